"""Grounding arms: memory (Remember), web (Observe), tools (Act).

Every arm implements `Arm`: `ground(query, deadline) -> list[Evidence]`, returning snippets, never prose.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import ConfigError


@dataclass(frozen=True)
class Query:
    """What an arm is asked to ground. `span` is the doubtful text; the rest is local context."""

    span: str  # the rewound span text (may be empty when the whole reply so far is in doubt)
    question: str  # the user's question
    sentence: str  # the sentence so far, up to and including the span
    span_class: str = "other"  # router's class: computable | entity | other


@dataclass(frozen=True)
class Evidence:
    claim: str  # the claim the evidence supports, e.g. "37 * 48 = 1776"
    evidence: str  # the snippet put into the model's context
    confidence: float  # 0..1, the arm's own relevance / certainty
    source: str  # e.g. "memory:country:BF", "tool:calculator"
    observable: float = 0.0  # 1.0 for a verified tool result
    detail: dict = field(default_factory=dict)  # arm-specific facts for the receipt (tool input/output)

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Arm(Protocol):
    name: str  # "memory" | "web" | "tool"; the router's arm order refers to these names

    def ground(self, query: Query, deadline: float) -> list[Evidence]:
        """Return evidence best first (empty: nothing above the arm's floor).

        `deadline` is an absolute `time.monotonic()` value; an arm must return or raise by then.
        """
        ...


def check_arm_settings(floor: float, default_floor: float, **counts: tuple[int, str]) -> None:
    """Raise ConfigError unless `floor` is within 0..1 and every count (name=(value, what it counts)) is >= 1."""
    if not 0.0 <= floor <= 1.0:
        raise ConfigError(f"floor={floor!r} is outside 0..1; pass a relevance floor such as {default_floor}")
    for name, (value, what) in counts.items():
        if value < 1:
            raise ConfigError(f"{name}={value!r} must be at least 1: how many {what}")

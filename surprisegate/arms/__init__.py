"""Grounding arms: memory (Remember), web (Observe), tools (Act).

Every arm implements `Arm`: `ground(query, deadline) -> list[Evidence]`, returning snippets, never prose.
A query may carry a `Scribe`: the model itself, for an arm that needs it to write something it then checks
(the tool arm's word-problem program, arms/programs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import ConfigError


@runtime_checkable
class Scribe(Protocol):
    """The reply's model, lent to an arm for one scratch text that never reaches the reply."""

    def write(
        self, messages: list[dict[str, str]], lead: str, *, max_tokens: int, stops: Sequence[str], deadline: float
    ) -> str:
        """Greedy continuation of a fresh chat (`messages`) whose assistant turn starts with `lead`: the text
        written up to and including the first of `stops` (searched from the lead's last line break on), or up
        to the end of the turn, `max_tokens` or `deadline` (a `time.monotonic()` value). The messages stay
        plain text."""
        ...

    @property
    def tokens_written(self) -> int:
        """Tokens decoded for scratch texts so far (they count in the reply's tokens decoded)."""
        ...


@dataclass(frozen=True)
class Query:
    """What an arm is asked to ground. `span` is the doubtful text; the rest is local context."""

    span: str  # the rewound span text (may be empty when the whole reply so far is in doubt)
    question: str  # the user's question
    sentence: str  # the sentence so far, up to and including the span
    span_class: str = "other"  # router's class: computable | entity | other
    # Sentence scope: who the sentence is about ("Chad"); then `question` is the sentence, subject named.
    subject: str = ""
    # Sentence scope: the user's whole request, where a subject it names may be found when `subject` is empty
    # (it names none with a capital: "write about chad: its capital and currency").
    prompt: str = ""
    # Sentence scope: asked about an item the reply has not stated ("its currency"), not about a sentence of it: one
    # passage sentence answers it, of the shape the item asks for (a year).
    asked_item: bool = False
    # The model, for arms that have it write a scratch text they check (None: the backend lends none).
    scribe: Scribe | None = field(default=None, compare=False, repr=False)


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

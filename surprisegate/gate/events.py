"""Events the loop's stream yields. Consumers switch on the class.

`Token` carries text that may still be rewound (in `emit` streaming) or is final (in `holdback`).
`Rewind` retracts the last `n_tokens` visible tokens (only sent in `emit` streaming).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import ReplyResult


@dataclass(frozen=True)
class Token:
    index: int  # position in the visible reply, 0-based
    token_id: int | None  # None where a black-box provider streams text only
    text: str
    surprise: float  # bits, -log2 p under the raw model distribution
    window_stat: float  # rolling statistic after pushing this token
    # (id, natural-log prob) of the k most likely tokens at this step, most likely first, when the config asks
    # for them (top_logprobs > 0) and the backend has token ids: what a stream's logprobs send with the token
    top_logprobs: tuple[tuple[int, float], ...] = ()


UNSAID_ITEM = "asked item unsaid"  # a Trigger's statistic for a round about an item the paragraph left unsaid


@dataclass(frozen=True)
class Trigger:
    token_index: int  # reply index of the token that pushed the window over the threshold
    statistic: str
    value: float
    threshold: float
    span_start: int  # reply index of the first token of the doubtful span
    span_text: str
    round: int


@dataclass(frozen=True)
class Grounding:
    round: int
    span_class: str
    arm_order: tuple[str, ...]
    found: bool
    source: str | None
    evidence: str | None
    reason: str  # why grounding was accepted or not


@dataclass(frozen=True)
class Rewind:
    round: int
    n_tokens: int  # visible tokens retracted (0 in holdback streaming when none were shown)
    dropped_text: str
    injected_tokens: int
    reverted: bool = False  # the rewrite ignored its evidence: the reply written without it comes back


@dataclass(frozen=True)
class Done:
    """The reply is finished: its typed result, from which the caller builds the receipt."""

    result: ReplyResult

    @property
    def text(self) -> str:
        return self.result.reply

    @property
    def finish_reason(self) -> str:  # "stop" | "length" | "error"
        return self.result.finish_reason

    @property
    def n_tokens(self) -> int:
        return self.result.n_tokens

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rounds as the receipt writes them."""
        return self.result.round_dicts()


Event = Token | Trigger | Grounding | Rewind | Done

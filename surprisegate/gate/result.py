"""The typed result of one reply, which both loops (mid-decode and revise) produce, and its receipt."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, shaping_of
from .receipts import ConvergenceRecord, receipt_record
from .surprise import aggregates

# The receipt's `extra`: always written, in this order; then the optional ones that are set.
_DETAILS = (
    "tokens_decoded",
    "tokens_injected",
    "prompt_tokens",
    "token_surprises",
    "token_entropies",
    "token_ids",
    "token_top_logprobs",
    "question_kind",
    "threshold",
    "would_trigger",
    "latency_ms",
)
_OPTIONAL_DETAILS = ("revise", "no_logprobs", "token_pieces", "token_windows", "probe")


@dataclass
class ReplyResult:
    """One finished reply, its signals and its rounds. The loop fills it in process; the revise pass from a
    chat API's draft (then `revise`, `no_logprobs` and `token_pieces` say what the draft did)."""

    reply: str
    finish_reason: str  # "stop" | "length" | "error"
    messages: list[dict[str, str]]
    question: str  # the last user turn: what the arms were asked about
    question_kind: str | None
    threshold: float
    n_tokens: int
    tokens_decoded: int  # every token sampled, dropped ones included
    latency_ms: float
    surprise: dict[str, Any] | None = None  # aggregates of the reply's surprise; None when not scored
    tokens_injected: int = 0
    prompt_tokens: int = 0
    token_surprises: list[float] = field(default_factory=list)
    token_entropies: list[float] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    token_top_logprobs: list[list[list[float]]] = field(default_factory=list)
    rounds: list[ConvergenceRecord] = field(default_factory=list)
    would_trigger: list[dict[str, Any]] = field(default_factory=list)  # detect: crossings never acted on
    probe: dict[str, Any] | None = None  # which probe judged the first sentence, and its score
    fault: dict[str, Any] | None = None  # the backend failed mid-reply: what happened
    revise: dict[str, Any] | None = None  # the revise pass: draft, flagged spans, evidence, outcome
    no_logprobs: str | None = None  # why a chat API's draft came without logprobs
    token_pieces: list[str] | None = None  # each token's text (a chat API's draft: labelling needs them, no ids)
    token_windows: list[float] | None = None  # the rolling window statistic right after each token (receipts view)

    def round_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rounds]

    def details(self) -> dict[str, Any]:
        """The receipt's `extra`: counts, per-token signals and what the trigger saw."""
        always = {k: getattr(self, k) for k in _DETAILS}
        return always | {k: getattr(self, k) for k in _OPTIONAL_DETAILS if getattr(self, k) is not None}

    def canary(self) -> dict[str, Any]:
        """The groundedness canary's verdict on this reply (canary.py); `not_scored` without surprise."""
        from .canary import groundedness_canary

        if not self.surprise:
            reason = "mode=off: no surprise measured"
            return {"verdict": "not_scored", "reason": reason, "uncertainty": None, "anchoring": None}
        return groundedness_canary(self.surprise, self.round_dicts(), self.threshold)


def surprise_summary(surprises: list[float], tail_cut: float, window_max: float, statistic: str) -> dict[str, Any]:
    """The receipt's `surprise`: aggregates of the reply's bits, and the highest eligible rolling statistic
    seen while decoding (what the gate compared to the threshold)."""
    return dict(aggregates(surprises, tail_cut)) | {"window_max": window_max, "statistic": statistic}


def rounded(values: list[float]) -> list[float]:
    return [round(x, 4) for x in values]


IN_PROCESS = ("llamacpp", "transformers")  # backends whose logits the loop reads itself


def sampling_record(config: Config, backend_name: str) -> dict[str, Any]:
    """The receipt's `sampling`: the settings that shaped which tokens were chosen, and where the surprise and
    entropy were read (never from the shaped distribution in process: the signal means the same whatever the
    settings)."""
    signal = (
        "the model's raw distribution (temperature 1, before logit bias, penalties and top-k/top-p/min-p)"
        if backend_name in IN_PROCESS
        else "the logprobs the backend returned with each token (see its notes in the README's Backends)"
    )
    return {"temperature": config.temperature, "shaped_by": shaping_of(config).settings(), "signal_from": signal}


def build_receipt(
    result: ReplyResult,
    backend: Any,
    config: Config,
    *,
    reply_id: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The receipt of one reply: its result, the backend that wrote it and the config it ran under.
    `reply_id` (default: a fresh one) and `extra` (kept beside the result's own details, e.g. serve's
    request) come from the caller, so the receipt is never edited after it is built."""
    return receipt_record(
        reply_id=reply_id,
        created=time.time(),
        model=backend.model_id,
        backend=backend.name,
        config=config.to_dict(),
        prompt=result.question,
        messages=result.messages,
        reply=result.reply,
        n_tokens=result.n_tokens,
        surprise=result.surprise,
        canary=result.canary(),
        rounds=result.rounds,
        mode=config.mode,
        finish_reason=result.finish_reason,
        fault=result.fault,
        extra=result.details() | {"sampling": sampling_record(config, backend.name)} | (extra or {}),
    )

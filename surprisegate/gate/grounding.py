"""A grounding round's arm calls: which arms, in what order, under one hard deadline.

Arms run in worker threads so an arm stuck in DNS or a dead socket can never stall the reply. The number
of calls in flight is bounded (`ArmPool`): a call that outlives its deadline keeps its slot until it
returns, and when every slot is taken the arm is skipped with that reason instead of piling up threads.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..arms import Arm, Evidence, Query
from ..config import Config
from ..errors import ArmError
from .receipts import ArmAttempt, ConvergenceRecord
from .router import closed_question


class ArmPool:
    """At most `size` arm calls in flight, across every session of the process."""

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ValueError(f"ArmPool(size={size}) needs size >= 1")
        self.size = size
        self._slots = threading.BoundedSemaphore(size)

    def call(self, fn: Callable[[], Any], deadline: float) -> tuple[str, Any]:
        """("ok", value) | ("error", exc) | ("timeout", None) by `deadline`; ("full", None) when no slot is free."""
        if not self._slots.acquire(blocking=False):
            return "full", None
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - reported, never raised into the loop
                box["error"] = exc
            finally:
                done.set()
                self._slots.release()

        threading.Thread(target=run, daemon=True, name="surprisegate-arm").start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            return "timeout", None
        if "error" in box:
            return "error", box["error"]
        return "ok", box.get("value")


DEFAULT_POOL = ArmPool()


def call_with_deadline(fn: Callable[[], Any], deadline: float, pool: ArmPool | None = None) -> tuple[str, Any]:
    """Run fn in a pooled daemon thread; ("ok", value) | ("error", exc) | ("timeout", None) | ("full", None)."""
    return (pool or DEFAULT_POOL).call(fn, deadline)


def arm_order(config: Config, span_class: str, arms: Mapping[str, Arm]) -> tuple[str, ...]:
    """The configured order for the span's class, keeping only the arms this run has."""
    configured = config.arm_order_computable if span_class == "computable" else config.arm_order_other
    return tuple(a for a in configured if a in arms)


def ground_round(
    arms: Mapping[str, Arm],
    order: Sequence[str],
    query: Query,
    deadline: float,
    cache: dict | None = None,
    margin: float = 0.0,
    pool: ArmPool | None = None,
) -> tuple[Evidence | None, list[ArmAttempt]]:
    """Try arms in order until one returns evidence that covers the question by at least `margin`; keep
    the best evidence of those asked. All of it under one hard deadline.

    With `margin` 0 the first arm with evidence wins. Above it, weak evidence (a passage about a
    neighbouring entity) lets the next arm be asked too, and the higher confidence wins (ties: the first).
    `cache` (per reply) remembers each arm's answer to a question, or its ArmError: a later round of the same
    reply asks the same question, and paying for the same lookup (or a program written) twice buys nothing.
    """
    attempts: list[ArmAttempt] = []
    best: Evidence | None = None
    for name in order:
        results, attempt = _ask_arm(arms, name, query, deadline, cache, pool)
        attempts.append(attempt)
        if results and (best is None or results[0].confidence > best.confidence):
            if best is not None:
                attempt.arbitration = f"kept over the weaker {best.source} ({best.confidence:.3f} < margin {margin})"
            best = results[0]
        if best is not None and best.confidence >= margin:
            break
        if best is not None and attempt.arbitration is None:
            attempt.arbitration = (
                f"{best.source} covers the question by {best.confidence:.3f} < margin {margin}: asking the next arm too"
            )
    return best, attempts


def _ask_arm(
    arms: Mapping[str, Arm], name: str, query: Query, deadline: float, cache: dict | None, pool: ArmPool | None
) -> tuple[list[Evidence], ArmAttempt]:
    """One arm's evidence for the query, and the attempt the receipt records."""
    key = (name, query.question, query.span_class)
    if cache is not None and key in cache:
        cached = cache[key]
        if isinstance(cached, str):  # the arm refused this question earlier in the reply
            return [], ArmAttempt(name, "error", cached=True, error=cached)
        return cached, ArmAttempt(name, "ok" if cached else "empty", cached=True, results=_dicts(cached))
    arm = arms.get(name)
    if arm is None:
        return [], ArmAttempt(name, "skipped", reason="arm not configured")
    if time.monotonic() >= deadline:
        return [], ArmAttempt(name, "timeout", reason="round deadline passed before this arm")
    started = time.monotonic()
    status, value = call_with_deadline(lambda: arm.ground(query, deadline), deadline, pool)
    asked = {"span": query.span, "question": query.question, "sentence": query.sentence}
    attempt = ArmAttempt(name, status, asked, latency_ms=round((time.monotonic() - started) * 1000, 2))
    if status == "full":
        size = (pool or DEFAULT_POOL).size
        attempt.status, attempt.reason = "skipped", f"arm executor full ({size} calls in flight): resumed unmodified"
    elif status == "error":
        attempt.error = f"{type(value).__name__}: {value}"
        if isinstance(value, TimeoutError):  # the arm gave up at the deadline itself
            attempt.status = "timeout"
        elif cache is not None and isinstance(value, ArmError):  # a refusal recurs: a later round is not asked again
            cache[key] = attempt.error
    elif status == "ok":
        results = list(value or [])
        if cache is not None:
            cache[key] = results
        attempt.status, attempt.results = ("ok" if results else "empty"), _dicts(results)
        return results, attempt
    return [], attempt


def _dicts(results: Sequence[Evidence]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in results]


def round_deadline(config: Config, query: Query) -> float:
    """Seconds a round may take: longer for a computable span when the model is lent to write a program."""
    programs = query.scribe is not None and query.span_class == "computable" and config.tool_programs
    return max(config.round_deadline_s, config.program_deadline_s) if programs else config.round_deadline_s


def ground_span(
    config: Config,
    arms: Mapping[str, Arm],
    router: Callable[..., Any],
    query: Query,
    trigger: dict[str, Any],
    round_no: int,
    cache: dict | None = None,
) -> tuple[Evidence | None, ConvergenceRecord]:
    """Route a doubtful span and ask the arms within the round's deadline: the evidence chosen (or None) and
    the round's record, its action not yet decided. Shared by the loop (rewind) and the revise pass."""
    started = time.monotonic()
    route = router(query.span, query.question, query.sentence)
    # A question that names its answers ("X or Y?", "Were X and Y ...?") is left as the model answered
    # it: one snippet rarely compares the two, and grounding broke more such answers than it fixed.
    computable = route.span_class == "computable"
    closed = None if config.ground_closed_questions or computable else closed_question(query.question)
    order = () if closed else arm_order(config, route.span_class, arms)
    query = dataclasses.replace(query, span_class=route.span_class)
    deadline = started + round_deadline(config, query)
    chosen, attempts = ground_round(arms, order, query, deadline, cache, config.arbitration_margin)
    record = ConvergenceRecord(
        round=round_no,
        trigger=trigger,
        span_class=route.span_class,
        route_rule=route.rule,
        closed_question=closed,
        arm_order=list(order),
        arms=attempts,
        chosen=chosen.to_dict() if chosen else None,
    )
    return chosen, record


def why_not_grounded(
    record: ConvergenceRecord, chosen: Evidence | None, earlier: Sequence[ConvergenceRecord]
) -> str | None:
    """Why a round changes nothing, or None when its evidence goes in."""
    if chosen is None:
        if record.closed_question:
            return (
                f"closed question ({record.closed_question}): its answer is one of the options it names; "
                "set ground_closed_questions = true to ground it anyway"
            )
        statuses = ", ".join(f"{a.arm}: {a.status}" for a in record.arms) or "no arms configured"
        return f"no grounding found ({statuses})"
    # The same evidence is already in the context: injecting it again only invites the model to echo it.
    used = ("rewound", "revised")
    repeat = next((r.round for r in earlier if r.action in used and r.evidence == chosen.evidence), None)
    return None if repeat is None else record.repeats(repeat)

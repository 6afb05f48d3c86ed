"""The ONE loop: decode, measure surprise, and when the rolling window crosses the threshold, ground
the doubtful span, rewind it (KV cache kept for everything before it), inject evidence, resume.

Layered like mlx-lm's generate.py:
  decode_step   one token from logits: (token id, surprise in bits, entropy in bits)
  stream        the loop; yields Token / Trigger / Grounding / Rewind / Done events
  generate      runs the stream to the end and returns the result with its receipt

The controller knows no backend or arm by name: it gets a `SteerableBackend` and a mapping of arm name
to `Arm`, and the router decides the order.
"""

from __future__ import annotations

import codecs
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .arms import Arm, Evidence, Query
from .backends import SteerableBackend
from .config import Config, evidence_text
from .router import closed_question
from .events import Done, Event, Grounding, Rewind, Token, Trigger
from .prompting import PromptLayout, chat_messages
from .signals import CopyTracker, question_kind, signal_value
from .support import cut_short, rewrite_problem, sentence_end, sentence_start
from .surprise import RollingWindow, aggregates, surprise_and_entropy, top_logprobs


# --------------------------------------------------------------------------------------------
# step
# --------------------------------------------------------------------------------------------
def decode_step(logits: np.ndarray, temperature: float, rng: np.random.Generator | None,
                scored: bool, banned: frozenset[int] = frozenset()) -> tuple[int, float, float]:
    """Pick the next token (never one of `banned`); return it with its surprise and the entropy (bits).

    Both come from the raw distribution (temperature 1) whatever the sampling temperature. Never writes
    `logits`. The entropy costs one dot product on top of the normaliser the surprise needs.
    """
    choose_from = logits
    if banned:  # a masked copy, only for the one step of a retry
        choose_from = logits.copy()
        choose_from[list(banned)] = -np.inf
    if temperature <= 0.0:
        token = int(choose_from.argmax())
    else:
        z = choose_from.astype(np.float64) / temperature
        p = np.exp(z - z.max())
        token = int(rng.choice(p.size, p=p / p.sum()))
    if not scored:
        return token, math.nan, math.nan
    return (token, *surprise_and_entropy(logits, token))


# --------------------------------------------------------------------------------------------
# grounding round
# --------------------------------------------------------------------------------------------
def call_with_deadline(fn: Callable[[], Any], deadline: float) -> tuple[str, Any]:
    """Run fn in a daemon thread; return ("ok", value) | ("error", exc) | ("timeout", None) by `deadline`.

    A daemon thread, so an arm stuck in DNS or a dead socket can never stall the reply or the exit.
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported, never raised into the loop
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="surprisegate-arm").start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        return "timeout", None
    if "error" in box:
        return "error", box["error"]
    return "ok", box.get("value")


def arm_order(config: Config, span_class: str, arms: Mapping[str, Arm]) -> tuple[str, ...]:
    """The configured order for the span's class, keeping only the arms this run has."""
    configured = config.arm_order_computable if span_class == "computable" else config.arm_order_other
    return tuple(a for a in configured if a in arms)


def ground_round(arms: Mapping[str, Arm], order: Sequence[str], query: Query, deadline: float,
                 cache: dict | None = None, margin: float = 0.0) -> tuple[Evidence | None, list[dict]]:
    """Try arms in order until one returns evidence that covers the question by at least `margin`; keep
    the best evidence of those asked. All of it under one hard deadline.

    With `margin` 0 the first arm with evidence wins. Above it, weak evidence (a passage about a
    neighbouring entity) lets the next arm be asked too, and the higher confidence wins (ties: the first).
    `cache` (per reply) remembers each arm's answer to a question: a later round of the same reply asks
    the same question, and paying for the same lookup twice buys nothing.
    """
    reports: list[dict] = []
    best: Evidence | None = None
    for name in order:
        results, report = _ask_arm(arms, name, query, deadline, cache)
        reports.append(report)
        if results and (best is None or results[0].confidence > best.confidence):
            if best is not None:
                report["arbitration"] = f"kept over the weaker {best.source} ({best.confidence:.3f} < margin {margin})"
            best = results[0]
        if best is not None and best.confidence >= margin:
            break
        if best is not None:
            report.setdefault("arbitration", f"{best.source} covers the question by {best.confidence:.3f} < "
                                              f"margin {margin}: asking the next arm too")
    return best, reports


def _ask_arm(arms: Mapping[str, Arm], name: str, query: Query, deadline: float,
             cache: dict | None) -> tuple[list[Evidence], dict]:
    """One arm's evidence for the query, and its report for the receipt."""
    key = (name, query.question, query.span_class)
    if cache is not None and key in cache:
        results = cache[key]
        return results, {"arm": name, "status": "ok" if results else "empty", "cached": True, "latency_ms": 0.0,
                         "results": [e.to_dict() for e in results]}
    arm = arms.get(name)
    if arm is None:
        return [], {"arm": name, "status": "skipped", "reason": "arm not configured", "latency_ms": 0.0, "results": []}
    if time.monotonic() >= deadline:
        return [], {"arm": name, "status": "timeout", "reason": "round deadline passed before this arm",
                    "latency_ms": 0.0, "results": []}
    started = time.monotonic()
    status, value = call_with_deadline(lambda: arm.ground(query, deadline), deadline)
    report = {"arm": name, "query": {"span": query.span, "question": query.question, "sentence": query.sentence},
              "status": status, "latency_ms": round((time.monotonic() - started) * 1000, 2), "results": []}
    results: list[Evidence] = []
    if status == "error":
        report["error"] = f"{type(value).__name__}: {value}"
        if isinstance(value, TimeoutError):  # the arm gave up at the deadline itself
            report["status"] = "timeout"
    elif status == "ok":
        results = list(value or [])
        if cache is not None:
            cache[key] = results
        report["results"] = [e.to_dict() for e in results]
        report["status"] = "ok" if results else "empty"
    return results, report


# --------------------------------------------------------------------------------------------
# stream
# --------------------------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def _current_sentence(text: str) -> str:
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    # A sentence that ends exactly at the end of the text is still the current one.
    ends = [e for e in ends if e < len(text.rstrip())]
    return text[ends[-1]:].strip() if ends else text.strip()


@dataclass
class _Context:
    tokens: list[int]  # every token the backend holds, in order
    turn_start: int  # index where the current assistant turn's header begins


@dataclass
class _Reply:
    """The visible reply: token ids, their surprises and bytes. Kept apart from the model's context."""

    tokens: list[int] = field(default_factory=list)
    surprises: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    window_stats: list[float] = field(default_factory=list)  # rolling statistic right after each token
    pieces: list[bytes] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # top-k logprobs (config.top_logprobs)

    def text(self, upto: int | None = None) -> str:
        return b"".join(self.pieces[:upto]).decode("utf-8", "replace")

    def cut(self, n: int) -> None:
        del self.tokens[n:], self.surprises[n:], self.entropies[n:], self.window_stats[n:], self.pieces[n:]
        del self.top[n:]

    def copy(self, n: int) -> "_Reply":
        return _Reply(self.tokens[:n], self.surprises[:n], self.entropies[:n], self.window_stats[:n], self.pieces[:n],
                      self.top[:n])


@dataclass
class _Snapshot:
    """The reply and the backend's context at one moment: where a dropped rewrite goes back to."""

    reply: _Reply
    context_tokens: list[int]  # what the backend held then
    turn_start: int

    @classmethod
    def take(cls, reply: _Reply, n_reply: int, context: _Context) -> "_Snapshot":
        return cls(reply.copy(n_reply), list(context.tokens), context.turn_start)


@dataclass
class _Unchecked:
    """A rewrite that has not yet shown it used its evidence: where to go back to, and where to retry from."""

    before: _Snapshot  # at the trigger: the reply without its triggering token, which was never fed
    span_start: int  # reply index where the first unchecked rewrite begins; nothing from here is shown
    first_round: int  # index in `rounds` of the first round it covers
    check_from: int = 0  # reply index of the latest rewind: its sentence is the one checked
    evidence: list[str] = field(default_factory=list)
    after_injection: _Snapshot | None = None  # right after the latest injection: a retry starts here
    tried_again: bool = False  # one more try per rewrite, then it is dropped


def _rewrite_verdict(reply: _Reply, unchecked: _Unchecked, question: str, final: bool) -> tuple[bool, str | None]:
    """(checked, problem) for the sentence holding the latest rewrite: (False, None) while it is open;
    once finished, the reason it must be dropped (`support.rewrite_problem`) or None when it stands."""
    text = reply.text()
    at = len(reply.text(unchecked.check_from))
    end = sentence_end(text, at)
    if end is None and not final:
        return False, None
    sentence = text[sentence_start(text, at): end]
    return True, rewrite_problem(sentence, unchecked.evidence, question)


def _restore(backend: SteerableBackend, context: _Context, reply: _Reply, saved: _Snapshot,
             prompt_len: int) -> np.ndarray:
    """Put the backend, context and reply back as they were at `saved`; the logits to go on.

    `prompt_len`: context tokens fed as the prompt; the reply's tokens were fed one at a time."""
    target = saved.context_tokens
    common = 0
    for have, want in zip(context.tokens, target):
        if have != want:
            break
        common += 1
    common = min(common, len(target) - 1)  # re-feed at least one token: its logits pick the next one
    if backend.can_trim():
        backend.trim(len(context.tokens) - common)
    else:
        backend.reset()
        common = 0
    # The same schedule as the first time (prompt in one batch, reply one token at a time): batched and
    # one-token kernels round differently, and the reply must come back exactly as written without evidence.
    logits = backend.append(target[common:prompt_len]) if common < prompt_len else None
    for token in target[max(common, prompt_len):]:
        logits = backend.append([token])
    assert logits is not None
    context.tokens[:] = target
    context.turn_start = saved.turn_start
    kept = saved.reply
    reply.tokens[:], reply.surprises[:], reply.entropies[:] = kept.tokens, kept.surprises, kept.entropies
    reply.window_stats[:], reply.pieces[:], reply.top[:] = kept.window_stats, kept.pieces, kept.top
    return logits


def stream(
    backend: SteerableBackend,
    question: str,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    assistant_prefix: str = "",
) -> Iterator[Event]:
    """Generate one reply to `question`, yielding events. Mutates the backend's context (KV cache).

    `assistant_prefix` starts the assistant's turn (a cloze such as "The capital of Chad is"): the model
    continues it; the visible reply is the continuation.

    Token events carry text once it can no longer be rewound (`holdback`), or at once with explicit
    Rewind events (`emit`). The last event is Done, which carries the receipt.
    """
    arms = dict(arms or {})
    if router is None:
        from .router import route as router
    scored = config.mode != "off"
    intervening = config.mode == "intervene"
    started = time.monotonic()
    rng = np.random.default_rng(config.seed) if config.temperature > 0 else None

    messages = chat_messages(question, config.system_prompt)
    layout = PromptLayout.from_template(backend.chat_prompt, messages)
    prefix_tokens = backend.tokenize(assistant_prefix) if assistant_prefix else []
    open_tokens = backend.tokenize(layout.open_assistant)
    prompt_tokens = backend.tokenize(layout.body) + open_tokens + prefix_tokens

    backend.reset()
    logits = backend.append(prompt_tokens)
    # What the backend holds (lets a backend that cannot trim re-prefill) and where the assistant turn opens.
    context = _Context(list(prompt_tokens), turn_start=len(prompt_tokens) - len(prefix_tokens) - len(open_tokens))
    window = RollingWindow(config.window, config.statistic)
    pushed_at: list[int] = []  # reply index of each value pushed since the last reset
    # Per-kind threshold (calibrated per-category normalisation), else the global one.
    kind = question_kind(question)
    threshold = config.kind_thresholds.get(kind, config.threshold)
    # Which tokens merely copy the question (or a cloze prefix): the "novel" signals skip them.
    copies = CopyTracker(question + " " + assistant_prefix) if config.signal.startswith("novel") else None
    reply = _Reply()
    rounds: list[dict] = []
    unchecked: _Unchecked | None = None  # a rewrite whose sentence is not finished: held back until checked
    reverted = False  # a rewrite ignored its evidence and was dropped: no further rounds in this reply
    banned: frozenset[int] = frozenset()  # tokens the next step may not pick (a retry of a failed rewrite)
    arm_cache: dict = {}  # per reply: (arm, question, class) -> evidence list
    would_trigger: list[dict] = []  # detect mode: crossings recorded, never acted on
    decoded = 0  # every token sampled, including dropped ones
    window_max = 0.0  # highest statistic of a window eligible to trigger, over every token decoded
    injected_total = 0
    finish_reason = "length"
    emitted = 0  # visible tokens already sent as Token events
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    emitted_texts: list[str] = []
    holdback = config.stream == "holdback"
    eos = backend.eos_token_ids
    max_decoded = config.max_tokens * (config.max_rounds + 2) + 8  # every round may rewrite, a revert redo

    def emit_upto(n: int, final: bool = False) -> Iterator[Token]:
        nonlocal emitted
        while emitted < n:
            i = emitted
            text = decoder.decode(reply.pieces[i], final=final and i == n - 1)
            emitted_texts.append(text)
            emitted += 1
            yield Token(i, reply.tokens[i], text, reply.surprises[i], reply.window_stats[i])

    def start_over_from(n: int) -> None:
        """The reply was cut back to `n` tokens: the window starts afresh and emit streaming resumes there."""
        nonlocal emitted, decoder
        window.reset()
        pushed_at.clear()
        if copies:
            copies.reset_word()  # the word in progress was dropped with the span
        if not holdback:
            emitted = min(emitted, n)
            del emitted_texts[emitted:]
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            decoder.decode(b"".join(reply.pieces[:emitted]), final=False)

    def revert(problem: str) -> Iterator[Event]:
        """The rewrite failed its check: back to the reply written without it; no more rounds."""
        nonlocal unchecked, reverted
        assert unchecked is not None
        start = unchecked.span_start
        text = reply.text()
        # The rewrite up to the end of the sentence that was checked, not the word that showed it had ended.
        rewritten = text[len(reply.text(start)): sentence_end(text, len(reply.text(unchecked.check_from)))]
        new_logits = _restore(backend, context, reply, unchecked.before, len(prompt_tokens))
        for record in rounds[unchecked.first_round:]:
            if record["action"] == "rewound":
                record.update(action="reverted", rewritten_text=rewritten, reason=(
                    f"{record['reason']}, but the rewrite {rewritten.strip()[:80]!r} {problem}: "
                    "kept the reply written without it"))
        shown = max(0, emitted - start)
        unchecked, reverted = None, True
        start_over_from(start)
        yield Rewind(rounds[-1]["round"], 0 if holdback else shown, rewritten, 0, reverted=True)
        return new_logits

    def try_again(problem: str, at_end_of_turn: bool, current: np.ndarray) -> Iterator[Event]:
        """One more try before a failed rewrite is dropped, the evidence still in context: a rewrite cut
        short by its end of turn goes on past it ("… is vpn." inside "vpn.acme.example"); any other is
        written again from the rewind point with its first token banned ("I'm ready to help.")."""
        nonlocal banned
        assert unchecked is not None and unchecked.after_injection is not None
        unchecked.tried_again = True
        start = unchecked.check_from
        failed = reply.text()[len(reply.text(start)):]
        rewound = next(r for r in reversed(rounds) if r["action"] == "rewound")  # the round whose rewrite failed
        if at_end_of_turn and cut_short(failed, unchecked.evidence):
            banned, how, new_logits = frozenset(eos), "continued past the end of turn", current
        else:
            banned = frozenset({reply.tokens[start]}) if len(reply.tokens) > start else frozenset()
            how = "rewritten from the rewind point with its first token banned"
            shown = max(0, emitted - start)
            new_logits = _restore(backend, context, reply, unchecked.after_injection, len(prompt_tokens))
            start_over_from(start)
            yield Rewind(rewound["round"], 0 if holdback else shown, failed, 0)
        rewound.setdefault("retries", []).append({"problem": problem, "rewrite": failed, "how": how})
        return new_logits

    def failed_check(problem: str, at_end_of_turn: bool, current: np.ndarray) -> Iterator[Event]:
        """A rewrite failed its check: one more try if allowed, else back to the reply written without it."""
        assert unchecked is not None
        if config.retry_failed_rewrite and not unchecked.tried_again and unchecked.after_injection is not None:
            return (yield from try_again(problem, at_end_of_turn, current))
        return (yield from revert(problem))

    while len(reply.tokens) < config.max_tokens and decoded < max_decoded:
        token, s, entropy = decode_step(logits, config.temperature, rng, scored, banned)
        banned = frozenset()
        decoded += 1
        if token in eos:
            problem = _rewrite_verdict(reply, unchecked, question, final=True)[1] if unchecked is not None else None
            if problem is not None:
                logits = yield from failed_check(problem, True, logits)
                continue
            finish_reason = "stop"
            break
        reply.tokens.append(token)
        reply.surprises.append(s)
        reply.entropies.append(entropy)
        reply.pieces.append(backend.token_bytes(token))
        if config.top_logprobs:
            reply.top.append([(t, round(lp, 4)) for t, lp in top_logprobs(logits, config.top_logprobs)])

        triggered = False
        pushed = None
        if scored:
            copied = copies.push(reply.pieces[-1].decode("utf-8", "replace")) if copies else False
            pushed = signal_value(config.signal, s, entropy, copied)
            if pushed is not None:  # novel signals skip tokens copied from the question
                window.push(pushed)
                pushed_at.append(len(reply.tokens) - 1)
        value = window.value if (scored and len(window)) else math.nan
        reply.window_stats.append(value)
        if pushed is not None:
            eligible = len(window) >= min(config.min_tokens, config.window)
            if eligible:
                window_max = max(window_max, value)
            triggered = (
                eligible
                and value > threshold
                and len(rounds) + len(would_trigger) < config.max_rounds
                and not reverted
            )
        if triggered:
            span_start = pushed_at[window.start]
            statistic = config.statistic if config.signal == "surprise" else f"{config.signal}:{config.statistic}"
            trigger = Trigger(
                token_index=len(reply.tokens) - 1, statistic=statistic, value=value,
                threshold=threshold, span_start=span_start,
                span_text=reply.text()[len(reply.text(span_start)):], round=len(rounds) + len(would_trigger) + 1,
            )
            if not intervening:
                would_trigger.append(_trigger_dict(trigger))
            else:
                yield trigger
                before = None
                if config.revert_unused_evidence and unchecked is None:
                    before = _Unchecked(_Snapshot.take(reply, len(reply.tokens) - 1, context),
                                        span_start=trigger.span_start, first_round=len(rounds))
                record, new_logits = yield from _intervene(
                    backend, layout, config, arms, router, question, reply, trigger, emitted, holdback, rounds, context,
                    prefix_tokens, arm_cache,
                )
                rounds.append(record)
                if new_logits is not None:
                    logits = new_logits
                    unchecked = unchecked or before
                    if unchecked is not None:
                        unchecked.check_from = trigger.span_start
                        unchecked.evidence.append(record["chosen"]["evidence"])
                        unchecked.after_injection = _Snapshot.take(reply, len(reply.tokens), context)
                    injected_total += record["tokens_injected"]
                    start_over_from(len(reply.tokens))
                    continue
            window.reset()  # after a round (acted on or not) the window starts afresh
            pushed_at.clear()
        if unchecked is not None:
            checked, problem = _rewrite_verdict(reply, unchecked, question, final=len(reply.tokens) >= config.max_tokens)
            if problem is not None:
                logits = yield from failed_check(problem, False, logits)
                continue
            if checked:
                unchecked = None  # the rewrite drew on its evidence and answers the question: it stands

        logits = backend.append([token])
        context.tokens.append(token)
        # Tokens before the window start can no longer be rewound: safe to show in holdback streaming.
        can_rewind = intervening and len(rounds) < config.max_rounds and not reverted
        first_rewindable = pushed_at[window.start] if len(window) else len(reply.tokens)
        final_upto = first_rewindable if (holdback and can_rewind) else len(reply.tokens)
        if holdback and unchecked is not None:
            final_upto = min(final_upto, unchecked.span_start)
        yield from emit_upto(final_upto)

    yield from emit_upto(len(reply.tokens), final=True)
    text = reply.text()
    surprise_summary = aggregates(reply.surprises, config.tail_cut) if scored else None
    if surprise_summary is not None:
        # The highest eligible rolling statistic seen while decoding: what the gate compares to the threshold.
        surprise_summary["window_max"] = window_max
        surprise_summary["statistic"] = config.statistic
    result = {
        "reply": text,
        "finish_reason": finish_reason,
        "n_tokens": len(reply.tokens),
        "tokens_decoded": decoded,
        "tokens_injected": injected_total,
        "prompt_tokens": len(prompt_tokens),
        "surprise": surprise_summary,
        "token_surprises": [round(x, 4) for x in reply.surprises] if scored else [],
        "token_entropies": [round(x, 4) for x in reply.entropies] if scored else [],
        "token_ids": list(reply.tokens),
        "token_top_logprobs": [[list(pair) for pair in top] for top in reply.top],
        "rounds": rounds,
        "would_trigger": would_trigger,
        "latency_ms": round((time.monotonic() - started) * 1000, 2),
        "messages": messages,
        "question_kind": kind,
        "threshold": threshold,
    }
    yield Done(text=text, finish_reason=finish_reason, n_tokens=len(reply.tokens), rounds=rounds, receipt=result)


def _trigger_dict(t: Trigger) -> dict:
    return {"token_index": t.token_index, "statistic": t.statistic, "value": round(t.value, 4),
            "threshold": t.threshold, "span_start": t.span_start, "span_text": t.span_text}


def _intervene(backend, layout, config, arms, router, question, reply, trigger, emitted, holdback, earlier_rounds,
               context, prefix_tokens, cache):
    """One grounding round. Returns (convergence record, new logits or None when resumed unmodified)."""
    started = time.monotonic()
    deadline = started + config.round_deadline_s
    # The sentence so far includes a cloze prefix the assistant turn started with.
    prefix_text = b"".join(backend.token_bytes(t) for t in prefix_tokens).decode("utf-8", "replace")
    reply_text = prefix_text + reply.text()
    query = Query(span=trigger.span_text.strip(), question=question.strip(), sentence=_current_sentence(reply_text))
    route = router(query.span, query.question, query.sentence, available=tuple(arms))
    # A question that names its answers ("X or Y?", "Were X and Y ...?") is left as the model answered it:
    # one snippet rarely compares the two, and grounding broke more such answers than it fixed.
    closed = None if config.ground_closed_questions or route.span_class == "computable" else closed_question(query.question)
    order = () if closed else arm_order(config, route.span_class, arms)
    query = Query(query.span, query.question, query.sentence, span_class=route.span_class)

    chosen, arm_reports = ground_round(arms, order, query, deadline, cache, config.arbitration_margin)
    record: dict[str, Any] = {
        "round": trigger.round,
        "trigger": _trigger_dict(trigger),
        "span_class": route.span_class,
        "route_rule": route.rule,
        "closed_question": closed,
        "arm_order": list(order),
        "arms": arm_reports,
        "chosen": chosen.to_dict() if chosen else None,
        "tokens_dropped": 0,
        "tokens_injected": 0,
        "dropped_text": "",
    }
    if chosen is None:
        statuses = ", ".join(f"{r['arm']}: {r['status']}" for r in arm_reports) or "no arms configured"
        reason = (f"closed question ({closed}): its answer is one of the options it names; "
                  "set ground_closed_questions = true to ground it anyway") if closed else f"no grounding found ({statuses})"
        record.update(action="resumed_unmodified", reason=reason,
                      latency_ms=round((time.monotonic() - started) * 1000, 2))
        yield Grounding(trigger.round, route.span_class, order, False, None, None, record["reason"])
        return record, None
    # The same evidence is already in the context: injecting it again only invites the model to echo it.
    repeat = next((r["round"] for r in earlier_rounds
                   if r["action"] == "rewound" and r["chosen"]["evidence"] == chosen.evidence), None)
    if repeat is not None:
        record.update(action="resumed_unmodified", reason=f"evidence already injected in round {repeat}", already_grounded=True,
                      latency_ms=round((time.monotonic() - started) * 1000, 2))
        yield Grounding(trigger.round, route.span_class, order, False, chosen.source, chosen.evidence, record["reason"])
        return record, None

    yield Grounding(trigger.round, route.span_class, order, True, chosen.source, chosen.evidence, "evidence accepted")
    # Rewind. The span's tokens always leave the context (the triggering token was never fed, so one
    # fewer). `system_turn` also drops the open assistant turn, back to where it began, so the evidence
    # sits in a system turn right before a fresh assistant turn, as if it had been there from the start.
    span_len = len(reply.tokens) - trigger.span_start
    dropped_text = reply.text()[len(reply.text(trigger.span_start)):]
    kept_prefix = reply.tokens[: trigger.span_start]
    keep = context.turn_start if config.injection == "system_turn" else len(context.tokens) - (span_len - 1)
    to_drop = len(context.tokens) - keep
    if backend.can_trim():
        trimmed, rewind_method = backend.trim(to_drop), "trim"
    else:
        # No trimmable cache: rebuild it from the kept tokens (costly, and the receipt says so).
        backend.reset()
        backend.append(context.tokens[:keep])
        trimmed, rewind_method = to_drop, "reprefill"
    del context.tokens[keep:]
    reply.cut(trigger.span_start)
    injected = evidence_text(config, chosen)
    if config.injection == "system_turn":
        system_turn = backend.tokenize(layout.system_turn_prefix + injected + layout.system_turn_suffix)
        segment = system_turn + backend.tokenize(layout.open_assistant)
        refeed = prefix_tokens + kept_prefix
        context.turn_start = keep + len(system_turn)
    elif config.injection == "close_reopen":
        segment = backend.tokenize(layout.segment(injected, "close_reopen"))
        refeed = prefix_tokens + kept_prefix
    else:
        segment, refeed = backend.tokenize(layout.segment(injected, "inline")), []
    logits = backend.append(segment + refeed)
    context.tokens.extend(segment + refeed)
    shown = max(0, emitted - trigger.span_start)  # visible tokens a consumer must retract (emit streaming)
    record.update(
        action="rewound", reason=f"grounded by {chosen.source}", tokens_dropped=span_len,
        tokens_trimmed=trimmed, rewind_method=rewind_method, tokens_injected=len(segment) + len(refeed), dropped_text=dropped_text,
        injected_text=injected, latency_ms=round((time.monotonic() - started) * 1000, 2),
    )
    yield Rewind(trigger.round, 0 if holdback else shown, dropped_text, record["tokens_injected"])
    return record, logits


# --------------------------------------------------------------------------------------------
# generate
# --------------------------------------------------------------------------------------------
@dataclass
class Result:
    text: str
    finish_reason: str
    n_tokens: int
    rounds: list[dict]
    receipt: dict[str, Any]


def generate(
    backend: SteerableBackend,
    question: str,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    on_event: Callable[[Event], None] | None = None,
    assistant_prefix: str = "",
) -> Result:
    """Run the stream to the end and build the receipt (not written: see receipts.ReceiptWriter)."""
    done: Done | None = None
    for event in stream(backend, question, config, arms, router, assistant_prefix=assistant_prefix):
        if on_event is not None:
            on_event(event)
        if isinstance(event, Done):
            done = event
    assert done is not None and done.receipt is not None
    receipt = build_receipt_for(backend, question, config, done.receipt)
    return Result(done.text, done.finish_reason, done.n_tokens, done.rounds, receipt)


def build_receipt_for(backend: SteerableBackend, question: str, config: Config, result: dict) -> dict:
    from .canary import groundedness_canary
    from .receipts import build_receipt

    surprise = result["surprise"]
    canary = groundedness_canary(surprise or {}, result["rounds"], result["threshold"]) if surprise else {
        "verdict": "not_scored", "reason": "mode=off: no surprise measured", "uncertainty": None, "anchoring": None}
    return build_receipt(
        reply_id=uuid.uuid4().hex,
        created=time.time(),
        model=backend.model_id,
        backend=backend.name,
        config=config.to_dict(),
        prompt=question,
        reply=result["reply"],
        n_tokens=result["n_tokens"],
        surprise=surprise,
        canary=canary,
        rounds=result["rounds"],
        mode=config.mode,
        finish_reason=result["finish_reason"],
        extra={k: result[k] for k in ("tokens_decoded", "tokens_injected", "prompt_tokens", "token_surprises",
                                      "token_entropies", "token_ids", "token_top_logprobs", "question_kind", "threshold",
                                      "would_trigger", "latency_ms")},
    )

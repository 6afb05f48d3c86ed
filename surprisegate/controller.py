"""The ONE loop: decode, measure surprise, and when the rolling window crosses the threshold, ground
the doubtful span, rewind it (KV cache kept for everything before it), inject evidence, resume.

Layered like mlx-lm's generate.py:
  step      the backend seam: `session.steps(tokens)` continues a context and yields Steps
            (token, piece, surprise, entropy, top-k logprobs); backends/__init__.py
  stream    the loop (`_ReplyLoop`); yields Token / Trigger / Grounding / Rewind / Done events
  generate  runs the stream to the end and returns the result with its receipt

Its parts: the window and trigger policy (trigger.py, shared with calibrate), the emitter (holdback or
emit streaming), the reply state, and the round (arm calls in grounding.py). The controller knows no
backend or arm by name: it gets a `SteerableBackend` and a mapping of arm name to `Arm`.
"""

from __future__ import annotations

import codecs
import math
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .arms import Arm, Evidence, Query
from .backends import BlackBoxBackend, HiddenStates, RequestLog, Sampling, SteerableBackend, Step, Steps
from .config import Config, evidence_text
from .errors import BackendFault, InputError
from .events import Done, Event, Grounding, Rewind, Token, Trigger
from .grounding import ground_span, why_not_grounded
from .probe import TriggerProbe, resolve_probe
from .prompting import PromptLayout, conversation, last_user_turn
from .receipts import ConvergenceRecord, rounded_trigger
from .support import cut_short, rewrite_problem
from .surprise import aggregates
from .text import current_sentence, first_stop, sentence_end, sentence_start
from .trigger import TriggerPolicy


# --------------------------------------------------------------------------------------------
# the reply state
# --------------------------------------------------------------------------------------------
@dataclass
class _Context:
    tokens: list[int]  # every token the model holds (or is about to: the step just accepted), in order
    turn_start: int  # index where the current assistant turn's header begins


@dataclass
class _Reply:
    """The visible reply: token ids, their signals and bytes. Kept apart from the model's context."""

    tokens: list[int] = field(default_factory=list)
    surprises: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    window_stats: list[float] = field(default_factory=list)  # rolling statistic right after each token
    pieces: list[bytes] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # top-k logprobs (config.top_logprobs)

    def add(self, step: Step, window_stat: float) -> None:
        assert step.token is not None
        self.tokens.append(step.token)
        self.surprises.append(step.surprise)
        self.entropies.append(step.entropy)
        self.pieces.append(step.piece)
        self.window_stats.append(window_stat)
        if step.top_logprobs:
            self.top.append(step.top_logprobs)

    def text(self, upto: int | None = None) -> str:
        return b"".join(self.pieces[:upto]).decode("utf-8", "replace")

    def tail(self, start: int) -> str:
        """The text of the reply from token `start` on."""
        return self.text()[len(self.text(start)) :]

    def between(self, start: int, end: int) -> str:
        """The text of reply tokens [start, end)."""
        return self.text(end)[len(self.text(start)) :]

    def cut(self, n: int) -> None:
        del self.tokens[n:], self.surprises[n:], self.entropies[n:], self.window_stats[n:], self.pieces[n:]
        del self.top[n:]

    def copy(self, n: int) -> _Reply:
        return _Reply(
            self.tokens[:n],
            self.surprises[:n],
            self.entropies[:n],
            self.window_stats[:n],
            self.pieces[:n],
            self.top[:n],
        )

    def restore(self, kept: _Reply) -> None:
        for name in ("tokens", "surprises", "entropies", "window_stats", "pieces", "top"):
            getattr(self, name)[:] = getattr(kept, name)


@dataclass
class _Snapshot:
    """The reply and the model's context at one moment: where a dropped rewrite goes back to."""

    reply: _Reply
    context_tokens: list[int]  # what the model held then
    turn_start: int

    @classmethod
    def take(cls, reply: _Reply, n_reply: int, context: _Context) -> _Snapshot:
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
    sentence = text[sentence_start(text, at) : end]
    return True, rewrite_problem(sentence, unchecked.evidence, question)


# --------------------------------------------------------------------------------------------
# the emitter
# --------------------------------------------------------------------------------------------
class _Emitter:
    """Sends visible tokens as Token events: once they can no longer be rewound (`holdback`), or at
    once with Rewind events that retract them (`emit`)."""

    def __init__(self, holdback: bool) -> None:
        self.holdback = holdback
        self.emitted = 0  # visible tokens already sent
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def upto(self, reply: _Reply, n: int, final: bool = False) -> Iterator[Token]:
        while self.emitted < n:
            i = self.emitted
            text = self._decoder.decode(reply.pieces[i], final=final and i == n - 1)
            self.emitted += 1
            top = reply.top[i] if i < len(reply.top) else ()
            yield Token(i, reply.tokens[i], text, reply.surprises[i], reply.window_stats[i], top)

    def shown_after(self, start: int) -> int:
        """Visible tokens from reply index `start` on that a consumer must retract (emit streaming)."""
        return 0 if self.holdback else max(0, self.emitted - start)

    def restart(self, reply: _Reply, n: int) -> None:
        """The reply was cut back to `n` tokens: emit streaming resumes there."""
        if not self.holdback:
            self.emitted = min(self.emitted, n)
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
            self._decoder.decode(b"".join(reply.pieces[: self.emitted]), final=False)


# --------------------------------------------------------------------------------------------
# stream
# --------------------------------------------------------------------------------------------
def stream(
    backend: SteerableBackend | BlackBoxBackend,
    messages: Sequence[dict[str, str]] | str,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    assistant_prefix: str = "",
    stop: Sequence[str] = (),
) -> Iterator[Event]:
    """Generate one reply to a chat (`messages`, or one question string), yielding events. The arms'
    query is the last user turn. Uses one session of the backend for the whole reply.

    `assistant_prefix` starts the assistant's turn (a cloze such as "The capital of Chad is"): the model
    continues it; the visible reply is the continuation.

    `stop`: strings that end the reply (finish reason "stop") once they stand in text that can no longer
    be rewound; the reply's text still holds the stop string (a caller cuts it, as serve does). A chat
    API's draft is not stopped early: its caller cuts it.

    Token events carry text once it can no longer be rewound (`holdback`), or at once with explicit
    Rewind events (`emit`). The last event is Done, which carries the receipt. On a black-box backend (a
    chat API) the reply is a draft and at most one revise pass (revise.py); it takes no `assistant_prefix`.
    """
    if router is None:
        from .router import route

        router = route
    if not isinstance(backend, SteerableBackend):  # a chat API: the draft, then at most one revise pass
        from .revise import revise_stream

        if assistant_prefix:
            raise InputError(
                f"assistant_prefix={assistant_prefix[:40]!r}: a chat API cannot continue an assistant turn; "
                "put the text in the question instead"
            )
        chat = conversation(messages, config.system_prompt)
        yield from revise_stream(backend, chat, config, dict(arms or {}), router)
        return
    chat = conversation(messages, config.system_prompt)
    loop = _ReplyLoop(backend, chat, config, dict(arms or {}), router, assistant_prefix, stop)
    try:
        yield from loop.run()
    finally:
        loop.close()


class _ReplyLoop:
    """One reply: its session on the backend, its reply state, trigger policy, emitter and rounds."""

    def __init__(
        self,
        backend: SteerableBackend,
        messages: list[dict[str, str]],
        config: Config,
        arms: dict[str, Arm],
        router: Callable[..., Any],
        assistant_prefix: str,
        stop: Sequence[str] = (),
    ) -> None:
        self.backend, self.config, self.arms, self.router = backend, config, arms, router
        self.messages = messages
        self.question = last_user_turn(messages)
        self.started = time.monotonic()
        self.scored = config.mode != "off"
        self.intervening = config.mode == "intervene"
        probe = _probe_for(backend, config) if self.scored else None
        self.policy = TriggerPolicy(config, self.question, assistant_prefix, probe)
        # Hidden states only when a probe will read them (the backend then keeps its tapped layer's state).
        self.sampling = Sampling(
            config.temperature, config.seed, self.scored, config.top_logprobs, hidden=self.policy.probe is not None
        )
        self.assistant_prefix = assistant_prefix
        # Set by _prepare_prompt (a server renders and tokenizes: it may fail, and the receipt says so).
        self.layout: PromptLayout | None = None
        self.prefix_tokens: list[int] = []
        self.open_tokens: list[int] = []
        self.prompt_tokens: list[int] = []
        self.context = _Context([], 0)
        self.emitter = _Emitter(config.stream == "holdback")
        self.reply = _Reply()
        self.rounds: list[ConvergenceRecord] = []
        self.would_trigger: list[dict] = []  # detect mode: crossings recorded, never acted on
        self.unchecked: _Unchecked | None = None  # a rewrite whose sentence is not finished: held back
        self.reverted = False  # a rewrite failed its check and was dropped: no further rounds
        self.arm_cache: dict = {}  # per reply: (arm, question, class) -> evidence list
        self.decoded = 0  # every token sampled, including dropped ones
        self.injected_total = 0
        self.finish_reason = "length"
        self.fault: dict[str, Any] | None = None  # the backend failed mid-reply: what happened (receipt "fault")
        self.eos = backend.eos_token_ids
        self.max_decoded = config.max_tokens * (config.max_rounds + 2) + 8  # every round may rewrite, a revert redo
        self.session = backend.session()
        self.steps: Steps | None = None  # the current continuation; replaced on every rewind
        self.stop = tuple(s for s in stop if s)  # stop strings (stream's `stop`; an empty one never stops)
        self.stop_searched = 0  # characters of unchangeable reply text already searched for them

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
        self.session.close()

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> Iterator[Event]:
        try:
            yield from self._decode()
        except BackendFault as fault:
            yield from self._on_fault(fault)
        yield from self.emitter.upto(self.reply, len(self.reply.tokens), final=True)
        yield self._done()

    def _prepare_prompt(self) -> None:
        """Render the chat with the model's template and tokenize it; the cloze prefix is the user's text:
        plain tokens, like every message."""
        backend = self.backend
        self.layout = PromptLayout.from_template(backend.chat_prompt, self.messages)
        prefix = self.assistant_prefix
        self.prefix_tokens = backend.tokenize(prefix) if prefix else []
        self.open_tokens = self.layout.open_tokens(backend.tokenize)
        self.prompt_tokens = self.layout.body_tokens(backend.tokenize) + self.open_tokens + self.prefix_tokens
        turn_start = len(self.prompt_tokens) - len(self.prefix_tokens) - len(self.open_tokens)
        self.context = _Context(list(self.prompt_tokens), turn_start)

    def _decode(self) -> Iterator[Event]:
        c, reply = self.config, self.reply
        self._prepare_prompt()
        self._continue_from(self.prompt_tokens)
        while len(reply.tokens) < c.max_tokens and self.decoded < self.max_decoded:
            assert self.steps is not None  # set before the loop, replaced on every rewind
            step = next(self.steps)
            self.decoded += 1
            if step.token in self.eos:
                if (yield from self._judged_at_end_of_turn()):
                    continue  # the probe found the first sentence doubtful: rewound
                if (yield from self._end_of_turn()):
                    break
                continue
            value, crossed = self._measure(step)
            reply.add(step, value)
            if crossed and self._may_trigger() and (yield from self._on_trigger()):
                continue  # rewound: the next step continues after the injected evidence
            if self.unchecked is not None and (yield from self._check_rewrite(len(reply.tokens) >= c.max_tokens)):
                continue  # a failed rewrite went back (or is tried again)
            self.context.tokens.append(reply.tokens[-1])  # fed when the next step is asked for
            yield from self.emitter.upto(reply, self._final_upto())
            if self.stop and self._reached_stop():
                self.finish_reason = "stop"
                break

    def _on_fault(self, fault: BackendFault) -> Iterator[Event]:
        """The backend failed mid-reply: the reply ends with what was received, and a rewrite not yet shown
        to have used its evidence is dropped for the reply written without it (never worse than ungrounded)."""
        self.finish_reason = "error"
        self.fault = {"kind": fault.kind, "status": fault.status, "message": str(fault)}
        if self.unchecked is not None:
            yield from self._revert(f"was cut off when the backend failed ({fault.kind})", session=False)
        self.fault["at_token"] = len(self.reply.tokens)

    def _continue_from(
        self, tokens: list[int], batch_until: int | None = None, banned: frozenset[int] = frozenset()
    ) -> None:
        """Abort the current steps and continue the session from `tokens`."""
        if self.steps is not None:
            self.steps.close()
        self.steps = self.session.steps(tokens, self.sampling, batch_until=batch_until, banned=banned)

    def _measure(self, step: Step) -> tuple[float, bool]:
        """The window statistic after this step, and whether an eligible window crossed the threshold."""
        if not self.scored:
            return math.nan, False
        return self.policy.push(
            len(self.reply.tokens), step.piece.decode("utf-8", "replace"), step.surprise, step.entropy, step.hidden
        )

    def _judged_at_end_of_turn(self) -> Generator[Event, None, bool]:
        """The turn ended with the first sentence still waiting for the probe: judge it; True when rewound.
        The last reply token counts as the triggering one (as if not yet fed), like any trigger's."""
        if not (self.scored and self._may_trigger() and self.reply.tokens and self.policy.end_of_turn()):
            return False
        self.context.tokens.pop()
        if (yield from self._on_trigger()):
            return True
        self.context.tokens.append(self.reply.tokens[-1])
        return False

    def _may_trigger(self) -> bool:
        return len(self.rounds) + len(self.would_trigger) < self.config.max_rounds and not self.reverted

    def _final_upto(self) -> int:
        """Reply tokens to show now: all of them in emit streaming, those that can no longer change in holdback."""
        return self._unchangeable_upto() if self.emitter.holdback else len(self.reply.tokens)

    def _reached_stop(self) -> bool:
        """Whether a stop string stands in the reply text that no rewind can change any more (searched once)."""
        text = self.reply.text(self._unchangeable_upto())
        start = max(0, self.stop_searched - max(len(s) for s in self.stop) + 1)
        self.stop_searched = len(text)
        return first_stop(text, self.stop, start) is not None

    def _unchangeable_upto(self) -> int:
        """Reply tokens that no round, rewrite check or revert can change any more."""
        n = len(self.reply.tokens)
        can_rewind = self.intervening and len(self.rounds) < self.config.max_rounds and not self.reverted
        final_upto = self.policy.first_rewindable(n) if can_rewind else n
        return min(final_upto, self.unchecked.span_start) if self.unchecked is not None else final_upto

    def _start_over_from(self, n: int) -> None:
        """The reply was cut back to `n` tokens: the window starts afresh and emit streaming resumes there."""
        self.policy.reset(word_dropped=True)
        self.emitter.restart(self.reply, n)

    # --- a trigger and its round ------------------------------------------------------------------
    def _on_trigger(self) -> Generator[Event, None, bool]:
        """Record (detect) or act on (intervene) a crossing; True when the reply was rewound."""
        reply, policy = self.reply, self.policy
        statistic, value, bar = policy.crossing
        trigger = Trigger(
            token_index=len(reply.tokens) - 1,
            statistic=statistic,
            value=value,
            threshold=bar,
            span_start=policy.span_start,
            span_text=reply.tail(policy.span_start),
            round=len(self.rounds) + len(self.would_trigger) + 1,
        )
        if not self.intervening:
            self.would_trigger.append(rounded_trigger(trigger))
            policy.reset()
            return False
        yield trigger
        before = None
        if self.config.revert_unused_evidence and self.unchecked is None:
            before = _Unchecked(
                _Snapshot.take(reply, len(reply.tokens) - 1, self.context),
                span_start=trigger.span_start,
                first_round=len(self.rounds),
            )
        record = yield from self._round(trigger)
        if record.action != "rewound":
            policy.reset()  # after a round (acted on or not) the window starts afresh
            return False
        self.unchecked = self.unchecked or before
        if self.unchecked is not None:
            self.unchecked.check_from = trigger.span_start
            self.unchecked.evidence.append(record.evidence or "")
            self.unchecked.after_injection = _Snapshot.take(reply, len(reply.tokens), self.context)
        self.injected_total += record.tokens_injected
        self._start_over_from(len(reply.tokens))
        return True

    def _round(self, trigger: Trigger) -> Generator[Event, None, ConvergenceRecord]:
        """One grounding round: route, ask the arms, and rewind with the evidence or resume unmodified."""
        started = time.monotonic()
        prefix_text = b"".join(self.backend.token_bytes(t) for t in self.prefix_tokens).decode("utf-8", "replace")
        # The sentence so far includes a cloze prefix the assistant turn started with.
        asked_from, asked_to = self.policy.query_span(len(self.reply.tokens))
        query = Query(
            span=self.reply.between(asked_from, asked_to).strip(),
            question=self.question,
            sentence=current_sentence(prefix_text + self.reply.text()),
        )
        chosen, record = ground_span(
            self.config, self.arms, self.router, query, rounded_trigger(trigger), trigger.round, self.arm_cache
        )
        earlier = list(self.rounds)
        self.rounds.append(record)  # in the receipt even if the backend fails during the rewind
        resumed = why_not_grounded(record, chosen, earlier)
        order = tuple(record.arm_order)
        if resumed is not None:
            record.reason = resumed
            record.latency_ms = round((time.monotonic() - started) * 1000, 2)
            source, evidence = (chosen.source, chosen.evidence) if chosen else (None, None)
            yield Grounding(trigger.round, record.span_class, order, False, source, evidence, resumed)
            return record
        assert chosen is not None
        yield Grounding(
            trigger.round, record.span_class, order, True, chosen.source, chosen.evidence, "evidence accepted"
        )
        yield from self._rewind(record, trigger, chosen)
        record.latency_ms = round((time.monotonic() - started) * 1000, 2)
        return record

    def _rewind(self, record: ConvergenceRecord, trigger: Trigger, chosen: Evidence) -> Generator[Event, None, None]:
        """Drop the span, inject the evidence and re-feed the kept prefix. The span's tokens always leave
        the context (the triggering token was never fed, so one fewer); `system_turn` also drops the open
        assistant turn, so the evidence sits in a system turn right before a fresh assistant turn."""
        reply, context = self.reply, self.context
        span_len = len(reply.tokens) - trigger.span_start
        dropped_text = reply.tail(trigger.span_start)
        keep = context.turn_start if self.config.injection == "system_turn" else len(context.tokens) - (span_len - 1)
        injected = evidence_text(self.config, chosen)
        segment, refeed, turn_start = self._segment(injected, keep, reply.tokens[: trigger.span_start])
        new_context = context.tokens[:keep] + segment + refeed
        try:
            self._continue_from(new_context)
        except BackendFault as fault:
            record.reason = f"grounded by {chosen.source}, but the resume failed ({fault.kind}): reply kept as written"
            raise
        trimmed, method = self.session.last_continue
        # A server session reports how its resume request went (in-process sessions have no such record).
        request = (self.session.last_request if isinstance(self.session, RequestLog) else None) or {}
        record.prompt_path, record.cached_tokens = request.get("path"), request.get("cached")
        context.tokens[:] = new_context
        context.turn_start = context.turn_start if turn_start is None else turn_start
        reply.cut(trigger.span_start)
        record.action, record.reason = "rewound", f"grounded by {chosen.source}"
        record.tokens_dropped, record.dropped_text, record.injected_text = span_len, dropped_text, injected
        record.tokens_trimmed, record.rewind_method = trimmed, method
        record.tokens_injected = len(segment) + len(refeed)
        yield Rewind(trigger.round, self.emitter.shown_after(trigger.span_start), dropped_text, record.tokens_injected)

    def _segment(self, injected: str, keep: int, kept_prefix: list[int]) -> tuple[list[int], list[int], int | None]:
        """(evidence segment, tokens re-fed after it, where the new assistant turn starts or None)."""
        tokenize, layout = self.backend.tokenize, self.layout
        assert layout is not None  # prepared before the first step
        if self.config.injection == "system_turn":
            turn = layout.segment_tokens(tokenize, injected, "system_turn")
            return turn + self.open_tokens, self.prefix_tokens + kept_prefix, keep + len(turn)
        if self.config.injection == "close_reopen":
            return layout.segment_tokens(tokenize, injected, "close_reopen"), self.prefix_tokens + kept_prefix, None
        return layout.segment_tokens(tokenize, injected, "inline"), [], None

    # --- checking a rewrite -----------------------------------------------------------------------
    def _end_of_turn(self) -> Generator[Event, None, bool]:
        """The model ended its turn: True when the reply is finished, False when a failed rewrite went back."""
        problem = None
        if self.unchecked is not None:
            problem = _rewrite_verdict(self.reply, self.unchecked, self.question, final=True)[1]
        if problem is None:
            self.finish_reason = "stop"
            return True
        yield from self._failed_check(problem, at_end_of_turn=True)
        return False

    def _check_rewrite(self, final: bool) -> Generator[Event, None, bool]:
        """Check the latest rewrite once its sentence is finished; True when it failed and went back."""
        assert self.unchecked is not None
        checked, problem = _rewrite_verdict(self.reply, self.unchecked, self.question, final)
        if problem is not None:
            yield from self._failed_check(problem, at_end_of_turn=False)
            return True
        if checked:
            self.unchecked = None  # the rewrite drew on its evidence and answers the question: it stands
        return False

    def _failed_check(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """A rewrite failed its check: one more try if allowed, else back to the reply written without it."""
        u = self.unchecked
        assert u is not None
        if self.config.retry_failed_rewrite and not u.tried_again and u.after_injection is not None:
            yield from self._try_again(problem, at_end_of_turn)
        else:
            yield from self._revert(problem)

    def _try_again(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """One more try before a failed rewrite is dropped, the evidence still in context: a rewrite cut
        short by its end of turn goes on past it ("… is vpn." inside "vpn.acme.example"); any other is
        written again from the rewind point with its first token banned ("I'm ready to help.")."""
        u, reply = self.unchecked, self.reply
        assert u is not None and u.after_injection is not None
        u.tried_again = True
        start = u.check_from
        failed = reply.tail(start)
        rewound = next(r for r in reversed(self.rounds) if r.action == "rewound")  # the round whose rewrite failed
        if at_end_of_turn and cut_short(failed, u.evidence):
            how = "continued past the end of turn"
            self._continue_from(self.context.tokens, banned=frozenset(self.eos))
        else:
            how = "rewritten from the rewind point with its first token banned"
            banned = frozenset({reply.tokens[start]}) if len(reply.tokens) > start else frozenset()
            shown = self.emitter.shown_after(start)
            self._restore(u.after_injection, banned)
            self._start_over_from(start)
            yield Rewind(rewound.round, shown, failed, 0)
        rewound.retries.append({"problem": problem, "rewrite": failed, "how": how})

    def _revert(self, problem: str, session: bool = True) -> Generator[Event, None, None]:
        """The rewrite failed its check: back to the reply written without it; no more rounds. `session`
        False: only the reply goes back (the backend failed; nothing more will be decoded)."""
        u, reply = self.unchecked, self.reply
        assert u is not None
        text = reply.text()
        # The rewrite up to the end of the sentence that was checked, not the word that showed it had ended.
        rewritten = text[len(reply.text(u.span_start)) : sentence_end(text, len(reply.text(u.check_from)))]
        shown = self.emitter.shown_after(u.span_start)
        if session:
            self._restore(u.before)
        else:
            self.reply.restore(u.before.reply)
        for record in self.rounds[u.first_round :]:
            if record.action == "rewound":
                record.action, record.rewritten_text = "reverted", rewritten
                record.reason = (
                    f"{record.reason}, but the rewrite {rewritten.strip()[:80]!r} {problem}: "
                    "kept the reply written without it"
                )
        self.unchecked, self.reverted = None, True
        self._start_over_from(u.span_start)
        yield Rewind(self.rounds[-1].round, shown, rewritten, 0, reverted=True)

    def _restore(self, saved: _Snapshot, banned: frozenset[int] = frozenset()) -> None:
        """Put the session, context and reply back as they were at `saved`. The prompt is re-fed in one
        batch and the reply one token at a time, the schedule of the first time: batched and one-token
        kernels round differently, and the reply must come back exactly as written without evidence."""
        self._continue_from(saved.context_tokens, batch_until=len(self.prompt_tokens), banned=banned)
        self.context.tokens[:] = saved.context_tokens
        self.context.turn_start = saved.turn_start
        self.reply.restore(saved.reply)

    # --- the result -------------------------------------------------------------------------------
    def _probe_receipt(self) -> dict[str, Any] | None:
        """Which probe judged the first sentence, and its score (None: no probe, or it never judged)."""
        probe = self.policy.probe
        if probe is None:
            return None
        score = self.policy.probe_score
        return probe.to_dict() | {"score": None if score is None else round(score, 4)}

    def _done(self) -> Done:
        reply, c = self.reply, self.config
        text = reply.text()
        surprise_summary: dict[str, Any] | None = aggregates(reply.surprises, c.tail_cut) if self.scored else None
        if surprise_summary is not None:
            # The highest eligible rolling statistic seen while decoding: what the gate compares to the threshold.
            surprise_summary["window_max"] = self.policy.window_max
            surprise_summary["statistic"] = c.statistic
        rounds = [r.to_dict() for r in self.rounds]
        result = {
            "reply": text,
            "finish_reason": self.finish_reason,
            "n_tokens": len(reply.tokens),
            "tokens_decoded": self.decoded,
            "tokens_injected": self.injected_total,
            "prompt_tokens": len(self.prompt_tokens),
            "surprise": surprise_summary,
            "token_surprises": [round(x, 4) for x in reply.surprises] if self.scored else [],
            "token_entropies": [round(x, 4) for x in reply.entropies] if self.scored else [],
            "token_ids": list(reply.tokens),
            "token_top_logprobs": [[[t, round(lp, 4)] for t, lp in top] for top in reply.top],
            "rounds": rounds,
            "would_trigger": self.would_trigger,
            "latency_ms": round((time.monotonic() - self.started) * 1000, 2),
            "messages": self.messages,
            "question": self.question,
            "question_kind": self.policy.kind,
            "threshold": self.policy.threshold,
            "probe": self._probe_receipt(),
            "fault": self.fault,
        }
        return Done(
            text=text, finish_reason=self.finish_reason, n_tokens=len(reply.tokens), rounds=rounds, receipt=result
        )


def _probe_for(backend: SteerableBackend, config: Config) -> TriggerProbe | None:
    """The trigger probe the config names, if the backend reads the layer it was fitted on (runtime taps it)."""
    tapped = backend.tapped_layer if isinstance(backend, HiddenStates) else None
    if tapped is None:  # servers, cloud APIs, several sessions: nothing to look up per reply
        return None
    probe = resolve_probe(config.probe, backend.model_id)
    return probe if probe is not None and probe.layer == tapped else None


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
    backend: SteerableBackend | BlackBoxBackend,
    messages: Sequence[dict[str, str]] | str,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    on_event: Callable[[Event], None] | None = None,
    assistant_prefix: str = "",
) -> Result:
    """Run the stream to the end and build the receipt (not written: see receipts.ReceiptWriter)."""
    done: Done | None = None
    for event in stream(backend, messages, config, arms, router, assistant_prefix=assistant_prefix):
        if on_event is not None:
            on_event(event)
        if isinstance(event, Done):
            done = event
    assert done is not None and done.receipt is not None
    receipt = build_receipt_for(backend, config, done.receipt)
    return Result(done.text, done.finish_reason, done.n_tokens, done.rounds, receipt)


def build_receipt_for(backend: SteerableBackend | BlackBoxBackend, config: Config, result: dict) -> dict:
    from .canary import groundedness_canary
    from .receipts import build_receipt

    surprise = result["surprise"]
    canary = (
        groundedness_canary(surprise or {}, result["rounds"], result["threshold"])
        if surprise
        else {
            "verdict": "not_scored",
            "reason": "mode=off: no surprise measured",
            "uncertainty": None,
            "anchoring": None,
        }
    )
    return build_receipt(
        reply_id=uuid.uuid4().hex,
        created=time.time(),
        model=backend.model_id,
        backend=backend.name,
        config=config.to_dict(),
        prompt=result["question"],
        messages=result["messages"],
        reply=result["reply"],
        n_tokens=result["n_tokens"],
        surprise=surprise,
        canary=canary,
        rounds=result["rounds"],
        mode=config.mode,
        finish_reason=result["finish_reason"],
        fault=result.get("fault"),
        extra={
            k: result[k]
            for k in (
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
        }
        # The revise pass on a chat API: the draft, its flagged spans, evidence, revision; why no logprobs came.
        | {k: result[k] for k in ("revise", "no_logprobs", "token_pieces", "probe") if result.get(k) is not None},
    )

"""The ONE loop: decode, measure surprise, and when the rolling window crosses the threshold, ground
the doubtful span, rewind it (KV cache kept for everything before it), inject evidence, resume.

Layered like mlx-lm's generate.py:
  step      the backend seam: `session.steps(tokens)` continues a context and yields Steps
            (token, piece, surprise, entropy, top-k logprobs); backends/__init__.py
  stream    the loop (`_ReplyLoop`); yields Token / Trigger / Grounding / Rewind / Done events
  generate  runs the stream to the end and returns the result with its receipt

Its parts, each in its own module: the reply state, session and emitter (reply.py), the window and
trigger policy (trigger.py, shared with calibrate), a round's arm calls (grounding.py), the rewrite
check with its retry and revert (rewrite.py), and the typed result (result.py). The loop knows no
backend or arm by name: it gets a `SteerableBackend` and a mapping of arm name to `Arm`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..arms import Arm, Evidence, Query
from ..backends import BlackBoxBackend, Grammars, HiddenStates, Sampling, SteerableBackend, Step, TokenGrammar
from ..config import Config, evidence_text, shaping_of
from ..errors import BackendFault, InputError
from ..text import current_sentence, ends_sentence, sentence_start
from .claims import sentence_arm_query
from .events import UNSAID_ITEM, Done, Event, Grounding, Rewind, Trigger
from .grounding import ground_span, why_not_grounded
from .patch import OwnWords, patchable
from .probe import TriggerProbe, resolve_probe
from .prompting import Continuation, ReplyPrompt, conversation, last_user_turn
from .receipts import ConvergenceRecord, rounded_trigger
from .repetition import RepetitionGuard
from .reply import PARAGRAPH_END, Decoding, Emitter, Reply, Snapshot, StopStrings, whole_end
from .result import ReplyResult, build_receipt, rounded, surprise_summary
from .rewrite import RewriteCheck, Unchecked
from .scribe import SessionScribe
from .structured import ResponseFormat, reply_grammar, told_format, with_llama_server_rules
from .tools import CallWatch, ToolUse
from .trigger import TriggerPolicy


# --------------------------------------------------------------------------------------------
# stream
# --------------------------------------------------------------------------------------------
def stream(
    backend: SteerableBackend | BlackBoxBackend,
    messages: Sequence[dict[str, str]] | str | Continuation,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    assistant_prefix: str = "",
    stop: Sequence[str] = (),
    tools: ToolUse | None = None,
    output: ResponseFormat | None = None,
) -> Iterator[Event]:
    """Generate one reply to a chat (`messages`, or one question string, or a raw prompt to continue:
    prompting.Continuation), yielding events; the arms' query is the last user turn (a raw prompt's text),
    and one session of the backend serves the whole reply. `assistant_prefix` starts
    the assistant's turn (a cloze such as "The capital of Chad is"); the visible reply is its continuation.

    `stop`: strings that end the reply (finish reason "stop") once they stand in text that can no longer
    be rewound; the reply's text still holds the stop string (a caller cuts it, as serve does).

    Token events carry text once it can no longer be rewound (`holdback`), or at once with explicit
    Rewind events (`emit`). The last event is Done, with the reply's result. On a black-box backend (a
    chat API) the reply is a draft and at most one revise pass (revise.py): no `assistant_prefix`, and its
    caller cuts the stop strings.

    `tools` offers tools (tools.ToolUse): the reply may end in calls, which are scored but never rewound
    (the gate grounds prose; a call's arguments are the client's code's input). `output` holds the reply to a
    JSON format under a grammar (structured.py); the gate grounds its string values like prose.
    """
    router = router or _default_router()
    if not isinstance(backend, SteerableBackend):
        yield from _revise(backend, messages, config, dict(arms or {}), router, assistant_prefix)
        return
    grammar, chat, config = _prepared(backend, messages, config, output, tools)
    stop = (*stop, *(tools.stops if tools else ()), *((PARAGRAPH_END,) if _ends_whole(config) else ()))
    loop = _ReplyLoop(backend, chat, config, dict(arms or {}), router, assistant_prefix, stop, tools, grammar)
    try:
        yield from loop.run()
    finally:
        loop.close()


def _prepared(
    backend: SteerableBackend,
    messages: Sequence[dict[str, str]] | str | Continuation,
    config: Config,
    output: ResponseFormat | None,
    tools: ToolUse | None,
) -> tuple[TokenGrammar | None, list[dict[str, str]] | Continuation, Config]:
    """The reply's grammar, what it answers (a checked chat, or a raw prompt as it is) and its config."""
    if isinstance(messages, Continuation):
        return None, messages, _continuing(config, tools, output)
    return _structured(backend, conversation(messages, config.system_prompt), config, output, tools)


def _structured(
    backend: SteerableBackend,
    chat: list[dict[str, str]],
    config: Config,
    output: ResponseFormat | None,
    tools: ToolUse | None,
) -> tuple[TokenGrammar | None, list[dict[str, str]], Config]:
    """A JSON reply's grammar, its chat told the format, and the config it runs under (structured.py); a
    forced tool call's grammar where the backend has grammars (tools.ToolUse.call_grammar)."""
    if output is not None:
        return reply_grammar(backend, output), *told_format(chat, output, config)
    if tools is None or not isinstance(backend, Grammars) or (call := tools.call_grammar()) is None:
        return None, chat, config
    return backend.grammar(with_llama_server_rules(call)), chat, config


def _continuing(config: Config, tools: ToolUse | None, output: ResponseFormat | None) -> Config:
    """The config a raw prompt (prompting.Continuation) is continued under: evidence inline, since a raw text
    has no turns to put a system turn between; tools and JSON formats live in chat templates only."""
    if tools is not None or output is not None:
        what = "tools" if tools is not None else "output"
        raise InputError(f"{what} was given with a raw prompt (Continuation); offer {what} in a chat instead")
    return config if config.injection == "inline" else replace(config, injection="inline")


def _default_router() -> Callable[..., Any]:
    from .router import route

    return route


def _revise(
    backend: BlackBoxBackend,
    messages: Sequence[dict[str, str]] | str | Continuation,
    config: Config,
    arms: dict[str, Arm],
    router: Callable[..., Any],
    assistant_prefix: str,
) -> Iterator[Event]:
    """A chat API: the draft, then at most one revise pass."""
    from .revise import revise_stream

    if isinstance(messages, Continuation):
        raise InputError(
            f"backend {getattr(backend, 'name', type(backend).__name__)!r} writes chat replies only: it cannot "
            "continue a raw prompt; send the prompt as a chat's user turn instead"
        )
    if assistant_prefix:
        raise InputError(
            f"assistant_prefix={assistant_prefix[:40]!r}: a chat API cannot continue an assistant turn; "
            "put the text in the question instead"
        )
    yield from revise_stream(backend, conversation(messages, config.system_prompt), config, arms, router)


class _ReplyLoop:
    """One reply: its decoding session, reply state, trigger policy, emitter, rounds and rewrite check."""

    def __init__(
        self,
        backend: SteerableBackend,
        messages: list[dict[str, str]] | Continuation,
        config: Config,
        arms: dict[str, Arm],
        router: Callable[..., Any],
        assistant_prefix: str,
        stop: Sequence[str] = (),
        tools: ToolUse | None = None,
        grammar: TokenGrammar | None = None,
    ) -> None:
        self.backend, self.config, self.arms, self.router = backend, config, arms, router
        self.messages, self.question = messages, last_user_turn(messages)
        self.assistant_prefix, self.started, self.calls = assistant_prefix, time.monotonic(), CallWatch(tools)
        self.scored, self.intervening = config.mode != "off", config.mode == "intervene"
        probe = _probe_for(backend, config, grammar) if self.scored else None
        self.policy = _trigger_policy(config, self.question, assistant_prefix, probe, grammar)
        self.prompt: ReplyPrompt | None = None  # rendered at the start (a server may fail: the receipt says so)
        self.emitter, self.reply, self.stops = Emitter(config.stream == "holdback"), Reply(), StopStrings(stop)
        sampling = _sampling(config, self.scored, self.policy.probe, self.reply, grammar)
        self.decoding = Decoding(backend.session(), sampling)
        self.scribe = SessionScribe(backend, self.decoding)  # lent to arms that have the model write (programs)
        self.rounds: list[ConvergenceRecord] = []
        self.would_trigger: list[dict] = []  # detect mode: crossings recorded, never acted on
        self.eos, state = frozenset(backend.eos_token_ids), (self.reply, self.decoding, self.emitter, self.rounds)
        ask = lambda part, pushed_past: _ground_unsaid(self, part, pushed_past)  # noqa: E731
        self.rewrites = RewriteCheck(
            config, self.question, state, self.eos, self._start_over_from, self._evidence_leaves, backend, ask
        )
        self.arm_cache: dict = {}  # per reply: (arm, question, class) -> evidence list
        self.injected_total, self.finish_reason, self.at_end_of_turn = 0, "length", False  # last: judged at turn end
        self.own_words = OwnWords(config.paragraph_goes_on == "own_sentence")  # the reply as the context holds it
        self.guard = RepetitionGuard(config.paragraph_loop_guard if not self.own_words.enabled else 0)
        self.fault: dict[str, Any] | None = None  # the backend failed mid-reply: what happened (receipt "fault")
        self.max_decoded = _decode_budget(config)

    def close(self) -> None:
        self.decoding.close()

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> Iterator[Event]:
        try:
            yield from self._decode()
        except BackendFault as fault:
            yield from self._on_fault(fault)
        _end_unrepeated(self)
        _end_whole(self)
        yield from self.emitter.upto(self.reply, len(self.reply.tokens), final=True)
        yield Done(_result(self))

    def _decode(self) -> Iterator[Event]:
        c, reply = self.config, self.reply
        self.prompt = ReplyPrompt.build(self.backend, self.messages, self.assistant_prefix, self.calls.tools)
        self.decoding.start(self.prompt.tokens, self.prompt.turn_start)
        while len(reply.tokens) < c.max_tokens and self.decoding.decoded < self.max_decoded:
            step = self.decoding.next_step()
            if step.token in self.eos:
                if (yield from self._judged_at_end_of_turn()):
                    continue  # the probe found the first sentence doubtful: rewound
                if (yield from self.rewrites.end_of_turn()):
                    self.finish_reason = "stop"
                    break
                continue  # a failed rewrite went back (or is tried again)
            value, crossed = self._measure(step)
            reply.add(step, value)
            if (yield from self._went_into_repetition()):
                continue  # the paragraph went on from a rewrite into a loop: written again from the model's own words
            if crossed and self._may_trigger() and (yield from self._on_trigger()):
                continue  # rewound: the next step continues after the injected evidence
            if self.rewrites.pending is not None and (
                yield from self.rewrites.check(len(reply.tokens) >= c.max_tokens)
            ):
                continue  # a failed rewrite went back (or is tried again)
            self.decoding.context.tokens.append(reply.tokens[-1])  # fed when the next step is asked for
            if self.stops and self.stops.reached(reply.text(self._unchangeable_upto())):
                self.finish_reason = "stop"  # the text from the stop on is cut before it is shown (_end_whole)
                break
            yield from self.emitter.upto(reply, self._final_upto())

    def _on_fault(self, fault: BackendFault) -> Iterator[Event]:
        """The backend failed mid-reply: the reply ends with what was received, and a rewrite not yet shown
        to have used its evidence is dropped for the reply written without it (never worse than ungrounded)."""
        self.finish_reason = "error"
        self.fault = {"kind": fault.kind, "status": fault.status, "message": str(fault)}
        yield from self.rewrites.on_fault(fault.kind)
        self.fault["at_token"] = len(self.reply.tokens)

    def _measure(self, step: Step) -> tuple[float, bool]:
        """The window statistic after this step, and whether an eligible window crossed the threshold."""
        if not self.scored:
            return math.nan, False
        piece = step.piece.decode("utf-8", "replace")
        return self.policy.push(len(self.reply.tokens), piece, step.surprise, step.entropy, step.hidden)

    def _judged_at_end_of_turn(self) -> Generator[Event, None, bool]:
        """The turn ended with the first sentence still waiting for the probe: judge it; True when rewound.
        The last reply token counts as the triggering one (as if not yet fed), like any trigger's."""
        if self.rewrites.item_pending:  # an item round's check comes first (rewrites.end_of_turn)
            return False
        if not (self.scored and self._may_trigger() and self.reply.tokens and self.policy.end_of_turn()):
            return False
        context = self.decoding.context
        context.tokens.pop()
        self.at_end_of_turn = True
        rewound = yield from self._on_trigger()
        self.at_end_of_turn = False
        if rewound:
            return True
        context.tokens.append(self.reply.tokens[-1])
        return False

    def _may_trigger(self) -> bool:
        return not self.calls.opened(self.reply) and self._rounds_left(len(self.rounds) + len(self.would_trigger))

    def _final_upto(self) -> int:
        """Reply tokens to show now: all of them in emit streaming, those that can no longer change in holdback."""
        return _whole_upto(self, self._unchangeable_upto() if self.emitter.holdback else len(self.reply.tokens))

    def _unchangeable_upto(self) -> int:
        """Reply tokens that no round, rewrite check or revert can change any more."""
        n = len(self.reply.tokens)
        can_rewind = self.intervening and self._rounds_left(len(self.rounds))
        final_upto = self.policy.first_rewindable(n) if can_rewind else n
        held = [at for at in (self.rewrites.held_from, self.guard.held_from) if at is not None]
        return min([final_upto, *held])

    def _rounds_left(self, used: int) -> bool:
        """Per reply (reply scope: none after a revert), or in sentence scope one per sentence (the judge's)
        up to paragraph_rounds, a reverted sentence stopping only itself."""
        if self.policy.sentences is not None:
            return used < self.config.paragraph_rounds
        return used < self.config.max_rounds and not self.rewrites.reverted

    def _evidence_leaves(self, at_end_of_turn: bool, stood: Unchecked) -> None:
        """Sentence scope: a rewrite stood, so its evidence leaves the context (patch.py) and the reply goes on
        after the model's own sentence or after the rewrite. A turn's end it went on from is banned once."""
        end = patchable(self.reply, stood, self.backend.token_bytes, self.emitter.emitted)
        patched, record = self.own_words.patch_in(self.reply, stood, end), self.rewrites.latest_rewound()
        record.stood("own_sentence" if patched else "rewrite")
        self.guard.watch_from(self.reply, stood, None if patched else end, record)  # unless patched: watched
        self._go_on(banned=self.eos if at_end_of_turn else frozenset())
        if patched:
            self._start_over_from(len(self.reply.tokens), opens_sentence=True)  # "symbol F." ended one

    def _went_into_repetition(self) -> Generator[Event, None, bool]:
        """A rewrite led into a loop: written again from its own words, or cut (_left_loop_owing); True if so."""
        back = self.guard.repeated(self.reply)  # its round's record holds the loop dropped
        if back is None:
            return (yield from _left_loop_owing(self))
        shown = self.emitter.shown_after(back.end)
        self.own_words.put_back(self.reply, back.start, back.own, back.end)
        self._go_on(frozenset())
        self._start_over_from(back.end, opens_sentence=True)
        yield Rewind(back.record.round, shown, back.record.went_back_from or "", 0)
        return True

    def _go_on(self, banned: frozenset[int]) -> None:
        """Decoding goes on after the reply as the context holds it (own_words), no evidence in it."""
        assert self.prompt is not None
        tokens = self.prompt.tokens + self.own_words.of(self.reply.tokens, len(self.reply.tokens))
        self.decoding.continue_from(tokens, banned=banned)
        self.decoding.replace(tokens, self.prompt.turn_start)

    def _start_over_from(self, n: int, opens_sentence: bool = False) -> None:
        """The reply was cut back to `n` tokens: the window starts afresh and emit streaming resumes there."""
        pieces = [p.decode("utf-8", "replace") for p in self.reply.pieces]
        self.policy.restart(pieces, self.reply.surprises, self.reply.entropies, n, opens_sentence)
        self.emitter.restart(self.reply, n)

    # --- a trigger and its round ------------------------------------------------------------------
    def _on_trigger(self) -> Generator[Event, None, bool]:
        """Record (detect) or act on (intervene) a crossing; True when the reply was rewound."""
        if (yield from self.rewrites.item_first()):
            return True  # an item round's sentence was checked before any trigger: it stood, or went back
        trigger = _trigger_of(self)
        if not self.intervening:
            self.would_trigger.append(rounded_trigger(trigger))
            self.policy.reset()
            return False
        own_sentence = self.policy.sentences.own_claim(self.reply.tokens) if self.policy.sentences else []
        written = self.reply.copy(len(self.reply.tokens)) if own_sentence else None  # its words, for a splice
        yield trigger
        before = self.rewrites.before_round(trigger.span_start)
        record = yield from self._round(trigger)
        if record.action != "rewound":
            self.policy.reset()  # after a round (acted on or not) the window starts afresh
            return False
        self.guard.stop()  # a rewrite after the watched one: the text is changing anyway
        computed = record.span_class == "computable"
        claim = _arm_query(self) if self.policy.sentences is not None else None
        self.rewrites.opened(before, trigger.span_start, record.evidence or "", self.decoding.context, computed, claim)
        if claim is not None and self.rewrites.pending is not None:
            self.rewrites.pending.replaces(own_sentence, not self.at_end_of_turn, written)
        self.injected_total += record.tokens_injected
        self._start_over_from(len(self.reply.tokens))
        return True

    def _round(self, trigger: Trigger, query: Query | None = None) -> Generator[Event, None, ConvergenceRecord]:
        """One grounding round: route, ask the arms (`query`, else about the doubtful words), and rewind with the
        evidence or resume unmodified."""
        started, query = time.monotonic(), query or _arm_query(self)
        chosen, record = ground_span(
            self.config, self.arms, self.router, query, rounded_trigger(trigger), trigger.round, self.arm_cache
        )
        # Sentence scope: each round's evidence left with its sentence, so none of it is in the context now.
        earlier = list(self.rounds) if self.policy.sentences is None else []
        self.rounds.append(record)  # in the receipt even if the backend fails during the rewind
        resumed = why_not_grounded(record, chosen, earlier)
        if resumed is not None:
            record.resume(resumed)
            record.finish(started)
            yield _grounding(trigger, record, chosen, resumed)
            return record
        assert chosen is not None
        yield _grounding(trigger, record, chosen, None)
        yield from self._rewind(record, trigger, chosen)
        record.finish(started)
        return record

    def _rewind(self, record: ConvergenceRecord, trigger: Trigger, chosen: Evidence) -> Iterator[Event]:
        """Drop the span, inject the evidence and re-feed the kept prefix. The span's tokens always leave
        the context (the triggering token was never fed, so one fewer); `system_turn` also drops the open
        assistant turn, so the evidence sits in a system turn right before a fresh assistant turn."""
        reply, context, prompt = self.reply, self.decoding.context, self.prompt
        assert prompt is not None  # built before the first step
        span_len = len(reply.tokens) - trigger.span_start
        dropped_text = reply.tail(trigger.span_start)
        injection, keep, kept_reply = _kept(self, trigger.span_start, trigger.statistic == UNSAID_ITEM)
        injected = evidence_text(self.config, chosen)
        segment, refeed, turn_start = prompt.segment(self.backend.tokenize, injected, injection, keep, kept_reply)
        new_context = context.tokens[:keep] + segment + refeed
        # A paragraph's rewrite must write its sentence: with the evidence in a fresh turn the model may end it at once.
        banned = self.eos if self.policy.sentences is not None else frozenset()
        try:
            self.decoding.continue_from(new_context, banned=banned)
        except BackendFault as fault:
            record.resume_failed(chosen.source, fault.kind)
            raise
        self.decoding.replace(new_context, turn_start)
        reply.cut(trigger.span_start)
        injected_tokens = len(segment) + len(refeed)
        record.rewind(
            chosen.source, (span_len, dropped_text), (injected_tokens, injected), self.decoding.rewind_report()
        )
        yield Rewind(trigger.round, self.emitter.shown_after(trigger.span_start), dropped_text, injected_tokens)


def _kept(loop: _ReplyLoop, span_start: int, item: bool = False) -> tuple[str, int, list[int]]:
    """A rewind's layout: (injection, context tokens kept, reply tokens re-fed after the evidence). system_turn
    keeps the prompt before the assistant turn, close_reopen everything before the span, and both re-feed the
    reply so far (a patched sentence as the model wrote it); sentence_turn keeps the reply before the doubtful
    sentence and re-feeds that sentence's kept words only, so a round's prefill does not grow with the reply.
    An item round in a fresh turn (config.item_round_fresh_turn) re-feeds the reply's last sentence there."""
    injection, reply, context = loop.config.injection, loop.reply, loop.decoding.context
    if item and loop.config.item_round_fresh_turn:
        return _item_turn(loop)
    at_span = len(context.tokens) - (len(reply.tokens) - 1 - span_start)  # the triggering token was never fed
    kept_reply = loop.own_words.of(reply.tokens, span_start)
    sentence = loop.policy.sentences.judged[0] if loop.policy.sentences is not None else 0
    if injection == "sentence_turn" and sentence == 0:  # the reply's first sentence (or reply scope)
        injection = "system_turn"
    if injection == "system_turn":
        return injection, context.turn_start, kept_reply
    if injection == "sentence_turn":
        words = len(kept_reply) - len(loop.own_words.of(reply.tokens, sentence))
        return injection, at_span - words, kept_reply[len(kept_reply) - words :]
    return injection, at_span, kept_reply


def _item_turn(loop: _ReplyLoop) -> tuple[str, int, list[int]]:
    """An item round's fresh turn holds the reply's last sentence, all of which the context holds: the model goes on
    after it as in its own turn. An empty fresh turn was opened without a space ("… Dzongkha.The capital …" in 34
    of 187 paragraphs)."""
    reply, context = loop.reply, loop.decoding.context
    last = _last_sentence_at(reply)
    kept_reply = loop.own_words.of(reply.tokens, len(reply.tokens))
    words = len(kept_reply) - len(loop.own_words.of(reply.tokens, last))
    return "sentence_turn", len(context.tokens) - words, kept_reply[len(kept_reply) - words :]


def _last_sentence_at(reply: Reply) -> int:
    """Reply index of the token that opens the reply's last sentence."""
    text = reply.text()
    return reply.token_at(sentence_start(text, len(text.rstrip()) - 1))


NEAR_END_TOKENS = 48  # longer than almost any sentence: the one open when the budget ends started after this


def _ends_whole(config: Config) -> bool:
    return config.long_reply_ends_whole and config.sentence_scope


def _end_whole(loop: _ReplyLoop) -> None:
    """A long reply ends whole: at its paragraph's end, or at its last finished sentence when max_tokens cut it
    (reply.whole_end); only text not yet shown is cut (holdback shows no open sentence)."""
    if not _ends_whole(loop.config) or loop.finish_reason == "error":
        return
    cut = whole_end(loop.reply.text(), loop.finish_reason == "length")
    if cut is not None:
        loop.reply.cut(max(loop.reply.token_at(cut), loop.emitter.emitted))


def _left_loop_owing(loop: _ReplyLoop) -> Generator[Event, None, bool]:
    """A paragraph that owes an asked item repeated a sentence (rewrite.UnsaidItems.looped): that sentence is cut
    and the paragraph goes on from its start, its first token banned, with the item's evidence where the arms
    find some (_ground_unsaid); True if so."""
    pending = loop.rewrites.pending is not None  # the rewrite's own check decides first
    at = None if pending else loop.rewrites.unsaid.looped(loop.reply, loop.rounds, loop.emitter.emitted)
    if at is None:
        return False
    opener = loop.reply.tokens[at]
    loop.reply.cut(at)
    loop._go_on(frozenset({opener}))
    if not (yield from loop.rewrites.ground_unsaid(frozenset({opener}))):
        loop._start_over_from(at, opens_sentence=True)
    return True


def _ground_unsaid(loop: _ReplyLoop, part: str, pushed_past: frozenset[int]) -> Generator[Event, None, bool]:
    """A round for an asked item a paragraph went on for (config.ground_unsaid_items): the arms are asked about
    the question's words for it ("its currency"), and the evidence goes in after the whole reply, nothing
    rewound; the sentence written with it is checked like any rewrite. In a fresh turn (_item_turn) the reply stays
    where the context holds it; under system_turn it is fed again to its end, its last token standing in for a
    trigger's, never fed. A revert goes back to the whole reply and on past `pushed_past`, as without the round.
    True: the evidence went in."""
    n, context, fresh = len(loop.reply.tokens), loop.decoding.context, loop.config.item_round_fresh_turn
    turns = ("system_turn", "sentence_turn") if fresh else ("system_turn",)
    if not n or loop.config.injection not in turns or loop.calls.opened(loop.reply):
        return False  # the other injections keep the reply's context in place: a span to drop is needed
    before = Unchecked(Snapshot.take(loop.reply, n, context), n, len(loop.rounds), pushed_past=pushed_past)
    # system_turn: as the context holds it (the model's own words where patched in place), the reply is fed again;
    # a fresh turn keeps it where it is.
    last = None if fresh else context.tokens.pop()
    trigger = Trigger(n - 1, UNSAID_ITEM, 0.0, 0.0, n, part, len(loop.rounds) + len(loop.would_trigger) + 1)
    yield trigger
    claim = sentence_arm_query(part, loop.question, loop.scribe, asked_item=True)
    record = yield from loop._round(trigger, claim)
    if record.action != "rewound":
        if last is not None:
            context.tokens.append(last)
        return False
    # After the paragraph's last sentence the model would end it ("\n") or open a sentence as it opened the last
    # one (how its loops begin): its first token may be neither.
    last_opener = loop.reply.tokens[_last_sentence_at(loop.reply)]
    breaks = frozenset(t for line in ("\n", "\n\n") for t in loop.backend.tokenize(line)[-1:])
    loop.decoding.continue_from(list(context.tokens), banned=loop.eos | breaks | {last_opener})
    loop.rewrites.opened(before, n, record.evidence or "", context, False, claim)
    if loop.rewrites.pending is not None:
        loop.rewrites.pending.replaces([], False, None)
    loop.injected_total += record.tokens_injected
    loop._start_over_from(n, opens_sentence=True)
    return True


def _end_unrepeated(loop: _ReplyLoop) -> None:
    """What a paragraph wrote after it went on for an unsaid item (rewrite.UnsaidItems, held back until now) ends
    before its first sentence that repeats an earlier one."""
    cut = loop.rewrites.unsaid.repeat_cut(loop.reply) if loop.finish_reason != "error" else None
    if cut is not None:
        loop.reply.cut(max(cut, loop.emitter.emitted))


def _whole_upto(loop: _ReplyLoop, upto: int) -> int:
    """Near max_tokens a long reply's open sentence is held back in every mode, so that one the budget cuts is
    dropped unseen (_end_whole); elsewhere the reply streams as before."""
    config, n = loop.config, len(loop.reply.tokens)
    if not _ends_whole(config) or n < config.max_tokens - NEAR_END_TOKENS:
        return upto
    text = loop.reply.text()
    opens_at = len(text.rstrip()) if ends_sentence(text) else sentence_start(text, len(text.rstrip()) - 1)
    return min(upto, loop.reply.token_at(opens_at))


def _decode_budget(config: Config) -> int:
    """Most tokens one reply may decode: every round may rewrite, and a revert redo."""
    rounds = config.paragraph_rounds if config.sentence_scope else config.max_rounds
    return config.max_tokens * (rounds + 2) + 8


def _trigger_of(loop: _ReplyLoop) -> Trigger:
    """The crossing the policy just saw, as the event and the round's trigger."""
    statistic, value, bar = loop.policy.crossing
    return Trigger(
        token_index=len(loop.reply.tokens) - 1,
        statistic=statistic,
        value=value,
        threshold=bar,
        span_start=loop.policy.span_start,
        span_text=loop.reply.tail(loop.policy.span_start),
        round=len(loop.rounds) + len(loop.would_trigger) + 1,
    )


def _arm_query(loop: _ReplyLoop) -> Query:
    """What the arms are asked: the doubtful words, the question, and the sentence so far (a cloze
    prefix the assistant turn started with included)."""
    assert loop.prompt is not None
    if loop.policy.sentences is not None:
        return sentence_arm_query(loop.policy.sentences.judged[2], loop.question, loop.scribe)
    prefix = b"".join(loop.backend.token_bytes(t) for t in loop.prompt.prefix).decode("utf-8", "replace")
    asked_from, asked_to = loop.policy.query_span(len(loop.reply.tokens))
    return Query(
        span=loop.reply.between(asked_from, asked_to).strip(),
        question=loop.question,
        sentence=current_sentence(prefix + loop.reply.text()),
        scribe=loop.scribe,
    )


def _sampling(
    config: Config, scored: bool, probe: TriggerProbe | None, reply: Reply, grammar: TokenGrammar | None
) -> Sampling:
    """Hidden states only when a probe will read them (the backend then keeps its tapped layer's state);
    frequency and presence penalties count the reply's own tokens, which the loop keeps, and a grammar
    follows them."""
    sampling = Sampling(config.temperature, config.seed, scored, config.top_logprobs, hidden=probe is not None)
    sampling.shaping, sampling.reply_tokens, sampling.grammar = shaping_of(config), lambda: reply.tokens, grammar
    return sampling


def _grounding(trigger: Trigger, record: ConvergenceRecord, chosen: Evidence | None, resumed: str | None) -> Grounding:
    """The round's Grounding event: what was found, and why it goes in (resumed None) or not."""
    source, evidence = (chosen.source, chosen.evidence) if chosen else (None, None)
    order = tuple(record.arm_order)
    return Grounding(
        trigger.round, record.span_class, order, resumed is None, source, evidence, resumed or "evidence accepted"
    )


def _trigger_policy(
    config: Config, question: str, assistant_prefix: str, probe: TriggerProbe | None, grammar: TokenGrammar | None
) -> TriggerPolicy:
    """The reply's trigger: under a grammar its JSON values are judged; under a server's grammar (its state starts
    at its root each request: backends.grammar.ServerGrammar) a doubtful reply is rewound whole."""
    whole = getattr(grammar, "restarts_at_reply_start", False)
    return TriggerPolicy(config, question, assistant_prefix, probe, grammar is not None, whole)


def _probe_for(backend: SteerableBackend, config: Config, grammar: TokenGrammar | None) -> TriggerProbe | None:
    """The trigger probe the config names, if the backend reads the layer it was fitted on (runtime taps it).
    None under a grammar: a probe fitted on prose sentences' hidden states does not judge JSON values."""
    tapped = backend.tapped_layer if isinstance(backend, HiddenStates) else None
    if tapped is None or grammar is not None:  # servers, cloud APIs, several sessions: nothing to look up per reply
        return None
    probe = resolve_probe(config.probe, backend.model_id, config.sentence_scope)
    return probe if probe is not None and probe.layer == tapped else None


def _probe_receipt(policy: TriggerPolicy) -> dict[str, Any] | None:
    """Which probe judged the first sentence, and its score (None: no probe, or it never judged)."""
    if policy.probe is None:
        return None
    score = policy.probe_score
    return policy.probe.to_dict() | {"score": None if score is None else round(score, 4)}


def _result(loop: _ReplyLoop) -> ReplyResult:
    """The finished reply as the typed result its receipt is built from."""
    reply, c, policy = loop.reply, loop.config, loop.policy
    scored = loop.scored
    return ReplyResult(
        reply=reply.text(),
        finish_reason=loop.finish_reason,
        messages=loop.messages.messages if isinstance(loop.messages, Continuation) else loop.messages,
        question=loop.question,
        question_kind=policy.kind,
        threshold=policy.threshold,
        n_tokens=len(reply.tokens),
        tokens_decoded=loop.decoding.decoded + loop.scribe.tokens_written,
        latency_ms=round((time.monotonic() - loop.started) * 1000, 2),
        surprise=surprise_summary(reply.surprises, c.tail_cut, policy.window_max, c.statistic) if scored else None,
        tokens_injected=loop.injected_total,
        prompt_tokens=len(loop.prompt.tokens) if loop.prompt is not None else 0,
        token_surprises=rounded(reply.surprises) if scored else [],
        token_entropies=rounded(reply.entropies) if scored else [],
        token_ids=list(reply.tokens),
        token_top_logprobs=[[[t, round(lp, 4)] for t, lp in top] for top in reply.top],
        token_pieces=reply.piece_texts() if scored else None,
        token_windows=rounded(reply.window_stats) if scored else None,
        rounds=loop.rounds,
        would_trigger=loop.would_trigger,
        probe=_probe_receipt(policy),
        fault=loop.fault,
    )


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
    result: ReplyResult | None = None


def generate(
    backend: SteerableBackend | BlackBoxBackend,
    messages: Sequence[dict[str, str]] | str | Continuation,
    config: Config,
    arms: Mapping[str, Arm] | None = None,
    router: Callable[..., Any] | None = None,
    on_event: Callable[[Event], None] | None = None,
    assistant_prefix: str = "",
    output: ResponseFormat | None = None,
) -> Result:
    """Run the stream to the end and build the receipt (not written: see receipts.ReceiptWriter). `output`: a
    JSON format the reply is decoded under (structured.py)."""
    done: Done | None = None
    if isinstance(messages, Continuation):  # the receipt says the config it ran under (evidence inline)
        config = _continuing(config, None, output)
    for event in stream(backend, messages, config, arms, router, assistant_prefix=assistant_prefix, output=output):
        if on_event is not None:
            on_event(event)
        if isinstance(event, Done):
            done = event
    assert done is not None
    receipt = build_receipt(done.result, backend, config)
    return Result(done.text, done.finish_reason, done.n_tokens, done.rounds, receipt, done.result)

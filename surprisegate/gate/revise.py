"""The revise pass: the gate on a black-box chat API, where we cannot cut or inject mid-reply (DESIGN §4).

The draft streams from `backend.chat`; the trigger policy the loop uses (trigger.py) scores it with the
provider's logprobs. In `intervene`, once the draft is finished, each window over the threshold (at most
`max_rounds`) is grounded through the same router, arms and deadline (`grounding.ground_span`); if
evidence was found, ONE revise request: the conversation, the draft as the assistant's turn, the evidence
in a system turn (the backend maps it to what the provider takes) and an instruction to correct only what
the evidence contradicts. The revision stands only if it uses its evidence and answers the question
(`rewrite_checks.rewrite_problem`, the loop's check); otherwise the draft does. A reply without logprobs
(Anthropic, a model that refuses them) passes through unchanged and the receipt says why.

Streaming: `off` / `detect` stream the draft as it arrives. In `intervene` the reply is held until the
revise decision (`stream = "holdback"`), or the draft streams and a revision retracts it with a Rewind event
(`stream = "emit"`), as the loop's emit streaming does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..arms import Arm, Evidence, Query
from ..backends import BlackBoxBackend, Sampling, Step
from ..config import Config
from ..errors import BackendFault
from ..text import current_sentence, first_sentence
from .events import Done, Event, Grounding, Rewind, Token, Trigger
from .grounding import ground_span, why_not_grounded
from .prompting import last_user_turn
from .receipts import ConvergenceRecord, rounded_trigger
from .result import ReplyResult, rounded, surprise_summary
from .rewrite_checks import rewrite_problem
from .trigger import TriggerPolicy


@dataclass
class Draft:
    """A reply as the provider streamed it: its steps' text and signals."""

    pieces: list[bytes] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    surprises: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    window_stats: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    no_logprobs: str | None = None
    fault: dict[str, Any] | None = None

    def add(self, step: Step, window_stat: float) -> None:
        self.pieces.append(step.piece)
        self.token_ids.append(step.token)
        self.surprises.append(step.surprise)
        self.entropies.append(step.entropy)
        self.window_stats.append(window_stat)

    def text(self, upto: int | None = None) -> str:
        return b"".join(self.pieces[:upto]).decode("utf-8", "replace")

    @property
    def scored(self) -> bool:
        return self.no_logprobs is None and any(not math.isnan(s) for s in self.surprises)


def revise_stream(
    backend: BlackBoxBackend,
    messages: list[dict[str, str]],
    config: Config,
    arms: Mapping[str, Arm],
    router: Callable[..., Any],
) -> Iterator[Event]:
    """One reply on a black-box backend, as events; the last is Done with the reply's result."""
    yield from _Revision(backend, messages, config, dict(arms), router).run()


class _Revision:
    """One reply: the draft, its flagged windows, their rounds, and at most one revise request."""

    def __init__(
        self,
        backend: BlackBoxBackend,
        messages: list[dict[str, str]],
        config: Config,
        arms: dict[str, Arm],
        router: Callable[..., Any],
    ) -> None:
        self.backend, self.messages, self.config, self.arms, self.router = backend, messages, config, arms, router
        self.question = last_user_turn(messages)
        self.started = time.monotonic()
        self.scored = config.mode != "off"
        self.intervening = config.mode == "intervene"
        self.policy = TriggerPolicy(config, self.question)
        self.triggers: list[Trigger] = []
        self.rounds: list[ConvergenceRecord] = []
        self.grounded: list[tuple[ConvergenceRecord, str]] = []  # rounds whose evidence the revision gets, source
        self.revise: dict[str, Any] = {}
        self.shown = 0  # draft tokens streamed to the caller
        self.arm_cache: dict = {}

    # --- the draft ------------------------------------------------------------------------------
    def run(self) -> Iterator[Event]:
        draft = Draft()
        show_draft = not self.intervening or self.config.stream == "emit"
        for i, step in enumerate(self._draft_steps(draft)):
            value, crossed = self._measure(i, step)
            draft.add(step, value)
            if crossed and len(self.triggers) < self.config.max_rounds:
                self._flag(draft, value)
            if show_draft:
                piece = step.piece.decode("utf-8", "replace")
                yield Token(i, step.token, piece, step.surprise, value, step.top_logprobs)
                self.shown = i + 1
        reply = draft
        if self.intervening and draft.fault is None:
            reply = yield from self._intervene(draft)
        if reply is not draft or not show_draft:
            yield from self._tokens(reply, start=0)
        yield self._done(draft, reply)

    def _draft_steps(self, draft: Draft) -> Iterator[Step]:
        """The provider's steps; a fault ends the draft with what arrived (the receipt says what happened)."""
        sampling = Sampling(self.config.temperature, self.config.seed, self.scored)
        stream = None
        try:  # chat() sends the request: an HTTP error (after its retries) comes from there
            stream = self.backend.chat(self.messages, sampling, self.config.max_tokens)
            yield from stream
            draft.finish_reason = stream.finish_reason or "stop"
        except BackendFault as fault:
            draft.finish_reason = "error"
            draft.fault = {"kind": fault.kind, "status": fault.status, "message": str(fault)}
        finally:
            if stream is not None:
                stream.close()
        draft.no_logprobs = stream.no_logprobs if self.scored and stream is not None else None  # ChatStream's
        if draft.fault is not None:
            draft.fault["at_token"] = len(draft.pieces)

    def _measure(self, index: int, step: Step) -> tuple[float, bool]:
        if not self.scored or math.isnan(step.surprise):
            return math.nan, False
        return self.policy.push(index, step.piece.decode("utf-8", "replace"), step.surprise, step.entropy)

    def _flag(self, draft: Draft, value: float) -> None:
        """A window crossed: note the span (grounded after the draft in intervene, recorded in detect)."""
        start = self.policy.span_start
        self.triggers.append(
            Trigger(
                token_index=len(draft.pieces) - 1,
                statistic=self.policy.statistic_name,
                value=value,
                threshold=self.policy.threshold,
                span_start=start,
                span_text=draft.text()[len(draft.text(start)) :],
                round=len(self.triggers) + 1,
            )
        )
        self.policy.reset()

    # --- grounding and the revise request ---------------------------------------------------------
    def _intervene(self, draft: Draft) -> Generator[Event, None, Draft]:
        """Ground the flagged spans; with evidence, one revise request. Returns the reply that stands."""
        text = draft.text()
        self.revise = {"draft": text, "flagged": [t.span_text for t in self.triggers], "evidence": []}
        if draft.no_logprobs is not None or not self.triggers:
            self.revise["outcome"] = "no_logprobs" if draft.no_logprobs else "nothing_flagged"
            return draft
        evidence = yield from self._ground(draft)
        if not evidence:
            self.revise["outcome"] = "no_evidence"
            return draft
        self.revise["evidence"] = [e.evidence for e in evidence]
        revision = self._request_revision(text, evidence)
        if revision is None:
            return draft
        return (yield from self._judge(draft, revision, evidence))

    def _ground(self, draft: Draft) -> Generator[Event, None, list[Evidence]]:
        """One round per flagged span; returns the distinct evidence chosen, best first."""
        chosen_all: list[Evidence] = []
        for trigger in self.triggers:
            yield trigger
            started = time.monotonic()
            chosen, record = self._round(draft, trigger)
            reason = why_not_grounded(record, chosen, self.rounds)
            repeat = next((r.round for r in self.rounds if chosen and r.evidence == chosen.evidence), None)
            if reason is None and repeat is not None:  # one revision takes each snippet once
                reason = record.repeats(repeat, "found")
            record.resume(reason or f"grounded by {chosen.source if chosen else '?'}: a revision was asked for")
            if reason is None and chosen is not None:
                self.grounded.append((record, chosen.source))
                chosen_all.append(chosen)
            record.finish(started)
            self.rounds.append(record)
            source, found = (chosen.source, chosen.evidence) if chosen else (None, None)
            order = tuple(record.arm_order)
            yield Grounding(
                trigger.round, record.span_class, order, reason is None, source, found, reason or "evidence accepted"
            )
        return chosen_all

    def _round(self, draft: Draft, trigger: Trigger) -> tuple[Evidence | None, ConvergenceRecord]:
        """Route the flagged span and ask the arms (grounding.ground_span, as the loop does)."""
        sentence = current_sentence(draft.text(trigger.token_index + 1))
        query = Query(span=trigger.span_text.strip(), question=self.question, sentence=sentence)
        cache = self.arm_cache
        return ground_span(self.config, self.arms, self.router, query, rounded_trigger(trigger), trigger.round, cache)

    def _request_revision(self, draft_text: str, evidence: Sequence[Evidence]) -> Draft | None:
        """The one revise request; None (the draft stands, the rounds say why) when it fails."""
        messages = revise_messages(self.config, self.messages, draft_text, evidence)
        sampling = Sampling(self.config.temperature, self.config.seed, self.scored)
        revised = Draft()  # the revision's steps, in the same record; its signals are not gated
        stream = None
        try:
            stream = self.backend.chat(messages, sampling, self.config.max_tokens)
            for step in stream:
                revised.add(step, math.nan)
        except BackendFault as fault:
            self._draft_stands(f"the revise request failed ({fault.kind}): {str(fault)[:200]}", revised.text())
            return None
        finally:
            if stream is not None:
                stream.close()
        revised.finish_reason = stream.finish_reason or "stop"
        return revised

    def _judge(self, draft: Draft, revised: Draft, evidence: Sequence[Evidence]) -> Generator[Event, None, Draft]:
        """The revision stands if it uses its evidence and answers the question; else the draft does."""
        text = revised.text().strip()
        problem = rewrite_problem(first_sentence(text), [e.evidence for e in evidence], self.question)
        if not text:
            problem = "was empty"
        if problem is not None:
            self._draft_stands(f"the revision {text[:80]!r} {problem}: kept the draft", text)
            return draft
        self.revise.update(outcome="revised", revision=text)
        for record, source in self.grounded:
            record.revised(source)
        if self.shown:  # the draft was streamed (emit): retract it before the revision
            yield Rewind(self.rounds[-1].round, self.shown, draft.text(), 0)
        return revised

    def _draft_stands(self, why: str, revision_text: str) -> None:
        self.revise.update(outcome="draft_stands", revision=revision_text or None, reason=why)
        for record, source in self.grounded:
            record.draft_stands(source, why, revision_text or None)

    # --- the result -------------------------------------------------------------------------------
    def _tokens(self, reply: Draft, start: int) -> Iterator[Token]:
        for i in range(start, len(reply.pieces)):
            piece = reply.pieces[i].decode("utf-8", "replace")
            yield Token(i, reply.token_ids[i], piece, reply.surprises[i], reply.window_stats[i])

    def _done(self, draft: Draft, reply: Draft) -> Done:
        c, revised = self.config, reply is not draft
        surprise = None
        if self.scored and draft.scored:
            bits = [s for s in draft.surprises if not math.isnan(s)]
            surprise = surprise_summary(bits, c.tail_cut, self.policy.window_max, c.statistic)
        return Done(
            ReplyResult(
                reply=reply.text(),
                finish_reason=reply.finish_reason if revised else draft.finish_reason,
                messages=self.messages,
                question=self.question,
                question_kind=self.policy.kind,
                threshold=self.policy.threshold,
                n_tokens=len(reply.pieces),
                tokens_decoded=len(draft.pieces) + (len(reply.pieces) if revised else 0),
                latency_ms=round((time.monotonic() - self.started) * 1000, 2),
                surprise=surprise,
                token_surprises=rounded(draft.surprises) if surprise else [],
                token_entropies=rounded(draft.entropies) if surprise else [],
                token_ids=list(draft.token_ids),
                # Labelling a chat API (`calibrate --backend`) needs each token's text: no ids to look it up by.
                token_pieces=[p.decode("utf-8", "replace") for p in draft.pieces] if c.top_logprobs else None,
                rounds=self.rounds,
                would_trigger=[] if self.intervening else [rounded_trigger(t) for t in self.triggers],
                fault=draft.fault,
                no_logprobs=draft.no_logprobs,
                revise=self.revise or None,
            )
        )


def revise_messages(
    config: Config, messages: Sequence[dict[str, str]], draft: str, evidence: Sequence[Evidence]
) -> list[dict[str, str]]:
    """The revise request: the conversation, the draft as the assistant's turn, the evidence in a system turn
    (data: quoted, never instructions of its own) and the instruction as the user's next turn."""
    found = "\n".join(f"- {e.evidence}" for e in evidence)
    return [
        *messages,
        {"role": "assistant", "content": draft},
        {"role": "system", "content": config.revise_evidence_template.format(evidence=found)},
        {"role": "user", "content": config.revise_instruction},
    ]

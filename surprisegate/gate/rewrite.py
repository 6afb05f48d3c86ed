"""The rewrite check: a rewrite stands only once its sentence shows it used its evidence and answers the
question (rewrite_checks.py); until then nothing of it is shown. One that fails is tried once more, the
evidence still in context; one that fails again is dropped for the reply written without it. So an
intervention may fail to help, but it never makes the reply worse.

The loop opens a check on every rewind (`opened`), asks it after every token (`check`) and at the end of
the turn (`end_of_turn`), and hands it a backend fault (`on_fault`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from ..config import Config
from ..text import sentence_end, sentence_start
from .events import Event, Rewind
from .receipts import ConvergenceRecord
from .reply import Context, Decoding, Emitter, Reply, Snapshot
from .rewrite_checks import cut_short, rewrite_problem


@dataclass
class Unchecked:
    """A rewrite that has not yet shown it used its evidence: where to go back to, and where to retry from."""

    before: Snapshot  # at the trigger: the reply without its triggering token, which was never fed
    span_start: int  # reply index where the first unchecked rewrite begins; nothing from here is shown
    first_round: int  # index in `rounds` of the first round it covers
    check_from: int = 0  # reply index of the latest rewind: its sentence is the one checked
    evidence: list[str] = field(default_factory=list)
    after_injection: Snapshot | None = None  # right after the latest injection: a retry starts here
    tried_again: bool = False  # one more try per rewrite, then it is dropped


def rewrite_verdict(reply: Reply, unchecked: Unchecked, question: str, final: bool) -> tuple[bool, str | None]:
    """(checked, problem) for the sentence holding the latest rewrite: (False, None) while it is open;
    once finished, the reason it must be dropped (`rewrite_problem`) or None when it stands."""
    text = reply.text()
    at = len(reply.text(unchecked.check_from))
    end = sentence_end(text, at)
    if end is None and not final:
        return False, None
    sentence = text[sentence_start(text, at) : end]
    return True, rewrite_problem(sentence, unchecked.evidence, question)


class RewriteCheck:
    """The rewrite awaiting its check, and what happens when it fails: one retry, then the revert.

    It shares the loop's reply, decoding, emitter and rounds; `start_over(n)` is the loop's restart of the
    window and the emitter after the reply was cut back to `n` tokens."""

    def __init__(
        self,
        config: Config,
        question: str,
        loop_state: tuple[Reply, Decoding, Emitter, list[ConvergenceRecord]],
        eos: frozenset[int],
        start_over: Callable[[int], None],
    ) -> None:
        self.enabled, self.retries = config.revert_unused_evidence, config.retry_failed_rewrite
        self.question = question
        self.reply, self.decoding, self.emitter, self.rounds = loop_state
        self.eos, self.start_over = eos, start_over
        self.pending: Unchecked | None = None  # a rewrite whose sentence is not finished: held back
        self.reverted = False  # a rewrite failed and was dropped: no further rounds

    @property
    def held_from(self) -> int | None:
        """Reply index from which nothing may be shown yet (None: no rewrite awaits its check)."""
        return None if self.pending is None else self.pending.span_start

    def before_round(self, span_start: int) -> Unchecked | None:
        """At a trigger, before its round: where a failed rewrite would go back to (the first of a chain)."""
        if not self.enabled or self.pending is not None:
            return None
        reply, context = self.reply, self.decoding.context
        return Unchecked(Snapshot.take(reply, len(reply.tokens) - 1, context), span_start, len(self.rounds))

    def opened(self, before: Unchecked | None, span_start: int, evidence: str, context: Context) -> None:
        """A rewind went in at `span_start`: its rewrite is checked once its sentence is finished."""
        self.pending = self.pending or before
        if self.pending is not None:
            self.pending.check_from = span_start
            self.pending.evidence.append(evidence)
            self.pending.after_injection = Snapshot.take(self.reply, len(self.reply.tokens), context)

    def check(self, final: bool) -> Generator[Event, None, bool]:
        """Check the latest rewrite once its sentence is finished; True when it failed and went back."""
        assert self.pending is not None
        checked, problem = rewrite_verdict(self.reply, self.pending, self.question, final)
        if problem is not None:
            yield from self._failed(problem, at_end_of_turn=False)
            return True
        if checked:
            self.pending = None  # the rewrite drew on its evidence and answers the question: it stands
        return False

    def end_of_turn(self) -> Generator[Event, None, bool]:
        """The model ended its turn: True when the reply is finished, False when a failed rewrite went back."""
        problem = None
        if self.pending is not None:
            problem = rewrite_verdict(self.reply, self.pending, self.question, final=True)[1]
        if problem is None:
            return True
        yield from self._failed(problem, at_end_of_turn=True)
        return False

    def on_fault(self, kind: str) -> Generator[Event, None, None]:
        """The backend failed: a rewrite not yet checked is dropped (only the reply goes back)."""
        if self.pending is not None:
            yield from self._revert(f"was cut off when the backend failed ({kind})", session=False)

    def _failed(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """A rewrite failed its check: one more try if allowed, else back to the reply written without it."""
        u = self.pending
        assert u is not None
        if self.retries and not u.tried_again and u.after_injection is not None:
            yield from self._try_again(problem, at_end_of_turn)
        else:
            yield from self._revert(problem)

    def _try_again(self, problem: str, at_end_of_turn: bool) -> Generator[Event, None, None]:
        """One more try, the evidence still in context: a rewrite cut short by its end of turn goes on past it
        ("… is vpn." inside "vpn.acme.example"); any other is written again from the rewind point with its
        first token banned ("I'm ready to help.")."""
        u, reply = self.pending, self.reply
        assert u is not None and u.after_injection is not None
        u.tried_again = True
        start = u.check_from
        failed = reply.tail(start)
        rewound = next(r for r in reversed(self.rounds) if r.action == "rewound")  # the round whose rewrite failed
        if at_end_of_turn and cut_short(failed, u.evidence):
            how = "continued past the end of turn"
            self.decoding.continue_from(self.decoding.context.tokens, banned=self.eos)
        else:
            how = "rewritten from the rewind point with its first token banned"
            banned = frozenset({reply.tokens[start]}) if len(reply.tokens) > start else frozenset()
            shown = self.emitter.shown_after(start)
            self.decoding.restore(u.after_injection, reply, banned)
            self.start_over(start)
            yield Rewind(rewound.round, shown, failed, 0)
        rewound.retry(problem, failed, how)

    def _revert(self, problem: str, session: bool = True) -> Generator[Event, None, None]:
        """Back to the reply written without the rewrite; no more rounds. `session` False: only the reply goes
        back (the backend failed; nothing more will be decoded)."""
        u, reply = self.pending, self.reply
        assert u is not None
        text = reply.text()
        # The rewrite up to the end of the sentence that was checked, not the word that showed it had ended.
        rewritten = text[len(reply.text(u.span_start)) : sentence_end(text, len(reply.text(u.check_from)))]
        shown = self.emitter.shown_after(u.span_start)
        if session:
            self.decoding.restore(u.before, reply)
        else:
            reply.restore(u.before.reply)
        for record in self.rounds[u.first_round :]:
            if record.action == "rewound":
                record.revert(rewritten, problem)
        self.pending, self.reverted = None, True
        self.start_over(u.span_start)
        yield Rewind(self.rounds[-1].round, shown, rewritten, 0, reverted=True)

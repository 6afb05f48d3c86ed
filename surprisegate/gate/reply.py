"""The loop's state for one reply: the visible reply, the model's context, the session that decodes it,
snapshots to go back to, the emitter that streams the reply, and the stop strings that end it.

Kept apart on purpose: the visible reply (what the user reads) and the model's context (what the model
holds: the prompt, injected evidence, the reply so far) diverge on every rewind.
"""

from __future__ import annotations

import codecs
import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..backends import RequestLog, Sampling, Session, Step, Steps
from ..text import ends_sentence, first_stop, sentence_start
from .events import Token
from .receipts import RewindReport


@dataclass
class Context:
    tokens: list[int]  # every token the model holds (or is about to: the step just accepted), in order
    turn_start: int  # index where the current assistant turn's header begins


@dataclass
class Reply:
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

    def piece_texts(self) -> list[str]:
        """Each token's share of the reply's text (a character split over two tokens goes to the second): they
        join to exactly `text()`."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        texts = [decoder.decode(piece) for piece in self.pieces]
        if texts:
            texts[-1] += decoder.decode(b"", final=True)
        return texts

    def tail(self, start: int) -> str:
        """The text of the reply from token `start` on."""
        return self.text()[len(self.text(start)) :]

    def between(self, start: int, end: int) -> str:
        """The text of reply tokens [start, end)."""
        return self.text(end)[len(self.text(start)) :]

    def token_starting_at(self, char: int) -> int | None:
        """The reply token whose text begins at character `char` of the reply's text (None: inside a token)."""
        for i in range(len(self.pieces)):
            starts = len(self.text(i))
            if starts >= char:
                return i if starts == char else None
        return None

    def token_at(self, char: int) -> int:
        """Index of the token holding character `char` of the reply's text (a word's token carries the space
        before it); the number of tokens when `char` is past the end."""
        end = 0
        for i, piece in enumerate(self.piece_texts()):
            end += len(piece)
            if end > char:
                return i
        return len(self.pieces)

    def cut(self, n: int) -> None:
        del self.tokens[n:], self.surprises[n:], self.entropies[n:], self.window_stats[n:], self.pieces[n:]
        del self.top[n:]

    def copy(self, n: int) -> Reply:
        return Reply(
            self.tokens[:n],
            self.surprises[:n],
            self.entropies[:n],
            self.window_stats[:n],
            self.pieces[:n],
            self.top[:n],
        )

    def extend(self, other: Reply, start: int, end: int) -> None:
        """Append `other`'s tokens [start, end) with their signals (words kept from a reply written earlier)."""
        self.tokens += other.tokens[start:end]
        self.surprises += other.surprises[start:end]
        self.entropies += other.entropies[start:end]
        self.window_stats += other.window_stats[start:end]
        self.pieces += other.pieces[start:end]
        self.top += other.top[start:end]

    def restore(self, kept: Reply) -> None:
        self.tokens[:], self.surprises[:], self.entropies[:] = kept.tokens, kept.surprises, kept.entropies
        self.window_stats[:], self.pieces[:], self.top[:] = kept.window_stats, kept.pieces, kept.top


@dataclass
class Snapshot:
    """The reply and the model's context at one moment: where a dropped rewrite goes back to."""

    reply: Reply
    context_tokens: list[int]  # what the model held then
    turn_start: int

    @classmethod
    def take(cls, reply: Reply, n_reply: int, context: Context) -> Snapshot:
        return cls(reply.copy(n_reply), list(context.tokens), context.turn_start)


class Decoding:
    """The reply's session on the backend, the context it holds, and the steps that continue it; every
    rewind (or restore) replaces the steps with a continuation from new context tokens."""

    def __init__(self, session: Session, sampling: Sampling) -> None:
        self.session, self.sampling = session, sampling
        self.context = Context([], 0)
        self.n_prompt = 0  # the prompt's tokens: re-fed in one batch on a restore
        self.steps: Steps | None = None
        self.decoded = 0  # every token sampled, including dropped ones
        # Held while the session is lent for a scratch text (an arm's thread); `lent`: the session holds
        # that text, so the context goes back in before the next step.
        self._lending = threading.Lock()
        self.lent = False

    def start(self, prompt_tokens: list[int], turn_start: int) -> None:
        self.context = Context(list(prompt_tokens), turn_start)
        self.n_prompt = len(prompt_tokens)
        self.continue_from(prompt_tokens)

    def next_step(self) -> Step:
        if self.lent:  # the prompt in one batch, the reply a token at a time: the schedule of the first time
            self.continue_from(self.context.tokens, batch_until=self.n_prompt)
        assert self.steps is not None  # set by start, replaced on every rewind
        self.decoded += 1
        return next(self.steps)

    def continue_from(
        self, tokens: list[int], batch_until: int | None = None, banned: frozenset[int] = frozenset()
    ) -> None:
        """Abort the current steps and continue the session from `tokens`."""
        with self._lending:  # a scratch text still being written (its arm outlived the round) ends first
            if self.steps is not None:
                self.steps.close()
            self.steps = self.session.steps(tokens, self.sampling, batch_until=batch_until, banned=banned)
            self.lent = False

    @contextlib.contextmanager
    def lend(self) -> Iterator[Session]:
        """The session, for a scratch text that replaces what it holds; the reply's steps stop here and its
        context is fed back in before the next step (rewinds and restores feed their own)."""
        with self._lending:
            if self.steps is not None:
                self.steps.close()
                self.steps = None
            self.lent = True
            yield self.session

    def replace(self, tokens: list[int], turn_start: int | None) -> None:
        """The context after a rewind (the session already continues from it)."""
        self.context.tokens[:] = tokens
        self.context.turn_start = self.context.turn_start if turn_start is None else turn_start

    def restore(self, saved: Snapshot, reply: Reply, banned: frozenset[int] = frozenset()) -> None:
        """Put the session, context and reply back as they were at `saved`. The prompt is re-fed in one
        batch and the reply one token at a time, the schedule of the first time: batched and one-token
        kernels round differently, and the reply must come back exactly as written without evidence."""
        reply.restore(saved.reply)  # first: a server's request is sent at once and reads the reply (its grammar)
        self.continue_from(saved.context_tokens, batch_until=self.n_prompt, banned=banned)
        self.context.tokens[:] = saved.context_tokens
        self.context.turn_start = saved.turn_start

    def rewind_report(self) -> RewindReport:
        """How the latest continuation reached the backend (a server session also reports its request)."""
        trimmed, method = self.session.last_continue
        request = (self.session.last_request if isinstance(self.session, RequestLog) else None) or {}
        return RewindReport(trimmed, method, request.get("path"), request.get("cached"))

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
        self.session.close()


class Emitter:
    """Sends visible tokens as Token events: once they can no longer be rewound (`holdback`), or at
    once with Rewind events that retract them (`emit`)."""

    def __init__(self, holdback: bool) -> None:
        self.holdback = holdback
        self.emitted = 0  # visible tokens already sent
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def upto(self, reply: Reply, n: int, final: bool = False) -> Iterator[Token]:
        while self.emitted < n:
            i = self.emitted
            text = self._decoder.decode(reply.pieces[i], final=final and i == n - 1)
            self.emitted += 1
            top = reply.top[i] if i < len(reply.top) else ()
            yield Token(i, reply.tokens[i], text, reply.surprises[i], reply.window_stats[i], top)

    def shown_after(self, start: int) -> int:
        """Visible tokens from reply index `start` on that a consumer must retract (emit streaming)."""
        return 0 if self.holdback else max(0, self.emitted - start)

    def restart(self, reply: Reply, n: int) -> None:
        """The reply was cut back to `n` tokens: emit streaming resumes there."""
        if not self.holdback:
            self.emitted = min(self.emitted, n)
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
            self._decoder.decode(b"".join(reply.pieces[: self.emitted]), final=False)


class StopStrings:
    """Strings that end the reply once they stand in text no rewind can change (an empty one never stops)."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)
        self.searched = 0  # characters of unchangeable reply text already searched

    def __bool__(self) -> bool:
        return bool(self.stop)

    def reached(self, unchangeable_text: str) -> bool:
        """Whether a stop string stands in `unchangeable_text` (each character searched once)."""
        start = max(0, self.searched - max(len(s) for s in self.stop) + 1)
        self.searched = len(unchangeable_text)
        return first_stop(unchangeable_text, self.stop, start) is not None


# A blank line after text ends a paragraph: a long reply asked for one stops there (config.long_reply_ends_whole).
PARAGRAPH_END = "\n\n"


def whole_end(text: str, cut_by_budget: bool) -> int | None:
    """Where a long reply should end to read whole: at its first blank line after some text (the paragraph's
    end; what follows starts the reply over), and where the paragraph or a reply the token budget cut ends
    mid-sentence, where that unfinished last sentence starts (one sentence at least is kept). None: it ends
    whole as it is."""
    opening = len(text) - len(text.lstrip())
    blank = text.find(PARAGRAPH_END, opening)
    if blank > opening:  # the paragraph ends here; its last sentence must end too ("… of DarISBN: 978-1")
        text, cut_by_budget = text[:blank], True
    if not cut_by_budget or ends_sentence(text):
        return blank if blank > opening else None
    start = sentence_start(text, len(text.rstrip()) - 1)
    return start if start > opening else (blank if blank > opening else None)

"""The repetition guard (config.paragraph_loop_guard): a paragraph that went on from a rewrite into repeating
itself goes back to the model's own sentence (patch in place, patch.py) and is written again from there.

Why: after a rewrite the small model sometimes loses the paragraph's plan and loops ("Armenia is a member of
the European Union and the Council of the European Union." twice), never writing the later claims it wrote
without the round; on longform_dev 4 of the 10 right claims lost were lost so. Patching every rewrite in place
keeps those claims but also keeps the model's omissions (see README, Paragraphs); patching only where the
paragraph loops keeps the rewrite's path wherever it goes on writing something new.

While a rewrite is watched nothing after its sentence is shown (holdback), so the text it replaces is never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text import MIN_WORDS, OVERLAP, repeats, sentence_end, sentence_start

__all__ = ["MIN_WORDS", "OVERLAP", "RepetitionGuard", "finished_sentences", "repeats"]
from .receipts import ConvergenceRecord
from .reply import Reply
from .rewrite import Unchecked


def finished_sentences(text: str, start: int) -> list[str]:
    """The finished sentences of `text` from character `start` on (an open last one left out)."""
    out = []
    while (end := sentence_end(text, start)) is not None:
        out.append(text[start:end].strip())
        start = end
    return out


@dataclass
class Watch:
    """A rewrite that stood and that the paragraph went on from: where it would be patched in place."""

    start: int  # reply index where the rewrite begins (the model's own tokens `own` began there)
    own: list[int]
    end: int  # reply index just past the rewrite's sentence
    from_char: int  # where the rewrite's sentence starts in the reply's text: sentences are compared from it
    record: ConvergenceRecord
    seen: int = 1  # finished sentences from `from_char` looked at so far (the rewrite's own first)


class RepetitionGuard:
    """Watches the latest rewrite the paragraph went on from, for `horizon` sentences after its own."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.watch: Watch | None = None

    @property
    def held_from(self) -> int | None:
        """Reply index from which nothing may be shown yet (None: nothing watched)."""
        return None if self.watch is None else self.watch.end

    def watch_from(self, reply: Reply, stood: Unchecked, end: int | None, record: ConvergenceRecord) -> None:
        """A rewrite that `stood` (its sentence ending at reply index `end`) and the paragraph goes on after it;
        `end` None: it cannot be patched in place (patch.patchable), or already was."""
        start, own = stood.check_from, stood.own_sentence
        if self.horizon <= 0 or not own or end is None:
            return
        text = reply.text()
        self.watch = Watch(start, list(own), end, sentence_start(text, len(reply.text(start))), record)

    def stop(self) -> None:
        """A new round opened (or the reply was cut back before the watched rewrite): nothing is watched."""
        self.watch = None

    def repeated(self, reply: Reply) -> Watch | None:
        """After a token: the watch to patch in place when the sentence it just finished repeats one since the
        rewrite's (the watch ends, its round's record told what is dropped), else None; past `horizon`
        sentences the watch ends unused."""
        w = self.watch
        if w is None:
            return None
        if len(reply.tokens) < w.end:  # cut back before the rewrite's end: a retry or revert took it
            self.watch = None
            return None
        sentences = finished_sentences(reply.text(), w.from_char)
        if len(sentences) <= w.seen:
            return None
        w.seen = len(sentences)
        if repeats(sentences[-1], sentences[:-1]) is not None:
            self.watch = None
            w.record.went_back(reply.tail(w.end))
            return w
        if len(sentences) > self.horizon:  # the rewrite's sentence and `horizon` after it went on without a loop
            self.watch = None
        return None

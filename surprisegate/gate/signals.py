"""Per-token signals beyond raw surprise, all from logits we already hold. Pure and incremental.

- surprise:  -log2 p(token)                        (the baseline, DESIGN.md §1)
- entropy:   H(next-token distribution) in bits     (uncertainty before the choice)
- novel:     surprise of tokens NOT copied from the question; copied tokens are skipped (never enter
             the window): "The capital of Burkina Faso is" is copied, the answer "Kouar-Boukoula" is not

A token counts as copied when the word it belongs to, so far, is a prefix of a word of the question.
That is decidable online, token by token, which the trigger needs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from ..text import KIND_STOPWORDS, WORD, fold, stems

SIGNALS = ("surprise", "entropy", "novel", "novel_entropy")


@lru_cache(maxsize=256)
def question_words(question: str) -> frozenset[str]:
    """The question's words, folded. Cached: a paragraph asks for them once per sentence it judges."""
    return frozenset(WORD.findall(fold(question)))


class CopyTracker:
    """Feed token pieces in order; `push(piece) -> bool` says whether the token is copied from the question."""

    def __init__(self, question: str):
        self.words = question_words(question)
        self.prefixes = frozenset(w[:i] for w in self.words for i in range(1, len(w) + 1))
        self.current = ""  # the word being written, folded

    def push(self, piece: str) -> bool:
        folded = fold(piece)
        if not folded:
            return False
        starts_word = not folded[0].isalnum() or not self.current
        chars = WORD.findall(folded)
        if not chars:  # pure punctuation / whitespace: ends the word, copies nothing new
            self.current = ""
            return True
        if starts_word or folded[0].isspace():
            self.current = chars[0]
        else:
            self.current += chars[0]
        if len(chars) > 1 or not folded.rstrip()[-1:].isalnum():
            # The piece holds a word break: judge the first part, keep the last as the word in progress.
            copied = self.current in self.prefixes
            self.current = chars[-1] if folded.rstrip()[-1:].isalnum() else ""
            return copied
        return self.current in self.prefixes

    def reset_word(self) -> None:
        self.current = ""


def signal_value(signal: str, surprise: float, entropy: float, copied: bool) -> float | None:
    """The value pushed into the rolling window for one token; None means the token is skipped."""
    if signal == "surprise":
        return surprise
    if signal == "entropy":
        return entropy
    if signal == "novel":
        return None if copied else surprise
    if signal == "novel_entropy":
        return None if copied else entropy
    raise ValueError(f"signal={signal!r} is not one of {', '.join(SIGNALS)}")


# A question that opens with an auxiliary verb asks yes or no ("Were X and Y founded in the same state?"):
# the router leaves it as answered, and the rewrite check expects no kind of answer from it.
YES_NO_START = re.compile(
    r"^\s*(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|shall)\s", re.IGNORECASE
)


# "Do you know the currency of Chad?", "Can you name a neighbour of Chad?": asked of the listener, the yes/no form
# is a polite request for the answer, not a question that asks yes or no.
_ASKS_THE_LISTENER = re.compile(r"^\s*(?:do|can|could|would|will)\s+you\b", re.IGNORECASE)


def asks_yes_or_no(question: str) -> bool:
    """Whether the question's form asks yes or no ("Were X and Y founded in the same state?"); a request put
    to the listener ("Do you know …?", "Could you tell me …?") asks for the answer."""
    return bool(YES_NO_START.match(question)) and not _ASKS_THE_LISTENER.match(question)


def question_kind(question: str) -> str:
    """A coarse, deterministic kind of question: its lower-case content words, names dropped.

    "What is the capital of Burkina Faso?" -> "capital"; "The official language of Qazvin Province is"
    -> "official language". Calibration learns per-kind thresholds (per-category normalisation): the
    model is right far more often on some kinds of question than others.
    """
    words = re.findall(r"[A-Za-z][\w.'-]*", question.split(":", 1)[-1] if question.startswith("Complete") else question)
    kept = [
        w.lower() for i, w in enumerate(words) if not (i > 0 and w[0].isupper()) and w.lower() not in KIND_STOPWORDS
    ]
    return " ".join(kept[:4])


def resolve_kind(question: str, known: Iterable[str]) -> str:
    """The calibrated kind a question asks about, however it is worded: its own `question_kind` when that
    was calibrated, else the known kind all of whose words it holds (stemmed), the one of most words (ties:
    the longer, then the first in order); else its own kind (which gets the global threshold).

    "Hey, do you know what the capital of Chad is?" -> "capital", as "What is the capital of Chad?" is: a
    kind is what is asked, and the words around it must not make the question a kind never calibrated. One
    shared word is not enough: "… is located in Chestnut Hill …" is no "continent located" question.
    """
    kind = question_kind(question)
    kinds = set(known)
    if kind in kinds:
        return kind
    held = _kind_stems(question)
    matches = {k: words for k in kinds if (words := _kind_stems(k)) and words <= held}
    return min(matches, key=lambda k: (-len(matches[k]), -len(k), k)) if matches else kind


_KIND_STOP_STEMS = frozenset(stems(" ".join(KIND_STOPWORDS)))


def _kind_stems(text: str) -> set[str]:
    # Words of one or two letters are the particles of names ("Rio de Janeiro", "Dar es Salaam") that a
    # calibrated kind may carry ("country city de"), not words of what is asked.
    return {stem for stem in stems(text) - _KIND_STOP_STEMS if len(stem) > 2}


def copy_flags(pieces: list[str], question: str) -> list[bool]:
    tracker = CopyTracker(question)
    return [tracker.push(p) for p in pieces]

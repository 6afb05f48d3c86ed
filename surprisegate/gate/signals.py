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
from functools import lru_cache

from ..text import KIND_STOPWORDS, WORD, fold

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


def copy_flags(pieces: list[str], question: str) -> list[bool]:
    tracker = CopyTracker(question)
    return [tracker.push(p) for p in pieces]

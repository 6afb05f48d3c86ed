"""Did a rewritten sentence use the evidence injected for it? Pure functions.

The controller asks once the sentence that holds a rewound span is finished. Evidence is "used" when
the sentence repeats one of the evidence's own content words or numbers; words the question already
holds do not count (any answer repeats them). When it uses none, the rewrite did not draw on the
evidence ("I'm ready to help. What's your question?"), so the controller keeps the reply the model
wrote without it: an intervention may fail to help, but it must not make the reply worse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction

from surprisegate.grading import SENTENCE_STOP, normalise, parse_numbers

# Function words, and words every templated evidence sentence uses: sharing them shows nothing.
STOPWORDS = frozenset(
    "a an and are as at be been by for from has have he her his in is it its of on or she that the their "
    "there they this to was were which who with about also include includes including".split()
)
# Counts this large are written rounded, often coarsely ("about 40 million" for 44,134,693); smaller
# numbers (years, codes, sums) must match exactly.
ROUNDED_FROM = 100_000
ROUNDING_TOLERANCE = Fraction(25, 100)
_DIGITS = re.compile(r"\d[\d,.]*\d")
# A sentence ends at grading's full stop once the next character is whitespace ("3." may still become
# "3.14"), or at a line break.
_SENTENCE_END = re.compile(SENTENCE_STOP + r"(?=\s)|\n")


def content_words(text: str) -> set[str]:
    """Normalised words of `text` that carry content: no function words, no bare numbers."""
    return {w for w in normalise(text).split() if w not in STOPWORDS and not w.isdigit()}


def sentence_end(text: str, start: int = 0) -> int | None:
    """Index just past the first sentence end at or after `start`, or None while the sentence is open."""
    m = _SENTENCE_END.search(text, start)
    return m.end() if m else None


def sentence_start(text: str, index: int) -> int:
    """Index where the sentence holding `text[index]` begins (just past the previous sentence end)."""
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.end() > index:
            break
        start = m.end()
    return start + (len(text[start:]) - len(text[start:].lstrip()))


def _same_number(a: Fraction, b: Fraction) -> bool:
    if a == b:
        return True
    big = max(abs(a), abs(b))
    return big >= ROUNDED_FROM and abs(a - b) <= ROUNDING_TOLERANCE * big


def uses_evidence(sentence: str, evidence: Iterable[str], question: str = "") -> bool:
    """True when `sentence` repeats a content word or number of `evidence` that `question` lacks.

    Also True when the evidence has nothing of its own to repeat (it only restates the question):
    then there is no way to tell, and the rewrite is given the benefit of the doubt.
    """
    asked_words = content_words(question)
    asked_numbers = parse_numbers(question)
    own_words: set[str] = set()
    own_numbers: list[Fraction] = []
    for text in evidence:
        own_words |= content_words(text) - asked_words
        own_numbers += [n for n in parse_numbers(text) if not any(_same_number(n, q) for q in asked_numbers)]
    if not own_words and not own_numbers:
        return True
    if own_words & content_words(sentence):
        return True
    if any(_same_number(n, e) for n in parse_numbers(sentence) for e in own_numbers):
        return True
    # Digits copied with other separators ("40.000,000" for "40,000,000") still repeat the evidence.
    said, asked = f" {normalise(sentence)} ", f" {normalise(question)} "
    grouped = {f" {normalise(raw)} " for text in evidence for raw in _DIGITS.findall(text)}
    return any(g in said and g not in asked for g in grouped if len(g.split()) > 1)


"""Grading rule of the evaluation sets (shared/data/README.md), as pure functions.

- Grade the first sentence of the reply only: it ends at . ! ? before whitespace or the end, but not at a
  dot after a single capital letter ("U.S.", "J. Smith") or a common abbreviation (St, Inc, Jan, ...);
  the rule lives in text.py, which every other reader of sentences shares.
- Normalise both sides: lower-case, strip accents and punctuation, collapse whitespace, drop leading articles.
- Correct when a normalised gold alias appears in the normalised first sentence as whole words.
- Numbers: compare parsed numbers (commas and number words allowed); `numeric_tolerance` (population:
  ±25%) widens the match; arithmetic takes the last number in the whole reply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from .text import first_sentence, fold

_ARTICLES = ("the ", "a ", "an ")
_LEADING_ARTICLES = re.compile("^(?:" + "|".join(_ARTICLES) + ")+")
_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])"
    r"(?:\s+(hundred|thousand|million|billion)\b)?",
    re.IGNORECASE,
)

_UNITS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen".split()
    )
}
_TENS = {
    w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORDS = set(_UNITS) | set(_TENS) | set(_SCALES)


def normalise(text: str) -> str:
    """Lower-case, strip accents and punctuation, collapse whitespace, drop leading articles.

    All of them ("A: a 0" -> "0"), so that normalising twice changes nothing.
    """
    text = fold(text)
    text = re.sub(r"[^\w\s]|_", " ", text)
    text = " ".join(text.split())
    return _LEADING_ARTICLES.sub("", text)


def contains_alias(sentence: str, alias: str) -> bool:
    """Whole-word containment of the normalised alias in the normalised sentence."""
    needle = normalise(alias)
    if not needle:
        return False
    return f" {needle} " in f" {normalise(sentence)} " or f" {needle} " in f" {_without_articles(sentence)} "


def _without_articles(text: str) -> str:
    # Articles inside the sentence too, so "is the Euro" matches the alias "the Euro" -> "euro".
    return " ".join(w for w in normalise(text).split() if w not in ("the", "a", "an"))


def _words_to_numbers(text: str) -> str:
    """Replace runs of English number words ("twenty-one", "two hundred five") with digits."""
    pieces = re.findall(r"[A-Za-z]+|[^A-Za-z]+", text)
    out: list[str] = []
    i = 0
    while i < len(pieces):
        if pieces[i].lower() in _NUMBER_WORDS and not (pieces[i].lower() in _SCALES and not _after_digit(out)):
            # Extend the run over number words joined by spaces or hyphens.
            j = i + 1
            while (
                j + 1 < len(pieces) and pieces[j].strip() in ("", "-", "and") and pieces[j + 1].lower() in _NUMBER_WORDS
            ):
                j += 2
            words = [pieces[k].lower() for k in range(i, j, 2)]
            value = _word_run_value(words)
            out.append(str(value) if value is not None else "".join(pieces[i:j]))
            i = j
        else:
            out.append(pieces[i])
            i += 1
    return "".join(out)


def _after_digit(out: list[str]) -> bool:
    # "9.5 million" is handled as a scaled number, not as the word run "million".
    return not ("".join(out[-2:]).rstrip()[-1:].isdigit() if out else False)


def _word_run_value(words: list[str]) -> int | None:
    total, current = 0, 0
    seen = False
    for w in words:
        if w in _UNITS:
            current += _UNITS[w]
        elif w in _TENS:
            current += _TENS[w]
        elif w in _SCALES:
            scale = _SCALES[w]
            if scale == 100:
                current = max(current, 1) * 100
            else:
                total += max(current, 1) * scale
                current = 0
        else:
            return None
        seen = True
    return total + current if seen else None


def parse_numbers(text: str) -> list[Fraction]:
    """Every number in `text`, in order: "1,234", "3.5", "-7", "1/2", "twelve"."""
    text = _words_to_numbers(text).replace("−", "-")
    out: list[Fraction] = []
    for m in _NUMBER.finditer(text):
        raw = m.group().split()[0].replace(",", "").lstrip("+")
        try:
            value = Fraction(raw)
        except (ValueError, ZeroDivisionError):
            continue
        out.append(value * _SCALES[m.group(1).lower()] if m.group(1) else value)
    return out


def _close(value: Fraction, gold: Fraction, tolerance: float) -> bool:
    if tolerance <= 0:
        # Exact, up to rounding a repeating decimal (1/3 written as 0.333333).
        return value == gold or abs(value - gold) <= Fraction(1, 10**6) * max(Fraction(1), abs(gold))
    return abs(value - gold) <= abs(gold) * Fraction(tolerance).limit_denominator(10_000)


@dataclass(frozen=True)
class Grade:
    correct: bool
    rule: str  # which rule decided: alias | number | arithmetic_last_number | none
    graded_text: str


def grade(reply: str, item: Mapping) -> Grade:
    """Grade one reply against one evaluation item (fields: answers, category, numeric_tolerance)."""
    answers = [str(a) for a in (item.get("answers") or [])]
    numeric_golds = [parse_numbers(a)[0] for a in answers if _is_numeric_alias(a)]
    if item.get("category") == "arithmetic":
        numbers = parse_numbers(reply)
        ok = bool(numbers) and any(_close(numbers[-1], g, 0.0) for g in numeric_golds)
        return Grade(ok, "arithmetic_last_number", reply)
    sentence = first_sentence(reply)
    if any(contains_alias(sentence, a) for a in answers):
        return Grade(True, "alias", sentence)
    tolerance = float(item.get("numeric_tolerance") or 0.0)
    if numeric_golds and any(_close(v, g, tolerance) for v in parse_numbers(sentence) for g in numeric_golds):
        return Grade(True, "number", sentence)
    return Grade(False, "none", sentence)


def _is_numeric_alias(alias: str) -> bool:
    return bool(re.fullmatch(r"\s*[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s*", alias))

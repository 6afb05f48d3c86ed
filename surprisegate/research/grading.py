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

from ..text import first_sentence, normalise, parse_numbers


def contains_alias(sentence: str, alias: str) -> bool:
    """Whole-word containment of the normalised alias in the normalised sentence."""
    needle = normalise(alias)
    if not needle:
        return False
    return f" {needle} " in f" {normalise(sentence)} " or f" {needle} " in f" {_without_articles(sentence)} "


def _without_articles(text: str) -> str:
    # Articles inside the sentence too, so "is the Euro" matches the alias "the Euro" -> "euro".
    return " ".join(w for w in normalise(text).split() if w not in ("the", "a", "an"))


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

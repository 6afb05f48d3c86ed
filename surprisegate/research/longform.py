"""Long-form grading (shared/data/README.md, longform_dev.jsonl), as pure functions: every claim a paragraph
prompt asks for is graded on its own over the whole reply.

- The reply is split into sentences with the first-sentence rule (text.py).
- A sentence *states* a claim's relation when its normalised text holds one of the relation's cues at a
  word start ("currenc" in "currency", "currencies").
- right: a stating sentence holds a gold answer; wrong: some sentence states it and none holds one;
  missing: no sentence states it.
- claim accuracy = right / claims; precision = right / (right + wrong); coverage = (right + wrong) / claims;
  a regression is a claim `off` got right that another mode did not, as a share of all claims.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..text import first_sentence, normalise, parse_numbers
from .grading import contains_alias

# A continent's name or adjective states the continent ("the African continent").
CONTINENT_WORDS = {
    "Africa": ("africa", "african"),
    "Asia": ("asia", "asian"),
    "Europe": ("europe", "european"),
    "North America": ("north america", "north american"),
    "South America": ("south america", "south american"),
    "Oceania": ("oceania", "oceanian"),
    "Australia": ("australia", "australian"),
    "Antarctica": ("antarctica", "antarctic"),
}
RELATION_CUES: dict[str, tuple[str, ...]] = {
    "capital": ("capital",),
    "us_state_capital": ("capital",),
    "currency": ("currenc", "money", "tender"),
    "official_language": ("language", "speak", "spoken"),
    "shares_border_with": ("border", "neighbo"),
    "continent": ("continent", *sorted({w for words in CONTINENT_WORDS.values() for w in words})),
    "calling_code": ("calling", "dialling", "dialing", "phone", "telephone", "country code"),
    "population": ("population", "people", "inhabitant", "resident", "populated"),
    "element_symbol": ("symbol",),
    "atomic_number": ("atomic number",),
    "discovery_year": ("discover", "isolat", "identif"),
    "us_state_abbreviation": ("abbreviat", "postal", "code"),
    "us_statehood_year": ("admitted", "union", "statehood", "became", "joined"),
}
# Gold answers compared as parsed numbers: exact, or within a share of the gold (population ±25%).
NUMBER_TOLERANCE = {"calling_code": 0.0, "atomic_number": 0.0, "discovery_year": 0.0, "us_statehood_year": 0.0}
NUMBER_TOLERANCE["population"] = 0.25
# Gold answers matched case-sensitively as whole words: "I" for iodine is not the pronoun "i".
CASE_SENSITIVE = frozenset({"element_symbol", "us_state_abbreviation"})
VERDICTS = ("right", "wrong", "missing")


def reply_sentences(reply: str) -> list[str]:
    """The reply's sentences, in order, by the first-sentence rule applied again after each one."""
    sentences, rest = [], reply.strip()
    while rest:
        sentence = first_sentence(rest)
        sentences.append(sentence)
        rest = rest[len(sentence) :].strip() if rest.startswith(sentence) else ""
    return sentences


def states_relation(sentence: str, relation: str) -> bool:
    """Whether the sentence holds one of the relation's cues at a word start (normalised text)."""
    cues = RELATION_CUES.get(relation)
    if cues is None:
        raise ValueError(f"relation={relation!r} has no cues; known: {', '.join(sorted(RELATION_CUES))}")
    text = f" {normalise(sentence)}"
    return any(f" {cue}" in text for cue in cues)


def holds_answer(sentence: str, relation: str, answers: Sequence[str]) -> bool:
    """Whether the sentence holds one of the gold answers, matched the way the relation asks."""
    if relation in CASE_SENSITIVE:
        return any(re.search(rf"(?<![^\W_]){re.escape(a.strip())}(?![^\W_])", sentence) for a in answers if a.strip())
    if relation in NUMBER_TOLERANCE:
        return _holds_number(sentence, answers, NUMBER_TOLERANCE[relation])
    aliases = (
        [*answers, *(w for a in answers for w in CONTINENT_WORDS.get(a, ()))] if relation == "continent" else answers
    )
    return any(contains_alias(sentence, a) for a in aliases)


def _holds_number(sentence: str, answers: Sequence[str], tolerance: float) -> bool:
    golds = [n for a in answers for n in parse_numbers(a)[:1]]
    share = Fraction(tolerance).limit_denominator(100)
    return any(abs(v - g) <= abs(g) * share for v in parse_numbers(sentence) for g in golds)


@dataclass(frozen=True)
class ClaimGrade:
    relation: str
    verdict: str  # right | wrong | missing
    sentence: str  # the stating sentence that decided (the first right one, else the first stating one)


def grade_claim(sentences: Sequence[str], claim: Mapping) -> ClaimGrade:
    relation, answers = str(claim["relation"]), [str(a) for a in claim.get("answers") or []]
    stating = [s for s in sentences if states_relation(s, relation)]
    right = next((s for s in stating if holds_answer(s, relation, answers)), None)
    if right is not None:
        return ClaimGrade(relation, "right", right)
    return ClaimGrade(relation, "wrong", stating[0]) if stating else ClaimGrade(relation, "missing", "")


def grade_claims(reply: str, item: Mapping) -> list[ClaimGrade]:
    """One grade per claim of a long-form item (field `claims`), in the item's order."""
    sentences = reply_sentences(reply)
    return [grade_claim(sentences, claim) for claim in item["claims"]]


def is_longform(item: Mapping) -> bool:
    return isinstance(item.get("claims"), list) and bool(item["claims"])


@dataclass(frozen=True)
class ClaimScores:
    claims: int
    right: int
    wrong: int
    missing: int
    regressions: int  # claims `off` got right that this mode did not (0 for off itself)
    fixes: int  # claims `off` did not get right that this mode did
    # Replies compared with off's, and those that still state every asked item off's reply states (right or
    # wrong): a rewrite that states its evidence and stops drops the items the model was about to write.
    replies: int = 0
    kept_stated: int = 0

    @property
    def accuracy(self) -> float:
        return self.right / self.claims if self.claims else 0.0

    @property
    def precision(self) -> float | None:
        stated = self.right + self.wrong
        return self.right / stated if stated else None

    @property
    def coverage(self) -> float:
        return (self.right + self.wrong) / self.claims if self.claims else 0.0

    @property
    def regression_rate(self) -> float:
        return self.regressions / self.claims if self.claims else 0.0

    def to_dict(self) -> dict:
        precision = self.precision
        return {
            "claims": self.claims,
            "right": self.right,
            "wrong": self.wrong,
            "missing": self.missing,
            "claim_accuracy": round(self.accuracy, 4),
            "claim_precision": None if precision is None else round(precision, 4),
            "coverage": round(self.coverage, 4),
            "claim_regressions": self.regressions,
            "claim_regression_rate": round(self.regression_rate, 4),
            "claim_fixes": self.fixes,
            "replies_compared": self.replies,
            "still_states_off_items": round(self.kept_stated / self.replies, 4) if self.replies else None,
        }


def score_claims(verdicts: Mapping[str, Sequence[str]], off: Mapping[str, Sequence[str]] | None = None) -> ClaimScores:
    """Scores of one mode from its verdicts per item id (in claim order); `off`: the same for plain decoding,
    which regressions and fixes are counted against (items missing from `off` count for neither)."""
    flat = [v for vs in verdicts.values() for v in vs]
    regressions = fixes = replies = kept = 0
    for item_id, vs in verdicts.items():
        base = (off or {}).get(item_id)
        if base is None:
            continue
        pairs = list(zip(base, vs, strict=True))
        regressions += sum(1 for b, v in pairs if b == "right" and v != "right")
        fixes += sum(1 for b, v in pairs if b != "right" and v == "right")
        replies += 1
        kept += all(v != "missing" for b, v in pairs if b != "missing")
    counts = (flat.count("right"), flat.count("wrong"), flat.count("missing"))
    return ClaimScores(len(flat), *counts, regressions, fixes, replies, kept)


def verdict_counts(grades: Iterable[ClaimGrade]) -> dict[str, int]:
    grades = list(grades)
    return {v: sum(1 for g in grades if g.verdict == v) for v in VERDICTS}

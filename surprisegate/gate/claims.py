"""Where a sentence's claim sits, and how doubtful it is: pure functions over a finished sentence.

A paragraph's doubt is not in its opening ("Chad is a vast…" is uncertain about wording, not about a fact)
but in the words that state something: numbers, and names the question did not give ("Its capital city,
Koufcontou, …"). Those are a sentence's *claim tokens*; the sentence's doubt is the highest per-token
value (entropy or surprise, the calibrated signal) among them, and a sentence without any states nothing
to ground.

The arms are asked about the sentence, with the conversation's subject in place of its pronouns and the
claim words themselves left out: the model may have them wrong, and a wrong name would pull the search
toward it ("Andorra la Mana"). What the rest of the sentence says ("capital", "official language") picks
the evidence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache

from ..arms import Query, Scribe
from ..text import NOT_NAMES, QUERY_STOPWORDS, WORD, fold, split_sentences, stems
from .signals import question_words

# A word: letters (any script), digits, and the joiners inside names and numbers ("N'Djamena", "1,234").
_WORD = re.compile(r"[^\W_](?:[\w'’.,-]*[^\W_])?")
# The opening words of a request: never the subject ("Write a short paragraph about Chad").
_REQUEST_WORDS = frozenset("write tell describe give explain list name summarise summarize".split())
# Words that shape a request rather than name a fact asked for ("briefly, including its capital").
_REQUEST_SHAPE = frozenset(
    "write tell describe give explain list summarise summarize short brief briefly paragraph paragraphs sentence "
    "sentences few words including include includes roughly approximately about me please".split()
)


def _is_claim_word(word: str, first_in_sentence: bool) -> bool:
    """A number, or a capitalised name that is not a sentence opener or a function word."""
    if any(ch.isdigit() for ch in word):
        return True
    if not word[:1].isupper() or word.lower().strip(".") in NOT_NAMES:
        return False
    return not first_in_sentence


def claim_words(sentence: str, question: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentence's claim words: numbers and names, none the question gave."""
    given = question_words(question)
    spans = []
    for i, m in enumerate(_WORD.finditer(sentence)):
        word = m.group()
        if _is_claim_word(word, first_in_sentence=i == 0) and fold(word).strip(".,") not in given:
            spans.append((m.start(), m.end()))
    return spans


def claim_token_flags(pieces: Sequence[str], question: str) -> list[bool]:
    """For each token piece of one sentence, whether it holds part of a claim word."""
    text = "".join(pieces)
    spans = claim_words(text, question)
    flags, at = [], 0
    for piece in pieces:
        start, end = at, at + len(piece)
        flags.append(any(s < end and start < e for s, e in spans))
        at = end
    return flags


@lru_cache(maxsize=256)
def asked_words(question: str) -> frozenset[str]:
    """Stems of what the question asks about: its content words, the subject's and the request's left out
    ("…about Chad: its capital, currency …" -> capital, currency, …). Cached: asked once per judged sentence."""
    words = [w for w in WORD.findall(fold(question)) if w not in QUERY_STOPWORDS and w not in _REQUEST_SHAPE]
    return frozenset(stems(" ".join(words)) - stems(subject_of(question)))


# The parts of a question's list of requests: "its capital, its currency and the year it became a state".
_LIST_PARTS = re.compile(r"[,;:?]|\band\b|\bor\b", re.IGNORECASE)


def asked_items(question: str) -> list[frozenset[str]]:
    """What the question asks for, item by item: the asked stems of each part of its list ("…: its capital,
    its currency and the year it became a state" -> {capital}, {currency}, {year, became, state})."""
    return list(asked_parts(question))


def asked_parts(question: str) -> dict[frozenset[str], str]:
    """asked_items, each with the question's own words for it (its first part: "the year it became a state")."""
    asked, parts = asked_words(question), {}
    for part in _LIST_PARTS.split(question):
        item = frozenset(stems(part) & asked)
        if item and item not in parts:
            parts[item] = part.strip(" .!\n")
    return parts


def distinct_parts(parts: dict[frozenset[str], str]) -> dict[frozenset[str], str]:
    """asked_parts, each item by the stems no other part shares: a word two parts share names neither ("the US
    state of Ohio: … the year it became a state" -> the year's item is {year, became}; "state", in every sentence
    about a state, would have said it), and a part left with none is dropped (it described the subject)."""
    out = {}
    for item, words in parts.items():
        own = item - set().union(*(other for other in parts if other is not item))
        if own:
            out[own] = words
    return out


def kind_stems(text: str, question: str) -> set[str]:
    """Stems of what the text calls its subject, in its "It is a …" and "<subject> is a …" sentences ("It is a
    landlocked country with …" -> landlocked, country, with): words of the subject's kind, which state no item
    ("the countries it borders" is not said by "country")."""
    heads = ["It"] + ([re.escape(subject)] if (subject := subject_of(question)) else [])
    called = re.compile(rf"(?:{'|'.join(heads)}) (?:is|was) an? ((?:[\w-]+ ){{0,3}}[\w-]+)")
    return set().union(*(stems(m.group(1)) for s in split_sentences(text) if (m := called.match(s))))


def speaks_of_asked(sentence: str, question: str) -> bool:
    """Whether the sentence speaks of something the question asked for (shares a stem with asked_words):
    "Its capital is Koufcontou." does, "It is a member of the African Union." does not."""
    return bool(stems(sentence) & asked_words(question))


def first_claim_token(pieces: Sequence[str], flags: Sequence[bool]) -> int:
    """Index of the token a sentence's rewrite starts at: its first claim token when that token starts a word
    (the words before it, "Its capital city, ", stay as written), else 0 (the sentence's start)."""
    first = next((i for i, f in enumerate(flags) if f), None)
    if first is None or first == 0:
        return 0
    before, piece = "".join(pieces[:first]), pieces[first]
    starts_word = piece[:1].isspace() or not before or not before[-1].isalnum()
    return first if starts_word else 0


def sentence_doubt(values: Sequence[float], flags: Sequence[bool]) -> float:
    """The highest value among the claim tokens; -inf when the sentence has none (it states nothing)."""
    held = [v for v, f in zip(values, flags, strict=True) if f and not math.isnan(v)]
    return max(held) if held else -math.inf


def subject_of(question: str) -> str:
    """The names a question is about, in order ("Write a short paragraph about Chad: …" -> "Chad"):
    its capitalised words, openers and function words left out."""
    names = []
    for i, m in enumerate(_WORD.finditer(question)):
        word = m.group().strip(".,")
        lowered = word.lower()
        if not word[:1].isupper() or lowered in NOT_NAMES or (i == 0 and lowered in _REQUEST_WORDS):
            continue
        if word not in names:
            names.append(word)
    return " ".join(names)


def without_claims(sentence: str, question: str) -> str:
    """The sentence with its claim words taken out, whitespace collapsed."""
    kept, at = [], 0
    for start, end in claim_words(sentence, question):
        kept.append(sentence[at:start])
        at = end
    kept.append(sentence[at:])
    return " ".join("".join(kept).split())


def sentence_arm_query(sentence: str, question: str, scribe: Scribe | None = None, asked_item: bool = False) -> Query:
    """What the arms are asked about a doubtful sentence of a paragraph: the sentence, its subject named and
    its claim words (which the model may have wrong) left out; `asked_item`: the sentence is the question's words
    for an item the reply has not stated."""
    subject, rest = subject_of(question), without_claims(sentence, question)
    asked = f"{subject}: {rest}" if subject else rest  # the subject, then the sentence without its claims
    return Query(rest, asked, sentence, scribe=scribe, subject=subject, prompt=question, asked_item=asked_item)

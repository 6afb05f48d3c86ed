"""The memory arm (Remember): ground a doubtful span in the user's own memory store.

It searches with the user's question (the doubtful span only re-ranks, since the model may have it
wrong) in the store's default mode (hybrid: BM25 fused with dense vectors), keeps passages whose
relevance `score` clears the floor, and from each passes on the one sentence that best answers the
question, never the whole passage. The floor is calibrated for the lexical `score` of "bm25" and
"hybrid"; a store searching in "dense" mode scores by cosine similarity, which it does not fit.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import ArmError, SurpriseGateError
from ..store.sqlite import Hit, query_terms
from ..store.titles import title_key
from ..text import QUERY_STOPWORDS, light_stem, split_sentences, stems
from . import Evidence, Query, check_arm_settings

# Chosen on factqa_dev (1309 questions over 901 passages): all but one of the 1301 right top passages
# scored at least 0.6; questions about made-up places scored at most 0.35 (0.46 typed in lower case).
DEFAULT_FLOOR = 0.6
PASSAGE_CHARS = 600  # how much of the passage the receipt keeps

# In "the capital of [the U.S. state of] X" the word before the first "of" names the relation asked.
_RELATION_HEAD = re.compile(r"([^\W_]+)\s+of\b", re.IGNORECASE)
# "In what year ..." / "When did ..." asks for a year: a sentence holding one answers it ("Iowa became a
# U.S. state in 1846." over "Iowa is a U.S. state with postal abbreviation IA.", which shares more words).
# A question that names "the year" asks for one too, however it is put ("I need the year X was discovered").
_ASKS_YEAR = re.compile(r"\byear\b|^\s*when\b", re.IGNORECASE)
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})\b")


class MemoryStore(Protocol):
    """What the arm needs from a store (SQLiteMemory; a Milvus store can offer the same)."""

    def search(self, query: str, k: int = 5, context: str = "", deadline: float | None = None) -> list[Hit]: ...


def best_sentences(
    passage: str,
    weights: dict[str, float],
    count: int = 1,
    relation: str | None = None,
    answer_shape: re.Pattern | None = None,
) -> str:
    """The `count` sentences of `passage` that best match the question, in passage order.

    `weights` maps stemmed question words to weights. Sentences holding the stemmed `relation` word
    (e.g. "currency") come first, then those holding text of the `answer_shape` the question asks for
    (a year), then by the weight of the words no sentence chosen before holds; ties go to the earlier one.
    """
    sentences = split_sentences(passage) or [passage]
    held = [stems(s) for s in sentences]
    covered: set[str] = set()

    def rank_key(index: int) -> tuple[bool, bool, float, int]:
        # Only words no chosen sentence holds count: "People from X are called Y." adds nothing once "The
        # international calling code of X …" is in, and the capital's sentence goes in before it.
        weight = sum(weight for stem, weight in weights.items() if stem in held[index] and stem not in covered)
        shaped = answer_shape is None or bool(answer_shape.search(sentences[index]))
        return (relation not in held[index], not shaped, -weight, index)

    chosen: list[int] = []
    rest = list(range(len(sentences)))
    while rest and len(chosen) < count:
        best = min(rest, key=rank_key)
        chosen.append(best)
        rest.remove(best)
        covered |= held[best]
    return " ".join(sentences[index] for index in sorted(chosen))


@dataclass(frozen=True)
class _Search:
    """What the store is asked, and how each passage found gives its sentences."""

    text: str  # the store's query
    weights: dict[str, float]  # stemmed words that pick a passage's sentence, by weight
    relation: str | None  # the stemmed word naming what is asked (best_sentences)
    shape: re.Pattern | None  # the shape of text asked for (a year)
    about: str  # text whose named title puts that title's passage first
    claims_per_sentence: bool  # a paragraph sentence: as many passage sentences as it states claims
    context: str = ""  # re-ranks the store's finds a little (the model's claim, which may be wrong)
    asked: str = ""  # the user's words: of two passages titled as the subject, the one holding more of them first


def _relates(word: str, held: set[str], subject: set[str]) -> bool:
    """Whether a question word can state the relation asked: the subject's passage holds it, and it is not
    the subject's own word or a bare number."""
    stem = light_stem(word)
    return stem in held and stem not in subject and not word.isdigit()


class MemoryArm:
    name = "memory"

    def __init__(self, store: MemoryStore, floor: float = DEFAULT_FLOOR, k: int = 5, max_sentences: int = 1):
        check_arm_settings(
            floor, DEFAULT_FLOOR, k=(k, "passages to consider"), max_sentences=(max_sentences, "sentences per passage")
        )
        self.store = store
        self.floor = floor
        self.k = k
        self.max_sentences = max_sentences

    def ground(self, query: Query, deadline: float) -> list[Evidence]:
        """Evidence best first; empty when no passage clears the floor or the deadline has passed."""
        if time.monotonic() >= deadline:
            return []
        try:
            search = self._subject_search(query, deadline) or self._wording_search(query)
            if not search.text:
                return []
            hits = self.store.search(search.text, k=self.k, context=search.context, deadline=deadline)
        except TimeoutError:
            return []
        except (sqlite3.Error, SurpriseGateError) as err:  # SQLite, or a Milvus server that went away
            raise ArmError(f"memory search failed for question={query.question or query.sentence!r}: {err}") from err
        return self._evidence(hits, search, deadline)

    def _subject_search(self, query: Query, deadline: float) -> _Search | None:
        """Ask about the subject the store knows by title, and the relation asked of it, or None.

        The subject is a title the question names (store/titles.py), whatever its wording; the relation is
        the question's words its passage holds, else the words of the model's sentence that it holds, else
        none (the passage's lead answers). The question's other words are its asker's wording: they neither
        search nor score, so a chatty question clears the floor as a terse one does.
        """
        named = getattr(self.store, "titles_named", None)
        question = query.question.strip()
        if named is None:
            return None
        texts = (query.subject, query.prompt, question)
        subject = next((titles[0] for text in texts if text and (titles := named(text))), "")
        if not subject:
            return None
        if query.subject or query.prompt:
            # A paragraph's sentence: the passage of the subject the store knows, its sentences picked by the
            # sentence's words (as many as it states claims). Evidence chosen by the sentence's held words alone,
            # or with the prompt's other asked items, measured worse (longform_dev intervene: 0.469 on all 187, 0.38
            # on the first 96, against 0.506 for these).
            return self._paragraph_search(question, subject, query)
        key = title_key(subject)
        passages = [
            h.text for h in self.store.search(subject, k=self.k, deadline=deadline) if title_key(h.title) == key
        ]
        held = set().union(*(stems(p) for p in passages))
        named_stems = stems(subject)
        relation = []
        for text in (question, query.sentence):
            relation = [t.word for t in query_terms(text) if _relates(t.word, held, named_stems)]
            if relation:
                break
        # Asked in words no sentence of it uses ("Which continent is Andorra part of?"): its passage still
        # answers, by the sentence of the shape asked (a year), else by its lead ("… a country in Europe.").
        words = " ".join(dict.fromkeys(relation))
        return _Search(
            text=f"{subject} {words}".strip(),
            weights=self._word_weights(words),
            relation=relation_word(question),
            shape=answer_shape(question),
            about=subject,
            claims_per_sentence=False,
            asked=question,
        )

    def _wording_search(self, query: Query) -> _Search:
        """Search by the question's words (the claim re-ranking), or a paragraph sentence by its subject."""
        question = query.question.strip()
        claim = query.span.strip() or query.sentence.strip()
        subject = query.subject.strip()
        if subject:
            return self._paragraph_search(question, subject, query)
        text, context = (question, claim) if question else (claim, "")
        return _Search(text, self._word_weights(text), relation_word(text), answer_shape(text), text, False, context)

    def _paragraph_search(self, sentence: str, subject: str, query: Query) -> _Search:
        """A paragraph's sentence: the subject finds the passage, the sentence's words pick its sentences (as
        many as it states claims). Its other words, such as a wrong name, cover no passage: as search words or
        as re-ranking context they would sink it below the floor. No relation word or answer shape: read from
        a subject's name they named none ("Republic of the Congo" gave "republ")."""
        weights = self._sentence_weights(sentence, subject)
        if query.asked_item:  # one item: one sentence, of the shape it asks for ("the year it became a state": 1889)
            # (as many as the words hold gave South Dakota's postal-code sentence too, and the model copied that one)
            return _Search(subject, weights, None, answer_shape(sentence), subject, False, asked=query.prompt)
        return _Search(subject, weights, None, None, subject, True, asked=query.prompt)

    def _evidence(self, hits: list[Hit], search: _Search, deadline: float) -> list[Evidence]:
        evidence: list[Evidence] = []
        # The subject's own passage first ("the atomic number of Zinc": Zinc's, not Mercury's); stable: score order.
        ordered = sorted(hits, key=lambda h: not names_subject(h.title, search.about))
        for hit in homonyms_by_asked(ordered, search.about, search.asked):
            if time.monotonic() > deadline:
                break
            if hit.score < self.floor:
                continue
            count = claim_count(hit.text, search.weights) if search.claims_per_sentence else self.max_sentences
            sentence = best_sentences(hit.text, search.weights, count, search.relation, search.shape)
            evidence.append(
                Evidence(
                    claim=sentence,
                    evidence=sentence,
                    confidence=hit.score,
                    source=f"memory:{hit.source}",
                    observable=0.0,
                    detail={
                        "title": hit.title,
                        "searched": search.text,
                        "bm25": hit.bm25,
                        "cosine": hit.cosine,  # None from a store without vectors
                        "passage": hit.text[:PASSAGE_CHARS],
                    },
                )
            )
        return evidence

    def _sentence_weights(self, sentence: str, subject: str) -> dict[str, float]:
        # The sentence's own words pick its passage sentence; the subject is in every one of them.
        named = stems(subject)
        return {w: v for w, v in self._word_weights(sentence).items() if w not in named}

    def _word_weights(self, question: str) -> dict[str, float]:
        # Rare words pick the sentence: "capital" beats "Burkina", which every sentence repeats.
        # A store without `idf()` (another backend) gets equal weights.
        idf = getattr(self.store, "idf", None)
        weights: dict[str, float] = {}
        for term in query_terms(question):
            stem = light_stem(term.word)
            weights[stem] = max(weights.get(stem, 0.0), idf(term.word) if idf else 1.0)
        return weights


def claim_count(passage: str, weights: dict[str, float], most: int = 3) -> int:
    """How many passage sentences a paragraph's sentence asks about: those holding one of its words (a
    sentence may state several claims, "Its capital is X, its currency Y and its language Z"), 1 to `most`.
    Two at most left a three-claim sentence one claim short: 3 measured 0.528 against 0.503 claim accuracy on
    60 longform_dev prompts (README Paragraphs)."""
    held = [stems(s) for s in split_sentences(passage)]
    return max(1, min(most, sum(1 for h in held if any(stem in h for stem in weights))))


def homonyms_by_asked(hits: list[Hit], subject: str, asked: str) -> list[Hit]:
    """`hits` with the passages titled as the subject reordered among their own places, the one holding more of
    the user's words first (stable): "the US state of Georgia: its capital, its postal abbreviation" is the U.S.
    state's passage, not the country's that the store ranked first; "What is the capital of Georgia?" says
    nothing either way and keeps the store's order."""
    key = title_key(subject)
    places = [i for i, hit in enumerate(hits) if key and title_key(hit.title or "") == key]
    if len(places) < 2:
        return hits
    words = {light_stem(t.word) for t in query_terms(asked)} - stems(subject)
    homonyms = sorted((hits[i] for i in places), key=lambda h: -len(words & stems(h.text)))
    out = list(hits)
    for i, hit in zip(places, homonyms, strict=True):
        out[i] = hit
    return out


def names_subject(title: str | None, question: str) -> bool:
    """Whether the passage's title is named in the question, as whole words.

    Among passages that all hold the question's words, the one about the subject comes first:
    "the atomic number of Zinc" is Zinc's passage, not Mercury's that mentions zinc.
    """
    if not title or not title.strip():
        return False
    return re.search(r"(?<![^\W_])" + re.escape(title.strip()) + r"(?![^\W_])", question, re.IGNORECASE) is not None


def answer_shape(question: str) -> re.Pattern | None:
    """The shape of text the question asks for, when its wording says so (only years, for now)."""
    return _YEAR if _ASKS_YEAR.search(question) else None


def relation_word(question: str) -> str | None:
    """The stemmed word naming what is asked: "currency" in "What is the official currency of X?".

    Without it, "official" (as rare as "currency") picks "Official languages of X ..." half the time.
    """
    head = _RELATION_HEAD.search(question)
    return light_stem(head.group(1)) if head and head.group(1).lower() not in QUERY_STOPWORDS else None

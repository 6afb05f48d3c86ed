"""The Milvus memory store against the real engine (milvus-lite), side by side with SQLiteMemory.

The behaviour tests run over every store kind: SQLite, Milvus with BM25 alone, and Milvus hybrid
(BM25 + dense vectors from a tiny hashing embedder, so no model is needed). Milvus kinds skip when
pymilvus or milvus-lite is not installed; URI routing and the unreachable-server check need neither
(the latter only pymilvus).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surprisegate.errors import BackendError, InputError, MissingDependency
from surprisegate.store.open import open_memory
from surprisegate.store.sqlite import MAX_CHUNK_CHARS, Hit, SQLiteMemory

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HAS_MILVUS_LITE = all(importlib.util.find_spec(name) for name in ("pymilvus", "milvus_lite"))
needs_milvus_lite = pytest.mark.skipif(not HAS_MILVUS_LITE, reason="pip install pymilvus milvus-lite")

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
# Filler, so that words like "capital" are common as in a real store (see test_store_sqlite.py).
PASSAGES += [
    {
        "kb_id": f"country:X{i}",
        "title": f"Land{i}",
        "text": f"Land{i} is a country in Asia. The capital of Land{i} is Town{i}.",
    }
    for i in range(20)
]


class HashingEmbedder:
    """A deterministic stand-in for a sentence embedder: hashed lower-cased words, unit length."""

    name = "test-hashing-64"
    dim = 64

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                vectors[row, int.from_bytes(digest[:2], "little") % self.dim] += 1.0 if digest[2] % 2 else -1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.divide(vectors, norms, out=vectors, where=norms > 0)


class OtherEmbedder(HashingEmbedder):
    name = "test-other-64"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8"
    )
    return path


# -- stores ---------------------------------------------------------------------------------------

KINDS = [
    "sqlite",
    "sqlite-hybrid",
    pytest.param("milvus", marks=needs_milvus_lite),
    pytest.param("milvus-hybrid", marks=needs_milvus_lite),
]
MILVUS_KINDS = [pytest.param("milvus", marks=needs_milvus_lite), pytest.param("milvus-hybrid", marks=needs_milvus_lite)]
_collection_numbers = itertools.count()


@pytest.fixture(scope="session")
def lite_db(tmp_path_factory) -> Path:
    # One milvus-lite file for the whole run (starting its engine takes a second or two); each store
    # gets a fresh collection in it.
    return tmp_path_factory.mktemp("milvus") / "memory.db"


def lite_uri(lite_db: Path, name: str | None = None) -> str:
    return f"milvus-lite:{lite_db}#{name or f'c{next(_collection_numbers)}'}"


def new_store(kind: str, tmp_path: Path, lite_db: Path):
    embedder = HashingEmbedder() if kind.endswith("-hybrid") else None
    if kind.startswith("sqlite"):
        return SQLiteMemory(tmp_path / f"m{next(_collection_numbers)}.sqlite", create=True, embedder=embedder)
    return open_memory(lite_uri(lite_db), create=True, embedder=embedder)


@pytest.fixture
def make_store(kind, tmp_path, lite_db):
    """A factory of empty stores of the test's `kind`, closed (and dropped) afterwards."""
    opened = []

    def make():
        store = new_store(kind, tmp_path, lite_db)
        opened.append(store)
        return store

    yield make
    for store in opened:
        if hasattr(store, "collection"):
            store._client.drop_collection(store.collection)
        store.close()


@pytest.fixture
def store(make_store, tmp_path):
    memory = make_store()
    memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
    return memory


@pytest.fixture(scope="module")
def module_store(request, tmp_path_factory, lite_db):
    tmp = tmp_path_factory.mktemp("module_store")
    memory = new_store(request.param, tmp, lite_db)
    memory.add_jsonl(write_jsonl(tmp / "kb.jsonl", PASSAGES))
    yield memory
    memory.close()


def by_kind(kinds=KINDS):
    """Run a test once per store kind; its `make_store`, `store` fixtures are of that kind."""
    return pytest.mark.parametrize("kind", kinds)


def by_module_kind(kinds=KINDS):
    """Run a test once per store kind, on one store per kind shared by the module."""
    return pytest.mark.parametrize("module_store", kinds, indirect=True)


# -- ingest ---------------------------------------------------------------------------------------


@by_kind()
def test_ingest_counts_and_dedup(make_store, tmp_path):
    duplicate = dict(PASSAGES[0], kb_id="country:BF-copy")  # same text, other id
    kb = write_jsonl(tmp_path / "kb.jsonl", PASSAGES + [duplicate])
    memory = make_store()
    first = memory.add_jsonl(kb)
    assert (first.added, first.skipped_duplicates, first.errors) == (len(PASSAGES), 1, [])
    again = memory.add_jsonl(kb)
    assert (again.added, again.skipped_duplicates) == (0, len(PASSAGES) + 1)
    assert memory.count() == len(PASSAGES)
    assert memory.search("capital of Burkina Faso")[0].source == "country:BF"  # the first copy's id wins


@by_kind()
def test_malformed_lines_are_reported_by_number_and_the_rest_ingested(make_store, tmp_path):
    rows = [PASSAGES[0], "{not json", PASSAGES[1], {"kb_id": "x", "title": "no text"}, "[1, 2]", "", PASSAGES[3]]
    memory = make_store()
    report = memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", rows))
    assert report.added == 3
    assert [line_no for line_no, _ in report.errors] == [2, 4, 5]
    assert "JSON" in report.errors[0][1] and "'text'" in report.errors[1][1]
    assert memory.count() == 3


@by_kind()
def test_id_field_falls_back_to_id_then_line(make_store, tmp_path):
    rows = [{"kb_id": "a", "text": "alpha passage"}, {"id": "b", "text": "bravo passage"}, {"text": "charlie passage"}]
    memory = make_store()
    memory.add_jsonl(write_jsonl(tmp_path / "notes.jsonl", rows))
    assert {memory.search(word)[0].source for word in ("alpha", "bravo", "charlie")} == {"a", "b", "notes.jsonl:3"}


@by_kind()
def test_custom_field_names(make_store, tmp_path):
    rows = [{"doc": "d1", "body": "The capital of Peru is Lima.", "heading": "Peru"}]
    memory = make_store()
    memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", rows), text_field="body", id_field="doc", title_field="heading")
    hit = memory.search("capital of Peru")[0]
    assert (hit.source, hit.title) == ("d1", "Peru")


@by_kind()
def test_failed_ingest_leaves_nothing_half_written(store):
    before = store.count()

    def passages_then_crash():
        yield {"text": "a fresh passage that would be new", "source": "new:1"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        store.add_passages(passages_then_crash())
    with pytest.raises(InputError, match="no text"):
        store.add_passages([{"text": "another fresh passage", "source": "new:2"}, {"text": "  ", "source": "new:3"}])
    assert store.count() == before
    assert store.search("fresh passage") == []


@by_kind()
def test_text_files_and_folders_are_chunked(make_store, tmp_path):
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "trip.md").write_text("# Trip\n\nWe flew to Ouagadougou in May.\n\nThe hotel was near the market.\n")
    long_paragraph = " ".join(f"Sentence number {i} talks about the quarterly budget review." for i in range(60))
    (notes / "sub" / "budget.txt").write_text(long_paragraph)
    (notes / "script.py").write_text("print('not a note')")
    single = tmp_path / "single.txt"
    single.write_text("A lone note about zebras.")
    memory = make_store()
    report = memory.add_text_files([notes, single])
    assert report.errors == []
    assert memory.search("Ouagadougou")[0].source == "file:notes/trip.md#0"
    assert memory.search("zebras")[0].source == "file:single.txt#0"
    budget = memory.search("quarterly budget review", k=50)
    assert len(budget) >= 4 and all(hit.source.startswith("file:notes/sub/budget.txt#") for hit in budget)
    assert all(len(hit.text) <= MAX_CHUNK_CHARS for hit in budget)
    assert memory.search("print") == []  # .py files are not notes


@by_kind(MILVUS_KINDS)
def test_passage_too_large_for_milvus_is_refused_by_name(make_store):
    memory = make_store()
    huge = " ".join(f"w{i}" for i in range(5_000))  # under 65,535 bytes but 5,000 distinct words
    with pytest.raises(InputError, match=r"source='big:1'.*distinct words.*split it"):
        memory.add_passages([{"text": "a small one", "source": "ok:1"}, {"text": huge, "source": "big:1"}])
    with pytest.raises(InputError, match="has 70,000 bytes of text, more than Milvus holds"):
        memory.add_passages([{"text": "x" * 70_000, "source": "big:2"}])
    assert memory.count() == 0  # checked before anything was written


# -- search ---------------------------------------------------------------------------------------


@by_module_kind()
def test_search_finds_the_passage_about_the_question(module_store):
    hits = module_store.search("What is the capital of Burkina Faso?")
    assert hits[0].source == "country:BF"
    assert hits[0].score == pytest.approx(1.0)
    assert all(isinstance(hit, Hit) and 0.0 <= hit.score <= 1.0 for hit in hits)
    hits = module_store.search("What is the capital of Burkina Faso?", mode="bm25")
    assert [hit.bm25 for hit in hits] == sorted(hit.bm25 for hit in hits)  # best (most negative) first
    assert all(hit.cosine is None for hit in hits)


@by_module_kind()
def test_unknown_subject_scores_low(module_store):
    assert all(hit.score < 0.3 for hit in module_store.search("What is the capital of Atlantis?"))
    assert all(hit.score < 0.5 for hit in module_store.search("what is the official currency of wakanda"))


@by_module_kind()
def test_symbol_that_is_a_stopword_still_counts(module_store):
    assert module_store.search("Which chemical element has the symbol He?")[0].source == "element:He"
    assert module_store.search("Which chemical element has the symbol H?")[0].source == "element:H"


@by_module_kind()
def test_wrong_claim_in_context_does_not_outrank_the_question(module_store):
    hits = module_store.search(
        "What is the capital of Burkina Faso?", context="The capital of Burkina Faso is Bobo-Dioulasso"
    )
    assert hits[0].source == "country:BF"
    assert hits[0].score >= 0.6


@by_module_kind()
def test_k_limits_results_and_stopwords_find_nothing(module_store):
    assert len(module_store.search("Africa country capital", k=2)) == 2
    assert module_store.search("Africa", k=0) == []
    assert module_store.search("what is the of and") == []
    assert module_store.search("") == []


FTS_SYNTAX = [
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
    'id in ["x"]',
    'source like "%"',
    "\\",
    '\\"',
    'array_contains(words, "capit")',
]


@by_module_kind()
def test_query_syntax_in_queries_never_raises(module_store):
    for query in FTS_SYNTAX:
        for hit in module_store.search(query) + module_store.search("capital", context=query):
            assert 0.0 <= hit.score <= 1.0


@by_module_kind(MILVUS_KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.lists(
        st.sampled_from(["AND", "OR", "capital", "France", "like", "in", *"\"*:()^-+{}[].,?!%_\\ 'é0"]), max_size=12
    ).map("".join)
    | st.text(max_size=40)
)
def test_any_text_searches_safely_with_scores_in_unit_interval(module_store, query):
    for hit in module_store.search(query, context=query):
        assert 0.0 <= hit.score <= 1.0


@by_module_kind(MILVUS_KINDS)
def test_scores_and_idf_equal_sqlites(module_store, tmp_path):
    """Same words, same document frequencies, same formula: the score of a passage does not depend on the store."""
    with SQLiteMemory(tmp_path / "m.sqlite", create=True) as sqlite:
        sqlite.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
        for query, context in [
            ("What is the capital of Burkina Faso?", ""),
            ("What is the capital of Burkina Faso?", "The capital of Burkina Faso is Bobo-Dioulasso"),
            ("Which chemical element has the symbol He?", ""),
            ("what is the official currency of wakanda", ""),
            ("How many people live in Bobo-Dioulasso?", "about 900,000 people"),
            ("capitals of countries", ""),
        ]:
            expected = {hit.source: hit.score for hit in sqlite.search(query, k=30, context=context)}
            got = {hit.source: hit.score for hit in module_store.search(query, k=30, context=context)}
            shared = expected.keys() & got.keys()
            assert shared and all(got[source] == pytest.approx(expected[source]) for source in shared), query
        for word in ("capital", "Capitals", "Burkina", "Atlantis", "904"):
            assert module_store.idf(word) == pytest.approx(sqlite.idf(word)), word


@by_module_kind()
def test_every_store_names_the_same_titles(module_store):
    """The memory arm asks about the subject a store knows by title: every kind reads a text's titles alike."""
    for text, named in [
        ("Hey, so which city is Burkina Faso's capital?", ["Burkina Faso"]),
        ("is bobo-dioulasso in burkina faso", ["Bobo-Dioulasso", "Burkina Faso"]),
        ("What is the capital of Atlantis?", []),
    ]:
        assert module_store.titles_named(text) == named, text


@needs_milvus_lite
def test_another_handles_writes_reach_the_score(lite_db, monkeypatch):
    """Document frequencies are cached, but a change in the store (here by another handle) drops them."""
    import surprisegate.store.milvus as milvus

    monkeypatch.setattr(milvus, "TOTAL_TTL_S", 0.0)  # re-count on every search instead of once a second
    uri = lite_uri(lite_db)
    with open_memory(uri, create=True, embedder=None) as writer, open_memory(uri, embedder=None) as reader:
        writer.add_passages([{"text": f"Zorblat is a town number {i}.", "source": f"z:{i}"} for i in range(3)])
        writer.add_passages([{"text": f"Plain filler passage number {i}.", "source": f"f:{i}"} for i in range(7)])
        before = reader.idf("Zorblat")
        assert before == pytest.approx(SQLiteMemory._idf(3, 10))
        writer.remove("z:0")
        assert reader.idf("Zorblat") == pytest.approx(SQLiteMemory._idf(2, 9))
        assert reader.search("Where is Zorblat?")[0].source in {"z:1", "z:2"}


@by_kind()
def test_deadline_already_passed_raises_timeout(store):
    with pytest.raises(TimeoutError):
        store.search("rivers mountains capital", deadline=time.monotonic() - 1)
    assert store.search("capital of France")[0].source == "country:FR"  # nothing left behind


# -- remove and stats -----------------------------------------------------------------------------


@by_kind(MILVUS_KINDS)
def test_remove_by_source_prefix(store):
    total = store.count()
    assert store.remove("country:X1") == 11  # X1 and X10..X19
    assert store.count() == total - 11
    assert all(not hit.source.startswith("country:X1") for hit in store.search("Asia capital", k=30))
    assert store.remove("country:X1") == 0
    assert store.remove("nothing:") == 0
    # LIKE's wildcards and quotes in a prefix are plain characters.
    store.add_passages(
        [{"text": t, "source": s} for t, s in [("one percent", 'odd:50%"x'), ("two", "odd:50_y"), ("three", "odd:é/1")]]
    )
    assert store.remove('odd:50%"') == 1
    assert store.remove("odd:é") == 1
    assert store.remove("odd:") == 1
    assert store.search("capital of France")[0].source == "country:FR"
    with pytest.raises(InputError, match="non-empty string"):
        store.remove("")


@by_kind(MILVUS_KINDS)
def test_stats(store):
    stats = store.stats()
    assert stats["backend"] == "milvus-lite" and stats["collection"] == store.collection
    assert stats["uri"].startswith("milvus-lite:") and stats["schema_version"] == 1
    assert (stats["passages"], stats["sources"]) == (len(PASSAGES), len(PASSAGES))
    if store.embedder is not None:
        assert (stats["vectors"], stats["embedder"], stats["dim"]) == (len(PASSAGES), "test-hashing-64", 64)
        assert (stats["search_modes"], stats["note"]) == (["bm25", "dense", "hybrid"], None)
    else:
        assert (stats["vectors"], stats["embedder"], stats["dim"], stats["search_modes"]) == (0, None, None, ["bm25"])
        assert "without vectors" in stats["note"]


@by_kind(MILVUS_KINDS)
def test_reindex_has_nothing_to_do_or_says_why_not(store):
    if store.embedder is not None:
        assert store.reindex() == 0  # every passage got its vector as it was written
        with pytest.raises(InputError, match="not offered for Milvus"):
            store.reindex(full=True)
    else:
        with pytest.raises(InputError, match="cannot gain them; build a new store"):
            store.reindex()


@by_kind(["sqlite-hybrid", pytest.param("milvus-hybrid", marks=needs_milvus_lite)])
def test_dense_and_hybrid_modes(store):
    dense = store.search("capital of France", mode="dense", k=3)
    assert len(dense) == 3 and all(hit.bm25 == 0.0 and hit.score == max(0.0, hit.cosine) for hit in dense)
    assert [hit.cosine for hit in dense] == sorted((hit.cosine for hit in dense), reverse=True)
    hybrid = store.search("capital of France", k=3)
    assert hybrid[0].source == "country:FR" and all(hit.cosine is not None for hit in hybrid)


# -- opening --------------------------------------------------------------------------------------


@needs_milvus_lite
def test_store_persists_across_reopen(lite_db, tmp_path):
    uri = lite_uri(lite_db, "persist")
    with open_memory(uri, create=True, embedder=HashingEmbedder()) as memory:
        memory.add_jsonl(write_jsonl(tmp_path / "kb.jsonl", PASSAGES))
    with open_memory(uri, embedder=HashingEmbedder()) as memory:
        assert memory.count() == len(PASSAGES)
        assert memory.search("capital of France")[0].source == "country:FR"
        assert memory.stats()["search_modes"] == ["bm25", "dense", "hybrid"]
    with pytest.raises(InputError, match="holds vectors from embedder 'test-hashing-64'"):
        open_memory(uri, embedder=OtherEmbedder())
    with open_memory(uri, embedder=None) as memory:  # no embedder: BM25 still answers, ingest refuses
        assert memory.search("capital of France")[0].source == "country:FR"
        with pytest.raises(InputError, match="open it with embedder='auto'"):
            memory.add_passages([{"text": "a new passage", "source": "new"}])
        with pytest.raises(InputError, match="mode='dense' needs vectors"):
            memory.search("capital of France", mode="dense")


@needs_milvus_lite
def test_missing_collection_names_uri_and_fix(lite_db):
    open_memory(lite_uri(lite_db), create=True, embedder=None).close()  # the file exists, the collection not
    uri = lite_uri(lite_db, "never_made")
    with pytest.raises(InputError) as err:
        open_memory(uri)
    assert str(err.value) == (
        f"memory={uri!r} has no collection 'never_made'; build it with: surprisegate memory add --memory {uri} "
        "FILE.jsonl"
    )


def test_missing_lite_file_names_uri_and_fix(tmp_path):
    uri = f"milvus-lite:{tmp_path / 'nowhere.db'}#memory"
    with pytest.raises(
        InputError, match="does not exist; build it with: surprisegate memory add --memory milvus-lite:"
    ):
        open_memory(uri)
    assert not (tmp_path / "nowhere.db").exists()


@needs_milvus_lite
def test_other_collection_is_refused(lite_db):
    from pymilvus import MilvusClient

    client = MilvusClient(uri=str(lite_db))
    client.create_collection("someone_elses", dimension=4)
    with pytest.raises(InputError, match="is a Milvus collection but not a surprisegate memory store"):
        open_memory(lite_uri(lite_db, "someone_elses"), create=True)  # create must not adopt it


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("milvus://localhost:19530/bad-name", "does not allow"),
        ("milvus://localhost:notaport/memory", "bad port"),
        ("milvus:///memory", "names no host"),
        ("milvus://user:secret@localhost:19530/memory", "MILVUS_TOKEN"),
        ("milvus-lite:/tmp/memory.sqlite#memory", "ending in .db"),
        ("postgres://localhost/memory", "scheme this surprisegate does not know"),
    ],
)
def test_bad_uris_are_input_errors(uri, message):
    with pytest.raises(InputError, match=message):
        open_memory(uri)


def test_plain_path_opens_sqlite(tmp_path):
    with open_memory(str(tmp_path / "m.sqlite"), create=True) as memory:
        assert isinstance(memory, SQLiteMemory)
    with pytest.raises(InputError, match="does not exist"):
        open_memory(str(tmp_path / "other.sqlite"))


def test_missing_milvus_lite_says_what_to_install(tmp_path, monkeypatch):
    pytest.importorskip("pymilvus")
    monkeypatch.setitem(sys.modules, "milvus_lite", None)  # as if not installed
    with pytest.raises(MissingDependency, match=r"milvus-lite cannot load .*pip install 'surprisegate\[milvus\]'"):
        open_memory(f"milvus-lite:{tmp_path / 'm.db'}#memory", create=True)


def test_unreachable_server_fails_fast_with_uri_and_fix():
    pytest.importorskip("pymilvus")
    start = time.monotonic()
    with pytest.raises(BackendError) as err:
        open_memory("milvus://127.0.0.1:1/x")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "memory='milvus://127.0.0.1:1/x'" in message and "no Milvus server answered" in message
    assert "milvus-lite:" in message  # the local alternative


# -- the project's knowledge base -----------------------------------------------------------------


@pytest.fixture(scope="module")
def factkb(lite_db):
    passages = SHARED_DATA / "factkb_passages.jsonl"
    if not passages.exists():
        pytest.skip(f"{passages} is not here")
    memory = open_memory(lite_uri(lite_db, "factkb"), create=True, embedder=None)
    report = memory.add_jsonl(passages)
    assert (report.added, report.errors) == (901, [])
    yield memory
    memory.close()


@needs_milvus_lite
def test_factkb_dev_questions_find_their_passage(factkb):
    assert factkb.search("What is the capital of Atlantis?")[0].score < 0.3
    rows = [json.loads(line) for line in (SHARED_DATA / "factqa_dev.jsonl").read_text().splitlines()][::8]
    top = [factkb.search(row["question"])[0].source for row in rows]
    accuracy = sum(source == row["kb_id"] for source, row in zip(top, rows, strict=True)) / len(rows)
    assert accuracy >= 0.98  # every 8th row: 0.99 (SQLiteMemory: 0.99)

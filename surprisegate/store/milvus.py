"""The scale-out memory store: one Milvus collection, searched by BM25 and by dense vectors.

It behaves as `SQLiteMemory` does (same methods, same `Hit`s, same relevance `score`), so one floor
works for both. How it stays the same:

- Words: passages and queries are cut into words by SQLite's own FTS5 tokenizer (porter stemming,
  case and accent folding) run on an in-memory scratch table, so "capitals" meets "capital" exactly as
  in SQLiteMemory. Milvus indexes those stems (`terms`, BM25 by a server-side `Function`) and keeps each
  passage's distinct stems in an array (`words`) for document frequencies.
- Score: the same IDF coverage of the query's terms. Whether a candidate holds a term is read from its
  `words`; a term's document frequency is counted by the engine (`array_contains`) and cached until the
  store's passage count changes, so a warm search costs a count and one or two searches.
- Ranking: Milvus's BM25, re-ranked by `context=` as in SQLiteMemory; with an embedder, fused with
  dense (inner product) search by reciprocal rank (k=60).

Milvus has no transactions: an ingest validates every passage before writing any, and deletes what it
wrote if a write fails midway.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BackendError, InputError, MissingDependency
from .sqlite import (
    CANDIDATE_POOL,
    CONTEXT_WEIGHT,
    FORMAT_NAME,
    UNSEEN_WORD_WEIGHT,
    Hit,
    IngestReport,
    QueryTerm,
    SQLiteMemory,
    _content_hash,
    query_terms,
)

SCHEMA_VERSION = 1
RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al.); larger flattens the rank differences
CONNECT_TIMEOUT_S = 5.0
RETRIEVAL_MODES = ("hybrid", "bm25", "dense")
META_PROPERTY = "surprisegate.meta"  # collection property holding the store's format, version, embedder

# Milvus's own limits: VARCHAR holds at most 65,535 bytes, an ARRAY at most 4,096 elements.
TEXT_BYTES = 65_535
LABEL_BYTES = 4_096  # title and source
MAX_WORDS = 4_096
WORD_BYTES = 256  # a longer "word" is an encoded blob, not something a question asks about
INSERT_BATCH = 1_000
# The tokenizer of SQLiteMemory's passages_fts; both stores must agree on what a word is.
FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"

MISSING_CLIENT = "the Milvus memory store needs pymilvus; install it with: pip install 'surprisegate[milvus]'"


class _Tokenizer:
    """SQLite FTS5's tokenizer as a function: text in, stems out, in order.

    Rows go into an in-memory FTS5 table, their tokens come back through `fts5vocab`, and the
    transaction is rolled back, so the scratch table stays empty.
    """

    CACHE_LIMIT = 100_000

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn.executescript(
            f"""CREATE VIRTUAL TABLE scratch USING fts5(title, text, tokenize='{FTS_TOKENIZER}');
                CREATE VIRTUAL TABLE scratch_tokens USING fts5vocab(scratch, 'instance');"""
        )
        self._lock = threading.Lock()
        self._word_stems: dict[str, tuple[str, ...]] = {}

    def passages(self, rows: list[tuple[str, str]]) -> list[tuple[list[str], list[str]]]:
        """(title stems, text stems) for each (title, text)."""
        tokens: list[tuple[list, list]] = [([], []) for _ in rows]
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany("INSERT INTO scratch(rowid, title, text) VALUES (?, ?, ?)", enumerate(rows))
                for doc, column, offset, term in self._conn.execute(
                    "SELECT doc, col, offset, term FROM scratch_tokens"
                ):
                    tokens[doc][column == "text"].append((offset, term))
            finally:
                self._conn.execute("ROLLBACK")
        return [([term for _, term in sorted(title)], [term for _, term in sorted(text)]) for title, text in tokens]

    def stems(self, word: str) -> tuple[str, ...]:
        """The stems of one query word: usually one ("capitals" -> "capit"), none for punctuation."""
        cached = self._word_stems.get(word)
        if cached is None:
            cached = tuple(self.passages([("", word)])[0][1])
            if len(self._word_stems) >= self.CACHE_LIMIT:
                self._word_stems.clear()
            self._word_stems[word] = cached
        return cached


_TOKENIZER = _Tokenizer()


@dataclass(frozen=True)
class _Candidate:
    """A passage as a search returns it: what `Hit` needs, plus its stems for scoring."""

    id: str
    text: str
    title: str
    source: str
    words: frozenset[str]


# Fields every search returns; `words` lets the score be computed without another round trip.
_OUTPUT_FIELDS = ["text", "title", "source", "words"]


def _import_pymilvus():
    try:
        import pymilvus
    except ImportError as err:
        raise MissingDependency(MISSING_CLIENT) from err
    # pymilvus logs each failed call with a traceback on stderr; this store raises one clear error instead.
    for name in ("pymilvus", "pymilvus.milvus_client"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return pymilvus


def _quote(value: str) -> str:
    """A string literal for a Milvus filter expression."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class MilvusMemory:
    """A memory store in one Milvus collection (a server, a cluster, or milvus-lite's embedded engine).

    `client_uri` is what pymilvus connects to: "http://host:19530" or a milvus-lite file "/path/memory.db";
    `uri` is the name errors show the user (e.g. "milvus://host:19530/memory").
    `embedder`: "auto" uses the embedder the collection was built with (a new collection gets the
    default one when its package is installed); None keeps the store BM25-only; or pass an `Embedder`.
    `retrieval`: "hybrid" (BM25 and dense, fused by reciprocal rank), "bm25" or "dense".
    Thread-safe; use as a context manager or call `close()`.
    """

    def __init__(
        self,
        client_uri: str,
        collection: str = "memory",
        create: bool = False,
        embedder: Any = "auto",
        retrieval: str = "hybrid",
        uri: str | None = None,
        token: str = "",
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        if retrieval not in RETRIEVAL_MODES:
            raise InputError(f"retrieval={retrieval!r} is not one of {', '.join(RETRIEVAL_MODES)}; pass one of them")
        self.uri = uri or f"{client_uri}#{collection}"
        self.collection = collection
        self.retrieval = retrieval
        self._pymilvus = _import_pymilvus()
        self._is_lite = not client_uri.startswith(("http://", "https://", "tcp://", "unix:"))
        try:
            self._client = self._pymilvus.MilvusClient(uri=client_uri, token=token, timeout=connect_timeout)
        except self._pymilvus.MilvusException as err:
            raise self._unreachable(err) from err
        except ImportError as err:  # a ".db" path without milvus-lite installed
            raise MissingDependency(
                f"memory={self.uri!r} is a milvus-lite store, which needs milvus-lite; "
                "install it with: pip install 'surprisegate[milvus]'"
            ) from err
        self._df_lock = threading.Lock()
        self._df_cache: dict[tuple[str, ...], int] = {}
        self._df_cache_total = -1  # the passage count the cached frequencies belong to
        self.embedder = None
        self._embedder_problem = ""  # why ingest cannot embed, when the store has vectors but no embedder
        try:
            self._open(create, embedder)
        except BaseException:
            self._client.close()
            raise

    def _unreachable(self, err: Exception) -> BackendError:
        if self._is_lite:
            return BackendError(
                f"memory={self.uri!r} could not be opened by milvus-lite ({getattr(err, 'message', err)}); "
                "milvus-lite lets one process at a time open a file: close the other one, or serve the "
                "store from a Milvus server and use milvus://HOST:19530/COLLECTION"
            )
        return BackendError(
            f"memory={self.uri!r}: no Milvus server answered ({getattr(err, 'message', err)}); start one "
            "(e.g. docker run -p 19530:19530 milvusdb/milvus:latest milvus run standalone) or fix host and "
            "port, or use a local store: milvus-lite:PATH.db#COLLECTION or a SQLite file path"
        )

    # -- schema ----------------------------------------------------------------------------------

    def _open(self, create: bool, embedder: Any) -> None:
        if not self._call("has_collection", self.collection):
            if not create:
                raise InputError(
                    f"memory={self.uri!r} has no collection {self.collection!r}; "
                    f"build it with: surprisegate memory add --memory {self.uri} FILE.jsonl"
                )
            if embedder == "auto":
                embedder = self._default_embedder()
            self.embedder = embedder
            self._create()
            return
        meta = self._read_meta()
        fix = f"pass a surprisegate memory, or build a new one with: surprisegate memory add --memory {self.uri} FILE.jsonl"
        if meta.get("format") != FORMAT_NAME:
            raise InputError(f"memory={self.uri!r} is a Milvus collection but not a surprisegate memory store; {fix}")
        if int(meta.get("schema_version", 0)) > SCHEMA_VERSION:
            raise InputError(
                f"memory={self.uri!r} has schema version {meta['schema_version']}, newer than this "
                f"surprisegate supports ({SCHEMA_VERSION}); upgrade with: pip install -U surprisegate"
            )
        self._attach_embedder(meta.get("embedder"), meta.get("dim"), embedder)
        # A server restarted (or a milvus-lite file reopened) holds the collection released.
        state = self._call("get_load_state", self.collection).get("state")
        if getattr(state, "name", str(state)) != "Loaded":
            self._call("load_collection", self.collection)

    @staticmethod
    def _default_embedder():
        from .embed import default_embedder

        try:
            return default_embedder()
        except MissingDependency:  # BM25 alone still works; `stats()` shows the store has no vectors
            return None

    def _attach_embedder(self, recorded: str | None, dim: int | None, embedder: Any) -> None:
        if not recorded:  # a BM25-only store: nothing to embed
            return
        if embedder == "auto":
            from .embed import embedder_from_name

            try:
                embedder = embedder_from_name(recorded)
            except MissingDependency as err:
                self._embedder_problem = str(err)
                return
        if embedder is None:
            self._embedder_problem = f"memory={self.uri!r} holds {recorded} vectors but was opened without an embedder"
            return
        if embedder.name != recorded or embedder.dim != dim:
            raise InputError(
                f"memory={self.uri!r} was built with embedder {recorded} ({dim} dims), not {embedder.name} "
                f"({embedder.dim} dims); open it with embedder='auto' or build a new store"
            )
        self.embedder = embedder

    def _meta(self) -> str:
        embedder = self.embedder
        return json.dumps(
            {
                "format": FORMAT_NAME,
                "schema_version": SCHEMA_VERSION,
                "embedder": embedder.name if embedder else None,
                "dim": embedder.dim if embedder else None,
            }
        )

    def _read_meta(self) -> dict:
        # The meta is written twice, as a collection property and as the description, because the
        # engines keep different ones (milvus-lite 2.5 drops properties, milvus-lite 3 descriptions).
        described = self._call("describe_collection", self.collection)
        for text in ((described.get("properties") or {}).get(META_PROPERTY), described.get("description")):
            try:
                meta = json.loads(text or "")
            except ValueError:
                continue
            if isinstance(meta, dict):
                return meta
        return {}

    def _create(self) -> None:
        from pymilvus import DataType, Function, FunctionType

        meta = self._meta()
        schema = self._pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False, description=meta)
        # The content hash is the primary key: re-adding a passage finds it by key.
        schema.add_field("id", DataType.VARCHAR, max_length=64, is_primary=True)
        schema.add_field("source", DataType.VARCHAR, max_length=LABEL_BYTES)
        schema.add_field("title", DataType.VARCHAR, max_length=LABEL_BYTES)
        schema.add_field("text", DataType.VARCHAR, max_length=TEXT_BYTES)
        # Stems separated by spaces; the standard analyzer splits them back exactly.
        schema.add_field(
            "terms", DataType.VARCHAR, max_length=TEXT_BYTES, enable_analyzer=True, analyzer_params={"tokenizer": "standard"}
        )
        schema.add_field(
            "words", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=MAX_WORDS, max_length=WORD_BYTES
        )
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(name="terms_bm25", function_type=FunctionType.BM25, input_field_names=["terms"], output_field_names=["sparse"])
        )
        index_params = self._client.prepare_index_params()
        index_params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        if self.embedder is not None:
            schema.add_field("dense", DataType.FLOAT_VECTOR, dim=self.embedder.dim)
            index_params.add_index(field_name="dense", index_type="AUTOINDEX", metric_type="IP")
        # Session consistency: this client sees its own writes at once, and reads never wait for others'.
        options = dict(schema=schema, index_params=index_params, consistency_level="Session")
        try:
            self._call("create_collection", self.collection, properties={META_PROPERTY: meta}, **options)
        except BackendError:
            if self._call("has_collection", self.collection):
                raise
            self._call("create_collection", self.collection, **options)  # an engine that refuses properties
        # An inverted index makes `array_contains` (document frequencies) fast on a server; milvus-lite
        # cannot index arrays and scans instead, which is quick at its sizes.
        words_index = self._client.prepare_index_params()
        words_index.add_index(field_name="words", index_type="INVERTED")
        try:
            self._call("create_index", self.collection, words_index)
        except BackendError:
            pass

    # -- calls -----------------------------------------------------------------------------------

    def _call(self, method: str, *args, deadline: float | None = None, **kwargs):
        """One client call; its failures become BackendError (TimeoutError past `deadline`)."""
        if deadline is not None:
            kwargs["timeout"] = deadline - time.monotonic()
            if kwargs["timeout"] <= 0:
                raise TimeoutError(f"memory search of {self.uri!r} passed its deadline")
        import grpc

        try:
            return getattr(self._client, method)(*args, **kwargs)
        except (self._pymilvus.MilvusException, grpc.RpcError) as err:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"memory search of {self.uri!r} passed its deadline: {err}") from err
            message = getattr(err, "message", None) or str(err)
            raise BackendError(f"memory={self.uri!r}: Milvus {method} failed: {message}") from err

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> MilvusMemory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def count(self, deadline: float | None = None) -> int:
        rows = self._call("query", self.collection, filter="", output_fields=["count(*)"], deadline=deadline)
        return int(rows[0]["count(*)"])

    def stats(self) -> dict:
        embedder = self.embedder
        return {
            "backend": "milvus-lite" if self._is_lite else "milvus",
            "uri": self.uri,
            "collection": self.collection,
            "passages": self.count(),
            "embedder": embedder.name if embedder else None,
            "dim": embedder.dim if embedder else None,
            "retrieval": self._retrieval(),
            "schema_version": SCHEMA_VERSION,
        }

    def _retrieval(self) -> str:
        """The mode searches really use: without vectors, every mode is BM25."""
        return self.retrieval if self.embedder is not None else "bm25"

    # -- ingest ----------------------------------------------------------------------------------

    def add_passages(self, passages: Iterable[Mapping[str, str]]) -> IngestReport:
        """Add passages ({"text", "title", "source"}); duplicates by text are skipped.

        Every passage is checked before any is written, so a bad one leaves the store as it was.
        """
        rows = self._rows(passages)
        if rows and self.embedder is None and self._embedder_problem:
            raise InputError(f"{self._embedder_problem}; cannot embed new passages: install it or build a new store")
        report = IngestReport()
        written: list[str] = []
        try:
            for start in range(0, len(rows), INSERT_BATCH):
                batch = rows[start : start + INSERT_BATCH]
                existing = self._existing_ids([row["id"] for row in batch])
                new_rows = []
                for row in batch:
                    if row["id"] in existing:
                        report.skipped_duplicates += 1
                    else:
                        existing.add(row["id"])  # a second copy within the batch is a duplicate too
                        new_rows.append(row)
                if not new_rows:
                    continue
                if self.embedder is not None:
                    vectors = self.embedder.encode([_embedding_text(row) for row in new_rows])
                    for row, vector in zip(new_rows, vectors):
                        row["dense"] = vector.tolist()
                self._call("insert", self.collection, new_rows)
                written.extend(row["id"] for row in new_rows)
                report.added += len(new_rows)
        except BaseException:
            if written:  # no transactions in Milvus: undo this call's writes by hand
                self._call("delete", self.collection, ids=written)
            raise
        finally:
            if written:
                self._forget_frequencies()
        return report

    def _rows(self, passages: Iterable[Mapping[str, str]]) -> list[dict]:
        """Validated rows, stems included; raises InputError naming the first passage Milvus cannot hold."""
        prepared: list[dict] = []
        for passage in passages:
            text = passage.get("text")
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"passage={str(passage)[:80]!r} has no text; give every passage a non-empty 'text'")
            prepared.append(
                {"id": _content_hash(text), "source": str(passage.get("source") or ""), "title": passage.get("title") or "", "text": text}
            )
        stems = _TOKENIZER.passages([(row["title"], row["text"]) for row in prepared])
        for row, (title_stems, text_stems) in zip(prepared, stems):
            title_stems = [stem for stem in title_stems if len(stem.encode()) <= WORD_BYTES]
            text_stems = [stem for stem in text_stems if len(stem.encode()) <= WORD_BYTES]
            # A line break keeps title and text apart for phrase checks; the analyzer ignores it.
            row["terms"] = " ".join(title_stems) + "\n" + " ".join(text_stems)
            row["words"] = sorted(set(title_stems) | set(text_stems))
            self._check_limits(row)
        return prepared

    def _check_limits(self, row: dict) -> None:
        where = f"passage source={row['source']!r}" if row["source"] else f"passage={row['text'][:60]!r}"
        fix = "split it into smaller passages (add_text_files cuts .txt/.md files into paragraphs)"
        for field, limit in (("text", TEXT_BYTES), ("terms", TEXT_BYTES), ("title", LABEL_BYTES), ("source", LABEL_BYTES)):
            size = len(row[field].encode("utf-8"))
            if size > limit:
                what = "its words" if field == "terms" else f"its {field}"
                raise InputError(f"{where}: {what} take {size:,} bytes, more than Milvus holds ({limit:,}); {fix}")
        if len(row["words"]) > MAX_WORDS:
            raise InputError(f"{where} has {len(row['words']):,} distinct words, more than Milvus holds ({MAX_WORDS:,}); {fix}")

    def _existing_ids(self, ids: list[str]) -> set[str]:
        rows = self._call("query", self.collection, filter=f"id in {json.dumps(ids)}", output_fields=["id"])
        return {row["id"] for row in rows}

    # The file parsing is SQLiteMemory's (bad lines reported by number, ids and titles picked the same
    # way); it only calls `self.add_passages`, so both stores read a file identically.
    def add_jsonl(
        self, path: str | Path, text_field: str = "text", id_field: str = "kb_id", title_field: str = "title"
    ) -> IngestReport:
        """Ingest one JSON object per line. Bad lines are reported by number; the rest still goes in."""
        return SQLiteMemory.add_jsonl(self, path, text_field=text_field, id_field=id_field, title_field=title_field)

    def add_text_files(self, paths: Iterable[str | Path]) -> IngestReport:
        """Ingest .txt/.md files, and such files found under folders, as paragraph-sized passages."""
        return SQLiteMemory.add_text_files(self, paths)

    def remove(self, source_prefix: str) -> int:
        """Delete the passages whose source starts with `source_prefix`; returns how many went."""
        if not isinstance(source_prefix, str) or not source_prefix:
            raise InputError(
                f"source_prefix={source_prefix!r} would remove every passage; pass a prefix such as 'file:notes/'"
            )
        # LIKE's wildcards and escaping differ between engines: match on the plainly safe head of the
        # prefix, then keep only true prefix matches here.
        head = ""
        for char in source_prefix:
            if not (char.isascii() and (char.isalnum() or char in ":/.-# ")):
                break
            head += char
        expression = f"source like {_quote(head + '%')}" if head else 'id != ""'
        doomed: list[str] = []
        iterator = self._call("query_iterator", self.collection, batch_size=1000, filter=expression, output_fields=["source"])
        try:
            while rows := iterator.next():
                doomed.extend(row["id"] for row in rows if row["source"].startswith(source_prefix))
        finally:
            iterator.close()
        for start in range(0, len(doomed), INSERT_BATCH):
            self._call("delete", self.collection, ids=doomed[start : start + INSERT_BATCH])
        if doomed:
            self._forget_frequencies()
        return len(doomed)

    # -- search ----------------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, context: str = "", deadline: float | None = None) -> list[Hit]:
        """The `k` best passages for `query`, best first.

        Ranking: BM25 (re-ranked by `context`, which counts CONTEXT_WEIGHT as much as `query`), fused
        with dense search by reciprocal rank when the store has vectors. `score` is SQLiteMemory's.
        With `deadline` (a `time.monotonic()` value) a search still running then raises TimeoutError.
        """
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"memory search of {self.uri!r} passed its deadline before it started")
        known = {term.word for term in terms}
        context_terms = [term for term in query_terms(context, CONTEXT_WEIGHT) if term.word not in known]
        mode = self._retrieval()
        pool = max(k, CANDIDATE_POOL)

        bm25_ranked: list[tuple[_Candidate, float]] = []
        if mode != "dense":
            bm25_ranked = self._bm25(_stem_text(terms), pool, deadline)
            if not bm25_ranked:  # no passage shares a word with the question: nothing is about it
                return []
        query_bm25 = {candidate.id: bm25 for candidate, bm25 in bm25_ranked}
        ranking = dict(query_bm25)  # SQLite's convention: lower (more negative) is better
        context_text = _stem_text(context_terms)
        if context_text and ranking:
            for candidate, bm25 in self._bm25(context_text, len(ranking), deadline, among=list(ranking)):
                ranking[candidate.id] += CONTEXT_WEIGHT * bm25
        candidates = {candidate.id: candidate for candidate, _ in bm25_ranked}
        lexical_order = sorted(ranking, key=ranking.__getitem__)

        if mode == "bm25":
            best = lexical_order[:k]
        else:
            dense_ranked = self._dense(query, pool, deadline)
            candidates.update((candidate.id, candidate) for candidate in dense_ranked)
            dense_order = [candidate.id for candidate in dense_ranked]
            best = _fuse([lexical_order, dense_order] if mode == "hybrid" else [dense_order])[:k]

        scores = self._scores(terms, context_terms, [candidates[id] for id in best], deadline)
        return [
            Hit(
                text=candidates[id].text,
                title=candidates[id].title,
                source=candidates[id].source,
                score=scores[id],
                bm25=query_bm25.get(id, 0.0),  # 0.0: found by meaning alone, sharing no word with the query
            )
            for id in best
        ]

    def idf(self, word: str) -> float:
        """Inverse document frequency of `word` in this store (stemmed like the passages)."""
        stems = _TOKENIZER.stems(word.lower())
        total = self._total()
        return SQLiteMemory._idf(self._frequencies([stems], total)[stems] if stems else 0, total)

    def _bm25(
        self, text: str, limit: int, deadline: float | None, among: list[str] | None = None
    ) -> list[tuple[_Candidate, float]]:
        """(candidate, bm25) best first, bm25 negated as in SQLite (lower is better); `among` limits the ids."""
        options = {"filter": f"id in {json.dumps(among)}"} if among else {}
        results = self._call(
            "search",
            self.collection,
            data=[text],
            anns_field="sparse",
            limit=limit,
            search_params={"metric_type": "BM25"},
            output_fields=_OUTPUT_FIELDS,
            deadline=deadline,
            **options,
        )
        # Engines disagree on the sign of a BM25 "distance" (server: +score, milvus-lite 3: -score).
        return [(_candidate(hit), -abs(float(hit["distance"]))) for hit in results[0] if hit["distance"]]

    def _dense(self, query: str, limit: int, deadline: float | None) -> list[_Candidate]:
        vector = self.embedder.encode([query])[0]
        if not vector.any():  # no word the embedder knows: every inner product would be 0
            return []
        results = self._call(
            "search",
            self.collection,
            data=[vector.tolist()],
            anns_field="dense",
            limit=limit,
            search_params={"metric_type": "IP"},
            output_fields=_OUTPUT_FIELDS,
            deadline=deadline,
        )
        return [_candidate(hit) for hit in results[0]]

    def _scores(
        self, terms: list[QueryTerm], context_terms: list[QueryTerm], candidates: list[_Candidate], deadline: float | None
    ) -> dict[str, float]:
        """SQLiteMemory's score: the IDF-weighted share of the query's terms each candidate holds."""
        total = self._total(deadline)
        stems = {term.word: _TOKENIZER.stems(term.word) for term in terms + context_terms}
        frequencies = self._frequencies([s for s in stems.values() if s], total, deadline)
        writes_names = any(term.is_name for term in terms)
        covered = {candidate.id: 0.0 for candidate in candidates}
        holds_a_word = dict.fromkeys(covered, False)  # a passage that shares only numbers is not about the query
        whole = 0.0
        for term in terms + context_terms:
            term_stems = stems[term.word]
            frequency = frequencies[term_stems] if term_stems else 0
            weight = term.weight * SQLiteMemory._idf(frequency, total)
            if writes_names and term.lower_case and not frequency:
                weight *= UNSEEN_WORD_WEIGHT
            whole += weight
            for candidate in candidates:
                if term_stems and all(stem in candidate.words for stem in term_stems):
                    covered[candidate.id] += weight
                    holds_a_word[candidate.id] |= not term.word.isdigit()
        return {id: min(1.0, covered[id] / whole) if holds_a_word[id] and whole else 0.0 for id in covered}

    # -- document frequencies --------------------------------------------------------------------

    def _total(self, deadline: float | None = None) -> int:
        total = self.count(deadline)
        with self._df_lock:
            if total != self._df_cache_total:  # the store changed (here or in another process)
                self._df_cache.clear()
                self._df_cache_total = total
        return total

    def _frequencies(
        self, stem_groups: list[tuple[str, ...]], total: int, deadline: float | None = None
    ) -> dict[tuple[str, ...], int]:
        """How many passages hold each group of stems (all of them, for a word that stems to several)."""
        with self._df_lock:
            known = {group: self._df_cache[group] for group in stem_groups if group in self._df_cache}
        for group in set(stem_groups) - set(known):
            if len(group) == 1:
                expression = f"array_contains(words, {_quote(group[0])})"
            else:
                expression = f"array_contains_all(words, [{', '.join(map(_quote, group))}])"
            rows = self._call("query", self.collection, filter=expression, output_fields=["count(*)"], deadline=deadline)
            known[group] = int(rows[0]["count(*)"])
            with self._df_lock:
                if self._df_cache_total == total:
                    self._df_cache[group] = known[group]
        return known

    def _forget_frequencies(self) -> None:
        with self._df_lock:
            self._df_cache.clear()
            self._df_cache_total = -1


def _candidate(hit) -> _Candidate:
    entity = hit["entity"]
    return _Candidate(hit["id"], entity["text"], entity["title"], entity["source"], frozenset(entity["words"] or ()))


def _stem_text(terms: list[QueryTerm]) -> str:
    """The query's stems, each once, for Milvus's BM25 (which, like FTS5's OR query, sums over words)."""
    stems: dict[str, None] = {}
    for term in terms:
        stems.update(dict.fromkeys(_TOKENIZER.stems(term.word)))
    return " ".join(stems)


def _embedding_text(row: dict) -> str:
    return f"{row['title']}\n{row['text']}" if row["title"] else row["text"]


def _fuse(rankings: list[list[str]]) -> list[str]:
    """Reciprocal-rank fusion: each ranking gives an id 1 / (RRF_K + rank); ties keep the first ranking's order."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, id in enumerate(ranking, start=1):
            fused[id] = fused.get(id, 0.0) + 1.0 / (RRF_K + rank)
    first_order = {id: position for position, id in enumerate(rankings[0])} if rankings else {}
    return sorted(fused, key=lambda id: (-fused[id], first_order.get(id, len(first_order))))

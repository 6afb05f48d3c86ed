"""The scale-out memory store: one Milvus collection, searched by BM25 and by dense vectors.

It behaves as `SQLiteMemory` does (same methods, modes, `Hit`s and relevance `score`), so one floor
works for both. How it stays the same:

- Words: passages and queries are cut into words by SQLite's own FTS5 tokenizer (porter stemming, case
  and accent folding; `text.IndexStemmer`) run on an in-memory scratch table, so "capitals" meets
  "capital" exactly as in SQLiteMemory. Milvus indexes those stems (`terms`, BM25 by a server-side
  `Function`) and keeps each passage's distinct stems in an array (`words`) for document frequencies.
- Score: the same IDF coverage of the query's terms. Whether a passage holds a term is read from its
  `words`; a term's document frequency is counted by the engine (one BM25 request lists the holders of
  all of a query's rare words; a common word is counted by `array_contains`), cached with the passage
  count it belongs to, and counted again once that count changes (checked at most every TOTAL_TTL_S).
  No side table to keep in step, so it stays right whichever process writes.
- Ranking: Milvus's BM25 over stems plus a made-up word per adjacent stem pair (FTS5's phrases),
  re-ranked by `context=` as in SQLiteMemory. With vectors, "hybrid" orders as SQLiteMemory does:
  passages holding more of the query's names and word pairs first, then reciprocal-rank fusion (k=60)
  of BM25 and dense (inner product) search; a vector-only find must hold a word of the query.

A search is a few round trips (BM25 returning its passages' fields, the context re-rank, document
frequencies on a cache miss; with vectors, the dense search and the name check), the independent ones
sent side by side.

Milvus has no transactions: an ingest checks every passage before writing any, and deletes what it
wrote if a write fails midway. A collection's fields are fixed when it is made, so a store built
without an embedder stays BM25-only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..errors import BackendError, InputError, MissingDependency
from ..text import IndexStemmer
from .embed import Embedder, default_embedder, embedder_from_name
from .sqlite import (
    CANDIDATE_POOL,
    CONTEXT_WEIGHT,
    FORMAT_NAME,
    RRF_K,
    SEARCH_MODES,
    UNSEEN_WORD_WEIGHT,
    Hit,
    IngestReport,
    QueryTerm,
    SQLiteMemory,
    _content_hash,
    check_deadline,
    check_mode,
    embedding_text,
    prepare_query,
    query_bigrams,
)
from .titles import TitleIndex

SCHEMA_VERSION = 1  # of the Milvus collection layout below
CONNECT_TIMEOUT_S = 5.0
META_PROPERTY = "surprisegate.meta"  # collection property holding the store's format, version, embedder

# Milvus's own limits: a VARCHAR holds at most 65,535 bytes, an ARRAY at most 4,096 elements.
TEXT_BYTES = 65_535
LABEL_BYTES = 4_096  # title and source
MAX_WORDS = 4_096
WORD_BYTES = 256  # a longer "word" is an encoded blob, not something a question asks about
WRITE_BATCH = 1_000  # passages embedded and inserted per request
DF_PROBE_LIMIT = 1_000  # see `_count_holding`
# How long a passage count (and the document frequencies cached with it) is trusted without asking
# again: this store's own writes refresh it at once; another process's show within this time.
TOTAL_TTL_S = 1.0

MISSING_CLIENT = "the Milvus memory store needs pymilvus; install it with: pip install 'surprisegate[milvus]'"


_TOKENIZER = IndexStemmer()  # cuts words as SQLiteMemory's FTS5 index does
_Frequencies = dict[tuple[str, ...], int]  # {group of stems: how many passages hold all of them}
_T = TypeVar("_T")


@dataclass(frozen=True)
class _Candidate:
    """A passage as a search returns it: what `Hit` needs, plus its stems and vector for scoring."""

    id: str
    text: str
    title: str
    source: str
    words: frozenset[str]
    vector: np.ndarray | None  # (dim,) float32, unit length; None in a store without vectors


def _import_pymilvus():
    try:
        import pymilvus
    except ImportError as err:
        raise MissingDependency(MISSING_CLIENT) from err
    # pymilvus logs each failed call with a traceback on stderr; this store raises one clear error instead.
    for name in ("pymilvus", "pymilvus.milvus_client"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return pymilvus


def _import_milvus_lite(uri: str) -> None:
    # pymilvus would report a missing or broken milvus-lite as a failed connection; say what to install.
    try:
        import milvus_lite  # noqa: F401
    except ImportError as err:
        fix = (
            "pip install 'setuptools<81' (milvus-lite 2.5 imports pkg_resources)"
            if err.name == "pkg_resources"
            else "pip install 'surprisegate[milvus]'"
        )
        raise MissingDependency(
            f"memory={uri!r} is a milvus-lite store, but milvus-lite cannot load ({err}); {fix}"
        ) from err


def _quote(value: str) -> str:
    """A string literal for a Milvus filter expression."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class MilvusMemory:
    """A memory store in one Milvus collection (a server, a cluster, or milvus-lite's embedded engine).

    `client_uri` is what pymilvus connects to: "http://host:19530" or a milvus-lite file "/path/memory.db";
    `uri` is the name errors show the user (e.g. "milvus://host:19530/memory"); `open_memory()` sets both.
    `embedder`: "auto" uses the embedder the collection records (a new collection gets the default one
    when it is installed); None searches by BM25 only and refuses to add passages to a collection that
    keeps vectors; an `Embedder` must match the one the collection records. `mode` ("bm25", "dense" or
    "hybrid") is the default for `search()`. Thread-safe; use as a context manager or call `close()`.
    """

    def __init__(
        self,
        client_uri: str,
        collection: str = "memory",
        create: bool = False,
        embedder: Embedder | str | None = "auto",
        mode: str = "hybrid",
        uri: str | None = None,
        token: str = "",
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        if embedder not in ("auto", None) and not isinstance(embedder, Embedder):
            raise InputError(f"embedder={embedder!r} is not an Embedder; pass 'auto', None or e.g. WordLlamaEmbedder()")
        self.mode = check_mode(mode)
        self.uri = uri or f"{client_uri}#{collection}"
        self.collection = collection
        self.embedder: Embedder | None = None
        self._embedder_problem = ""  # why vectors cannot be used, for stats() and ingest errors
        self._has_vectors = False  # the collection has a dense field
        self._df_lock = threading.Lock()
        self._df_cache: dict[tuple[str, ...], int] = {}
        self._df_cache_total = -1  # the passage count the cached frequencies belong to
        self._total_counted_at = -math.inf  # time.monotonic() of that count
        self._titles: tuple[int, TitleIndex] | None = None  # (the passage count they were read at, the titles)
        self._workers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="surprisegate-milvus")
        self._pymilvus = _import_pymilvus()
        self._is_lite = not client_uri.startswith(("http://", "https://", "tcp://", "unix:"))
        if self._is_lite:
            _import_milvus_lite(self.uri)
        try:
            self._client = self._pymilvus.MilvusClient(uri=client_uri, token=token, timeout=connect_timeout)
        except self._pymilvus.MilvusException as err:
            raise self._unreachable(err) from err
        try:
            self._open(create, embedder)
        except BaseException:
            self.close()
            raise

    def _unreachable(self, err: Exception) -> BackendError:
        reason = getattr(err, "message", None) or str(err)
        if self._is_lite:
            return BackendError(
                f"memory={self.uri!r} could not be opened by milvus-lite ({reason}); milvus-lite lets one process "
                "at a time open a file: close the other one, or serve the store from a Milvus server and use "
                "milvus://HOST:19530/COLLECTION"
            )
        return BackendError(
            f"memory={self.uri!r}: no Milvus server answered ({reason}); start one "
            "(e.g. docker run -p 19530:19530 milvusdb/milvus milvus run standalone) or fix host and port, "
            "or use a local store: milvus-lite:PATH.db#COLLECTION or a SQLite file path"
        )

    # -- schema ----------------------------------------------------------------------------------

    def _open(self, create: bool, embedder: Embedder | str | None) -> None:
        if not self._call("has_collection", self.collection):
            if not create:
                raise InputError(
                    f"memory={self.uri!r} has no collection {self.collection!r}; "
                    f"build it with: surprisegate memory add --memory {self.uri} FILE.jsonl"
                )
            self._create(self._new_store_embedder(embedder))
            return
        meta = self._read_meta()
        fix = (
            "pass a surprisegate memory, or build a new one with: "
            f"surprisegate memory add --memory {self.uri} FILE.jsonl"
        )
        if meta.get("format") != FORMAT_NAME:
            raise InputError(f"memory={self.uri!r} is a Milvus collection but not a surprisegate memory store; {fix}")
        if int(meta.get("schema_version", 0)) > SCHEMA_VERSION:
            raise InputError(
                f"memory={self.uri!r} has schema version {meta['schema_version']}, newer than this "
                f"surprisegate supports ({SCHEMA_VERSION}); upgrade with: pip install -U surprisegate"
            )
        self._attach_embedder(meta.get("embedder"), meta.get("dim"), embedder)
        # A restarted server (or a reopened milvus-lite file) holds the collection released.
        state = self._call("get_load_state", self.collection).get("state")
        if getattr(state, "name", str(state)) != "Loaded":
            self._call("load_collection", self.collection)

    def _new_store_embedder(self, embedder: Embedder | str | None) -> Embedder | None:
        if embedder is None:
            self._embedder_problem = "the collection was built without vectors (embedder=None)"
        if not isinstance(embedder, str):  # an Embedder, or None; the only string __init__ lets through is "auto"
            return embedder
        try:
            return default_embedder()
        except MissingDependency as err:  # BM25 alone still works; stats() says why there are no vectors
            self._embedder_problem = f"the collection was built without vectors, as no embedder was installed ({err})"
            return None

    def _attach_embedder(self, recorded: str | None, dim: int | None, embedder: Embedder | str | None) -> None:
        self._has_vectors = bool(recorded)
        if not recorded:
            self._embedder_problem = (
                "the collection was built without vectors; build a new one with an embedder installed"
            )
            return
        if embedder is None:
            self._embedder_problem = f"opened with embedder=None, though the collection keeps {recorded!r} vectors"
            return
        if isinstance(embedder, str):  # "auto", the only string __init__ lets through
            try:
                embedder = embedder_from_name(recorded)
            except (MissingDependency, InputError) as err:
                self._embedder_problem = (
                    f"the collection's vectors come from {recorded!r}, which cannot load here ({err})"
                )
                return
        if (embedder.name, embedder.dim) != (recorded, dim):
            raise InputError(
                f"memory={self.uri!r} holds vectors from embedder {recorded!r} (dim {dim}), not {embedder.name!r} "
                f"(dim {embedder.dim}); vectors of two models cannot be compared. Open it with embedder='auto', "
                "or build a new store for the other embedder"
            )
        self.embedder = embedder

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

    def _create(self, embedder: Embedder | None) -> None:
        from pymilvus import DataType, Function, FunctionType

        meta = json.dumps(
            {
                "format": FORMAT_NAME,
                "schema_version": SCHEMA_VERSION,
                "embedder": embedder.name if embedder else None,
                "dim": embedder.dim if embedder else None,
            }
        )
        schema = self._pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False, description=meta)
        # The content hash is the primary key: re-adding a passage finds it by key.
        schema.add_field("id", DataType.VARCHAR, max_length=64, is_primary=True)
        schema.add_field("source", DataType.VARCHAR, max_length=LABEL_BYTES)
        schema.add_field("title", DataType.VARCHAR, max_length=LABEL_BYTES)
        schema.add_field("text", DataType.VARCHAR, max_length=TEXT_BYTES)
        # Stems separated by spaces; the standard analyzer splits them back exactly.
        schema.add_field(
            "terms",
            DataType.VARCHAR,
            max_length=TEXT_BYTES,
            enable_analyzer=True,
            analyzer_params={"tokenizer": "standard"},
        )
        schema.add_field(
            "words", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=MAX_WORDS, max_length=WORD_BYTES
        )
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name="terms_bm25",
                function_type=FunctionType.BM25,
                input_field_names=["terms"],
                output_field_names=["sparse"],
            )
        )
        index_params = self._client.prepare_index_params()
        index_params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        if embedder is not None:
            schema.add_field("dense", DataType.FLOAT_VECTOR, dim=embedder.dim)
            index_params.add_index(field_name="dense", index_type="AUTOINDEX", metric_type="IP")
        # Session consistency: this client sees its own writes at once, and reads never wait for others'.
        options = dict(schema=schema, index_params=index_params, consistency_level="Session")
        try:
            self._call("create_collection", self.collection, properties={META_PROPERTY: meta}, **options)
        except BackendError:
            if self._call("has_collection", self.collection):
                raise
            self._call("create_collection", self.collection, **options)  # an engine that refuses properties
        # An inverted index makes `array_contains` (document frequencies) fast on a server (Milvus 2.4+);
        # milvus-lite cannot index arrays and scans instead, which is quick at its sizes.
        if not self._is_lite:
            words_index = self._client.prepare_index_params()
            words_index.add_index(field_name="words", index_type="INVERTED")
            try:
                self._call("create_index", self.collection, words_index)
            except BackendError:
                pass  # an older server: counts scan, slower but right
        self.embedder = embedder
        self._has_vectors = embedder is not None

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
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> MilvusMemory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def count(self, deadline: float | None = None) -> int:
        rows = self._call("query", self.collection, filter="", output_fields=["count(*)"], deadline=deadline)
        return int(rows[0]["count(*)"])

    def stats(self) -> dict:
        """What the store holds and how it will search (SQLiteMemory's keys, where they apply)."""
        passages = self.count()
        embedder = self.embedder
        usable = embedder is not None
        return {
            "backend": "milvus-lite" if self._is_lite else "milvus",
            "uri": self.uri,
            "collection": self.collection,
            "schema_version": SCHEMA_VERSION,
            "passages": passages,
            "sources": self._source_count(),
            "vectors": passages if self._has_vectors else 0,  # the dense field is required on every row
            "embedder": embedder.name if embedder is not None else None,
            "dim": embedder.dim if embedder is not None else None,
            "search_modes": list(SEARCH_MODES) if usable else ["bm25"],
            "note": None if usable else f"{self._embedder_problem}; searching by BM25 only",
        }

    def _source_count(self) -> int:
        # A text file's chunks ("file:notes/a.md#3") count as one source, as in SQLiteMemory.
        sources = set()
        for rows in self._scan('id != ""', ["source"]):
            for row in rows:
                source = row["source"]
                if source.startswith("file:") and "#" in source and source.rpartition("#")[2].isdigit():
                    source = source.rpartition("#")[0]
                sources.add(source)
        return len(sources)

    def _scan(self, expression: str, fields: list[str]):
        """Batches of rows matching `expression`, each with "id" and `fields`."""
        iterator = self._call(
            "query_iterator", self.collection, batch_size=1000, filter=expression, output_fields=fields
        )
        try:
            while rows := iterator.next():
                yield rows
        finally:
            iterator.close()

    # -- ingest ----------------------------------------------------------------------------------

    def add_passages(self, passages: Iterable[Mapping[str, str]]) -> IngestReport:
        """Add passages ({"text", "title", "source"}); duplicates by text are skipped.

        Every passage is checked before any is written; a failed write removes this call's passages.
        """
        rows = self._rows(passages)
        if rows and self._has_vectors and self.embedder is None:
            raise InputError(
                f"memory={self.uri!r} keeps vectors for every passage, but {self._embedder_problem}; "
                "open it with embedder='auto' so that new passages get theirs too"
            )
        report = IngestReport()
        written: list[str] = []
        try:
            for start in range(0, len(rows), WRITE_BATCH):
                batch = rows[start : start + WRITE_BATCH]
                seen = self._existing_ids([row["id"] for row in batch])
                new_rows = []
                for row in batch:
                    if row["id"] in seen:
                        report.skipped_duplicates += 1
                    else:
                        seen.add(row["id"])  # a second copy within the call is a duplicate too
                        new_rows.append(row)
                if not new_rows:
                    continue
                if self.embedder is not None:
                    self._embed(new_rows, self.embedder)
                    report.embedded += len(new_rows)
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

    def _embed(self, rows: list[dict], embedder: Embedder) -> None:
        vectors = np.asarray(
            embedder.encode([embedding_text(row["title"], row["text"]) for row in rows]), dtype=np.float32
        )
        if vectors.shape != (len(rows), embedder.dim):
            raise InputError(
                f"embedder={embedder.name!r} returned shape {vectors.shape} for {len(rows)} texts; "
                f"expected ({len(rows)}, {embedder.dim})"
            )
        for row, vector in zip(rows, vectors, strict=True):
            row["dense"] = vector

    def _rows(self, passages: Iterable[Mapping[str, str]]) -> list[dict]:
        """Checked rows, stems included; raises InputError naming the first passage Milvus cannot hold."""
        rows: list[dict] = []
        for passage in passages:
            text = passage.get("text")
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"passage={str(passage)[:80]!r} has no text; give every passage a non-empty 'text'")
            source, title = str(passage.get("source") or ""), passage.get("title") or ""
            rows.append({"id": _content_hash(text), "source": source, "title": title, "text": text})
        stems = _TOKENIZER.passages([(row["title"], row["text"]) for row in rows])
        for row, (title_stems, text_stems) in zip(rows, stems, strict=True):
            title_stems = [stem for stem in title_stems if len(stem.encode()) <= WORD_BYTES]
            text_stems = [stem for stem in text_stems if len(stem.encode()) <= WORD_BYTES]
            row["words"] = sorted(set(title_stems) | set(text_stems))
            row["terms"] = " ".join(title_stems) + "\n" + " ".join(text_stems)
            _check_limits(row)
            pairs = " ".join(
                _pair_token(*pair) for stems_ in (title_stems, text_stems) for pair in itertools.pairwise(stems_)
            )
            if len(row["terms"].encode()) + 1 + len(pairs) <= TEXT_BYTES:  # a very long passage goes without
                row["terms"] += "\n" + pairs
        return rows

    def _existing_ids(self, ids: list[str]) -> set[str]:
        rows = self._call("query", self.collection, filter=f"id in {json.dumps(ids)}", output_fields=["id"])
        return {row["id"] for row in rows}

    # The file parsing is SQLiteMemory's (bad lines reported by number, ids and titles picked the same
    # way); it calls nothing of the store but `add_passages`, so both stores read a file identically.
    def add_jsonl(
        self, path: str | Path, text_field: str = "text", id_field: str = "kb_id", title_field: str = "title"
    ) -> IngestReport:
        """Ingest one JSON object per line. Bad lines are reported by number; the rest still goes in."""
        return SQLiteMemory.add_jsonl(self, path, text_field=text_field, id_field=id_field, title_field=title_field)

    def add_text_files(self, paths: Iterable[str | Path]) -> IngestReport:
        """Ingest .txt/.md files, and such files found under folders, as paragraph-sized passages.

        A passage's source is "file:<path relative to the argument's folder>#<chunk number>".
        """
        return SQLiteMemory.add_text_files(self, paths)

    def reindex(self, full: bool = False) -> int:
        """SQLiteMemory's "embed what lacks a vector": here every passage gets its vector as it is
        written, so there is nothing to do (returns 0). A collection's fields are fixed, so one built
        without vectors cannot gain them, and `full` re-embedding is not offered: build a new store."""
        fix = f"build a new store with: surprisegate memory add --memory NEW_URI FILES (this one is {self.uri})"
        if not self._has_vectors:
            raise InputError(
                f"memory={self.uri!r} was built without vectors, and a Milvus collection cannot gain them; {fix}"
            )
        if full:
            raise InputError(
                f"memory={self.uri!r}: full=True (re-embed every passage) is not offered for Milvus; {fix}"
            )
        return 0

    def remove(self, source_prefix: str) -> int:
        """Remove the passages whose source starts with `source_prefix`. Returns how many were removed."""
        if not isinstance(source_prefix, str) or not source_prefix:
            raise InputError(
                f"source_prefix={source_prefix!r} must be a non-empty string, e.g. 'file:notes/' or 'country:'"
            )
        # LIKE's wildcards and escapes differ between engines: the engine matches the prefix's plainly
        # safe head, and only true prefix matches are kept here.
        head = ""
        for char in source_prefix:
            if not (char.isascii() and (char.isalnum() or char in ":/.-# ")):
                break
            head += char
        expression = f"source like {_quote(head + '%')}" if head else 'id != ""'
        doomed = [
            row["id"]
            for rows in self._scan(expression, ["source"])
            for row in rows
            if row["source"].startswith(source_prefix)
        ]
        for start in range(0, len(doomed), WRITE_BATCH):
            self._call("delete", self.collection, ids=doomed[start : start + WRITE_BATCH])
        if doomed:
            self._forget_frequencies()
        return len(doomed)

    # -- search ----------------------------------------------------------------------------------

    def search(
        self, query: str, k: int = 5, context: str = "", deadline: float | None = None, mode: str | None = None
    ) -> list[Hit]:
        """The `k` best passages for `query`, best first; as `SQLiteMemory.search`.

        `mode` is "bm25", "dense" or "hybrid" (default: the store's `mode`); "hybrid" without usable
        vectors searches by BM25, "dense" there raises InputError. `context` re-ranks the passages BM25
        finds and counts CONTEXT_WEIGHT as much as `query` in ranking and `score`. With `deadline` (a
        `time.monotonic()` value) a search still running then raises TimeoutError.
        """
        mode = check_mode(mode or self.mode)
        prepared = prepare_query(query, context, k, mode)
        if prepared is None:
            return []
        terms, context_terms = prepared
        check_deadline(deadline, self.uri)
        if mode == "dense" and self.embedder is None:
            raise InputError(
                f"mode='dense' needs vectors, but memory={self.uri!r} cannot use any ({self._embedder_problem}); "
                "search with mode='hybrid' or 'bm25'"
            )
        query_vector = self.embedder.encode([query])[0] if mode != "bm25" and self.embedder is not None else None
        if query_vector is not None and not query_vector.any():  # no word the embedder knows
            query_vector = None if mode != "dense" else query_vector
        pool = max(k, CANDIDATE_POOL)

        if mode == "dense":
            assert query_vector is not None  # an embedder is there (checked above), and dense keeps a zero vector
            nearest = self._dense(query_vector, k, deadline, fields=_fields(True)) if query_vector.any() else []
            cosines = {candidate.id: float(candidate.vector @ query_vector) for candidate in nearest}
            return [
                _hit(candidate, max(0.0, cosines[candidate.id]), 0.0, cosines[candidate.id]) for candidate in nearest
            ]

        # Round trips that do not wait on each other's answers run side by side: the counts behind
        # `score`, the dense search, and the BM25 searches.
        counting = self._start_counts([_TOKENIZER.stems(term.word) for term in terms + context_terms], deadline)
        dense_search = None if query_vector is None else self._workers.submit(self._dense, query_vector, pool, deadline)
        bigrams = query_bigrams(query)
        query_text = _stem_text(terms, bigrams)
        lexical, query_bm25 = self._lexical(query_text, context_terms, pool, deadline)
        if not lexical:  # no passage shares a word with the question: nothing here is about it
            return []
        order = (
            lexical
            if dense_search is None
            else self._hybrid_order(terms, bigrams, lexical, dense_search.result(), deadline)
        )
        total, frequencies = self._finish_counts(*counting, deadline)
        # A vector-only find must hold a word of the query itself, so that `score` (and the floor) can
        # judge it; checked k at a time, best first, as SQLiteMemory does. The passages come from a
        # BM25 search limited to the batch: it returns just the ones holding a query word, with their
        # fields, where fetching by id would scan the whole collection in milvus-lite.
        best: list[_Candidate] = []
        scores: dict[str, float] = {}
        for start in range(0, len(order), k):
            ids = order[start : start + k]
            found = self._bm25(query_text, len(ids), deadline, among=ids, fields=_fields(query_vector is not None))
            by_id = {candidate.id: candidate for candidate, _ in found}
            batch = [by_id[id] for id in ids if id in by_id]
            batch_scores, holds_query_word = self._coverage(terms, context_terms, batch, total, frequencies)
            scores.update(batch_scores)
            best += [candidate for candidate in batch if candidate.id in query_bm25 or candidate.id in holds_query_word]
            if len(best) >= k:
                break
        return [
            _hit(
                candidate,
                scores[candidate.id],
                query_bm25.get(candidate.id, 0.0),
                None if query_vector is None else float(candidate.vector @ query_vector),
            )
            for candidate in best[:k]
        ]

    def titles_named(self, text: str) -> list[str]:
        """The titles of stored passages that `text` names, most specific first (store/titles.py); the titles
        are read once, again when the store's passage count changes."""
        total = self._count_passages(None)
        if self._titles is None or self._titles[0] != total:
            titles = (row["title"] for rows in self._scan('id != ""', ["title"]) for row in rows)
            self._titles = (total, TitleIndex(titles, passages_naming=self._passages_naming))
        return self._titles[1].named(text)

    def _passages_naming(self, title: str) -> int:
        group = _TOKENIZER.stems(title.lower())
        return self._count_holding([group], None).get(group, 0) if group else 0

    def idf(self, word: str) -> float:
        """Inverse document frequency of `word` in this store (stemmed like the passages)."""
        group = _TOKENIZER.stems(word.lower())
        total, frequencies = self._finish_counts(*self._start_counts([group], None), None)
        return SQLiteMemory._idf(frequencies.get(group, 0), total)

    def _lexical(
        self, query_text: str, context_terms: list[QueryTerm], pool: int, deadline: float | None
    ) -> tuple[list[str], dict[str, float]]:
        """The ids of the `pool` best passages by BM25, re-ranked by `context_terms`, and their query BM25."""
        query_bm25 = {candidate.id: bm25 for candidate, bm25 in self._bm25(query_text, pool, deadline)}
        ranking = dict(query_bm25)  # SQLite's convention: lower (more negative) is better
        context_text = _stem_text(context_terms)
        if context_text and ranking:
            for candidate, bm25 in self._bm25(context_text, len(ranking), deadline, among=list(ranking)):
                ranking[candidate.id] += CONTEXT_WEIGHT * bm25
        return sorted(query_bm25, key=ranking.__getitem__), query_bm25

    def _bm25(
        self, text: str, limit: int, deadline: float | None, among: list[str] | None = None, fields: Sequence[str] = ()
    ) -> list[tuple[_Candidate, float]]:
        """(passage, bm25) best first, bm25 negated as in SQLite (lower is better); `among` limits the
        ids. The passages hold only the `fields` asked for."""
        options = {"filter": f"id in {json.dumps(among)}"} if among else {}
        results = self._call(
            "search",
            self.collection,
            data=[text],
            anns_field="sparse",
            limit=limit,
            search_params={"metric_type": "BM25"},
            output_fields=list(fields),
            deadline=deadline,
            **options,
        )
        # Engines disagree on the sign of a BM25 "distance" (server: +score, milvus-lite 3: -score).
        return [(_candidate(hit), -abs(float(hit["distance"]))) for hit in results[0] if hit["distance"]]

    def _dense(
        self, vector: np.ndarray, limit: int, deadline: float | None, fields: Sequence[str] = ()
    ) -> list[_Candidate]:
        """The `limit` passages whose vectors are nearest `vector`, best first, holding the `fields` asked for."""
        results = self._call(
            "search",
            self.collection,
            data=[vector.tolist()],
            anns_field="dense",
            limit=limit,
            search_params={"metric_type": "IP"},
            output_fields=list(fields),
            deadline=deadline,
        )
        return [_candidate(hit) for hit in results[0]]

    def _hybrid_order(
        self,
        terms: list[QueryTerm],
        bigrams: list[str],
        lexical: list[str],
        dense: list[_Candidate],
        deadline: float | None,
    ) -> list[str]:
        """SQLiteMemory's hybrid order of ids: passages holding more of the query's names and word pairs
        first (static vectors blur "Li" and "H"), then by reciprocal-rank fusion, then by BM25 rank."""
        fused = _fuse([lexical, [candidate.id for candidate in dense]])
        marks = [stems[0] for term in terms if term.is_name and len(stems := _TOKENIZER.stems(term.word)) == 1]
        marks += _stem_text([], bigrams).split()
        names_held = dict.fromkeys(fused, 0)
        if marks:
            # One BM25 search per mark, all in one request, each limited to the fused passages.
            results = self._call(
                "search",
                self.collection,
                data=marks,
                anns_field="sparse",
                limit=len(fused),
                filter=f"id in {json.dumps(fused)}",
                search_params={"metric_type": "BM25"},
                output_fields=[],
                deadline=deadline,
            )
            for holders in results:
                for hit in holders:
                    if hit["distance"] and hit["id"] in names_held:
                        names_held[hit["id"]] += 1
        position = {id: at for at, id in enumerate(fused)}  # already by fused score, then BM25 rank
        return sorted(fused, key=lambda id: (-names_held[id], position[id]))

    @staticmethod
    def _coverage(
        terms: list[QueryTerm],
        context_terms: list[QueryTerm],
        candidates: list[_Candidate],
        total: int,
        frequencies: dict[tuple[str, ...], int],
    ) -> tuple[dict[str, float], set[str]]:
        """(SQLiteMemory's `score` of each candidate: the IDF-weighted share of the query's terms it
        holds; the candidates holding a word of the query itself, not a number)."""
        stems = {term.word: _TOKENIZER.stems(term.word) for term in terms + context_terms}
        query_words = {term.word for term in terms if not term.word.isdigit()}
        holds_query_word: set[str] = set()
        writes_names = any(term.is_name for term in terms)
        covered = {candidate.id: 0.0 for candidate in candidates}
        holds_a_word = dict.fromkeys(covered, False)  # a passage that shares only numbers is not about the query
        whole = 0.0
        for term in terms + context_terms:
            group = stems[term.word]
            frequency = frequencies.get(group, 0)
            weight = term.weight * SQLiteMemory._idf(frequency, total)
            if writes_names and term.lower_case and not frequency:
                weight *= UNSEEN_WORD_WEIGHT
            whole += weight
            if not frequency:
                continue
            for candidate in candidates:
                if all(stem in candidate.words for stem in group):
                    covered[candidate.id] += weight
                    holds_a_word[candidate.id] |= not term.word.isdigit()
                    if term.word in query_words:
                        holds_query_word.add(candidate.id)
        scores = {id: min(1.0, covered[id] / whole) if holds_a_word[id] and whole > 0 else 0.0 for id in covered}
        return scores, holds_query_word

    # -- document frequencies --------------------------------------------------------------------

    def _start_counts(
        self, groups: list[tuple[str, ...]], deadline: float | None
    ) -> tuple[Future[int], int, _Frequencies, Future[_Frequencies]]:
        """Start counting the store's passages (unless counted within TOTAL_TTL_S) and, for each group
        of stems not cached, the passages holding all of them. Hand the result to `_finish_counts`."""
        wanted = {group for group in groups if group}  # a word of punctuation only is held by none
        with self._df_lock:
            cached = {group: self._df_cache[group] for group in wanted if group in self._df_cache}
            cached_total = self._df_cache_total
            recent = time.monotonic() - self._total_counted_at < TOTAL_TTL_S
        total = _done(cached_total) if recent else self._workers.submit(self._count_passages, deadline)
        missing = sorted(wanted - cached.keys())
        no_counts: _Frequencies = {}
        pending = self._workers.submit(self._count_holding, missing, deadline) if missing else _done(no_counts)
        return total, cached_total, cached, pending

    def _finish_counts(
        self,
        counting: Future[int],
        cached_total: int,
        cached: _Frequencies,
        pending: Future[_Frequencies],
        deadline: float | None,
    ) -> tuple[int, _Frequencies]:
        """(passage count, {group: document frequency}) from `_start_counts`."""
        total = counting.result()
        frequencies = pending.result()
        if total != cached_total:  # the store changed since those were cached: count them again
            frequencies.update(self._count_holding(list(cached), deadline))
        else:
            frequencies.update(cached)
        with self._df_lock:
            if self._df_cache_total == total:
                # Bound it in long-lived processes.
                if len(self._df_cache) + len(frequencies) > IndexStemmer.CACHE_LIMIT:
                    self._df_cache.clear()
                self._df_cache.update(frequencies)
        return total, frequencies

    def _count_passages(self, deadline: float | None) -> int:
        total = self.count(deadline)
        with self._df_lock:
            if total != self._df_cache_total:  # the store changed (here or in another process)
                self._df_cache.clear()
                self._df_cache_total = total
            self._total_counted_at = time.monotonic()
        return total

    def _count_holding(self, groups: list[tuple[str, ...]], deadline: float | None) -> dict[tuple[str, ...], int]:
        """How many passages hold each group of stems (all of them, for a word that stems to several).

        One BM25 search with a query per word lists the holders of every rare word in one round trip
        (the inverted index answers it from the posting lists); a word held by DF_PROBE_LIMIT passages
        or more is counted by a filter instead, and then cached like any other.
        """
        counts: dict[tuple[str, ...], int] = {}
        single: list[tuple[str, ...]] = [group for group in groups if len(group) == 1]
        per_request = 16  # keeps queries x limit within Milvus's 16,384 results per request
        for start in range(0, len(single), per_request):
            chunk = single[start : start + per_request]
            results = self._call(
                "search",
                self.collection,
                data=[stem for (stem,) in chunk],
                anns_field="sparse",
                limit=DF_PROBE_LIMIT,
                search_params={"metric_type": "BM25"},
                output_fields=[],
                deadline=deadline,
            )
            for group, holders in zip(chunk, results, strict=False):
                if len(holders) < DF_PROBE_LIMIT:
                    counts[group] = sum(1 for hit in holders if hit["distance"])
        for group in groups:
            if group not in counts:
                if len(group) == 1:
                    expression = f"array_contains(words, {_quote(group[0])})"
                else:
                    expression = f"array_contains_all(words, [{', '.join(map(_quote, group))}])"
                rows = self._call(
                    "query", self.collection, filter=expression, output_fields=["count(*)"], deadline=deadline
                )
                counts[group] = int(rows[0]["count(*)"])
        return counts

    def _forget_frequencies(self) -> None:
        with self._df_lock:
            self._df_cache.clear()
            self._df_cache_total = -1
            self._total_counted_at = -math.inf


def _done(value: _T) -> Future[_T]:
    future: Future[_T] = Future()
    future.set_result(value)
    return future


def _check_limits(row: dict) -> None:
    where = f"passage source={row['source']!r}" if row["source"] else f"passage={row['text'][:60]!r}"
    fix = "split it into smaller passages (add_text_files cuts .txt/.md files into paragraphs)"
    for field, limit in (("text", TEXT_BYTES), ("terms", TEXT_BYTES), ("title", LABEL_BYTES), ("source", LABEL_BYTES)):
        size = len(row[field].encode("utf-8"))
        if size > limit:
            what = "stemmed words" if field == "terms" else field
            raise InputError(f"{where} has {size:,} bytes of {what}, more than Milvus holds ({limit:,}); {fix}")
    if len(row["words"]) > MAX_WORDS:
        raise InputError(
            f"{where} has {len(row['words']):,} distinct words, more than Milvus holds ({MAX_WORDS:,}); {fix}"
        )


def _fields(with_vectors: bool) -> list[str]:
    # `words` lets `score` be computed without another round trip; `dense` gives each hit's cosine.
    return ["text", "title", "source", "words"] + (["dense"] if with_vectors else [])


def _candidate(hit) -> _Candidate:
    """A passage from a search hit; fields the search did not return are left empty."""
    entity = hit.get("entity") or {}
    vector = entity.get("dense")
    return _Candidate(
        id=hit["id"],
        text=entity.get("text", ""),
        title=entity.get("title", ""),
        source=entity.get("source", ""),
        words=frozenset(entity.get("words") or ()),
        vector=None if vector is None else np.asarray(vector, dtype=np.float32),
    )


def _hit(candidate: _Candidate, score: float, bm25: float, cosine: float | None) -> Hit:
    return Hit(
        text=candidate.text, title=candidate.title, source=candidate.source, score=score, bm25=bm25, cosine=cosine
    )


def _stem_text(terms: list[QueryTerm], bigrams: Sequence[str] = ()) -> str:
    """The query for Milvus's BM25 (which, like FTS5's OR query, sums over words): the terms' stems,
    each once, then a pair token for each adjacent word pair, standing in for FTS5's phrases."""
    tokens: dict[str, None] = {}
    for term in terms:
        tokens.update(dict.fromkeys(_TOKENIZER.stems(term.word)))
    for bigram in bigrams:
        stems = [stem for word in bigram.split() for stem in _TOKENIZER.stems(word)]
        tokens.update(dict.fromkeys(_pair_token(*pair) for pair in itertools.pairwise(stems)))
    return " ".join(tokens)


def _pair_token(first: str, second: str) -> str:
    """One made-up word for two adjacent stems ("symbol b"), so that BM25 can rank the phrase.

    A hash, letters and digits only, so that every engine's analyzer keeps it whole; 40 bits make a
    collision between two of a store's pairs unlikely and harmless (it only nudges ranking).
    """
    return "p" + hashlib.blake2b(f"{first} {second}".encode(), digest_size=5).hexdigest()


def _fuse(rankings: list[list[str]]) -> list[str]:
    """Reciprocal-rank fusion: each ranking gives an id 1 / (RRF_K + rank); ties keep the first ranking's order."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, id in enumerate(ranking, start=1):
            fused[id] = fused.get(id, 0.0) + 1.0 / (RRF_K + rank)
    first = {id: position for position, id in enumerate(rankings[0])}
    return sorted(fused, key=lambda id: (-fused[id], first.get(id, len(first))))

"""The embedded memory store: one SQLite file holding passages, an FTS5 index and dense vectors.

`search()` has three modes:
- "bm25": FTS5's BM25 over the query's content words and adjacent word pairs.
- "dense": cosine similarity between the query's and each passage's embedding (see `embed.py`).
- "hybrid" (default): both rankings fused by reciprocal rank (RRF, k=60). A passage found only by its
  vector joins the results only if it holds at least one of the query's words: the lexical `score`
  below must be able to judge every hit.

Each hit has a `score` in [0, 1]. In "bm25" and "hybrid" it is the IDF-weighted share of the query's
words that the passage holds, names (capitalised words) weighing more. Raw BM25 is unbounded and
depends on the corpus; the share is comparable across stores, so one relevance floor can decide
"nothing found". A query about something the store never mentions scores low, because the unknown
name carries the largest IDF of all. In "dense" mode `score` is the cosine similarity (below 0 read as
0), which depends on the embedder and is not calibrated against the lexical floor.

Vectors live in the same file (table `passage_vectors`); `meta` records which embedder made them, and
a store refuses vectors from another. A store without vectors (made before they existed, or without
an embedder installed) still searches, by BM25; `stats()` says so and `reindex()` adds the vectors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from ..errors import InputError, MissingDependency
from ..text import FTS_TOKENIZER, QUERY_STOPWORDS, name_tokens, split_sentences
from .embed import Embedder, default_embedder, embedder_from_name
from .titles import TitleIndex

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

FORMAT_NAME = "surprisegate-memory"
SCHEMA_VERSION = 2  # 2 added passage_vectors; version-1 stores are upgraded on their first write

SEARCH_MODES = ("bm25", "dense", "hybrid")
# Weight of a query term in `score`. A capitalised word inside a sentence (a name: "Burkina", or a
# symbol such as "He") is what a fact question is about, so the store missing it should weigh most.
NAME_WEIGHT = 3.0
# In a query that capitalises its names, a lower-case word that no passage holds is the asker's
# wording ("located", "telephone"), not a missing subject, so it counts this fraction of its IDF.
# All-lower-case queries get no discount: there, an unknown subject looks the same.
UNSEEN_WORD_WEIGHT = 0.25
# `context=` (e.g. the model's own doubtful claim, often wrong) counts this much relative to the query,
# both in ranking and in `score`; on factqa_dev 0.1 held top-1 with wrong and right claims alike.
CONTEXT_WEIGHT = 0.1
# How many of the query's best BM25 passages `context=` may re-rank, and how many each ranking
# brings to the hybrid fusion.
CANDIDATE_POOL = 50
# Reciprocal rank fusion: a passage's fused score is the sum of 1 / (RRF_K + rank) over the rankings.
RRF_K = 60
# BM25 over a word held by a third of a large store means scoring every one of those passages. Only
# the query's rarest phrases, holding at most this many passages together, pick the candidates; the
# commoner ones still add to their BM25. Stores up to this size rank exactly as plain FTS5 would.
ANCHOR_POSTINGS = 2000
# BM25 column weights (title, text). Weighting titles up measured slightly worse on factqa_dev.
TITLE_WEIGHT, TEXT_WEIGHT = 1.0, 1.0
MAX_CHUNK_CHARS = 800
# Reading a posting list costs about 0.4 us a passage, seeking one passage in it about 25 us: below
# this many postings per wanted passage, read the whole list.
HOLDERS_SCAN_RATIO = 50
EMBED_BATCH = 1024  # passages embedded and written per step of an ingest


@dataclass(frozen=True)
class Hit:
    text: str
    title: str
    source: str
    score: float  # bm25/hybrid: IDF coverage of the query's terms, 0..1, comparable across stores;
    # dense: the cosine similarity, below 0 read as 0
    bm25: float  # FTS5's raw bm25(): lower (more negative) is better; 0.0 when BM25 did not rank it
    cosine: float | None = None  # similarity of the query's and the passage's vectors; None without vectors


@dataclass
class IngestReport:
    added: int = 0
    skipped_duplicates: int = 0
    embedded: int = 0  # passages given a vector, new ones and any older ones that lacked one
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line_no, message)

    def merge(self, other: IngestReport) -> None:
        self.added += other.added
        self.skipped_duplicates += other.skipped_duplicates
        self.embedded += other.embedded
        self.errors.extend(other.errors)


class _AddsPassages(Protocol):
    """A store that `add_jsonl` and `add_text_files` can fill: MilvusMemory borrows them too."""

    def add_passages(self, passages: Iterable[Mapping[str, str]]) -> IngestReport: ...


NUMBER_WEIGHT = 0.25


@dataclass(frozen=True)
class QueryTerm:
    word: str  # lower-cased; FTS5 stems it as it stems the passages
    weight: float  # multiplies the term's IDF in `score`
    is_name: bool = False  # capitalised inside a sentence
    lower_case: bool = False  # typed in lower case (so surely not a name)


def prepare_query(query: str, context: str, k: int, mode: str) -> tuple[list[QueryTerm], list[QueryTerm]] | None:
    """The query's terms and the context's new terms (at CONTEXT_WEIGHT); None when nothing can match.

    Shared by every store, so SQLite and Milvus read a question the same way.
    """
    if k <= 0 or not query.strip():
        return None
    terms = query_terms(query)
    if not terms and mode != "dense":
        return None
    known = {term.word for term in terms}
    return terms, [term for term in query_terms(context, CONTEXT_WEIGHT) if term.word not in known]


def query_terms(text: str, weight: float = 1.0) -> list[QueryTerm]:
    """Content words of `text`, in order, without duplicates; names weigh NAME_WEIGHT times more."""
    terms: dict[str, QueryTerm] = {}
    for token, looks_like_name, _ in name_tokens(text):
        word = token.lower()
        if word in QUERY_STOPWORDS and not looks_like_name:  # keep "He"/"In" when they are symbols
            continue
        # Bare numbers are values or operands ("37 times 48"), rarely what identifies a passage.
        kind_weight = NUMBER_WEIGHT if word.isdigit() else (NAME_WEIGHT if looks_like_name else 1.0)
        term = QueryTerm(word, weight * kind_weight, looks_like_name, token == word)
        if word not in terms or terms[word].weight < term.weight:
            terms[word] = term
    return list(terms.values())


def query_bigrams(text: str) -> list[str]:
    """Adjacent content-word pairs ("symbol b", "burkina faso"), to favour passages with the phrase."""
    bigrams: list[str] = []
    previous = None
    for token, looks_like_name, follows_previous in name_tokens(text):
        word = token.lower()
        if word in QUERY_STOPWORDS and not looks_like_name:
            previous = None
            continue
        if previous and follows_previous and f"{previous} {word}" not in bigrams:
            bigrams.append(f"{previous} {word}")
        previous = word
    return bigrams


def _fts_phrase(word: str) -> str:
    # A quoted FTS5 string is a phrase: AND, NEAR, *, :, ( and ) inside it are plain text.
    return '"' + word.replace('"', '""') + '"'


def _content_hash(text: str) -> str:
    normalised = " ".join(unicodedata.normalize("NFKC", text).split())
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def chunk_text(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Split text into paragraph-sized passages of at most `max_chars`.

    Paragraphs (blank-line separated) are merged while they fit; longer ones split at sentence ends,
    and a sentence longer than `max_chars` at word boundaries.
    """
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        if len(paragraph) <= max_chars:
            pieces.append(paragraph)
            continue
        for sentence in split_sentences(paragraph):
            while len(sentence) > max_chars:
                cut = sentence.rfind(" ", 0, max_chars)
                cut = cut if cut > 0 else max_chars
                pieces.append(sentence[:cut].strip())
                sentence = sentence[cut:].strip()
            if sentence:
                pieces.append(sentence)
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + 2 + len(piece) <= max_chars:
            chunks[-1] += ("\n\n" if piece[:1].isupper() else " ") + piece
        else:
            chunks.append(piece)
    return chunks


_SCHEMA_V1 = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE passages (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL,
    content_hash TEXT NOT NULL UNIQUE
);
CREATE VIRTUAL TABLE passages_fts USING fts5(
    title, text, content='passages', content_rowid='id',
    tokenize='{FTS_TOKENIZER}'
);
-- Keep the index in step with the table whatever writes to it.
CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
    INSERT INTO passages_fts(rowid, title, text) VALUES (new.id, new.title, new.text);
END;
CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
    INSERT INTO passages_fts(passages_fts, rowid, title, text)
    VALUES ('delete', old.id, old.title, old.text);
END;
CREATE TRIGGER passages_au AFTER UPDATE ON passages BEGIN
    INSERT INTO passages_fts(passages_fts, rowid, title, text)
    VALUES ('delete', old.id, old.title, old.text);
    INSERT INTO passages_fts(rowid, title, text) VALUES (new.id, new.title, new.text);
END;
"""
# Version 2: one float32 vector (little-endian bytes) per passage, removed with its passage. Run
# statement by statement, since executescript() would commit an open transaction first.
_VECTOR_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS passage_vectors (id INTEGER PRIMARY KEY, vector BLOB NOT NULL)",
    """CREATE TRIGGER IF NOT EXISTS passage_vectors_ad AFTER DELETE ON passages BEGIN
        DELETE FROM passage_vectors WHERE id = old.id;
    END""",
    # An edited passage's vector is stale; dropping it lets the next add_*() or reindex() redo it.
    """CREATE TRIGGER IF NOT EXISTS passage_vectors_au AFTER UPDATE OF title, text ON passages BEGIN
        DELETE FROM passage_vectors WHERE id = old.id;
    END""",
)


def embedding_text(title: str, text: str) -> str:
    """What a passage's vector is made from: its title (unless the text opens with it) and text."""
    return text if not title or text.startswith(title) else f"{title}\n{text}"


# threadpoolctl's controller, found on first use; False without threadpoolctl.
_BLAS: ThreadpoolController | Literal[False] | None = None
_BLAS_LOCK = threading.Lock()


def _one_thread_product(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """`matrix @ vector` with BLAS held to one thread.

    On small machines a threaded BLAS matrix-vector product waits on thread wake-ups longer than it
    computes (100k x 256: about 8 ms threaded, 4 ms on one thread, on 2 cores). The limit is
    process-wide, so the lock keeps two searches from interleaving its setting and restoring.
    """
    global _BLAS
    with _BLAS_LOCK:
        if _BLAS is None:
            try:
                from threadpoolctl import ThreadpoolController

                _BLAS = ThreadpoolController()
            except ImportError:
                _BLAS = False
        if _BLAS is False:
            return matrix @ vector
        with _BLAS.limit(limits=1, user_api="blas"):
            return matrix @ vector


@dataclass
class _VectorIndex:
    """All vectors of a store as one matrix, rows in passage-id order, for a matrix-vector search."""

    ids: np.ndarray  # int64, ascending
    matrix: np.ndarray  # float32 (len(ids), dim), unit rows

    def similarities(self, vector: np.ndarray) -> np.ndarray:
        return _one_thread_product(self.matrix, vector)

    def best(self, similarities: np.ndarray, n: int) -> list[int]:
        """Row positions of the `n` most similar, best first."""
        n = min(n, len(similarities))
        if n <= 0:
            return []
        top = np.argpartition(-similarities, n - 1)[:n] if n < len(similarities) else np.arange(len(similarities))
        return top[np.argsort(-similarities[top], kind="stable")].tolist()

    def position(self, rowid: int) -> int | None:
        at = int(np.searchsorted(self.ids, rowid))
        return at if at < len(self.ids) and self.ids[at] == rowid else None


class SQLiteMemory:
    """A memory store in one SQLite file. Thread-safe; use as a context manager or call `close()`.

    `embedder`: "auto" uses the embedder the store records, or for a store without vectors the default
    one (wordllama) when it is installed; None searches by BM25 only and refuses to add passages to a
    store that keeps vectors; an `Embedder` must match the one the store records. `mode` is the
    default for `search()`.
    """

    def __init__(
        self, path: str | Path, create: bool = False, embedder: Embedder | str | None = "auto", mode: str = "hybrid"
    ):
        self.path = Path(path)
        if embedder not in ("auto", None) and not isinstance(embedder, Embedder):
            raise InputError(f"embedder={embedder!r} is not an Embedder; pass 'auto', None or e.g. WordLlamaEmbedder()")
        self.mode = check_mode(mode)
        if not self.path.exists() and not create:
            raise InputError(
                f"memory={str(path)!r} does not exist; "
                f"build it with: surprisegate memory add --memory {path} FILE.jsonl"
            )
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._embedder_choice = embedder
        self._embedder: Embedder | None = embedder if isinstance(embedder, Embedder) else None
        self._embedder_problem: str | None = None  # why vectors cannot be used, for stats()
        self._lock = threading.Lock()
        # Caches, dropped whenever this connection writes or PRAGMA data_version shows another did.
        self._data_version: int | None = None
        self._vectors: _VectorIndex | None = None
        self._frequencies: dict[str, int] = {}
        self._total_passages: int | None = None
        self._titles: TitleIndex | None = None
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._open(create)
        except BaseException:
            self._conn.close()
            raise

    def _open(self, create: bool) -> None:
        fix = (
            "pass the path of a surprisegate memory, "
            "or build a new one with: surprisegate memory add --memory NEW.sqlite FILE.jsonl"
        )
        try:
            tables = {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master")}
            if not tables and create:
                self._conn.executescript(
                    f"BEGIN; {_SCHEMA_V1}; {'; '.join(_VECTOR_SCHEMA)};"
                    f"INSERT INTO meta(key, value) VALUES ('format', '{FORMAT_NAME}'), "
                    f"('schema_version', '{SCHEMA_VERSION}'); COMMIT;"
                )
                with self._write_transaction():
                    self._writing_embedder()  # records the embedder, so stats() names it from the start
                return
            meta = dict(self._conn.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
        except sqlite3.DatabaseError as err:  # e.g. "file is not a database"
            raise InputError(f"memory={str(self.path)!r} is not a surprisegate memory store ({err}); {fix}") from err
        if meta.get("format") != FORMAT_NAME or "passages_fts" not in tables:
            raise InputError(f"memory={str(self.path)!r} is an SQLite file but not a surprisegate memory store; {fix}")
        if int(meta.get("schema_version", 0)) > SCHEMA_VERSION:
            raise InputError(
                f"memory={str(self.path)!r} has schema version {meta['schema_version']}, newer than this "
                f"surprisegate supports ({SCHEMA_VERSION}); upgrade with: pip install -U surprisegate"
            )
        self._check_same_embedder(self._recorded_embedder())

    def _check_same_embedder(self, recorded: tuple[str, int] | None) -> None:
        if self._embedder is None or recorded is None:
            return
        if (self._embedder.name, self._embedder.dim) != recorded:
            raise InputError(
                f"memory={str(self.path)!r} holds vectors from embedder {recorded[0]!r} (dim {recorded[1]}), "
                f"not {self._embedder.name!r} (dim {self._embedder.dim}); vectors of two models cannot be "
                "compared. Open it with embedder='auto', or build a new store for the other embedder"
            )

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteMemory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM passages").fetchone()[0]

    def stats(self) -> dict:
        """What the store holds and how it will search: counts, embedder, size, schema, and a note
        when vectors are missing or unusable (then "hybrid" searches by BM25 alone)."""
        with self._lock:
            self._refresh_caches()
            meta = dict(self._conn.execute("SELECT key, value FROM meta"))
            passages = self._total()
            sources = self._conn.execute(
                # A text file's chunks ("file:notes/a.md#3") count as one source.
                """SELECT count(DISTINCT CASE WHEN source LIKE 'file:%#%'
                   THEN rtrim(rtrim(source, '0123456789'), '#') ELSE source END) FROM passages"""
            ).fetchone()[0]
            fts_rows = self._conn.execute("SELECT count(*) FROM passages_fts_docsize").fetchone()[0]
            vectors = self._vector_count()
            # An empty store with an embedder is ready for every mode; one with passages needs vectors.
            usable = self._search_embedder() is not None and (vectors > 0 or passages == 0)
            note = None
            if not usable:
                why = (
                    self._embedder_problem
                    or "the store has no vectors yet; run `surprisegate memory reindex --memory PATH` to add them"
                )
                note = f"{why}; searching by BM25 only"
            elif vectors < passages:
                note = f"{passages - vectors} passages have no vector yet (dense search misses them); run reindex()"
        return {
            "path": str(self.path),
            "schema_version": int(meta.get("schema_version", 1)),
            "passages": passages,
            "sources": sources,
            "fts_rows": fts_rows,
            "vectors": vectors,
            "embedder": meta.get("embedder"),
            "dim": int(meta["embedding_dim"]) if "embedding_dim" in meta else None,
            "file_bytes": os.path.getsize(self.path),
            "search_modes": list(SEARCH_MODES) if usable else ["bm25"],
            "note": note,
        }

    # -- ingest ----------------------------------------------------------------------------------

    def add_passages(self, passages: Iterable[Mapping[str, str]]) -> IngestReport:
        """Add passages ({"text", "title", "source"}) in one transaction; duplicates by text are skipped.

        New passages get vectors in batches, and so does any older passage still lacking one.
        """
        report = IngestReport()
        with self._lock, self._write_transaction():
            embedder = self._writing_embedder()
            if embedder is not None:
                report.embedded += self._embed_missing(embedder)
            pending: list[tuple[int, str]] = []  # (rowid, text to embed) not yet written
            for passage in passages:
                text = passage.get("text")
                if not isinstance(text, str) or not text.strip():
                    raise InputError(
                        f"passage={str(passage)[:80]!r} has no text; give every passage a non-empty 'text'"
                    )
                title = passage.get("title") or ""
                cursor = self._conn.execute(
                    "INSERT OR IGNORE INTO passages(source, title, text, content_hash) VALUES (?, ?, ?, ?)",
                    (str(passage.get("source") or ""), title, text, _content_hash(text)),
                )
                if not cursor.rowcount:
                    report.skipped_duplicates += 1
                    continue
                report.added += 1
                if embedder is not None:
                    assert cursor.lastrowid is not None  # set by the INSERT that just added a row
                    pending.append((cursor.lastrowid, embedding_text(title, text)))
                    if len(pending) >= EMBED_BATCH:
                        report.embedded += self._write_vectors(embedder, pending)
                        pending = []
            if embedder is not None and pending:
                report.embedded += self._write_vectors(embedder, pending)
        return report

    def add_jsonl(
        self: _AddsPassages,
        path: str | Path,
        text_field: str = "text",
        id_field: str = "kb_id",
        title_field: str = "title",
    ) -> IngestReport:
        """Ingest one JSON object per line. Bad lines are reported by number; the rest still goes in."""
        path = Path(path)
        if not path.is_file():
            raise InputError(f"file={str(path)!r} does not exist or is not a file; pass a JSON Lines file")
        errors: list[tuple[int, str]] = []
        passages: list[dict[str, str]] = []
        with path.open("rb") as lines:
            for line_no, raw in enumerate(lines, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                    if not line:
                        continue
                    row = json.loads(line)
                except (UnicodeDecodeError, json.JSONDecodeError) as err:
                    errors.append((line_no, f"not valid JSON: {err}"))
                    continue
                if not isinstance(row, dict):
                    errors.append((line_no, f"expected a JSON object, got {type(row).__name__}"))
                    continue
                text = row.get(text_field)
                if not isinstance(text, str) or not text.strip():
                    errors.append((line_no, f"missing text field {text_field!r} (set another with text_field=)"))
                    continue
                source = next(
                    (row[key] for key in (id_field, "id") if row.get(key) not in (None, "")), f"{path.name}:{line_no}"
                )
                title = row.get(title_field)
                passages.append({"text": text, "title": title if isinstance(title, str) else "", "source": str(source)})
        report = self.add_passages(passages)
        report.errors = errors
        return report

    def add_text_files(self: _AddsPassages, paths: Iterable[str | Path]) -> IngestReport:
        """Ingest .txt/.md files, and such files found under folders, as paragraph-sized passages.

        A passage's source is "file:<path relative to the argument's folder>#<chunk number>".
        """
        report = IngestReport()
        for argument in map(Path, paths):
            if argument.is_dir():
                files = sorted(p for p in argument.rglob("*") if p.suffix.lower() in {".txt", ".md"} and p.is_file())
                base = argument.parent
            elif argument.is_file():
                files, base = [argument], argument.parent
            else:
                raise InputError(f"path={str(argument)!r} does not exist; pass .txt/.md files or folders holding them")
            for file in files:
                try:
                    text = file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as err:
                    report.errors.append((0, f"{file}: {err}"))
                    continue
                relative = file.relative_to(base).as_posix()
                report.merge(
                    self.add_passages(
                        {"text": chunk, "title": file.stem, "source": f"file:{relative}#{number}"}
                        for number, chunk in enumerate(chunk_text(text))
                    )
                )
        return report

    def reindex(self, full: bool = False) -> int:
        """Embed the passages that have no vector (all of them with `full=True`, which also rebuilds the
        full-text index). Returns how many passages were embedded."""
        if self._embedder_choice is None:
            raise InputError(
                f"memory={str(self.path)!r} was opened with embedder=None; open it with embedder='auto' to add vectors"
            )
        with self._lock, self._write_transaction():
            embedder = self._writing_embedder()
            if embedder is None:
                raise MissingDependency(
                    f"memory={str(self.path)!r} cannot get vectors: "
                    f"{self._embedder_problem or 'no embedder'}; install one with: pip install wordllama"
                )
            if full:
                self._conn.execute("DELETE FROM passage_vectors")
                self._conn.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")
            return self._embed_missing(embedder)

    def remove(self, source_prefix: str) -> int:
        """Remove the passages whose source starts with `source_prefix` from the table, the full-text
        index and the vectors, in one transaction. Returns how many were removed."""
        if not isinstance(source_prefix, str) or not source_prefix:
            raise InputError(
                f"source_prefix={source_prefix!r} must be a non-empty string, e.g. 'file:notes/' or 'country:'"
            )
        with self._lock, self._write_transaction():
            # substr(), not LIKE: a prefix holding % or _ must match literally.
            cursor = self._conn.execute(
                "DELETE FROM passages WHERE substr(source, 1, ?) = ?", (len(source_prefix), source_prefix)
            )
            return cursor.rowcount

    # -- writing helpers (called holding the lock, inside a write transaction) ------------------

    def _write_transaction(self):
        return _WriteTransaction(self)

    def _upgrade_schema(self) -> None:
        version = int(self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])
        if version < 2:
            for statement in _VECTOR_SCHEMA:
                self._conn.execute(statement)
            self._conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _recorded_embedder(self) -> tuple[str, int] | None:
        meta = dict(self._conn.execute("SELECT key, value FROM meta WHERE key IN ('embedder', 'embedding_dim')"))
        return (meta["embedder"], int(meta["embedding_dim"])) if "embedder" in meta else None

    def _writing_embedder(self) -> Embedder | None:
        """The embedder new vectors come from, or None for a BM25-only store."""
        recorded = self._recorded_embedder()
        if self._embedder_choice is None:
            if recorded is not None:
                raise InputError(
                    f"memory={str(self.path)!r} keeps {recorded[0]!r} vectors for every passage; open it with "
                    "embedder='auto' so that new passages get theirs too"
                )
            return None
        if self._embedder is None:
            try:
                self._embedder = embedder_from_name(recorded[0]) if recorded else default_embedder()
            except MissingDependency as err:
                if recorded:
                    raise  # adding passages without vectors would leave dense search blind to them
                self._embedder_problem = f"no embedder is installed ({err})"
                return None
        self._check_same_embedder(recorded)  # another process may have recorded one since we opened
        if recorded is None:
            self._conn.execute(
                "INSERT INTO meta(key, value) VALUES ('embedder', ?), ('embedding_dim', ?)",
                (self._embedder.name, str(self._embedder.dim)),
            )
        return self._embedder

    def _embed_missing(self, embedder: Embedder) -> int:
        if self._conn.execute("SELECT count(*) FROM passage_vectors").fetchone()[0] == self._total(fresh=True):
            return 0
        missing = self._conn.execute(
            """SELECT p.id, p.title, p.text FROM passages p
               WHERE NOT EXISTS (SELECT 1 FROM passage_vectors v WHERE v.id = p.id) ORDER BY p.id"""
        ).fetchall()
        embedded = 0
        for start in range(0, len(missing), EMBED_BATCH):
            batch = missing[start : start + EMBED_BATCH]
            texts = [(rowid, embedding_text(title, text)) for rowid, title, text in batch]
            embedded += self._write_vectors(embedder, texts)
        return embedded

    def _write_vectors(self, embedder: Embedder, items: list[tuple[int, str]]) -> int:
        vectors = np.asarray(embedder.encode([text for _, text in items]), dtype="<f4")
        if vectors.shape != (len(items), embedder.dim):
            raise InputError(
                f"embedder={embedder.name!r} returned shape {vectors.shape} for {len(items)} texts; "
                f"expected ({len(items)}, {embedder.dim})"
            )
        self._conn.executemany(
            "INSERT OR REPLACE INTO passage_vectors(id, vector) VALUES (?, ?)",
            ((rowid, vector.tobytes()) for (rowid, _), vector in zip(items, vectors, strict=True)),
        )
        return len(items)

    # -- caches ----------------------------------------------------------------------------------

    def _drop_caches(self) -> None:
        self._vectors = None
        self._frequencies.clear()
        self._total_passages = None
        self._titles = None

    def _refresh_caches(self) -> None:
        # data_version changes when another connection commits; this connection's own writes drop the
        # caches directly.
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._drop_caches()
            self._data_version = version

    def _total(self, fresh: bool = False) -> int:
        if self._total_passages is None or fresh:
            self._total_passages = self._conn.execute("SELECT count(*) FROM passages").fetchone()[0]
        return self._total_passages

    def _frequency(self, phrase: str) -> int:
        """How many passages hold `phrase` (after the same stemming as the passages)."""
        frequency = self._frequencies.get(phrase)
        if frequency is None:
            frequency = self._conn.execute(
                "SELECT count(*) FROM passages_fts WHERE passages_fts MATCH ?", (_fts_phrase(phrase),)
            ).fetchone()[0]
            if len(self._frequencies) > 100_000:  # bound the cache in long-lived processes
                self._frequencies.clear()
            self._frequencies[phrase] = frequency
        return frequency

    def _has_vector_table(self) -> bool:
        found = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'passage_vectors'")
        return found.fetchone() is not None

    def _vector_count(self) -> int:
        if not self._has_vector_table():
            return 0
        return self._conn.execute("SELECT count(*) FROM passage_vectors").fetchone()[0]

    def _search_embedder(self) -> Embedder | None:
        """The embedder that encodes queries, or None (and `_embedder_problem` says why)."""
        if self._embedder is not None:
            return self._embedder
        if self._embedder_choice is None:
            self._embedder_problem = "opened with embedder=None"
            return None
        recorded = self._recorded_embedder()
        if recorded is None:
            return None
        try:
            self._embedder = embedder_from_name(recorded[0])
        except (MissingDependency, InputError) as err:
            self._embedder_problem = f"the store's vectors come from {recorded[0]!r}, which cannot load here ({err})"
            return None
        return self._embedder

    def _vector_index(self) -> _VectorIndex | None:
        """Every vector as one in-memory matrix, loaded on first use; None when dense search cannot run."""
        if self._vectors is None:
            embedder = self._search_embedder()
            if embedder is None or not self._has_vector_table():
                return None
            self._conn.execute("BEGIN")  # one snapshot: the count must hold while the rows are read
            try:
                self._vectors = self._read_vectors(embedder.dim)
            finally:
                self._conn.execute("COMMIT")
        return self._vectors

    def _read_vectors(self, dim: int) -> _VectorIndex | None:
        count = self._conn.execute("SELECT count(*) FROM passage_vectors").fetchone()[0]
        if not count:
            return None
        ids = np.empty(count, dtype=np.int64)
        matrix = np.empty((count, dim), dtype=np.float32)
        filled = 0
        cursor = self._conn.execute("SELECT id, vector FROM passage_vectors ORDER BY id")
        while rows := cursor.fetchmany(10_000):  # in slices, so loading never holds two copies
            data = b"".join(vector for _, vector in rows)
            if len(data) != len(rows) * dim * 4:
                raise InputError(
                    f"memory={str(self.path)!r} holds vectors that are not all {dim}-dimensional; "
                    "rebuild them with reindex(full=True)"
                )
            ids[filled : filled + len(rows)] = [rowid for rowid, _ in rows]
            matrix[filled : filled + len(rows)] = np.frombuffer(data, dtype="<f4").reshape(len(rows), dim)
            filled += len(rows)
        return _VectorIndex(ids=ids, matrix=matrix)

    # -- search ----------------------------------------------------------------------------------

    def search(
        self, query: str, k: int = 5, context: str = "", deadline: float | None = None, mode: str | None = None
    ) -> list[Hit]:
        """The `k` best passages for `query`, best first.

        `mode` is "bm25", "dense" or "hybrid" (default: the store's `mode`). "hybrid" on a store whose
        vectors are missing or unusable searches by BM25 (see `stats()`); "dense" there raises InputError.
        `context` is extra text (e.g. the claim being checked, which may be wrong): it re-ranks the
        passages BM25 finds for `query` and counts CONTEXT_WEIGHT as much as `query` in ranking and
        `score`; dense ranking uses `query` alone. With `deadline` (a `time.monotonic()` value) a
        search still running then raises TimeoutError.
        """
        mode = check_mode(mode or self.mode)
        prepared = prepare_query(query, context, k, mode)
        if prepared is None:
            return []
        terms, context_terms = prepared
        with self._lock:
            self._refresh_caches()
            if deadline is not None:
                self._conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
            try:
                return self._search(query, terms, query_bigrams(query), context_terms, k, mode, deadline)
            except sqlite3.OperationalError as err:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"memory search passed its deadline: {err}") from err
                raise
            finally:
                self._conn.set_progress_handler(None, 0)

    def titles_named(self, text: str) -> list[str]:
        """The titles of stored passages that `text` names, most specific first (store/titles.py)."""
        with self._lock:
            self._refresh_caches()
            if self._titles is None:
                titles = (title for (title,) in self._conn.execute("SELECT DISTINCT title FROM passages"))
                self._titles = TitleIndex(titles, passages_naming=self._frequency)
            return self._titles.named(text)

    def idf(self, word: str) -> float:
        """Inverse document frequency of `word` in this store (stemmed like the passages)."""
        with self._lock:
            self._refresh_caches()
            return self._idf(self._frequency(word.lower()), self._total())

    @staticmethod
    def _idf(frequency: int, total: int) -> float:
        # BM25's IDF, shifted to stay positive; a word no passage holds gets the largest value.
        return math.log(1.0 + (total - frequency + 0.5) / (frequency + 0.5))

    def _search(
        self,
        query: str,
        terms: list[QueryTerm],
        bigrams: list[str],
        context_terms: list[QueryTerm],
        k: int,
        mode: str,
        deadline: float | None,
    ) -> list[Hit]:
        pool = max(k, CANDIDATE_POOL)
        index = self._vector_index() if mode != "bm25" else None
        if self._total() == 0:
            return []
        if index is None:
            if mode == "dense":
                raise InputError(
                    f"mode='dense' needs vectors, but memory={str(self.path)!r} cannot use any "
                    f"({self._embedder_problem or 'it has none yet'}); "
                    "run reindex(), or search with mode='hybrid' or 'bm25'"
                )
            lexical, query_bm25 = self._lexical(terms, bigrams, context_terms, pool)
            check_deadline(deadline)
            best = lexical[:k]  # BM25 alone
            return self._hits(best, self._scores(terms, context_terms, best), query_bm25, {})

        check_deadline(deadline)
        embedder = self._search_embedder()
        assert embedder is not None  # the vector index is loaded only when there is one
        similarities = index.similarities(embedder.encode([query])[0])
        if mode == "dense":
            best = [int(index.ids[at]) for at in index.best(similarities, k)]
            cosines = {rowid: float(similarities[index.position(rowid)]) for rowid in best}
            return self._hits(best, {rowid: max(0.0, cosines[rowid]) for rowid in best}, {}, cosines)

        lexical, query_bm25 = self._lexical(terms, bigrams, context_terms, pool)
        check_deadline(deadline)
        dense = [int(index.ids[at]) for at in index.best(similarities, pool)]
        fused: dict[int, float] = {}
        for ranking in (lexical, dense):
            for rank, rowid in enumerate(ranking, start=1):
                fused[rowid] = fused.get(rowid, 0.0) + 1.0 / (RRF_K + rank)
        lexical_rank = {rowid: rank for rank, rowid in enumerate(lexical)}
        # Static vectors blur names and symbols ("Li" and "H", "Town4" and "Town0"), so a passage that
        # holds more of the query's names and word pairs ("symbol C") ranks first; fusion orders
        # passages that hold as many.
        names_held = dict.fromkeys(fused, 0)
        for phrase in [term.word for term in terms if term.is_name] + bigrams:
            if self._frequency(phrase):
                for rowid in self._holders(phrase, list(fused)):
                    names_held[rowid] += 1
        order = sorted(fused, key=lambda rowid: (-names_held[rowid], -fused[rowid], lexical_rank.get(rowid, pool)))
        # Vector-only finds must hold a word of the query, so that `score` (and the floor) can judge them.
        best = []
        scores: dict[int, float] = {}
        for start in range(0, len(order), k):
            batch = order[start : start + k]
            batch_scores, holds_query_word = self._coverage(terms, context_terms, batch)
            scores.update(batch_scores)
            best += [rowid for rowid in batch if rowid in lexical_rank or rowid in holds_query_word]
            if len(best) >= k:
                break
        best = best[:k]
        cosines = {rowid: float(similarities[at]) for rowid in best if (at := index.position(rowid)) is not None}
        return self._hits(best, scores, query_bm25, cosines)

    def _bm25(self, match: str, limit: int | None = None) -> list[tuple[int, float]]:
        """(rowid, bm25) of the passages matching the FTS5 expression `match`, best first."""
        return self._conn.execute(
            f"""SELECT rowid, bm25(passages_fts, {TITLE_WEIGHT}, {TEXT_WEIGHT}) AS b FROM passages_fts
                WHERE passages_fts MATCH ? ORDER BY b LIMIT ?""",
            (match, -1 if limit is None else limit),
        ).fetchall()

    def _lexical(
        self, terms: list[QueryTerm], bigrams: list[str], context_terms: list[QueryTerm], pool: int
    ) -> tuple[list[int], dict[int, float]]:
        """The `pool` best passages by BM25 (re-ranked by `context_terms`), and their query BM25."""
        # Adjacent word pairs join the OR-query as phrases: "symbol B" finds boron, not every "B".
        phrases = sorted((p for p in [t.word for t in terms] + bigrams if self._frequency(p)), key=self._frequency)
        if not phrases:
            return [], {}
        anchors: list[str] = []
        postings = 0
        for phrase in phrases:
            if anchors and postings + self._frequency(phrase) > ANCHOR_POSTINGS:
                break
            anchors.append(phrase)
            postings += self._frequency(phrase)
        anchor_match = " OR ".join(map(_fts_phrase, anchors))
        others = phrases[len(anchors) :]
        if not others:  # every phrase is selective enough: plain FTS5 ranking
            anchor_bm25 = dict(self._bm25(anchor_match, pool))
            query_bm25 = dict(anchor_bm25)
        else:
            # BM25 is a sum over phrases, so for a passage that also holds a common phrase, the AND-query
            # gives its full score; the others hold only anchors and their anchor score is the full one.
            anchor_bm25 = dict(self._bm25(anchor_match))
            query_bm25 = dict(anchor_bm25)
            query_bm25.update(self._bm25(f"({anchor_match}) AND ({' OR '.join(map(_fts_phrase, others))})"))
        best = sorted(query_bm25, key=query_bm25.__getitem__)[:pool]
        query_bm25 = {rowid: query_bm25[rowid] for rowid in best}
        context_phrases = [term.word for term in context_terms if self._frequency(term.word)]
        if context_phrases:
            # The context's own BM25 for the pool: (anchors AND context) minus the anchors' part.
            context_match = f"({anchor_match}) AND ({' OR '.join(map(_fts_phrase, context_phrases))})"
            ranking = dict(query_bm25)
            for rowid, both in self._bm25(context_match):
                if rowid in ranking:
                    ranking[rowid] += CONTEXT_WEIGHT * (both - anchor_bm25[rowid])
            best = sorted(best, key=ranking.__getitem__)
        return best, query_bm25

    def _holders(self, phrase: str, rowids: list[int]) -> list[int]:
        """Those of `rowids` whose passage holds `phrase`."""
        if self._frequency(phrase) <= HOLDERS_SCAN_RATIO * len(rowids):
            wanted = set(rowids)
            postings = self._conn.execute(
                "SELECT rowid FROM passages_fts WHERE passages_fts MATCH ?", (_fts_phrase(phrase),)
            )
            return [rowid for (rowid,) in postings if rowid in wanted]
        # FTS5 answers "rowid = ?" by seeking the posting list: cheap for a handful of passages even when
        # the word is in half the store.
        return [
            rowid
            for (rowid,) in self._conn.execute(
                "SELECT rowid FROM passages_fts WHERE passages_fts MATCH ? "
                f"AND rowid IN ({','.join('?' * len(rowids))})",
                (_fts_phrase(phrase), *rowids),
            )
        ]

    def _scores(self, terms: list[QueryTerm], context_terms: list[QueryTerm], rowids: list[int]) -> dict[int, float]:
        """`score` of each passage: the IDF-weighted share of the query's terms it holds."""
        return self._coverage(terms, context_terms, rowids)[0]

    def _coverage(
        self, terms: list[QueryTerm], context_terms: list[QueryTerm], rowids: list[int]
    ) -> tuple[dict[int, float], set[int]]:
        """(`score` of each passage, the passages holding a word of the query itself, not a number)."""
        if not rowids:
            return {}, set()
        total = self._total()
        query_words = {term.word for term in terms if not term.word.isdigit()}
        holds_query_word: set[int] = set()
        writes_names = any(term.is_name for term in terms)
        covered = dict.fromkeys(rowids, 0.0)
        holds_a_word = dict.fromkeys(rowids, False)  # a passage that shares only numbers is not about the query
        whole = 0.0
        for term in terms + context_terms:
            frequency = self._frequency(term.word)
            weight = term.weight * self._idf(frequency, total)
            if writes_names and term.lower_case and not frequency:
                weight *= UNSEEN_WORD_WEIGHT
            whole += weight
            if frequency:
                for rowid in self._holders(term.word, rowids):
                    covered[rowid] += weight
                    holds_a_word[rowid] |= not term.word.isdigit()
                    if term.word in query_words:
                        holds_query_word.add(rowid)
        scores = {
            rowid: min(1.0, covered[rowid] / whole) if holds_a_word[rowid] and whole > 0 else 0.0 for rowid in rowids
        }
        return scores, holds_query_word

    def _hits(
        self, best: list[int], scores: dict[int, float], bm25: dict[int, float], cosines: dict[int, float]
    ) -> list[Hit]:
        if not best:
            return []
        stored = {
            rowid: (text, title, source)
            for rowid, text, title, source in self._conn.execute(
                f"SELECT id, text, title, source FROM passages WHERE id IN ({','.join('?' * len(best))})", best
            )
        }
        return [
            Hit(
                text=stored[rowid][0],
                title=stored[rowid][1],
                source=stored[rowid][2],
                score=scores[rowid],
                bm25=bm25.get(rowid, 0.0),
                cosine=cosines.get(rowid),
            )
            for rowid in best
        ]


class _WriteTransaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error so a failed write leaves nothing half-done;
    upgrades a version-1 store first, and drops the search caches afterwards either way."""

    def __init__(self, store: SQLiteMemory):
        self.store = store

    def __enter__(self) -> None:
        self.store._conn.execute("BEGIN IMMEDIATE")
        try:
            self.store._upgrade_schema()
        except BaseException:
            self.store._conn.execute("ROLLBACK")
            raise

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            self.store._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.store._drop_caches()


def check_mode(mode: str) -> str:
    """`mode` when it is one of SEARCH_MODES (every store offers the same); InputError otherwise."""
    if mode not in SEARCH_MODES:
        raise InputError(f"mode={mode!r} is not a search mode; pass one of {', '.join(SEARCH_MODES)}")
    return mode


def check_deadline(deadline: float | None, store: str = "") -> None:
    """TimeoutError once `deadline` (time.monotonic()) has passed; `store` names it in the message."""
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"memory search{f' of {store!r}' if store else ''} passed its deadline")

"""The embedded memory store: one SQLite file, FTS5 full-text search ranked by BM25.

`search()` ranks passages by FTS5's BM25 and gives each a `score` in [0, 1]: the IDF-weighted share
of the query's words that the passage holds, names (capitalised words) weighing more. Raw BM25 is
unbounded and depends on the corpus; the share is comparable across stores, so one relevance floor
can decide "nothing found". A query about something the store never mentions scores low, because
the unknown name carries the largest IDF of all.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

FORMAT_NAME = "surprisegate-memory"
SCHEMA_VERSION = 1

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
# How many of the query's best BM25 passages `context=` may re-rank.
CANDIDATE_POOL = 50
# BM25 column weights (title, text). Weighting titles up measured slightly worse on factqa_dev.
TITLE_WEIGHT, TEXT_WEIGHT = 1.0, 1.0
MAX_CHUNK_CHARS = 800

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    whose why will with would you your yours yourself yourselves s t d ll m re ve tell please one""".split()
    # Arithmetic operator words: in "What is 2 times 2?" they are operations, not what a passage is about.
    + "plus minus times multiplied divided".split()
)

_WORD = re.compile(r"[^\W_]+")  # FTS5's unicode61 tokenizer splits on everything but letters/digits


@dataclass(frozen=True)
class Hit:
    text: str
    title: str
    source: str
    score: float  # IDF coverage of the query's terms, 0..1; comparable across stores
    bm25: float  # FTS5's raw bm25(): lower (more negative) is better


@dataclass
class IngestReport:
    added: int = 0
    skipped_duplicates: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line_no, message)

    def merge(self, other: IngestReport) -> None:
        self.added += other.added
        self.skipped_duplicates += other.skipped_duplicates
        self.errors.extend(other.errors)


NUMBER_WEIGHT = 0.25


@dataclass(frozen=True)
class QueryTerm:
    word: str  # lower-cased; FTS5 stems it as it stems the passages
    weight: float  # multiplies the term's IDF in `score`
    is_name: bool = False  # capitalised inside a sentence
    lower_case: bool = False  # typed in lower case (so surely not a name)


def _tokens(text: str):
    """Yield (token, looks_like_name, follows_previous_word) for each word of `text`.

    A name is capitalised inside a sentence; `follows_previous_word` is true when only spaces or a
    hyphen separate it from the word before ("Burkina Faso", "Bobo-Dioulasso").
    """
    text = unicodedata.normalize("NFKC", text)
    previous_end = None
    for match in _WORD.finditer(text):
        token = match.group()
        between = "." if previous_end is None else text[previous_end : match.start()]
        previous_end = match.end()
        sentence_start = any(mark in between for mark in ".!?")
        yield token, token[0].isupper() and not sentence_start, between.strip() in ("", "-")


def query_terms(text: str, weight: float = 1.0) -> list[QueryTerm]:
    """Content words of `text`, in order, without duplicates; names weigh NAME_WEIGHT times more."""
    terms: dict[str, QueryTerm] = {}
    for token, looks_like_name, _ in _tokens(text):
        word = token.lower()
        if word in STOPWORDS and not looks_like_name:  # keep "He"/"In" when they are symbols
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
    for token, looks_like_name, follows_previous in _tokens(text):
        word = token.lower()
        if word in STOPWORDS and not looks_like_name:
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
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
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


_SCHEMA = f"""
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
    tokenize='porter unicode61 remove_diacritics 2'
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
INSERT INTO meta(key, value) VALUES ('format', '{FORMAT_NAME}'), ('schema_version', '{SCHEMA_VERSION}');
"""


class SQLiteMemory:
    """A memory store in one SQLite file. Thread-safe; use as a context manager or call `close()`."""

    def __init__(self, path: str | Path, create: bool = False):
        self.path = Path(path)
        if not self.path.exists() and not create:
            raise InputError(
                f"memory={str(path)!r} does not exist; "
                f"build it with: surprisegate memory add --memory {path} FILE.jsonl"
            )
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
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
                self._conn.executescript(f"BEGIN; {_SCHEMA} COMMIT;")
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

    # -- ingest ----------------------------------------------------------------------------------

    def add_passages(self, passages: Iterable[Mapping[str, str]]) -> IngestReport:
        """Add passages ({"text", "title", "source"}) in one transaction; duplicates by text are skipped."""
        report = IngestReport()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for passage in passages:
                    text = passage.get("text")
                    if not isinstance(text, str) or not text.strip():
                        raise InputError(
                            f"passage={str(passage)[:80]!r} has no text; give every passage a non-empty 'text'"
                        )
                    cursor = self._conn.execute(
                        "INSERT OR IGNORE INTO passages(source, title, text, content_hash) VALUES (?, ?, ?, ?)",
                        (str(passage.get("source") or ""), passage.get("title") or "", text, _content_hash(text)),
                    )
                    if cursor.rowcount:
                        report.added += 1
                    else:
                        report.skipped_duplicates += 1
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")  # a failed ingest leaves nothing half-written
                raise
        return report

    def add_jsonl(
        self, path: str | Path, text_field: str = "text", id_field: str = "kb_id", title_field: str = "title"
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

    def add_text_files(self, paths: Iterable[str | Path]) -> IngestReport:
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

    # -- search ----------------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, context: str = "", deadline: float | None = None) -> list[Hit]:
        """The `k` best passages for `query`, best first by BM25.

        `context` is extra text (e.g. the claim being checked, which may be wrong): it re-ranks the
        passages `query` finds and counts CONTEXT_WEIGHT as much as `query` in ranking and `score`.
        With `deadline` (a `time.monotonic()` value) a search still running then raises TimeoutError.
        """
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        known = {term.word for term in terms}
        context_terms = [term for term in query_terms(context, CONTEXT_WEIGHT) if term.word not in known]
        with self._lock:
            if deadline is not None:
                self._conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
            try:
                return self._search(terms, query_bigrams(query), context_terms, k)
            except sqlite3.OperationalError as err:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"memory search passed its deadline: {err}") from err
                raise
            finally:
                self._conn.set_progress_handler(None, 0)

    def idf(self, word: str) -> float:
        """Inverse document frequency of `word` in this store (stemmed like the passages)."""
        with self._lock:
            return self._idf(len(self._passages_with(word.lower())), self._total())

    def _total(self) -> int:
        return self._conn.execute("SELECT count(*) FROM passages").fetchone()[0]

    def _passages_with(self, word: str) -> set[int]:
        # The whole posting list: at memory-store sizes this is faster than filtering by rowid in SQL,
        # and its length is the document frequency (counted after the same stemming as the passages).
        rows = self._conn.execute("SELECT rowid FROM passages_fts WHERE passages_fts MATCH ?", (_fts_phrase(word),))
        return {rowid for (rowid,) in rows}

    @staticmethod
    def _idf(frequency: int, total: int) -> float:
        # BM25's IDF, shifted to stay positive; a word no passage holds gets the largest value.
        return math.log(1.0 + (total - frequency + 0.5) / (frequency + 0.5))

    def _bm25(self, phrases: list[str], limit: int | None = None) -> list[tuple[int, float]]:
        """(rowid, bm25) of the passages matching any of `phrases`, best first."""
        match = " OR ".join(_fts_phrase(phrase) for phrase in phrases)
        return self._conn.execute(
            f"""SELECT rowid, bm25(passages_fts, {TITLE_WEIGHT}, {TEXT_WEIGHT}) AS b FROM passages_fts
                WHERE passages_fts MATCH ? ORDER BY b LIMIT ?""",
            (match, -1 if limit is None else limit),
        ).fetchall()

    def _search(self, terms: list[QueryTerm], bigrams: list[str], context_terms: list[QueryTerm], k: int) -> list[Hit]:
        total = self._total()
        # Adjacent word pairs join the OR-query as phrases: "symbol B" finds boron, not every "B".
        query_bm25 = dict(self._bm25([term.word for term in terms] + bigrams, max(k, CANDIDATE_POOL)))
        if not query_bm25:
            return []
        rowids = list(query_bm25)
        ranking = dict(query_bm25)
        if context_terms:
            # Scoring every passage that matches is faster than filtering by rowid at these sizes.
            for rowid, bm25 in self._bm25([term.word for term in context_terms]):
                if rowid in ranking:
                    ranking[rowid] += CONTEXT_WEIGHT * bm25
        # score: the IDF-weighted share of the query's terms each passage holds.
        writes_names = any(term.is_name for term in terms)
        covered = dict.fromkeys(rowids, 0.0)
        holds_a_word = dict.fromkeys(rowids, False)  # a passage that shares only numbers is not about the query
        whole = 0.0
        for term in terms + context_terms:
            holders = self._passages_with(term.word)
            weight = term.weight * self._idf(len(holders), total)
            if writes_names and term.lower_case and not holders:
                weight *= UNSEEN_WORD_WEIGHT
            whole += weight
            for rowid in holders.intersection(rowids):
                covered[rowid] += weight
                holds_a_word[rowid] |= not term.word.isdigit()
        best = sorted(rowids, key=ranking.__getitem__)[:k]
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
                score=min(1.0, covered[rowid] / whole) if holds_a_word[rowid] else 0.0,
                bm25=query_bm25[rowid],
            )
            for rowid in best
        ]

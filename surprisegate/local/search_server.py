"""A local search server that speaks SearxNG's JSON API, over a BM25 index of a JSONL corpus.

It lets the web arm (and its tests and benchmarks) run against a real HTTP endpoint on loopback
with no internet: `GET /search?q=...&format=json` answers in SearxNG's shape (see
shared/wire/searxng_search.json), any other format gets 403 as a SearxNG with JSON switched off
does, and `/healthz` answers "OK". Each corpus line is `{"doc_id", "text", "title"?, "url"?}`; a
document without a url gets `https://corpus.local/<doc_id>`, so the doc id is recoverable.

    surprisegate websearch-serve --corpus web_corpus.jsonl --port 8888
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ..errors import InputError
from ..text import STOPWORDS, WORD, light_stem

CORPUS_URL_PREFIX = "https://corpus.local/"
ENGINE_NAME = "local-bm25"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8888  # SearxNG's usual port, and the web arm's default SURPRISEGATE_SEARXNG_URL
PAGE_SIZE = 10  # SearxNG serves 10 results a page; `pageno` pages on
MAX_QUERY_CHARS = 2000
# Content is the whole document up to this many characters: the arm picks sentences from it.
MAX_CONTENT_CHARS = 2000
BM25_K1, BM25_B = 1.2, 0.75


def doc_url(doc_id: str) -> str:
    return CORPUS_URL_PREFIX + quote(doc_id, safe="")


def doc_id_from_url(url: str) -> str | None:
    """The doc id behind a `doc_url()`, or None for any other url."""
    if not url.startswith(CORPUS_URL_PREFIX):
        return None
    return unquote(url[len(CORPUS_URL_PREFIX) :])


def index_terms(text: str) -> list[str]:
    """The words BM25 counts, documents and queries alike: light stems of the non-function words."""
    return [light_stem(word) for word in WORD.findall(text) if word.lower() not in STOPWORDS]


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str
    url: str


def load_corpus(corpus: str | Path | Iterable[Mapping]) -> list[Document]:
    """Documents from a JSONL path or from dicts. Raises InputError naming the bad line."""
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        if not path.is_file():
            raise InputError(f"corpus={str(path)!r} is not a file; pass a JSONL file with doc_id and text fields")
        rows: list[tuple[int, Mapping]] = []
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((line_no, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise InputError(
                        f"{path}:{line_no}: not JSON ({err.msg}); each line must be one JSON object"
                    ) from err
    else:
        rows = list(enumerate(corpus, 1))
    documents: list[Document] = []
    seen: set[str] = set()
    for line_no, row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("text"), str) or not str(row.get("doc_id") or ""):
            raise InputError(f"corpus line {line_no}: needs a non-empty 'doc_id' and a string 'text'")
        doc_id = str(row["doc_id"])
        if doc_id in seen:
            raise InputError(f"corpus line {line_no}: doc_id={doc_id!r} appears twice; doc ids must be unique")
        seen.add(doc_id)
        documents.append(
            Document(doc_id, row["text"], str(row.get("title") or ""), str(row.get("url") or doc_url(doc_id)))
        )
    if not documents:
        raise InputError("the corpus is empty; pass a JSONL file with at least one {doc_id, text} line")
    return documents


class BM25Index:
    """Okapi BM25 over title + text, held in memory; read-only once built, so threads may share it."""

    def __init__(self, documents: list[Document]):
        self.documents = documents
        self._term_counts = [Counter(index_terms(f"{doc.title} {doc.text}")) for doc in documents]
        self._lengths = [sum(counts.values()) for counts in self._term_counts]
        self._average_length = (sum(self._lengths) / len(self._lengths)) or 1.0
        document_frequency: Counter = Counter()
        for counts in self._term_counts:
            document_frequency.update(counts.keys())
        count = len(documents)
        self._idf = {term: math.log(1 + (count - df + 0.5) / (df + 0.5)) for term, df in document_frequency.items()}
        self._postings: dict[str, list[int]] = {}
        for position, counts in enumerate(self._term_counts):
            for term in counts:
                self._postings.setdefault(term, []).append(position)

    def search(self, query: str) -> list[tuple[Document, float]]:
        """Every document sharing a term with the query, best first (ties: corpus order)."""
        scores: dict[int, float] = {}
        for term in set(index_terms(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for position in self._postings[term]:
                frequency = self._term_counts[position][term]
                norm = BM25_K1 * (1 - BM25_B + BM25_B * self._lengths[position] / self._average_length)
                scores[position] = scores.get(position, 0.0) + idf * frequency * (BM25_K1 + 1) / (frequency + norm)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return [(self.documents[position], score) for position, score in ranked]


def searxng_response(query: str, hits: list[tuple[Document, float]], pageno: int = 1) -> dict:
    """One page of hits in SearxNG's JSON shape (searx/webutils.py get_json_response)."""
    page = hits[(pageno - 1) * PAGE_SIZE : pageno * PAGE_SIZE]
    results = []
    for position, (doc, score) in enumerate(page, (pageno - 1) * PAGE_SIZE + 1):
        parts = urlsplit(doc.url)
        results.append(
            {
                "url": doc.url,
                "title": doc.title or _title_from_text(doc.text),
                "content": doc.text[:MAX_CONTENT_CHARS],
                "engine": ENGINE_NAME,
                "template": "default.html",
                # SearxNG sends urlparse()'s 6 parts: scheme, netloc, path, params, query, fragment.
                "parsed_url": [parts.scheme, parts.netloc, parts.path, "", parts.query, parts.fragment],
                "img_src": "",
                "thumbnail": "",
                "priority": "",
                "engines": [ENGINE_NAME],
                "positions": [position],
                "score": round(score, 6),
                "category": "general",
                "publishedDate": None,
            }
        )
    return {
        "query": query,
        "number_of_results": len(hits),  # dropped by SearxNG in 2026-05; older instances send it
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }


def _title_from_text(text: str, words: int = 8) -> str:
    head = text.split()
    return " ".join(head[:words]) + (" ..." if len(head) > words else "")


class _SearchHandler(BaseHTTPRequestHandler):
    server: LocalSearchServer
    server_version = "surprisegate-websearch/1"

    def do_GET(self) -> None:
        path, _, query_string = self.path.partition("?")
        self._route(path, parse_qs(query_string, keep_blank_values=True))

    # SearxNG also takes the form as a POST body.
    def do_POST(self) -> None:
        path, _, query_string = self.path.partition("?")
        length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
        form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"), keep_blank_values=True)
        for key, values in parse_qs(query_string, keep_blank_values=True).items():
            form.setdefault(key, values)
        self._route(path, form)

    def _route(self, path: str, params: dict[str, list[str]]) -> None:
        self.server.count_request()
        if path == "/healthz":
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif path == "/search":
            self._search(params)
        else:
            self._send(404, b"Not Found", "text/plain; charset=utf-8")

    def _search(self, params: dict[str, list[str]]) -> None:
        if params.get("format", [""])[0] != "json":
            # What SearxNG does for a format missing from settings.yml `search.formats`.
            self._send(403, b"<h1>403 Forbidden</h1>", "text/html; charset=utf-8")
            return
        query = params.get("q", [""])[0].strip()[:MAX_QUERY_CHARS]
        if not query:
            self._send_json(400, {"error": "search error: the q parameter is empty"})
            return
        try:
            pageno = max(1, int(params.get("pageno", ["1"])[0]))
        except ValueError:
            self._send_json(400, {"error": "search error: pageno must be a whole number"})
            return
        self._send_json(200, searxng_response(query, self.server.index.search(query), pageno))

    def _send_json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload, ensure_ascii=False).encode("utf-8"), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


class LocalSearchServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client connection must not keep the process alive

    def __init__(self, index: BM25Index, host: str, port: int, quiet: bool = True):
        super().__init__((host, port), _SearchHandler)
        self.index = index
        self.quiet = quiet
        self.requests_served = 0
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def count_request(self) -> None:
        with self._count_lock:
            self.requests_served += 1

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):  # typeshed allows bytes (AF_UNIX); an HTTP server's host is a str
            host = host.decode()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def start(self) -> LocalSearchServer:
        # A short poll interval so close() (shutdown) returns promptly in tests.
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="surprisegate-websearch"
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()

    def __enter__(self) -> LocalSearchServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(
    corpus: str | Path | Iterable[Mapping], host: str = DEFAULT_HOST, port: int = 0, quiet: bool = True
) -> LocalSearchServer:
    """Index `corpus` and serve it from a background thread; port 0 picks a free one (see `.url`).

    Call `.close()` (or use it as a context manager) to stop it.
    """
    index = BM25Index(load_corpus(corpus))
    return LocalSearchServer(index, host, port, quiet=quiet).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="surprisegate websearch-serve", description="Serve a JSONL corpus over SearxNG's JSON search API."
    )
    parser.add_argument("--corpus", required=True, help="JSONL file: doc_id, text, optional title and url")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    args = parser.parse_args(argv)
    try:
        index = BM25Index(load_corpus(args.corpus))
        server = LocalSearchServer(index, args.host, args.port, quiet=args.quiet)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(
            f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err}; pick another --port",
            file=sys.stderr,
        )
        return 2
    print(
        f"serving {len(index.documents)} documents at {server.url}/search?q=...&format=json",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

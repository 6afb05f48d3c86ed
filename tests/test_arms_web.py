"""The web arm: deadlines (hung resolver, hung server, slow server), wire replays, error messages, cache.

Every server here is a loopback fake: real sockets on 127.0.0.1, a bounded number of requests.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.arms import Arm, Query, web
from surprisegate.arms.web import (
    BraveSearch,
    SearxngSearch,
    TavilySearch,
    WebArm,
    WebBadResponse,
    WebForbidden,
    WebKeyError,
    WebRateLimited,
    WebTimeout,
    WebUnavailable,
    WikipediaSearch,
    http_request,
    make_provider,
    search_text,
    strip_html,
)
from surprisegate.errors import ArmError, ConfigError
from surprisegate.gate.grounding import ground_round

WIRE = Path(__file__).resolve().parents[2] / "shared" / "wire"
needs_wire = pytest.mark.skipif(not WIRE.is_dir(), reason="shared/wire is not present")

PARIS = Query(span="Lyon", question="What is the capital of France?", sentence="The capital of France is Lyon")
DEADLINE_S = 0.3  # budget given to ground() in the deadline tests
OVERSHOOT_S = 0.1  # ground() must return or raise within deadline + this


# --------------------------------------------------------------------------------------------
# loopback fakes
# --------------------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


class FakeServer:
    """An HTTP server on 127.0.0.1 answering each path with a fixed Reply and recording every request."""

    def __init__(self, routes: dict[str, Reply]):
        self.routes = routes
        self.seen: list[Seen] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer()

            def do_POST(self):
                self._answer()

            def _answer(self):
                parts = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.seen.append(
                    Seen(
                        self.command,
                        parts.path,
                        parse_qs(parts.query),
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
                reply = fake.routes.get(parts.path, Reply(404, b'{"error": "no such path"}'))
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(reply.body)))
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client gave up (deadline tests)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    servers: list[FakeServer] = []

    def start(routes: dict[str, Reply]) -> FakeServer:
        servers.append(FakeServer(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def silent_server():
    """Accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set() and len(held) < 8:
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=1)
    for connection in held:
        connection.close()
    listener.close()


def wire(name: str) -> bytes:
    return (WIRE / name).read_bytes()


def wire_part(name: str, key: str) -> bytes:
    # The error files hold several bodies side by side; each is served as one response.
    return json.dumps(json.loads(wire(name))[key], indent=2).encode()


def ground_timed(arm: WebArm, query: Query = PARIS, budget_s: float = DEADLINE_S):
    """(evidence or exception, seconds past the deadline when ground() came back)."""
    deadline = time.monotonic() + budget_s
    try:
        outcome = arm.ground(query, deadline)
    except ArmError as err:
        outcome = err
    return outcome, time.monotonic() - deadline


# --------------------------------------------------------------------------------------------
# deadlines
# --------------------------------------------------------------------------------------------
def test_hung_resolver_cannot_stall_the_round(monkeypatch):
    release = threading.Event()
    calls = []

    def hung_resolver(host, port):
        calls.append(host)
        release.wait(30)  # a resolver that never answers; released at teardown
        raise socket.gaierror("released")

    monkeypatch.setattr(web, "resolve_address", hung_resolver)
    try:
        outcome, overshoot = ground_timed(WebArm(SearxngSearch(base_url="http://search.invalid:8888", env={})))
    finally:
        release.set()
    assert calls == ["search.invalid"]
    assert isinstance(outcome, WebTimeout) and isinstance(outcome, TimeoutError)
    assert "resolving search.invalid" in str(outcome)
    assert overshoot < OVERSHOOT_S, f"returned {overshoot * 1000:.0f} ms after the deadline"


def test_hung_server_cannot_stall_the_round(silent_server):
    outcome, overshoot = ground_timed(WebArm(SearxngSearch(base_url=silent_server, env={})))
    assert isinstance(outcome, WebTimeout)
    assert "waiting for the response" in str(outcome)
    assert overshoot < OVERSHOOT_S, f"returned {overshoot * 1000:.0f} ms after the deadline"


def test_hung_tls_handshake_cannot_stall_the_round(silent_server):
    https_url = silent_server.replace("http://", "https://")
    outcome, overshoot = ground_timed(WebArm(SearxngSearch(base_url=https_url, env={})))
    assert isinstance(outcome, WebTimeout) and "TLS handshake with 127.0.0.1" in str(outcome)
    assert overshoot < OVERSHOOT_S, f"returned {overshoot * 1000:.0f} ms after the deadline"


def test_slow_server_cannot_stall_the_round(fake_server):
    server = fake_server(
        {"/search": Reply(200, wire("searxng_search.json") if WIRE.is_dir() else b"{}", delay_s=DEADLINE_S + 1.0)}
    )
    outcome, overshoot = ground_timed(WebArm(SearxngSearch(base_url=server.url, env={})))
    assert isinstance(outcome, WebTimeout)
    assert overshoot < OVERSHOOT_S, f"returned {overshoot * 1000:.0f} ms after the deadline"
    assert len(server.seen) == 1


def test_deadline_already_passed_makes_no_request(fake_server):
    server = fake_server({})
    with pytest.raises(WebTimeout, match="deadline passed before"):
        http_request("GET", f"{server.url}/x", deadline=time.monotonic() - 1)
    assert server.seen == []


def test_controller_round_ends_on_time_with_a_hung_resolver(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(web, "resolve_address", lambda host, port: release.wait(30))
    deadline = time.monotonic() + DEADLINE_S
    try:
        chosen, reports = ground_round(
            {"web": WebArm(SearxngSearch(base_url="http://x.invalid", env={}))}, ["web"], PARIS, deadline
        )
    finally:
        release.set()
    assert chosen is None
    assert reports[0].status in ("timeout", "error")
    assert time.monotonic() - deadline < OVERSHOOT_S


def test_refused_connection_is_unavailable():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome, _ = ground_timed(WebArm(SearxngSearch(base_url=f"http://127.0.0.1:{port}", env={})), budget_s=2.0)
    assert isinstance(outcome, WebUnavailable)
    assert "connection refused" in str(outcome)


def test_wikipedia_slow_summaries_fall_back_to_snippets(fake_server):
    if not WIRE.is_dir():
        pytest.skip("shared/wire is not present")
    server = fake_server(
        {
            "/w/api.php": Reply(200, wire("wikipedia_action_search.json")),
            "/api/rest_v1/page/summary/Paris": Reply(200, wire("wikipedia_rest_summary.json"), delay_s=2.0),
        }
    )
    outcome, overshoot = ground_timed(WebArm(WikipediaSearch(base_url=server.url, env={}), floor=0.0), budget_s=0.5)
    assert overshoot < 0  # summaries may use 80% of what is left: the snippets go back before the deadline
    assert outcome and outcome[0].evidence.startswith("Paris is the capital and largest city of France")


# --------------------------------------------------------------------------------------------
# wire replays: requests as the APIs expect, responses parsed into evidence
# --------------------------------------------------------------------------------------------
@needs_wire
def test_searxng_replay(fake_server):
    server = fake_server({"/search": Reply(200, wire("searxng_search.json"))})
    evidence = WebArm(SearxngSearch(base_url=server.url, env={})).ground(PARIS, time.monotonic() + 5)
    seen = server.seen[0]
    assert (seen.method, seen.path) == ("GET", "/search")
    assert seen.params == {"q": ["What is the capital of France?"], "format": ["json"]}
    assert seen.headers["accept"] == "application/json"
    best = evidence[0]
    assert best.source == "web:searxng:https://en.wikipedia.org/wiki/Paris"
    assert best.evidence.startswith("Paris is the capital and largest city of France.")
    assert best.observable == 0.0 and 0.0 < best.confidence <= 1.0
    assert {e.source for e in evidence} == {
        "web:searxng:https://en.wikipedia.org/wiki/Paris",
        "web:searxng:https://www.britannica.com/place/Paris",
    }


@needs_wire
def test_brave_replay(fake_server):
    server = fake_server({"/res/v1/web/search": Reply(200, wire("brave_web_search.json"))})
    provider = BraveSearch(api_key="BSA-test", base_url=f"{server.url}/res/v1/web/search", env={})
    evidence = WebArm(provider).ground(PARIS, time.monotonic() + 5)
    seen = server.seen[0]
    assert seen.headers["x-subscription-token"] == "BSA-test"
    assert seen.headers["accept"] == "application/json"
    assert seen.params["q"] == ["What is the capital of France?"] and int(seen.params["count"][0]) >= 3
    assert evidence[0].source == "web:brave:https://en.wikipedia.org/wiki/Paris"
    assert "<strong>" not in evidence[0].evidence
    assert evidence[0].evidence.startswith("Paris is the capital and largest city of France.")


@needs_wire
def test_brave_gzip_answer(fake_server):
    body = gzip.compress(wire("brave_web_search.json"))
    server = fake_server({"/s": Reply(200, body, headers=(("Content-Encoding", "gzip"),))})
    results = BraveSearch(api_key="k", base_url=f"{server.url}/s", env={}).search(
        "capital of france", 3, time.monotonic() + 5
    )
    assert [r.url for r in results] == ["https://en.wikipedia.org/wiki/Paris", "https://www.britannica.com/place/Paris"]
    assert server.seen[0].headers["accept-encoding"] == "gzip"


@needs_wire
def test_tavily_replay(fake_server):
    server = fake_server({"/search": Reply(200, wire("tavily_search.json"))})
    provider = TavilySearch(api_key="tvly-test", base_url=f"{server.url}/search", env={})
    evidence = WebArm(provider).ground(PARIS, time.monotonic() + 5)
    seen = server.seen[0]
    assert seen.method == "POST" and seen.headers["authorization"] == "Bearer tvly-test"
    assert seen.headers["content-type"] == "application/json"
    sent = json.loads(seen.body)
    assert set(sent) == set(json.loads(wire("tavily_request.json")))
    assert sent["query"] == "What is the capital of France?" and sent["search_depth"] == "basic"
    assert evidence[0].source == "web:tavily:https://en.wikipedia.org/wiki/Paris"
    assert evidence[0].detail["provider_score"] == pytest.approx(0.91834)


@needs_wire
def test_wikipedia_action_replay_with_summaries(fake_server):
    server = fake_server(
        {
            "/w/api.php": Reply(200, wire("wikipedia_action_search.json")),
            "/api/rest_v1/page/summary/Paris": Reply(200, wire("wikipedia_rest_summary.json")),
            # No route for List_of_capitals_of_France: its 404 keeps the search snippet.
        }
    )
    evidence = WebArm(WikipediaSearch(base_url=server.url, env={}), floor=0.0).ground(PARIS, time.monotonic() + 5)
    search = next(s for s in server.seen if s.path == "/w/api.php")
    assert search.params["action"] == ["query"] and search.params["list"] == ["search"]
    assert search.params["format"] == ["json"] and search.params["formatversion"] == ["2"]
    assert search.params["srsearch"] == ["capital france"]  # keywords: the API ANDs every word
    assert "surprisegate" in search.headers["user-agent"]
    assert {s.path for s in server.seen} >= {
        "/api/rest_v1/page/summary/Paris",
        "/api/rest_v1/page/summary/List_of_capitals_of_France",
    }
    by_source = {e.source: e for e in evidence}
    assert (
        by_source["web:wikipedia:https://en.wikipedia.org/wiki/Paris"].evidence
        == "Paris is the capital and largest city of France."
    )
    capitals = by_source[f"web:wikipedia:{server.url}/wiki/List_of_capitals_of_France"]
    assert capitals.evidence == "This is a chronological list of capitals of France."  # snippet, tags stripped


@needs_wire
def test_wikipedia_rest_replay(fake_server):
    server = fake_server({"/w/rest.php/v1/search/page": Reply(200, wire("wikipedia_rest_search.json"))})
    provider = WikipediaSearch(base_url=server.url, api="rest", summaries=False, env={})
    evidence = WebArm(provider, floor=0.0).ground(PARIS, time.monotonic() + 5)
    assert server.seen[0].params["q"] == ["capital france"] and len(server.seen) == 1
    assert evidence[0].source == f"web:wikipedia:{server.url}/wiki/Paris"
    assert "searchmatch" not in evidence[0].evidence and "Paris is the capital" in evidence[0].evidence


def test_wikipedia_retries_with_names_when_keywords_find_nothing(fake_server):
    empty = json.dumps({"batchcomplete": True, "query": {"searchinfo": {"totalhits": 0}, "search": []}}).encode()
    server = fake_server({"/w/api.php": Reply(200, empty)})
    query = Query(
        span="", question="Which magazine was started first, Arthur's Magazine or First for Women?", sentence=""
    )
    assert (
        WebArm(WikipediaSearch(base_url=server.url, summaries=False, env={})).ground(query, time.monotonic() + 5) == []
    )
    assert len(server.seen) == 2
    keywords, names = (seen.params["srsearch"][0].split() for seen in server.seen)
    assert "started" in keywords and "which" not in keywords
    assert set(names) == {"magazine", "first", "arthur", "women"}  # the capitalised words only


# --------------------------------------------------------------------------------------------
# error bodies -> clear messages
# --------------------------------------------------------------------------------------------
def brave_arm(server) -> WebArm:
    return WebArm(BraveSearch(api_key="BSA-bad", base_url=f"{server.url}/s", env={}))


@needs_wire
def test_brave_invalid_token(fake_server):
    server = fake_server({"/s": Reply(422, wire_part("brave_errors.json", "invalid_token_422"))})
    outcome, _ = ground_timed(brave_arm(server), budget_s=5)
    assert isinstance(outcome, WebKeyError) and outcome.kind == "auth"
    assert str(outcome) == "brave: 422 SUBSCRIPTION_TOKEN_INVALID — set BRAVE_API_KEY to a valid key"


@needs_wire
def test_brave_rate_and_quota_limits(fake_server):
    limited = json.loads(wire("brave_errors.json"))["rate_limited_429"]
    quota = json.loads(json.dumps(limited))
    quota["error"]["code"] = "QUOTA_LIMITED"  # same envelope, other code (no separate sample in shared/wire)
    server = fake_server(
        {
            "/s": Reply(429, wire_part("brave_errors.json", "rate_limited_429")),
            "/q": Reply(429, json.dumps(quota).encode()),
        }
    )
    outcome, _ = ground_timed(brave_arm(server), budget_s=5)
    assert isinstance(outcome, WebRateLimited)
    assert str(outcome) == "brave: 429 RATE_LIMITED (plan Free: 1 request/s) — slow down or upgrade the plan"
    with pytest.raises(WebRateLimited, match="QUOTA_LIMITED — the plan's monthly quota is used up"):
        BraveSearch(api_key="k", base_url=f"{server.url}/q", env={}).search("x", 3, time.monotonic() + 5)


@needs_wire
def test_brave_validation_error(fake_server):
    server = fake_server({"/s": Reply(422, wire_part("brave_errors.json", "validation_422"))})
    outcome, _ = ground_timed(brave_arm(server), budget_s=5)
    assert isinstance(outcome, WebBadResponse)
    assert "422 VALIDATION query.count: Input should be greater than or equal to 1" in str(outcome)


def test_brave_missing_key_names_the_env_var_and_sends_nothing(fake_server):
    server = fake_server({})
    arm = WebArm(BraveSearch(base_url=f"{server.url}/s", env={}))
    assert "BRAVE_API_KEY" in arm.problem()
    with pytest.raises(WebKeyError, match="brave: no API key — set BRAVE_API_KEY"):
        arm.ground(PARIS, time.monotonic() + 5)
    assert server.seen == []


def test_keys_and_urls_come_from_env(fake_server):
    server = fake_server({"/b": Reply(200, b'{"type": "search"}')})
    provider = BraveSearch(env={"BRAVE_API_KEY": "from-env", "SURPRISEGATE_BRAVE_URL": f"{server.url}/b/"})
    assert provider.problem() is None
    assert provider.search("q", 3, time.monotonic() + 5) == []  # no "web" section: no results
    assert server.seen[0].headers["x-subscription-token"] == "from-env"
    assert SearxngSearch(env={"SURPRISEGATE_SEARXNG_URL": "http://h:1/searx/"}).search_url == "http://h:1/searx/search"
    assert SearxngSearch(env={}).search_url == "http://127.0.0.1:8888/search"
    assert TavilySearch(env={"TAVILY_API_KEY": "tvly-x"}).problem() is None
    assert (
        WikipediaSearch(env={"SURPRISEGATE_WIKIPEDIA_URL": "https://de.wikipedia.org/"}).base_url
        == "https://de.wikipedia.org"
    )
    assert "surprisegate" in SearxngSearch(env={}).user_agent
    assert SearxngSearch(env={"SURPRISEGATE_USER_AGENT": "me@example.org"}).user_agent == "me@example.org"


@needs_wire
def test_tavily_unauthorized(fake_server):
    server = fake_server({"/search": Reply(401, wire_part("tavily_errors.json", "unauthorized_401"))})
    outcome, _ = ground_timed(
        WebArm(TavilySearch(api_key="tvly-bad", base_url=f"{server.url}/search", env={})), budget_s=5
    )
    assert isinstance(outcome, WebKeyError)
    assert str(outcome) == "tavily: 401 Unauthorized: missing or invalid API key. — set TAVILY_API_KEY to a valid key"


@needs_wire
def test_tavily_bad_request_and_usage_limit(fake_server):
    server = fake_server(
        {
            "/bad": Reply(400, wire_part("tavily_errors.json", "bad_request_400_INFERRED")),
            "/limit": Reply(432, b'{"detail": {"error": "This request exceeds your plan\'s set usage limit."}}'),
        }
    )
    with pytest.raises(WebBadResponse, match="tavily: 400 Invalid request: query is required."):
        TavilySearch(api_key="k", base_url=f"{server.url}/bad", env={}).search("x", 3, time.monotonic() + 5)
    with pytest.raises(WebRateLimited, match="tavily: 432 usage limit reached: This request exceeds"):
        TavilySearch(api_key="k", base_url=f"{server.url}/limit", env={}).search("x", 3, time.monotonic() + 5)


def test_tavily_missing_key():
    with pytest.raises(WebKeyError, match="set TAVILY_API_KEY"):
        WebArm(TavilySearch(env={})).ground(PARIS, time.monotonic() + 5)


def test_searxng_json_disabled(fake_server):
    server = fake_server({"/search": Reply(403, b"<h1>403 Forbidden</h1>", content_type="text/html")})
    outcome, _ = ground_timed(WebArm(SearxngSearch(base_url=server.url, env={})), budget_s=5)
    assert isinstance(outcome, WebForbidden) and outcome.http_status == 403
    assert "JSON output is off" in str(outcome) and "search.formats" in str(outcome)
    assert "SURPRISEGATE_SEARXNG_URL" in str(outcome)


def test_searxng_rate_limit_query_error_and_not_json(fake_server):
    server = fake_server(
        {
            "/a/search": Reply(429, b"Too Many Requests", content_type="text/plain", headers=(("Retry-After", "7"),)),
            "/b/search": Reply(200, b'{"error": "search error"}'),
            "/c/search": Reply(200, b"<html>hello</html>", content_type="text/html"),
            "/d/search": Reply(502, b"Bad Gateway", content_type="text/plain"),
        }
    )

    def search(path):
        return SearxngSearch(base_url=f"{server.url}{path}", env={}).search("q", 3, time.monotonic() + 5)

    with pytest.raises(WebRateLimited, match="searxng: 429 rate limited Too Many Requests — wait 7 s and retry"):
        search("/a")
    with pytest.raises(WebBadResponse, match="searxng: search error"):
        search("/b")
    with pytest.raises(WebBadResponse, match="not JSON"):
        search("/c")
    with pytest.raises(WebUnavailable, match="searxng: 502 server error"):
        search("/d")


def test_error_status_lands_in_the_controller_report():
    arm = WebArm(BraveSearch(env={}))
    chosen, reports = ground_round({"web": arm}, ["web"], PARIS, time.monotonic() + 2)
    assert chosen is None and reports[0].status == "error"
    assert "set BRAVE_API_KEY" in reports[0].error


# --------------------------------------------------------------------------------------------
# cache, query building, evidence
# --------------------------------------------------------------------------------------------
SEARX_BODY = json.dumps(
    {
        "query": "q",
        "results": [
            {
                "url": "https://corpus.local/paris",
                "title": "Paris",
                "score": 2.0,
                "content": (
                    "Paris has many museums. Paris is the capital and largest city of France. The Seine flows "
                    "through it."
                ),
            },
            {
                "url": "https://corpus.local/lyon",
                "title": "Lyon",
                "score": 1.0,
                "content": "Lyon is the third-largest city of France. It is known for its cuisine.",
            },
            {"url": "https://corpus.local/cake", "title": "Cake", "score": 0.5, "content": "A cake is a sweet food."},
        ],
    }
).encode()


def test_cache_hit_on_identical_query(fake_server):
    server = fake_server({"/search": Reply(200, SEARX_BODY)})
    arm = WebArm(SearxngSearch(base_url=server.url, env={}))
    first = arm.ground(PARIS, time.monotonic() + 5)
    again = arm.ground(PARIS, time.monotonic() + 5)
    assert first == again and len(server.seen) == 1
    arm.ground(Query(span="", question="Where is Lyon?", sentence=""), time.monotonic() + 5)
    assert len(server.seen) == 2
    uncached = WebArm(SearxngSearch(base_url=server.url, env={}), cache=False)
    uncached.ground(PARIS, time.monotonic() + 5)
    uncached.ground(PARIS, time.monotonic() + 5)
    assert len(server.seen) == 4


def test_the_cache_drops_the_least_recently_used_search(fake_server):
    server = fake_server({"/search": Reply(200, SEARX_BODY)})
    arm = WebArm(SearxngSearch(base_url=server.url, env={}), cache_size=2)

    def ask(question: str) -> None:
        arm.ground(Query(span="", question=question, sentence=""), time.monotonic() + 5)

    for question in ("Where is Paris?", "Where is Lyon?", "Where is Paris?"):  # Paris is now the most recent
        ask(question)
    assert len(server.seen) == 2
    ask("Where is Nice?")  # a third search: Lyon, used least recently, is dropped
    ask("Where is Paris?")
    assert len(server.seen) == 3
    ask("Where is Lyon?")
    assert len(server.seen) == 4


def test_the_default_cache_is_bounded():
    assert WebArm("searxng", base_url="http://127.0.0.1:1", env={}).cache_size == web.CACHE_SIZE == 256


class _CountingProvider(web.SearchProvider):
    name = "counting"

    def __init__(self):
        super().__init__(env={})
        self.searched: list[str] = []

    def search(self, text, count, deadline):
        self.searched.append(text)
        return [web.SearchResult("", text, text, 0)]


@given(st.lists(st.sampled_from("abcdef"), max_size=40), st.integers(1, 4))
def test_the_cache_is_a_bounded_lru(searches, size):
    # Against a plain model of an LRU: the searches it misses are the ones the provider sees.
    provider = _CountingProvider()
    arm = WebArm(provider, cache_size=size)
    recent: list[str] = []  # least recently used first
    missed = []
    for text in searches:
        assert arm._search(text, float("inf"))[0].text == text
        if text in recent:
            recent.remove(text)
        else:
            missed.append(text)
        recent = (recent + [text])[-size:]
    assert provider.searched == missed
    assert list(key for _, key in arm._cache) == recent


def test_a_cached_search_expires_after_its_time_to_live():
    provider, now = _CountingProvider(), [0.0]
    arm = WebArm(provider, cache_ttl_s=60.0, clock=lambda: now[0])
    arm._search("a", float("inf"))
    now[0] = 59.0
    arm._search("a", float("inf"))  # still fresh: no second request
    assert provider.searched == ["a"]
    now[0] = 120.0
    arm._search("a", float("inf"))  # stale: searched again, then fresh from then on
    arm._search("a", float("inf"))
    assert provider.searched == ["a", "a"]


def test_no_cache_at_a_time_to_live_of_zero():
    provider = _CountingProvider()
    arm = WebArm(provider, cache_ttl_s=0)
    for _ in range(3):
        arm._search("a", float("inf"))
    assert provider.searched == ["a"] * 3 and arm._cache is None


@pytest.mark.parametrize("ttl", [-1.0, float("nan"), float("inf")])
def test_a_bad_time_to_live_is_refused(ttl):
    with pytest.raises(ConfigError, match="cache_ttl_s"):
        WebArm(_CountingProvider(), cache_ttl_s=ttl)


def test_errors_are_not_cached(fake_server):
    server = fake_server({"/search": Reply(503, b"busy", content_type="text/plain")})
    arm = WebArm(SearxngSearch(base_url=server.url, env={}))
    for _ in range(2):
        with pytest.raises(WebUnavailable):
            arm.ground(PARIS, time.monotonic() + 5)
    assert len(server.seen) == 2


def test_evidence_is_the_best_sentences_not_the_page(fake_server):
    server = fake_server({"/search": Reply(200, SEARX_BODY)})
    evidence = WebArm(SearxngSearch(base_url=server.url, env={}), max_sentences=1).ground(PARIS, time.monotonic() + 5)
    assert evidence[0].evidence == "Paris is the capital and largest city of France."
    assert evidence[0].claim == evidence[0].evidence
    assert evidence[0].source == "web:searxng:https://corpus.local/paris"
    assert evidence[0].detail["rank"] == 0 and evidence[0].detail["search"] == PARIS.question
    assert [e.confidence for e in evidence] == sorted((e.confidence for e in evidence), reverse=True)
    assert "web:searxng:https://corpus.local/cake" not in {e.source for e in evidence}  # under the floor


def test_span_only_reranks_lightly():
    # The question says "capital"; the wrong span "Lyon" must not pull a Lyon sentence above it.
    result = web.SearchResult("u", "France", "Lyon is a big city in France. The capital of France is Paris.", 0)
    evidence = web.results_to_evidence([result], PARIS, "x", searched=PARIS.question, floor=0.0, max_sentences=1)
    assert evidence[0].evidence == "The capital of France is Paris."
    assert search_text(PARIS) == "What is the capital of France?"  # the span is not searched
    assert (
        search_text(Query(span="Lyon", question="", sentence="The capital of France is Lyon"))
        == "The capital of France is Lyon"
    )
    assert len(search_text(Query(span="", question="word " * 200, sentence="")).split()) == 50


def test_a_chatty_question_is_covered_as_the_terse_one_is():
    # The asker's words that no result holds ("quick", "exam", "tomorrow") barely count in coverage.
    result = web.SearchResult("u", "France", "Lyon is a big city in France. The capital of France is Paris.", 0)
    chatty = Query(
        span="", question="Quick question before my exam tomorrow: what's the capital of France?", sentence=""
    )

    def best(query):
        return web.results_to_evidence([result], query, "x", searched=query.question, floor=0.0, max_sentences=1)[0]

    assert best(chatty).evidence == best(PARIS).evidence == "The capital of France is Paris."
    assert best(chatty).confidence >= 2 * web.DEFAULT_FLOOR  # 0.70 (0.46 when every word counted whole)
    # A made-up name no result holds still counts whole: it may be what the question is about.
    made_up = Query(span="", question="Quick question: what's the capital of Fraxonia?", sentence="")
    assert best(made_up).confidence < 0.5 * best(PARIS).confidence


def test_glued_paragraphs_split_into_sentences():
    result = web.SearchResult(
        "u", "", "Arthur's Magazine (1844–1846) was an American periodical.First for Women is a woman's magazine.", 0
    )
    query = Query(span="", question="Who publishes First for Women?", sentence="")
    assert (
        web.results_to_evidence([result], query, "x", searched=query.question, floor=0.0, max_sentences=1)[0].evidence
        == "First for Women is a woman's magazine."
    )


def test_strip_html():
    assert strip_html('<strong>Paris</strong> &amp; <span class="searchmatch">France</span>') == "Paris & France"


def test_arm_protocol_and_config_errors():
    arm = WebArm("searxng", base_url="http://127.0.0.1:1", env={})
    assert isinstance(arm, Arm) and arm.name == "web" and arm.problem() is None
    with pytest.raises(ConfigError, match="provider='bing'"):
        make_provider("bing")
    with pytest.raises(ConfigError, match="floor"):
        WebArm("searxng", floor=2.0)
    with pytest.raises(ConfigError, match="max_results"):
        WebArm("searxng", max_results=0)
    with pytest.raises(ConfigError, match="cache_size=0 must be at least 1"):
        WebArm("searxng", cache_size=0)
    with pytest.raises(ConfigError, match="api='graphql'"):
        WikipediaSearch(api="graphql", env={})
    with pytest.raises(ConfigError, match="SURPRISEGATE_SEARXNG_URL"):
        SearxngSearch(env={"SURPRISEGATE_SEARXNG_URL": "localhost:8888"})


def test_against_the_local_search_server(tmp_path):
    from surprisegate.local.search_server import serve

    corpus = [
        {"doc_id": "fr", "text": "Lyon is a city in France. Paris is the capital of France."},
        {"doc_id": "de", "text": "Berlin is the capital of Germany."},
    ]
    with serve(corpus) as server:
        evidence = WebArm(SearxngSearch(base_url=server.url, env={})).ground(PARIS, time.monotonic() + 5)
        assert server.requests_served == 1
    assert evidence[0].source == "web:searxng:https://corpus.local/fr"
    assert "Paris is the capital of France." in evidence[0].evidence


def test_halueval_through_the_arm(shared_data):
    """End to end over HTTP: the arm's evidence comes from the question's evidence document (top 3)."""
    from surprisegate.local.search_server import doc_id_from_url, load_corpus, serve

    rows = [json.loads(line) for line in (shared_data / "halueval_qa_dev.jsonl").open(encoding="utf-8")]
    corpus = shared_data / "web_corpus.jsonl"
    gold_by_text = {doc.text.strip(): doc.doc_id for doc in load_corpus(corpus)}
    in_evidence = first = 0
    with serve(corpus) as server:
        arm = WebArm(SearxngSearch(base_url=server.url, env={}))
        for row in rows:
            query = Query(
                span=row["hallucinated_answer"], question=row["question"], sentence=row["hallucinated_answer"]
            )
            ids = [doc_id_from_url(e.detail["url"]) for e in arm.ground(query, time.monotonic() + 5)]
            gold = gold_by_text[row["evidence"].strip()]
            in_evidence += gold in ids
            first += bool(ids) and ids[0] == gold
    print(f"halueval via WebArm: gold doc among evidence {in_evidence}/{len(rows)}, first {first}/{len(rows)}")
    assert in_evidence / len(rows) >= 0.90


def test_build_web_arm_from_a_url_or_a_name():
    arm = web.build_web_arm("http://127.0.0.1:9999/", max_results=2)
    assert isinstance(arm.provider, SearxngSearch) and arm.provider.search_url == "http://127.0.0.1:9999/search"
    assert arm.max_results == 2
    assert isinstance(web.build_web_arm("wikipedia", env={}).provider, WikipediaSearch)
    assert "BRAVE_API_KEY" in web.build_web_arm("brave", env={}).problem()


def test_a_hop_sentence_is_shown_before_the_subject_sentence():
    from surprisegate.arms.web import _pick_sentences

    stems = [{"album", "record", "new", "paltz"}, {"new", "paltz", "village", "ulster", "county"}, {"weather"}]
    weights = {"album": 1.0, "record": 1.0, "county": 1.0, "new": 0.5}
    idf = {k: 1.0 for k in weights}
    # the album sentence covers most of the question, the county sentence adds the rest: it is shown first
    assert _pick_sentences(stems, weights, idf, 2) == [1, 0]
    # a second pick that adds no question word keeps text order
    assert _pick_sentences([{"album", "record", "county"}, {"weather"}], weights, idf, 2) == [0, 1]
    assert _pick_sentences(stems, weights, idf, 1) == [0]

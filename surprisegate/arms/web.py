"""The web arm (Observe): ground a doubtful span in web search results.

Providers speak the real APIs (request and response shapes as in shared/wire): SearxNG JSON, Brave
Search, Tavily and Wikipedia (Action API or REST). Every request runs under one whole-request
deadline that covers name resolution, connection and TLS set-up as well as the exchange itself: it
runs in a daemon worker thread that the caller abandons at the deadline, and the worker's own
socket timeouts never exceed the time left, so a hung resolver or a silent server cannot stall a
round. HTTP and API errors become `WebSearchError`s whose message says what went wrong and what to
set, e.g. "brave: 422 SUBSCRIPTION_TOKEN_INVALID — set BRAVE_API_KEY to a valid key".

`WebArm` searches with the user's question (the doubtful span may be wrong, so it only re-ranks
sentences, lightly), and from each top result passes on the sentence(s) that best match the
question, never the page.

Environment:
    SURPRISEGATE_SEARXNG_URL    SearxNG base url (default http://127.0.0.1:8888, `websearch-serve`'s)
    BRAVE_API_KEY               Brave Search subscription token
    SURPRISEGATE_BRAVE_URL      default https://api.search.brave.com/res/v1/web/search
    TAVILY_API_KEY              Tavily API key (tvly-...)
    SURPRISEGATE_TAVILY_URL     default https://api.tavily.com/search
    SURPRISEGATE_WIKIPEDIA_URL  default https://en.wikipedia.org
    SURPRISEGATE_USER_AGENT     User-Agent sent to every provider (Wikimedia asks for a contact)
"""

from __future__ import annotations

import html
import http.client
import json
import math
import os
import re
import socket
import ssl
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit

from ..errors import ArmError, ConfigError
from ..store.sqlite import UNSEEN_WORD_WEIGHT, query_terms
from ..text import light_stem, split_sentences, stems
from . import Evidence, Query, check_arm_settings

PROVIDERS = ("searxng", "brave", "tavily", "wikipedia")
DEFAULT_SEARXNG_URL = "http://127.0.0.1:8888"
DEFAULT_BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
DEFAULT_TAVILY_URL = "https://api.tavily.com/search"
DEFAULT_WIKIPEDIA_URL = "https://en.wikipedia.org"
DEFAULT_USER_AGENT = "surprisegate/0.1 (surprise-gated grounding; set SURPRISEGATE_USER_AGENT to add a contact)"

MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a search answer is a few kB; more is a misbehaving server
MAX_QUERY_WORDS, MAX_QUERY_CHARS = 50, 400  # Brave's documented limits; the others accept them too
SEARCH_RESULTS = 5  # results asked for: more than `max_results`, so sentence IDF sees some contrast
# Weight of the doubtful span's words relative to the question's: the span may be the model's error,
# so it may only break ties between sentences, never pick the page.
SPAN_WEIGHT = 0.1
# Confidence is question-word coverage. On halueval_qa_dev over the local BM25 server 0.3 keeps
# 97.8% of the top results (0.5 keeps 90%); factqa questions the corpus cannot answer still pass
# 44% of the time, because coverage cannot tell "Togo" + "population" from an answer about them.
DEFAULT_FLOOR = 0.3
EVIDENCE_CHARS = 600  # two sentences; longer means the sentence split failed on a list or table
RESULT_TEXT_CHARS = 600  # how much of the result text the receipt keeps
# Searches a WebArm remembers (per arm, least recently used dropped first). A reply asks one question at
# most `max_rounds` times; a server's arm sees many questions and must not grow without bound.
CACHE_SIZE = 256
CACHE_TTL_S = 600.0  # a search result older than this is fetched again (results go stale)


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------
class WebSearchError(ArmError):
    """A web search failed. `kind` is a short machine label for the receipt; str() says what to do."""

    kind = "error"

    def __init__(self, message: str, provider: str = "", http_status: int | None = None, code: str = ""):
        super().__init__(message)
        self.provider = provider
        self.http_status = http_status
        self.code = code


class WebKeyError(WebSearchError):
    """The API key is missing or the provider rejected it."""

    kind = "auth"


class WebForbidden(WebSearchError):
    """403: the endpoint refuses (SearxNG with JSON output switched off, a blocked client)."""

    kind = "forbidden"


class WebRateLimited(WebSearchError):
    """429 or a plan/usage limit (Brave RATE_LIMITED/QUOTA_LIMITED, Tavily 432/433)."""

    kind = "rate_limited"


class WebTimeout(WebSearchError, TimeoutError):
    """No answer by the deadline; the message says which phase (resolving, connecting, waiting) hung."""

    kind = "timeout"


class WebUnavailable(WebSearchError):
    """Cannot reach the endpoint: DNS failure, connection refused, TLS error, 5xx."""

    kind = "unavailable"


class WebBadResponse(WebSearchError):
    """The endpoint answered with something that is not the API's shape, or rejected the request."""

    kind = "bad_response"


# --------------------------------------------------------------------------------------------
# HTTP under one deadline
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def resolve_address(host: str, port: int) -> list[tuple]:
    """The system resolver. A module-level name so tests can swap in one that hangs."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class _Exchange:
    """One request, run in a worker thread; `phase` says where it is if the caller gives up."""

    def __init__(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, deadline: float, label: str
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebBadResponse(f"{label}: url {url!r} is not an http(s) url; check the provider's base url", label)
        self.method, self.headers, self.body, self.deadline, self.label = method, dict(headers), body, deadline, label
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.phase = f"resolving {self.host}"
        self.response: HttpResponse | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def run(self) -> None:
        try:
            self.response = self._exchange()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, never lost in the thread
            self.error = exc
        finally:
            with self._lock:
                sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()
            self.done.set()

    def abandon(self) -> None:
        """Wake a worker blocked on the socket; it closes the socket itself (closing here could race)."""
        with self._lock:
            self._abandoned = True
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _time_left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def _exchange(self) -> HttpResponse:
        try:
            sock = self._connect()
            if self.https:
                self.phase = f"TLS handshake with {self.host}"
                sock.settimeout(self._time_left())
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
                self._own(sock)
            connection_class = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            connection = connection_class(self.host, self.port)
            connection.sock = sock  # ours, already connected under the deadline; http.client only talks
            self.phase = f"sending the request to {self.host}"
            sock.settimeout(self._time_left())
            connection.request(self.method, self.target, body=self.body, headers=self.headers)
            self.phase = f"waiting for the response from {self.host}"
            sock.settimeout(self._time_left())
            response = connection.getresponse()
            self.phase = f"reading the response from {self.host}"
            body = bytearray()
            while not response.isclosed():  # http.client closes it once the whole body is in
                sock.settimeout(self._time_left())  # before every read, so a trickling server cannot stretch it
                chunk = response.read(64 * 1024)
                if not chunk:
                    break
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise WebBadResponse(
                        f"{self.label}: response from {self.host} is over {MAX_RESPONSE_BYTES} bytes", self.label
                    )
            headers = {name.lower(): value for name, value in response.getheaders()}
            return HttpResponse(response.status, headers, _decoded(bytes(body), headers, self.label))
        except WebSearchError:
            raise
        except TimeoutError as err:
            raise WebTimeout(f"{self.label}: no answer by the deadline (while {self.phase})", self.label) from err
        except socket.gaierror as err:
            raise WebUnavailable(
                f"{self.label}: cannot resolve {self.host}: {err.strerror or err}", self.label
            ) from err
        except ssl.SSLError as err:
            raise WebUnavailable(f"{self.label}: TLS failed with {self.host}: {err.reason or err}", self.label) from err
        except (OSError, http.client.HTTPException) as err:
            if self._abandoned:
                raise WebTimeout(f"{self.label}: no answer by the deadline (while {self.phase})", self.label) from err
            raise WebUnavailable(f"{self.label}: {self.phase} failed: {type(err).__name__}: {err}", self.label) from err

    def _connect(self) -> socket.socket:
        addresses = resolve_address(self.host, self.port)
        last_error: OSError | None = None
        for position, (family, kind, proto, _, address) in enumerate(addresses):
            self.phase = f"connecting to {self.host} ({address[0]}:{address[1]})"
            sock = socket.socket(family, kind, proto)
            self._own(sock)
            try:
                # Share the time left among the addresses still to try, so one black-holed address
                # (often IPv6) cannot use up the budget of a working one.
                sock.settimeout(self._time_left() / (len(addresses) - position))
                sock.connect(address)
                return sock
            except TimeoutError:
                if position == len(addresses) - 1:
                    raise
                last_error = TimeoutError(f"connecting to {address[0]} timed out")
                with self._lock:
                    self._sock = None
                sock.close()
            except OSError as err:  # refused or unreachable: try the next address
                last_error = err
                with self._lock:
                    self._sock = None
                sock.close()
        if isinstance(last_error, ConnectionRefusedError):
            raise WebUnavailable(
                f"{self.label}: connection refused by {self.host}:{self.port}; is the server running?", self.label
            )
        raise WebUnavailable(
            f"{self.label}: cannot connect to {self.host}:{self.port}: {last_error or 'no address'}", self.label
        )

    def _own(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            abandoned = self._abandoned
        if abandoned:
            raise TimeoutError("abandoned")


def _decoded(body: bytes, headers: Mapping[str, str], label: str) -> bytes:
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        # Bounded: a small compressed body must not inflate into gigabytes.
        inflater = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
        data = inflater.decompress(body, MAX_RESPONSE_BYTES + 1)
        if len(data) > MAX_RESPONSE_BYTES:
            raise WebBadResponse(f"{label}: decompressed response is over {MAX_RESPONSE_BYTES} bytes", label)
        return data
    return body


def http_request(
    method: str,
    url: str,
    *,
    deadline: float,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    label: str = "web",
) -> HttpResponse:
    """One HTTP request that returns or raises by `deadline` (absolute `time.monotonic()`).

    Resolution, connection, TLS, sending and reading all count. Raises WebTimeout (a TimeoutError)
    naming the phase it gave up in, WebUnavailable for network failures. Any status is returned.
    """
    exchange = _Exchange(method, url, {"Connection": "close", **(headers or {})}, body, deadline, label)
    if deadline - time.monotonic() <= 0:
        raise WebTimeout(f"{label}: the deadline passed before the request to {exchange.host} started", label)
    worker = threading.Thread(target=exchange.run, daemon=True, name=f"surprisegate-{label}-http")
    worker.start()
    if not exchange.done.wait(max(0.0, deadline - time.monotonic())):
        phase = exchange.phase
        exchange.abandon()
        raise WebTimeout(f"{label}: no answer by the deadline (while {phase})", label)
    if exchange.error is not None:
        raise exchange.error
    assert exchange.response is not None
    return exchange.response


# --------------------------------------------------------------------------------------------
# providers
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchResult:
    url: str
    title: str
    text: str  # plain text (HTML tags and entities removed)
    rank: int  # 0 = the provider's best
    provider_score: float | None = None


_TAG = re.compile(r"<[^>]+>")


def strip_html(text: str) -> str:
    """`<strong>Paris</strong> &amp; co` -> `Paris & co`: Brave and Wikipedia highlight matches in HTML."""
    return " ".join(html.unescape(_TAG.sub("", text or "")).split())


def _json(response: HttpResponse, label: str) -> object:
    try:
        return json.loads(response.body)
    except ValueError as err:
        start = response.text()[:60].strip()
        raise WebBadResponse(
            f"{label}: {response.status} response is not JSON (starts {start!r})", label, response.status
        ) from err


def _error_detail(payload: object) -> str:
    """The human text of an error body, whatever the provider's nesting."""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, Mapping):
        for key in ("error", "detail", "message", "info", "messageTranslations"):
            if payload.get(key):
                value = payload[key]
                if isinstance(value, Mapping) and "en" in value:  # MediaWiki REST messageTranslations
                    return str(value["en"])
                return _error_detail(value)
    return ""


def _raise_for_status(label: str, response: HttpResponse, key_env: str | None = None, hint_403: str = "") -> None:
    """Map a non-2xx answer to the WebSearchError subclass with a message that says what to do."""
    status = response.status
    if 200 <= status < 300:
        return
    try:
        detail = _error_detail(json.loads(response.body))
    except ValueError:
        detail = strip_html(response.text())[:120]
    said = f" {detail}" if detail else ""
    if status == 401 or (status == 403 and key_env):
        fix = f" — set {key_env} to a valid key" if key_env else ""
        raise WebKeyError(f"{label}: {status}{said}{fix}", label, status)
    if status == 403:
        raise WebForbidden(f"{label}: 403 forbidden{said}{hint_403}", label, status)
    if status == 429:
        retry = response.headers.get("retry-after")
        raise WebRateLimited(
            f"{label}: 429 rate limited{said} — wait{' ' + retry + ' s' if retry else ''} and retry", label, status
        )
    if status >= 500:
        raise WebUnavailable(f"{label}: {status} server error{said}; try again later", label, status)
    raise WebBadResponse(f"{label}: {status}{said}", label, status)


class SearchProvider:
    """A search API: `search(text, count, deadline)` returns results best first or raises WebSearchError."""

    name = "web"
    key_env: str | None = None  # the env variable holding the API key, for providers that need one

    def __init__(self, env: Mapping[str, str] | None = None, user_agent: str | None = None):
        env = os.environ if env is None else env
        self.user_agent = user_agent or env.get("SURPRISEGATE_USER_AGENT") or DEFAULT_USER_AGENT

    def problem(self) -> str | None:
        """Why this provider cannot work as configured (e.g. no API key), or None."""
        return None

    def search(self, text: str, count: int, deadline: float) -> list[SearchResult]:
        raise NotImplementedError


def _base_url(value: str | None, default: str, env_name: str) -> str:
    url = (value or default).strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"base url {url!r} is not an http(s) url; fix the base_url argument or {env_name}")
    return url


class SearxngSearch(SearchProvider):
    """GET {base}/search?q=...&format=json (JSON output must be enabled in the instance's settings.yml)."""

    name = "searxng"

    def __init__(
        self, base_url: str | None = None, env: Mapping[str, str] | None = None, user_agent: str | None = None
    ):
        super().__init__(env, user_agent)
        env = os.environ if env is None else env
        base = _base_url(
            base_url or env.get("SURPRISEGATE_SEARXNG_URL"), DEFAULT_SEARXNG_URL, "SURPRISEGATE_SEARXNG_URL"
        )
        self.search_url = base if base.endswith("/search") else base + "/search"

    def search(self, text: str, count: int, deadline: float) -> list[SearchResult]:
        url = f"{self.search_url}?{urlencode({'q': text, 'format': 'json'})}"
        response = http_request(
            "GET",
            url,
            deadline=deadline,
            label=self.name,
            headers={"Accept": "application/json", "User-Agent": self.user_agent},
        )
        _raise_for_status(
            self.name,
            response,
            hint_403=(
                f" — JSON output is off on {self.search_url}: add `json` to search.formats in its settings.yml, "
                "or set SURPRISEGATE_SEARXNG_URL to an instance that allows it"
            ),
        )
        payload = _json(response, self.name)
        if not isinstance(payload, Mapping) or not isinstance(payload.get("results", []), list):
            raise WebBadResponse(
                f"{self.name}: the answer has no results list; is {self.search_url} a SearxNG?", self.name
            )
        if payload.get("error") and not payload.get("results"):  # SearxNG reports query errors as 200 {"error": ...}
            raise WebBadResponse(f"{self.name}: {payload['error']}", self.name, response.status)
        results: list[SearchResult] = []
        for item in payload.get("results", []):
            if isinstance(item, Mapping) and (item.get("content") or item.get("title")):
                results.append(
                    SearchResult(
                        str(item.get("url") or ""),
                        strip_html(str(item.get("title") or "")),
                        strip_html(str(item.get("content") or "")),
                        len(results),
                        _number(item.get("score")),
                    )
                )
        return results[:count]


class _KeyedSearch(SearchProvider):
    """A provider that needs an API key (from the argument or `key_env`) and has a base url (or `url_env`)."""

    key_env: str  # every keyed provider names the env variable of its key
    url_env = ""  # the env variable that overrides the endpoint
    default_url = ""
    key_hint = ""  # where to get a key, for the message when it is missing

    def __init__(
        self, api_key: str | None, base_url: str | None, env: Mapping[str, str] | None, user_agent: str | None
    ):
        super().__init__(env, user_agent)
        env = os.environ if env is None else env
        self.api_key = (api_key or env.get(self.key_env) or "").strip()
        self.search_url = _base_url(base_url or env.get(self.url_env), self.default_url, self.url_env)

    def problem(self) -> str | None:
        if not self.api_key:
            return f"{self.name}: no API key — set {self.key_env} ({self.key_hint})"
        return None

    def _check_key(self) -> None:
        problem = self.problem()
        if problem:
            raise WebKeyError(problem, self.name)


class BraveSearch(_KeyedSearch):
    """GET api.search.brave.com/res/v1/web/search?q=...&count=N with X-Subscription-Token."""

    name = "brave"
    key_env, url_env, default_url = "BRAVE_API_KEY", "SURPRISEGATE_BRAVE_URL", DEFAULT_BRAVE_URL
    key_hint = "a subscription token from api-dashboard.search.brave.com"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        env: Mapping[str, str] | None = None,
        user_agent: str | None = None,
        extra_snippets: bool = True,
    ):
        super().__init__(api_key, base_url, env, user_agent)
        self.extra_snippets = extra_snippets  # up to 5 more excerpts per result, on plans that allow it

    def search(self, text: str, count: int, deadline: float) -> list[SearchResult]:
        self._check_key()
        params = {"q": text, "count": max(1, min(count, 20))}
        if self.extra_snippets:
            params["extra_snippets"] = "true"
        response = http_request(
            "GET",
            f"{self.search_url}?{urlencode(params)}",
            deadline=deadline,
            label=self.name,
            headers={
                "Accept": "application/json",
                "Accept-Encoding": "gzip",
                "User-Agent": self.user_agent,
                "X-Subscription-Token": self.api_key,
            },
        )
        if response.status >= 400:
            self._raise_error(response)
        payload = _json(response, self.name)
        web = payload.get("web") if isinstance(payload, Mapping) else None
        results: list[SearchResult] = []
        for item in (web or {}).get("results", []) if isinstance(web, Mapping) else []:
            if not isinstance(item, Mapping):
                continue
            snippets = [str(item.get("description") or "")] + [str(s) for s in item.get("extra_snippets") or []]
            snippet_text = " ".join(strip_html(s) for s in snippets if s)
            if snippet_text:
                results.append(
                    SearchResult(
                        str(item.get("url") or ""), strip_html(str(item.get("title") or "")), snippet_text, len(results)
                    )
                )
        return results[:count]

    def _raise_error(self, response: HttpResponse) -> None:
        # Brave's envelope: {"type": "ErrorResponse", "error": {status, code, detail, meta}}.
        try:
            error = json.loads(response.body).get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        if not isinstance(error, Mapping):
            error = {}
        code, detail, meta = str(error.get("code") or ""), str(error.get("detail") or ""), error.get("meta") or {}
        status = response.status
        if code == "SUBSCRIPTION_TOKEN_INVALID" or status == 401:
            raise WebKeyError(
                f"brave: {status} {code or 'unauthorized'} — set BRAVE_API_KEY to a valid key", self.name, status, code
            )
        if code == "RATE_LIMITED":
            plan = (
                f" (plan {meta.get('plan')}: {meta.get('rate_limit')} request/s)"
                if isinstance(meta, Mapping) and meta.get("plan")
                else ""
            )
            raise WebRateLimited(
                f"brave: {status} RATE_LIMITED{plan} — slow down or upgrade the plan", self.name, status, code
            )
        if code == "QUOTA_LIMITED":
            raise WebRateLimited(
                f"brave: {status} QUOTA_LIMITED — the plan's monthly quota is used up", self.name, status, code
            )
        if code == "VALIDATION":
            problems = (
                "; ".join(
                    f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}"
                    for e in (meta.get("errors") or [])
                    if isinstance(e, Mapping)
                )
                if isinstance(meta, Mapping)
                else ""
            )
            raise WebBadResponse(f"brave: {status} VALIDATION {problems or detail}", self.name, status, code)
        if code:
            raise WebBadResponse(f"brave: {status} {code} {detail}".rstrip(), self.name, status, code)
        _raise_for_status(self.name, response, key_env=self.key_env)


class TavilySearch(_KeyedSearch):
    """POST api.tavily.com/search, JSON body as tavily_request.json, `Authorization: Bearer tvly-...`."""

    name = "tavily"
    key_env, url_env, default_url = "TAVILY_API_KEY", "SURPRISEGATE_TAVILY_URL", DEFAULT_TAVILY_URL
    key_hint = "tvly-..., from app.tavily.com"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        env: Mapping[str, str] | None = None,
        user_agent: str | None = None,
        search_depth: str = "basic",
        topic: str = "general",
    ):
        if search_depth not in ("basic", "advanced"):
            raise ConfigError(f"search_depth={search_depth!r}: use 'basic' or 'advanced'")
        if topic not in ("general", "news"):
            raise ConfigError(f"topic={topic!r}: use 'general' or 'news'")
        super().__init__(api_key, base_url, env, user_agent)
        self.search_depth, self.topic = search_depth, topic

    def search(self, text: str, count: int, deadline: float) -> list[SearchResult]:
        self._check_key()
        request = {
            "query": text,
            "search_depth": self.search_depth,
            "max_results": max(1, min(count, 20)),
            "include_answer": False,  # Tavily's answer is generated text, not a source to cite
            "include_raw_content": False,
            "include_images": False,
            "topic": self.topic,
        }
        response = http_request(
            "POST",
            self.search_url,
            deadline=deadline,
            label=self.name,
            body=json.dumps(request).encode("utf-8"),
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                "Authorization": f"Bearer {self.api_key}",
                "User-Agent": self.user_agent,
            },
        )
        if response.status in (432, 433):  # Tavily's plan and pay-as-you-go limits
            detail = _error_detail(_json_or_none(response.body))
            raise WebRateLimited(
                f"tavily: {response.status} usage limit reached{': ' + detail if detail else ''} — "
                "upgrade the plan or wait for the quota to reset",
                self.name,
                response.status,
            )
        _raise_for_status(self.name, response, key_env=self.key_env if response.status in (401, 403) else None)
        payload = _json(response, self.name)
        results: list[SearchResult] = []
        for item in payload.get("results", []) if isinstance(payload, Mapping) else []:
            if isinstance(item, Mapping) and (item.get("content") or item.get("raw_content")):
                results.append(
                    SearchResult(
                        str(item.get("url") or ""),
                        strip_html(str(item.get("title") or "")),
                        strip_html(str(item.get("content") or item.get("raw_content"))),
                        len(results),
                        _number(item.get("score")),
                    )
                )
        return results[:count]


class WikipediaSearch(SearchProvider):
    """MediaWiki search (Action API `list=search`, or REST `search/page`), then page summaries.

    Search snippets are sentence fragments, so with `summaries` the top pages' lead extracts
    (REST page/summary) replace them when they arrive in time.
    """

    name = "wikipedia"

    def __init__(
        self,
        base_url: str | None = None,
        api: str = "action",
        summaries: bool = True,
        env: Mapping[str, str] | None = None,
        user_agent: str | None = None,
    ):
        super().__init__(env, user_agent)
        env = os.environ if env is None else env
        if api not in ("action", "rest"):
            raise ConfigError(f"api={api!r}: use 'action' (w/api.php) or 'rest' (w/rest.php/v1/search/page)")
        self.base_url = _base_url(
            base_url or env.get("SURPRISEGATE_WIKIPEDIA_URL"), DEFAULT_WIKIPEDIA_URL, "SURPRISEGATE_WIKIPEDIA_URL"
        )
        self.api, self.summaries = api, summaries

    def _headers(self) -> dict[str, str]:
        return {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": self.user_agent}

    def search(self, text: str, count: int, deadline: float) -> list[SearchResult]:
        # Wikipedia's search ANDs every word, so a whole question usually finds nothing: send keywords.
        keywords = " ".join(term.word for term in query_terms(text)) or text
        started = time.monotonic()
        results = self._search(keywords, count, deadline)
        if not results and time.monotonic() - started < 0.4 * (deadline - started):
            names = " ".join(term.word for term in query_terms(text) if term.is_name)
            if names and names != keywords:  # fewer words: the names alone usually find the page
                results = self._search(names, count, deadline)
        if self.summaries and results:
            # Leave a margin: summaries are a bonus, the snippets already in hand must still go back in time.
            results = self._with_summaries(results, time.monotonic() + 0.8 * (deadline - time.monotonic()))
        return results

    def _search(self, keywords: str, count: int, deadline: float) -> list[SearchResult]:
        limit = max(1, min(count, 50))
        if self.api == "action":
            params = {
                "action": "query",
                "list": "search",
                "srsearch": keywords,
                "format": "json",
                "formatversion": "2",
                "srprop": "snippet|timestamp|wordcount|size",
                "srlimit": limit,
            }
            url = f"{self.base_url}/w/api.php?{urlencode(params)}"
        else:
            url = f"{self.base_url}/w/rest.php/v1/search/page?{urlencode({'q': keywords, 'limit': limit})}"
        response = http_request("GET", url, deadline=deadline, label=self.name, headers=self._headers())
        _raise_for_status(self.name, response)
        payload = _json(response, self.name)
        if not isinstance(payload, Mapping):
            raise WebBadResponse(f"{self.name}: the answer is not a JSON object", self.name)
        if self.api == "action":
            if "error" in payload:  # the Action API reports errors as 200 {"error": {"code", "info"}}
                error = payload["error"] if isinstance(payload["error"], Mapping) else {}
                raise WebBadResponse(
                    f"wikipedia: {error.get('code', 'error')}: {error.get('info', '')}".rstrip(": "), self.name
                )
            items = (payload.get("query") or {}).get("search") or []
            pairs = [(item.get("title"), item.get("snippet")) for item in items if isinstance(item, Mapping)]
        else:
            items = payload.get("pages") or []
            pairs = [
                (
                    item.get("title"),
                    " ".join(
                        filter(None, [item.get("description") and f"{item['description']}.", item.get("excerpt")])
                    ),
                )
                for item in items
                if isinstance(item, Mapping)
            ]
        results: list[SearchResult] = []
        for title, snippet in pairs:
            if title:
                page_url = f"{self.base_url}/wiki/{quote(str(title).replace(' ', '_'))}"
                results.append(SearchResult(page_url, str(title), strip_html(str(snippet or "")), len(results)))
        return results[:count]

    def _with_summaries(self, results: list[SearchResult], deadline: float) -> list[SearchResult]:
        extracts: dict[int, tuple[str, str]] = {}

        def fetch(position: int, title: str) -> None:
            url = f"{self.base_url}/api/rest_v1/page/summary/{quote(title.replace(' ', '_'), safe='')}"
            try:
                response = http_request("GET", url, deadline=deadline, label=self.name, headers=self._headers())
                page = json.loads(response.body) if response.status == 200 else None
            except (WebSearchError, ValueError):
                return  # keep the search snippet
            if isinstance(page, Mapping) and page.get("type") == "standard" and page.get("extract"):
                page_url = ((page.get("content_urls") or {}).get("desktop") or {}).get("page") or ""
                extracts[position] = (str(page["extract"]), str(page_url))

        workers = [threading.Thread(target=fetch, args=(r.rank, r.title), daemon=True) for r in results]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        merged = []
        for result in results:
            extract, page_url = extracts.get(result.rank, ("", ""))
            merged.append(
                SearchResult(page_url or result.url, result.title, extract or result.text, result.rank)
                if extract
                else result
            )
        return merged


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _json_or_none(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


_PROVIDER_CLASSES: dict[str, Callable[..., SearchProvider]] = {
    "searxng": SearxngSearch,
    "brave": BraveSearch,
    "tavily": TavilySearch,
    "wikipedia": WikipediaSearch,
}


def make_provider(name: str, **options) -> SearchProvider:
    """A provider by name (searxng | brave | tavily | wikipedia); options go to its constructor."""
    try:
        factory = _PROVIDER_CLASSES[name]
    except KeyError:
        raise ConfigError(f"web provider={name!r} is unknown; use one of {', '.join(PROVIDERS)}") from None
    return factory(**options)


# --------------------------------------------------------------------------------------------
# results -> evidence
# --------------------------------------------------------------------------------------------
def search_text(query: Query) -> str:
    """What to send to the search engine: the question, capped to the APIs' limits.

    The doubtful span is left out: it may be the model's error, and search engines that AND their
    words find nothing for a question plus a wrong answer. It re-ranks sentences instead.
    """
    text = query.question.strip() or query.sentence.strip() or query.span.strip()
    words = text.split()[:MAX_QUERY_WORDS]
    return " ".join(words)[:MAX_QUERY_CHARS]


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 2)  # at a word boundary when there is one
    return text[: cut if cut > 0 else limit - 2].rstrip() + " …"


def _term_weights(question: str, span: str) -> dict[str, float]:
    """Stemmed words to their weights: names count most, numbers least, span words SPAN_WEIGHT as much."""
    weights: dict[str, float] = {}
    for text, scale in ((question, 1.0), (span, SPAN_WEIGHT)):
        for term in query_terms(text, weight=scale):
            stem = light_stem(term.word)
            if stem not in weights:  # a question word keeps its full weight even if the span repeats it
                weights[stem] = term.weight
    return weights


def _asker_words_discounted(weights: dict[str, float], question: str, held: set[str]) -> dict[str, float]:
    """In a question that writes its names with capitals, a lower-case word no result holds is the asker's
    wording ("Quick question before my exam"), not a missing subject: it counts UNSEEN_WORD_WEIGHT of its
    weight in coverage, as the memory store counts it, so that a chatty question is not judged less covered."""
    terms = query_terms(question)
    if not any(t.is_name for t in terms):
        return weights
    lower = {light_stem(t.word) for t in terms if t.lower_case}
    return {s: w * (UNSEEN_WORD_WEIGHT if s in lower and s not in held else 1.0) for s, w in weights.items()}


@dataclass
class _Candidate:
    result: SearchResult
    sentences: list[str]
    sentence_stems: list[set[str]]


def _pick_sentences(
    sentence_stems: list[set[str]], weights: dict[str, float], idf: dict[str, float], count: int
) -> list[int]:
    """Indices of up to `count` sentences, picked greedily by the question weight they add, in the order to show them.

    Greedy coverage, not the top `count` by score: a multi-hop question ("the network of the show
    whose finale is X") needs the sentence naming the show and the one naming its network. When every
    later pick adds question words the earlier picks lack (a hop), they are shown last-picked first: the
    first pick usually names the question's subject and the hop answers ("... in New Paltz." / "New Paltz
    is a village in Ulster County."), and a small model restates the first sentence it is shown
    (halueval_qa_dev, 100 items: intervene 0.40 -> 0.44, no answer broken). Otherwise text order.
    """

    def gain(index: int, covered: set[str]) -> tuple[float, int]:
        new = (sentence_stems[index] - covered) & weights.keys()
        return (sum(weights[s] * idf[s] for s in new), -index)  # ties: the earlier sentence

    chosen: list[int] = []
    gains: list[float] = []
    covered: set[str] = set()
    for _ in range(min(count, len(sentence_stems))):
        (best_gain, _), best = max((gain(i, covered), i) for i in range(len(sentence_stems)) if i not in chosen)
        gains.append(best_gain)
        chosen.append(best)
        covered |= sentence_stems[best]
    if len(chosen) > 1 and all(g > 0 for g in gains[1:]):
        return chosen[::-1]
    return sorted(chosen)


def results_to_evidence(
    results: list[SearchResult],
    query: Query,
    provider: str,
    *,
    searched: str,
    floor: float = DEFAULT_FLOOR,
    max_results: int = 3,
    max_sentences: int = 2,
) -> list[Evidence]:
    """The best sentence(s) of each top result as Evidence, best first, those under `floor` dropped.

    Sentences are scored by the IDF-weighted question words they hold (IDF over all the results'
    sentences, so words every sentence repeats do not decide). Confidence is the weighted share of
    the question's words found in the result's title plus chosen sentences, lowered a little by rank.
    """
    weights = _term_weights(query.question or searched, query.span)
    if not weights or not results:
        return []
    candidates = []
    for result in results:
        sentences = split_sentences(result.text) or [result.text]
        candidates.append(_Candidate(result, sentences, [stems(s) for s in sentences]))
    held = set().union(*(stems(c.result.title) for c in candidates), *(h for c in candidates for h in c.sentence_stems))
    coverage_weights = _asker_words_discounted(weights, query.question or searched, held)
    total_weight = sum(coverage_weights.values())
    sentence_count = sum(len(c.sentences) for c in candidates)
    frequency = {stem: sum(stem in held for c in candidates for held in c.sentence_stems) for stem in weights}
    idf = {stem: math.log(1 + sentence_count / (1 + frequency[stem])) for stem in weights}

    evidence = []
    for candidate in candidates[:max_results]:
        chosen = _pick_sentences(candidate.sentence_stems, weights, idf, max_sentences)
        snippet = _clip(" ".join(candidate.sentences[i] for i in chosen), EVIDENCE_CHARS)
        covered = stems(candidate.result.title) | set().union(*(candidate.sentence_stems[i] for i in chosen))
        coverage = sum(weight for stem, weight in coverage_weights.items() if stem in covered) / total_weight
        confidence = round(coverage * (1.0 - 0.05 * candidate.result.rank), 4)
        if confidence < floor or not snippet:
            continue
        result = candidate.result
        evidence.append(
            Evidence(
                claim=snippet,
                evidence=snippet,
                confidence=confidence,
                source=f"web:{provider}:{result.url or result.title}",
                observable=0.0,
                detail={
                    "title": result.title,
                    "url": result.url,
                    "rank": result.rank,
                    "provider_score": result.provider_score,
                    "search": searched,
                    "coverage": round(coverage, 4),
                    "result_text": result.text[:RESULT_TEXT_CHARS],
                },
            )
        )
    evidence.sort(key=lambda e: (-e.confidence, e.detail["rank"]))
    return evidence


class WebArm:
    """Observe: search the web (or a SearxNG-compatible local index) and pass on the best sentences."""

    name = "web"

    def __init__(
        self,
        provider: str | SearchProvider = "searxng",
        floor: float = DEFAULT_FLOOR,
        max_results: int = 3,
        cache: bool = True,
        max_sentences: int = 2,
        cache_size: int = CACHE_SIZE,
        cache_ttl_s: float = CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        **provider_options,
    ):
        check_arm_settings(
            floor,
            DEFAULT_FLOOR,
            max_results=(max_results, "results to use"),
            max_sentences=(max_sentences, "sentences per result"),
            cache_size=(cache_size, "searches to remember"),
        )
        if not (math.isfinite(cache_ttl_s) and cache_ttl_s >= 0):
            raise ConfigError(f"cache_ttl_s={cache_ttl_s!r}: use seconds >= 0 a result is reused, e.g. {CACHE_TTL_S}")
        self.provider = make_provider(provider, **provider_options) if isinstance(provider, str) else provider
        self.floor, self.max_results, self.max_sentences = floor, max_results, max_sentences
        # Keyed by provider + search text: a second round on the same question costs no request. Least
        # recently used first out, so a long-lived arm holds at most `cache_size` answers, none older than
        # `cache_ttl_s` (stale results are searched again). serve keeps none: a hit's speed would tell one
        # client what another asked.
        self._cache: OrderedDict[tuple[str, str], tuple[float, list[SearchResult]]] | None = (
            OrderedDict() if cache and cache_ttl_s > 0 else None
        )
        self.cache_size, self.cache_ttl_s, self._clock = cache_size, cache_ttl_s, clock
        self._cache_lock = threading.Lock()

    def problem(self) -> str | None:
        """Why the arm cannot work as configured (e.g. "brave: no API key — set BRAVE_API_KEY ..."), or None."""
        return self.provider.problem()

    def ground(self, query: Query, deadline: float) -> list[Evidence]:
        """Evidence best first; empty when nothing clears the floor. Raises WebSearchError (an ArmError)."""
        searched = search_text(query)
        if not searched:
            return []
        results = self._search(searched, deadline)
        return results_to_evidence(
            results,
            query,
            self.provider.name,
            searched=searched,
            floor=self.floor,
            max_results=self.max_results,
            max_sentences=self.max_sentences,
        )

    def _search(self, searched: str, deadline: float) -> list[SearchResult]:
        key = (self.provider.name, searched)
        if self._cache is not None:
            with self._cache_lock:
                stored = self._cache.get(key)
                if stored is not None and self._clock() - stored[0] < self.cache_ttl_s:
                    self._cache.move_to_end(key)
                    return stored[1]
                self._cache.pop(key, None)  # expired
        results = self.provider.search(searched, max(SEARCH_RESULTS, self.max_results), deadline)
        if self._cache is not None:
            with self._cache_lock:
                self._cache[key] = (self._clock(), results)
                self._cache.move_to_end(key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return results


def build_web_arm(target: str = "searxng", **options) -> WebArm:
    """A WebArm from one CLI value: a SearxNG-compatible url, or a provider name (searxng | brave | tavily | wikipedia).

    `options` go to WebArm (floor, max_results, cache, max_sentences, cache_size, cache_ttl_s) and on to the
    provider.
    """
    if target.startswith(("http://", "https://")):
        return WebArm(SearxngSearch(base_url=target), **options)
    return WebArm(target, **options)

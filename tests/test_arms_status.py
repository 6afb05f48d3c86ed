"""The status tool: allow-list matching, TCP and HTTP checks against 127.0.0.1 only, deadlines, extraction."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from surprisegate.arms.status import (
    StatusRequest,
    StatusTarget,
    _resolve,
    check_status,
    extract_status_request,
    is_allowed,
    normal_path,
    parse_target,
    remove_dot_segments,
    resolve_request,
    status_evidence,
)
from surprisegate.arms.toolkit import ToolRefused
from surprisegate.errors import ConfigError


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    yield server
    server.close()


def _connected(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except OSError:  # includes the accept timeout
        return False
    connection.close()
    return True


@pytest.fixture
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # http.server's naming
            self.send_response(503 if self.path.startswith("/broken") else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def _deadline(seconds: float = 2.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("localhost:8080", StatusTarget("tcp", "localhost", 8080)),
        ("tcp://127.0.0.1:22", StatusTarget("tcp", "127.0.0.1", 22)),
        ("http://Example.COM./health", StatusTarget("http", "example.com", 80, "/health")),
        ("https://example.org", StatusTarget("https", "example.org", 443, "/")),
        ("http://127.0.0.1:8000/a?b=1", StatusTarget("http", "127.0.0.1", 8000, "/a?b=1")),
        ("[::1]:9000", StatusTarget("tcp", "::1", 9000)),
    ],
)
def test_parse_target(text, target):
    assert parse_target(text) == target


@pytest.mark.parametrize("text", ["", "localhost", "ftp://example.com:21", "http://", "a b:80", "localhost:99999"])
def test_parse_target_refuses_malformed_targets(text):
    with pytest.raises(ConfigError):
        parse_target(text)


def test_allow_list_matching():
    allowed = [parse_target("127.0.0.1:5432"), parse_target("http://localhost:8000/api/")]
    assert is_allowed(parse_target("127.0.0.1:5432"), allowed)
    assert not is_allowed(parse_target("127.0.0.1:5433"), allowed)
    assert is_allowed(parse_target("localhost:8000"), allowed)  # an allowed URL allows a TCP check of its port
    assert is_allowed(parse_target("http://localhost:8000/api/health"), allowed)
    assert not is_allowed(parse_target("http://localhost:8000/admin"), allowed)
    assert not is_allowed(parse_target("http://localhost:8000/api-v2"), allowed)  # prefixes end at a "/"
    assert not is_allowed(parse_target("https://localhost:8000/api/"), allowed)  # the scheme must match
    assert not is_allowed(parse_target("http://127.0.0.1:5432/"), allowed)  # a TCP entry allows no HTTP


# --------------------------------------------------------------------------------------------------
# normal form: what is matched is what is sent (the red team's "/health/../v1/models" got through)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "normal"),
    [  # RFC 3986 §5.2.4 and §5.4's examples, then the edges
        ("/a/b/c/./../../g", "/a/g"),
        ("mid/content=5/../6", "mid/6"),
        ("/b/c/d;p/../g", "/b/c/g"),
        ("/b/c/d/../../../../g", "/g"),  # more ".." than segments stops at the root
        ("/./g", "/g"),
        ("/g.", "/g."),
        ("/.g", "/.g"),
        ("/..g", "/..g"),
        ("/g..", "/g.."),
        ("/b/c/./g/.", "/b/c/g/"),
        ("/b/c/g/..", "/b/c/"),
        ("/..", "/"),
        ("/.", "/"),
        ("/", "/"),
        ("", ""),
        ("/a//../b", "/a/b"),  # ".." removes the empty segment, as the RFC says
    ],
)
def test_remove_dot_segments(path, normal):
    assert remove_dot_segments(path) == normal


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("/health/../v1/models", "/v1/models"),
        ("/health/%2e%2e/v1/models", "/v1/models"),
        ("/health/%2E%2e/v1/models", "/v1/models"),
        ("/health/.%2e/v1", "/v1"),
        ("/health/%2e/x", "/health/x"),
        ("/health/./", "/health/"),
        ("/%7Euser/%41", "/~user/A"),  # unreserved escapes decoded
        ("/a%3fb/%3A", "/a%3Fb/%3A"),  # reserved ones kept, in upper case
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/café", "/caf%C3%A9"),  # non-ASCII sent as UTF-8 escapes
        ("health", "/health"),
    ],
)
def test_normal_path(path, normal):
    assert normal_path(path) == normal


@pytest.mark.parametrize(
    "text",
    [
        "http://127.0.0.1:8000/health/..%2fv1",  # an encoded slash (a server decoding it first sees "..")
        "http://127.0.0.1:8000/health/..%2Fv1",
        "http://127.0.0.1:8000/health/..%5cv1",  # an encoded backslash
        "http://127.0.0.1:8000/health%252e%252e/v1",  # an encoded "%" (double decoding)
        "http://127.0.0.1:8000/health/%00",
        "http://127.0.0.1:8000/health/%zz",
        "http://127.0.0.1:8000/health/%2",
        "http://127.0.0.1:8000/health\\..\\v1",  # backslashes (some servers read "\\" as "/")
        "http://127.0.0.1:8000\\@evil.example/health",
        "http://127.0.0.1:8000/health/..;/v1",  # ";" parameters dropped by the server leave ".."
        "http://127.0.0.1:8000/health/.;x/v1",
        "http://user@127.0.0.1:8000/health",  # user info
        "http://127.0.0.1:8000@evil.example/health",  # the host is what follows "@"
        "http://127.0.0.1:8000:80/health",  # two ports
        "http://127.0.0.1:+8000/health",
        "http://127.0.0.1:0/health",
        "http://127.0.0.%31:8000/health",  # an escaped host
        "http://127.0.0.1:8000/\x00",
        "http://127.0.0.1:8000/a\x7fb",
        "localhost:8000/admin",  # a TCP check takes no path
    ],
)
def test_parse_target_refuses_what_a_server_could_read_as_another_target(text):
    with pytest.raises(ConfigError) as caught:
        parse_target(text)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("http://127.0.0.1:8000/health", True),
        ("http://127.0.0.1:8000/health/", True),
        ("http://127.0.0.1:8000/health/live", True),
        ("http://127.0.0.1:8000/health/./live", True),
        ("http://127.0.0.1:8000/health/x/../live", True),
        ("http://127.0.0.1:8000/health/%6Cive", True),  # %6C is "l"
        ("http://127.0.0.1:8000/health?x=/../v1", True),  # the query is no path
        ("http://127.0.0.1:8000/health#/../../v1", True),  # a fragment is never sent
        ("http://127.0.0.1:8000/health/../v1/models", False),
        ("http://127.0.0.1:8000/health/%2e%2e/v1/models", False),
        ("http://127.0.0.1:8000/health/%2E%2E/v1/models", False),
        ("http://127.0.0.1:8000/health/.%2e/v1/models", False),
        ("http://127.0.0.1:8000/health/./../v1/models", False),
        ("http://127.0.0.1:8000/health/live/../../v1/models", False),
        ("http://127.0.0.1:8000/health/..", False),
        ("http://127.0.0.1:8000/health/%2e%2e", False),
        ("http://127.0.0.1:8000/healthz", False),
        ("http://127.0.0.1:8000/health;x", False),
        ("http://127.0.0.1:8000//health", False),
        ("http://127.0.0.1:8000/HEALTH", False),  # paths are case-sensitive
        ("http://127.0.0.1:8001/health", False),
        ("http://127.0.0.1:08000/health", True),  # the same port
        ("HTTP://127.0.0.1:8000/health", True),
        ("https://127.0.0.1:8000/health", False),
        ("http://localhost:8000/health", False),  # another name is another host
        ("http://[::ffff:127.0.0.1]:8000/health", False),
        ("http://127.1:8000/health", False),  # a short form of an address is not the listed one
    ],
)
def test_allow_list_matches_the_normal_form(text, allowed):
    entries = [parse_target("http://127.0.0.1:8000/health")]
    assert is_allowed(parse_target(text), entries) is allowed


def test_allow_list_entries_are_normalised_too():
    entries = [parse_target("http://127.0.0.1:8000/a/../health/"), parse_target("http://[0:0:0:0:0:0:0:1]:9000/")]
    assert entries[0].path == "/health/" and entries[1].host == "::1"
    assert is_allowed(parse_target("http://127.0.0.1:8000/health/live"), entries)
    assert not is_allowed(parse_target("http://127.0.0.1:8000/a/x"), entries)
    assert is_allowed(parse_target("http://[::1]:9000/anything"), entries)


@pytest.fixture
def recording_server():
    """An HTTP server on 127.0.0.1 that keeps the request line's path of every HEAD it gets."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # http.server's naming
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.seen = seen
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_normal_form_is_what_is_sent(recording_server):
    port = recording_server.server_address[1]
    allowed = [f"http://127.0.0.1:{port}/health"]
    result = check_status(f"http://127.0.0.1:{port}/health/x/%2E%2E/./live", allowed, _deadline())
    assert result.up and recording_server.seen == ["/health/live"]
    for sneaky in ("/health/../v1/models", "/health/%2e%2e/v1/models", "/health/.%2E/v1/models"):
        with pytest.raises(ToolRefused) as caught:
            check_status(f"http://127.0.0.1:{port}{sneaky}", allowed, _deadline())
        assert caught.value.reason == "not_allowed" and "/v1/models" in str(caught.value)
    assert recording_server.seen == ["/health/live"]  # nothing else was contacted


def test_a_sneaky_target_in_a_question_is_refused_before_any_contact(recording_server):
    port = recording_server.server_address[1]
    allowed = [parse_target(f"http://127.0.0.1:{port}/health")]
    for question in (
        f"Is http://127.0.0.1:{port}/health/../v1/models up?",
        f"Is http://127.0.0.1:{port}/health/%2e%2e/v1/models up?",
    ):
        target = resolve_request(extract_status_request(question), allowed)
        assert target.path == "/v1/models" and not is_allowed(target, allowed)
    with pytest.raises(ToolRefused) as caught:
        resolve_request(extract_status_request(f"Is http://127.0.0.1:{port}/health/..%2fv1 up?"), allowed)
    assert caught.value.reason == "bad_target"
    assert recording_server.seen == []


def test_tcp_up(listener):
    port = listener.getsockname()[1]
    result = check_status(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], _deadline())
    assert result.up
    assert result.detail == "accepting connections"
    assert result.address == "127.0.0.1"


def test_tcp_down():
    port = _free_port()
    result = check_status(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], _deadline())
    assert not result.up
    assert "refused" in result.detail


def test_http_head(http_server):
    port = http_server.server_address[1]
    allowed = [f"http://127.0.0.1:{port}/"]
    ok = check_status(f"http://127.0.0.1:{port}/health", allowed, _deadline())
    assert ok.up and ok.http_status == 200 and ok.detail == "HTTP 200 OK"
    broken = check_status(f"http://127.0.0.1:{port}/broken", allowed, _deadline())
    assert not broken.up and broken.http_status == 503


def test_targets_off_the_allow_list_are_never_contacted(listener):
    port = listener.getsockname()[1]
    with pytest.raises(ToolRefused) as caught:
        check_status(f"127.0.0.1:{port}", ["127.0.0.1:1"], _deadline())
    assert caught.value.reason == "not_allowed"
    assert "allow-list" in str(caught.value)
    assert not _connected(listener)


def test_a_passed_deadline_contacts_nothing(listener):
    port = listener.getsockname()[1]
    with pytest.raises(ToolRefused) as caught:
        check_status(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], time.monotonic() - 1)
    assert caught.value.reason == "timeout"
    assert not _connected(listener)


def test_a_silent_server_is_bounded_by_the_deadline(listener):
    # The listener accepts at the TCP level but never answers HTTP: HEAD must give up at the deadline.
    port = listener.getsockname()[1]
    started = time.monotonic()
    result = check_status(f"http://127.0.0.1:{port}/", [f"http://127.0.0.1:{port}/"], _deadline(0.5))
    assert time.monotonic() - started < 1.5
    assert not result.up
    assert "HTTP failed" in result.detail


def test_dns_is_bounded_by_the_deadline(monkeypatch):
    def stuck(*args, **kwargs):
        time.sleep(5)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _resolve("stuck.example.internal", 80, time.monotonic() + 0.3)
    assert time.monotonic() - started < 1.0


def test_dns_timeout_is_a_result(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(5))
    result = check_status("stuck.example.internal:80", ["stuck.example.internal:80"], _deadline(0.3))
    assert not result.up
    assert "DNS" in result.detail


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        ("Is https://api.example.org/health responding?", StatusRequest("", target="https://api.example.org/health")),
        ("What is the status of localhost:8000?", StatusRequest("", target="localhost:8000")),
        ("Is port 8080 open?", StatusRequest("", port=8080)),
        ("Is example.com up?", StatusRequest("", host="example.com")),
    ],
)
def test_extract_status_request(text, request_):
    found = extract_status_request(text)
    assert (found.target, found.host, found.port) == (request_.target, request_.host, request_.port)


@pytest.mark.parametrize("text", ["", "What is 37 times 48?", "Is the store open late?", "Visit example.com today"])
def test_no_status_request(text):
    assert extract_status_request(text) is None


def test_resolve_request_against_the_allow_list():
    allowed = [parse_target("127.0.0.1:8080"), parse_target("https://example.com/")]
    assert resolve_request(StatusRequest("", port=8080), allowed) == parse_target("127.0.0.1:8080")
    assert resolve_request(StatusRequest("", host="example.com"), allowed) == parse_target("https://example.com/")
    with pytest.raises(ToolRefused, match="not on the status allow-list"):
        resolve_request(StatusRequest("", port=9999), allowed)
    with pytest.raises(ToolRefused, match="several"):
        resolve_request(StatusRequest("", port=80), [parse_target("a.com:80"), parse_target("b.com:80")])


def test_status_evidence(listener):
    port = listener.getsockname()[1]
    evidence = status_evidence(check_status(f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], _deadline()), "question")
    assert evidence.source == "tool:status"
    assert evidence.observable == 1.0
    assert evidence.claim == f"127.0.0.1:{port} is up"
    assert evidence.detail["tool"] == "status"
    assert evidence.detail["input"] == f"127.0.0.1:{port}"
    assert evidence.detail["sandbox"] == "allow-list"

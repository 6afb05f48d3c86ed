"""The status tool: is an allow-listed host:port accepting connections, does an allow-listed URL answer?

Only targets on the configured allow-list are ever contacted: "host:port" (TCP connect) or an http(s) URL
(HTTP HEAD, no redirects followed). Everything is bounded by the caller's deadline, DNS included: names are
resolved in a daemon thread that is abandoned when the deadline passes.

A URL is matched in its normal form and sent in that same form (parse_target, normal_path): escapes
decoded where RFC 3986 allows, dot segments removed, so "/health/../v1/models" is "/v1/models" and is
refused under an allowed "/health"; what a server could read as another path is refused outright.
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from surprisegate.arms import Evidence
from surprisegate.arms.toolkit import ToolRefused, tool_evidence
from surprisegate.errors import ConfigError

USER_AGENT = "surprisegate-status/0.1"


@dataclass(frozen=True)
class StatusTarget:
    scheme: str  # "tcp" | "http" | "https"
    host: str  # lower-case, without a trailing dot; IPv6 without brackets
    port: int
    path: str = "/"  # http(s) only

    @property
    def label(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.scheme == "tcp":
            return f"{host}:{self.port}"
        default = {"http": 80, "https": 443}[self.scheme]
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{host}{port}{self.path}"


def parse_target(text: str) -> StatusTarget:
    """ "host:port", "tcp://host:port" or an http(s) URL -> StatusTarget in normal form (see normal_path);
    ConfigError when malformed or when servers could read it differently from us (user info, a backslash,
    an encoded slash or percent, a control character)."""
    if not isinstance(text, str) or not text.strip() or len(text) > 2048 or any(c.isspace() for c in text.strip()):
        raise ConfigError(f"status target {_short(text)} must be 'host:port' or an http(s) URL, e.g. 'localhost:8080'")
    written = text.strip()
    bad = next((c for c in written if ord(c) < 0x20 or ord(c) == 0x7F or c == "\\"), None)
    if bad is not None:
        raise ConfigError(
            f"status target {_short(text)} holds {bad!r}, which servers read differently; write the URL without it"
        )
    if "://" not in written:
        written = "tcp://" + written
    try:
        parts = urlsplit(written)
        port = parts.port
    except ValueError as err:
        raise ConfigError(f"status target {_short(text)} is malformed ({err})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("tcp", "http", "https") or not parts.hostname:
        raise ConfigError(f"status target {_short(text)} must be 'host:port' or an http(s) URL, e.g. 'localhost:8080'")
    if "@" in parts.netloc:
        raise ConfigError(
            f"status target {_short(text)} holds user info before '@' (the host is what follows it); write "
            "only the scheme, host, port and path"
        )
    host = _host(parts.hostname, text)
    if port == 0:
        raise ConfigError(f"status target {_short(text)} has port 0; use a port from 1 to 65535")
    if scheme == "tcp":
        if port is None:
            raise ConfigError(f"status target {_short(text)} needs a port, e.g. '{host}:8080'")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(f"status target {_short(text)}: a host:port check takes no path; drop it")
        return StatusTarget("tcp", host, port)
    path = normal_path(parts.path or "/", text)
    if parts.query:
        path += "?" + _ascii(parts.query)
    return StatusTarget(scheme, host, port or {"http": 80, "https": 443}[scheme], path)


_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Escapes a server may decode before routing (or twice): left in, they would hide a "/" or a "..".
_REFUSED_ESCAPES = {"2F": "an encoded '/'", "5C": "an encoded backslash", "25": "an encoded '%'"}


def _short(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:80] + f"… ({len(shown)} characters)"


def _host(name: str, text: str) -> str:
    """The host in normal form: lower case, no trailing dot, an IP address in its compressed form."""
    host = name.lower().rstrip(".")
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(host):
        raise ConfigError(
            f"status target {_short(text)}: host {host!r} must be a name of letters, digits, '-' and '.' "
            "(an internationalised name in its xn-- form) or an IP address"
        )
    return host


def normal_path(path: str, text: str = "") -> str:
    """A URL path in the normal form it is matched and sent in (RFC 3986 §6.2.2): escapes of unreserved
    characters decoded (%2e is "."), other escapes in upper case, non-ASCII characters escaped as UTF-8,
    then dot segments removed (§5.2.4), so "/health/../v1" is "/v1". ConfigError for what a server could
    still read as another path: an encoded "/", backslash or "%", an escaped control character, a
    malformed escape, or a "..;" segment (servers that drop ";" parameters read it as "..")."""
    text = text or path
    if re.search(r"%(?![0-9A-Fa-f]{2})", path):
        raise ConfigError(f"status target {_short(text)} has a malformed %-escape; write %XX with two hex digits")

    def decode(match: re.Match) -> str:
        code = match.group(1).upper()
        char = chr(int(code, 16))
        if code in _REFUSED_ESCAPES or int(code, 16) < 0x20 or int(code, 16) == 0x7F:
            what = _REFUSED_ESCAPES.get(code, "an encoded control character")
            raise ConfigError(f"status target {_short(text)} holds {what} (%{code}); write the path without it")
        return char if char in _UNRESERVED else "%" + code

    path = remove_dot_segments(_ascii(_ESCAPE.sub(decode, path)))
    for segment in path.split("/"):
        if segment.split(";", 1)[0] in (".", ".."):
            raise ConfigError(f"status target {_short(text)} has a {segment!r} segment; write the path it means")
    return path if path.startswith("/") else "/" + path


def _ascii(text: str) -> str:
    """Non-ASCII characters as UTF-8 %-escapes (what a request line can carry); ASCII kept as it is."""
    return "".join(c if ord(c) < 0x80 else quote(c, safe="") for c in text)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4, rule by rule: "/a/b/c/./../../g" -> "/a/g", "mid/content=5/../6" -> "mid/6"."""
    source, out = path, ""
    while source:
        if source.startswith("../"):
            source = source[3:]
        elif source.startswith("./"):
            source = source[2:]
        elif source.startswith("/./"):
            source = source[2:]
        elif source == "/.":
            source = "/"
        elif source.startswith("/../") or source == "/..":
            source = "/" + source[4:]
            out = out[: max(out.rfind("/"), 0)]
        elif source in (".", ".."):
            source = ""
        else:
            end = source.find("/", 1)
            end = len(source) if end < 0 else end
            out, source = out + source[:end], source[end:]
    return out


def is_allowed(target: StatusTarget, allowed: Sequence[StatusTarget]) -> bool:
    """A TCP target is allowed when some entry has its host and port (an allowed URL allows its port too);
    an http(s) target when an entry of the same scheme, host and port has a path that prefixes its path."""
    for entry in allowed:
        if (entry.host, entry.port) != (target.host, target.port):
            continue
        if target.scheme == "tcp":
            return True
        if entry.scheme == target.scheme and _path_within(target.path, entry.path):
            return True
    return False


def _path_within(path: str, prefix: str) -> bool:
    path, prefix = path.split("?")[0], prefix.split("?")[0]
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


@dataclass(frozen=True)
class StatusResult:
    target: StatusTarget
    up: bool  # TCP: the port accepted a connection; HTTP: answered with a status below 500
    detail: str  # "HTTP 200 OK", "connection refused", "no answer within 1.0 s", "DNS lookup failed: ..."
    http_status: int | None
    address: str | None  # the IP address contacted
    latency_ms: float


def check_status(target: StatusTarget | str, allowed: Sequence[StatusTarget | str], deadline: float) -> StatusResult:
    """Contact an allow-listed target once, finishing by `deadline` (time.monotonic()).

    ToolRefused("not_allowed") for targets off the list, ("timeout") when the deadline has already passed;
    an unreachable target is a result (up=False), not an error.
    """
    target = parse_target(target) if isinstance(target, str) else target
    allowed_targets = [parse_target(a) if isinstance(a, str) else a for a in allowed]
    if not is_allowed(target, allowed_targets):
        listed = ", ".join(a.label for a in allowed_targets) or "nothing"
        raise ToolRefused(
            "not_allowed",
            f"status target {target.label} is not on the allow-list ({listed}); "
            "add it to allowed_status_targets to check it",
        )
    started = time.monotonic()
    if started >= deadline:
        raise ToolRefused("timeout", f"no time left to check {target.label}: the round's deadline has passed")

    def done(up: bool, detail: str, status: int | None = None, address: str | None = None) -> StatusResult:
        return StatusResult(target, up, detail, status, address, round((time.monotonic() - started) * 1000, 1))

    try:
        addresses = _resolve(target.host, target.port, deadline)
    except TimeoutError:
        return done(False, f"DNS lookup for {target.host} did not finish within the deadline")
    except OSError as err:
        return done(False, f"DNS lookup for {target.host} failed: {err}")
    last_problem = "no address"
    for family, address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return done(False, f"no answer from {target.label} within the deadline")
        connection = socket.socket(family, socket.SOCK_STREAM)
        connection.settimeout(remaining)
        try:
            connection.connect(address)
        except TimeoutError:
            connection.close()
            last_problem = f"no answer within {remaining:.1f} s (filtered or down)"
            continue
        except ConnectionRefusedError:
            connection.close()
            last_problem = "connection refused (nothing is listening)"
            continue
        except OSError as err:
            connection.close()
            last_problem = f"connection failed: {err.strerror or err}"
            continue
        if target.scheme == "tcp":
            connection.close()
            return done(True, "accepting connections", address=address[0])
        try:
            status, reason = _head(connection, target, deadline)
        except (OSError, http.client.HTTPException, ssl.SSLError, ValueError) as err:
            return done(False, f"connected, but HTTP failed: {type(err).__name__}: {err}", address=address[0])
        finally:
            connection.close()
        return done(status < 500, f"HTTP {status} {reason}".strip(), status, address[0])
    return done(False, last_problem)


def _resolve(host: str, port: int, deadline: float) -> list[tuple[int, tuple]]:
    """[(family, sockaddr)] for host; a name is resolved in a daemon thread so a stuck resolver cannot
    hold the round past its deadline (the thread is abandoned, never joined)."""
    try:
        ip = ipaddress.ip_address(host)
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
    except ValueError:
        pass
    box: dict = {}
    finished = threading.Event()

    def lookup() -> None:
        try:
            box["value"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as err:
            box["error"] = err
        finally:
            finished.set()

    threading.Thread(target=lookup, daemon=True, name="surprisegate-dns").start()
    if not finished.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"DNS lookup for {host} timed out")
    if "error" in box:
        raise box["error"]
    return [(family, sockaddr) for family, _, _, _, sockaddr in box["value"]]


def _head(connection: socket.socket, target: StatusTarget, deadline: float) -> tuple[int, str]:
    sock = connection
    if target.scheme == "https":
        context = ssl.create_default_context()
        sock = context.wrap_socket(connection, server_hostname=target.host)
    client = http.client.HTTPConnection(target.host, target.port, timeout=max(0.01, deadline - time.monotonic()))
    client.sock = sock  # already connected (and resolved within the deadline): http.client must not redo it
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    host_header = target.host if ":" not in target.host else f"[{target.host}]"
    default_port = 443 if target.scheme == "https" else 80
    if target.port != default_port:
        host_header += f":{target.port}"
    client.request("HEAD", target.path, headers={"Host": host_header, "User-Agent": USER_AGENT, "Connection": "close"})
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    response = client.getresponse()
    return response.status, response.reason


# --------------------------------------------------------------------------------------------------
# finding a status question in text

STATUS_WORDS = (
    r"\b(?:up|down|online|offline|reachable|unreachable|responding|open|closed|listening|running|ping|status)\b"
)
_STATUS_WORD = re.compile(STATUS_WORDS, re.IGNORECASE)
_URL = re.compile(r"\bhttps?://[^\s'\"<>`()\[\]]{1,2000}", re.IGNORECASE)
_HOST_PORT = re.compile(
    r"(?<![\w./:-])(?P<host>localhost|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]|[a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63}){1,6})"
    r":(?P<port>\d{1,5})\b",
    re.IGNORECASE,
)
_PORT = re.compile(r"\bport\s+(?P<port>\d{1,5})\b", re.IGNORECASE)
_HOST = re.compile(
    r"(?<![\w./:@-])(?P<host>localhost|\d{1,3}(?:\.\d{1,3}){3}"
    r"|[a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63}){0,4}\.(?:com|org|net|io|dev|ai|edu|gov|co|uk|de|fr|app|info|me|local|internal))"
    r"\b(?![./-]\w)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class StatusRequest:
    """What the text asks to check: a full target, or only a host or a port to match against the allow-list."""

    text: str
    target: str | None = None  # "host:port" or a URL, as written
    host: str | None = None
    port: int | None = None

    def describe(self) -> str:
        if self.target:
            return self.target
        return " ".join(part for part in (self.host, f"port {self.port}" if self.port else None) if part)


def extract_status_request(text: str) -> StatusRequest | None:
    """ "Is https://api.example.org/health up?", "is localhost:8000 responding", "is port 8080 open" -> request."""
    if not text or not _STATUS_WORD.search(text[:4000]):
        return None
    text = text[:4000]
    url = _URL.search(text)
    if url:
        return StatusRequest(text, target=url.group().rstrip(".,;:!?"))
    host_port = _HOST_PORT.search(text)
    if host_port:
        return StatusRequest(text, target=host_port.group())
    port = _PORT.search(text)
    host = _HOST.search(text)
    if port or host:
        return StatusRequest(
            text, host=host.group("host").lower() if host else None, port=int(port.group("port")) if port else None
        )
    return None


def resolve_request(request: StatusRequest, allowed: Sequence[StatusTarget]) -> StatusTarget:
    """The allow-listed target a request means; ToolRefused("not_allowed") when none (or several) match."""
    listed = ", ".join(a.label for a in allowed) or "nothing"
    if request.target is not None:
        try:
            return parse_target(request.target)
        except ConfigError as err:
            raise ToolRefused("bad_target", str(err)) from None
    matches = [
        a
        for a in allowed
        if (request.host is None or a.host == request.host) and (request.port is None or a.port == request.port)
    ]
    # "port 8080" means this machine: prefer loopback entries when several hosts listen on that port.
    if request.host is None and len(matches) > 1:
        matches = [a for a in matches if a.host in ("localhost", "127.0.0.1", "::1")] or matches
    if request.host is None and len({(a.host, a.port) for a in matches}) > 1:
        raise ToolRefused("ambiguous", f"port {request.port} matches several allowed targets ({listed}); name the host")
    if not matches:
        raise ToolRefused("not_allowed", f"{request.describe().strip()} is not on the status allow-list ({listed})")
    return matches[0]


def status_evidence(result: StatusResult, field_name: str = "") -> Evidence:
    state = "up" if result.up else "down"
    if result.http_status is not None:
        sentence = f"{result.target.label} answered {result.detail} ({result.latency_ms:g} ms): it is {state}."
    elif result.up:
        sentence = f"{result.target.label} is {state}: {result.detail} ({result.latency_ms:g} ms)."
    else:
        sentence = f"{result.target.label} is {state}: {result.detail}."
    return tool_evidence(
        "status",
        claim=f"{result.target.label} is {state}",
        evidence=sentence,
        tool_input=result.target.label,
        output=result.detail,
        sandbox="allow-list",
        up=result.up,
        http_status=result.http_status,
        address=result.address,
        latency_ms=result.latency_ms,
        field=field_name,
    )

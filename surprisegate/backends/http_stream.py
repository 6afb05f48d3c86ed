"""A small HTTP/1.1 client for inference servers: JSON requests and streamed responses.

Standard library only (`http.client`), so a server backend adds no dependency. One `Endpoint` per server:
plain JSON calls share one kept-alive connection (under a lock); every stream gets a connection of its
own, so closing a stream closes its socket, which is how every inference server learns to abort.
Streams come in the two framings the servers use (../shared/wire/README.md "Framing"): server-sent events
(`data: <json>` events, `data: [DONE]` at the end for the OpenAI-shaped ones) and NDJSON (one JSON object a
line: Ollama's native API). Every server backend (llama-server, vLLM, SGLang, Ollama) talks through here.

Timeouts (seconds): `connect` (TCP + TLS), `first_byte` (until the status line: a server sends it once
the prompt is processed, so it covers prompt processing) and `idle` (between two reads of a stream).
Every failure is a `ServerError` (a `BackendFault`: the loop ends the reply with what it had) whose
message names the URL and the fix; an HTTP error keeps the server's own error body. The timeouts are the
config keys connect_timeout, first_byte_timeout and idle_timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import BackendFault

KEY_ENV = "SURPRISEGATE_SERVER_KEY"
FRAMINGS = ("sse", "ndjson")
# How to start each kind of server, for the message of a refused connection.
START_HINTS = {
    "llama-server": "llama-server -m MODEL.gguf --port {port}",
    "vllm": "vllm serve MODEL --port {port}",
    "sglang": "python -m sglang.launch_server --model-path MODEL --port {port}",
    "ollama": "OLLAMA_HOST=0.0.0.0:{port} ollama serve",
}


class ServerError(BackendFault):
    """An inference server could not be reached, refused a request or broke off a stream."""

    def __init__(
        self, message: str, *, url: str, status: int | None = None, body: Any = None, kind: str = "error"
    ) -> None:
        super().__init__(message, kind=kind, status=status)
        self.url, self.body = url, body


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    first_byte: float = 300.0  # prompt processing of a long prompt on a small CPU: 1,500 tokens took 10 s here
    idle: float = 60.0


class Endpoint:
    """One server: `host:port`, TLS or not, and an optional bearer key (read from the environment by the
    caller, never stored in a config or a receipt; `repr` does not show it)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool = False,
        key: str | None = None,
        timeouts: Timeouts = Timeouts(),
        scheme: str = "llama-server",
    ) -> None:
        self.host, self.port, self.tls, self.timeouts = host, int(port), bool(tls), timeouts
        self._key = key or None
        self.scheme = scheme
        self.base = f"{'https' if tls else 'http'}://{host}:{port}"
        self.uri = f"{scheme}{'+https' if tls else ''}://{host}:{port}"
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def __repr__(self) -> str:
        return f"Endpoint({self.uri!r})"

    # --- connections ------------------------------------------------------------------------------
    def _connect(self) -> http.client.HTTPConnection:
        if self.tls:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeouts.connect, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeouts.connect)
        try:
            conn.connect()
        except ConnectionRefusedError:
            conn.close()
            start = START_HINTS.get(self.scheme, START_HINTS["llama-server"]).format(port=self.port)
            raise ServerError(
                f"{self.base}: connection refused; is the server running on that host and port? "
                f"(start it, e.g. `{start}`, or fix --backend)",
                url=self.base,
                kind="refused",
            ) from None
        except TimeoutError:
            conn.close()
            raise ServerError(
                f"{self.base}: no connection within {self.timeouts.connect:g} s; check the host and "
                "port, or that no firewall drops the packets (or raise connect_timeout)",
                url=self.base,
                kind="connect_timeout",
            ) from None
        except ssl.SSLError as err:
            conn.close()
            raise ServerError(
                f"{self.base}: TLS handshake failed ({err.reason or err}); drop +https for a plain-HTTP "
                "server, or fix its certificate",
                url=self.base,
                kind="tls",
            ) from None
        except OSError as err:
            conn.close()
            raise ServerError(
                f"{self.base}: cannot connect ({err.strerror or err}); check the host and port in --backend",
                url=self.base,
                kind="connect",
            ) from None
        return conn

    def _headers(self, body: bytes | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _send(
        self, conn: http.client.HTTPConnection, method: str, path: str, payload: Any, accept: str = "application/json"
    ) -> http.client.HTTPResponse:
        """Send one request on `conn`, wait for the status line (first-byte timeout), raise on HTTP errors."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode("utf-8")
        url = self.base + path
        try:
            conn.request(method, path, body=body, headers=self._headers(body, accept))
            if conn.sock is not None:
                conn.sock.settimeout(self.timeouts.first_byte)
            response = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise ServerError(
                f"{url}: no response within {self.timeouts.first_byte:g} s (first byte); the server "
                "is busy or stuck: retry, or raise first_byte_timeout (config key)",
                url=url,
                kind="first_byte_timeout",
            ) from None
        except (ConnectionError, http.client.HTTPException, OSError) as err:
            conn.close()
            raise ServerError(
                f"{url}: the connection broke before a response ({type(err).__name__}: {err}); "
                "check that the server is still up",
                url=url,
                kind="reset",
            ) from None
        if response.status >= 400:
            try:
                raw = response.read(65536)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            raise self._http_error(url, response.status, raw)
        if conn.sock is not None:
            conn.sock.settimeout(self.timeouts.idle)
        return response

    def _http_error(self, url: str, status: int, raw: bytes) -> ServerError:
        text = raw.decode("utf-8", "replace").strip()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        message = body
        if isinstance(body, dict):
            err = body.get("error", body)
            message = err.get("message", err) if isinstance(err, dict) else err
        fix = {
            401: "set SURPRISEGATE_SERVER_KEY to the server's API key",
            403: "set SURPRISEGATE_SERVER_KEY to a key this server accepts",
            404: "is this the right kind of server for this --backend scheme?",
            503: "the server is loading or has no free slot: retry shortly",
        }.get(status, "fix the request or the server's settings" if status < 500 else "see the server's log")
        return ServerError(
            f"{url}: HTTP {status}: {str(message)[:500]}; {fix}", url=url, status=status, body=body, kind="http"
        )

    # --- requests -------------------------------------------------------------------------------
    def request_json(self, method: str, path: str, payload: Any = None) -> Any:
        """One JSON request on the kept-alive connection (a stale one is reopened once)."""
        with self._lock:
            for attempt in (0, 1):
                if self._conn is None:
                    self._conn = self._connect()
                conn = self._conn
                try:
                    response = self._send(conn, method, path, payload)
                    raw = response.read()
                except ServerError as err:
                    self._conn = None
                    if err.kind == "reset" and attempt == 0:
                        continue  # a kept-alive connection the server had closed: reopen once
                    raise
                except (OSError, http.client.HTTPException) as err:  # TimeoutError included
                    conn.close()
                    self._conn = None
                    url, stalled = self.base + path, isinstance(err, TimeoutError)
                    why = f"broke off ({err}); check the server"
                    if stalled:
                        why = f"stalled for {self.timeouts.idle:g} s (idle_timeout)"
                    raise ServerError(
                        f"{url}: the response {why}", url=url, kind="idle_timeout" if stalled else "reset"
                    ) from None
                if response.will_close:
                    conn.close()
                    self._conn = None
                try:
                    return json.loads(raw)
                except ValueError:
                    raise ServerError(
                        f"{self.base + path}: the response is not JSON ({raw[:120]!r}); is this the "
                        "right kind of server for the --backend scheme?",
                        url=self.base + path,
                        kind="bad_body",
                    ) from None
        raise AssertionError("unreachable")

    def stream(self, path: str, payload: Any, framing: str = "sse") -> EventStream:
        """POST `payload` and return the stream of the response (its own connection): server-sent events
        ("sse") or one JSON object a line ("ndjson")."""
        if framing not in FRAMINGS:
            raise ValueError(f"framing={framing!r} must be one of {FRAMINGS}")
        conn = self._connect()
        accept = "text/event-stream" if framing == "sse" else "application/x-ndjson"
        response = self._send(conn, "POST", path, payload, accept)
        return EventStream(conn, response, self.base + path, self.timeouts.idle, framing)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class EventStream:
    """The events of one streamed response, as parsed JSON (None for `[DONE]`).

    framing "sse": the `data:` events; comment lines (`:` pings) and other fields are skipped, and an event
    is its data lines joined by newlines. framing "ndjson": every non-blank line is an event.
    `close()` closes the socket: the server sees the client leave and stops generating.
    """

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        url: str,
        idle: float,
        framing: str = "sse",
    ) -> None:
        self._conn, self._response, self.url, self.idle = conn, response, url, idle
        self.framing = framing
        self.closed = False
        self.events = 0

    def __iter__(self) -> Iterator[Any]:
        return self._lines() if self.framing == "ndjson" else self._events()

    def _lines(self) -> Iterator[Any]:
        while not self.closed:
            line = self._readline()
            if not line:  # end of the body
                return
            if line.strip():
                yield self._parse(line.strip())

    def _readline(self) -> bytes:
        try:
            return self._response.readline(1 << 24)
        except TimeoutError:
            self.close()
            raise ServerError(
                f"{self.url}: the stream stalled: no data for {self.idle:g} s; the server is stuck or "
                "overloaded (raise idle_timeout, a config key, for a slow server)",
                url=self.url,
                kind="idle_timeout",
            ) from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            if self.closed:
                return b""
            self.close()
            raise ServerError(
                f"{self.url}: the stream broke off ({type(err).__name__}: {err}); the server closed "
                "the connection mid-reply",
                url=self.url,
                kind="reset",
            ) from None

    def _events(self) -> Iterator[Any]:
        data: list[bytes] = []
        while not self.closed:
            line = self._readline()
            if not line:  # end of the body
                if data:
                    yield self._parse(b"\n".join(data))
                return
            line = line.rstrip(b"\r\n")
            if not line:
                if data:
                    event, data = b"\n".join(data), []
                    yield self._parse(event)
                continue
            if line.startswith(b":"):
                continue  # a comment: keep-alive ping
            field, _, value = line.partition(b":")
            if field == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)

    def _parse(self, event: bytes) -> Any:
        self.events += 1
        if self.framing == "sse" and event.strip() == b"[DONE]":
            return None
        try:
            return json.loads(event)
        except ValueError:
            self.close()
            raise ServerError(
                f"{self.url}: a stream event is not JSON ({event[:120]!r}); the stream is corrupt or "
                "this is not the server the --backend scheme says",
                url=self.url,
                kind="bad_event",
            ) from None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            sock = self._conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the server notices at its next write and aborts the request
                except OSError:
                    pass
            self._response.close()
        finally:
            self._conn.close()


def endpoint_from(
    scheme: str,
    host: str,
    port: int,
    tls: bool = False,
    *,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
) -> Endpoint:
    """The `Endpoint` a registry URI names, with the timeouts given (None: the default) and the bearer key from
    $SURPRISEGATE_SERVER_KEY (never from a config)."""
    defaults = Timeouts()
    timeouts = Timeouts(
        connect=connect_timeout or defaults.connect,
        first_byte=first_byte_timeout or defaults.first_byte,
        idle=idle_timeout or defaults.idle,
    )
    return Endpoint(host, port, tls=tls, key=os.environ.get(KEY_ENV) or None, timeouts=timeouts, scheme=scheme)

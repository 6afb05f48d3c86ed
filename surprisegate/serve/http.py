"""Running the app under uvicorn: in the foreground (`surprisegate serve`) or in a thread (tests, bench).

uvicorn bounds a request body only through the app (read_body: 413, 408) and waits for request headers
for ever; `HeaderDeadline` closes a connection whose headers do not arrive in time (a slowloris client),
with an OpenAI-shaped 408, so slow clients hold a socket for seconds, never a session.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import InputError


def _timeout_response(seconds: float) -> bytes:
    message = f"the request headers did not arrive within {seconds} s; send them at once"
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "request_timeout"}}
    )
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode()


def header_deadline(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a deadline for each request's headers."""
    response = _timeout_response(seconds)

    class HeaderDeadline(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection gets its own deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire, self.cycle)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, armed: Any) -> None:
            # A new cycle means the request's headers were parsed in time; the app bounds its body.
            if self.cycle is armed and not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

    return HeaderDeadline


def uvicorn_config(
    app: Any, host: str, port: int, header_timeout_s: float = 10.0, log_level: str = "info"
) -> uvicorn.Config:
    if not 0 < header_timeout_s <= 600:
        raise InputError(f"header_timeout_s={header_timeout_s!r} must be seconds between 0 and 600, e.g. 10")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=header_deadline(header_timeout_s),
        log_level=log_level,
        timeout_graceful_shutdown=5,
    )


class ServerThread:
    """uvicorn in a daemon thread on a free port (port 0): `start()` returns once it accepts connections."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.server = uvicorn.Server(uvicorn_config(app, host, port, **options))
        self.thread = threading.Thread(target=self.server.run, name="surprisegate-serve", daemon=True)
        self.host = host

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {timeout_s} s")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

"""Faults of an inference server, on a real socket, through the whole loop (http_stream.py + gate/loop.py).

A loopback fake llama.cpp server answers the set-up calls from the captures, then its /completion
misbehaves: the connection refused, reset mid-stream, an HTTP 4xx/5xx with its error body, a silent
server, a slow first byte, a stream without its final chunk. Each reply ends cleanly with what arrived,
its receipt says what happened (finish_reason "error", `fault`), and it ends within the timeout that
applies + 100 ms, timed from the moment the server starts to misbehave.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

from surprisegate.backends.http_stream import Timeouts
from surprisegate.backends.llama_server import from_llama_server
from surprisegate.config import Config
from surprisegate.gate.loop import generate
from test_backend_llama_server import MODELS, FakeServer, captured, json_route, sse_events, tokenize_route

QUESTION = "What is the capital of France?"
TIMEOUT = 0.5  # seconds: the first-byte and idle timeouts of these tests
SLACK = 0.1  # each fault must end the reply within its timeout + 100 ms
BAD_TOKEN = "llamacpp_real_error_bad_token.json"  # a real llama.cpp server's 400 body
DETECT = Config(mode="detect", system_prompt="Answer in one short sentence.", kind_thresholds={})


class Clock:
    """When the fake began to misbehave (monotonic seconds), set from the server's thread."""

    def __init__(self) -> None:
        self.fault_at: float | None = None

    def mark(self) -> None:
        self.fault_at = time.monotonic()


def events() -> list[bytes]:
    return sse_events(captured("llamacpp_completion_token_prompt_stream.sse"))


def head(handler, status: int = 200, ctype: str = "text/event-stream") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def chunk(handler, data: bytes) -> None:
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def wait_for_close(handler, limit: float = 5.0) -> None:
    """Hold the connection open, sending nothing, until the client leaves (or `limit` passes)."""
    handler.connection.settimeout(limit)
    try:
        handler.connection.recv(1)
    except OSError:
        pass
    handler.close_connection = True


def apply_template(body):
    """SmolLM2's ChatML, as the server renders it (the capture's render for the capture's messages)."""
    messages = body["messages"]
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    if messages[-1]["role"] == "assistant":  # the server continues a final assistant message (prefill)
        text = text.removesuffix("<|im_end|>\n")
    elif body.get("add_generation_prompt", True):
        text += "<|im_start|>assistant\n"
    return 200, "application/json", json.dumps({"prompt": text}).encode()


@pytest.fixture()
def server():
    """The loopback fake llama.cpp server: captured set-up answers, the captured stream on /completion."""
    with FakeServer() as fake:
        fake.routes[("GET", "/props")] = json_route(captured("llamacpp_props.json"))
        fake.routes[("GET", "/v1/models")] = json_route(json.dumps(MODELS).encode())
        fake.routes[("POST", "/tokenize")] = tokenize_route
        fake.routes[("POST", "/apply-template")] = apply_template
        fake.routes[("POST", "/completion")] = lambda body: (200, "text/event-stream", events())
        yield fake


def run_loop(fake_server, **timeouts):
    backend = from_llama_server(
        None,
        host="127.0.0.1",
        port=fake_server.port,
        first_byte_timeout=timeouts.get("first_byte", TIMEOUT),
        idle_timeout=timeouts.get("idle", TIMEOUT),
        connect_timeout=timeouts.get("connect", TIMEOUT),
    )
    result = generate(backend, QUESTION, DETECT)
    return result, time.monotonic()


def check_fault(result, kind: str, kept: str) -> dict:
    receipt = result.receipt
    assert result.text == kept and receipt["reply"] == kept  # what arrived before the fault is kept
    assert result.finish_reason == receipt["finish_reason"] == "error"
    fault = receipt["fault"]
    assert fault["kind"] == kind and fault["at_token"] == result.n_tokens
    assert len(receipt["extra"]["token_surprises"]) == result.n_tokens  # the kept tokens keep their signals
    return fault


def test_the_config_defaults_are_the_clients_defaults():
    config, defaults = Config(), Timeouts()
    assert (config.connect_timeout, config.first_byte_timeout, config.idle_timeout) == (
        defaults.connect,
        defaults.first_byte,
        defaults.idle,
    )


def test_connection_refused_ends_the_reply_at_once_with_its_fault(server):
    backend = from_llama_server(None, host="127.0.0.1", port=server.port, connect_timeout=TIMEOUT)
    assert generate(backend, QUESTION, DETECT).text == "The capital of France is Paris."
    server.httpd.shutdown()
    server.httpd.server_close()  # the server goes away between two replies
    started = time.monotonic()
    result = generate(backend, QUESTION, DETECT)
    assert time.monotonic() - started < SLACK
    fault = check_fault(result, "refused", "")
    assert f"127.0.0.1:{server.port}" in fault["message"] and "llama-server -m" in fault["message"]


def test_a_connection_reset_mid_stream_keeps_the_tokens_before_it(server):
    clock = Clock()

    def reset(handler):
        head(handler)
        for event in events()[:2]:
            chunk(handler, event)
        time.sleep(0.05)  # the client has read both events
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        clock.mark()
        handler.connection.close()  # linger 0: an RST, not a clean end
        handler.close_connection = True

    server.routes[("POST", "/completion")] = lambda body: (200, "", reset)
    result, ended = run_loop(server)
    assert ended - clock.fault_at < SLACK
    check_fault(result, "reset", "The capital")


@pytest.mark.parametrize(
    "status,body,says",
    [
        (400, BAD_TOKEN, "Prompt contains invalid tokens"),
        (500, '{"error":{"code":500,"message":"slot crashed","type":"server_error"}}', "slot crashed"),
        (503, '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}', "retry shortly"),
    ],
)
def test_an_http_error_ends_the_reply_with_the_servers_error_body(server, status, body, says):
    clock = Clock()
    payload = captured(body) if body == BAD_TOKEN else body.encode()

    def error(handler):
        clock.mark()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
        handler.wfile.flush()

    server.routes[("POST", "/completion")] = lambda body: (status, "", error)
    result, ended = run_loop(server)
    assert ended - clock.fault_at < SLACK
    fault = check_fault(result, "http", "")
    assert fault["status"] == status and says in fault["message"] and f"HTTP {status}" in fault["message"]


def test_a_silent_server_ends_the_reply_after_the_first_byte_timeout(server):
    clock = Clock()

    def silent(handler):
        clock.mark()
        wait_for_close(handler)

    server.routes[("POST", "/completion")] = lambda body: (200, "", silent)
    result, ended = run_loop(server)
    assert TIMEOUT - 0.02 <= ended - clock.fault_at <= TIMEOUT + SLACK
    fault = check_fault(result, "first_byte_timeout", "")
    assert "first_byte_timeout" in fault["message"]


def test_a_server_that_goes_silent_mid_stream_ends_after_the_idle_timeout(server):
    clock = Clock()

    def stalls(handler):
        head(handler)
        for event in events()[:3]:
            chunk(handler, event)
        clock.mark()
        wait_for_close(handler)

    server.routes[("POST", "/completion")] = lambda body: (200, "", stalls)
    result, ended = run_loop(server)
    assert TIMEOUT - 0.02 <= ended - clock.fault_at <= TIMEOUT + SLACK
    fault = check_fault(result, "idle_timeout", "The capital of")
    assert "idle_timeout" in fault["message"]


def test_a_slow_first_byte_within_the_timeout_is_waited_for(server):
    def slow(handler):
        time.sleep(TIMEOUT * 0.6)
        head(handler)
        for event in events():
            chunk(handler, event)
        chunk(handler, b"")  # the end of the chunked body

    server.routes[("POST", "/completion")] = lambda body: (200, "", slow)
    result, _ = run_loop(server)
    assert result.text == "The capital of France is Paris." and result.finish_reason == "stop"
    assert "fault" not in result.receipt


def test_a_first_byte_later_than_the_timeout_ends_the_reply(server):
    clock = Clock()

    def late(handler):
        clock.mark()
        time.sleep(TIMEOUT * 2)
        try:
            head(handler)
            for event in events():
                chunk(handler, event)
        except OSError:  # the client left after its timeout
            handler.close_connection = True

    server.routes[("POST", "/completion")] = lambda body: (200, "", late)
    result, ended = run_loop(server)
    assert TIMEOUT - 0.02 <= ended - clock.fault_at <= TIMEOUT + SLACK
    check_fault(result, "first_byte_timeout", "")


def test_a_stream_that_ends_without_its_final_chunk_keeps_what_came(server):
    clock = Clock()

    def truncated(handler):
        head(handler)
        for event in events()[:4]:
            chunk(handler, event)
        clock.mark()
        chunk(handler, b"")  # a clean end of the body, but the stop event never came

    server.routes[("POST", "/completion")] = lambda body: (200, "", truncated)
    result, ended = run_loop(server)
    assert ended - clock.fault_at < SLACK
    fault = check_fault(result, "truncated", "The capital of France")
    assert "without its final chunk" in fault["message"]


def test_a_fault_is_shown_in_the_receipt_and_ask_exits_with_its_message(server, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from surprisegate.cli import main
    from surprisegate.gate.receipts import format_receipt

    server.routes[("POST", "/completion")] = lambda body: (200, "text/event-stream", events()[:3])
    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))
    receipts = tmp_path / "r.jsonl"
    out = CliRunner().invoke(
        main,
        ["ask", QUESTION, "--backend", f"llama-server://127.0.0.1:{server.port}", "--mode", "detect"]
        + ["--memory", "none", "--receipts", str(receipts), "--json"],
    )
    assert out.exit_code == 3 and "Traceback" not in out.output
    shown = json.loads(out.stdout.splitlines()[0])
    assert shown["reply"] == "The capital of" and shown["fault"]["kind"] == "truncated"
    assert "the reply ended early after 3 tokens" in out.stderr
    (receipt,) = [json.loads(line) for line in receipts.read_text().splitlines()]
    assert receipt["fault"]["kind"] == "truncated" and receipt["reply"] == "The capital of"
    assert "fault    truncated · 3 reply tokens kept" in format_receipt(receipt)

"""`surprisegate bench server`: `serve` under concurrent clients, as a deployment would see it.

It starts `surprisegate serve` in a subprocess on a free loopback port (the embedded model, the tools,
no memory store), then, all in one run:
  load        `clients` threads x `per_client` requests, streaming and not, one in three intervening.
              Each asks its own sum ("What is A plus B?", every answer distinct): a reply holding another
              request's answer and not its own, or a receipt naming another question or id, is mixed.
              Every answered request's receipt must be in the receipts file exactly once.
  gated       the same questions one at a time, `detect` then `off`: the median of the pairs' latency
              ratios (goal <= 1.10)
  throughput  requests/s with 8 clients / with 1 client, best of two alternating runs each (goal >= 1.5
              where sessions decode together)
  streams     one question the gate grounds, streamed with intervene and with off in alternating pairs:
              time to the first byte and to the first content, and the longest silence on the wire
              (goals: first byte < 0.3 s, no silence over 2 s: keep-alives go out while text is held)
  streams under load  the same, 3 pairs, while 8 other clients keep every session busy and the queue full:
              a stream starts before its turn comes and keep-alives go out while it waits
and checks that the server is healthy afterwards. Then, with serve stopped, the ceiling that throughput
has on this machine: the same model in this process, one `llama_decode` of 8 one-token sequences against
one of a single sequence (`decode_8_over_1`, tokens/s), and a prompt's prefill time against a reply's
decode time (prefill runs alone: it does not batch with other sessions' steps).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..errors import BackendError, InputError

MAX_TOKENS = 24  # replies stay short: the bench measures serving, not writing


def _noop(_: str) -> None:
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def question(k: int) -> tuple[str, str]:
    """Request k's question and its answer, distinct from every other request's."""
    a, b = 2000 + 101 * k, 7 + k % 5
    return f"What is {a} plus {b}?", str(a + b)


@dataclass
class Outcome:
    k: int
    status: int
    ms: float
    text: str = ""
    receipt: dict[str, Any] = field(default_factory=dict)
    header_id: str = ""


# --------------------------------------------------------------------------------------------
# the server under test
# --------------------------------------------------------------------------------------------
class ServeProcess:
    """`surprisegate serve` in a subprocess on a free loopback port; `stop()` ends it."""

    def __init__(self, sessions: int, queue: int, receipts: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "surprisegate", "serve", "--port", str(self.port), "--memory", "none"]
        argv += ["--sessions", str(sessions), "--queue", str(queue), "--receipts", str(receipts)]
        argv += ["--max-tokens", str(MAX_TOKENS)]
        env = {k: v for k, v in os.environ.items() if k not in ("SURPRISE_CANARY", "SURPRISE_INTERVENE")}
        env.pop("SURPRISEGATE_API_KEY", None)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise BackendError(f"serve exited with {self.proc.returncode}: {self.log.read()[-2000:]!r}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BackendError(f"serve did not answer /health within {timeout_s} s on {self.url}")

    def stop(self) -> None:
        if self.proc.poll() is not None:  # already stopped
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# --------------------------------------------------------------------------------------------
# one request
# --------------------------------------------------------------------------------------------
def chat_body(model: str, text: str, stream: bool, mode: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        "surprisegate": {"mode": mode},
    }


def request(url: str, model: str, k: int, stream: bool, mode: str) -> Outcome:
    import httpx

    body = chat_body(model, question(k)[0], stream, mode)
    started = time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as resp:
            if resp.status_code != 200:
                resp.read()
                return Outcome(k, resp.status_code, (time.perf_counter() - started) * 1000)
            text, receipt = _read_stream(resp) if stream else _read_body(resp)
            header = resp.headers.get("x-surprisegate-receipt", "")
    except httpx.HTTPError:
        return Outcome(k, 0, (time.perf_counter() - started) * 1000)
    return Outcome(k, 200, (time.perf_counter() - started) * 1000, text, receipt, header)


def _read_body(resp: Any) -> tuple[str, dict]:
    data = json.loads(resp.read())
    return data["choices"][0]["message"]["content"], data["surprisegate"]["receipt"]


def _read_stream(resp: Any) -> tuple[str, dict]:
    text, receipt = "", cast(dict[str, Any], {})
    for line in resp.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        if chunk.get("choices"):
            text += chunk["choices"][0]["delta"].get("content") or ""
        receipt = chunk.get("surprisegate", {}).get("receipt", receipt)
    return text, receipt


def mixed(outcome: Outcome, answers: dict[int, str]) -> bool:
    """A reply holding another request's answer and not its own, or a receipt of another request."""
    q, own = question(outcome.k)
    reply = outcome.text.replace(",", "")
    others = any(a in reply for k, a in answers.items() if k != outcome.k and a not in q)
    receipt = outcome.receipt
    foreign = (
        receipt.get("prompt") != q
        or receipt.get("reply_id") != outcome.header_id
        or receipt.get("reply") != outcome.text
    )
    return (others and own not in reply) or foreign


# --------------------------------------------------------------------------------------------
# the phases
# --------------------------------------------------------------------------------------------
def run_clients(url: str, model: str, jobs: list[list[tuple[int, bool, str]]]) -> tuple[list[Outcome], float]:
    """Each inner list is one client's requests, run in order; all clients at once. (outcomes, seconds)"""
    out: list[Outcome] = []
    lock = threading.Lock()

    def client(mine: list[tuple[int, bool, str]]) -> None:
        for k, stream, mode in mine:
            o = request(url, model, k, stream, mode)
            with lock:
                out.append(o)

    threads = [threading.Thread(target=client, args=(mine,)) for mine in jobs]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - started


def load_phase(url: str, model: str, clients: int, per_client: int) -> list[Outcome]:
    jobs = [
        [
            (c * per_client + j, (c + j) % 2 == 1, "intervene" if (c * per_client + j) % 3 == 0 else "detect")
            for j in range(per_client)
        ]
        for c in range(clients)
    ]
    return run_clients(url, model, jobs)[0]


def gated_over_plain(url: str, model: str, n: int, first_k: int) -> float:
    """Median over `n` pairs of detect ÷ off latency, the same question one request at a time: a burst of
    load from elsewhere hits both requests of a pair, not one mode's median."""
    ratios = []
    for i in range(n):
        detect = request(url, model, first_k + i, False, "detect").ms
        ratios.append(detect / request(url, model, first_k + i, False, "off").ms)
    return statistics.median(ratios)


def throughput_ratio(url: str, model: str, per_client: int, first_k: int, runs: int = 2) -> float:
    """Requests/s with 8 clients ÷ with 1 client (plain requests, answered ones only); each the best of
    `runs` alternating runs, so load from elsewhere during one run does not decide the ratio."""

    def rate(n_clients: int, base: int) -> float:
        jobs = [[(base + c * per_client + j, False, "off") for j in range(per_client)] for c in range(n_clients)]
        outcomes, seconds = run_clients(url, model, jobs)
        return sum(o.status == 200 for o in outcomes) / seconds

    ones, eights = [], []
    for r in range(runs):
        base = first_k + r * 9 * per_client
        ones.append(rate(1, base))
        eights.append(rate(8, base + per_client))
    return max(eights) / max(ones)


STREAM_QUESTION = "What is 37 times 48?"  # the embedded model gets it wrong: the gate grounds it (calculator)


@dataclass
class StreamTiming:
    first_byte_ms: float  # the response's first line (the role chunk)
    first_content_ms: float  # the first chunk with text
    longest_silence_ms: float  # the longest wait between any two lines (keep-alive comments count)
    fired: bool  # the gate grounded the reply


def timed_stream(url: str, model: str, mode: str) -> StreamTiming:
    """One streamed chat, every line's arrival timed from the request's start."""
    import httpx

    body = chat_body(model, STREAM_QUESTION, True, mode)
    started = time.perf_counter()
    arrivals: list[float] = []
    first_content, receipt = None, cast(dict[str, Any], {})
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as resp:
        for line in resp.iter_lines():
            if not line:
                continue
            arrivals.append((time.perf_counter() - started) * 1000)
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])
                if first_content is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first_content = arrivals[-1]
                receipt = chunk.get("surprisegate", {}).get("receipt", receipt)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    fired = any(r.get("action") == "rewound" for r in receipt.get("rounds", []))
    return StreamTiming(arrivals[0], first_content or arrivals[-1], max(gaps), fired)


def stream_timing(url: str, model: str, pairs: int = 5) -> dict[str, Any]:
    """`pairs` streams of the same question with the gate (intervene) and without (off), alternating: the
    medians of each figure per mode, and the median of the pairs' first-content ratios."""
    runs: dict[str, list[StreamTiming]] = {"off": [], "intervene": []}
    for _ in range(pairs):
        for mode in runs:
            runs[mode].append(timed_stream(url, model, mode))

    def medians(timings: list[StreamTiming]) -> dict[str, Any]:
        return {
            "first_byte_ms": round(statistics.median(t.first_byte_ms for t in timings), 1),
            "first_content_ms": round(statistics.median(t.first_content_ms for t in timings), 1),
            "longest_silence_ms": round(max(t.longest_silence_ms for t in timings), 1),
            "fired": sum(t.fired for t in timings),
        }

    ratios = [g.first_content_ms / o.first_content_ms for g, o in zip(runs["intervene"], runs["off"], strict=True)]
    return {
        "question": STREAM_QUESTION,
        "pairs": pairs,
        **{mode: medians(timings) for mode, timings in runs.items()},
        "first_content_intervene_over_off": round(statistics.median(ratios), 2),
    }


def stream_timing_under_load(url: str, model: str, load_clients: int = 8, pairs: int = 3) -> dict[str, Any]:
    """`stream_timing` while `load_clients` other clients keep every session busy and the queue full of plain
    requests: a stream then waits its turn, and the figures say whether the wire stays moving meanwhile."""
    stop = threading.Event()

    def load(client: int) -> None:
        k = 100_000 + client * 1_000
        while not stop.is_set():
            request(url, model, k, False, "detect")
            k += 1

    threads = [threading.Thread(target=load, args=(c,), daemon=True) for c in range(load_clients)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # the load is running before the first stream
        return {"load_clients": load_clients, **stream_timing(url, model, pairs)}
    finally:
        stop.set()
        for t in threads:
            t.join(120)


def receipts_lost(receipts: Path, answered: list[Outcome]) -> int:
    """Answered requests whose receipt is not in the file exactly once."""
    from ..gate.receipts import read_receipts

    written = [r.get("reply_id") for r in read_receipts(receipts)] if receipts.exists() else []
    return sum(written.count(o.header_id) != 1 for o in answered)


def bench_server(
    clients: int = 32,
    per_client: int = 5,
    sessions: int = 4,
    queue: int = 32,
    progress: Callable[[str], None] = _noop,
) -> dict[str, Any]:
    if not (1 <= clients <= 256 and 1 <= per_client <= 100):
        raise InputError(f"clients={clients}, requests={per_client}: use 1..256 clients and 1..100 requests each")
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        receipts = Path(tmp) / "receipts.jsonl"
        server = ServeProcess(sessions, queue, receipts)
        try:
            progress(f"bench server: starting serve on {server.url} ({sessions} sessions, queue {queue}) ...")
            server.wait_ready()
            model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
            return _measure(server, model, receipts, clients, per_client, sessions, queue, progress)
        finally:
            server.stop()


def decode_ceiling(n: int = 8, steps: int = 32, repeats: int = 3) -> dict[str, float]:
    """Tokens/s of one llama_decode over `n` one-token sequences ÷ over one (best of `repeats` each), and the
    prefill ms of a bench prompt: what batching sessions can give at most on this machine's cores."""
    from ..backends.llamacpp import LlamaCppSessions, from_llamacpp
    from ..config import Config
    from ..gate.prompting import chat_messages

    backend = from_llamacpp(sessions=n)
    assert isinstance(backend, LlamaCppSessions)  # sessions > 1
    prompt = backend.tokenize(backend.chat_prompt(chat_messages(question(0)[0], Config().system_prompt)), special=True)
    rates = {}
    for width in (1, n):
        best = 0.0
        for _ in range(repeats):
            best = max(best, backend.lockstep_rate(width, prompt, steps))
        rates[width] = best
    started = time.perf_counter()
    backend.lockstep_rate(1, prompt, 0)  # the prompt's prefill alone
    prefill_ms = (time.perf_counter() - started) * 1000
    return {
        f"decode_{n}_over_1": round(rates[n] / rates[1], 3),
        "decode_tok_s_1": round(rates[1], 1),
        f"decode_tok_s_{n}": round(rates[n], 1),
        "prefill_ms": round(prefill_ms, 1),
        "prompt_tokens": len(prompt),
    }


def _measure(
    server: ServeProcess,
    model: str,
    receipts: Path,
    clients: int,
    per_client: int,
    sessions: int,
    queue: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    import httpx

    progress(f"bench server: {clients} clients x {per_client} requests ...")
    outcomes = load_phase(server.url, model, clients, per_client)
    answers = {k: question(k)[1] for k in range(clients * per_client)}
    answered = [o for o in outcomes if o.status == 200]
    latencies = sorted(o.ms for o in answered)
    progress("bench server: gated ÷ plain latency, one request at a time ...")
    first_k = clients * per_client
    gated = gated_over_plain(server.url, model, 10, first_k)
    progress("bench server: throughput with 8 clients ÷ 1 client ...")
    throughput = throughput_ratio(server.url, model, 4, first_k + 10)
    progress("bench server: streams with the gate and without (first byte, first content, longest silence) ...")
    streams = stream_timing(server.url, model)
    progress("bench server: the same streams while 8 other clients keep the sessions and queue busy ...")
    streams_loaded = stream_timing_under_load(server.url, model)
    after = request(server.url, model, 0, False, "detect")
    healthy = httpx.get(server.url + "/health").json().get("status") == "ok" and after.status == 200
    server.stop()  # the ceiling is measured on an idle machine
    progress("bench server: the machine's ceiling (llama_decode of 8 one-token sequences ÷ 1) ...")
    ceiling = decode_ceiling()
    return {
        "requests": len(outcomes),
        "answered": len(answered),
        "rejected_429": sum(o.status == 429 for o in outcomes),
        "failed": sum(o.status not in (200, 429) for o in outcomes),
        "mixed": sum(mixed(o, answers) for o in answered),
        "receipts_lost": receipts_lost(receipts, answered),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p95_ms": round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 1) if latencies else None,
        "gated_over_plain": round(gated, 3),
        "throughput_8_over_1": round(throughput, 3),
        "streams": streams,
        "streams_under_load": streams_loaded,
        "ceiling": ceiling,
        "healthy_after": healthy,
        "clients": clients,
        "per_client": per_client,
        "sessions": sessions,
        "queue": queue,
        "max_tokens": MAX_TOKENS,
    }

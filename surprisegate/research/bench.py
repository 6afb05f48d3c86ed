"""Benchmarks that measure a ratio against a baseline in the same run, on the same loaded model.

decode: detect-mode tokens/s (our loop, scoring every token) ÷ plain llama-cpp-python greedy
        `Llama.generate` tokens/s, same model, same prompt, same tokens; and the same with the trigger
        probe's layer tap on (a second copy of the model, `probe = "auto"`).
rewind: (continue from the context minus a 16-token span plus a 30-token segment, then re-decode 16, all
        through the session seam) ÷ re-prefilling the whole context.
Repeats interleave baseline and candidates, the order rotated and reversed from one repeat to the next, so
drift in machine load hits every arm alike. A ratio is reported with a paired bootstrap interval over the
repeats (`paired_ratio_interval`): on a shared machine the spread between repeats is larger than the effect.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..gate.prompting import PromptLayout, chat_messages
from ..gate.surprise import percentile

DECODE_PROMPT = "Write a long, detailed essay about the history of the Roman Empire, from its founding to its fall."
# `bench decode --paragraph`: the paragraph, decoded in sentence scope (every sentence judged).
PARAGRAPH_PROMPT = (
    "Write a short paragraph about Chad: its capital, currency, official languages and neighbouring countries."
)


def _noop(_: str) -> None:
    pass


def paired_ratio_interval(
    candidate: list[float], baseline: list[float], resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """sum(candidate) / sum(baseline) over repeats, with a percentile bootstrap interval that resamples
    whole repeats: a candidate run and the baseline run beside it share that moment's machine load."""
    if len(candidate) != len(baseline) or not candidate:
        raise ValueError(f"paired runs: {len(candidate)} candidate and {len(baseline)} baseline figures")
    n = len(candidate)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        draws.append(sum(candidate[i] for i in idx) / sum(baseline[i] for i in idx))
    draws.sort()
    tail = 100.0 * (1.0 - level) / 2
    low, high = percentile(draws, tail), percentile(draws, 100.0 - tail)
    ratio = sum(candidate) / sum(baseline)
    return {"ratio": round(ratio, 4), "low": round(min(low, ratio), 4), "high": round(max(high, ratio), 4)}


def repeat_order(names: list[str], i: int) -> list[str]:
    """Repeat i's order: rotated by i and reversed on odd rounds, so over 2×len(names) repeats every arm
    runs in every position, both after and before each other arm."""
    k = (i // 2) % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if i % 2 else order


def machine_note(n_threads: int | None) -> dict[str, Any]:
    """What decides a CPU decode's speed besides our code: governor, cores, threads, load at the start."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", encoding="ascii") as f:
            governor = f.read().strip()
    except OSError:
        governor = "unknown (no cpufreq in /sys: a VM or container)"
    return {
        "cpu_governor": governor,
        "cpu_count": os.cpu_count(),
        "n_threads": n_threads,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def _detect_run(backend, config: Config, prompt: str = DECODE_PROMPT) -> tuple[list[int], float]:
    """The decode prompt through the loop (detect mode): the visible token ids and the seconds taken."""
    from ..gate.events import Done, Token
    from ..gate.loop import stream

    out: list[int] = []
    t0 = time.perf_counter()
    for ev in stream(backend, prompt, config):
        if isinstance(ev, Token):
            out.append(-1 if ev.token_id is None else ev.token_id)  # steerable backends always give ids
        elif isinstance(ev, Done):
            break
    return out, time.perf_counter() - t0


def plain_run(backend, prompt_tokens: list[int], n_tokens: int) -> tuple[list[int], float]:
    """The baseline: llama-cpp-python's own greedy `Llama.generate` from a reset context, up to `n_tokens`
    or the end of the turn; the token ids and the seconds taken."""
    llama = backend._llama
    llama.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llama.generate(prompt_tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if tok in backend.eos_token_ids or len(out) >= n_tokens:
            break
        out.append(tok)
    return out, time.perf_counter() - t0


def bench_decode(
    n_tokens: int = 64, repeats: int = 40, progress: Callable[[str], None] = _noop, paragraph: bool = False
) -> dict:
    """`paragraph`: the paragraph prompt in sentence scope, each finished sentence judged on its claim tokens."""
    from ..backends.llamacpp import LlamaCppBackend, from_llamacpp

    backend = from_llamacpp(None, n_ctx=2048)
    assert isinstance(backend, LlamaCppBackend)  # sessions=1: the one-context backend
    llama = backend._llama
    prompt, scope = (PARAGRAPH_PROMPT, "sentence") if paragraph else (DECODE_PROMPT, "reply")
    # The same tokens as plain decoding: a reply ending whole (cut at a blank line or unfinished sentence) would
    # compare fewer; what is timed is the per-token cost of detection.
    config = Config(
        mode="detect",
        max_tokens=n_tokens,
        max_rounds=0,
        system_prompt="",
        claim_scope=scope,
        long_reply_ends_whole=False,
    )
    layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(prompt))
    prompt_tokens = layout.body_tokens(backend.tokenize) + layout.open_tokens(backend.tokenize)

    def plain() -> tuple[list[int], float]:
        return plain_run(backend, prompt_tokens, n_tokens)

    def detect() -> tuple[list[int], float]:
        return _detect_run(backend, config, prompt)

    # The probe's layer tap on a second copy (its context is made anew with the callback), as `probe = "auto"`
    # sets it up: states read at every step where the probe judges (reply scope), the tap paused in sentence scope.
    tapped, tapped_config = _tapped_copy(config)

    def detect_tapped() -> tuple[list[int], float]:
        return _detect_run(tapped, tapped_config, prompt)

    runs: dict[str, tuple[Callable[[], tuple[list[int], float]], list[float]]] = {
        "plain": (plain, []),
        "detect": (detect, []),
        "detect_tapped": (detect_tapped, []),
    }
    for fn, _ in runs.values():
        fn()  # warm-up: page in weights, build caches
    tokens: dict[str, list[int]] = {}
    same_tokens = True
    for i in range(repeats):
        for name in repeat_order(list(runs), i):
            fn, sink = runs[name]
            tokens[name], seconds = fn()
            sink.append(len(tokens[name]) / seconds)
        same_tokens &= tokens["plain"] == tokens["detect"] == tokens["detect_tapped"]
        progress(
            f"decode repeat {i + 1}/{repeats}: " + ", ".join(f"{name} {runs[name][1][-1]:.1f} tok/s" for name in runs)
        )
    tps = {name: statistics.fmean(sink) for name, (_, sink) in runs.items()}  # mean/mean is the ratio of sums
    detect_ci = paired_ratio_interval(runs["detect"][1], runs["plain"][1])
    tapped_ci = paired_ratio_interval(runs["detect_tapped"][1], runs["plain"][1])
    return {
        "benchmark": "decode_paragraph" if paragraph else "decode",
        "prompt": prompt,
        "claim_scope": scope,
        "ratio": detect_ci["ratio"],
        "ratio_95ci": [detect_ci["low"], detect_ci["high"]],
        "target": ">= 0.97 at the interval's lower bound",
        "tapped_ratio": tapped_ci["ratio"],
        "tapped_ratio_95ci": [tapped_ci["low"], tapped_ci["high"]],
        "repeats": repeats,
        "machine": machine_note(getattr(llama, "n_threads", None)),
        "tap": "compiled" if tapped._tap.native else "python",
        "detect_tokens_per_s": round(tps["detect"], 2),
        "detect_tapped_tokens_per_s": round(tps["detect_tapped"], 2),
        "plain_tokens_per_s": round(tps["plain"], 2),
        **{f"{name}_runs": [round(x, 2) for x in sink] for name, (_, sink) in runs.items()},
        "tokens_per_run": {name: len(toks) for name, toks in tokens.items()},
        "same_tokens": same_tokens,
        "model": backend.model_id,
        "prompt_tokens": len(prompt_tokens),
    }


def _tapped_copy(config: Config) -> tuple[Any, Config]:
    """A second copy of the embedded model with the shipped probe's layer tapped, and the config that
    turns the probe on (the loop reads hidden states where the probe judges: the first sentence in reply
    scope, every sentence in sentence scope)."""
    from ..backends.llamacpp import LlamaCppBackend, from_llamacpp
    from ..gate.probe import resolve_probe

    tapped = from_llamacpp(None, n_ctx=2048)
    assert isinstance(tapped, LlamaCppBackend)  # sessions=1: the one-context backend, which taps a layer
    probe = resolve_probe("auto", tapped.model_id, config.sentence_scope)
    if probe is None:
        raise RuntimeError(f"no probe ships for {tapped.model_id}; the tapped run needs one")
    tapped.tap_layer(probe.layer)
    return tapped, config.replace(probe="auto")


def _filler_text(n_sentences: int) -> str:
    subjects = ["The river", "A committee", "The old bridge", "Our library", "The northern station", "A small museum"]
    verbs = ["opened", "was rebuilt", "closed", "expanded", "was renamed", "moved"]
    return " ".join(
        f"{subjects[i % 6]} number {i} {verbs[(i * 7) % 6]} in {1800 + (i * 37) % 220}." for i in range(n_sentences)
    )


def bench_rewind(
    context_tokens: int = 1500,
    repeats: int = 5,
    span: int = 16,
    segment_tokens: int = 30,
    progress: Callable[[str], None] = _noop,
) -> dict:
    from ..backends import Sampling
    from ..backends.llamacpp import from_llamacpp

    backend = from_llamacpp(None, n_ctx=max(2048, context_tokens + 256))
    tokens = backend.tokenize(_filler_text(400))
    if len(tokens) < context_tokens:
        raise RuntimeError(f"filler text gave only {len(tokens)} tokens")
    context = tokens[:context_tokens]
    segment = backend.tokenize(_filler_text(40))[:segment_tokens]

    def reprefill() -> float:
        session = backend.session()
        t0 = time.perf_counter()
        session.steps(context, Sampling(scored=False))  # feeds the whole context (eager), decodes nothing
        return time.perf_counter() - t0

    def rewind() -> float:
        """Through the loop's seam: continue from the context minus the span plus the evidence segment
        (the session keeps the rest of its cache), then decode the span again, scoring every token."""
        session = backend.session()
        session.steps(context, Sampling(scored=False))  # the state at trigger time (not timed)
        t0 = time.perf_counter()
        steps = session.steps(context[:-span] + segment, Sampling())
        for _ in range(span):
            next(steps)
        elapsed = time.perf_counter() - t0
        steps.close()
        return elapsed

    reprefill()
    rewind()  # warm-up
    base, cand = [], []
    for i in range(repeats):
        if i % 2 == 0:
            base.append(reprefill())
            cand.append(rewind())
        else:
            cand.append(rewind())
            base.append(reprefill())
        progress(
            f"rewind repeat {i + 1}/{repeats}: re-prefill {base[-1] * 1000:.0f} ms, rewind+inject+re-decode "
            f"{cand[-1] * 1000:.0f} ms"
        )
    b, c = statistics.median(base), statistics.median(cand)
    return {
        "benchmark": "rewind",
        "ratio": round(c / b, 4),
        "target": "<= 0.1",
        "rewind_inject_redecode_ms": round(c * 1000, 2),
        "reprefill_ms": round(b * 1000, 2),
        "rewind_runs_ms": [round(x * 1000, 2) for x in cand],
        "reprefill_runs_ms": [round(x * 1000, 2) for x in base],
        "context_tokens": context_tokens,
        "rewound_tokens": span,
        "injected_tokens": len(segment),
        "redecoded_tokens": span,
        "model": backend.model_id,
    }


def _median_ratio(num: list[float], den: list[float]) -> float:
    return round(statistics.median(num) / statistics.median(den), 4)


def bench_http(
    backend_uri: str | None = None,
    context_tokens: int = 1500,
    n_tokens: int = 256,
    repeats: int = 5,
    span: int = 16,
    segment_tokens: int = 30,
    progress: Callable[[str], None] = _noop,
) -> dict:
    """Over a llama.cpp server (started here on a free loopback port unless `backend_uri` names one):

    resume_ratio: the server's own prompt-processing time (`timings.prompt_ms`) of the request that resumes
        after a real rewind and injection (steps(context), then steps(context[:-span] + segment)) ÷ that of a
        cold request of the same length (its first token differs each time, so nothing of it is cached).
    stream_ratio: detect-mode tokens/s through our loop ÷ plain /completion streaming tokens/s with the same
        n_probs (20), no scoring; the server's own cost of n_probs 20 (plain n_probs 0 vs 20) beside it.
    """
    from ..backends import Sampling
    from ..backends.http_session import SIGNAL_TOP_K, ServerBackend
    from ..backends.llama_server import LlamaServerBackend, LlamaServerProcess
    from ..backends.registry import open_backend
    from ..errors import ConfigError

    server: LlamaServerProcess | None = None
    if backend_uri is None:
        server = LlamaServerProcess(n_ctx=max(4096, context_tokens + segment_tokens + n_tokens + 64)).start()
        backend_uri = server.uri
        progress(f"started {' '.join(server.argv())}")
    opened = open_backend(backend_uri)
    if not isinstance(opened, LlamaServerBackend):  # the plain runs below post to llama-server's /completion
        if isinstance(opened, ServerBackend):
            opened.close()
        raise ConfigError(f"bench http needs a llama-server://HOST:PORT backend, not {backend_uri!r}")
    backend = opened
    try:
        # --- resume_ratio -----------------------------------------------------------------------------
        tokens = backend.tokenize(_filler_text(400))
        if len(tokens) < context_tokens:
            raise RuntimeError(f"filler text gave only {len(tokens)} tokens")
        context = tokens[:context_tokens]
        segment = backend.tokenize(_filler_text(40))[:segment_tokens]
        resumed = context[:-span] + segment
        words = "Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliet Kilo Lima Mike November Oscar Papa"
        firsts = [t for t in dict.fromkeys(backend.tokenize(w)[0] for w in words.split()) if t != context[0]]
        no_scoring = Sampling(scored=False)

        def first_request(session: Any, prompt: list[int]) -> dict:
            steps = session.steps(prompt, no_scoring)  # sends it and reads the first chunk (its timings)
            steps.close()
            return dict(session.requests[-1])

        def cold(i: int) -> dict:
            prompt = [firsts[i % len(firsts)], *resumed[1:]]
            return first_request(backend.session(), prompt)

        def resume(_: int) -> dict:
            session = backend.session()
            first_request(session, context)  # the state at trigger time (not timed)
            rec = first_request(session, resumed)
            rec["last_continue"] = list(session.last_continue)
            return rec

        cold(len(firsts) - 1)
        resume(0)  # warm-up
        colds: list[dict] = []
        resumes: list[dict] = []
        for i in range(repeats):
            order = ((cold, colds), (resume, resumes)) if i % 2 == 0 else ((resume, resumes), (cold, colds))
            for fn, sink in order:
                sink.append(fn(i))
            progress(
                f"resume repeat {i + 1}/{repeats}: cold {colds[-1]['prompt_ms']:.1f} ms "
                f"({colds[-1]['prompt_n']} tokens, {colds[-1]['cached']} cached), resume "
                f"{resumes[-1]['prompt_ms']:.1f} ms ({resumes[-1]['prompt_n']} tokens, {resumes[-1]['cached']} cached)"
            )
        cold_ms = [float(r["prompt_ms"]) for r in colds]
        resume_ms = [float(r["prompt_ms"]) for r in resumes]

        # --- stream_ratio -----------------------------------------------------------------------------
        config = Config(mode="detect", max_tokens=n_tokens, max_rounds=0, system_prompt="")
        layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(DECODE_PROMPT))
        prompt_tokens = layout.body_tokens(backend.tokenize) + layout.open_tokens(backend.tokenize)

        def detect() -> tuple[list[int], float]:
            return _detect_run(backend, config)

        def plain(n_probs: int) -> tuple[list[int], float]:
            body = {
                "prompt": prompt_tokens,
                "n_predict": n_tokens,
                "stream": True,
                "cache_prompt": True,
                "return_tokens": True,
                "n_probs": n_probs,
                "temperature": 0,
                "samplers": ["temperature"],
                "ignore_eos": False,
            }
            out: list[int] = []
            t0 = time.perf_counter()
            events = backend.endpoint.stream("/completion", body, framing="sse")
            try:
                for event in events:
                    if isinstance(event, dict):
                        out.extend(int(t) for t in event.get("tokens") or [])
                        if event.get("stop"):
                            break
            finally:
                events.close()
            return out, time.perf_counter() - t0

        def plain20() -> tuple[list[int], float]:
            return plain(SIGNAL_TOP_K)

        def plain0() -> tuple[list[int], float]:
            return plain(0)

        for warm in (plain0, plain20, detect):  # warm-up
            warm()
        runs: dict[str, list[float]] = {"detect": [], "plain20": [], "plain0": []}
        counts: dict[str, int] = {}
        toks: dict[str, list[int]] = {}
        same_tokens = True
        fns = {"detect": detect, "plain20": plain20, "plain0": plain0}
        for i in range(repeats):
            names = ["plain20", "detect", "plain0"] if i % 2 == 0 else ["plain0", "detect", "plain20"]
            for name in names:
                got, seconds = fns[name]()
                runs[name].append(len(got) / seconds)
                counts[name], toks[name] = len(got), got
            same_tokens &= toks["detect"] == toks["plain20"]
            progress(
                f"stream repeat {i + 1}/{repeats}: detect {runs['detect'][-1]:.1f} tok/s, plain n_probs 20 "
                f"{runs['plain20'][-1]:.1f} tok/s, plain n_probs 0 {runs['plain0'][-1]:.1f} tok/s"
            )
        med = {k: statistics.median(v) for k, v in runs.items()}
        return {
            "benchmark": "http",
            "resume_ratio": _median_ratio(resume_ms, cold_ms),
            "resume_target": "resume_ratio <= 0.1",
            "stream_ratio": _median_ratio(runs["detect"], runs["plain20"]),
            "stream_target": "stream_ratio >= 0.97",
            "n_probs_cost": round(1 - med["plain20"] / med["plain0"], 4),
            "resume_prompt_ms": round(statistics.median(resume_ms), 3),
            "cold_prompt_ms": round(statistics.median(cold_ms), 3),
            "resume_runs_ms": [round(x, 3) for x in resume_ms],
            "cold_runs_ms": [round(x, 3) for x in cold_ms],
            "resume_prompt_n": [r["prompt_n"] for r in resumes],
            "resume_cached": [r["cached"] for r in resumes],
            "resume_continue": resumes[-1]["last_continue"],
            "cold_prompt_n": [r["prompt_n"] for r in colds],
            "cold_cached": [r["cached"] for r in colds],
            "context_tokens": context_tokens,
            "rewound_tokens": span,
            "injected_tokens": len(segment),
            "resume_request_tokens": len(resumed),
            "detect_tokens_per_s": round(med["detect"], 2),
            "plain_tokens_per_s": round(med["plain20"], 2),
            "plain_n_probs0_tokens_per_s": round(med["plain0"], 2),
            "detect_runs": [round(x, 2) for x in runs["detect"]],
            "plain_runs": [round(x, 2) for x in runs["plain20"]],
            "plain_n_probs0_runs": [round(x, 2) for x in runs["plain0"]],
            "tokens_per_run": counts,
            "same_tokens": same_tokens,
            "n_probs": SIGNAL_TOP_K,
            "prompt_tokens": len(prompt_tokens),
            "backend": backend_uri,
            "server_started_here": server is not None,
            "model": backend.model_id,
            "build_info": backend.build_info,
        }
    finally:
        backend.close()
        if server is not None:
            server.stop()

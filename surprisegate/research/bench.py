"""Benchmarks that measure a ratio against a baseline in the same run, on the same loaded model.

decode: detect-mode tokens/s (our loop, scoring every token) ÷ plain llama-cpp-python greedy
        `Llama.generate` tokens/s, same model, same prompt, same tokens.
rewind: (continue from the context minus a 16-token span plus a 30-token segment, then re-decode 16, all
        through the session seam) ÷ re-prefilling the whole context.
Repeats alternate baseline and candidate so drift in machine load hits both; medians are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from ..config import Config
from ..prompting import PromptLayout, chat_messages

DECODE_PROMPT = "Write a long, detailed essay about the history of the Roman Empire, from its founding to its fall."


def _noop(_: str) -> None:
    pass


def bench_decode(n_tokens: int = 256, repeats: int = 5, progress: Callable[[str], None] = _noop) -> dict:
    from ..backends.llamacpp import from_llamacpp
    from ..controller import stream
    from ..events import Done, Token

    backend = from_llamacpp(None, n_ctx=2048)
    llama = backend._llama
    config = Config(mode="detect", max_tokens=n_tokens, max_rounds=0, system_prompt="")
    layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(DECODE_PROMPT))
    prompt_tokens = layout.body_tokens(backend.tokenize) + layout.open_tokens(backend.tokenize)

    def plain() -> tuple[list[int], float]:
        llama.reset()
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in llama.generate(
            prompt_tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
            if tok in backend.eos_token_ids or len(out) >= n_tokens:
                break
            out.append(tok)
        return out, time.perf_counter() - t0

    def detect() -> tuple[list[int], float]:
        out: list[int] = []
        t0 = time.perf_counter()
        for ev in stream(backend, DECODE_PROMPT, config):
            if isinstance(ev, Token):
                out.append(ev.token_id)
            elif isinstance(ev, Done):
                break
        return out, time.perf_counter() - t0

    plain()
    detect()  # warm-up: page in weights, build caches
    plain_s: list[float] = []
    detect_s: list[float] = []
    same_tokens = True
    n_plain = n_detect = 0
    for i in range(repeats):
        for name, fn, sink in (
            (("plain", plain, plain_s), ("detect", detect, detect_s))
            if i % 2 == 0
            else (("detect", detect, detect_s), ("plain", plain, plain_s))
        ):
            toks, seconds = fn()
            sink.append(len(toks) / seconds)
            if name == "plain":
                plain_toks, n_plain = toks, len(toks)
            else:
                detect_toks, n_detect = toks, len(toks)
        same_tokens &= plain_toks == detect_toks
        progress(f"decode repeat {i + 1}/{repeats}: plain {plain_s[-1]:.1f} tok/s, detect {detect_s[-1]:.1f} tok/s")
    plain_tps, detect_tps = statistics.median(plain_s), statistics.median(detect_s)
    return {
        "benchmark": "decode",
        "ratio": round(detect_tps / plain_tps, 4),
        "target": ">= 0.97",
        "detect_tokens_per_s": round(detect_tps, 2),
        "plain_tokens_per_s": round(plain_tps, 2),
        "detect_runs": [round(x, 2) for x in detect_s],
        "plain_runs": [round(x, 2) for x in plain_s],
        "tokens_per_run": {"plain": n_plain, "detect": n_detect},
        "same_tokens": same_tokens,
        "model": backend.model_id,
        "prompt_tokens": len(prompt_tokens),
    }


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

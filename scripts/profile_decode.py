"""Where a decoded token's time goes besides llama.cpp's own decode, part by part: our loop (detect, sentence
scope, with or without the probe's layer tap) against plain `Llama.generate`, same model, prompt and tokens.

    python scripts/profile_decode.py --repeats 10 [--json results/bench/decode_parts.json]

Each part is timed in place with perf_counter_ns (a wrapper costs ~0.3 us a call), so the figures are what
the parts cost inside a real decode, where the logits llama.cpp just wrote are slower to read than in a
micro-benchmark. `llama_decode` is the C call itself; "outside decode" is everything else a run spends per
token, the run's setup and its result included. Plain's `sample` reads the logits once in C, as our
softmax pass does: the two are the like-for-like pair. Ratios belong to `surprisegate bench decode`; this
says why they are what they are.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class PartTimer:
    """Wraps attributes of classes or modules so that each call's time is added to its part's total;
    `restore()` puts the originals back (the script may run inside another process, a test's)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self._originals: list[tuple[Any, str, Any]] = []

    def restore(self) -> None:
        for owner, name, inner in reversed(self._originals):
            setattr(owner, name, inner)
        self._originals.clear()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)
        self._originals.append((owner, name, inner))

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                self.ns[label] = self.ns.get(label, 0) + time.perf_counter_ns() - start

        setattr(owner, name, timed)

    def clear(self) -> None:
        self.ns.clear()


def measure(run: Callable[[], tuple[list[int], float]], timer: PartTimer, repeats: int) -> dict[str, Any]:
    """Per-token microseconds of each part over `repeats` runs (after one warm-up run)."""
    run()
    timer.clear()
    seconds, tokens = 0.0, 0
    for _ in range(repeats):
        out, s = run()
        seconds, tokens = seconds + s, tokens + len(out)
    decode = timer.ns.get("llama_decode", 0)
    parts = {k: round(v / tokens / 1e3, 1) for k, v in sorted(timer.ns.items(), key=lambda kv: -kv[1])}
    return {
        "tokens": tokens,
        "us_per_token": round(seconds / tokens * 1e6, 1),
        "outside_decode_us_per_token": round((seconds * 1e9 - decode) / tokens / 1e3, 1),
        "parts_us_per_token": parts,
    }


def _profile(timer: PartTimer, n_tokens: int, repeats: int) -> dict[str, Any]:
    import llama_cpp

    import surprisegate.backends as backends
    from surprisegate.backends.llamacpp import LlamaCppBackend, from_llamacpp
    from surprisegate.config import Config
    from surprisegate.gate import trigger
    from surprisegate.gate.prompting import PromptLayout, chat_messages
    from surprisegate.research import bench

    prompt = bench.PARAGRAPH_PROMPT
    config = Config(mode="detect", max_tokens=n_tokens, max_rounds=0, system_prompt="", claim_scope="sentence")
    plain_model = from_llamacpp(None, n_ctx=2048)
    assert isinstance(plain_model, LlamaCppBackend)
    tapped_model, tapped_config = bench._tapped_copy(config)  # the shipped probe's layer tapped, as bench decode
    for model in (plain_model, tapped_model):  # the C call alone, whichever path makes it
        ctx = model._llama._ctx
        timer.wrap(ctx, "decode", "llama_decode")
    timer.wrap(llama_cpp.Llama, "eval", "Llama.eval (with its decode)")
    timer.wrap(llama_cpp.Llama, "sample", "Llama.sample (plain: reads the logits in C)")
    timer.wrap(backends.Sampling, "stats", "Sampling.stats (softmax pass)")
    timer.wrap(backends.Sampling, "step", "Sampling.step")
    timer.wrap(backends, "hidden_state_of", "hidden_state_of (tapped copy)")
    timer.wrap(LlamaCppBackend, "_last_logits", "LlamaCppBackend._last_logits")
    timer.wrap(trigger.TriggerPolicy, "push", "TriggerPolicy.push (sentence judge)")

    layout = PromptLayout.from_template(plain_model.chat_prompt, chat_messages(prompt))
    prompt_tokens = layout.body_tokens(plain_model.tokenize) + layout.open_tokens(plain_model.tokenize)

    def plain() -> tuple[list[int], float]:
        return bench.plain_run(plain_model, prompt_tokens, n_tokens)

    return {
        "prompt": prompt,
        "repeats": repeats,
        "plain": measure(plain, timer, repeats),
        "detect": measure(lambda: bench._detect_run(plain_model, config, prompt), timer, repeats),
        "detect_tapped": measure(lambda: bench._detect_run(tapped_model, tapped_config, prompt), timer, repeats),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    timer = PartTimer()
    try:
        figures = _profile(timer, args.tokens, args.repeats)
    finally:
        timer.restore()
    for arm in ("plain", "detect", "detect_tapped"):
        f = figures[arm]
        print(f"{arm}: {f['us_per_token']} us a token, {f['outside_decode_us_per_token']} us outside llama_decode")
        for part, us in f["parts_us_per_token"].items():
            print(f"    {part}: {us} us")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

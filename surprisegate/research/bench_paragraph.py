"""`surprisegate bench paragraph`: the pause a reader sees while a paragraph is grounded.

Each prompt is streamed twice through the loop with holdback streaming, `off` and `intervene` (the order
alternates between prompts), the same model, arms and config. Per reply: the time to the first shown token,
and the longest gap between two shown sentences (from the first token, each sentence counted when its last
token is shown; the reply's end closes the last one). The extra gap a grounding round adds is intervene's
longest gap minus off's on the same prompt, over the prompts where intervene rewrote a sentence; p50/p95
of each, against off in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..arms import Arm
from ..config import Config
from ..gate.events import Done, Token
from ..gate.loop import stream
from ..gate.surprise import percentile
from ..text import sentence_end


def shown_times(backend, prompt: str, config: Config, arms: Mapping[str, Arm]) -> tuple[float, list[float], list]:
    """(time to the first shown token, times at which each shown sentence was complete, rounds) of one reply."""
    started = time.perf_counter()
    first, marks, text, done_at = None, [], "", 0
    rounds: list = []
    for event in stream(backend, prompt, config, arms):
        now = time.perf_counter() - started
        if isinstance(event, Token):
            first = now if first is None else first
            text += event.text
            while (end := sentence_end(text, done_at)) is not None:
                marks.append(now)
                done_at = end
        elif isinstance(event, Done):
            rounds = event.rounds
            if text[done_at:].strip():
                marks.append(now)
    return (first if first is not None else time.perf_counter() - started), marks, rounds


def longest_gap(first: float, marks: Sequence[float]) -> float:
    """The longest wait between two shown sentences, the first token opening the first one."""
    points = [first, *marks]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    ordered = sorted(values)  # percentile() reads a sorted sequence
    return {
        "p50": round(percentile(ordered, 50) * 1000, 1),
        "p95": round(percentile(ordered, 95) * 1000, 1),
        "n": len(values),
    }


def bench_paragraph(
    backend,
    config: Config,
    arms: Mapping[str, Arm],
    prompts: Sequence[str],
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    per_mode: dict[str, dict[str, list[float]]] = {m: {"ttft": [], "gap": []} for m in ("off", "intervene")}
    extra, grounded = [], 0
    for i, prompt in enumerate(prompts):
        order = ("off", "intervene") if i % 2 == 0 else ("intervene", "off")
        gaps, rewound = {}, False
        for mode in order:
            first, marks, rounds = shown_times(backend, prompt, config.replace(mode=mode, stream="holdback"), arms)
            per_mode[mode]["ttft"].append(first)
            gaps[mode] = longest_gap(first, marks)
            per_mode[mode]["gap"].append(gaps[mode])
            rewound = rewound or (mode == "intervene" and any(r.get("action") == "rewound" for r in rounds))
        if rewound:
            grounded += 1
            extra.append(gaps["intervene"] - gaps["off"])
        if progress:
            progress(i + 1, len(prompts), prompt[:40])
    return {
        "prompts": len(prompts),
        "max_tokens": config.max_tokens,
        "grounded_prompts": grounded,
        "ms": {
            mode: {"time_to_first_token": _quantiles(v["ttft"]), "longest_sentence_gap": _quantiles(v["gap"])}
            for mode, v in per_mode.items()
        },
        "extra_gap_ms": _quantiles(extra),
        "goal": "extra_gap_ms p95 <= 150",
    }

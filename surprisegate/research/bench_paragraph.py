"""`surprisegate bench paragraph`: the pause a reader sees while a paragraph is grounded.

Each prompt is streamed twice through the loop with holdback streaming, `off` and `intervene` (the order
alternates between prompts), the same model, arms and config. Per reply: the time to the first shown token,
and the longest gap between two shown sentences (from the first token, each sentence counted when its last
token is shown; the reply's end closes the last one). The extra gap a grounding round adds is intervene's
longest gap minus off's on the same prompt, over the prompts where intervene rewrote a sentence; p50/p95
of each, against off in the same run. That gap is mostly the rewrite's own decode (about 20 tokens), which no
design can hide while rewound text is never shown, so it is split: each rewound round's own overhead
(routing, arms, injection and re-feeding: the receipt's `latency_ms`) and the rewrite's decode (from the
rewind until its sentence is shown, in ms and tokens). The goal is on the overhead, itself split into the
arms' calls and the injection (the tokens fed before the rewrite's first token, and their time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..arms import Arm
from ..config import Config
from ..gate.events import Done, Rewind, Token
from ..gate.loop import stream
from ..gate.surprise import percentile
from ..text import sentence_end


@dataclass
class ShownReply:
    """What a reader saw of one streamed reply, in seconds from the request."""

    first: float  # the first shown token
    marks: list[float] = field(default_factory=list)  # each shown sentence complete
    rounds: list = field(default_factory=list)  # the receipt's rounds
    # Each rewind: (seconds from the rewind to the end of the sentence rewritten, tokens shown in that time).
    rewrites: list[tuple[float, int]] = field(default_factory=list)


def shown_times(backend, prompt: str, config: Config, arms: Mapping[str, Arm]) -> ShownReply:
    """When each sentence of one reply was shown, its rounds, and how long each rewrite took to write."""
    started = time.perf_counter()
    first, marks, text, done_at = None, [], "", 0
    rewrites: list[tuple[float, int]] = []
    rewinding: tuple[float, int, int] | None = None  # (when the span was rewound, tokens shown since, text shown then)
    rounds: list = []
    for event in stream(backend, prompt, config, arms):
        now = time.perf_counter() - started
        if isinstance(event, Rewind):
            rewinding = (now, 0, len(text))
        elif isinstance(event, Token):
            first = now if first is None else first
            text += event.text
            rewinding = (rewinding[0], rewinding[1] + 1, rewinding[2]) if rewinding else None
            while (end := sentence_end(text, done_at)) is not None:
                marks.append(now)
                done_at = end
                if rewinding and end > rewinding[2] + 1:  # the rewritten sentence is shown whole (an end seen
                    rewrites.append((now - rewinding[0], rewinding[1]))  # only now is an earlier one's)
                    rewinding = None
        elif isinstance(event, Done):
            rounds = event.rounds
            if text[done_at:].strip():
                marks.append(now)
    shown_first = first if first is not None else time.perf_counter() - started
    return ShownReply(shown_first, marks, rounds, rewrites)


def longest_gap(first: float, marks: Sequence[float]) -> float:
    """The longest wait between two shown sentences, the first token opening the first one."""
    points = [first, *marks]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)


def _quantiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50, p95 and count of `values` times `scale` (seconds to ms by default; 1 for counts)."""
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    ordered = sorted(values)  # percentile() reads a sorted sequence
    return {
        "p50": round(percentile(ordered, 50) * scale, 1),
        "p95": round(percentile(ordered, 95) * scale, 1),
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
    own: list[float] = []  # each rewound round, routing to resume (arms, injection, re-feeding), seconds
    arms_s: list[float] = []  # of which its arms' calls
    fed: list[int] = []  # tokens each rewound round fed before its rewrite's first token (evidence, re-fed words)
    rewrites: list[tuple[float, int]] = []
    for i, prompt in enumerate(prompts):
        order = ("off", "intervene") if i % 2 == 0 else ("intervene", "off")
        gaps, rewound = {}, False
        for mode in order:
            shown = shown_times(backend, prompt, config.replace(mode=mode, stream="holdback"), arms)
            per_mode[mode]["ttft"].append(shown.first)
            gaps[mode] = longest_gap(shown.first, shown.marks)
            per_mode[mode]["gap"].append(gaps[mode])
            if mode == "intervene":
                rewound = any(r.get("action") == "rewound" for r in shown.rounds)
                rewound_rounds = [r for r in shown.rounds if r.get("action") == "rewound"]
                own.extend(r["latency_ms"] / 1000 for r in rewound_rounds)
                arms_s.extend(
                    sum(a.get("latency_ms") or 0.0 for a in r.get("arms") or []) / 1000 for r in rewound_rounds
                )
                fed.extend(r.get("tokens_injected") or 0 for r in rewound_rounds)
                rewrites.extend(shown.rewrites)
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
        # The extra gap is mostly the rewrite's own decode, which no design hides while rewound text is never
        # shown; what a round adds beyond it (its arms, injection, re-feeding) is the round's overhead.
        "round_overhead_ms": _quantiles(own),
        # Its parts: the arms' calls, and the rest, mostly prefilling the evidence segment and the words re-fed
        # after it (config.injection decides how many), at the backend's prefill speed.
        "round_parts": {
            "arms_ms": _quantiles(arms_s),
            "injection_and_refeed_ms": _quantiles([o - a for o, a in zip(own, arms_s, strict=True)]),
            "tokens_fed": _quantiles(fed, scale=1),
        },
        "rewrite_decode": {
            "ms": _quantiles([seconds for seconds, _ in rewrites]),
            "tokens": _quantiles([tokens for _, tokens in rewrites], scale=1),
        },
        "goal": "round_overhead_ms p95 <= 150",
    }

"""Token surprise, reply aggregates and rolling windows. Pure functions and small classes, no I/O.

Surprise is in bits: s = -log2 p(token), from the raw model distribution the token was drawn from.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Iterable, Sequence

import numpy as np

LN2 = math.log(2.0)
STATISTICS = ("mean", "p90", "max")


def surprise_bits(logprob: float) -> float:
    """Surprise in bits from a natural-log probability (what providers and backends report)."""
    return -logprob / LN2


def top_logprobs(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The `k` most likely tokens with their natural-log probabilities, most likely first: what an
    inference server streams with each token (OpenAI `top_logprobs`), so signals can be checked on it."""
    if k <= 0:
        return []
    x = logits.astype(np.float64, copy=False)
    m = float(x.max())
    log_z = m + math.log(float(np.exp(x - m).sum()))
    k = min(k, x.size)
    top = np.argpartition(-x, k - 1)[:k]
    top = top[np.lexsort((top, -x[top]))]  # most likely first; ties by token id, so the order is stable
    return [(int(t), float(x[t]) - log_z) for t in top]


def surprise_and_entropy(logits: np.ndarray, token_id: int) -> tuple[float, float]:
    """Surprise of `token_id` and entropy of softmax(logits), both in bits. Reads `logits`, never writes it.

    Runs once per decoded token: one shifted copy, one exp, one sum and one dot product.
    """
    m = float(logits.max())
    shifted = logits - m  # (vocab,) new array: the caller's logits stay untouched
    e = np.exp(shifted)
    total = float(e.sum())
    log_z = math.log(total)  # log-normaliser relative to m
    # The chosen token's logit in float64: a float32 difference loses ~1e-6 bits on very surprising tokens.
    return (log_z - (float(logits[token_id]) - m)) / LN2, (log_z - float(e @ shifted) / total) / LN2


def token_surprise(logits: np.ndarray, token_id: int) -> float:
    """Surprise in bits of `token_id` under softmax(logits)."""
    return surprise_and_entropy(logits, token_id)[0]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of an already sorted sequence."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def aggregates(surprises: Iterable[float], tail_cut: float = 4.0) -> dict[str, float]:
    """Reply-level aggregates: mean, p90, max and tail mass (share of tokens above `tail_cut` bits)."""
    values = sorted(float(s) for s in surprises)
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": 0.0, "p90": 0.0, "max": 0.0, "tail_mass": 0.0, "tail_cut": tail_cut}
    above = n - bisect.bisect_right(values, tail_cut)
    return {
        "n": n,
        "mean": math.fsum(values) / n,
        "p90": percentile(values, 90.0),
        "max": values[-1],
        "tail_mass": above / n,
        "tail_cut": tail_cut,
    }


class RollingWindow:
    """The last `size` surprises with an incrementally maintained statistic.

    mean: running sum, O(1). max: monotonic deque, O(1) amortised. p90: sorted copy kept with bisect,
    O(log W) search plus a W-element shift (W is small, 4-32). The window reports over what it holds,
    so it can trigger before it is full (short answers are where facts live).
    """

    def __init__(self, size: int = 16, statistic: str = "mean"):
        if size < 1:
            raise ValueError(f"window={size!r} must be a positive number of tokens, e.g. 16")
        if statistic not in STATISTICS:
            raise ValueError(f"statistic={statistic!r} is not one of {', '.join(STATISTICS)}")
        self.size = size
        self.statistic = statistic
        self._values: deque[float] = deque()
        self._sum = 0.0
        self._sorted: list[float] = []
        self._max_candidates: deque[tuple[int, float]] = deque()  # (push index, value), values decreasing
        self._pushed = 0  # total pushes since the last reset

    def __len__(self) -> int:
        return len(self._values)

    @property
    def start(self) -> int:
        """Push index (since reset) of the oldest value still in the window."""
        return self._pushed - len(self._values)

    def reset(self) -> None:
        self._values.clear()
        self._sum = 0.0
        self._sorted.clear()
        self._max_candidates.clear()
        self._pushed = 0

    def push(self, value: float) -> float:
        """Add one surprise value; return the updated statistic."""
        value = float(value)
        if len(self._values) == self.size:
            old = self._values.popleft()
            self._sum -= old
            if self.statistic == "p90":
                del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._values.append(value)
        self._sum += value
        if self._pushed % 1024 == 1023:
            self._sum = math.fsum(self._values)  # bound float drift of the running sum on long replies
        if self.statistic == "p90":
            bisect.insort(self._sorted, value)
        elif self.statistic == "max":
            while self._max_candidates and self._max_candidates[-1][1] <= value:
                self._max_candidates.pop()
            self._max_candidates.append((self._pushed, value))
            while self._max_candidates[0][0] < self._pushed + 1 - self.size:
                self._max_candidates.popleft()
        self._pushed += 1
        return self.value

    @property
    def value(self) -> float:
        n = len(self._values)
        if n == 0:
            return 0.0
        if self.statistic == "mean":
            return self._sum / n
        if self.statistic == "p90":
            return percentile(self._sorted, 90.0)
        return self._max_candidates[0][1]

    def values(self) -> list[float]:
        return list(self._values)


def window_trace(surprises: Sequence[float], size: int, statistic: str) -> list[float]:
    """The rolling statistic after each token (used by calibration sweeps)."""
    window = RollingWindow(size, statistic)
    return [window.push(s) for s in surprises]

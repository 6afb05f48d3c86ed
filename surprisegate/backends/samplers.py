"""The sampling settings clients send (OpenAI's, vLLM's and llama.cpp's), as pure functions over one step's logits.

They shape only which token is *chosen*: surprise and entropy are still read from the model's raw distribution
(`Sampling.step`), so the gate's signal means the same whatever a client asks for. The order is llama.cpp's
default chain and vLLM's: logit bias, then penalties (both change greedy choices too), then the truncations
top-k, top-p and min-p (which a greedy choice never feels: the most likely token survives all three), then
the temperature.

Penalties: `repeat_penalty` (llama.cpp, HF's repetition_penalty) divides a positive logit (multiplies a
negative one) of every token among the context's last `repeat_last_n`, prompt included; `frequency_penalty`
and `presence_penalty` (OpenAI, vLLM) subtract count x frequency + presence from the logits of tokens the
reply itself has used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

REPEAT_LAST_N = 64  # llama.cpp's default window for repeat_penalty


@dataclass(frozen=True)
class Shaping:
    """One reply's sampling settings beyond the temperature (the defaults change nothing)."""

    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = REPEAT_LAST_N
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def reshapes(self) -> bool:
        """Whether the logits change before a choice (a greedy choice can differ from the argmax)."""
        return bool(self.logit_bias) or self.penalises

    @property
    def penalises(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def active(self) -> bool:
        return self.reshapes or self.truncates

    def settings(self) -> dict[str, object]:
        """The settings that differ from the defaults, for a receipt."""
        out: dict[str, object] = {}
        for key, default in (
            ("top_k", 0),
            ("top_p", 1.0),
            ("min_p", 0.0),
            ("repeat_penalty", 1.0),
            ("frequency_penalty", 0.0),
            ("presence_penalty", 0.0),
        ):
            if getattr(self, key) != default:
                out[key] = getattr(self, key)
        if self.repeat_penalty != 1.0:
            out["repeat_last_n"] = self.repeat_last_n
        if self.logit_bias:
            out["logit_bias"] = {str(k): v for k, v in sorted(self.logit_bias.items())}
        return out

    def reshape(self, logits: np.ndarray, context: Sequence[int], reply: Sequence[int]) -> np.ndarray:
        """The logits the choice is made from: a new array (the model's are never written)."""
        out = logits.astype(np.float64, copy=True)
        if self.logit_bias:
            out = add_bias(out, self.logit_bias)
        if self.repeat_penalty != 1.0 and self.repeat_last_n:
            out = repeat_penalised(out, context[-self.repeat_last_n :], self.repeat_penalty)
        if self.frequency_penalty or self.presence_penalty:
            out = count_penalised(out, reply, self.frequency_penalty, self.presence_penalty)
        return out

    def truncate(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every token outside top-k, top-p and min-p at -inf (a new array)."""
        return truncated(logits, self.top_k, self.top_p, self.min_p)


def add_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """OpenAI's logit_bias: each listed token's logit plus its bias (ids outside the vocabulary are refused
    at the edge); -100 bans a token, +100 all but forces it."""
    out = logits.copy()
    for token, value in bias.items():
        if 0 <= token < out.size:  # serve refuses ids past the vocabulary where the backend says its size
            out[token] += value
    return out


def repeat_penalised(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp's repeat penalty: each distinct recent token's logit divided by `penalty` when positive,
    multiplied by it when negative (both make it less likely for penalty > 1)."""
    out = logits.copy()
    ids = np.fromiter((t for t in set(recent) if 0 <= t < out.size), dtype=np.int64)
    if ids.size:
        values = out[ids]
        out[ids] = np.where(values > 0, values / penalty, values * penalty)
    return out


def count_penalised(logits: np.ndarray, used: Sequence[int], frequency: float, presence: float) -> np.ndarray:
    """OpenAI's penalties: logit - count x frequency - presence for every token the reply has used."""
    out = logits.copy()
    for token, count in Counter(used).items():
        if 0 <= token < out.size:
            out[token] -= count * frequency + presence
    return out


def truncated(logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Keep the top_k most likely tokens, then the smallest most-likely set whose probability reaches top_p,
    then those at least min_p times as likely as the most likely one; the rest go to -inf. The most likely
    token always stays."""
    out = logits.astype(np.float64, copy=True)
    order = np.argsort(-out, kind="stable")
    keep = np.ones(out.size, dtype=bool)
    if 0 < top_k < out.size:
        keep[order[top_k:]] = False
    if top_p < 1.0 or min_p > 0.0:
        z = out - out[order[0]]
        p = np.exp(z)
        p[~keep] = 0.0
        p /= p.sum()
        if top_p < 1.0:
            cumulative = np.cumsum(p[order])
            # the first position where the mass before it already reaches top_p, and everything after
            cut = int(np.searchsorted(cumulative, top_p, side="left")) + 1
            keep[order[max(cut, 1) :]] = False
        if min_p > 0.0:
            keep &= p >= min_p * p[order[0]]
        keep[order[0]] = True
    out[~keep] = -np.inf
    return out


__all__ = ["REPEAT_LAST_N", "Shaping", "add_bias", "count_penalised", "repeat_penalised", "truncated"]

"""The window and trigger policy: when a reply's rolling signal says "this is doubtful".

One rule, used online by the loop (`TriggerPolicy`) and offline by `calibrate` (`window_peak`): the
per-token value of the configured signal enters a rolling window; a window holding at least
min(min_tokens, window) values is eligible, and an eligible window above the threshold triggers.
"""

from __future__ import annotations

import math

from .config import Config
from .signals import CopyTracker, question_kind, signal_value
from .surprise import RollingWindow


def eligible(n_values: int, window: int, min_tokens: int) -> bool:
    """A window may trigger once it holds min(min_tokens, window) values (short answers are where facts live)."""
    return n_values >= min(min_tokens, window)


def window_peak(values: list[float], window: int, statistic: str, min_tokens: int) -> float:
    """Highest rolling statistic over the eligible windows of a reply (what calibration thresholds)."""
    w = RollingWindow(window, statistic)
    peak = -math.inf
    for v in values:
        stat = w.push(v)
        if eligible(len(w), window, min_tokens):
            peak = max(peak, stat)
    return 0.0 if peak == -math.inf else peak  # never eligible (too few values): it could not have fired


class TriggerPolicy:
    """The rolling window of one reply, the threshold for its kind of question, and where a span starts."""

    def __init__(self, config: Config, question: str, copied_from: str = "") -> None:
        self.config = config
        self.kind = question_kind(question)
        # Per-kind threshold (calibrated per-category normalisation), else the global one.
        self.threshold = config.kind_thresholds.get(self.kind, config.threshold)
        self.window = RollingWindow(config.window, config.statistic)
        self.pushed_at: list[int] = []  # reply index of each value pushed since the last reset
        # Which tokens merely copy the question (or a cloze prefix): the "novel" signals skip them.
        self.copies = CopyTracker(question + " " + copied_from) if config.signal.startswith("novel") else None
        self.window_max = 0.0  # highest eligible statistic over every token decoded

    @property
    def statistic_name(self) -> str:
        c = self.config
        return c.statistic if c.signal == "surprise" else f"{c.signal}:{c.statistic}"

    def push(self, index: int, text: str, surprise: float, entropy: float) -> tuple[float, bool]:
        """Add reply token `index`; return (window statistic after it, whether an eligible window crossed)."""
        copied = self.copies.push(text) if self.copies else False
        pushed = signal_value(self.config.signal, surprise, entropy, copied)
        if pushed is None:  # novel signals skip tokens copied from the question
            return (self.window.value if len(self.window) else math.nan), False
        value = self.window.push(pushed)
        self.pushed_at.append(index)
        if not eligible(len(self.window), self.config.window, self.config.min_tokens):
            return value, False
        self.window_max = max(self.window_max, value)
        return value, value > self.threshold

    @property
    def span_start(self) -> int:
        """Reply index of the window's oldest token: where a doubtful span begins."""
        return self.pushed_at[self.window.start]

    def first_rewindable(self, n_reply: int) -> int:
        """Reply tokens before this index have left the window and can no longer be rewound."""
        return self.span_start if len(self.window) else n_reply

    def reset(self, word_dropped: bool = False) -> None:
        """Start the window afresh (after a round, or when the reply was cut back)."""
        self.window.reset()
        self.pushed_at.clear()
        if word_dropped and self.copies:
            self.copies.reset_word()  # the word in progress was dropped with the span

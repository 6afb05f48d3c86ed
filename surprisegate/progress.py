"""A small progress line for long jobs (stderr): count, rate, ETA. No dependency, safe when not a TTY."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", stream=None, every_s: float = 0.5):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0
        self.every_s = every_s
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last < self.every_s and self.done < self.total:
            return
        self._last = now
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        width = 24
        filled = int(width * self.done / max(1, self.total))
        bar = "█" * filled + "·" * (width - filled)
        line = f"{self.label} {bar} {self.done}/{self.total}  {rate:.2f}/s  ETA {eta:4.0f}s  {note}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            if self.done >= self.total:
                self.stream.write("\n")
        elif self.done >= self.total or int(elapsed) % 10 == 0:
            self.stream.write(line + "\n")
        self.stream.flush()

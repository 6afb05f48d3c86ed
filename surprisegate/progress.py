"""Progress for long jobs, through tqdm, on stderr (stdout is the CLI's JSON).

    with progress_bar("label", total=53, initial=12) as bar:   # 12 already on disk (a resumed job)
        for item in todo:
            ...
            bar.update(1, note="acc 0.81")

The items already done show as `initial` and count toward neither the rate nor the ETA. On a terminal it is
tqdm's bar, redrawn in place. Where stderr is not a terminal (a log file, a pipe, CI) it writes plain lines,
no carriage returns: one when it starts, then at most one every LOG_INTERVAL_S seconds as items finish
(TQDM_MININTERVAL sets another interval, in seconds), and one at the end with the final count.

The research loops (`labeling.label`, `evaluate.evaluate`) report through a callback `progress(done, total,
note)` that counts the whole job; `progress_callback(label)` turns one into a bar, taking the first call's
`done` (made before any work, with the count found on disk) as the bar's initial.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs (types-tqdm is not a dependency)

LOG_INTERVAL_S = 15.0  # not a terminal: at most one line per this many seconds (and one at the end)
TTY_INTERVAL_S = 0.5  # a terminal: how often the bar is redrawn
LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} ({percentage:3.0f}%) [{elapsed}<{remaining}, {rate_fmt}]{postfix}"
LOG_FORMAT_NO_TOTAL = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}]{postfix}"


class _LogLines(tqdm):
    """tqdm for a stream that is not a terminal: each refresh is one whole line, never a '\\r' redraw."""

    monitor_interval = 0  # no monitor thread: lines come from updates, at the interval, and from close()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._printed: float | None = None  # the count on the last line written
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "":  # tqdm clearing its line: a log has nothing to clear
            return False
        self.fp.write((self.__str__() if msg is None else msg) + "\n")
        self.fp.flush()
        self._printed = self.n
        return True

    def close(self) -> None:
        if self.disable:
            return
        if self._printed != self.n:  # the final count, at the whole run's average rate
            self._ema_dt = lambda: None
            self.display()
        self.leave = False  # tqdm's own close would add a blank line; this one only clears, which is a no-op
        super().close()


class ProgressBar:
    """One job's progress: `update(n, note)` as items finish, `close()` (or a `with` block) at the end."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        initial: int = 0,
        stream: IO[str] | None = None,
        interval: float | None = None,
    ) -> None:
        stream = stream if stream is not None else sys.stderr  # looked up now: tests and redirects swap it
        tty = bool(getattr(stream, "isatty", lambda: False)())
        if interval is None:
            try:
                interval = float(os.environ["TQDM_MININTERVAL"])
            except (KeyError, ValueError):
                interval = TTY_INTERVAL_S if tty else LOG_INTERVAL_S
        common: dict[str, Any] = {
            "desc": label,
            "total": total,
            "initial": initial,
            "file": stream,
            "mininterval": interval,
            "unit": "item",
        }
        if tty:
            self.bar: tqdm = tqdm(**common, dynamic_ncols=True)
        else:
            # miniters=1: a line whenever the interval has passed and an item finished, however uneven the
            # items; smoothing=0: the rate and ETA are this run's average, steadier than tqdm's EMA in a log.
            fmt = LOG_FORMAT if total is not None else LOG_FORMAT_NO_TOTAL
            self.bar = _LogLines(**common, miniters=1, smoothing=0, bar_format=fmt, ascii=True)
        self.closed = False

    @property
    def n(self) -> float:
        return self.bar.n

    def update(self, n: int = 1, note: str = "") -> None:
        if note:
            self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.closed = True
        self.bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(
    label: str,
    total: int | None = None,
    initial: int = 0,
    stream: IO[str] | None = None,
    interval: float | None = None,
) -> ProgressBar:
    """A progress bar on stderr (or `stream`): `initial` items already done, `total` in all (None: unknown)."""
    return ProgressBar(label, total, initial, stream, interval)


@contextmanager
def progress_callback(
    label: str, stream: IO[str] | None = None, interval: float | None = None
) -> Iterator[Callable[[int, int, str], None]]:
    """A `progress(done, total, note)` for the research loops; its bar is closed (the final line written) when
    `done` reaches `total`, or on leaving the `with` block, whichever comes first.

    `done` and `total` count the whole job, items found done on disk included; the first call (made before
    any work) opens the bar with that `done` as its initial, so a resumed job's rate and ETA count only the
    items it does now. `total` may grow between calls; a call after the bar closed opens a new one from there.
    """
    state: dict[str, ProgressBar] = {}

    def progress(done: int, total: int, note: str = "") -> None:
        bar = state.get("bar")
        if bar is None or bar.closed:
            start = done if bar is None else int(bar.n)
            bar = state["bar"] = progress_bar(
                label, total=max(total, done), initial=start, stream=stream, interval=interval
            )
        if total != bar.bar.total:
            bar.bar.total = max(total, done)
        if done != bar.n:
            bar.update(done - int(bar.n), note)
        if done >= total:
            bar.close()

    try:
        yield progress
    finally:
        if "bar" in state:
            state["bar"].close()

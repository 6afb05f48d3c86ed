"""A JSON reply judged value by value: what the gate's trigger reads when a grammar holds the reply to JSON.

In prose the claim is a sentence; in JSON it is a value (`"capital": "Kouar-Boukoula"`). Keys, brackets and
punctuation state nothing the model could get wrong, so only the tokens that write a value's content feed the
signal (`JsonScanner` says which characters those are). Each value is judged once it closes: its highest
rolling window (the whole value when it is shorter than the window) against the threshold. A doubtful value
is rewound from its first token, so the keys and values before it stay as written. A value the question
itself holds (the country of "What is the capital of Peru?", a name to extract from the user's text) is the
user's, not a claim of the model's: it is not judged doubtful, unless it repeats a value written before it
(`{"country": "Bhutan", "capital": "Bhutan"}`: a small model that knows nothing to write copies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..text import normalise
from .surprise import window_peak

SCALAR_START = frozenset("-0123456789tfn")  # a number, true, false or null begins
SCALAR_CHAR = frozenset("0123456789+-.eEtruefalsn")  # and goes on


@dataclass
class JsonScanner:
    """Reads JSON text a character at a time and says which characters write a value's content (the letters of
    a string value, a number's digits, a literal's letters), and where a value opens and closes. Text that is
    not JSON is read as well as it can be (the grammar keeps a reply to JSON; a test's text may not be)."""

    stack: list[str] = field(default_factory=list)  # open containers, "{" or "["
    expect: str = "value"  # what comes next: "value", "key", "colon" or "after" (a comma or a close)
    string: str | None = None  # inside a string: "key" or "value"
    escaped: bool = False
    scalar: bool = False  # inside a number or literal

    def feed(self, ch: str) -> str | None:
        """ "content", "open" (a value's string opens), "close" (a value ends) or None (structure, keys, space)."""
        if self.string is not None:
            return self._in_string(ch)
        if self.scalar:
            if ch in SCALAR_CHAR:
                return "content"
            self.scalar, self.expect = False, "after"
            closed = self._structure(ch)
            return "close" if closed is None else closed
        return self._structure(ch)

    def _in_string(self, ch: str) -> str | None:
        kind = self.string
        if self.escaped:
            self.escaped = False
        elif ch == "\\":
            self.escaped = True
        elif ch == '"':
            self.string = None
            self.expect = "colon" if kind == "key" else "after"
            return "close" if kind == "value" else None
        return "content" if kind == "value" else None

    def _structure(self, ch: str) -> str | None:
        if ch in " \t\r\n":
            return None
        if ch == '"':
            self.string = "key" if self.expect == "key" else "value"
            return "open" if self.string == "value" else None
        if ch in "{[":
            self.stack.append(ch)
            self.expect = "key" if ch == "{" else "value"
        elif ch in "}]":
            if self.stack:
                self.stack.pop()
            self.expect = "after"
        elif ch == ":":
            self.expect = "value"
        elif ch == ",":
            self.expect = "key" if self.stack and self.stack[-1] == "{" else "value"
        elif self.expect == "value" and ch in SCALAR_START:
            self.scalar = True
            return "content"
        return None


@dataclass
class ValueJudge:
    """The trigger under a JSON grammar: each value's content tokens judged once the value closes (see module)."""

    window: int
    statistic: str
    min_tokens: int
    threshold: float
    question: str = ""
    scanner: JsonScanner = field(default_factory=JsonScanner)
    open_at: int | None = None  # reply index of the open value's first content token
    values: list[float] = field(default_factory=list)  # the open value's signal values
    text: str = ""  # the open value's content as written
    written: list[str] = field(default_factory=list)  # the values closed so far, normalised
    judged: tuple[int, int] = (0, 0)  # reply indices [start, end) of the last value judged
    doubt: float = -math.inf  # its statistic
    peak: float = -math.inf  # the highest statistic of any value judged
    # A server's grammar starts at its root each request (backends.grammar.ServerGrammar): the values are
    # judged as they close, but the reply is rewound whole, once it has ended, for its most doubtful value.
    whole_reply: bool = False
    held: tuple[tuple[int, int], float] | None = None  # whole_reply: the most doubtful value's span and statistic

    _last_index: int = -1  # the last token whose value went in (a token may write several characters)

    def push(self, index: int, text: str, value: float) -> bool:
        """Add reply token `index` (its text and signal value); True when it closed a doubtful value (whole
        reply: never; the most doubtful is held for the end)."""
        return self._keep_most_doubtful(self._read(index, text, value, judging=True)) and not self.whole_reply

    def end(self) -> bool:
        """The reply ended: judge a value still open (cut at max_tokens or the end of turn); whole reply: True
        when any value was doubtful, with `judged` its span."""
        doubtful = self._keep_most_doubtful(self.open_at is not None and self._judge(self._last_index + 1))
        if not self.whole_reply or self.held is None:
            return doubtful and not self.whole_reply
        (self.judged, self.doubt), self.held = self.held, None
        return True

    @property
    def rewind_at(self) -> int:
        """Where a doubtful value's rewind starts: the value, or under a server's grammar the reply's start."""
        return 0 if self.whole_reply else self.judged[0]

    def first_rewindable(self, n_reply: int) -> int:
        """Tokens before the open value (all of them when none is open) can no longer be rewound; a reply
        rewound whole stays rewindable to its end."""
        if self.whole_reply:
            return 0
        return self.open_at if self.open_at is not None else n_reply

    def _keep_most_doubtful(self, doubtful: bool) -> bool:
        if doubtful and self.whole_reply and (self.held is None or self.doubt > self.held[1]):
            self.held = (self.judged, self.doubt)
        return doubtful

    def restart(self, pieces: Sequence[str], values: Sequence[float], at: int) -> None:
        """The reply was cut back to `at` tokens: read them again, judging nothing (a value open at the cut
        stays open; the values before it were judged when they closed)."""
        self.scanner, self.open_at, self.values, self._last_index = JsonScanner(), None, [], -1
        self.written, self.held = [], None
        for index, (text, value) in enumerate(zip(pieces[:at], values[:at], strict=True)):
            self._read(index, text, value, judging=False)

    def _read(self, index: int, text: str, value: float, judging: bool) -> bool:
        doubtful = False
        for ch in text:
            event = self.scanner.feed(ch)
            if event == "content":
                if self.open_at is None:
                    self.open_at, self.values, self.text = index, [], ""
                self.text += ch
                if self._last_index != index:
                    self.values.append(value)
                    self._last_index = index
            elif event == "close" and self.open_at is not None:
                if judging:
                    doubtful = self._judge(index + 1) or doubtful
                else:
                    self.written.append(normalise(self.text))
                    self.open_at, self.values = None, []
        return doubtful

    def _judge(self, end: int) -> bool:
        assert self.open_at is not None
        doubt = value_peak(self.values, self.window, self.statistic, self.min_tokens)
        self.judged, self.doubt, self.peak = (self.open_at, end), doubt, max(self.peak, doubt)
        value = normalise(self.text)
        users = holds_words(self.question, self.text) and value not in self.written
        self.written.append(value)
        self.open_at, self.values = None, []
        return doubt > self.threshold and not users


def holds_words(text: str, value: str) -> bool:
    """Whether `text` holds `value` as whole words, both normalised (case, accents, punctuation)."""
    needle = normalise(value)
    return bool(needle) and f" {needle} " in f" {normalise(text)} "


def value_peak(values: Sequence[float], window: int, statistic: str, min_tokens: int) -> float:
    """The trigger's own window rule (`surprise.window_peak`) over a value's tokens, where a value shorter than
    `min_tokens` is one window: most values are a word or two."""
    return window_peak(list(values), window, statistic, min(min_tokens, len(values))) if values else -math.inf


__all__ = ["JsonScanner", "ValueJudge", "holds_words", "value_peak"]

"""The window and trigger policy: when a reply's rolling signal says "this is doubtful".

One rule, used online by the loop (`TriggerPolicy`) and offline by `calibrate` (`surprise.window_peak`): the
per-token value of the configured signal enters a rolling window; a window holding at least
min(min_tokens, window) values is eligible, and an eligible window above the threshold triggers.

With a trigger probe (probe.py) for the question's kind and hidden states from the backend, the reply's
first sentence is judged whole instead, once it ends (or the reply does): the probe weighs its highest
window's margin over the threshold with the mean hidden state of its tokens, and a doubtful sentence is
rewound from its start. Later sentences go back to the window rule.

In sentence scope (paragraphs) there is no window: every finished sentence is judged on its claim tokens
(SentenceJudge), by the sentence threshold or, with a sentence probe (kind "sentence") and hidden states,
by that probe. Under a JSON grammar (structured output) every value is judged when it closes (ValueJudge,
json_values.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import Config
from ..text import ends_sentence, sentence_end, sentence_end_after
from .claims import claim_token_flags, first_claim_token, sentence_doubt, speaks_of_asked
from .json_values import ValueJudge
from .probe import SENTENCE_KIND, TriggerProbe
from .signals import CopyTracker, resolve_kind, signal_value
from .surprise import RollingWindow, eligible  # the window rule (and calibration's window_peak) lives beside its window


def sentence_value(signal: str, surprise: float, entropy: float) -> float:
    """The per-token value a sentence's doubt is read from: entropy for the entropy signals, else surprise
    (claim tokens are never copies, so the "novel" signals read the same as their base)."""
    return entropy if signal.endswith("entropy") else surprise


class _PendingSentence:
    """The reply's first sentence while the probe has not judged it: its highest window and mean state."""

    def __init__(self) -> None:
        self.text = ""
        self.peak = -math.inf  # highest eligible window statistic in it
        self.peak_span = (0, 0)  # reply indices [start, end) of the window that reached it
        self.state_sum: np.ndarray | None = None
        self.states = 0

    def add(self, text: str, hidden: np.ndarray | None) -> None:
        self.text += text
        if hidden is not None:
            self.state_sum = hidden.astype(np.float64) if self.state_sum is None else self.state_sum + hidden
            self.states += 1

    @property
    def mean_state(self) -> np.ndarray | None:
        return None if self.state_sum is None else self.state_sum / self.states


class SentenceJudge:
    """Sentence scope (config.claim_scope): every finished sentence of the reply is judged once, on its claim
    tokens (claims.py): its doubt is their highest per-token value, and a doubt above `threshold` grounds it.

    With a sentence probe (probe.py, kind "sentence") and hidden states, a sentence with a claim token is
    judged by the probe instead: its doubt's margin over `threshold` weighed with the mean state of its tokens.

    It tracks the open sentence (the reply's last, from `start`); the loop restarts it from the reply after
    every cut (`restart`), and a sentence whose start is `settled` (judged, grounded or rewritten) is not
    judged again: one round per sentence."""

    def __init__(
        self,
        question: str,
        threshold: float,
        max_tokens: int,
        asked_only: bool = True,
        probe: TriggerProbe | None = None,
    ) -> None:
        self.question, self.threshold, self.max_tokens = question, threshold, max_tokens
        self.asked_only = asked_only  # only sentences that speak of what the question asked for
        self.probe = probe
        self.states: dict[int, np.ndarray] = {}  # reply index -> the hidden state that chose it (with a probe)
        self.probe_score: float | None = None  # the probe's score of the last judged sentence
        self.start = 0  # reply index of the open sentence's first token
        self.pieces: list[str] = []
        self.values: list[float] = []
        self.searched = 0  # characters of the open sentence's text searched for its end without one found
        self.settled: set[int] = set()
        self.judged: tuple[int, int, str] = (0, 0, "")  # the last judged sentence: reply [start, end), its text
        self.rewind_at = 0  # where a rewrite of it begins: its first claim word (a word boundary), else its start
        self.doubt = -math.inf

    def push(self, index: int, piece: str, value: float, hidden: np.ndarray | None = None) -> bool:
        """Add reply token `index`; True when it closed a sentence (or the reply's budget) that is doubtful."""
        if self.probe is not None and hidden is not None:
            # The step's own copy (backends.hidden_state_of): kept as it is, not copied again.
            self.states[index] = hidden if hidden.dtype == np.float32 else hidden.astype(np.float32)
        self.pieces.append(piece)
        self.values.append(value)
        text = "".join(self.pieces)
        end = sentence_end_after(text, self.searched)
        self.searched = len(text)
        if end is not None:
            inside = tokens_before(self.pieces, end)  # the token that showed the end may open the next one
            return self._close(inside, next_start=self.start + inside)
        if index + 1 >= self.max_tokens:
            return self._close(len(self.pieces), next_start=index + 1)
        return False

    def end_of_turn(self) -> bool:
        """The reply ended: judge the open sentence (it may have no full stop)."""
        return bool(self.pieces) and self._close(len(self.pieces), next_start=self.start + len(self.pieces))

    def _close(self, inside: int, next_start: int) -> bool:
        start, pieces, values = self.start, self.pieces[:inside], self.values[:inside]
        self.start, self.pieces, self.values = next_start, self.pieces[inside:], self.values[inside:]
        self.searched = 0  # what is left opens the next sentence: searched afresh
        if start in self.settled or not "".join(pieces).strip():
            return False
        self.settled.add(start)
        self.judged = (start, start + inside, "".join(pieces).strip())
        text = self.judged[2]
        asked = not self.asked_only or speaks_of_asked(text, self.question)
        flags = claim_token_flags(pieces, self.question)
        self.doubt = sentence_doubt(values, flags) if asked else -math.inf
        self.rewind_at = start + first_claim_token(pieces, flags)
        return self._doubtful(start, start + inside)

    def _doubtful(self, start: int, end: int) -> bool:
        """The verdict on reply tokens [start, end): the probe's where it has their states, else the threshold's."""
        self.probe_score = None
        states = [self.states[i] for i in range(start, end) if i in self.states]
        if self.probe is None or not states or self.doubt == -math.inf:
            return self.doubt > self.threshold
        mean: np.ndarray = np.stack(states).mean(axis=0, dtype=np.float64)
        self.probe_score = self.probe.score(self.doubt - self.threshold, mean)
        return self.probe_score > self.probe.cut

    def own_claim(self, tokens: list[int]) -> list[int]:
        """The last judged sentence's tokens from its rewind point (its first claim word) to its end."""
        return list(tokens[self.rewind_at : self.judged[1]])

    def restart(self, pieces: list[str], values: list[float], at: int, opens: bool = False) -> None:
        """The reply was cut back (a rewind, retry or revert) to these tokens, decoding going on from reply
        index `at`: the open sentence is the one holding `at` (a sentence starts there when the text before
        it has ended one, or `opens` says so: a patched sentence ended there); sentences cut away are forgotten."""
        before = "".join(pieces[:at])
        if at == 0 or opens or ends_sentence(before):
            self.start = min(at, len(pieces))
        else:
            start_char = _open_sentence_start(before)
            self.start = tokens_before(pieces, start_char) if start_char else 0
        self.pieces, self.values = list(pieces[self.start :]), list(values[self.start :])
        self.searched = 0
        self.settled = {i for i in self.settled if i <= self.start}
        self.states = {i: h for i, h in self.states.items() if i < at}  # later ones are decoded anew


def _open_sentence_start(text: str) -> int:
    """Character index just past the last finished sentence of `text`, its whitespace included (text.
    sentence_start skips that whitespace; the judge's sentences start at the token holding it)."""
    start = 0
    while (end := sentence_end(text, start)) is not None:
        start = end
    return start


def tokens_before(pieces: list[str], char: int) -> int:
    """How many leading pieces lie entirely before character `char` of their joined text."""
    at = 0
    for i, piece in enumerate(pieces):
        if at + len(piece) > char:
            return i
        at += len(piece)
    return len(pieces)


class TriggerPolicy:
    """The rolling window of one reply, the threshold for its kind of question, and where a span starts.

    `probe`: a trigger probe; it judges the first sentence when it applies to this kind of question and
    the reply is not the continuation of a cloze prefix (it was fitted on answers to questions)."""

    def __init__(
        self,
        config: Config,
        question: str,
        copied_from: str = "",
        probe: TriggerProbe | None = None,
        json_values: bool = False,
        whole_reply: bool = False,
    ) -> None:
        self.config = config
        # The kind asked, whatever the wording, among those calibrated; its threshold, else the global one.
        self.kind = resolve_kind(question, [*config.kind_thresholds, *(probe.kinds if probe else ())])
        self.threshold = config.kind_thresholds.get(self.kind, config.threshold)
        self.window = RollingWindow(config.window, config.statistic)
        self.pushed_at: list[int] = []  # reply index of each value pushed since the last reset
        # Which tokens merely copy the question (or a cloze prefix): the "novel" signals skip them.
        self.copies = CopyTracker(question + " " + copied_from) if config.signal.startswith("novel") else None
        self.window_max = 0.0  # highest eligible statistic over every token decoded
        # Sentence scope: every finished sentence judged on its claim tokens (no window; a sentence probe, if any).
        sentence_scope = config.sentence_scope and not copied_from and not json_values
        # Under a JSON grammar: every value judged when it closes (json_values.py), nothing else.
        self.values = self._value_judge(question, whole_reply) if json_values else None
        # A probe judges what it was fitted on: every sentence (kind "sentence"), or this kind's first sentence.
        applies = probe is not None and probe.applies_to(SENTENCE_KIND if sentence_scope else self.kind)
        self.probe = probe if applies and not copied_from else None
        self.sentences = (
            SentenceJudge(
                question, config.sentence_threshold, config.max_tokens, config.sentence_asked_only, self.probe
            )
            if sentence_scope
            else None
        )
        first_sentence = self.probe is not None and self.sentences is None
        self.pending: _PendingSentence | None = _PendingSentence() if first_sentence else None
        self.probe_score: float | None = None  # the probe's score of the first sentence, once judged
        self.judged: tuple[float, np.ndarray] | None = None  # what it judged: (window margin, mean state)
        self._judged_from = 0  # reply index where the judged sentence began
        self._judged_peak = (0, 0)  # reply indices [start, end) of its highest window
        # The last crossing: (statistic, value, the bar it crossed), for the trigger's receipt.
        self.crossing: tuple[str, float, float] = ("", math.nan, math.nan)

    @property
    def statistic_name(self) -> str:
        c = self.config
        return c.statistic if c.signal == "surprise" else f"{c.signal}:{c.statistic}"

    def push(
        self, index: int, text: str, surprise: float, entropy: float, hidden: np.ndarray | None = None
    ) -> tuple[float, bool]:
        """Add reply token `index`; return (window statistic after it, whether the reply should be grounded now:
        an eligible window crossed, or the probe judged the finished first sentence doubtful)."""
        if self.sentences is not None:
            return self._push_sentence(index, text, surprise, entropy, hidden)
        if self.values is not None:
            return self._push_value(index, text, surprise, entropy)
        copied = self.copies.push(text) if self.copies else False
        pushed = signal_value(self.config.signal, surprise, entropy, copied)
        if pushed is None:  # novel signals skip tokens copied from the question
            return (self.window.value if len(self.window) else math.nan), False
        value = self.window.push(pushed)
        self.pushed_at.append(index)
        is_eligible = eligible(len(self.window), self.config.window, self.config.min_tokens)
        if is_eligible:
            self.window_max = max(self.window_max, value)
        if self.pending is not None:
            return value, self._judge_pending(index, text, value if is_eligible else None, hidden)
        return value, is_eligible and self._window_crossed(value)

    def _push_sentence(
        self, index: int, text: str, surprise: float, entropy: float, hidden: np.ndarray | None
    ) -> tuple[float, bool]:
        judge = self.sentences
        assert judge is not None
        value = sentence_value(self.config.signal, surprise, entropy)
        doubtful = judge.push(index, text, value, hidden)
        self.window_max = max(self.window_max, judge.doubt)  # -inf until a sentence with a claim was judged
        self._sentence_crossing()
        return value, doubtful

    def _push_value(self, index: int, text: str, surprise: float, entropy: float) -> tuple[float, bool]:
        judge = self.values
        assert judge is not None
        value = sentence_value(self.config.signal, surprise, entropy)
        doubtful = judge.push(index, text, value)
        self._value_crossing()
        return value, doubtful

    def _value_crossing(self) -> None:
        judge = self.values
        assert judge is not None
        self.window_max = max(self.window_max, judge.peak)  # -inf until a value was judged
        self.crossing = (f"value:{self.statistic_name}", judge.doubt, self.threshold)

    def _sentence_crossing(self) -> None:
        judge = self.sentences
        assert judge is not None
        if judge.probe_score is not None and judge.probe is not None:
            self.probe_score = judge.probe_score
            self.crossing = ("sentence:probe", judge.probe_score, judge.probe.cut)
        else:
            self.crossing = (f"sentence:{self.config.signal}", judge.doubt, judge.threshold)

    def _judge_pending(self, index: int, text: str, stat: float | None, hidden: np.ndarray | None) -> bool:
        """Add a token to the pending first sentence; judge it once it has ended with an eligible window in it,
        or the reply reached max_tokens."""
        pending = self.pending
        assert pending is not None
        if hidden is None:  # no hidden states from this backend: the window rule from here on
            self.pending = None
            return stat is not None and self._window_crossed(stat)
        pending.add(text, hidden)
        if stat is not None and stat > pending.peak:
            pending.peak, pending.peak_span = stat, (self.pushed_at[self.window.start], index + 1)
        ended = ends_sentence(pending.text) or index + 1 >= self.config.max_tokens
        return self._judge() if ended and pending.peak > -math.inf else False

    def _value_judge(self, question: str, whole_reply: bool) -> ValueJudge:
        c = self.config
        return ValueJudge(c.window, c.statistic, c.min_tokens, self.threshold, question, whole_reply=whole_reply)

    def _window_crossed(self, stat: float) -> bool:
        self.crossing = (self.statistic_name, stat, self.threshold)
        return stat > self.threshold

    def end_of_turn(self) -> bool:
        """The reply ended: judge a first sentence still pending (it may have no full stop)."""
        if self.sentences is not None:
            doubtful = self.sentences.end_of_turn()
            self._sentence_crossing()
            return doubtful
        if self.values is not None:
            doubtful = self.values.end()
            self._value_crossing()
            return doubtful
        if self.pending is None or self.pending.peak == -math.inf:
            return False
        return self._judge()

    def _judge(self) -> bool:
        pending, probe = self.pending, self.probe
        assert pending is not None and probe is not None and pending.mean_state is not None
        self.judged = (pending.peak - self.threshold, pending.mean_state)
        self.probe_score = probe.score(*self.judged)
        self.crossing = ("probe", self.probe_score, probe.cut)
        self.pending = None
        self._judged_from = self.pushed_at[0] if self.pushed_at else 0
        self._judged_peak = pending.peak_span
        self.window.reset()  # later sentences start a fresh window
        self.pushed_at.clear()
        return self.probe_score > probe.cut

    @property
    def _probe_crossed(self) -> bool:
        """The last crossing was the probe's verdict on the first sentence (its window has been reset since)."""
        return not len(self.window) and self.crossing[0] == "probe"

    @property
    def span_start(self) -> int:
        """Reply index where a doubtful span begins: the window's oldest token, or after the probe judged the
        first sentence doubtful, its first token."""
        if self.sentences is not None:
            return self.sentences.rewind_at
        if self.values is not None:
            return self.values.rewind_at
        if self._probe_crossed:
            return self._judged_from
        return self.pushed_at[self.window.start]

    def query_span(self, n_reply: int) -> tuple[int, int]:
        """Reply indices [start, end) of the tokens the arms are asked about: the window that crossed, or
        after the probe judged the first sentence doubtful, its highest window (the whole sentence mostly
        restates the question, and a longer claim re-ranks evidence toward the restatement)."""
        if self.sentences is not None:
            return self.sentences.judged[:2]
        if self.values is not None:
            return self.values.judged
        if self._probe_crossed:
            return self._judged_peak
        return self.span_start, n_reply

    def first_rewindable(self, n_reply: int) -> int:
        """Reply tokens before this index have left the window and can no longer be rewound (a pending
        first sentence may be rewound whole; in sentence scope, the open sentence)."""
        if self.sentences is not None:
            return min(self.sentences.start, n_reply)
        if self.values is not None:
            return self.values.first_rewindable(n_reply)
        if self.pending is not None:
            return self.pushed_at[0] if self.pushed_at else n_reply
        return self.pushed_at[self.window.start] if len(self.window) else n_reply

    def restart(
        self, pieces: list[str], surprises: list[float], entropies: list[float], at: int, opens: bool = False
    ) -> None:
        """The reply was cut back to these tokens (a rewind, retry or revert): the window starts afresh; in
        sentence scope the open sentence is read back from them (the judged one stays settled; `opens`: a
        sentence starts at `at`)."""
        self.reset(word_dropped=True)
        if self.sentences is None and self.values is None:
            return
        values = [sentence_value(self.config.signal, s, h) for s, h in zip(surprises, entropies, strict=True)]
        if self.sentences is not None:
            self.sentences.restart(pieces, values, at, opens)
        if self.values is not None:  # a JSON reply: the kept values read again (json_values.ValueJudge)
            self.values.restart(pieces, values, at)

    def reset(self, word_dropped: bool = False) -> None:
        """Start the window afresh (after a round, or when the reply was cut back). A first sentence still
        pending is no longer judged by the probe: the window rule goes on. The sentence judge keeps its
        open sentence (a round on the last one left it there)."""
        self.window.reset()
        self.pushed_at.clear()
        self.pending = None
        self.crossing = ("", math.nan, math.nan)
        if word_dropped and self.copies:
            self.copies.reset_word()  # the word in progress was dropped with the span

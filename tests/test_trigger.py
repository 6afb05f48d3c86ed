"""The window and trigger policy: the online rule and calibrate's offline peak are the same rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.config import Config
from surprisegate.gate.surprise import eligible, window_peak
from surprisegate.gate.trigger import TriggerPolicy


def cfg(**kw):
    base = dict(
        mode="detect", signal="surprise", statistic="mean", window=4, threshold=3.0, min_tokens=2, kind_thresholds={}
    )
    return Config(**(base | kw))


@pytest.mark.parametrize(
    "n, window, min_tokens, expected",
    [(0, 4, 1, False), (1, 4, 1, True), (3, 4, 4, False), (4, 4, 4, True), (2, 2, 8, True), (1, 2, 8, False)],
)
def test_eligible_needs_min_of_min_tokens_and_window(n, window, min_tokens, expected):
    assert eligible(n, window, min_tokens) is expected


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(0, 20, allow_nan=False), max_size=40),
    window=st.integers(1, 8),
    min_tokens=st.integers(1, 8),
    statistic=st.sampled_from(["mean", "max", "p90"]),
)
def test_the_online_window_max_is_calibrates_peak(values, window, min_tokens, statistic):
    policy = TriggerPolicy(cfg(window=window, min_tokens=min_tokens, statistic=statistic), "Who?")
    for i, v in enumerate(values):
        policy.push(i, "x", v, math.nan)
    assert policy.window_max == pytest.approx(max(0.0, window_peak(values, window, statistic, min_tokens)))


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=40))
def test_it_crosses_exactly_when_an_eligible_window_is_above_the_threshold(values):
    policy = TriggerPolicy(cfg(threshold=5.0), "Who?")
    crossed = [policy.push(i, "x", v, math.nan)[1] for i, v in enumerate(values)]
    assert any(crossed) == (window_peak(values, 4, "mean", 2) > 5.0)


def test_the_span_starts_at_the_windows_oldest_token_and_reset_starts_afresh():
    policy = TriggerPolicy(cfg(window=3), "Who?")
    for i in range(5):
        policy.push(i, "x", 1.0, math.nan)
    assert policy.span_start == 2 and policy.first_rewindable(5) == 2
    policy.reset()
    assert policy.first_rewindable(5) == 5


def test_a_kind_threshold_overrides_the_global_one_and_entropy_signals_name_themselves():
    policy = TriggerPolicy(cfg(signal="entropy", kind_thresholds={"capital": 1.5}), "What is the capital of Chad?")
    assert policy.kind == "capital" and policy.threshold == 1.5
    assert policy.statistic_name == "entropy:mean"
    value, crossed = policy.push(0, "N", 0.0, 2.0)
    assert value == 2.0 and not crossed  # one value: not yet eligible (min_tokens 2)
    assert policy.push(1, "d", 0.0, 2.0) == (2.0, True)


def test_novel_signals_skip_tokens_copied_from_the_question():
    policy = TriggerPolicy(cfg(signal="novel", min_tokens=1), "Where is Ouagadougou?")
    value, crossed = policy.push(0, "Ouagadougou", 9.0, math.nan)
    assert math.isnan(value) and not crossed and policy.pushed_at == []


# --------------------------------------------------------------------------------------------
# sentence scope: the judge of every finished sentence
# --------------------------------------------------------------------------------------------
from surprisegate.gate.trigger import SentenceJudge  # noqa: E402

CHAD = "Write a short paragraph about Chad: its capital and its currency."


def feed(judge, pieces, values):
    fired = []
    for i, (p, v) in enumerate(zip(pieces, values, strict=True)):
        if judge.push(i, p, v):
            fired.append((judge.judged, judge.rewind_at, judge.doubt))
    return fired


def test_the_judge_fires_on_the_claim_of_a_sentence_that_speaks_of_what_was_asked():
    pieces = [
        "Chad",
        " is",
        " vast",
        ".",
        " Its",
        " capital",
        " is",
        " Kou",
        "fc",
        "ontou",
        ".",
        " It",
        " is",
        " nice",
        ".",
    ]
    values = [9.0, 9.0, 9.0, 0.1, 0.1, 0.1, 0.1, 4.0, 0.2, 0.2, 0.1, 0.1, 0.1, 9.0, 0.1]
    judge = SentenceJudge(CHAD, threshold=2.0, max_tokens=160)
    fired = feed(judge, pieces, values)
    # The opening is uncertain but claims nothing; "It is nice." claims nothing either.
    ((start, end, text), rewind_at, doubt) = fired[0]
    assert len(fired) == 1 and (start, end, text) == (4, 11, "Its capital is Koufcontou.")
    assert rewind_at == 7 and doubt == 4.0  # the rewrite begins at " Kou", a word start


def test_a_sentence_off_the_question_is_not_judged_unless_asked_only_is_off():
    pieces = [" It", " joined", " the", " African", " Union", ".", " Then"]
    values = [0.1, 0.1, 0.1, 5.0, 0.1, 0.1, 0.1]
    assert feed(SentenceJudge(CHAD, 2.0, 160), pieces, values) == []
    assert len(feed(SentenceJudge(CHAD, 2.0, 160, asked_only=False), pieces, values)) == 1


def test_a_settled_sentence_is_not_judged_again_after_a_restart():
    pieces = [" Its", " capital", " is", " Kou", ".", " It"]
    values = [0.1, 0.1, 0.1, 5.0, 0.1, 0.1]
    judge = SentenceJudge(CHAD, 2.0, 160)
    assert len(feed(judge, pieces, values)) == 1
    # A revert puts the sentence back without the token that showed its end; the same end is not judged twice.
    judge.restart(pieces[:5], values[:5], at=0)
    assert judge.start == 0 and not judge.push(5, " It", 0.1)
    # A rewind cut the reply back to the sentence's claim word: the rewrite is not judged either.
    judge.restart(pieces[:3], values[:3], at=3)
    assert judge.start == 0
    assert not any(judge.push(i, p, 9.0) for i, p in enumerate([" Paris", ".", " It"], start=3))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([" Its", " capital", " is", " Kou", ".", " 12", "\n", " the", " currency"]), max_size=30)
)
def test_every_sentence_is_judged_once_and_in_order(pieces):
    judge = SentenceJudge(CHAD, -1.0, 10_000)
    starts = []
    for i, p in enumerate(pieces):
        before = set(judge.settled)
        judge.push(i, p, 1.0)
        starts += sorted(judge.settled - before)
    judge.end_of_turn()
    assert starts == sorted(starts) and len(starts) == len(set(starts))
    assert all(0 <= s < max(1, len(pieces)) for s in starts)


# ---- a sentence probe (kind "sentence"): the judge weighs the doubt with the sentence's mean state ----
import numpy as np  # noqa: E402

from surprisegate.gate.probe import SENTENCE_KIND, TriggerProbe  # noqa: E402

CAPITAL = [" Its", " capital", " is", " Kou", ".", " It"]
CAPITAL_VALUES = [0.1, 0.1, 0.1, 5.0, 0.1, 0.1]


def state_probe(kinds=frozenset({SENTENCE_KIND})) -> TriggerProbe:
    """Scores only the first state dimension (margin weight 0): a sentence fires when its mean state's x > 0."""
    zero = np.zeros(2, dtype=np.float32)
    return TriggerProbe("m.gguf", 3, kinds, zero, zero + 1, 0.0, np.array([1.0, 0.0], np.float32), 0.0, 0.0)


def push_with_states(judge, pieces, values, x):
    return [
        judge.push(i, p, v, np.array([x, 9.0], np.float32)) for i, (p, v) in enumerate(zip(pieces, values, strict=True))
    ]


@pytest.mark.parametrize("x, fires", [(1.0, True), (-1.0, False)])
def test_a_sentence_probe_decides_where_it_has_the_states(x, fires):
    judge = SentenceJudge(CHAD, 2.0, 160, probe=state_probe())
    verdicts = push_with_states(judge, CAPITAL, CAPITAL_VALUES, x)
    # The doubt (5.0) is over the threshold either way; the state alone decides.
    assert verdicts == [False] * 5 + [fires] and judge.doubt == 5.0  # " It" showed the end
    assert judge.probe_score == pytest.approx(x)


def test_without_states_or_a_claim_the_threshold_decides():
    judge = SentenceJudge(CHAD, 2.0, 160, probe=state_probe())
    assert feed(judge, CAPITAL, CAPITAL_VALUES) and judge.probe_score is None  # no states: the threshold
    off_topic = SentenceJudge(CHAD, -1.0, 160, probe=state_probe())
    pushed = push_with_states(off_topic, [" It", " joined", " the", " Union", ".", " It"], [5.0] * 6, 1.0)
    assert not any(pushed) and off_topic.probe_score is None  # speaks of nothing asked: never grounded


def test_a_restart_forgets_the_states_of_tokens_cut_away():
    judge = SentenceJudge(CHAD, 2.0, 160, probe=state_probe())
    push_with_states(judge, CAPITAL[:3], CAPITAL_VALUES[:3], 1.0)
    judge.restart(CAPITAL[:2], CAPITAL_VALUES[:2], at=2)
    assert sorted(judge.states) == [0, 1]
    # The tokens decoded after the cut bring their own states: their mean with the kept ones decides.
    later = zip(CAPITAL[2:], CAPITAL_VALUES[2:], strict=True)
    verdicts = [judge.push(i, p, v, np.array([-5.0, 0.0], np.float32)) for i, (p, v) in enumerate(later, start=2)]
    assert not any(verdicts) and judge.probe_score == pytest.approx((1 + 1 - 5 - 5 - 5) / 5)


def test_the_policy_gives_a_probe_only_to_the_scope_it_was_fitted_on():
    from surprisegate.gate.signals import question_kind

    paragraph = cfg(claim_scope="sentence", max_tokens=160)
    sentence_probe, first_probe = state_probe(), state_probe(frozenset({question_kind(CHAD)}))
    policy = TriggerPolicy(paragraph, CHAD, probe=sentence_probe)
    assert policy.probe is sentence_probe and policy.sentences.probe is sentence_probe and policy.pending is None
    for i, (p, v) in enumerate(zip(CAPITAL, CAPITAL_VALUES, strict=True)):
        policy.push(i, p, v, v, np.array([1.0, 0.0], np.float32))
    assert policy.crossing == ("sentence:probe", pytest.approx(1.0), 0.0) and policy.probe_score == pytest.approx(1.0)
    assert TriggerPolicy(paragraph, CHAD, probe=first_probe).probe is None  # a first-sentence probe: the threshold
    assert TriggerPolicy(cfg(claim_scope="reply"), CHAD, probe=sentence_probe).probe is None

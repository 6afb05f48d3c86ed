"""The window and trigger policy: the online rule and calibrate's offline peak are the same rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.config import Config
from surprisegate.gate.trigger import TriggerPolicy, eligible, window_peak


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

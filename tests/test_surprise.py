"""Surprise, aggregates and rolling windows against naive recomputation (property tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.surprise import RollingWindow, aggregates, percentile, surprise_bits, token_surprise, window_trace

finite = st.floats(min_value=0.0, max_value=60.0, allow_nan=False, allow_infinity=False)


def naive(values, statistic):
    if not values:
        return 0.0
    if statistic == "mean":
        return sum(values) / len(values)
    if statistic == "max":
        return max(values)
    return float(np.percentile(values, 90))


@pytest.mark.parametrize("logprob,bits", [(0.0, 0.0), (math.log(0.5), 1.0), (math.log(0.25), 2.0), (math.log(1 / 1024), 10.0)])
def test_surprise_bits_exact(logprob, bits):
    assert surprise_bits(logprob) == pytest.approx(bits, abs=1e-12)


@given(st.lists(st.floats(-30, 30), min_size=2, max_size=50), st.data())
def test_token_surprise_matches_log_softmax(logits, data):
    arr = np.array(logits, dtype=np.float32)
    before = arr.copy()
    tok = data.draw(st.integers(0, len(logits) - 1))
    x = arr.astype(np.float64)
    expected = -(x[tok] - (x.max() + np.log(np.exp(x - x.max()).sum()))) / math.log(2)
    assert token_surprise(arr, tok) == pytest.approx(expected, abs=1e-6)
    assert token_surprise(arr, tok) >= -1e-9
    np.testing.assert_array_equal(arr, before)  # detection only reads the logits


@settings(max_examples=300)
@given(st.lists(finite, max_size=80), st.integers(1, 32), st.sampled_from(["mean", "p90", "max"]))
def test_rolling_window_matches_naive_recomputation(values, size, statistic):
    window = RollingWindow(size, statistic)
    for i, v in enumerate(values):
        got = window.push(v)
        expect = naive(values[max(0, i + 1 - size): i + 1], statistic)
        assert got == pytest.approx(expect, rel=1e-9, abs=1e-9)
        assert len(window) == min(i + 1, size)
        assert window.start == max(0, i + 1 - size)


@given(st.lists(finite, min_size=1, max_size=40), st.lists(finite, min_size=1, max_size=40), st.integers(1, 16),
       st.sampled_from(["mean", "p90", "max"]))
def test_reset_forgets_everything(first, second, size, statistic):
    window = RollingWindow(size, statistic)
    for v in first:
        window.push(v)
    window.reset()
    assert len(window) == 0 and window.value == 0.0 and window.start == 0
    fresh = RollingWindow(size, statistic)
    for v in second:
        assert window.push(v) == pytest.approx(fresh.push(v))


def test_long_stream_mean_does_not_drift():
    rng = np.random.default_rng(0)
    values = rng.exponential(2.0, size=20_000)
    window = RollingWindow(16, "mean")
    for v in values:
        window.push(v)
    assert window.value == pytest.approx(values[-16:].mean(), rel=1e-12)


@given(st.lists(finite, max_size=100), st.floats(0, 20))
def test_aggregates_match_numpy(values, cut):
    agg = aggregates(values, tail_cut=cut)
    assert agg["n"] == len(values)
    if not values:
        assert agg["mean"] == agg["p90"] == agg["max"] == agg["tail_mass"] == 0.0
        return
    assert agg["mean"] == pytest.approx(np.mean(values), rel=1e-9, abs=1e-12)
    assert agg["p90"] == pytest.approx(np.percentile(values, 90), rel=1e-9, abs=1e-12)
    assert agg["max"] == max(values)
    assert agg["tail_mass"] == pytest.approx(sum(v > cut for v in values) / len(values))
    assert 0.0 <= agg["tail_mass"] <= 1.0


@given(st.lists(finite, min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(values, q):
    assert percentile(sorted(values), q) == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-9)


def test_window_trace_is_the_stream_of_statistics():
    assert window_trace([1.0, 3.0, 5.0], 2, "mean") == [1.0, 2.0, 4.0]
    assert window_trace([1.0, 3.0, 2.0, 0.0], 2, "max") == [1.0, 3.0, 3.0, 2.0]


@pytest.mark.parametrize("size,statistic,match", [(0, "mean", "window=0"), (4, "median", "statistic='median'")])
def test_bad_window_arguments_name_the_value(size, statistic, match):
    with pytest.raises(ValueError, match=match):
        RollingWindow(size, statistic)

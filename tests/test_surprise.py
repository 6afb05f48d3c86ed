"""Surprise, aggregates and rolling windows against naive recomputation (property tests)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.errors import InputError
from surprisegate.gate import surprise
from surprisegate.gate.surprise import (
    RollingWindow,
    aggregates,
    percentile,
    surprise_and_entropy,
    surprise_bits,
    token_surprise,
    top_logprobs,
    topk_entropy,
    topk_entropy_bounds,
    window_trace,
)

finite = st.floats(min_value=0.0, max_value=60.0, allow_nan=False, allow_infinity=False)


def naive(values, statistic):
    if not values:
        return 0.0
    if statistic == "mean":
        return sum(values) / len(values)
    if statistic == "max":
        return max(values)
    return float(np.percentile(values, 90))


@pytest.mark.parametrize(
    "logprob,bits", [(0.0, 0.0), (math.log(0.5), 1.0), (math.log(0.25), 2.0), (math.log(1 / 1024), 10.0)]
)
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
        expect = naive(values[max(0, i + 1 - size) : i + 1], statistic)
        assert got == pytest.approx(expect, rel=1e-9, abs=1e-9)
        assert len(window) == min(i + 1, size)
        assert window.start == max(0, i + 1 - size)


@given(
    st.lists(finite, min_size=1, max_size=40),
    st.lists(finite, min_size=1, max_size=40),
    st.integers(1, 16),
    st.sampled_from(["mean", "p90", "max"]),
)
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


# ------------------------------------------------------------------------------------------------
# entropy from the top-k logprobs only
# ------------------------------------------------------------------------------------------------

logit_lists = st.lists(st.floats(-30, 30, allow_nan=False, allow_infinity=False), min_size=1, max_size=60)
TOL = 1e-9


def exact_entropy(logits) -> float:
    return surprise_and_entropy(np.asarray(logits, dtype=np.float64), 0)[1]


@given(logit_lists)
def test_topk_entropy_is_exact_when_k_covers_the_distribution(logits):
    top = top_logprobs(np.array(logits), len(logits))
    h = exact_entropy(logits)
    lower, upper = topk_entropy_bounds(top, vocab_size=len(logits))
    assert lower == pytest.approx(h, abs=1e-9) and upper == pytest.approx(h, abs=1e-9)
    assert topk_entropy(top, vocab_size=len(logits)) == pytest.approx(h, abs=1e-9)
    assert topk_entropy(top) == pytest.approx(h, abs=1e-6)  # vocab unknown: the top k hold all the mass


@settings(max_examples=200)
@given(logit_lists)
def test_topk_bounds_hold_and_tighten_as_k_grows(logits):
    x = np.array(logits)
    h = exact_entropy(x)
    v = len(logits)
    previous = (-math.inf, math.inf)
    for k in range(1, v + 1):
        top = top_logprobs(x, k)
        lower, upper = topk_entropy_bounds(top, vocab_size=v)
        estimate = topk_entropy(top, vocab_size=v)
        assert lower - TOL <= h <= upper + TOL
        assert lower - TOL <= estimate <= upper + TOL and math.isfinite(estimate)
        assert lower >= previous[0] - TOL and upper <= previous[1] + TOL  # more of the distribution: tighter
        assert 0.0 <= lower and upper <= math.log2(v) + TOL
        # vocab unknown: the same lower bound, no upper bound unless the top k hold all the mass
        unknown_lower, unknown_upper = topk_entropy_bounds(top)
        assert unknown_lower == pytest.approx(lower, abs=TOL) and unknown_upper >= upper - TOL
        assert math.isfinite(topk_entropy(top))
        previous = (lower, upper)


def test_topk_entropy_takes_pairs_or_plain_logprobs():
    logits = np.array([2.0, 1.0, 0.5, -1.0, -3.0])
    pairs = top_logprobs(logits, 3)
    plain = [lp for _, lp in pairs]
    assert topk_entropy(pairs, 5) == topk_entropy(plain, 5) == topk_entropy(np.array(plain), 5)
    assert topk_entropy([list(p) for p in pairs], 5) == topk_entropy(plain, 5)  # as receipts store them (JSON)


def test_topk_entropy_edge_cases():
    # k = 1, all the mass on it: certain
    assert topk_entropy_bounds([0.0]) == (0.0, 0.0) and topk_entropy([0.0]) == 0.0
    # -inf logprobs carry no mass
    assert topk_entropy_bounds([math.log(0.5), math.log(0.5), -math.inf], 10) == (
        pytest.approx(1.0),
        pytest.approx(1.0),
    )
    # m ~ 0: rounding may make the top k sum a little above 1; that is a complete distribution
    lower, upper = topk_entropy_bounds([-0.00001, -11.0], 1000)
    assert lower == upper and 0 < lower < 0.01
    # m ~ 1: the most likely token holds almost nothing, so the entropy is high but finite
    lower, upper = topk_entropy_bounds([-20.0], 49152)
    assert lower <= upper == pytest.approx(math.log2(49152), abs=1e-3)
    assert math.isfinite(topk_entropy([-20.0])) and topk_entropy([-20.0]) > 15
    # the same top-1, less on the second token: more missing mass, so more room for the tail
    uppers = [topk_entropy_bounds([math.log(0.6), math.log(p)], 100)[1] for p in (0.4, 0.3, 0.2, 0.1, 0.01)]
    assert all(b >= a - TOL for a, b in itertools.pairwise(uppers))
    estimates = [topk_entropy([math.log(0.6), math.log(p)], 100) for p in (0.4, 0.3, 0.2, 0.1, 0.01)]
    assert all(math.isfinite(e) and 0 <= e <= math.log2(100) for e in estimates)


@pytest.mark.parametrize(
    "top,vocab,match",
    [
        ([], None, r"top_logprobs=\[\] holds no logprobs"),
        (3.0, None, r"top_logprobs=3.0 holds no logprobs"),
        ([0.5, 0.3], None, r"holds 0.5, which is not a natural-log probability.*pass log p"),
        ([float("nan")], None, r"holds nan"),
        ([-2.0, -1.0], None, r"is not most likely first; sort it"),
        ([-0.1, -0.2], None, r"sum to probability 1.7236 > 1; pass the logprobs of one normalised distribution"),
        (
            [-1.0, -math.inf],
            None,
            r"leave probability 0.6321 unaccounted, but its k-th most likely token has probability 0",
        ),
        ([-1.0], 1, r"vocab_size=1 leaves no other token"),
        ([-1.0, -2.0], 1, r"vocab_size=1 must be a whole number of tokens >= k=2"),
        ([-1.0], 2.5, r"vocab_size=2.5 must be a whole number"),
        (["x"], None, r"holds 'x', not a logprob"),
    ],
)
def test_topk_entropy_bad_input_names_the_argument_and_the_fix(top, vocab, match):
    with pytest.raises(InputError, match=match):
        topk_entropy_bounds(top, vocab)
    with pytest.raises(ValueError):  # InputError is a ValueError
        topk_entropy(top, vocab)


def _float64_signals(logits: np.ndarray, token: int) -> tuple[float, float]:
    x = logits.astype(np.float64)
    m = x.max()
    e = np.exp(x - m)
    z = e.sum()
    return (math.log(z) - (x[token] - m)) / math.log(2), (math.log(z) - (e @ (x - m)) / z) / math.log(2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70_000), st.floats(0.1, 40.0), st.integers(0, 2**32 - 1))
def test_the_compiled_softmax_stats_and_numpy_give_the_same_choice_and_signals(size, scale, seed):
    """The per-token stats in C (native.py) and their numpy twin choose the same token and agree with a float64
    reference to ~1e-6 bits, at every vocabulary length (the kernel's 16 lanes, 1024-value blocks, a tail)."""
    from surprisegate.native import softmax_stats_library

    if softmax_stats_library() is None:
        pytest.skip("no C compiler here: only the numpy twin runs")
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(size) * scale).astype(np.float32)
    logits[rng.integers(size)] += np.float32(rng.uniform(0, 30))  # a confident step as well as a flat one
    token = int(rng.integers(size))
    native, twin = surprise.softmax_stats(logits), surprise.numpy_softmax_stats(logits)
    assert native.argmax == twin.argmax == int(logits.argmax())
    assert native.max == twin.max
    assert native[2:] == pytest.approx(twin[2:], rel=2e-5, abs=1e-30)
    got = surprise_and_entropy(logits, token)
    want = _float64_signals(logits, token)
    assert got[0] == pytest.approx(want[0], abs=2e-5)
    assert got[1] == pytest.approx(want[1], abs=2e-5)


@pytest.mark.parametrize("native", [True, False])
def test_masked_logits_count_as_nothing_in_either_twin(native, monkeypatch):
    """A -inf logit (a masked token) adds nothing: the entropy is that of the tokens left, not NaN."""
    from surprisegate import native as native_module

    if not native:
        monkeypatch.setattr(native_module, "softmax_stats_library", lambda: None)
    elif native_module.softmax_stats_library() is None:
        pytest.skip("no C compiler here")
    logits = np.zeros(40, dtype=np.float32)
    logits[:36] = -np.inf  # four equally likely tokens left: 2 bits of entropy, 2 bits of surprise each
    surprise_bits_, entropy = surprise_and_entropy(logits, 38)
    assert surprise_bits_ == pytest.approx(2.0, abs=1e-6)
    assert entropy == pytest.approx(2.0, abs=1e-6)


def test_float64_and_strided_logits_take_the_numpy_twin_and_agree():
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(3001) * 4).astype(np.float32)
    want = surprise_and_entropy(logits, 11)
    assert surprise_and_entropy(logits.astype(np.float64), 11) == pytest.approx(want, abs=2e-5)
    doubled = np.repeat(logits, 2)[::2]  # a strided view: the kernel reads contiguous floats only
    assert not doubled.flags.c_contiguous
    assert surprise_and_entropy(doubled, 11) == pytest.approx(want, abs=2e-5)


@pytest.mark.parametrize(
    "where", [[5], [5, 3000], [2000, 2001, 40000], [49151], [0, 49151]], ids=lambda w: "ties at " + str(w)
)
def test_the_greedy_choice_is_the_first_of_tied_maxima_as_numpy_argmax(where):
    """The kernel keeps the first block that reached the max and the first index in it (numpy's argmax)."""
    logits = np.full(49152, -1.0, dtype=np.float32)
    logits[where] = np.float32(9.5)
    assert surprise.softmax_stats(logits).argmax == where[0] == int(logits.argmax())


def test_a_max_that_rises_block_after_block_rescales_the_sums():
    """Ascending logits raise the running max in every block: the rescaled sums still match float64."""
    logits = np.linspace(-20, 20, 49152, dtype=np.float32)
    stats = surprise.softmax_stats(logits)
    x = logits.astype(np.float64)
    e = np.exp(x - x.max())
    assert stats.argmax == 49151
    assert stats.total == pytest.approx(e.sum(), rel=1e-6)
    assert stats.weighted == pytest.approx(e @ (x - x.max()), rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=30), st.data())
def test_signals_within_a_set_are_those_of_the_renormalised_distribution(values, data):
    logits = np.array(values, dtype=np.float32)
    allowed = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, unique=True))
    token = data.draw(st.sampled_from(allowed))
    s, h = surprise.signals_within(logits, token, allowed)
    ids = sorted(set(allowed))
    p = np.exp(logits[ids].astype(np.float64) - logits[ids].max())
    p /= p.sum()
    assert s == pytest.approx(max(-math.log2(p[ids.index(token)]), 0.0), abs=1e-6)
    assert h == pytest.approx(max(float(-(p[p > 0] * np.log2(p[p > 0])).sum()), 0.0), abs=1e-6)
    whole_s, _ = surprise.signals_within(logits, token, range(len(values)))
    assert s <= whole_s + 1e-9  # a smaller set never makes the token more surprising

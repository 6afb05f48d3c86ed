"""backends/samplers.py: the sampling settings clients send shape the choice and never the signal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.backends import Sampling
from surprisegate.backends.samplers import Shaping, add_bias, count_penalised, repeat_penalised, truncated
from surprisegate.config import Config
from surprisegate.errors import ConfigError
from surprisegate.gate.loop import generate
from surprisegate.gate.result import sampling_record

logits_st = st.lists(st.floats(-20, 20), min_size=2, max_size=40).map(lambda v: np.array(v, dtype=np.float32))


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    finite = np.isfinite(z)
    p = np.zeros_like(z)
    p[finite] = np.exp(z[finite] - z[finite].max())
    return p / p.sum()


# ------------------------------------------------------------------------------------------ truncation
def test_top_k_keeps_the_k_most_likely():
    z = np.array([1.0, 5.0, 3.0, 4.0, 2.0])
    assert np.isfinite(truncated(z, 2, 1.0, 0.0)).tolist() == [False, True, False, True, False]


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.isfinite(truncated(z, 0, 0.5, 0.0)).tolist() == [True, False, False, False]
    assert np.isfinite(truncated(z, 0, 0.6, 0.0)).tolist() == [True, True, False, False]
    assert np.isfinite(truncated(z, 0, 0.75, 0.0)).tolist() == [True, True, False, False]
    assert np.isfinite(truncated(z, 0, 0.85, 0.0)).tolist() == [True, True, True, False]
    assert np.isfinite(truncated(z, 0, 1.0, 0.0)).all()


def test_min_p_is_relative_to_the_most_likely():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.isfinite(truncated(z, 0, 1.0, 0.3)).tolist() == [True, True, True, False]  # 0.15 >= 0.3 x 0.5
    assert np.isfinite(truncated(z, 0, 1.0, 0.9)).tolist() == [True, False, False, False]


@settings(max_examples=200, deadline=None)
@given(logits_st, st.integers(0, 50), st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_truncation_keeps_the_argmax_and_only_removes(z, top_k, top_p, min_p):
    out = truncated(z, top_k, top_p, min_p)
    kept = np.isfinite(out)
    assert kept[int(np.argmax(z))]  # the most likely token always survives: greedy never feels truncation
    assert np.array_equal(out[kept], z[kept].astype(np.float64))  # kept logits unchanged
    if top_k:
        assert kept.sum() <= max(top_k, 1)
    p = softmax(z)
    if (
        top_p < 1.0
    ):  # the kept set reaches the mass (or is the argmax alone), and no kept token is less likely than a dropped one
        assert p[kept].sum() >= min(top_p, p.max()) - 1e-9 or top_k
    if kept.sum() < z.size:
        assert p[kept].min() >= p[~kept].max() - 1e-12


# ------------------------------------------------------------------------------------------ reshaping
def test_logit_bias_adds_and_never_writes_the_input():
    z = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    out = add_bias(z, {0: 5.0, 2: -100.0})
    assert out.tolist() == [5.0, 1.0, -98.0] and z.tolist() == [0.0, 1.0, 2.0]


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_once_per_token():
    z = np.array([4.0, -2.0, 3.0, 1.0])
    out = repeat_penalised(z, [0, 1, 0, 0], 2.0)
    assert out.tolist() == [2.0, -4.0, 3.0, 1.0]


def test_frequency_and_presence_follow_openais_formula():
    z = np.zeros(4)
    out = count_penalised(z, [1, 1, 1, 3], frequency=0.5, presence=0.25)
    assert out.tolist() == [0.0, -1.75, 0.0, -0.75]


@settings(max_examples=100, deadline=None)
@given(logits_st, st.lists(st.integers(0, 1), max_size=10), st.floats(1.0, 3.0), st.floats(0.0, 2.0))
def test_penalties_never_make_a_used_token_likelier(z, used, repeat, frequency):
    shaping = Shaping(repeat_penalty=repeat, frequency_penalty=frequency)
    out = shaping.reshape(z, used, used)
    for t in set(used):
        assert out[t] <= z[t] + 1e-9
    untouched = [i for i in range(z.size) if i not in set(used)]
    assert np.allclose(out[untouched], z[untouched])


def test_defaults_change_nothing_and_say_nothing():
    assert not Shaping().active and Shaping().settings() == {}
    shaped = Shaping(top_p=0.9, repeat_penalty=1.1, logit_bias={7: -100.0})
    assert shaped.settings() == {"top_p": 0.9, "repeat_penalty": 1.1, "repeat_last_n": 64, "logit_bias": {"7": -100.0}}


# ------------------------------------------------------------------------------------------ Sampling.choose
def test_greedy_choice_follows_bias_and_penalties_but_not_truncation():
    z = np.array([1.0, 3.0, 2.9, 0.0], dtype=np.float32)
    assert Sampling(shaping=Shaping(top_k=1, top_p=0.1, min_p=0.9)).choose(z) == 1
    assert Sampling(shaping=Shaping(logit_bias={1: -100.0})).choose(z) == 2
    assert Sampling(shaping=Shaping(repeat_penalty=2.0)).choose(z, context=[5, 1]) == 2
    reply = [1]
    penalised = Sampling(shaping=Shaping(frequency_penalty=1.0), reply_tokens=lambda: reply)
    assert penalised.choose(z) == 2
    reply.clear()
    assert penalised.choose(z) == 1  # the reply after a rewind: nothing to penalise


def test_sampled_choices_stay_inside_top_k():
    z = np.zeros(50, dtype=np.float32)
    z[:3] = [3.0, 2.9, 2.8]
    sampling = Sampling(temperature=1.5, seed=3, shaping=Shaping(top_k=3))
    assert {sampling.choose(z) for _ in range(300)} <= {0, 1, 2}
    unshaped = Sampling(temperature=1.5, seed=3)
    assert len({unshaped.choose(z) for _ in range(300)}) > 3


def test_the_signal_is_read_from_the_raw_distribution():
    z = np.array([1.0, 3.0, 2.0], dtype=np.float32)
    plain = Sampling().step(z, 2, b"x")
    shaped = Sampling(shaping=Shaping(logit_bias={1: -100.0}, top_p=0.5)).step(z, 2, b"x")
    assert shaped.surprise == plain.surprise and shaped.entropy == plain.entropy
    assert plain.surprise == pytest.approx(-math.log2(softmax(z)[2]))


# ------------------------------------------------------------------------------------------ config and receipt
@pytest.mark.parametrize(
    "key,value",
    [
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("min_p", 2.0),
        ("repeat_penalty", 0.0),
        ("frequency_penalty", 3.0),
    ],
)
def test_config_refuses_settings_out_of_range_naming_them(key, value):
    with pytest.raises(ConfigError, match=f"^{key}="):
        Config().replace(**{key: value})


def test_config_refuses_a_bad_logit_bias():
    with pytest.raises(ConfigError, match="logit_bias"):
        Config().replace(logit_bias={5: 500.0})
    assert Config().replace(logit_bias={"5": "-100"}).logit_bias == {5: -100.0}  # as a TOML table gives it


def test_the_receipt_says_what_shaped_the_choice_and_where_the_signal_came_from():
    record = sampling_record(Config().replace(top_p=0.9, logit_bias={3: -100.0}), "llamacpp")
    assert record["shaped_by"] == {"top_p": 0.9, "logit_bias": {"3": -100.0}}
    assert "raw distribution" in record["signal_from"]
    assert sampling_record(Config(), "vllm")["shaped_by"] == {}


# ------------------------------------------------------------------------------------------ the real model
@pytest.mark.slow
def test_a_banned_first_token_changes_the_greedy_reply_and_the_signal_stays_raw(llama_backend):
    question = "What is the capital of France?"
    plain = generate(llama_backend, question, Config(mode="detect", max_tokens=8)).result
    first = plain.token_ids[0]
    banned = generate(llama_backend, question, Config(mode="detect", max_tokens=8, logit_bias={first: -100.0})).result
    assert banned.token_ids[0] != first
    # The second choice's surprise is its raw -log2 p: higher than the greedy token's, under no bias.
    assert banned.token_surprises[0] > plain.token_surprises[0]
    penalised = generate(
        llama_backend, "Repeat the word cat ten times.", Config(mode="detect", max_tokens=24, frequency_penalty=2.0)
    ).result
    unpenalised = generate(llama_backend, "Repeat the word cat ten times.", Config(mode="detect", max_tokens=24)).result
    assert penalised.reply != unpenalised.reply

"""Benchmarks run end to end at a small size: the JSON they print has the ratio and the raw timings.

The targets themselves (decode >= 0.97, rewind <= 0.1) are measured by `surprisegate bench`, not here:
a timed assertion on a shared 2-core CI machine would be noise.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.research.bench import paired_ratio_interval, repeat_order


@pytest.mark.slow
def test_bench_decode_small():
    pytest.importorskip("llama_cpp")
    from surprisegate.research.bench import bench_decode

    out = bench_decode(n_tokens=24, repeats=2)
    assert out["same_tokens"] is True  # detection only reads logits: same greedy tokens as plain llama.cpp
    assert (
        out["tokens_per_run"]["plain"] == out["tokens_per_run"]["detect"] == out["tokens_per_run"]["detect_tapped"] > 0
    )
    assert out["ratio"] == pytest.approx(out["detect_tokens_per_s"] / out["plain_tokens_per_s"], rel=1e-2)
    assert out["tapped_ratio"] == pytest.approx(out["detect_tapped_tokens_per_s"] / out["plain_tokens_per_s"], rel=1e-2)
    assert out["tap"] == "compiled"  # setup builds llama.cpp from source: a C compiler is here
    assert len(out["detect_runs"]) == len(out["plain_runs"]) == len(out["detect_tapped_runs"]) == 2
    for key in ("ratio", "tapped_ratio"):
        low, high = out[f"{key}_95ci"]
        assert low <= out[key] <= high
    assert out["machine"]["cpu_count"] >= 1 and out["repeats"] == 2


@pytest.mark.slow
def test_bench_decode_paragraph_judges_sentences_and_decodes_the_same_tokens():
    pytest.importorskip("llama_cpp")
    from surprisegate.research.bench import PARAGRAPH_PROMPT, bench_decode

    out = bench_decode(n_tokens=48, repeats=1, paragraph=True)
    assert out["benchmark"] == "decode_paragraph" and out["claim_scope"] == "sentence"
    assert out["prompt"] == PARAGRAPH_PROMPT and out["same_tokens"] is True  # the judge only reads, never steers
    assert out["tokens_per_run"]["detect"] == out["tokens_per_run"]["plain"] > 0


@pytest.mark.slow
def test_bench_rewind_small():
    pytest.importorskip("llama_cpp")
    from surprisegate.research.bench import bench_rewind

    out = bench_rewind(context_tokens=300, repeats=1)
    assert out["context_tokens"] == 300 and out["injected_tokens"] == 30 and out["rewound_tokens"] == 16
    assert out["ratio"] == pytest.approx(out["rewind_inject_redecode_ms"] / out["reprefill_ms"], rel=1e-2)
    assert out["reprefill_ms"] > 0 and out["rewind_inject_redecode_ms"] > 0


@pytest.mark.slow
def test_bench_http_small():
    from surprisegate.backends.llama_server import find_llama_server

    if find_llama_server() is None:
        pytest.skip("llama-server is not built (make llama-server)")
    from surprisegate.research.bench import bench_http

    out = bench_http(context_tokens=400, n_tokens=24, repeats=1)
    assert out["benchmark"] == "http" and out["server_started_here"] is True
    assert out["injected_tokens"] == 30 and out["rewound_tokens"] == 16
    assert out["resume_ratio"] < 1
    assert out["resume_ratio"] == pytest.approx(out["resume_prompt_ms"] / out["cold_prompt_ms"], rel=1e-2)
    assert out["stream_ratio"] == pytest.approx(out["detect_tokens_per_s"] / out["plain_tokens_per_s"], rel=1e-2)
    assert out["resume_cached"][0] >= 400 - 16 - 1 and out["cold_cached"][0] <= 1
    assert out["tokens_per_run"]["detect"] > 0 and out["tokens_per_run"]["plain20"] > 0
    assert len(out["detect_runs"]) == len(out["plain_runs"]) == len(out["plain_n_probs0_runs"]) == 1
    for key in ("resume_target", "stream_target", "n_probs_cost", "cold_runs_ms", "resume_runs_ms"):
        assert key in out


# The interval and the order are pure: tested over many cases without a model.

speeds = st.lists(st.floats(min_value=1.0, max_value=500.0, allow_nan=False), min_size=1, max_size=30)


@given(speeds, st.floats(min_value=0.5, max_value=1.5))
def test_interval_holds_the_ratio_and_scales(base, factor):
    out = paired_ratio_interval([b * factor for b in base], base, resamples=200)
    assert out["low"] <= out["ratio"] <= out["high"]
    assert out["ratio"] == pytest.approx(factor, abs=1e-4)  # a constant factor: every resample sees it


@given(speeds, speeds)
def test_interval_lies_within_the_repeats(cand, base):
    n = min(len(cand), len(base))
    cand, base = cand[:n], base[:n]
    out = paired_ratio_interval(cand, base, resamples=200)
    per_repeat = [c / b for c, b in zip(cand, base, strict=True)]
    # a ratio of sums is a weighted mean of the per-repeat ratios: it cannot leave their range
    assert min(per_repeat) - 1e-3 <= out["low"] <= out["high"] <= max(per_repeat) + 1e-3


def test_interval_narrows_with_more_repeats_and_names_a_mismatch():
    rng = random.Random(3)
    base = [60 + rng.uniform(-6, 6) for _ in range(200)]
    cand = [b * 0.95 + rng.uniform(-3, 3) for b in base]
    few, many = paired_ratio_interval(cand[:8], base[:8]), paired_ratio_interval(cand, base)
    assert many["high"] - many["low"] < few["high"] - few["low"]
    assert many["low"] <= 0.95 <= many["high"]
    with pytest.raises(ValueError, match="3 candidate and 2 baseline"):
        paired_ratio_interval([1.0, 2.0, 3.0], [1.0, 2.0])


def test_repeat_order_puts_every_arm_in_every_position_both_ways():
    names = ["plain", "detect", "detect_tapped"]
    orders = [repeat_order(names, i) for i in range(2 * len(names))]
    assert all(sorted(o) == sorted(names) for o in orders)
    for pos in range(3):
        assert {o[pos] for o in orders} == set(names)
    for a in names:
        for b in names:
            if a != b:
                assert any(o.index(a) < o.index(b) for o in orders) and any(o.index(b) < o.index(a) for o in orders)


# --------------------------------------------------------------------------------------------
# bench paragraph: the pause a reader sees
# --------------------------------------------------------------------------------------------
from surprisegate.research.bench_paragraph import _quantiles, bench_paragraph, longest_gap  # noqa: E402


@given(st.lists(st.floats(0, 10), min_size=1, max_size=30))
def test_quantiles_are_ordered_whatever_the_order_of_the_values(values):
    q = _quantiles(values)
    assert min(values) * 1000 - 0.1 <= q["p50"] <= q["p95"] <= max(values) * 1000 + 0.1 and q["n"] == len(values)


@given(st.floats(0, 5), st.lists(st.floats(0, 5), max_size=10))
def test_the_longest_gap_is_between_two_consecutive_shown_points(first, steps):
    marks, at = [], first
    for step in steps:
        at += step
        marks.append(at)
    assert longest_gap(first, marks) == pytest.approx(max(steps, default=0.0), abs=1e-9)


def test_bench_paragraph_runs_off_and_intervene_on_the_same_prompts():
    from surprisegate.arms import Evidence
    from surprisegate.config import Config

    from scripted import ScriptedBackend, plan

    wrong = "Testland is a small country. Its capital is Wrongville. Its currency is the Testmark."

    def script(context):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "Rightburg" in reply or "Testland is Rightburg." in context:
            return plan(wrong.replace("Wrongville", "Rightburg"))
        return plan(wrong, doubtful="Wrongville")

    class Memory:
        name = "memory"

        def ground(self, query, deadline):
            return [Evidence("c", "The capital of Testland is Rightburg.", 0.9, "memory:x")]

    config = Config(signal="surprise", system_prompt="", max_tokens=160, sentence_threshold=3.0, kind_thresholds={})
    prompt = "Write a short paragraph about Testland: its capital and its currency."
    out = bench_paragraph(ScriptedBackend(script), config, {"memory": Memory()}, [prompt, prompt, prompt])
    assert out["prompts"] == 3 and out["grounded_prompts"] == 3 and out["extra_gap_ms"]["n"] == 3
    # Each rewound round's overhead, and its rewrite's decode: the sentence rewritten ("Its capital is Rightburg.").
    assert out["round_overhead_ms"]["n"] == 3 and out["round_overhead_ms"]["p95"] >= 0
    assert out["rewrite_decode"]["ms"]["n"] == out["rewrite_decode"]["tokens"]["n"] == 3
    assert out["rewrite_decode"]["tokens"]["p50"] >= 1 and out["goal"] == "round_overhead_ms p95 <= 150"
    for mode in ("off", "intervene"):
        assert out["ms"][mode]["time_to_first_token"]["n"] == 3
        assert out["ms"][mode]["longest_sentence_gap"]["p95"] >= out["ms"][mode]["longest_sentence_gap"]["p50"] >= 0
    # The overhead's parts: the arms, and the injection with the tokens it fed (system_turn: the evidence turn, then
    # the reply so far again). Under sentence_turn the opening sentence stays where it was: 2 tokens close its turn.
    parts = out["round_parts"]
    assert parts["arms_ms"]["n"] == parts["injection_and_refeed_ms"]["n"] == parts["tokens_fed"]["n"] == 3
    assert parts["tokens_fed"]["p50"] > len("The capital of Testland is Rightburg. Testland is a small country.")
    turn = bench_paragraph(
        ScriptedBackend(script, turns_join=True),
        config.replace(injection="sentence_turn"),
        {"memory": Memory()},
        [prompt],
    )
    assert (
        turn["round_parts"]["tokens_fed"]["p50"] == parts["tokens_fed"]["p50"] - len("Testland is a small country.") + 2
    )


@pytest.mark.slow
def test_profile_decode_times_each_part_in_place(tmp_path):
    """scripts/profile_decode.py: every arm decodes, the parts it names were called, and the time outside
    llama_decode is positive and less than the whole."""
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "profile_decode.py"
    spec = importlib.util.spec_from_file_location("profile_decode", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "parts.json"
    assert module.main(["--repeats", "1", "--tokens", "12", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for arm in ("plain", "detect", "detect_tapped"):
        f = figures[arm]
        assert f["tokens"] == 12
        assert 0 < f["outside_decode_us_per_token"] < f["us_per_token"]
        assert f["parts_us_per_token"]["llama_decode"] > 0
    assert "Llama.sample (plain: reads the logits in C)" in figures["plain"]["parts_us_per_token"]
    assert "Sampling.stats (softmax pass)" in figures["detect"]["parts_us_per_token"]
    assert "hidden_state_of (tapped copy)" in figures["detect_tapped"]["parts_us_per_token"]


def test_stream_timing_times_first_byte_first_content_and_silence_per_mode():
    from surprisegate.research.bench_server import stream_timing
    from test_serve import MODEL, Sessions, scripted_runtime, start

    srv = start(scripted_runtime(Sessions(delay_s=0.01)))
    try:
        out = stream_timing(srv.url, MODEL, pairs=2)
    finally:
        srv.stop()
    assert out["pairs"] == 2 and out["question"]
    for mode in ("off", "intervene"):
        figures = out[mode]
        assert 0 < figures["first_byte_ms"] <= figures["first_content_ms"]
        assert 0 < figures["longest_silence_ms"] < 2000 and figures["fired"] == 0  # nothing grounds an echo
    assert out["first_content_intervene_over_off"] > 0

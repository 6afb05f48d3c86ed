"""Benchmarks run end to end at a small size: the JSON they print has the ratio and the raw timings.

The targets themselves (decode >= 0.97, rewind <= 0.1) are measured by `surprisegate bench`, not here:
a timed assertion on a shared 2-core CI machine would be noise.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


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


def test_bench_rewind_small():
    pytest.importorskip("llama_cpp")
    from surprisegate.research.bench import bench_rewind

    out = bench_rewind(context_tokens=300, repeats=1)
    assert out["context_tokens"] == 300 and out["injected_tokens"] == 30 and out["rewound_tokens"] == 16
    assert out["ratio"] == pytest.approx(out["rewind_inject_redecode_ms"] / out["reprefill_ms"], rel=1e-2)
    assert out["reprefill_ms"] > 0 and out["rewind_inject_redecode_ms"] > 0


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

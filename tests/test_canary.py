"""The groundedness canary: a table of verdicts, the edges of the rule, and monotonicity in surprise."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.arms import Evidence
from surprisegate.errors import ConfigError
from surprisegate.gate.canary import VERDICTS, groundedness_canary
from surprisegate.gate.receipts import ConvergenceRecord

THRESHOLD = 3.5
CALM = {"n_tokens": 12, "mean": 1.0, "p90": 2.0, "window_max": 2.5}  # below the threshold
JUMPY = {"n_tokens": 12, "mean": 2.5, "p90": 5.0, "window_max": 5.5}  # above it


def rewound(confidence: float, observable: float = 0.0, source: str = "memory:kb:1") -> dict:
    chosen = {"claim": "c", "evidence": "e", "confidence": confidence, "source": source, "observable": observable}
    return {"round": 1, "action": "rewound", "chosen": chosen}


UNRESOLVED = {"round": 1, "action": "resumed_unmodified", "chosen": None, "reason": "web timed out"}


@pytest.mark.parametrize(
    "aggregates, rounds, verdict",
    [
        (CALM, [], "confident_unanchored"),
        (CALM, [rewound(0.9)], "confident_grounded"),
        (CALM, [rewound(1.0, observable=1.0, source="tool:calculator")], "confident_grounded"),
        (JUMPY, [], "uncertain_unanchored"),
        (JUMPY, [UNRESOLVED], "uncertain_unanchored"),
        (JUMPY, [rewound(0.3)], "uncertain_unanchored"),  # evidence too weak to count as anchoring
        (JUMPY, [rewound(0.9)], "uncertain_grounded"),
        (JUMPY, [UNRESOLVED, rewound(0.9)], "uncertain_grounded"),
        (None, [], "not_scored"),  # a black-box API without logprobs
        ({}, [rewound(0.9)], "not_scored"),
        ({"n_tokens": 0, "p90": 0.0}, [], "not_scored"),  # an empty reply
        ({"n_tokens": 4, "mean": 1.0}, [], "not_scored"),  # neither statistic present
        ({"n_tokens": 4, "window_max": math.nan, "p90": 5.0}, [], "uncertain_unanchored"),  # NaN falls back to p90
    ],
)
def test_verdict_table(aggregates, rounds, verdict):
    result = groundedness_canary(aggregates, rounds, THRESHOLD)
    assert result["verdict"] == verdict
    assert result["verdict"] in VERDICTS
    assert isinstance(result["reason"], str) and result["reason"].endswith(".")
    assert 0.0 <= result["anchoring"] <= 1.0
    if verdict == "not_scored":
        assert result["uncertainty"] is None and result["statistic"] is None
    else:
        assert 0.0 <= result["uncertainty"] <= 1.0


def test_uncertainty_is_a_half_at_the_threshold_and_prefers_the_window_statistic():
    at = groundedness_canary({"window_max": THRESHOLD, "p90": 9.0}, [], THRESHOLD)
    assert at["uncertainty"] == 0.5 and at["statistic"] == "window_max"
    assert at["verdict"] == "confident_unanchored"  # the gate fires on `>`, so equal is not uncertain
    assert groundedness_canary({"p90": THRESHOLD + 1.0}, [], THRESHOLD)["uncertainty"] == pytest.approx(
        1 / (1 + math.exp(-1))
    )


def test_infinite_surprise_is_maximal_uncertainty():
    result = groundedness_canary({"window_max": math.inf}, [], THRESHOLD)
    assert result["uncertainty"] == 1.0 and result["verdict"] == "uncertain_unanchored"


def test_anchoring_is_the_best_accepted_evidence_with_an_observable_bonus():
    unverified = groundedness_canary(CALM, [rewound(1.0)], THRESHOLD)["anchoring"]
    verified = groundedness_canary(CALM, [rewound(1.0, observable=1.0)], THRESHOLD)["anchoring"]
    assert unverified == pytest.approx(0.8) and verified == pytest.approx(1.0)
    best = groundedness_canary(CALM, [rewound(0.4), rewound(0.9, source="web:wiki")], THRESHOLD)
    assert best["anchoring"] == pytest.approx(0.72) and "web:wiki" in best["reason"]


def test_evidence_that_was_not_injected_does_not_anchor():
    not_used = {"round": 1, "action": "resumed_unmodified", "chosen": rewound(1.0)["chosen"]}
    result = groundedness_canary(CALM, [not_used], THRESHOLD)
    assert result["anchoring"] == 0.0 and result["unresolved_rounds"] == 1
    assert "left as written" in result["reason"]


def test_odd_evidence_values_are_clamped_not_trusted():
    assert groundedness_canary(CALM, [rewound(7.0, observable=3.0)], THRESHOLD)["anchoring"] == 1.0
    assert groundedness_canary(CALM, [rewound(math.nan)], THRESHOLD)["anchoring"] == 0.0
    assert groundedness_canary(CALM, [{"action": "rewound", "chosen": {}}], THRESHOLD)["anchoring"] == 0.0


def test_accepts_convergence_records_directly():
    evidence = Evidence(claim="2+2=4", evidence="2+2 = 4", confidence=1.0, source="tool:calculator", observable=1.0)
    record = ConvergenceRecord(round=1, trigger={"token_index": 3}, chosen=evidence, action="rewound")
    result = groundedness_canary(JUMPY, [record], THRESHOLD)
    assert result["verdict"] == "uncertain_grounded" and "tool:calculator" in result["reason"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, "3.5", None, True])
def test_threshold_must_be_a_finite_number(bad):
    with pytest.raises(ConfigError, match="threshold="):
        groundedness_canary(CALM, [], bad)


surprise_bits = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False) | st.sampled_from([math.inf, 0.0, 1e308])


@given(
    low=surprise_bits,
    raise_by=st.floats(min_value=0.0, max_value=1e6, allow_nan=False) | st.just(math.inf),
    threshold=st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
    key=st.sampled_from(["window_max", "p90"]),
)
def test_higher_surprise_never_lowers_uncertainty(low, raise_by, threshold, key):
    high = low + raise_by
    u_low = groundedness_canary({key: low}, [], threshold)["uncertainty"]
    u_high = groundedness_canary({key: high}, [], threshold)["uncertainty"]
    assert 0.0 <= u_low <= u_high <= 1.0


@given(
    window_max=surprise_bits,
    p90=surprise_bits,
    bump=st.floats(min_value=0.0, max_value=100.0),
    threshold=st.floats(min_value=0.0, max_value=20.0),
)
def test_raising_any_aggregate_never_lowers_uncertainty(window_max, p90, bump, threshold):
    base = {"n_tokens": 8, "window_max": window_max, "p90": p90}
    u = groundedness_canary(base, [], threshold)["uncertainty"]
    for key in ("window_max", "p90"):
        assert groundedness_canary(base | {key: base[key] + bump}, [], threshold)["uncertainty"] >= u

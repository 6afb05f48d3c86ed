"""scripts/peer_signals.py: long-form replies are judged sentence by sentence, each method over its own sentences,
and the halves' thresholds are read from the claim sentences (the model-bound part runs in results/peers/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
spec = importlib.util.spec_from_file_location("peer_signals", SCRIPTS / "peer_signals.py")
assert spec is not None and spec.loader is not None
peer_signals = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = peer_signals  # its dataclasses look their module up by name
spec.loader.exec_module(peer_signals)

CLAIMS = [
    {"relation": "capital", "answers": ["Andorra la Vella"]},
    {"relation": "currency", "answers": ["Euro", "EUR"]},
]


def test_token_spans_follow_the_decoded_prefixes():
    assert peer_signals.token_spans([3, 3, 7, 12]) == [(0, 3), (3, 3), (3, 7), (7, 12)]
    assert peer_signals.token_spans([]) == []


def test_lowest_per_span_reads_the_tokens_overlapping_each_sentence():
    tokens = [(0, 4), (4, 9), (9, 10), (10, 15), (15, 20)]
    values = [0.9, 0.2, 0.8, 0.5, 0.7]
    # a token straddling two spans counts for both; a span no token reaches is FLARE's "no doubt"
    assert peer_signals.lowest_per_span(values, tokens, [(0, 10), (10, 20), (20, 30)]) == [0.2, 0.5, 1.0]
    assert peer_signals.lowest_per_span(values, tokens, [(8, 12)]) == [0.2]


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.integers(1, 5))
def test_lowest_per_span_is_the_minimum_of_its_tokens(values, width):
    tokens = [(i * width, (i + 1) * width) for i in range(len(values))]
    whole = (0, len(values) * width)
    assert peer_signals.lowest_per_span(values, tokens, [whole]) == [min(values)]


def test_claim_units_keep_the_sentences_stating_an_asked_claim():
    pairs = [
        ("Andorra is a small country in Europe.", 1.0),
        ("Its capital is Andorra la Vella.", 2.0),
        ("Its currency is the peseta.", 3.0),
    ]
    units = peer_signals.claim_units(pairs, CLAIMS)
    assert units == [["Its capital is Andorra la Vella.", 2.0, "right"], ["Its currency is the peseta.", 3.0, "wrong"]]


def test_labelled_reads_a_reply_or_its_claim_sentences():
    short = {"id": "a", "correct": False, "signals": {"dragin": 2.5, "seakr": None}}
    assert peer_signals.labelled(short, "dragin") == [(2.5, True)]
    assert peer_signals.labelled(short, "seakr") == []
    long = {"id": "b", "units": {"dragin": [["s1", 1.0, "right"], ["s2", 4.0, "wrong"]]}}
    assert peer_signals.labelled(long, "dragin") == [(1.0, False), (4.0, True)]
    assert peer_signals.labelled(long, "etc") == []


def _long_row(item_id: str, units: list[tuple[float, str]]) -> dict:
    return {"id": item_id, "units": {"dragin": [[f"s{i}", v, label] for i, (v, label) in enumerate(units)]}}


def test_summarise_long_form_counts_sentences_and_tunes_on_half_a():
    rows = [
        _long_row("a1", [(5.0, "wrong"), (1.0, "right")]),
        _long_row("a2", [(4.0, "wrong"), (2.0, "right"), (4.5, "right")]),
        _long_row("b1", [(6.0, "wrong"), (0.5, "right")]),
        _long_row("b2", [(3.0, "right")]),
    ]
    summary = peer_signals.summarise(rows, {"a1", "a2"})
    assert "off_accuracy" not in summary
    dragin = summary["signals"]["dragin"]
    assert (dragin["units_A"], dragin["wrong_A"], dragin["units_B"], dragin["wrong_B"]) == (5, 2, 3, 1)
    # half A: cut 5.0 fires on one wrong sentence alone (precision 1.0, recall 0.5): the highest precision
    assert dragin["threshold_from_A"] == 5.0
    assert (dragin["B_fires"], dragin["B_precision"], dragin["B_recall"]) == (1, 1.0, 1.0)
    assert dragin["auroc_B"] == 1.0
    assert dragin["auroc_A"] == pytest.approx(5 / 6, abs=1e-4)
    assert set(summary["signals"]) == {"dragin"}


def test_summarise_short_answers_is_unchanged_by_the_long_form_path():
    rows = [
        {"id": f"q{i}", "correct": bool(i % 2), "signals": {"flare": p}}
        for i, p in enumerate([0.1, 0.9, 0.2, 0.8, 0.05, 0.95, 0.3, 0.7])
    ]
    summary = peer_signals.summarise(rows, {"q0", "q1", "q2", "q3"})
    assert summary["off_accuracy"] == 0.5
    flare = summary["signals"]["flare"]
    assert flare["auroc_A"] == 1.0 and flare["auroc_B"] == 1.0  # low probability = wrong, on both halves
    assert flare["threshold_from_A"] == pytest.approx(0.2)
    # half B: 0.05 fires, 0.3 (wrong too) is above the cut
    assert (flare["B_fires"], flare["B_precision"]) == (1, 1.0)
    assert np.isclose(flare["B_recall"], 0.5)

"""Calibration: AUROC against brute force, operating-point choice, per-kind thresholds, the whole run."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.calibrate import (Labelled, auroc, calibrate, choose, fit_kind_model, kind_scores, kind_thresholds,
                                    window_peak)
from surprisegate.config import load_config


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=40))
def test_auroc_matches_brute_force(pairs):
    scores = [float(s) for s, _ in pairs]
    labels = [int(y) for _, y in pairs]
    if len(set(labels)) < 2:
        assert math.isnan(auroc(scores, labels))
    else:
        assert auroc(scores, labels) == pytest.approx(brute_auroc(scores, labels))


def test_auroc_extremes():
    assert auroc([0, 1, 2, 3], [0, 0, 1, 1]) == 1.0
    assert auroc([3, 2, 1, 0], [0, 0, 1, 1]) == 0.0


def test_choose_objectives():
    points = [
        {"precision": 0.95, "recall": 0.50}, {"precision": 0.90, "recall": 0.70},
        {"precision": 0.82, "recall": 0.85}, {"precision": 0.99, "recall": 0.30},
    ]
    assert choose(points, objective="precision") == points[0]  # recall 0.3 is below the 0.5 floor
    assert choose(points, objective="recall", min_precision=0.85) == points[1]
    assert choose(points, objective="recall", min_precision=0.8) == points[2]


def test_window_peak_needs_min_tokens():
    assert window_peak([5.0, 0.0, 0.0], 4, "mean", 1) == 5.0
    assert window_peak([5.0, 0.0, 0.0], 4, "mean", 3) == pytest.approx(5 / 3)
    assert window_peak([5.0], 4, "mean", 4) == 0.0  # never eligible: could not have fired


def test_kind_thresholds_are_equivalent_to_the_score_cut():
    rng = np.random.default_rng(1)
    kinds = ["capital"] * 40 + ["currency"] * 40 + ["rare"] * 3
    peaks = rng.normal(2.0, 1.0, len(kinds))
    labels = (rng.random(len(kinds)) < 0.6).astype(int)
    model = fit_kind_model(peaks, labels, kinds)
    assert "rare" not in model  # too few replies: falls back to the global parameters
    cut, beta = 0.3, 1.5
    glob, per_kind = kind_thresholds(model, beta, cut)
    scores = kind_scores(peaks, kinds, model, beta)
    for peak, kind, score in zip(peaks, kinds, scores):
        threshold = per_kind.get(kind, glob)
        assert (score > cut) == (peak > threshold + 1e-9) or abs(peak - threshold) < 1e-3


def synthetic_labels(tmp_path, n=240, seed=0):
    """Replies whose entropy separates right from wrong, within two kinds of question of different difficulty."""
    rng = np.random.default_rng(seed)
    out = tmp_path / "labels"
    out.mkdir()
    with open(out / "labels.jsonl", "w") as fh:
        for i in range(n):
            hard = i % 2 == 0
            correct = bool(rng.random() < (0.2 if hard else 0.7))
            level = 1.0 if correct else 3.0
            k = 6
            rec = {"id": f"q{i}", "question": "What is the capital of X?" if hard else "What is the currency of X?",
                   "format": "qa", "category": "entity", "correct": correct, "answers": ["x"], "reply": "r",
                   "pieces": [f" w{j}" for j in range(k)], "surprises": list(rng.normal(level, 0.8, k)),
                   "entropies": list(rng.normal(level, 0.8, k))}
            fh.write(json.dumps(rec) + "\n")
    return out


def test_calibrate_writes_a_loadable_config_report_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    labels = synthetic_labels(tmp_path)
    report = calibrate([labels], tmp_path / "out" / "config.toml", bootstrap=50)
    config = load_config(tmp_path / "out" / "config.toml", env={})
    assert report["best"]["auroc"] > 0.8
    assert config.signal == report["chosen"]["signal"] and config.window == report["chosen"]["window"]
    assert report["chosen"]["precision"] >= 0.8 and report["chosen"]["recall"] >= 0.5
    for plot in report["plots"]:
        with open(plot, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "out" / "calibration.json").read_text())
    assert saved["n"] == 240 and saved["best_plain_surprise"]["signal"] == "surprise"
    # The default rule is the issue's: the highest intervention precision at recall >= 0.5.
    assert report["objective"] == "precision"
    assert report["per_kind"]["chosen"] == report["per_kind"]["highest_precision_point"]


def test_prepare_skips_copied_tokens_for_novel_signals():
    from surprisegate.calibrate import prepare

    [item] = prepare([{"id": "a", "question": "What is the capital of Chad?", "correct": False,
                       "pieces": ["The", " capital", " is", " Ko"], "surprises": [1.0, 1.0, 1.0, 5.0],
                       "entropies": [1.0, 1.0, 1.0, 4.0]}])
    assert isinstance(item, Labelled)
    assert item.sequences["novel"] == [5.0] and item.sequences["surprise"] == [1.0, 1.0, 1.0, 5.0]
    assert item.kind == "capital"

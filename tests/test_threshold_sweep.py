"""Calibration: AUROC against brute force, operating-point choice, per-kind thresholds, the whole run."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.config import load_config
from surprisegate.research.threshold_sweep import (
    Labelled,
    auroc,
    calibrate,
    choose,
    fit_kind_model,
    kind_scores,
    kind_thresholds,
    window_peak,
)


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
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
        {"precision": 0.95, "recall": 0.50},
        {"precision": 0.90, "recall": 0.70},
        {"precision": 0.82, "recall": 0.85},
        {"precision": 0.99, "recall": 0.30},
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
    for peak, kind, score in zip(peaks, kinds, scores, strict=True):
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
            rec = {
                "id": f"q{i}",
                "question": "What is the capital of X?" if hard else "What is the currency of X?",
                "format": "qa",
                "category": "entity",
                "correct": correct,
                "answers": ["x"],
                "reply": "r",
                "pieces": [f" w{j}" for j in range(k)],
                "surprises": list(rng.normal(level, 0.8, k)),
                "entropies": list(rng.normal(level, 0.8, k)),
            }
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
    from surprisegate.research.threshold_sweep import prepare

    [item] = prepare(
        [
            {
                "id": "a",
                "question": "What is the capital of Chad?",
                "correct": False,
                "pieces": ["The", " capital", " is", " Ko"],
                "surprises": [1.0, 1.0, 1.0, 5.0],
                "entropies": [1.0, 1.0, 1.0, 4.0],
            }
        ]
    )
    assert isinstance(item, Labelled)
    assert item.sequences["novel"] == [5.0] and item.sequences["surprise"] == [1.0, 1.0, 1.0, 5.0]
    assert item.kind == "capital"


# ------------------------------------------------------------------------------------------------
# --top-k: signals from the top K logprobs only
# ------------------------------------------------------------------------------------------------
def synthetic_topk_labels(tmp_path, n=160, seed=0, vocab=300, keep=20, name="topk"):
    """Replies from random logits: wrong replies come from flatter distributions; rows keep the top `keep`."""
    from surprisegate.gate.surprise import surprise_and_entropy, top_logprobs

    rng = np.random.default_rng(seed)
    out = tmp_path / name
    out.mkdir()
    with open(out / "labels.jsonl", "w") as fh:
        for i in range(n):
            hard = i % 2 == 0
            correct = bool(rng.random() < (0.2 if hard else 0.7))
            scale = 4.0 if correct else 1.5  # peaked logits: low entropy
            surprises, entropies, top = [], [], []
            for _ in range(6):
                logits = rng.normal(0, scale, vocab)
                token = int(logits.argmax())
                s, h = surprise_and_entropy(logits, token)
                surprises.append(round(s, 4))
                entropies.append(round(h, 4))
                top.append([[t, round(lp, 4)] for t, lp in top_logprobs(logits, keep)])
            rec = {
                "id": f"q{i}",
                "question": "What is the capital of X?" if hard else "What is the currency of X?",
                "format": "qa",
                "category": "entity",
                "correct": correct,
                "answers": ["x"],
                "reply": "r",
                "pieces": [f" w{j}" for j in range(6)],
                "surprises": surprises,
                "entropies": entropies,
                "top_logprobs": top,
                "vocab_size": vocab,
            }
            fh.write(json.dumps(rec) + "\n")
    return out


def test_prepare_top_k_estimates_entropy_and_keeps_surprise_exact(tmp_path):
    from surprisegate.gate.surprise import topk_entropy
    from surprisegate.research.threshold_sweep import prepare

    labels = synthetic_topk_labels(tmp_path, n=4)
    records = [json.loads(line) for line in open(labels / "labels.jsonl")]
    full = prepare(records)
    for k in (20, 5, 1):
        items = prepare(records, top_k=k)
        for item, plain, r in zip(items, full, records, strict=True):
            assert item.sequences["surprise"] == plain.sequences["surprise"] == r["surprises"]
            assert item.sequences["entropy"] == [topk_entropy(t[:k], r["vocab_size"]) for t in r["top_logprobs"]]
    est = np.array([v for it in prepare(records, top_k=20) for v in it.sequences["entropy"]])
    exact = np.array([v for it in full for v in it.sequences["entropy"]])
    assert (
        np.abs(est - exact).mean()
        < np.abs(np.array([v for it in prepare(records, top_k=1) for v in it.sequences["entropy"]]) - exact).mean()
    )


def test_calibrate_top_k_runs_on_estimated_entropy(tmp_path):
    pytest.importorskip("matplotlib")
    labels = synthetic_topk_labels(tmp_path)
    report = calibrate([labels], tmp_path / "out" / "config.toml", bootstrap=20, top_k=8)
    assert report["top_k"] == 8 and report["best"]["auroc"] > 0.8
    assert "top 8 logprobs" in (tmp_path / "out" / "config.toml").read_text()
    assert json.loads((tmp_path / "out" / "calibration.json").read_text())["top_k"] == 8
    load_config(tmp_path / "out" / "config.toml", env={})


def test_top_k_on_labels_without_top_logprobs_names_the_folder_and_the_fix(tmp_path):
    from surprisegate.errors import InputError

    old = synthetic_labels(tmp_path, n=10)  # labelled before `label` kept the top logprobs
    with pytest.raises(InputError, match=r"--labels=.*labels'.* has no top-k logprobs.*re-run `surprisegate label"):
        calibrate([old], tmp_path / "out" / "config.toml", bootstrap=5, top_k=20)
    few = synthetic_topk_labels(tmp_path, n=4, keep=5, name="few")
    with pytest.raises(InputError, match=r"--top-k=8 but --labels=.*few.* kept only 5 logprobs.*--top-k 5 or less"):
        calibrate([few], tmp_path / "out" / "config.toml", bootstrap=5, top_k=8)
    for bad in (0, 21, True, 2.5):
        with pytest.raises(InputError, match=rf"--top-k={bad!r} must be a whole number from 1 to 20"):
            calibrate([few], tmp_path / "out" / "config.toml", top_k=bad)


def test_calibrate_cli_top_k_errors_cleanly(tmp_path):
    from click.testing import CliRunner

    from surprisegate.cli import main

    old = synthetic_labels(tmp_path, n=10)
    result = CliRunner().invoke(
        main, ["calibrate", "--labels", str(old), "--out", str(tmp_path / "c.toml"), "--top-k", "20"]
    )
    assert result.exit_code == 2 and "re-run `surprisegate label" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(
        main, ["calibrate", "--labels", str(old), "--out", str(tmp_path / "c.json"), "--compare-top-k", "20,x"]
    )
    assert result.exit_code == 2 and "--compare-top-k='20,x' is not a comma list" in result.output


def test_compare_top_k_writes_json_and_markdown(tmp_path):
    from click.testing import CliRunner

    from surprisegate.cli import main

    a = synthetic_topk_labels(tmp_path, n=120, seed=1, name="a")
    b = synthetic_topk_labels(tmp_path, n=120, seed=2, name="b")
    out = tmp_path / "cmp" / "topk.json"
    result = CliRunner().invoke(
        main,
        [
            "calibrate",
            "--labels",
            str(a),
            "--labels",
            str(b),
            "--out",
            str(out),
            "--compare-top-k",
            "20,5",
            "--bootstrap",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert [r["top_k"] for r in summary["rows"]] == [None, 20, 5]
    assert summary["rule"] == {"signal": "entropy", "statistic": "mean", "window": 4, "min_tokens": 4}
    full, top20, top5 = summary["rows"]
    assert full["n"] == top20["n"] == 240 and full["estimate"] is None
    assert top20["estimate"]["within_bounds"] == 1.0 and top5["estimate"]["within_bounds"] == 1.0
    assert top20["estimate"]["mean_abs_error_bits"] < top5["estimate"]["mean_abs_error_bits"]
    for row in summary["rows"]:
        assert 0.5 < row["per_kind_auroc_cv"] <= 1 and row["per_kind_ci"][0] <= row["per_kind_ci"][1]
    md = out.with_suffix(".md").read_text()
    assert "| top-20 logprobs (estimate) |" in md and "| full distribution | exact |" in md
    assert md.strip() in result.output


# ------------------------------------------------------------------------------------------------
# the packaged calibration set and `calibrate --backend`
# ------------------------------------------------------------------------------------------------
def packaged_set() -> list[dict]:
    from importlib.resources import files

    text = (files("surprisegate") / "data" / "calibration_set.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_packaged_set_loads_graded_items_with_their_licences():
    from surprisegate import model_calibrations
    from surprisegate.research.labeling import read_items

    items = packaged_set()
    assert len(items) == 400 and len({it["id"] for it in items}) == 400
    assert all(it["answers"] and it["question"] and it["meta"]["license"] for it in items)
    shares = {
        prefix: sum(it["id"].startswith(prefix) for it in items) for prefix in ("fact-", "bb-qa_wikidata", "bb-arith")
    }
    assert shares["fact-"] == 210 and shares["bb-qa_wikidata"] == 165
    with model_calibrations.calibration_set() as path:
        assert [it["id"] for it in read_items(path)] == [it["id"] for it in items]


def test_the_packaged_set_leaves_out_the_eval_sample(shared_data):
    import random

    from surprisegate.research.labeling import read_items

    # research/evaluate.py: `eval --sample 100` is random.Random(0).sample(items, 100).
    held_out = {it["id"] for it in random.Random(0).sample(read_items(shared_data / "factqa_dev.jsonl"), 100)}
    assert len(held_out) == 100 and not held_out & {it["id"] for it in packaged_set()}
    committed = Path(__file__).resolve().parents[1] / "results" / "eval" / "factqa_dev" / "results.jsonl"
    if committed.is_file():  # the committed A/B's own items
        assert {json.loads(line)["id"] for line in committed.open()} == held_out


def test_the_selection_script_reproduces_the_packaged_set(shared_data):
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "calibration_set.py"
    spec = importlib.util.spec_from_file_location("calibration_set", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.select(shared_data) == packaged_set()


def test_the_probe_questions_are_other_fact_questions_the_script_picks(shared_data):
    import importlib.util
    import random
    from importlib.resources import files

    from surprisegate import model_calibrations
    from surprisegate.research.labeling import read_items

    text = (files("surprisegate") / "data" / "probe_questions.jsonl").read_text(encoding="utf-8")
    extra = [json.loads(line) for line in text.splitlines() if line.strip()]
    ids = {it["id"] for it in extra}
    assert len(extra) == len(ids) == 400 and all(it["id"].startswith("fact-") and it["meta"]["license"] for it in extra)
    held_out = {it["id"] for it in random.Random(0).sample(read_items(shared_data / "factqa_dev.jsonl"), 100)}
    assert not ids & held_out and not ids & {it["id"] for it in packaged_set()}
    with model_calibrations.probe_questions() as path:
        assert [it["id"] for it in read_items(path)] == [it["id"] for it in extra]
    script = Path(__file__).resolve().parents[1] / "scripts" / "calibration_set.py"
    spec = importlib.util.spec_from_file_location("calibration_set", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.select_probe_questions(shared_data, module.select(shared_data)) == extra


def scripted_model(items: list[dict]):
    """A scripted backend that answers a third of the set's items right, confidently, and the rest wrong at low
    probability (high surprise and entropy): plan entries are bytes, as the backend indexes them."""
    import zlib

    from scripted import ScriptedBackend

    def script(context: str):
        item = max((it for it in items if it["question"] in context), key=lambda it: len(it["question"]))
        right = zlib.crc32(item["id"].encode()) % 3 == 0
        prefix = item["question"] if item.get("format") == "cloze" else ""
        reply = f" {item['answers'][0]}." if right else " Nowhere."
        return [(chr(b), 0.95) for b in prefix.encode()] + [(chr(b), 0.95 if right else 0.05) for b in reply.encode()]

    return ScriptedBackend(script)


def test_calibrate_refuses_a_set_with_too_few_right_or_wrong_replies(tmp_path):
    from surprisegate.errors import InputError

    labels = synthetic_labels(tmp_path, n=40)
    # Six replies cannot hold five right and five wrong.
    with pytest.raises(InputError, match=r"6 labelled replies hold \d+ right and \d+ wrong: too few.*--limit"):
        calibrate([labels], tmp_path / "out" / "config.toml", bootstrap=5, only={f"q{i}" for i in range(6)})

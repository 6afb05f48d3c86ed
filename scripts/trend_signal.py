"""ETC's entropy trend as the gate's window signal (issue 43, "what the gate should learn from them").

ETC (pkuserc/ETC) fires on the second difference of word entropies, smoothed (their Mt). The loop sees
tokens, not spaCy's words, so the trend here is theirs over the reply's tokens: `etc._differences` with no
function words, then `etc._smoothed`, the functions tests/test_peers.py pins to their code; "abs" is its
magnitude. On each model's calibration labels (the replies `calibrate` fits on) the shipped rule and the
best trend rule by half-A cross-validated AUROC (signal x statistic x window, per-kind normalisation fitted
on half A, as rule_choice fits every challenger) are scored on half B, with the share of paired resamples
of half B in which the trend rule's AUROC is higher (rule_choice's bar is 90%).

    .venv/bin/python scripts/trend_signal.py results/calibration_rule_choice/smollm2_labels.jsonl \\
        results/second_model/calibration/labels.jsonl --out results/peers/gate_ideas/trend_signal.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from surprisegate.research.peers.etc import _differences, _smoothed
from surprisegate.research.probe_fit import halves
from surprisegate.research.rule_choice import (
    MODEL_KIND_MIN_ITEMS,
    MODEL_RULE,
    _wrong,
    fit_on_a_score_b,
    paired_win_rate,
    rule_name,
)
from surprisegate.research.threshold_sweep import STATISTICS, WINDOWS, auroc, prepare


def token_trend(entropies: list[float]) -> list[float]:
    """ETC's smoothed second difference over tokens (no function words: the loop has no parser)."""
    _, s2 = _differences(np.asarray(entropies, dtype=np.float64), set())
    return _smoothed(s2)


def with_trend(items):
    for it in items:
        trend = token_trend(it.sequences["entropy"])
        it.sequences["entropy_trend"] = trend
        it.sequences["entropy_trend_abs"] = [abs(v) for v in trend]
    return items


def judge(path: Path) -> dict:
    items = with_trend(prepare(json.loads(line) for line in path.read_text().splitlines() if line.strip()))
    in_a = halves([it.id for it in items], 0)
    a = [it for it in items if it.id in in_a]
    b = [it for it in items if it.id not in in_a]
    wrong_b = _wrong(b)
    shipped_cv, shipped_b = fit_on_a_score_b(a, b, MODEL_RULE, MODEL_KIND_MIN_ITEMS)
    trend_rules = [
        {"signal": signal, "statistic": statistic, "window": window, "min_tokens": min(4, window)}
        for signal, statistic, window in itertools.product(
            ("entropy_trend", "entropy_trend_abs"), STATISTICS, (1, 2, *WINDOWS)
        )
    ]
    fitted = [(rule, *fit_on_a_score_b(a, b, rule, MODEL_KIND_MIN_ITEMS)) for rule in trend_rules]
    best_rule, best_cv, best_b = max(fitted, key=lambda t: t[1])
    return {
        "labels": str(path),
        "half_a": len(a),
        "half_b": len(b),
        "shipped": {
            "rule": rule_name(MODEL_RULE),
            "auroc_cv_a": round(shipped_cv, 4),
            "auroc_b": round(auroc(shipped_b, wrong_b), 4),
        },
        "best_trend": {
            "rule": rule_name(best_rule),
            "auroc_cv_a": round(best_cv, 4),
            "auroc_b": round(auroc(best_b, wrong_b), 4),
        },
        "trend_wins_b": round(paired_win_rate(best_b, shipped_b, wrong_b), 3),
        "trend_rules": [
            {"rule": rule_name(rule), "auroc_cv_a": round(cv, 4), "auroc_b": round(auroc(scores, wrong_b), 4)}
            for rule, cv, scores in sorted(fitted, key=lambda t: -t[1])
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", nargs="+", type=Path, help="label JSONL files (one per model)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    report = [judge(path) for path in args.labels]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for r in report:
        s, t = r["shipped"], r["best_trend"]
        print(
            f"{r['labels']}: shipped {s['rule']} CV {s['auroc_cv_a']} / B {s['auroc_b']}; "
            f"best trend {t['rule']} CV {t['auroc_cv_a']} / B {t['auroc_b']}; "
            f"trend ahead on B in {r['trend_wins_b']:.0%}"
        )


if __name__ == "__main__":
    main()

"""`surprisegate calibrate`: how well does each signal separate right from wrong replies, and where to set
the trigger.

Positives are WRONG replies (what an intervention should catch). For every signal (surprise, entropy,
novel, novel_entropy) we report reply-level AUROC with a bootstrap CI for the aggregates (mean, p90,
max, tail mass) and for the highest rolling statistic (mean / p90 / max over W tokens). Then we sweep
signal × statistic × W × threshold for the online trigger (fires when an eligible window crosses the
threshold) and choose the point with the highest intervention precision at recall >= 0.5. Plain windowed
surprise stays reported as the baseline.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .config import Config, to_toml
from .errors import InputError
from .labeling import CLOZE_INSTRUCTION, iter_labels
from .signals import SIGNALS, copy_flags, question_kind, signal_value
from .surprise import RollingWindow

WINDOWS = (4, 8, 16, 32)
STATISTICS = ("mean", "p90", "max")
MIN_RECALL = 0.5
MIN_PRECISION = 0.90  # "recall" objective: catch the most wrong replies while 90% of triggers are on wrong ones
OBJECTIVES = ("recall", "precision")


# ------------------------------------------------------------------------------------------------
# pure metrics
# ------------------------------------------------------------------------------------------------
def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Probability a random positive scores above a random negative (ties count half). NaN if one class."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = _average_ranks(s)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i: j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def bootstrap_auroc(scores, labels, n: int = 500, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the AUROC."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        idx = rng.integers(0, len(s), len(s))
        a = auroc(s[idx], y[idx])
        if not math.isnan(a):
            values.append(a)
    if not values:
        return math.nan, math.nan
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate, thresholds), thresholds descending."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    thresholds = np.unique(s)[::-1]
    tpr = np.array([((s >= t) & (y == 1)).sum() for t in thresholds]) / max(1, y.sum())
    fpr = np.array([((s >= t) & (y == 0)).sum() for t in thresholds]) / max(1, (y == 0).sum())
    return np.concatenate([[0.0], fpr]), np.concatenate([[0.0], tpr]), thresholds


def precision_recall(fired: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    tp = int((fired & (labels == 1)).sum())
    precision = tp / int(fired.sum()) if fired.any() else math.nan
    recall = tp / int(labels.sum()) if labels.any() else math.nan
    return precision, recall


# ------------------------------------------------------------------------------------------------
# features from labels
# ------------------------------------------------------------------------------------------------
@dataclass
class Labelled:
    id: str
    correct: bool
    category: str
    sequences: dict[str, list[float]]  # signal -> per-token values (novel signals: copied tokens skipped)
    kind: str = ""  # question_kind of the question as the model saw it


def prepare(records: Iterable[dict]) -> list[Labelled]:
    out = []
    for r in records:
        if "surprises" not in r or not isinstance(r.get("correct"), bool):
            continue
        context = r["question"] + (" " + r["question"] if r.get("format") == "cloze" else "")
        flags = copy_flags(r.get("pieces") or [""] * len(r["surprises"]), context)
        entropies = r.get("entropies") or [math.nan] * len(r["surprises"])
        seqs = {}
        for sig in SIGNALS:
            values = (signal_value(sig, s, h, c) for s, h, c in zip(r["surprises"], entropies, flags))
            seqs[sig] = [v for v in values if v is not None]  # novel signals skip copied tokens
        question = CLOZE_INSTRUCTION.format(question=r["question"]) if r.get("format") == "cloze" else r["question"]
        out.append(Labelled(r["id"], r["correct"], r.get("category") or "", seqs, question_kind(question)))
    if not out:
        raise InputError("no usable labelled replies found; run `surprisegate label` first")
    return out


def reply_aggregates(values: list[float], tail_cut: float = 4.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p90": 0.0, "max": 0.0, "tail_mass": 0.0}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p90": float(np.percentile(a, 90)), "max": float(a.max()),
            "tail_mass": float((a > tail_cut).mean())}


def window_peak(values: list[float], window: int, statistic: str, min_tokens: int) -> float:
    """Highest rolling statistic over windows holding at least min(min_tokens, window) tokens."""
    w = RollingWindow(window, statistic)
    need = min(min_tokens, window)
    peak = -math.inf
    for v in values:
        stat = w.push(v)
        if len(w) >= need:
            peak = max(peak, stat)
    if peak == -math.inf:  # never eligible (too few values): the trigger could not have fired
        return 0.0
    return peak


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------
def signal_table(items: list[Labelled], bootstrap: int = 500, min_tokens: int = 4) -> list[dict]:
    """AUROC (95% CI) of every signal × feature, best first."""
    labels = np.array([0 if it.correct else 1 for it in items])
    rows = []
    for sig in SIGNALS:
        if any(math.isnan(v) for it in items for v in it.sequences[sig][:1]):
            continue  # entropies missing in old labels
        feats: dict[str, list[float]] = {}
        for it in items:
            agg = reply_aggregates(it.sequences[sig])
            for k, v in agg.items():
                feats.setdefault(k, []).append(v)
            for stat, w in itertools.product(STATISTICS, WINDOWS):
                feats.setdefault(f"window_{stat}_{w}", []).append(window_peak(it.sequences[sig], w, stat, min_tokens))
        for name, scores in feats.items():
            lo, hi = bootstrap_auroc(scores, labels, n=bootstrap)
            rows.append({"signal": sig, "feature": name, "auroc": auroc(scores, labels), "ci_low": lo, "ci_high": hi})
    rows.sort(key=lambda r: -r["auroc"])
    return rows


def sweep(items: list[Labelled], signals=SIGNALS, windows=WINDOWS, statistics=STATISTICS,
          min_tokens_options=(1, 4), n_thresholds: int = 60) -> list[dict]:
    """Every online trigger rule with its intervention precision and recall (positives: wrong replies)."""
    labels = np.array([0 if it.correct else 1 for it in items])
    points = []
    for sig, stat, w, mt in itertools.product(signals, statistics, windows, min_tokens_options):
        if mt > w:
            continue
        peaks = np.array([window_peak(it.sequences[sig], w, stat, mt) for it in items])
        if np.isnan(peaks).any():
            continue
        for t in np.unique(np.quantile(peaks, np.linspace(0.02, 0.98, n_thresholds))):
            fired = peaks > t
            precision, recall = precision_recall(fired, labels)
            points.append({"signal": sig, "statistic": stat, "window": w, "min_tokens": mt,
                           "threshold": round(float(t), 4), "precision": precision, "recall": recall,
                           "trigger_rate": float(fired.mean())})
    return points


def choose(points: list[dict], min_recall: float = MIN_RECALL, objective: str = "precision",
           min_precision: float = MIN_PRECISION) -> dict:
    """objective "precision": highest precision at recall >= min_recall (ties: higher recall).
    objective "recall": highest recall at precision >= min_precision and recall >= min_recall; when no
    point reaches min_precision, falls back to the "precision" rule.
    """
    eligible = [p for p in points if p["recall"] >= min_recall and not math.isnan(p["precision"])]
    if not eligible:
        raise InputError(f"no trigger reaches recall >= {min_recall}; label more items")
    if objective == "recall":
        precise = [p for p in eligible if p["precision"] >= min_precision]
        if precise:
            return max(precise, key=lambda p: (round(p["recall"], 4), p["precision"]))
    return max(eligible, key=lambda p: (round(p["precision"], 4), p["recall"]))


# ------------------------------------------------------------------------------------------------
# per-kind normalisation: the model is right far more often on some kinds of question than others
# ------------------------------------------------------------------------------------------------
MIN_KIND_ITEMS = 15  # kinds with fewer labelled replies use the global parameters
BETAS = (0.5, 1.0, 1.5, 2.0, 3.0)


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


def fit_kind_model(peaks: np.ndarray, labels: np.ndarray, kinds: list[str]) -> dict:
    """Per-kind (prior wrong-rate, mean, spread) of the window peak, shrunk toward the global values."""
    glob_p = float(labels.mean())
    glob_mu, glob_sd = float(peaks.mean()), float(peaks.std()) + 1e-6
    model = {"_global": (glob_p, glob_mu, glob_sd)}
    for k in set(kinds):
        idx = np.array([kk == k for kk in kinds])
        n = int(idx.sum())
        if n < MIN_KIND_ITEMS:
            continue
        prior = (labels[idx].sum() + 2 * glob_p) / (n + 2)  # two pseudo-counts of the global rate
        mu = float(peaks[idx].mean())
        sd = float(peaks[idx].std()) + 0.25 * glob_sd  # a floor: small kinds must not get razor-thin spreads
        model[k] = (float(prior), mu, sd)
    return model


def kind_scores(peaks: np.ndarray, kinds: list[str], model: dict, beta: float) -> np.ndarray:
    out = np.empty(len(peaks))
    for i, (x, k) in enumerate(zip(peaks, kinds)):
        prior, mu, sd = model.get(k, model["_global"])
        out[i] = _logit(prior) + beta * (x - mu) / sd
    return out


def cross_validated_scores(peaks, labels, kinds, beta, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Scores of each reply from a model fitted without it (so the AUROC is not flattered by overfitting)."""
    fold = np.random.default_rng(seed).integers(0, folds, len(peaks))
    out = np.empty(len(peaks))
    for f in range(folds):
        train, test = fold != f, fold == f
        model = fit_kind_model(peaks[train], labels[train], [k for k, t in zip(kinds, train) if t])
        out[test] = kind_scores(peaks[test], [k for k, t in zip(kinds, test) if t], model, beta)
    return out


def kind_thresholds(model: dict, beta: float, cut: float) -> tuple[float, dict[str, float]]:
    """Turn the score cut into a threshold in bits per kind: score > cut  <=>  peak > threshold_k."""
    def threshold(prior, mu, sd):
        return mu + sd * (cut - _logit(prior)) / beta

    glob = threshold(*model["_global"])
    return glob, {k: round(threshold(*v), 4) for k, v in model.items() if k != "_global"}


def calibrate_kinds(items: list[Labelled], rules: list[dict], objective: str = "precision",
                    min_precision: float = MIN_PRECISION) -> dict:
    """Best (rule, beta) by cross-validated AUROC; the operating point on those honest scores."""
    labels = np.array([0 if it.correct else 1 for it in items])
    kinds = [it.kind for it in items]
    best = None
    for rule in rules:
        peaks = np.array([window_peak(it.sequences[rule["signal"]], rule["window"], rule["statistic"],
                                      rule["min_tokens"]) for it in items])
        for beta in BETAS:
            scores = cross_validated_scores(peaks, labels, kinds, beta)
            a = auroc(scores, labels)
            if best is None or a > best["auroc"]:
                best = {"rule": rule, "beta": beta, "auroc": a, "scores": scores, "peaks": peaks}
    scores = best["scores"]
    points = []
    for cut in np.unique(np.quantile(scores, np.linspace(0.02, 0.98, 80))):
        precision, recall = precision_recall(scores > cut, labels)
        points.append({"cut": float(cut), "precision": precision, "recall": recall,
                       "trigger_rate": float((scores > cut).mean())})
    chosen = choose(points, objective=objective, min_precision=min_precision)
    highest_precision = choose(points, objective="precision")
    model = fit_kind_model(best["peaks"], labels, kinds)
    glob, per_kind = kind_thresholds(model, best["beta"], chosen["cut"])
    lo, hi = bootstrap_auroc(scores, labels)
    return {"rule": best["rule"], "beta": best["beta"], "auroc_cv": best["auroc"], "ci_low": lo, "ci_high": hi,
            "chosen": chosen,
        "objective": objective,
        "min_precision": min_precision, "highest_precision_point": highest_precision, "threshold": round(glob, 4), "kind_thresholds": per_kind,
            "kinds": {k: {"prior_wrong": round(v[0], 3), "mean": round(v[1], 3), "sd": round(v[2], 3)}
                      for k, v in model.items()}, "scores": scores}


def plot_curves(items: list[Labelled], chosen: dict, baseline: dict, out_dir: Path,
                kind_scores: np.ndarray | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = np.array([0 if it.correct else 1 for it in items])
    curves = {}
    for name, p in (("chosen", chosen), ("baseline", baseline)):
        if name == "chosen" and kind_scores is not None:
            curves[f"chosen: {p['signal']} {p['statistic']} W={p['window']} + per-kind (cross-validated)"] = list(kind_scores)
            continue
        scores = [window_peak(it.sequences[p["signal"]], p["window"], p["statistic"], p["min_tokens"]) for it in items]
        curves[f"{name}: {p['signal']} {p['statistic']} W={p['window']}"] = scores
    paths = []
    fig, ax = plt.subplots(figsize=(5, 5))
    for label, scores in curves.items():
        fpr, tpr, _ = roc_curve(scores, labels)
        ax.plot(fpr, tpr, label=f"{label} (AUROC {auroc(scores, labels):.2f})")
    ax.plot([0, 1], [0, 1], ":", color="grey")
    ax.set_xlabel("false positive rate (right replies flagged)")
    ax.set_ylabel("true positive rate (wrong replies flagged)")
    ax.set_title("ROC: reply is wrong")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    paths.append(str(out_dir / "roc.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 5))
    for label, scores in curves.items():
        s = np.asarray(scores)
        ts = np.unique(s)
        pr = [precision_recall(s > t, labels) for t in ts]
        ax.plot([r for _, r in pr], [p for p, _ in pr], label=label)
    ax.axvline(MIN_RECALL, ls=":", color="grey")
    ax.axhline(labels.mean(), ls="--", color="grey", label=f"base rate of wrong replies {labels.mean():.2f}")
    ax.scatter([chosen["recall"]], [chosen["precision"]], color="red", zorder=3, label="chosen operating point")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall (wrong replies the trigger catches)")
    ax.set_ylabel("intervention precision (triggers on wrong replies)")
    ax.set_title("Precision-recall of the trigger")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    paths.append(str(out_dir / "pr.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def calibrate(label_dirs: list[str | Path], out_config: str | Path, base: Config | None = None,
              bootstrap: int = 500, objective: str = "precision", min_precision: float = MIN_PRECISION,
              progress: Callable[[str], None] = lambda m: None) -> dict:
    """Compute the report, write the chosen operating point into a TOML config, and plots beside it."""
    items = prepare(iter_labels(label_dirs))
    progress(f"{len(items)} labelled replies, {sum(not it.correct for it in items)} wrong")
    table = signal_table(items, bootstrap=bootstrap)
    progress("swept AUROC; sweeping trigger rules ...")
    points = sweep(items)
    chosen = choose(points, objective=objective, min_precision=min_precision)
    baseline_points = [p for p in points if p["signal"] == "surprise" and p["statistic"] == "mean"]
    baseline = choose(baseline_points)
    # Per-kind normalisation over the strongest few window rules (ranked by plain AUROC of their peak).
    rules = []
    for row in table:
        if row["feature"].startswith("window_"):
            _, stat, w = row["feature"].split("_")
            for mt in (1, 4):
                if mt <= int(w):
                    rules.append({"signal": row["signal"], "statistic": stat, "window": int(w), "min_tokens": mt})
        if len(rules) >= 8:
            break
    progress("fitting per-kind normalisation ...")
    kinds = calibrate_kinds(items, rules, objective=objective, min_precision=min_precision)
    base = base or Config()
    # Per-kind normalisation is used when it separates better (cross-validated) than the best plain signal.
    use_kinds = kinds["auroc_cv"] > table[0]["auroc"]
    if use_kinds:
        rule = kinds["rule"]
        config = base.replace(signal=rule["signal"], statistic=rule["statistic"], window=rule["window"],
                              min_tokens=rule["min_tokens"], threshold=kinds["threshold"],
                              kind_thresholds=kinds["kind_thresholds"])
        chosen = {**rule, "threshold": kinds["threshold"], "precision": kinds["chosen"]["precision"],
                  "recall": kinds["chosen"]["recall"], "trigger_rate": kinds["chosen"]["trigger_rate"],
                  "per_kind": True, "beta": kinds["beta"]}
    else:
        config = base.replace(signal=chosen["signal"], statistic=chosen["statistic"], window=chosen["window"],
                              min_tokens=chosen["min_tokens"], threshold=chosen["threshold"], kind_thresholds={})
    out = Path(out_config)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# written by surprisegate calibrate from {len(items)} labelled replies\n"
              f"# chosen: precision {chosen['precision']:.3f} at recall {chosen['recall']:.3f} "
              f"(trigger rate {chosen['trigger_rate']:.3f})\n")
    out.write_text(header + to_toml(config))
    plots = plot_curves(items, chosen, baseline, out.parent, kind_scores=kinds["scores"] if use_kinds else None)
    best_plain = next(r for r in table if r["signal"] == "surprise")
    kinds_report = {k: v for k, v in kinds.items() if k != "scores"}
    report = {
        "n": len(items),
        "wrong": int(sum(not it.correct for it in items)),
        "best": ({"signal": f"{kinds['rule']['signal']} {kinds['rule']['statistic']} W={kinds['rule']['window']} "
                           f"+ per-kind normalisation", "feature": "cross-validated score", "auroc": kinds["auroc_cv"],
                           "ci_low": kinds["ci_low"], "ci_high": kinds["ci_high"]}
                 if kinds["auroc_cv"] > table[0]["auroc"] else table[0]),
        "per_kind": kinds_report,
        "best_plain_surprise": best_plain,
        "chosen": chosen,
        "objective": objective,
        "min_precision": min_precision,
        "baseline_surprise_mean": baseline,
        "config": str(out),
        "plots": plots,
        "auroc_table": table,
    }
    (out.parent / "calibration.json").write_text(json.dumps(report, indent=2))
    return report

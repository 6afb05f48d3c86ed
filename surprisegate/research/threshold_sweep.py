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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..config import Config, to_toml
from ..errors import InputError
from ..gate.signals import SIGNALS, copy_flags, question_kind, signal_value
from ..gate.surprise import (
    topk_entropy,
    topk_entropy_bounds,
    window_peak,  # the loop's own rule: calibration thresholds what the loop compares
)
from .labeling import CLOZE_INSTRUCTION, iter_labels

WINDOWS = (4, 8, 16, 32)
STATISTICS = ("mean", "p90", "max")
MIN_RECALL = 0.5
MIN_PRECISION = 0.90  # "recall" objective: catch the most wrong replies while 90% of triggers are on wrong ones
MAX_TOP_K = 20  # labels keep the top 20 logprobs (labeling.LABEL_TOP_LOGPROBS), the most a server sends
OBJECTIVES = ("recall", "precision")


# ------------------------------------------------------------------------------------------------
# pure metrics
# ------------------------------------------------------------------------------------------------
def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
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
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
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


def check_top_k(top_k: int | None) -> None:
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K):
        raise InputError(
            f"--top-k={top_k!r} must be a whole number from 1 to {MAX_TOP_K} (the most logprobs a "
            "server streams per token, and what labels keep); omit it to use the full distribution"
        )


def topk_entropies(record: dict, top_k: int, source: str = "--labels") -> list[float]:
    """Per-token entropy estimated from the first `top_k` logprobs a label row kept (surprise.topk_entropy)."""
    top = record.get("top_logprobs")
    n = len(record.get("surprises") or [])
    if top is None or len(top) != n:
        raise InputError(
            f"{source} has no top-k logprobs for every token (row {record.get('id')!r}: labelled before "
            "`label` kept them), so --top-k cannot be computed; re-run `surprisegate label --data FILE "
            f"--out NEW_FOLDER` and calibrate on that folder, or drop --top-k={top_k}"
        )
    short = min((len(t) for t in top), default=top_k)
    if short < top_k:
        raise InputError(
            f"--top-k={top_k} but {source} kept only {short} logprobs for a token of row "
            f"{record.get('id')!r}; pass --top-k {short} or less, or re-run `surprisegate label`"
        )
    vocab = record.get("vocab_size")
    try:
        return [topk_entropy(t[:top_k], vocab) for t in top]
    except InputError as err:
        raise InputError(f"{source}, row {record.get('id')!r}: {err}") from None


def prepare(
    records: Iterable[dict], top_k: int | None = None, source: str = "--labels", allow_empty: bool = False
) -> list[Labelled]:
    """Label rows -> per-signal sequences. `top_k`: entropy estimated from that many top logprobs."""
    check_top_k(top_k)
    out = []
    for r in records:
        if "surprises" not in r or not isinstance(r.get("correct"), bool):
            continue
        context = r["question"] + (" " + r["question"] if r.get("format") == "cloze" else "")
        flags = copy_flags(r.get("pieces") or [""] * len(r["surprises"]), context)
        if top_k is not None:
            entropies = topk_entropies(r, top_k, source)
        else:
            entropies = r.get("entropies") or [math.nan] * len(r["surprises"])
        seqs = {}
        for sig in SIGNALS:
            values = (signal_value(sig, s, h, c) for s, h, c in zip(r["surprises"], entropies, flags, strict=False))
            seqs[sig] = [v for v in values if v is not None]  # novel signals skip copied tokens
        question = CLOZE_INSTRUCTION.format(question=r["question"]) if r.get("format") == "cloze" else r["question"]
        out.append(Labelled(r["id"], r["correct"], r.get("category") or "", seqs, question_kind(question)))
    if not out and not allow_empty:
        raise InputError("no usable labelled replies found; run `surprisegate label` first")
    return out


def load_items(
    label_dirs: list[str | Path], top_k: int | None = None, only: Collection[str] | None = None
) -> list[Labelled]:
    """Every labels folder's replies (only those with ids in `only`, if given), pooled; a folder that lacks
    what --top-k needs is named in the error."""
    check_top_k(top_k)
    items: list[Labelled] = []
    for d in label_dirs:
        records = (r for r in iter_labels([d]) if only is None or r.get("id") in only)
        items.extend(prepare(records, top_k, source=f"--labels={str(d)!r}", allow_empty=True))
    if not items:
        raise InputError("no usable labelled replies found; run `surprisegate label` first")
    return items


MIN_CLASS = 5  # right and wrong replies each, fewer and the sweep and the 5-fold fit say nothing


def check_classes(items: list[Labelled]) -> None:
    wrong = sum(not it.correct for it in items)
    right = len(items) - wrong
    if min(right, wrong) < MIN_CLASS:
        raise InputError(
            f"{len(items)} labelled replies hold {right} right and {wrong} wrong: too few of one kind to "
            f"calibrate (at least {MIN_CLASS} of each); label more items (drop --limit, or raise it)"
        )


def reply_aggregates(values: list[float], tail_cut: float = 4.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p90": 0.0, "max": 0.0, "tail_mass": 0.0}
    a = np.asarray(values, dtype=float)
    return {
        "mean": float(a.mean()),
        "p90": float(np.percentile(a, 90)),
        "max": float(a.max()),
        "tail_mass": float((a > tail_cut).mean()),
    }


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------
def signal_table(items: list[Labelled], bootstrap: int = 500, min_tokens: int = 4) -> list[dict]:
    """AUROC (95% CI) of every signal × feature, best first."""
    labels = np.array([0 if it.correct else 1 for it in items])
    rows: list[dict[str, Any]] = []
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


def sweep(
    items: list[Labelled],
    signals=SIGNALS,
    windows=WINDOWS,
    statistics=STATISTICS,
    min_tokens_options=(1, 4),
    n_thresholds: int = 60,
) -> list[dict]:
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
            points.append(
                {
                    "signal": sig,
                    "statistic": stat,
                    "window": w,
                    "min_tokens": mt,
                    "threshold": round(float(t), 4),
                    "precision": precision,
                    "recall": recall,
                    "trigger_rate": float(fired.mean()),
                }
            )
    return points


def choose(
    points: list[dict],
    min_recall: float = MIN_RECALL,
    objective: str = "precision",
    min_precision: float = MIN_PRECISION,
) -> dict:
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


def fit_kind_model(peaks: np.ndarray, labels: np.ndarray, kinds: list[str], min_items: int = MIN_KIND_ITEMS) -> dict:
    """Per-kind (prior wrong-rate, mean, spread) of the window peak, shrunk toward the global values."""
    glob_p = float(labels.mean())
    glob_mu, glob_sd = float(peaks.mean()), float(peaks.std()) + 1e-6
    model = {"_global": (glob_p, glob_mu, glob_sd)}
    for k in set(kinds):
        idx = np.array([kk == k for kk in kinds])
        n = int(idx.sum())
        if n < min_items:
            continue
        prior = (labels[idx].sum() + 2 * glob_p) / (n + 2)  # two pseudo-counts of the global rate
        mu = float(peaks[idx].mean())
        sd = float(peaks[idx].std()) + 0.25 * glob_sd  # a floor: small kinds must not get razor-thin spreads
        model[k] = (float(prior), mu, sd)
    return model


def kind_scores(peaks: np.ndarray, kinds: list[str], model: dict, beta: float) -> np.ndarray:
    out = np.empty(len(peaks))
    for i, (x, k) in enumerate(zip(peaks, kinds, strict=True)):
        prior, mu, sd = model.get(k, model["_global"])
        out[i] = _logit(prior) + beta * (x - mu) / sd
    return out


def cross_validated_scores(
    peaks, labels, kinds, beta, folds: int = 5, seed: int = 0, min_items: int = MIN_KIND_ITEMS
) -> np.ndarray:
    """Scores of each reply from a model fitted without it (so the AUROC is not flattered by overfitting)."""
    fold = np.random.default_rng(seed).integers(0, folds, len(peaks))
    out = np.empty(len(peaks))
    for f in range(folds):
        train, test = fold != f, fold == f
        model = fit_kind_model(
            peaks[train], labels[train], [k for k, t in zip(kinds, train, strict=True) if t], min_items
        )
        out[test] = kind_scores(peaks[test], [k for k, t in zip(kinds, test, strict=True) if t], model, beta)
    return out


def kind_thresholds(model: dict, beta: float, cut: float) -> tuple[float, dict[str, float]]:
    """Turn the score cut into a threshold in bits per kind: score > cut  <=>  peak > threshold_k."""

    def threshold(prior, mu, sd):
        return mu + sd * (cut - _logit(prior)) / beta

    glob = threshold(*model["_global"])
    return glob, {k: round(threshold(*v), 4) for k, v in model.items() if k != "_global"}


def calibrate_kinds(
    items: list[Labelled],
    rules: list[dict],
    objective: str = "precision",
    min_precision: float = MIN_PRECISION,
    min_items_options: Sequence[int] = (MIN_KIND_ITEMS,),
) -> dict:
    """Best (rule, beta, least replies for a kind's own parameters) by cross-validated AUROC; the operating
    point on those honest scores."""
    labels = np.array([0 if it.correct else 1 for it in items])
    kinds = [it.kind for it in items]
    best: dict[str, Any] | None = None
    for rule in rules:
        peaks = np.array(
            [
                window_peak(it.sequences[rule["signal"]], rule["window"], rule["statistic"], rule["min_tokens"])
                for it in items
            ]
        )
        for beta, min_items in itertools.product(BETAS, min_items_options):
            scores = cross_validated_scores(peaks, labels, kinds, beta, min_items=min_items)
            a = auroc(scores, labels)
            if best is None or a > best["auroc"]:
                best = {
                    "rule": rule,
                    "beta": beta,
                    "min_items": min_items,
                    "auroc": a,
                    "scores": scores,
                    "peaks": peaks,
                }
    assert best is not None, "calibrate_kinds needs at least one rule"
    scores = best["scores"]
    points = []
    for cut in np.unique(np.quantile(scores, np.linspace(0.02, 0.98, 80))):
        precision, recall = precision_recall(scores > cut, labels)
        points.append(
            {"cut": float(cut), "precision": precision, "recall": recall, "trigger_rate": float((scores > cut).mean())}
        )
    chosen = choose(points, objective=objective, min_precision=min_precision)
    highest_precision = choose(points, objective="precision")
    model = fit_kind_model(best["peaks"], labels, kinds, best["min_items"])
    glob, per_kind = kind_thresholds(model, best["beta"], chosen["cut"])
    lo, hi = bootstrap_auroc(scores, labels)
    return {
        "rule": best["rule"],
        "beta": best["beta"],
        "min_kind_items": best["min_items"],
        "auroc_cv": best["auroc"],
        "ci_low": lo,
        "ci_high": hi,
        "chosen": chosen,
        "objective": objective,
        "min_precision": min_precision,
        "highest_precision_point": highest_precision,
        "threshold": round(glob, 4),
        "kind_thresholds": per_kind,
        "kinds": {
            k: {"prior_wrong": round(v[0], 3), "mean": round(v[1], 3), "sd": round(v[2], 3)} for k, v in model.items()
        },
        "scores": scores,
    }


def plot_curves(
    items: list[Labelled], chosen: dict, baseline: dict, out_dir: Path, kind_scores: np.ndarray | None = None
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = np.array([0 if it.correct else 1 for it in items])
    curves = {}
    for name, p in (("chosen", chosen), ("baseline", baseline)):
        if name == "chosen" and kind_scores is not None:
            curves[f"chosen: {p['signal']} {p['statistic']} W={p['window']} + per-kind (cross-validated)"] = list(
                kind_scores
            )
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


def strongest_rules(table: list[dict], most: int = 8) -> list[dict]:
    """The window rules to try per-kind normalisation on: the strongest few by plain AUROC of their peak."""
    rules: list[dict] = []
    for row in table:
        if row["feature"].startswith("window_"):
            _, stat, w = row["feature"].split("_")
            for mt in (1, 4):
                if mt <= int(w):
                    rules.append({"signal": row["signal"], "statistic": stat, "window": int(w), "min_tokens": mt})
        if len(rules) >= most:
            break
    return rules


def calibrate(
    label_dirs: list[str | Path],
    out_config: str | Path,
    base: Config | None = None,
    bootstrap: int = 500,
    objective: str = "precision",
    min_precision: float = MIN_PRECISION,
    progress: Callable[[str], None] = lambda m: None,
    top_k: int | None = None,
    only: Collection[str] | None = None,
    fixed_rule: Mapping[str, Any] | None = None,
    kind_min_items: Sequence[int] = (MIN_KIND_ITEMS,),
) -> dict:
    """Compute the report, write the chosen operating point into a TOML config, and plots beside it.

    `top_k`: compute the signals from the top K logprobs only (what a server streams); None: full distribution.
    `only`: calibrate on the replies with these ids (None: every labelled reply).
    `fixed_rule`: {signal, statistic, window, min_tokens} to fit thresholds for, instead of searching the rules.
    `kind_min_items`: the least replies a kind needs for its own threshold, chosen among these by CV AUROC.
    """
    items = load_items(label_dirs, top_k, only)
    check_classes(items)
    progress(
        f"{len(items)} labelled replies, {sum(not it.correct for it in items)} wrong"
        + (f"; entropy estimated from the top {top_k} logprobs" if top_k else "")
    )
    table = signal_table(items, bootstrap=bootstrap)
    progress("swept AUROC; sweeping trigger rules ...")
    if fixed_rule is None:
        points = sweep(items)
        rules = strongest_rules(table)
        plain_best = table[0]
    else:
        one = fixed_rule
        points = sweep(items, (one["signal"],), (one["window"],), (one["statistic"],), (one["min_tokens"],))
        rules = [dict(fixed_rule)]
        feature = f"window_{one['statistic']}_{one['window']}"
        plain_best = next(r for r in table if r["signal"] == one["signal"] and r["feature"] == feature)
    chosen = choose(points, objective=objective, min_precision=min_precision)
    baseline = choose(sweep(items, signals=("surprise",), statistics=("mean",)))
    progress("fitting per-kind normalisation ...")
    kinds = calibrate_kinds(items, rules, objective, min_precision, kind_min_items)
    base = base or Config()
    # Per-kind normalisation is used when it separates better (cross-validated) than the best plain signal.
    use_kinds = kinds["auroc_cv"] > plain_best["auroc"]
    if use_kinds:
        rule = kinds["rule"]
        config = base.replace(
            signal=rule["signal"],
            statistic=rule["statistic"],
            window=rule["window"],
            min_tokens=rule["min_tokens"],
            threshold=kinds["threshold"],
            kind_thresholds=kinds["kind_thresholds"],
        )
        chosen = {
            **rule,
            "threshold": kinds["threshold"],
            "precision": kinds["chosen"]["precision"],
            "recall": kinds["chosen"]["recall"],
            "trigger_rate": kinds["chosen"]["trigger_rate"],
            "per_kind": True,
            "beta": kinds["beta"],
        }
    else:
        config = base.replace(
            signal=chosen["signal"],
            statistic=chosen["statistic"],
            window=chosen["window"],
            min_tokens=chosen["min_tokens"],
            threshold=chosen["threshold"],
            kind_thresholds={},
        )
    out = Path(out_config)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# written by surprisegate calibrate from {len(items)} labelled replies\n"
        f"# chosen: precision {chosen['precision']:.3f} at recall {chosen['recall']:.3f} "
        f"(trigger rate {chosen['trigger_rate']:.3f})\n"
        + (
            f"# signals from the top {top_k} logprobs only (calibrate --top-k {top_k}): for a backend that "
            f"streams {top_k}\n"
            if top_k
            else ""
        )
    )
    out.write_text(header + to_toml(config))
    plots = plot_curves(items, chosen, baseline, out.parent, kind_scores=kinds["scores"] if use_kinds else None)
    best_plain = next(r for r in table if r["signal"] == "surprise")
    kinds_report = {k: v for k, v in kinds.items() if k != "scores"}
    report = {
        "top_k": top_k,
        "n": len(items),
        "wrong": int(sum(not it.correct for it in items)),
        "best": (
            {
                "signal": f"{kinds['rule']['signal']} {kinds['rule']['statistic']} W={kinds['rule']['window']} "
                f"+ per-kind normalisation",
                "feature": "cross-validated score",
                "auroc": kinds["auroc_cv"],
                "ci_low": kinds["ci_low"],
                "ci_high": kinds["ci_high"],
            }
            if use_kinds
            else plain_best
        ),
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


# ------------------------------------------------------------------------------------------------
# the shipped rule on the full entropy vs entropy estimated from the top K (issue 10: signals from top-k)
# ------------------------------------------------------------------------------------------------
TOPK_COMPARED = (20, 8, 5)  # the most OpenAI / vLLM send; xAI's most; a small k
BOUND_SLACK = 2e-3  # bits: label rows round logprobs and entropies to 4 decimals


def _estimate_errors(records: list[dict], ks: Sequence[int]) -> dict[int, dict]:
    """Per K: mean abs / mean signed error (bits) of the estimate vs the exact entropy, and how often the
    exact entropy lies within the bounds (up to the rounding of label rows)."""
    errs: dict[int, list[float]] = {k: [] for k in ks}
    inside: dict[int, int] = {k: 0 for k in ks}
    for r in records:
        for h, top in zip(r.get("entropies") or [], r.get("top_logprobs") or [], strict=False):
            for k in ks:
                lo, hi = topk_entropy_bounds(top[:k], r.get("vocab_size"))
                errs[k].append(topk_entropy(top[:k], r.get("vocab_size")) - h)
                inside[k] += lo - BOUND_SLACK <= h <= hi + BOUND_SLACK
    out = {}
    for k in ks:
        e = np.asarray(errs[k])
        out[k] = {
            "tokens": int(e.size),
            "mean_abs_error_bits": float(np.abs(e).mean()) if e.size else math.nan,
            "mean_error_bits": float(e.mean()) if e.size else math.nan,
            "p90_abs_error_bits": float(np.percentile(np.abs(e), 90)) if e.size else math.nan,
            "within_bounds": inside[k] / e.size if e.size else math.nan,
        }
    return out


def topk_comparison(
    label_dirs: list[str | Path],
    ks: Sequence[int] = TOPK_COMPARED,
    base: Config | None = None,
    bootstrap: int = 500,
    progress: Callable[[str], None] = lambda m: None,
) -> dict:
    """Reply-level AUROC of the shipped rule (base's signal, statistic, window, min_tokens) with per-kind
    normalisation, cross-validated as `calibrate` does it (best beta by 5-fold CV AUROC, bootstrap CI),
    on the full distribution and with entropy estimated from the top K logprobs, for each K in `ks`."""
    for size in ks:
        check_top_k(size)
    base = base or Config()
    rule: dict[str, Any] = {
        "signal": base.signal,
        "statistic": base.statistic,
        "window": base.window,
        "min_tokens": base.min_tokens,
    }
    records = [r for d in label_dirs for r in iter_labels([d])]
    rows = []
    baseline = None
    for k in (None, *ks):
        items = load_items(label_dirs, k)
        labels = np.array([0 if it.correct else 1 for it in items])
        peaks = np.array(
            [
                window_peak(it.sequences[rule["signal"]], rule["window"], rule["statistic"], rule["min_tokens"])
                for it in items
            ]
        )
        lo, hi = bootstrap_auroc(peaks, labels, n=bootstrap)
        kinds = calibrate_kinds(items, [rule])
        fired = np.array(
            [p > base.kind_thresholds.get(it.kind, base.threshold) for p, it in zip(peaks, items, strict=True)]
        )
        shipped_precision, shipped_recall = precision_recall(fired, labels)
        hp = kinds["highest_precision_point"]
        rows.append(
            {
                "top_k": k,
                "n": len(items),
                "wrong": int(labels.sum()),
                "plain_auroc": auroc(peaks, labels),
                "plain_ci": [lo, hi],
                "per_kind_auroc_cv": kinds["auroc_cv"],
                "per_kind_ci": [kinds["ci_low"], kinds["ci_high"]],
                "beta": kinds["beta"],
                "precision_at_recall_0.5": {
                    "precision": hp["precision"],
                    "recall": hp["recall"],
                    "trigger_rate": hp["trigger_rate"],
                },
                "shipped_thresholds_as_is": {
                    "precision": shipped_precision,
                    "recall": shipped_recall,
                    "trigger_rate": float(fired.mean()),
                },
            }
        )
        if baseline is None:
            sp = np.array([window_peak(it.sequences["surprise"], 4, "mean", 4) for it in items])
            blo, bhi = bootstrap_auroc(sp, labels, n=bootstrap)
            baseline = {"signal": "surprise", "feature": "window_mean_4", "auroc": auroc(sp, labels), "ci": [blo, bhi]}
        progress(f"{'full distribution' if k is None else f'top-{k}'}: per-kind CV AUROC {kinds['auroc_cv']:.3f}")
    errors = _estimate_errors(records, ks)
    for row in rows:
        row["estimate"] = errors.get(row["top_k"]) if row["top_k"] else None
    return {
        "labels": [str(d) for d in label_dirs],
        "rule": rule,
        "bootstrap": bootstrap,
        "estimator": "surprise.topk_entropy: midpoint of surprise.topk_entropy_bounds (vocab_size from the labels)",
        "baseline_surprise": baseline,
        "rows": rows,
    }


def topk_markdown(summary: dict) -> str:
    """The comparison as a Markdown table (what the README shows)."""
    rule = summary["rule"]
    name = f"{rule['signal']} {rule['statistic']} W={rule['window']}"
    n, wrong = summary["rows"][0]["n"], summary["rows"][0]["wrong"]
    lines = [
        f"Labelled replies: {n} ({wrong} wrong); shipped rule {name} (min_tokens {rule['min_tokens']}), "
        "reply-level AUROC with 95% bootstrap CI.",
        "",
        f"| entropy from | estimate error, bits/token (mean abs; mean) | {name}, plain | "
        f"**{name} + per-kind normalisation (5-fold cross-validated)** | precision at recall ≥ 0.5 | "
        "shipped thresholds as they are: precision, recall (trigger rate) |",
        "|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        k = row["top_k"]
        est = row["estimate"]
        err = "exact" if k is None else f"{est['mean_abs_error_bits']:.3f}; {est['mean_error_bits']:+.3f}"
        pr, sh = row["precision_at_recall_0.5"], row["shipped_thresholds_as_is"]
        lines.append(
            f"| {'full distribution' if k is None else f'top-{k} logprobs (estimate)'} | {err} | "
            f"{row['plain_auroc']:.3f} [{row['plain_ci'][0]:.3f}, {row['plain_ci'][1]:.3f}] | "
            f"**{row['per_kind_auroc_cv']:.3f} [{row['per_kind_ci'][0]:.3f}, {row['per_kind_ci'][1]:.3f}]** | "
            f"{pr['precision']:.3f} at {pr['recall']:.3f} | "
            f"{sh['precision']:.3f}, {sh['recall']:.3f} ({sh['trigger_rate']:.2f}) |"
        )
    b = summary["baseline_surprise"]
    lines += [
        "",
        f"Plain windowed surprise ({b['feature']}), exact at any k: {b['auroc']:.3f} "
        f"[{b['ci'][0]:.3f}, {b['ci'][1]:.3f}]. Entropy from the top k: `surprise.topk_entropy`, the "
        "midpoint of tight bounds (k-th probability caps the missing tokens; vocabulary size). "
        "Shipped thresholds: the config's per-kind thresholds, calibrated on the full entropy, "
        "applied to the estimate unchanged (recalibrate per k: `calibrate --top-k K`).",
    ]
    return "\n".join(lines) + "\n"


def write_topk_comparison(
    label_dirs: list[str | Path],
    out_json: str | Path,
    ks: Sequence[int] = TOPK_COMPARED,
    bootstrap: int = 500,
    progress: Callable[[str], None] = lambda m: None,
) -> dict:
    """`calibrate --compare-top-k`: the JSON summary at `out_json`, the Markdown table beside it (.md)."""
    summary = topk_comparison(label_dirs, ks, bootstrap=bootstrap, progress=progress)
    out = Path(out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    md = out.with_suffix(".md")
    md.write_text(topk_markdown(summary))
    summary["markdown"] = str(md)
    return summary

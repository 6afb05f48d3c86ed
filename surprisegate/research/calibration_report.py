"""What `calibrate` prints: the summary of a model's own calibration (`calibrate --backend`) and of a
report on labels (`calibrate --labels`), as lines of text. Beside the sweep whose results they render."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_calibration_lines(
    result: dict[str, Any], objective: str, signals: str, user_file: Path, ask_hint: str, out: str | None
) -> list[str]:
    """`calibrate_model`'s result: the rule chosen, how well it separates, where the file went and whether
    ask, eval and demo pick it up there (`user_file`: where they look; `ask_hint`: the ask command line;
    `out`: the --out given)."""
    r = result["record"]
    kinds = f" + per-kind thresholds ({r['kinds_with_own_threshold']} kinds)" if r["per_kind"] else ""
    lines = [
        f"calibrated {r['model_id']} ({signals}) on {r['items']} replies ({r['wrong']} wrong): {r['rule']}{kinds}",
        f"AUROC {r['auroc']:.3f} [{r['auroc_ci'][0]:.3f}, {r['auroc_ci'][1]:.3f}] ({r['auroc_is']}); "
        f"{objective} objective: precision {r['precision']:.3f}, recall {r['recall']:.3f}, trigger rate "
        f"{r['trigger_rate']:.3f}; threshold {result['report']['chosen']['threshold']} bits"
        + (" for other kinds" if r["per_kind"] else ""),
        *probe_lines(r),
        f"wrote {result['calibration']}" + _took(r),
    ]
    if Path(result["calibration"]).resolve() == user_file.resolve():
        lines.append(
            f"picked up by ask, eval and demo for {r['model_id']} ({signals}), e.g. {ask_hint}; "
            "a flag, --config or SURPRISEGATE_* setting still wins"
        )
    else:
        lines.append(f"not where it is looked up: pass --config {out}, or copy it to {user_file}")
    return [*lines, f"report → {r['report']}; labels → {result['labels']['out']}"]


def _took(record: dict[str, Any]) -> str:
    if "seconds" not in record:
        return ""
    return f" in {record['seconds']:.0f} s (labels and thresholds {record['seconds_labels_and_thresholds']:.0f} s)"


def probe_lines(record: dict[str, Any]) -> list[str]:
    """The trigger probe's part of the summary: what it was judged on and whether it was written."""
    if "probe_auroc_half_b" not in record:
        return [f"trigger probe: {record['probe']}"] if "probe" in record else []
    wp, wr = record["half_b_window_precision_recall"]
    pp, pr = record["half_b_probe_precision_recall"]
    written = record["probe"] if not str(record["probe"]).startswith("none") else "not written"
    return [
        f"trigger probe (layer {record['probe_layer']}, C {record['probe_c']}, {record['probe_questions']} questions): "
        f"AUROC {record['probe_auroc_cv_half_a']:.3f} cross-validated on half A (window margin "
        f"{record['window_margin_auroc_half_a']:.3f}); half B {record['probe_auroc_half_b']:.3f} "
        f"({record['window_margin_auroc_half_b']:.3f})",
        f"half B: probe precision {pp:.3f} at recall {pr:.3f}, window rule {wp:.3f} at {wr:.3f} → "
        f"{record['probe_why']}: {written}",
    ]


def labels_report_lines(report: dict[str, Any], top_k: int | None) -> list[str]:
    """`calibrate`'s report on labels: AUROC per signal and feature, the plain-surprise baseline, the trigger."""
    lines = [
        f"{report['n']} replies, {report['wrong']} wrong"
        + (f"; signals from the top {top_k} logprobs" if top_k else ""),
        "signal         feature            AUROC   95% CI",
    ]
    lines += [
        f"{row['signal']:<14} {row['feature']:<18} {row['auroc']:.3f}   [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        for row in report["auroc_table"][:12]
    ]
    b, c = report["best_plain_surprise"], report["chosen"]
    return [
        *lines,
        f"baseline (plain surprise) best: {b['feature']} {b['auroc']:.3f}",
        f"chosen trigger: {c['signal']} {c['statistic']} W={c['window']} min_tokens={c['min_tokens']} "
        f"threshold={c['threshold']} → precision {c['precision']:.3f}, recall {c['recall']:.3f}",
        f"config → {report['config']}; plots → {', '.join(report['plots'])}",
    ]

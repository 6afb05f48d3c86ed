"""Render the Results page's tables (docs/results/index.md) from the saved calibration and eval summaries.

python scripts/results_md.py results/   > results/RESULTS.md
python scripts/results_md.py results/ --page docs/results/index.md   # also replace the page's generated block
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def calibration_md(cal: dict) -> list[str]:
    pk = cal["per_kind"]
    best_plain = cal["best_plain_surprise"]
    rule = pk["rule"]
    hp = pk["highest_precision_point"]
    ch = pk["chosen"]
    lines = [
        f"Labelled replies: {cal['n']} ({cal['wrong']} wrong).",
        "",
        "| signal | reply-level AUROC (95% CI) |",
        "|---|---|",
        f"| plain windowed surprise (baseline): {best_plain['feature']} | {best_plain['auroc']:.3f} "
        f"[{best_plain['ci_low']:.3f}, {best_plain['ci_high']:.3f}] |",
    ]
    table = cal.get("auroc_table") or cal.get("auroc_table_top") or []
    aggregates = [r for r in table if r["signal"] == "surprise" and r["feature"] in ("mean", "p90", "max", "tail_mass")]
    for row in aggregates:
        lines.append(
            f"| surprise, whole-reply {row['feature']} | {row['auroc']:.3f} [{row['ci_low']:.3f}, "
            f"{row['ci_high']:.3f}] |"
        )
    for row in table[:5]:
        lines.append(
            f"| {row['signal']} {row['feature']} | {row['auroc']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] |"
        )
    lines.append(
        f"| **chosen: {rule['signal']} {rule['statistic']} W={rule['window']} + per-kind normalisation "
        f"(5-fold cross-validated)** | **{pk['auroc_cv']:.3f} [{pk['ci_low']:.3f}, {pk['ci_high']:.3f}]** |"
    )
    point = (
        f"Operating point of the chosen signal (cross-validated scores): highest precision at recall ≥ 0.5 = "
        f"precision {hp['precision']:.3f} at recall {hp['recall']:.3f} (trigger rate {hp['trigger_rate']:.2f})"
    )
    if cal.get("objective") == "recall":
        point += (
            f"; written to the config (most recall at precision ≥ {cal.get('min_precision')}) = precision "
            f"{ch['precision']:.3f} at recall {ch['recall']:.3f} (trigger rate {ch['trigger_rate']:.2f})"
        )
    return lines + ["", point + "."]


def eval_md(name: str, summary: dict) -> list[str]:
    lines = [
        f"**{name}**",
        "",
        "| mode | n | accuracy | regressions | trigger rate | precision | recall | grounding calls | tokens "
        "decoded | tokens prefilled | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in summary["modes"].items():
        lines.append(
            f"| {m} | {s['n']} | {s['accuracy']:.2f} | {s['regressions']} | {s['trigger_rate']:.2f} | "
            f"{s['intervention_precision'] if s['intervention_precision'] is not None else '–'} | "
            f"{s['intervention_recall'] if s['intervention_recall'] is not None else '–'} | "
            f"{s['grounding_calls']} | {s['tokens_decoded']} | {s['tokens_prefilled']} | {s['seconds']:.0f} |"
        )
    if "oracle" in summary:
        lines += ["", oracle_md(summary["oracle"])]
    return lines + [""]


def oracle_md(oracle: dict) -> str:
    """Below the A/B table: how much of the oracle's gain the gate's trigger got with as many grounded replies."""
    efficiency = "–" if oracle["efficiency"] is None else f"{oracle['efficiency']:.2f}"
    budget = (
        f"as many replies as intervene grounded ({oracle['budget']})"
        if oracle["calls_source"] == "intervene"
        else f"{oracle['budget']} replies (--oracle-calls)"
    )
    return (
        f"Oracle: grounds only replies `off` got wrong, {budget}. Trigger efficiency (intervene's accuracy gain "
        f"÷ the oracle's): **{efficiency}**."
    )


BEGIN, END = "<!-- results:begin (scripts/results_md.py) -->", "<!-- results:end -->"


def splice(page: Path, block: str) -> None:
    text = page.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{page} has no {BEGIN} ... {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + "\n" + block.rstrip() + "\n" + END + tail)


def main(root: str, page: str | None = None) -> None:
    base = Path(root)
    out: list[str] = []
    for folder, title in (
        ("calibration_factqa_wikidata", "Detection on factqa_dev + wikidata_cloze_dev pooled"),
        ("calibration", "Shipped calibration (factqa + wikidata + 150 arith items)"),
    ):
        cal = base / folder / "calibration.json"
        if cal.exists():
            out += [f"## {title}", ""] + calibration_md(json.loads(cal.read_text())) + [""]
    evals = sorted((base / "eval").glob("*/summary.json"))
    if evals:
        out += ["## A/B", ""]
        for path in evals:
            out += eval_md(path.parent.name, json.loads(path.read_text()))
    for path in sorted((base / "tradeoff").glob("*/tradeoff.md")):
        out += [
            f"## Operating points on {path.parent.name}: accuracy against grounding calls and tokens",
            "",
            path.read_text().rstrip(),
            "",
            f"![trade-off](../figures/{path.parent.relative_to(base).as_posix()}/tradeoff.png)",
            "",
        ]
    print("\n".join(out))
    if page:
        splice(Path(page), "\n".join(out))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Render the Results page's tables from results/.")
    ap.add_argument("root", nargs="?", default="results")
    ap.add_argument("--page", help="also replace this page's generated block (docs/results/index.md)")
    cli = ap.parse_args()
    main(cli.root, cli.page)

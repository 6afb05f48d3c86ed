"""Plot the paragraph trade-off: claim accuracy against grounding calls per mode, one panel per eval folder.

    python scripts/paragraph_plot.py results/paragraphs/smollm2 results/second_model/paragraphs/longform_dev \
        --out results/paragraphs/tradeoff.png

Each folder is an `surprisegate eval` output on a long-form set (its summary.json has per-mode claim scores).
Beside each point: claim accuracy, coverage and regressions (share of claims).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(summary: dict) -> list[tuple[str, int, dict]]:
    return [(mode, s["grounding_calls"], s["claims"]) for mode, s in summary["modes"].items() if "claims" in s]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.folders), figsize=(5.2 * len(args.folders), 4), squeeze=False)
    for ax, folder in zip(axes[0], args.folders, strict=True):
        summary = json.loads((Path(folder) / "summary.json").read_text())
        config = json.loads((Path(folder) / "eval_config.json").read_text())
        for mode, calls, c in points(summary):
            label = (
                f"{mode}: accuracy {c['claim_accuracy']:.2f}, coverage {c['coverage']:.2f}, "
                f"regressions {c['claim_regression_rate']:.1%}"
            )
            ax.scatter([calls], [c["claim_accuracy"]], s=60, label=label)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_xlabel("grounding calls")
        ax.set_ylabel("claim accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"{Path(str(config.get('model', folder))).name[:40]}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

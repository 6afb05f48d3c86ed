"""The revise fallback against mid-decode intervention: one table and one plot from finished eval folders.

Each set has two runs on the same seeded 100-item sample: `off,intervene` through a chat API (the embedded
model behind llama.cpp's server, used as a black box through the `openai` client, so `intervene` is the revise
pass) in FALLBACK/SET, and the in-process README run (`intervene` mid-decode) in INPROCESS/SET.

    python scripts/fallback_table.py --fallback results/eval_fallback --inprocess results/eval \\
        --out results/eval_fallback/fallback
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SETS = {"factqa_dev": "memory", "arith_dev": "tools", "halueval_qa_dev": "web"}
COLUMNS = ("accuracy", "regressions", "grounding_calls", "tokens_decoded", "seconds")


def rows(fallback: Path, inprocess: Path) -> list[dict]:
    out = []
    for name, arm in SETS.items():
        chat = json.loads((fallback / name / "summary.json").read_text())["modes"]
        local = json.loads((inprocess / name / "summary.json").read_text())["modes"]
        for label, s in (
            ("off (chat API)", chat["off"]),
            ("revise (chat API)", chat["intervene"]),
            ("intervene (in process)", local["intervene"]),
        ):
            out.append({"set": name, "arm": arm, "mode": label, "n": s["n"]} | {k: s[k] for k in COLUMNS})
    return out


def markdown(table: list[dict]) -> str:
    lines = [
        "| set (arm) | mode | n | accuracy | regressions | grounding calls | tokens decoded | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['set']} ({r['arm']}) | {r['mode']} | {r['n']} | {r['accuracy']:.2f} | {r['regressions']} | "
            f"{r['grounding_calls']} | {r['tokens_decoded']} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    modes = list(dict.fromkeys(r["mode"] for r in table))
    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        values = [next(r["accuracy"] for r in table if r["set"] == s and r["mode"] == mode) for s in SETS]
        ax.bar([x + i * width for x in range(len(SETS))], values, width, label=mode)
    ax.set_xticks([x + width for x in range(len(SETS))], [f"{s}\n({a})" for s, a in SETS.items()])
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (100 items)")
    ax.set_title("revise fallback (chat API) vs mid-decode intervene, SmolLM2-135M")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fallback", type=Path, required=True)
    ap.add_argument("--inprocess", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="path stem: writes STEM.md, STEM.json and STEM.png")
    args = ap.parse_args()
    table = rows(args.fallback, args.inprocess)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(table))
    plot(table, args.out.with_suffix(".png"))
    print(markdown(table), end="")


if __name__ == "__main__":
    main()

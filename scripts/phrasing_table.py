"""The gate's gain per family of wording beside the template's (issue 45), from results/phrasings/MODEL.

    python scripts/phrasing_table.py results/phrasings/smollm2

Per family: accuracy off and intervening, the gain, grounding calls (and as a multiple of the template's),
trigger rate and regressions, on the same 100 items. Writes table.md and table.json beside the runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELD_OUT = ("lowercase", "indirect")


def row(summary: dict) -> dict:
    off, on = summary["modes"]["off"], summary["modes"]["intervene"]
    return {
        "off": off["accuracy"],
        "intervene": on["accuracy"],
        "gain": round(on["accuracy"] - off["accuracy"], 4),
        "calls": on["grounding_calls"],
        "trigger_rate": on["trigger_rate"],
        "regressions": on["regressions"],
        "n": on["n"],
    }


def main() -> None:
    root = Path(sys.argv[1])
    rows = {
        p.parent.name.removeprefix("factqa_"): row(json.loads(p.read_text()))
        for p in root.glob("factqa_*/summary.json")
    }
    base = rows.get("template")
    lines = [
        "| wording (100 factqa_dev items) | off | intervene | gain | gain − template's | grounding calls "
        "(× template's) | trigger rate | regressions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = ["template", "conversational", "extra_words", "lowercase", "indirect"]
    for name in sorted(rows, key=lambda n: order.index(n) if n in order else 99):
        r = rows[name]
        label = name + (" (held out)" if name in HELD_OUT else "")
        vs = f"{r['gain'] - base['gain']:+.2f}" if base else "–"
        times = f" ({r['calls'] / base['calls']:.2f}×)" if base and base["calls"] else ""
        lines.append(
            f"| {label} | {r['off']:.2f} | {r['intervene']:.2f} | {r['gain']:+.2f} | {vs} | {r['calls']}{times} | "
            f"{r['trigger_rate']:.2f} | {r['regressions']} |"
        )
    (root / "table.md").write_text("\n".join(lines) + "\n")
    (root / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

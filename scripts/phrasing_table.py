"""The gate's gain per family of wording beside the template's (issue 45), from results/phrasings/MODEL.

    python scripts/phrasing_table.py results/phrasings/smollm2

Per set (factqa: 100 items, accuracy; longform: 60 prompts, claim accuracy) and family: off and intervening,
the gain, grounding calls (and as a multiple of the template's), trigger rate and regressions (longform: claims
off had right, and the share of replies that still state every item off's reply states), on the same items.
Writes table.md and table.json beside the runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELD_OUT = ("lowercase", "indirect")


def row(summary: dict) -> dict:
    off, on = summary["modes"]["off"], summary["modes"]["intervene"]
    claims = on.get("claims")  # a paragraph set: scored claim by claim
    accuracy = (lambda m: m["claims"]["claim_accuracy"]) if claims else (lambda m: m["accuracy"])
    return {
        "off": accuracy(off),
        "intervene": accuracy(on),
        "gain": round(accuracy(on) - accuracy(off), 4),
        "calls": on["grounding_calls"],
        "trigger_rate": on["trigger_rate"],
        "regressions": claims["claim_regressions"] if claims else on["regressions"],
        "still_states_off_items": claims.get("still_states_off_items") if claims else None,
        "n": on["n"],
    }


def table(rows: dict[str, dict], set_name: str) -> list[str]:
    base = rows.get("template")
    paragraphs = set_name == "longform"
    unit = "60 longform_dev prompts, claim accuracy" if paragraphs else "100 factqa_dev items"
    lines = [
        f"| wording ({unit}) | off | intervene | gain | gain − template's | grounding calls "
        "(× template's) | trigger rate | regressions |" + (" still states off's items |" if paragraphs else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if paragraphs else ""),
    ]
    order = ["template", "conversational", "extra_words", "lowercase", "indirect"]
    for name in sorted(rows, key=lambda n: order.index(n) if n in order else 99):
        r = rows[name]
        label = name + (" (held out)" if name in HELD_OUT else "")
        vs = f"{r['gain'] - base['gain']:+.2f}" if base else "–"
        times = f" ({r['calls'] / base['calls']:.2f}×)" if base and base["calls"] else ""
        stated = (
            f" {r['still_states_off_items']:.2f} |" if paragraphs and r["still_states_off_items"] is not None else ""
        )
        lines.append(
            f"| {label} | {r['off']:.2f} | {r['intervene']:.2f} | {r['gain']:+.2f} | {vs} | {r['calls']}{times} | "
            f"{r['trigger_rate']:.2f} | {r['regressions']} |{stated}"
        )
    return lines


def main() -> None:
    root = Path(sys.argv[1])
    out: dict[str, dict] = {}
    lines: list[str] = []
    for set_name in ("factqa", "longform"):
        rows = {
            p.parent.name.removeprefix(f"{set_name}_"): row(json.loads(p.read_text()))
            for p in root.glob(f"{set_name}_*/summary.json")
        }
        if rows:
            out[set_name] = rows
            lines += table(rows, set_name) + [""]
    (root / "table.md").write_text("\n".join(lines))
    (root / "table.json").write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Claim scores of a long-form eval folder on each seeded half of the set: half A is where
scripts/fit_sentence_threshold.py fitted `sentence_threshold`, half B was not read while fitting.

    python scripts/paragraph_halves.py results/paragraphs/smollm2 --data ../shared/data/longform_dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_sentence_threshold import halves

from surprisegate.research.labeling import read_items
from surprisegate.research.longform import score_claims


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    half_a = halves([it["id"] for it in read_items(args.data)], args.seed)
    rows = [json.loads(line) for line in (Path(args.folder) / "results.jsonl").read_text().splitlines() if line]
    out = {}
    for half, keep in (("A", lambda i: i in half_a), ("B", lambda i: i not in half_a)):
        by_mode: dict[str, dict[str, list[str]]] = {}
        for r in rows:
            if "claims" in r and keep(r["id"]):
                by_mode.setdefault(r["mode"], {})[r["id"]] = r["claims"]
        off = by_mode.get("off")
        calls = {m: sum(r["grounding_calls"] for r in rows if r["mode"] == m and keep(r["id"])) for m in by_mode}
        out[half] = {
            m: score_claims(v, off).to_dict() | {"grounding_calls": calls[m], "prompts": len(v)}
            for m, v in by_mode.items()
        }
        for m, s in out[half].items():
            print(
                f"half {half} {m:9s} prompts {s['prompts']:3d} claims {s['claims']:3d}: "
                f"accuracy {s['claim_accuracy']:.3f} precision {s['claim_precision']} "
                f"coverage {s['coverage']:.3f} regressions {s['claim_regressions']}"
                f" ({s['claim_regression_rate']:.1%}) calls {s['grounding_calls']}"
                f" still states off's items {s.get('still_states_off_items')}"
            )
    (Path(args.folder) / "halves.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

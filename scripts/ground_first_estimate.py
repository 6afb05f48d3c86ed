"""What a question-level "ground first" would do (issue 43): for the kinds of question a model gets wrong most
of the time without evidence, ground before the first token (the `always` mode's reply) instead of gating;
every other question goes through the gate as it ships. Estimated from rows already made, not run: per half-B
item, the `always` row if its kind is "hard", else the gate's `intervene` row. A kind is hard when the model's
off accuracy on that kind in half A (the signals run's greedy replies, the other 50 items) is at most `cut`.
The kind is the data's relation, the best a kind rule could do (the gate reads a question's kind from its words).

    .venv/bin/python scripts/ground_first_estimate.py --model smollm2 --gate results/peers/smollm2/factqa_gate_probe
    .venv/bin/python scripts/ground_first_estimate.py --model qwen --gate results/peers/qwen/factqa_eval
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

CUTS = (0.0, 0.2, 0.34, 0.5)


def rows_of(folder: Path) -> dict[tuple[str, str], dict]:
    rows = (json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line)
    return {(r["id"], r["mode"]): r for r in rows}


def off_accuracy_by_kind(signals: Path, half_b: set[str]) -> dict[str, tuple[int, int]]:
    """Per relation, (items, right without evidence) over half A of the signals run."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for line in signals.read_text().splitlines():
        row = json.loads(line)
        if row["id"] not in half_b:
            kind = row["id"].split("-")[1]  # fact-<relation>-<n>
            counts[kind][0] += 1
            counts[kind][1] += bool(row["correct"])
    return {k: (n, right) for k, (n, right) in counts.items()}


def estimate(gate: dict, always: dict, ids: list[str], hard: set[str]) -> dict:
    chosen = [always[(i, "always")] if gate[(i, "off")]["relation"] in hard else gate[(i, "intervene")] for i in ids]
    broken = sum(gate[(i, "off")]["correct"] and not row["correct"] for i, row in zip(ids, chosen, strict=True))
    return {
        "hard_kinds": sorted(hard),
        "accuracy": round(sum(r["correct"] for r in chosen) / len(ids), 3),
        "calls": sum(r["grounding_calls"] for r in chosen),
        "regressions": broken,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="smollm2 or qwen: results/peers/<model>/")
    ap.add_argument("--gate", required=True, type=Path, help="eval folder with the gate's off and intervene rows")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    peers = Path("results/peers") / args.model
    half_b = {json.loads(line)["id"] for line in Path("results/peers/smollm2/factqa_halfB.jsonl").open()}
    gate, always = rows_of(args.gate), rows_of(peers / "factqa_always")
    ids = sorted(half_b)
    by_kind = off_accuracy_by_kind(peers / "factqa_signals" / "signals.jsonl", half_b)
    shipped = estimate(gate, always, ids, set())
    out = {
        "model": args.model,
        "gate": shipped,
        "always": estimate(gate, always, ids, {gate[(i, "off")]["relation"] for i in ids}),
        "ground_first": {
            str(cut): estimate(gate, always, ids, {k for k, (n, right) in by_kind.items() if right <= cut * n})
            for cut in CUTS
        },
        "half_a_off_by_kind": by_kind,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

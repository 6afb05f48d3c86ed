"""The "against the field" table and plot: every method's accuracy, regressions, retrieval calls, tokens decoded
and prefilled and wall time from one eval folder, with each trigger's detection AUROC from peer_signals.py and
an exact McNemar test of the gate against each peer on the same items.

    .venv/bin/python scripts/peer_table.py results/peers/smollm2/factqa_eval \\
        --signals results/peers/smollm2/factqa_signals/summary.json \\
        [--extra "flare theirs θ=0.8=results/peers/smollm2/factqa_flare_theirs_0.8:flare" ...]

--claims (long-form sets): claim accuracy and claim regressions instead of whole replies, and the McNemar test
over claims (each asked item of each prompt; claims of one prompt are not independent, so read p loosely).

--extra LABEL=FOLDER:MODE adds one mode of another eval folder over the same items (a run with settings the
main folder cannot hold, e.g. FLARE as their configs run it) as a row named LABEL.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

GATE = "intervene"
SIGNAL_OF = {
    "intervene": "gate-window",
    "dragin": "dragin",
    "etc": "etc",
    "etc-trend": "etc-trend",
    "seakr": "seakr",
    "flare": "flare",
    "entropy-rule": "entropy-mean",
}


def parse_extra(spec: str) -> tuple[str, Path, str]:
    """'LABEL=FOLDER:MODE' -> (LABEL, FOLDER, MODE); the label may hold '=' (θ=0.8), the folder may not."""
    head, _, mode = spec.rpartition(":")
    label, _, folder = head.rpartition("=")
    if not (label and folder and mode):
        raise SystemExit(f"--extra {spec!r} is not LABEL=FOLDER:MODE, e.g. 'flare theirs=results/x:flare'")
    return label, Path(folder), mode


def mcnemar_p(gate_only: int, peer_only: int) -> float:
    """Exact two-sided McNemar: the binomial probability of a split at least this uneven of the discordant pairs."""
    n = gate_only + peer_only
    if n == 0:
        return 1.0
    k = min(gate_only, peer_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def rows_by_mode(folder: Path) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out.setdefault(r["mode"], {})[r["id"]] = r
    return out


def outcomes(rows: dict[str, dict], claims: bool) -> dict:
    """Right or not per item (per (item, asked item) with `claims`)."""
    if not claims:
        return {i: r["correct"] for i, r in rows.items()}
    return {(i, k): grade == "right" for i, r in rows.items() for k, grade in enumerate(r.get("claims") or [])}


def as_claims(s: dict) -> dict:
    """A mode's summary with claim accuracy and claim regressions in the place of the whole reply's."""
    c = s["claims"]
    return s | {"n": c["claims"], "accuracy": c["claim_accuracy"], "regressions": c["claim_regressions"]}


def table(
    folder: Path,
    signals: dict | None,
    extras: Sequence[tuple[str, Path, str]] = (),
    gate_label: str = GATE,
    claims: bool = False,
) -> tuple[list[str], dict]:
    summary = json.loads((folder / "summary.json").read_text())
    rows = rows_by_mode(folder)
    for label, other, mode in extras:
        summary["modes"][label] = json.loads((other / "summary.json").read_text())["modes"][mode]
        rows[label] = rows_by_mode(other)[mode]
    gate = outcomes(rows.get(gate_label, {}), claims)
    what = "claims" if claims else "n"
    lines = [
        f"| method | {what} | accuracy | regressions | retrieval calls | tokens decoded | tokens prefilled | wall s | "
        f"AUROC half A / B | vs the gate ({gate_label}): only the gate right / only it right, exact p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = {}
    for mode, s in summary["modes"].items():
        if mode == "detect":
            continue
        s = as_claims(s) if claims else s
        # The gate's signal on claim sentences is its sentence rule; an extra row has none.
        name = "gate-sentence" if claims and mode == GATE else SIGNAL_OF.get(mode, "")
        sig = (signals or {}).get("signals", {}).get(name, {})
        auroc = f"{sig.get('auroc_A', '–')} / {sig.get('auroc_B', '–')}" if sig else "–"
        versus = "–"
        if mode != gate_label and gate and mode in rows:
            peer = outcomes(rows[mode], claims)
            common = set(gate) & set(peer)
            g_only = sum(1 for i in common if gate[i] and not peer[i])
            p_only = sum(1 for i in common if peer[i] and not gate[i])
            versus = f"{g_only} / {p_only}, p = {mcnemar_p(g_only, p_only):.3f}"
        lines.append(
            f"| {mode} | {s['n']} | {s['accuracy']:.3f} | {s['regressions']} | {s['grounding_calls']} | "
            f"{s['tokens_decoded']} | {s['tokens_prefilled']} | {s['seconds']:.0f} | {auroc} | {versus} |"
        )
        out[mode] = s
    return lines, out


def plot(out: dict, path: Path, title: str, ylabel: str = "accuracy") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    biggest = max(s["tokens_prefilled"] for s in out.values()) or 1
    for mode, s in out.items():
        ax.scatter(
            s["grounding_calls"],
            s["accuracy"],
            s=40 + 600 * s["tokens_prefilled"] / biggest,
            alpha=0.6,
            color="#c44e52" if mode.startswith(GATE) else "#4c72b0",
        )
        ax.annotate(mode, (s["grounding_calls"], s["accuracy"]), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("retrieval calls")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (marker area: tokens prefilled)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--signals", type=Path, default=None)
    ap.add_argument("--extra", action="append", default=[], help="LABEL=FOLDER:MODE (repeatable)")
    ap.add_argument("--gate", default=GATE, help="the row the McNemar column compares every other row with")
    ap.add_argument("--claims", action="store_true", help="long-form: claim accuracy, McNemar over claims")
    args = ap.parse_args()
    signals = json.loads(args.signals.read_text()) if args.signals else None
    lines, out = table(args.folder, signals, [parse_extra(e) for e in args.extra], args.gate, args.claims)
    (args.folder / "field.md").write_text("\n".join(lines) + "\n")
    plot(out, args.folder / "field.png", args.folder.name, "claim accuracy" if args.claims else "accuracy")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Accuracy against cost for several operating points: does the gate buy `always`'s accuracy for fewer calls?

Runs `intervene` once per config (each a calibrated operating point, e.g. from `surprisegate calibrate
--min-precision P`) and `flare` once per theta, on the same seeded sample as a finished `surprisegate eval`
folder (--base, which holds `off`, `always` and default `flare`), then writes OUT/tradeoff.json,
OUT/tradeoff.md and OUT/tradeoff.png (accuracy vs grounding calls, accuracy vs tokens decoded).

With --oracle, each point also gets the oracle at its own budget (the replies it grounded: the same number of
items `off` got wrong, grounded at their first window) and the trigger efficiency, the point's accuracy gain
over `off` ÷ the oracle's. That costs one plain pass and about as many grounded replies again per point.

    python scripts/tradeoff.py --data ../shared/data/factqa_dev.jsonl --memory factkb.sqlite \\
        --base results/eval/factqa_dev --sample 100 --out results/tradeoff/factqa_dev \\
        --point p85=results/calibration/points/p85.toml --point p95=... --flare-theta 0.1 --flare-theta 0.2 [--oracle]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from surprisegate.config import load_config
from surprisegate.gate.receipts import read_receipts
from surprisegate.progress import progress_callback
from surprisegate.research.evaluate import FLARE_THETA, FlareSettings, evaluate, summarise, trigger_efficiency
from surprisegate.runtime import build_arms, load_backend


def rows_of(folder: Path, mode: str) -> list[dict]:
    path = folder / "results.jsonl"
    return [r for r in read_receipts(path) if r["mode"] == mode] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--memory", default="none")
    ap.add_argument("--web", default=None)
    ap.add_argument("--base", required=True, help="a finished `surprisegate eval` folder with off, always, flare")
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--point", action="append", default=[], help="NAME=CONFIG.toml (repeatable)")
    ap.add_argument("--flare-theta", action="append", type=float, default=[])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--oracle",
        action="store_true",
        help="also run the oracle at each point's budget (replies grounded) for a trigger-efficiency column",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    base, out = Path(args.base), Path(args.out)
    off = rows_of(base, "off")
    if not off:
        sys.exit(
            f"--base={args.base!r} holds no `off` results; run `surprisegate eval --modes off,always,flare` there first"
        )
    ids = {r["id"] for r in off}
    points: dict[str, dict] = {}
    # One model for every run: the operating points differ only in trigger settings, not in the model.
    defaults = load_config(None, {"threads": args.threads})
    backend = load_backend(defaults)
    runs = [
        (f"intervene {name}", name, "intervene", path or None, FLARE_THETA)
        for name, _, path in (spec.partition("=") for spec in args.point)
    ]
    runs += [(f"flare θ={theta}", f"flare_theta_{theta}", "flare", None, theta) for theta in args.flare_theta]
    for label, folder, mode, path, theta in runs:
        config = load_config(path, {"threads": args.threads})
        if (config.backend, config.model) != (defaults.backend, defaults.model):
            sys.exit(f"{path} sets backend/model {config.backend}/{config.model!r}; the points share the default model")
        arms = build_arms(config, args.memory, web=args.web)
        print(f"{label} ({path or 'defaults'})", file=sys.stderr)
        with progress_callback(folder) as progress:
            evaluate(
                args.data,
                [mode],
                backend,
                config,
                arms,
                out / folder,
                sample=args.sample,
                progress=progress,
                flare=FlareSettings(theta),
            )
        rows = [r for r in rows_of(out / folder, mode) if r["id"] in ids]
        points[label] = summarise(off + rows, ["off", mode])["modes"][mode]
        if args.oracle:
            # Same folder: its own `off` pass, then the oracle given exactly the replies this point grounded.
            budget = sum(1 for r in rows if r["grounding_calls"] > 0)
            with progress_callback(f"{folder} oracle") as progress:
                summary = evaluate(
                    args.data,
                    ["off", mode, "oracle"],
                    backend,
                    config,
                    arms,
                    out / folder,
                    sample=args.sample,
                    progress=progress,
                    flare=FlareSettings(theta),
                    oracle_calls=budget,
                )
            points[label] |= oracle_fields(summary["modes"], mode, budget)
    baseline = summarise(
        off + rows_of(base, "always") + rows_of(base, "flare") + rows_of(base, "intervene") + rows_of(base, "oracle"),
        ["off", "intervene", "always", "flare", "oracle"],
    )["modes"]
    names = {
        "off": "off",
        "always": "always",
        "intervene": "intervene (shipped config)",
        "flare": "flare θ=0.4",
        "oracle": "oracle (base run's budget)",
    }
    for mode, name in names.items():
        if mode in baseline:
            points[name] = baseline[mode]
    if "intervene" in baseline and "oracle" in baseline:
        points[names["intervene"]] = points[names["intervene"]] | oracle_fields(
            baseline, "intervene", base_budget(base)
        )
    write(points, out, Path(args.data).stem)
    return 0


def base_budget(base: Path) -> int | None:
    """The oracle budget the base eval recorded in its summary.json (None when it has none)."""
    path = base / "summary.json"
    return json.loads(path.read_text()).get("oracle", {}).get("budget") if path.exists() else None


def oracle_fields(modes: dict[str, dict], gate: str, budget: int | None) -> dict:
    """A point's oracle columns: the oracle's accuracy at that point's budget and the point's share of its gain."""
    off, point, oracle = (modes[m]["accuracy"] for m in ("off", gate, "oracle"))
    return {
        "oracle_budget": budget,
        "oracle_accuracy": oracle,
        "trigger_efficiency": trigger_efficiency(off, point, oracle),
    }


def write(points: dict[str, dict], out: Path, title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tradeoff.json").write_text(json.dumps(points, indent=2))
    always = points.get("always")
    # The oracle columns only when some point has an oracle run: older tables stay as they were.
    with_oracle = any("oracle_accuracy" in s for s in points.values())
    lines = [
        "| run | accuracy | regressions | trigger rate | grounding calls | tokens decoded | "
        "share of always's accuracy | share of always's calls |"
        + (" oracle at the same replies grounded | trigger efficiency |" if with_oracle else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if with_oracle else ""),
    ]
    for name, s in sorted(points.items(), key=lambda kv: kv[1]["grounding_calls"]):
        share_acc = f"{s['accuracy'] / always['accuracy']:.2f}" if always and always["accuracy"] else "–"
        share_calls = (
            f"{s['grounding_calls'] / always['grounding_calls']:.2f}" if always and always["grounding_calls"] else "–"
        )
        lines.append(
            f"| {name} | {s['accuracy']:.2f} | {s['regressions']} | {s['trigger_rate']:.2f} | "
            f"{s['grounding_calls']} | {s['tokens_decoded']} | {share_acc} | {share_calls} |"
            + (oracle_cells(s) if with_oracle else "")
        )
    (out / "tradeoff.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "grounding_calls", "grounding calls"),
        (axes[1], "tokens_decoded", "tokens decoded"),
    ):
        for name, s in points.items():
            colour = "#4c72b0" if name.startswith("intervene") else "#dd8452" if name.startswith("flare") else "#555555"
            ax.scatter(s[key], s["accuracy"], color=colour)
            # FLARE's labels go below their points, the others above: the two curves interleave
            ax.annotate(
                name,
                (s[key], s["accuracy"]),
                fontsize=7,
                xytext=(4, -11 if name.startswith("flare") else 5),
                textcoords="offset points",
            )
        # Each family as a curve from its fewest to its most grounding calls, so the frontiers compare at a glance.
        for prefix, colour in (("intervene", "#4c72b0"), ("flare", "#dd8452")):
            family = sorted(
                (s["grounding_calls"], s[key], s["accuracy"]) for name, s in points.items() if name.startswith(prefix)
            )
            ax.plot([x for _, x, _ in family], [y for _, _, y in family], color=colour, lw=0.8, alpha=0.6)
        if always:
            ax.axhline(0.9 * always["accuracy"], color="#999999", ls="--", lw=0.8)
            if key == "grounding_calls":
                ax.axvline(0.5 * always["grounding_calls"], color="#999999", ls=":", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("accuracy")
    axes[0].set_title(f"{title}: dashed 90% of always's accuracy, dotted 50% of its calls", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "tradeoff.png", dpi=110)
    plt.close(fig)


def oracle_cells(s: dict) -> str:
    oracle = f"{s['oracle_accuracy']:.2f}" if s.get("oracle_accuracy") is not None else "–"
    efficiency = f"{s['trigger_efficiency']:.2f}" if s.get("trigger_efficiency") is not None else "–"
    return f" {oracle} | {efficiency} |"


if __name__ == "__main__":
    from surprisegate.errors import SurpriseGateError

    try:
        raise SystemExit(main())
    except SurpriseGateError as err:  # a clear message, as the CLI gives, not a traceback
        raise SystemExit(f"error: {err}") from None

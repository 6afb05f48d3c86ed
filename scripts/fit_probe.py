"""Fit the trigger probe (surprisegate/probe.py) on the dev labels; judge it on the half it never saw.

Each item's reply is decoded in detect mode through the loop on the embedded llama.cpp model with layer
`--layer` tapped (the replies are the `off` replies: detect never changes a token), graded, and replayed
through `TriggerPolicy` to get what the probe judges: the highest window's margin over its kind's
threshold in the first sentence, and the mean hidden state of that sentence's tokens. An L2 logistic
regression (wrong reply = 1) is fitted on seeded half A (random.Random(seed) over the sorted ids, the
halves of scripts/trigger_features.py); its cut is set on cross-fitted half-A scores where half A keeps
at least the shipped window rule's recall (so the gate grounds as many wrong replies as before). The
shipped rule and the probe rule (replayed online: the probe on the first sentence, the window rule after
it) are then compared on half B and on the README's 100-item sample.

    python scripts/fit_probe.py --data ../shared/data/factqa_dev.jsonl \\
        --sample results/eval/factqa_dev/results.jsonl --out results/probe \\
        --probe surprisegate/data/probes/SmolLM2-135M-Instruct.Q4_1.gguf.npz
(about 12 minutes on 2 cores; needs scikit-learn, which the minilm extra brings)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from surprisegate.backends import Sampling
from surprisegate.backends.llamacpp import from_llamacpp
from surprisegate.config import Config
from surprisegate.gate.loop import generate
from surprisegate.gate.probe import TriggerProbe
from surprisegate.gate.signals import question_kind
from surprisegate.gate.trigger import TriggerPolicy
from surprisegate.research.grading import grade
from surprisegate.research.labeling import read_items
from surprisegate.research.probe_fit import Logistic, cut_keeping_recall, feature_probe  # shared with calibrate
from surprisegate.research.probe_fit import as_probe as probe_fit_as_probe
from surprisegate.research.threshold_sweep import auroc, precision_recall


class _Recorder:
    """A view of a steerable backend whose sessions keep every step they yield, hidden state included."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self.steps: list = []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def session(self):
        recorder, session = self, self._backend.session()

        class _Session:
            def __getattr__(self, name):
                return getattr(session, name)

            def steps(self, tokens, sampling: Sampling, **kw):
                sampling.hidden = True  # detect mode never asks for them; the probe's features need them
                inner = session.steps(tokens, sampling, **kw)

                def recorded():
                    try:
                        for step in inner:
                            recorder.steps.append(step)
                            yield step
                    finally:
                        inner.close()

                return recorded()

        return _Session()


def replay(
    config: Config, question: str, steps: list, eos: frozenset[int], probe: TriggerProbe | None
) -> tuple[TriggerPolicy, bool]:
    """The policy after a reply's steps, and whether it fired (a trigger records and resets, as detect does)."""
    policy, fired = TriggerPolicy(config, question, "", probe), False
    for n, step in enumerate(steps):
        if step.token in eos:
            fired |= policy.end_of_turn()
            break
        _, crossed = policy.push(n, step.piece.decode("utf-8", "replace"), step.surprise, step.entropy, step.hidden)
        if crossed:
            fired = True
            policy.reset()
    return policy, fired


def collect(items: list[dict], layer: int) -> tuple[list[dict], frozenset[int]]:
    """Each item's detect-mode reply, graded, with its recorded steps."""
    backend = _Recorder(from_llamacpp())
    backend.tap_layer(layer)
    config = Config(mode="detect", max_rounds=0)
    rows, started = [], time.monotonic()
    for n, item in enumerate(items, 1):
        backend.steps = []
        result = generate(backend, item["question"], config, {})
        rows.append(
            {
                "id": item["id"],
                "question": item["question"],
                "reply": result.text,
                "wrong": int(not grade(result.text, item).correct),
                "kind": question_kind(item["question"]),
                "steps": backend.steps,
            }
        )
        if n % 100 == 0:
            print(f"decoded {n}/{len(items)} ({time.monotonic() - started:.0f} s)", flush=True)
    return rows, backend.eos_token_ids


def fit(x: np.ndarray, y: np.ndarray, c: float):
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]
    from sklearn.preprocessing import StandardScaler  # type: ignore[import-untyped]

    scaler = StandardScaler().fit(x)
    return scaler, LogisticRegression(C=c, max_iter=5000).fit(scaler.transform(x), y)


def cross_fitted(x: np.ndarray, y: np.ndarray, c: float, seed: int, folds: int = 5) -> np.ndarray:
    """Each row's score from a model fitted without it."""
    fold = np.random.default_rng(seed).integers(0, folds, len(y))
    out = np.empty(len(y))
    for k in range(folds):
        scaler, model = fit(x[fold != k], y[fold != k], c)
        out[fold == k] = model.decision_function(scaler.transform(x[fold == k]))
    return out


def as_probe(scaler, model, model_name: str, layer: int, kinds: set[str], cut: float) -> TriggerProbe:
    """The fitted scikit-learn pipeline as one probe (research/probe_fit.as_probe folds the standardisation)."""
    fitted = Logistic(scaler.mean_, scaler.scale_, model.coef_[0], float(model.intercept_[0]))
    return probe_fit_as_probe(fitted, model_name, layer, kinds, cut)


def judged_rows(rows, config, eos, layer):
    """(rows whose first sentence was judged, their features, whether a later window crossed)."""
    out, feats, later = [], [], []
    width = next(s.hidden.size for r in rows for s in r["steps"] if s.hidden is not None)
    features = feature_probe(layer, width, {r["kind"] for r in rows})
    for r in rows:
        policy, fired_later = replay(config, r["question"], r["steps"], eos, features)
        if policy.judged is not None:
            out.append(r)
            feats.append(np.concatenate([[policy.judged[0]], policy.judged[1]]))
            later.append(fired_later)  # the feature probe never fires: only a later sentence's window can
    return out, np.array(feats), np.array(later)


def at(fired: np.ndarray, wrong: np.ndarray, mask: np.ndarray) -> dict:
    p, r = precision_recall(fired[mask], wrong[mask])
    return {"precision": round(p, 3), "recall": round(r, 3), "fired": int(fired[mask].sum()), "n": int(mask.sum())}


def fit_and_judge(rows: list[dict], eos: frozenset[int], seed: int, layer: int, c: float, sample: set[str]):
    """Fit the probe on seeded half A, cut it where half A keeps the shipped rule's recall, replay both rules."""
    config = Config(mode="detect")
    half_a = set(random.Random(seed).sample(sorted(r["id"] for r in rows), len(rows) // 2))
    wrong = np.array([r["wrong"] for r in rows])
    in_a = np.array([r["id"] in half_a for r in rows])
    in_sample = np.array([r["id"] in sample for r in rows])
    fired_by = {"shipped": np.array([replay(config, r["question"], r["steps"], eos, None)[1] for r in rows])}
    recall_a = precision_recall(fired_by["shipped"][in_a], wrong[in_a])[1]

    judged, x, later = judged_rows(rows, config, eos, layer)
    j_a = np.array([r["id"] in half_a for r in judged])
    j_y = np.array([r["wrong"] for r in judged])
    # Replies never judged (too short for a window) cannot fire under either rule; they count in the recall.
    need = recall_a * wrong[in_a].sum() / max(1, j_y[j_a].sum())
    cut = cut_keeping_recall(cross_fitted(x[j_a], j_y[j_a], c, seed), later[j_a], j_y[j_a], need)
    scaler, model = fit(x[j_a], j_y[j_a], c)
    from surprisegate.backends.llamacpp import embedded_model_path

    probe = as_probe(scaler, model, embedded_model_path().name, layer, {r["kind"] for r in judged}, cut)
    fired_by["probe"] = np.array([replay(config, r["question"], r["steps"], eos, probe)[1] for r in rows])
    report = {
        "seed": seed,
        "cut": round(cut, 4),
        "shipped recall on half A": round(recall_a, 3),
        "auroc_b": {
            "probe": round(auroc(model.decision_function(scaler.transform(x[~j_a])), j_y[~j_a]), 3),
            "window margin": round(auroc(x[~j_a, 0], j_y[~j_a]), 3),
        },
    }
    masks = {
        "a (the probe fitted here)": in_a,
        "b": ~in_a,
        "sample": in_sample,
        "sample, half-B items": in_sample & ~in_a,
    }
    for rule, fired in fired_by.items():
        report[rule] = {name: at(fired, wrong, mask) for name, mask in masks.items()}
    return probe, report


def markdown(reports: list[dict]) -> str:
    lines = [
        "| seed | AUROC B: probe / window | half B shipped: precision / recall (fired) | half B probe | "
        "sample shipped | sample probe | sample half-B items: shipped / probe |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(d: dict) -> str:
        return f"{d['precision']} / {d['recall']} ({d['fired']})"

    for r in reports:
        s, p = r["shipped"], r["probe"]
        lines.append(
            f"| {r['seed']} | {r['auroc_b']['probe']} / {r['auroc_b']['window margin']} | {cell(s['b'])} | "
            f"{cell(p['b'])} | {cell(s['sample'])} | {cell(p['sample'])} | "
            f"{cell(s['sample, half-B items'])} / {cell(p['sample, half-B items'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="question items (JSONL with question, answers)")
    ap.add_argument("--sample", required=True, help="an eval results.jsonl whose ids are the 100-item sample")
    ap.add_argument("--out", required=True, help="folder for the report")
    ap.add_argument("--probe", required=True, help="where to write the probe fitted on the first seed's half A")
    ap.add_argument("--layer", type=int, default=17, help="layer whose output the probe reads (0-based)")
    ap.add_argument("--c", type=float, default=0.01, help="inverse L2 strength of the logistic regression")
    ap.add_argument("--seeds", default="0,1,2,3", help="seeds of the halves to judge on; the first one ships")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()

    items = [it for it in read_items(args.data, args.limit) if it.get("format", "qa") == "qa"]
    rows, eos = collect(items, args.layer)
    sample = {json.loads(line)["id"] for line in open(args.sample)}
    reports = []
    for n, seed in enumerate(int(s) for s in args.seeds.split(",")):
        probe, report = fit_and_judge(rows, eos, seed, args.layer, args.c, sample)
        reports.append(report | {"layer": args.layer, "c": args.c, "replies": len(rows)})
        print(json.dumps(reports[-1]), flush=True)
        if n == 0:
            Path(args.probe).parent.mkdir(parents=True, exist_ok=True)
            probe.save(args.probe)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit_probe.json").write_text(json.dumps(reports, indent=2))
    (out / "fit_probe.md").write_text(markdown(reports))
    print(markdown(reports))


if __name__ == "__main__":
    sys.exit(main())

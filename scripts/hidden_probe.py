"""Pilot: does a linear probe on SmolLM2's hidden states tell wrong replies from right ones better than the
shipped entropy window? Tuned on seeded half A of the factqa_dev labels, judged on half B (the halves and
the README's 100-item sample of scripts/trigger_features.py).

Each labelled reply is run once more through the transformers backend (the same GGUF, dequantised), teacher
forced, and the residual stream is read at layers 6, 12, 18, 24 and 30 at each position that chose a reply
token. Features per reply: the mean over the whole reply ("all"; post hoc: the loop has it only at the end),
over the 4-token window of highest mean entropy ("window"), and the state that chose the first reply token
("first"). An L2 logistic regression per layer is fitted on half A (scores on A cross-fitted, 5 folds), its
cut set where factqa half A keeps the shipped recall (0.705), and judged on half B and on the sample.

    python scripts/hidden_probe.py --labels labels/factqa_dev --sample results/eval/factqa_dev/results.jsonl \\
        --out results/hidden_probe
(needs the transformers extra and scikit-learn, which the minilm extra brings; about 8 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import trigger_features as tf

from surprisegate.gate.surprise import window_peak
from surprisegate.research.threshold_sweep import auroc, precision_recall

LAYERS = (6, 12, 18, 24, 30)
WINDOW = 4


def reply_states(rows: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """Per reply id: {"all", "window", "first"} -> (layers, hidden) arrays."""
    import torch

    from surprisegate.backends.transformers import from_transformers
    from surprisegate.config import Config
    from surprisegate.gate.prompting import chat_messages

    backend = from_transformers(None)
    system_prompt = Config().system_prompt
    out = {}
    for n, r in enumerate(rows, 1):
        ids = r["token_ids"]
        if not ids:
            continue
        prompt = backend.tokenize(backend.chat_prompt(chat_messages(r["question"], system_prompt)), special=True)
        with torch.inference_mode():
            hidden = backend._model(torch.tensor([prompt + ids]), output_hidden_states=True).hidden_states
        # the state that chose reply token t sits at position len(prompt) + t - 1
        states = torch.stack([hidden[layer][0, len(prompt) - 1 : len(prompt) - 1 + len(ids)] for layer in LAYERS])
        e = np.array(r["entropies"])
        lo = int(np.convolve(e, np.ones(WINDOW) / WINDOW, "valid").argmax()) if len(e) >= WINDOW else 0
        out[r["id"]] = {
            "all": states.mean(1).numpy(),
            "window": states[:, lo : lo + WINDOW].mean(1).numpy(),
            "first": states[:, 0].numpy(),
        }
        if n % 100 == 0:
            print(f"states {n}/{len(rows)}", flush=True)
    return out


def probe_scores(x: np.ndarray, wrong: np.ndarray, half_a: np.ndarray) -> np.ndarray:
    """Decision values: cross-fitted on half A, from the half-A fit on half B."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]
    from sklearn.model_selection import cross_val_predict  # type: ignore[import-untyped]
    from sklearn.pipeline import make_pipeline  # type: ignore[import-untyped]
    from sklearn.preprocessing import StandardScaler  # type: ignore[import-untyped]

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.01, max_iter=3000))
    s = np.zeros(len(x))
    s[half_a] = cross_val_predict(clf, x[half_a], wrong[half_a], cv=5, method="decision_function")
    clf.fit(x[half_a], wrong[half_a])
    s[~half_a] = clf.decision_function(x[~half_a])
    return s


def at_shipped_recall(scores: np.ndarray, wrong: np.ndarray, half_a: np.ndarray, sample: np.ndarray) -> dict:
    cuts = np.sort(scores[half_a])
    cut = next(t for t in cuts if precision_recall(scores[half_a] > t, wrong[half_a])[1] <= tf.SHIPPED_RECALL)

    def judged(mask: np.ndarray) -> dict:
        p, r = precision_recall(scores[mask] > cut, wrong[mask])
        return {"precision": round(p, 3), "recall": round(r, 3), "fired": int((scores[mask] > cut).sum())}

    return {"auroc_b": round(auroc(scores[~half_a], wrong[~half_a]), 3), "b": judged(~half_a), "sample": judged(sample)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", required=True, help="the factqa_dev labels folder")
    ap.add_argument("--sample", required=True, help="an eval results.jsonl whose ids are the 100-item sample")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = tf.load(args.labels)
    states = reply_states(rows)
    rows = [r for r in rows if r["id"] in states]
    sample_ids = {json.loads(line)["id"] for line in open(args.sample)}
    wrong = np.array([0 if r["correct"] else 1 for r in rows])
    half_a = np.array([r["half_a"] for r in rows])
    sample = np.array([r["id"] in sample_ids for r in rows])
    peaks = np.array([window_peak(r["entropies"], WINDOW, "mean", WINDOW) for r in rows])
    results = {"entropy window peak, no per-kind model": at_shipped_recall(peaks, wrong, half_a, sample)}
    results["shipped rule (per-kind model, trigger_features.judge)"] = tf.judge(
        rows, lambda r: window_peak(r["entropies"], WINDOW, "mean", WINDOW), sample_ids
    )
    for feature in ("all", "window", "first"):
        for i, layer in enumerate(LAYERS):
            x = np.stack([states[r["id"]][feature][i] for r in rows]).astype(np.float64)
            name = f"probe on {feature}, layer {layer}"
            results[name] = at_shipped_recall(probe_scores(x, wrong, half_a), wrong, half_a, sample)
            print(name, results[name], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hidden_probe.json").write_text(json.dumps(results, indent=2))
    lines = ["| rule | factqa B AUROC | B precision / recall (fired) | 100-sample precision / recall (fired) |"]
    lines.append("|---|---|---|---|")
    for name, r in results.items():
        b, s = (r["b"], r["sample"]) if "b" in r else (r["factqa_b"], r["sample"])
        auc = r.get("auroc_b", r.get("auroc_factqa_b"))
        lines.append(
            f"| {name} | {auc} | {b['precision']} / {b['recall']} ({b['fired']}) | "
            f"{s['precision']} / {s['recall']} ({s['fired']}) |"
        )
    (out / "hidden_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Can a sharper trigger be built from the per-token signals we have? Tuned on one seeded half, judged on the other.

For each candidate rule the per-kind model of `calibrate` (prior wrong-rate, mean and spread of the window
peak per kind of question) is fitted on half A of every labels folder (random.Random(0) over the sorted
ids), the cut is set where factqa half A keeps the shipped rule's recall (0.705), and the same model and cut
are judged on half B and on the README's factqa 100-item sample. Trigger efficiency at a fixed number of
calls is about precision × (the gate's fix rate ÷ the oracle's), so precision at equal recall is what a
better trigger has to raise.

The last candidates read each token's top-20 alternatives (the labels keep them; their text comes from the
embedded model's vocabulary): a crude semantic entropy that merges alternatives spelling the same word
("Sant" / "Santiago"), or leaves out alternatives that only rephrase (function words, punctuation).

    python scripts/trigger_features.py --labels labels/factqa_dev labels/wikidata labels/arith \\
        --sample results/eval/factqa_dev/results.jsonl --out results/trigger_features
(labels from `surprisegate label --data ../shared/data/<set>.jsonl --out labels/<set> --max-tokens 32`)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from surprisegate.gate.signals import copy_flags, question_kind
from surprisegate.gate.surprise import window_peak
from surprisegate.research.threshold_sweep import (
    BETAS,
    CLOZE_INSTRUCTION,
    auroc,
    cross_validated_scores,
    fit_kind_model,
    kind_scores,
    precision_recall,
)
from surprisegate.text import STOPWORDS, WORD, fold

SHIPPED_RECALL = 0.705  # the shipped rule's recall on factqa half A: candidates are compared at this recall
SENTENCE_END = re.compile(r"[.!?]\s*$")


def load(folder: str) -> list[dict]:
    rows = [json.loads(line) for line in (Path(folder) / "labels.jsonl").open()]
    ids = sorted(r["id"] for r in rows)
    half_a = set(random.Random(0).sample(ids, len(ids) // 2))
    for r in rows:
        cloze = r.get("format") == "cloze"
        r["half_a"] = r["id"] in half_a
        r["kind"] = question_kind(CLOZE_INSTRUCTION.format(question=r["question"]) if cloze else r["question"])
        r["copied"] = copy_flags(r["pieces"], r["question"] + (" " + r["question"] if cloze else ""))
        r["factqa"] = "factqa" in folder
    return rows


def window_features(r: dict, width: int = 4) -> np.ndarray:
    """Per eligible window: mean entropy, mean surprise, copied share, starts after sentence 1, starts at token 0."""
    e, s, c = (np.array(r[k], float) for k in ("entropies", "surprises", "copied"))
    sentence, k = np.zeros(len(e)), 0
    for i, piece in enumerate(r["pieces"]):
        sentence[i] = k
        k += bool(SENTENCE_END.search(piece)) and not piece.rstrip().rstrip(".").isdigit()
    out = [
        (e[lo : i + 1].mean(), s[lo : i + 1].mean(), c[lo : i + 1].mean(), float(sentence[lo] > 0), float(lo == 0))
        for i in range(width - 1, len(e))
        for lo in [i - width + 1]
    ]
    return np.array(out) if out else np.zeros((1, 5))


def peak_of(weights: tuple[float, ...]) -> Callable[[dict], float]:
    w = np.array(weights)
    return lambda r: float((r["windows"] @ w).max())


def skipping(predicate: Callable[[dict, int], bool]) -> Callable[[dict], float]:
    """Mean-entropy W=4 peak over the tokens the predicate keeps."""

    def peak(r: dict) -> float:
        return window_peak([h for i, h in enumerate(r["entropies"]) if predicate(r, i)], 4, "mean", 4)

    return peak


CANDIDATES: dict[str, Callable[[dict], float]] = {
    "entropy mean W=4 (shipped)": peak_of((1, 0, 0, 0, 0)),
    "skip the first token": skipping(lambda r, i: i > 0),
    "skip tokens copied from the question": skipping(lambda r, i: not r["copied"][i]),
    "entropy + surprise": peak_of((0.5, 0.5, 0, 0, 0)),
}
for a, b, c, d in itertools.product((0, 0.5), (0, -1, -2), (0, -1, -2), (0, -1)):
    if (a, b, c, d) != (0, 0, 0, 0):
        CANDIDATES[f"entropy {a:+}·surprise {b:+}·copied {c:+}·after-sentence-1 {d:+}·first-window"] = peak_of(
            (1, a, b, c, d)
        )


def vocabulary() -> list[str]:
    """Every token's text in the embedded model (the labels' top-20 ids are its ids)."""
    from llama_cpp import Llama

    from surprisegate.backends.llamacpp import embedded_model_path

    model = Llama(str(embedded_model_path()), vocab_only=True, verbose=False)
    return [model.detokenize([i]).decode("utf-8", "replace") for i in range(model.n_vocab())]


def word_groups(top: list, vocab: list[str]) -> list[tuple[str, float]]:
    """Top-k alternatives merged when one's folded, stripped text is a prefix of another's: (text, mass)."""
    groups: list[list] = []
    for token, logprob in top:
        key, p = fold(vocab[token]).strip(), math.exp(logprob)
        for g in groups:
            if key and g[0] and (key.startswith(g[0]) or g[0].startswith(key)):
                g[1] += p
                break
        else:
            groups.append([key, p])
    return [(k, m) for k, m in groups]


def entropy_bits(masses: list[float]) -> float:
    total = sum(masses)
    return -sum(m / total * math.log2(m / total) for m in masses if m > 0) if total > 0 else 0.0


def alternative_signals(r: dict, vocab: list[str]) -> dict[str, list[float]]:
    """Per token: entropy over merged spellings (+ the missing mass), and over content-word alternatives only."""
    merged, content = [], []
    for top in r["top_logprobs"]:
        groups = word_groups(top, vocab)
        missing = max(0.0, 1.0 - sum(m for _, m in groups))
        merged.append(entropy_bits([m for _, m in groups] + [missing]))
        words = [m for k, m in groups if WORD.findall(k) and not all(w in STOPWORDS for w in WORD.findall(k))]
        content.append(entropy_bits(words))
    return {"merged": merged, "content": content}


def alternatives_peak(name: str, skip_copied: bool = False) -> Callable[[dict], float]:
    def peak(r: dict) -> float:
        values = r["alternatives"][name]
        if skip_copied:
            values = [v for v, c in zip(values, r["copied"], strict=True) if not c]
        return window_peak(values, 4, "mean", 4)

    return peak


ALTERNATIVE_CANDIDATES = {
    "top-20 spellings merged (crude semantic entropy)": alternatives_peak("merged"),
    "top-20 spellings merged, copied tokens skipped": alternatives_peak("merged", True),
    "top-20 content-word alternatives only": alternatives_peak("content"),
    "top-20 content-word alternatives only, copied tokens skipped": alternatives_peak("content", True),
}


def judge(rows: list[dict], peak: Callable[[dict], float], sample: set[str]) -> dict:
    peaks = np.array([peak(r) for r in rows])
    wrong = np.array([0 if r["correct"] else 1 for r in rows])
    kinds = [r["kind"] for r in rows]
    a = np.array([r["half_a"] for r in rows])
    fq = np.array([r["factqa"] for r in rows])
    kinds_a = [k for k, keep in zip(kinds, a, strict=True) if keep]
    cv, beta = max((auroc(cross_validated_scores(peaks[a], wrong[a], kinds_a, b), wrong[a]), b) for b in BETAS)
    scores = kind_scores(peaks, kinds, fit_kind_model(peaks[a], wrong[a], kinds_a), beta)
    cuts = np.sort(scores[a & fq])
    recalls = [precision_recall(scores[a & fq] > t, wrong[a & fq])[1] for t in cuts]
    cut = next(t for t, r in zip(cuts, recalls, strict=True) if r <= SHIPPED_RECALL)
    in_sample = np.array([r["id"] in sample for r in rows])

    def at_cut(mask: np.ndarray) -> dict:
        p, r = precision_recall(scores[mask] > cut, wrong[mask])
        return {"precision": round(p, 3), "recall": round(r, 3), "fired": int((scores[mask] > cut).sum())}

    return {
        "cv_auroc_a": round(cv, 3),
        "auroc_b": round(auroc(scores[~a], wrong[~a]), 3),
        "auroc_factqa_b": round(auroc(scores[~a & fq], wrong[~a & fq]), 3),
        "factqa_a": at_cut(a & fq),
        "factqa_b": at_cut(~a & fq),
        "sample": at_cut(in_sample),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", nargs="+", required=True, help="labels folders (factqa first)")
    ap.add_argument("--sample", required=True, help="an eval results.jsonl whose ids are the 100-item sample")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [r for folder in args.labels for r in load(folder)]
    for r in rows:
        r["windows"] = window_features(r)
    candidates = dict(CANDIDATES)
    if any(r.get("top_logprobs") for r in rows):  # labels made with top-20 logprobs
        vocab = vocabulary()
        for r in rows:
            r["alternatives"] = alternative_signals(r, vocab)
        candidates.update(ALTERNATIVE_CANDIDATES)
    sample = {json.loads(line)["id"] for line in open(args.sample)}
    results = {}
    for i, (name, peak) in enumerate(candidates.items(), 1):
        results[name] = judge(rows, peak, sample)
        print(f"[{i}/{len(candidates)}] {name}: {results[name]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trigger_features.json").write_text(json.dumps(results, indent=2))
    lines = [
        "| rule (per-kind model fitted on half A) | cv AUROC A | AUROC B | factqa B AUROC | factqa A prec/rec | "
        "factqa B prec/rec | 100-sample prec/rec (fired) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in sorted(results.items(), key=lambda kv: -kv[1]["factqa_b"]["precision"]):
        fa, fb, sm = r["factqa_a"], r["factqa_b"], r["sample"]
        lines.append(
            f"| {name} | {r['cv_auroc_a']} | {r['auroc_b']} | {r['auroc_factqa_b']} | {fa['precision']}/{fa['recall']} "
            f"| {fb['precision']}/{fb['recall']} | {sm['precision']}/{sm['recall']} ({sm['fired']}) |"
        )
    (out / "trigger_features.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

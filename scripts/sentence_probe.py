"""Pilot (issue 25): does a probe on the model's hidden state judge a paragraph's sentences better than the
sentence threshold (the highest entropy on a sentence's claim tokens)? Fitted on seeded half A of the
long-form dev labels, judged on half B, which nothing here reads while fitting.

Every prompt is decoded in detect mode (its `off` reply) at `--max-tokens`; prompt + reply is then fed once
more in one pass with a few candidate layers recorded (`sequence_states`): step k's state is the row at the
position whose logits chose reply token k, as the loop would see it online. Each reply is replayed sentence
by sentence through the loop's own `SentenceJudge` (infinite bar: it judges every sentence and fires on
none). A judged sentence with a claim token that speaks of what was asked is a candidate (the others can
never fire); it is labelled `wrong` when it states an asked relation without its gold answer.

Features: the doubt's margin over the shipped threshold (unpenalised, as the first-sentence probe's window
margin) and the mean state over the sentence's tokens ("sentence") or its claim tokens ("claim"). The layer
is the first-sentence probe's where one ships (`--layer first`, the default: the runtime taps one layer,
which then serves both scopes), or chosen among a few through the stack (`--layer candidates`, also where
no first-sentence probe ships), or given; the layer and the L2 strength by 5-fold cross-validated AUROC on
half A; the cut on half A's
cross-fitted scores catches as many of half A's wrong sentences as the threshold does. Half B: the probe at
that cut against the threshold, sentences fired (each one a grounding call) by label, and a paired bootstrap
of the sentences fired at equal recall. `--write` saves the half-A fit as the probe the loop loads in
sentence scope (probe = auto: surprisegate/data/probes/<model file>.sentence.npz).

    python scripts/sentence_probe.py --data ../shared/data/longform_dev.jsonl --out results/paragraphs/sentence_probe \
        --write surprisegate/data/probes/SmolLM2-135M-Instruct.Q4_1.gguf.sentence.npz
(about 8 minutes on 2 cores with the embedded model; `--model PATH.gguf` for another)
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fit_sentence_threshold import halves, sentence_label

from surprisegate.config import Config
from surprisegate.gate.claims import claim_token_flags
from surprisegate.gate.loop import generate
from surprisegate.gate.probe import SENTENCE_KIND, resolve_probe
from surprisegate.gate.trigger import SentenceJudge, sentence_value
from surprisegate.research.labeling import read_items
from surprisegate.research.probe_fit import (
    L2_STRENGTHS,
    as_probe,
    candidate_layers,
    cross_fitted,
    fit_logistic,
    prompt_tokens,
    step_states,
)
from surprisegate.research.threshold_sweep import auroc
from surprisegate.runtime import load_backend

FEATURES = ("sentence", "claim")


def decode(items: list[dict], config: Config, backend, cache: Path) -> dict[str, dict]:
    """Detect-mode replies with their tokens and signals, cached in `cache` (resumable)."""
    done = {}
    if cache.exists():
        done = {r["id"]: r for r in map(json.loads, cache.read_text().splitlines())}
    todo = [it for it in items if it["id"] not in done]
    with cache.open("a") as fh:
        for n, item in enumerate(todo, 1):
            result = generate(backend, item["question"], config).result
            assert result is not None
            row = {
                "id": item["id"],
                "token_ids": list(result.token_ids),
                "pieces": [backend.token_bytes(t).decode("utf-8", "replace") for t in result.token_ids],
                "surprise": result.token_surprises,
                "entropy": result.token_entropies,
            }
            fh.write(json.dumps(row) + "\n")
            done[item["id"]] = row
            print(f"\rdecoded {n}/{len(todo)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return done


def judged_spans(question: str, pieces: list[str], values: list[float], max_tokens: int) -> list[tuple]:
    """(start, end, text, doubt) of every judged sentence of a reply, as the loop's judge sees them."""
    judge = SentenceJudge(question, math.inf, max_tokens)
    out = []
    for i, (piece, value) in enumerate(zip(pieces, values, strict=True)):
        before = len(judge.settled)
        judge.push(i, piece, value)
        if len(judge.settled) > before:
            out.append((*judge.judged, judge.doubt))
    before = len(judge.settled)
    judge.end_of_turn()
    if len(judge.settled) > before:
        out.append((*judge.judged, judge.doubt))
    return out


def sentence_rows(items, replies, backend, config: Config, layers: list[int]) -> list[dict]:
    """One row per candidate sentence: id, half, label, doubt and per layer its two mean states."""
    half_a = halves([it["id"] for it in items], 0)
    rows = []
    for n, item in enumerate(items, 1):
        r = replies[item["id"]]
        if not r["token_ids"]:
            continue
        prompt = prompt_tokens(backend, item, config)
        states = backend.sequence_states([prompt + r["token_ids"]], layers)[0]
        steps = step_states(states, len(prompt), len(r["token_ids"]))
        assert steps is not None, item["id"]
        values = [sentence_value(config.signal, s, h) for s, h in zip(r["surprise"], r["entropy"], strict=True)]
        for start, end, text, doubt in judged_spans(item["question"], r["pieces"], values, config.max_tokens):
            if doubt == -math.inf:
                continue
            flags = np.array(claim_token_flags(r["pieces"][start:end], item["question"]))
            row = {"id": item["id"], "half": "A" if item["id"] in half_a else "B", "doubt": doubt}
            row["label"] = sentence_label(text, item["claims"])
            for layer in layers:
                span = steps[layer][start:end]
                row[("sentence", layer)] = span.mean(0)
                row[("claim", layer)] = span[flags].mean(0)
            rows.append(row)
        print(f"\rstates {n}/{len(items)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def probe_layers(backend, layer: str) -> list[int]:
    """The layers to choose among: a number given; 'first': the layer of the model's first-sentence probe where
    one ships (one tap then serves both scopes: a server's replies may be short or paragraphs, and the runtime
    taps one layer); 'candidates', or 'first' with none shipped: a few through the stack."""
    if layer.isdigit():
        return [int(layer)]
    first = resolve_probe("auto", backend.model_id) if layer == "first" else None
    return [first.layer] if first is not None else candidate_layers(backend.n_layer)


def cached_rows(path: Path, layers: list[int], compute) -> list[dict]:
    """The candidate rows, kept in `path` between runs (states of every layer: not for the repository)."""
    if path.exists():
        rows = pickle.loads(path.read_bytes())
        if rows and all(("sentence", layer) in rows[0] for layer in layers):
            return rows
    rows = compute()
    path.write_bytes(pickle.dumps(rows))
    return rows


def features(rows: list[dict], feature: str, layer: int, threshold: float) -> np.ndarray:
    return np.array([np.concatenate([[r["doubt"] - threshold], r[(feature, layer)]]) for r in rows])


def cut_catching(scores: np.ndarray, wrong: np.ndarray, count: int) -> float:
    """The highest cut at which score > cut still fires on `count` wrong sentences."""
    ordered = np.sort(scores[wrong == 1])[::-1]
    return float(ordered[count - 1]) - 1e-9 if count else math.inf


def fired(scores: np.ndarray, cut: float, labels: list[str]) -> dict:
    fire = scores > cut
    out = {"fired": int(fire.sum()), "sentences": len(labels)}
    for label in ("wrong", "right", "none"):
        of = np.array([x == label for x in labels])
        out[label], out[f"{label}_fired"] = int(of.sum()), int((fire & of).sum())
    return out


def fewer_fired_rate(probe: np.ndarray, doubt: np.ndarray, wrong: np.ndarray, threshold: float, n: int = 1000) -> float:
    """Over paired bootstrap resamples of half B's sentences: how often the probe, cut to catch as many
    wrong sentences as the threshold does in the resample, fires on fewer sentences than it."""
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(n):
        pick = rng.integers(0, len(wrong), len(wrong))
        caught = int(((doubt[pick] > threshold) & (wrong[pick] == 1)).sum())
        cut = cut_catching(probe[pick], wrong[pick], caught)
        wins += int((probe[pick] > cut).sum()) < int((doubt[pick] > threshold).sum())
    return wins / n


def recall_sweep(cv_a, doubt_a, ya, scores_b, doubt_b, a, b) -> list[dict]:
    """Both rules cut on half A to catch a share of its wrong sentences, then judged on half B."""
    labels_b = [r["label"] for r in b]
    out = []
    for share in (0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
        count = math.ceil(share * ya.sum())
        out.append(
            {
                "half_a_recall": share,
                "probe_b": fired(scores_b, cut_catching(cv_a, ya, count), labels_b),
                "threshold_b": fired(doubt_b, cut_catching(doubt_a, ya, count), labels_b),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--layer", default="first", help="first | candidates | a layer number (see probe_layers)")
    ap.add_argument("--write", default="", help="save the probe fitted on half A here (a .npz the loop reads)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = read_items(args.data)
    config = Config(mode="detect", max_tokens=args.max_tokens, model=args.model, claim_scope="sentence", probe="off")
    backend = load_backend(config)
    layers = probe_layers(backend, args.layer)
    replies = decode(items, config, backend, out / "replies.jsonl")
    rows = cached_rows(out / "states.pkl", layers, lambda: sentence_rows(items, replies, backend, config, layers))
    threshold = config.sentence_threshold
    a = [r for r in rows if r["half"] == "A"]
    b = [r for r in rows if r["half"] == "B"]
    ya = np.array([r["label"] == "wrong" for r in a], dtype=float)
    yb = np.array([r["label"] == "wrong" for r in b], dtype=float)
    doubt_a, doubt_b = np.array([r["doubt"] for r in a]), np.array([r["doubt"] for r in b])
    table = []
    for feature in FEATURES:
        for layer in layers:
            for c in L2_STRENGTHS:
                cv = auroc(cross_fitted(features(a, feature, layer, threshold), ya, c), ya)
                table.append({"feature": feature, "layer": layer, "c": c, "auroc_cv_a": round(cv, 4)})
    # the loop reads the mean over the sentence's tokens; the claim-token mean is measured beside it only
    best = max((t for t in table if t["feature"] == "sentence"), key=lambda t: t["auroc_cv_a"])
    xa = features(a, best["feature"], best["layer"], threshold)
    xb = features(b, best["feature"], best["layer"], threshold)
    caught_a = int(((doubt_a > threshold) & (ya == 1)).sum())
    cut = cut_catching(cross_fitted(xa, ya, best["c"]), ya, caught_a)
    fit = fit_logistic(xa, ya, best["c"], free=1)
    scores_b = fit.score(xb)
    report = {
        "threshold": threshold,
        "candidates": {"A": len(a), "B": len(b)},
        "chosen": best,
        "auroc_b": {"probe": round(auroc(scores_b, yb), 4), "threshold_doubt": round(auroc(doubt_b, yb), 4)},
        "auroc_cv_a_doubt": round(auroc(doubt_a, ya), 4),
        "half_a_threshold": fired(doubt_a, threshold, [r["label"] for r in a]),
        "half_b_threshold": fired(doubt_b, threshold, [r["label"] for r in b]),
        "half_b_probe": fired(scores_b, cut, [r["label"] for r in b]),
        "half_b_probe_fewer_fired_at_equal_recall": fewer_fired_rate(scores_b, doubt_b, yb, threshold),
        "recall_sweep": recall_sweep(cross_fitted(xa, ya, best["c"]), doubt_a, ya, scores_b, doubt_b, a, b),
        "sweep": table,
    }
    (out / "sentence_probe.json").write_text(json.dumps(report, indent=2))
    if args.write:
        probe = as_probe(fit, Path(backend.model_id).name, best["layer"], {SENTENCE_KIND}, cut)
        probe.save(args.write)
        print(f"sentence probe (layer {best['layer']}, cut {cut:.4f}) written to {args.write}", file=sys.stderr)
    print(json.dumps({k: v for k, v in report.items() if k != "sweep"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Each method's trigger signal on the same replies, for detection (AUROC for a wrong reply) and tuning.

For every item: the greedy reply on the transformers backend (what `off` writes there, and the first
generation of every peer), graded, and each trigger's signal for it: DRAGIN's largest RIND value, ETC's
largest trend x attention value and its trend alone, FLARE's lowest token probability, the question-level
mean and max token entropy (Moskvoretskii et al. 2025), SeaKR's EigenScore over k samples, and the gate's
window rule (the largest mean entropy over its window, in bits, minus the question kind's threshold; the kinds'
thresholds were fitted on factqa_dev, these items included, so `window-plain`, the same peak without them, is
the gate's signal untouched by these items).
Each fires when its signal is above a threshold (FLARE: below), so one reply pass tunes them all.

Then, on seeded halves of the items (scripts/fit_sentence_threshold.halves): AUROC per signal on each half,
and each threshold chosen on half A by the design's rule (the highest precision at recall >= 0.5), applied to
half B. Writes OUT/signals.jsonl (resumable) and OUT/summary.json.

Long-form items (paragraphs, field `claims`) are judged sentence by sentence: a unit is a sentence stating an
asked claim (the grading rule's `sentence_label`: wrong or right), each method over the sentences it judges
(DRAGIN and ETC: spaCy's, line by line for ETC as its loop generates; FLARE: Punkt's, its look-ahead cut; the
gate: its own SentenceJudge's), its value the largest it compares there (FLARE: the lowest probability).
The question-level rules (the entropy rule, SeaKR) decide a whole reply: each sentence carries its reply's value.

    .venv/bin/python scripts/peer_signals.py --data ../shared/data/factqa_dev.jsonl --sample 100 \\
        --out results/peers/smollm2/factqa_signals [--model PATH.gguf] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_sentence_threshold import halves, judged_sentences, sentence_label

from surprisegate.config import Config
from surprisegate.gate.signals import question_kind
from surprisegate.gate.trigger import sentence_value
from surprisegate.research.evaluate import _punkt
from surprisegate.research.grading import grade
from surprisegate.research.labeling import prompt_for, read_items
from surprisegate.research.longform import is_longform
from surprisegate.research.peers import dragin, etc, nlp
from surprisegate.research.peers.common import Costs, PeerModel, join_nonempty, prompt_ids
from surprisegate.research.peers.run import _etc_blocks, seakr_uncertainty
from surprisegate.research.threshold_sweep import auroc

# signal name -> True when a higher value means more doubt (FLARE's lowest probability is the other way)
SIGNALS = {
    "dragin": True,
    "etc": True,
    "etc-trend": True,
    "flare": False,
    "entropy-mean": True,
    "entropy-max": True,
    "seakr": True,
    "gate-window": True,
    "window-plain": True,
    "gate-sentence": True,
}
MIN_RECALL = 0.5


def _finite_peak(values) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return max(finite) if finite else 0.0


def _rind_sentences(model: PeerModel, ids, pieces, scores, text: str, costs: Costs) -> list[tuple[str, float]]:
    """(sentence, the largest value rind_check compares there) for each sentence of `text` (spaCy's split)."""
    if not ids:
        return []
    signals = dragin.rind_signals(pieces, ids, scores, model.last_layer_attention(ids, costs), model.space_token)
    return [
        (split[sid], _finite_peak(values))
        for sid, split, _, _, values in dragin.rind_values(text, signals, nlp.sentences)
    ]


def _rind_peak(model: PeerModel, ids, pieces, scores, text: str, costs: Costs) -> float:
    """The largest value rind_check compares, over every sentence (it fires above a threshold iff this does)."""
    return max((v for _, v in _rind_sentences(model, ids, pieces, scores, text, costs)), default=0.0)


def _etc_peaks(model: PeerModel, question: str, config: Config, gen, costs: Costs) -> tuple[float, float]:
    """ETC's first generation stops at a line break: greedy, so it is the reply cut after its first "\\n".
    Returns the largest value etc_check compares (trend x attention) and the largest trend of any word."""
    # Each piece as text: "Ċ" on a byte-level tokenizer, "<0x0A>" or "\n" on others.
    cut = next((i + 1 for i, p in enumerate(gen.pieces) if "\n" in model.tokens_to_string([p])), len(gen.ids))
    ids, pieces, scores = gen.ids[:cut], gen.pieces[:cut], gen.scores[:cut]
    ended = bool(ids) and ids[-1] in model.eos_ids
    tokens = pieces[:-1] if ended else pieces
    if len(pieces) <= 1:
        return 0.0, 0.0
    blocks = _etc_blocks(model, question, config, "")
    new = etc.Block(model.tokens_to_string(tokens), tokens, model.etc_word_ranges(tokens))
    attention = model.last_layer_attention(gen.prompt_ids + ids, costs)
    signals = etc.etc_signals(attention, [*blocks, new], scores, nlp.content_words(new.text), model.tokens_to_string)
    sentences = nlp.sentences(new.text)
    weighted = (v for *_, values in etc.etc_values(signals, new, sentences, model.tokens_to_string) for v in values)
    trend = np.array(signals.mt_s2, dtype=np.float64)
    return _finite_peak(weighted), float(np.nanmax(trend)) if len(trend) else 0.0


def _window_peak(entropy_bits: np.ndarray, window: int, threshold: float) -> float:
    if len(entropy_bits) < window:
        return float(entropy_bits.mean() - threshold) if len(entropy_bits) else -threshold
    means = np.convolve(entropy_bits, np.ones(window) / window, mode="valid")
    return float(means.max() - threshold)


@dataclass
class GreedyReply:
    """An item's greedy reply (the end token left out) with what every signal reads of it."""

    question: str
    prompt: list[int]
    gen: Any
    ids: list[int]
    pieces: list[str]
    scores: np.ndarray
    reply: str
    entropy: np.ndarray  # nats, per token
    chosen: list[float]  # each chosen token's probability
    costs: Costs
    started: float


def greedy_reply(model: PeerModel, item: dict, config: Config) -> GreedyReply:
    started = time.monotonic()
    question, prefix = prompt_for(item)
    costs = Costs()
    prompt = prompt_ids(model, question, config, [], prefix)
    gen = model.generate(prompt, config.max_tokens, costs)
    n = gen.reply_len
    ids, pieces, scores = gen.ids[:n], gen.pieces[:n], gen.scores[:n]
    entropy = dragin.token_entropies(scores) if n else np.zeros(0)
    chosen = [float(np.exp(s[t] - s.max()) / np.exp(s - s.max()).sum()) for s, t in zip(scores, ids, strict=True)]
    return GreedyReply(question, prompt, gen, ids, pieces, scores, model.decode(ids), entropy, chosen, costs, started)


def item_signals(model: PeerModel, item: dict, config: Config, samples: int) -> dict:
    r = greedy_reply(model, item, config)
    question, gen, costs, prompt, reply = r.question, r.gen, r.costs, r.prompt, r.reply
    ids, pieces, scores, entropy, chosen, n = r.ids, r.pieces, r.scores, r.entropy, r.chosen, len(r.ids)
    kind = question_kind(question)
    threshold = config.kind_thresholds.get(kind, config.threshold)
    etc_peak, trend_peak = _etc_peaks(model, question, config, gen, costs)
    return {
        "id": item["id"],
        "question": item["question"],
        "reply": reply,
        "correct": grade(reply, item).correct,
        "signals": {
            "dragin": _rind_peak(model, ids, pieces, scores, reply, costs),
            "etc": etc_peak,
            "etc-trend": trend_peak,
            "flare": min(chosen) if chosen else 1.0,
            "entropy-mean": float(entropy.mean()) if n else 0.0,
            "entropy-max": float(entropy.max()) if n else 0.0,
            "seakr": seakr_uncertainty(model, prompt, samples, config.max_tokens, costs, seed=0) if samples else None,
            "gate-window": _window_peak(entropy / math.log(2), config.window, threshold),
            "window-plain": _window_peak(entropy / math.log(2), config.window, 0.0),
        },
        "tokens": n,
        "seconds": round(time.monotonic() - r.started, 2),
    }


def token_spans(ends: list[int]) -> list[tuple[int, int]]:
    """Each token's [start, end) in the reply from the lengths of its decoded prefixes."""
    return [(0 if i == 0 else ends[i - 1], end) for i, end in enumerate(ends)]


def lowest_per_span(values: list[float], tokens: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[float]:
    """The lowest token value overlapping each character span (1.0, FLARE's "no doubt", where none does)."""
    out = []
    for a, b in spans:
        inside = [v for v, (s, e) in zip(values, tokens, strict=True) if s < b and e > a]
        out.append(min(inside) if inside else 1.0)
    return out


def claim_units(pairs, claims: list[dict]) -> list[list]:
    """[sentence, value, label] for the sentences that state an asked claim (label wrong or right)."""
    units = [[text, float(value), sentence_label(text, claims)] for text, value in pairs]
    return [u for u in units if u[2] != "none"]


def _etc_sentences(
    model: PeerModel, question: str, config: Config, gen, costs: Costs
) -> list[tuple[str, float, float]]:
    """ETC's values line by line, as its loop generates a paragraph (each generation stops at a line break and
    the next one starts from the text kept): (sentence, largest trend x attention, largest trend)."""
    out: list[tuple[str, float, float]] = []
    text, start = "", 0
    while start < len(gen.ids):
        cut = next(
            (i + 1 for i in range(start, len(gen.ids)) if "\n" in model.tokens_to_string([gen.pieces[i]])),
            len(gen.ids),
        )
        ids, pieces, scores = gen.ids[start:cut], gen.pieces[start:cut], gen.scores[start:cut]
        tokens = pieces[:-1] if ids[-1] in model.eos_ids else pieces
        if len(pieces) > 1:  # a lone line break is their "empty" generation
            blocks = _etc_blocks(model, question, config, text)
            prompt = [i for b in blocks for i in model.tokenizer.convert_tokens_to_ids(b.tokens)]
            new = etc.Block(model.tokens_to_string(tokens), tokens, model.etc_word_ranges(tokens))
            attention = model.last_layer_attention(prompt + ids, costs)
            signals = etc.etc_signals(
                attention, [*blocks, new], scores, nlp.content_words(new.text), model.tokens_to_string
            )
            trend = np.array(signals.mt_s2, dtype=np.float64)
            split = nlp.sentences(new.text)
            for wl, wr, weighted in etc.etc_values(signals, new, split, model.tokens_to_string):
                words = new.tokens[new.ranges[wl][0] : new.ranges[wr - 1][1] + 1]
                out.append((model.tokens_to_string(words).strip(), _finite_peak(weighted), _finite_peak(trend[wl:wr])))
            text = join_nonempty(text, model.decode([i for i in ids if i not in model.eos_ids]))
        start = cut
    return out


def sentence_signals(model: PeerModel, item: dict, config: Config, samples: int) -> dict:
    """A long-form item's reply and, per method, its claim sentences with their values (see the docstring)."""
    r = greedy_reply(model, item, config)
    question, gen, costs, prompt, reply = r.question, r.gen, r.costs, r.prompt, r.reply
    ids, entropy, chosen, n = r.ids, r.entropy, r.chosen, len(r.ids)
    tokens = token_spans([len(model.decode(ids[: i + 1])) for i in range(n)])
    spacy_split = nlp.sentences(reply)
    claims = item["claims"]
    punkt_spans = list(_punkt().span_tokenize(reply))
    flare = lowest_per_span(chosen, tokens, punkt_spans)
    bits = [
        sentence_value(config.signal, -math.log2(max(p, 1e-300)), h / math.log(2))
        for p, h in zip(chosen, entropy, strict=True)
    ]
    gate = judged_sentences(question, [model.decode([i]) for i in ids], bits, config.max_tokens)
    etc_rows = _etc_sentences(model, question, config, gen, costs)
    whole = {
        "entropy-mean": float(entropy.mean()) if n else 0.0,
        "entropy-max": float(entropy.max()) if n else 0.0,
        "seakr": seakr_uncertainty(model, prompt, samples, config.max_tokens, costs, seed=0) if samples else None,
    }
    units = {
        "dragin": claim_units(_rind_sentences(model, r.ids, r.pieces, r.scores, r.reply, r.costs), claims),
        "etc": claim_units([(s, w) for s, w, _ in etc_rows], claims),
        "etc-trend": claim_units([(s, t) for s, _, t in etc_rows], claims),
        "flare": claim_units([(reply[a:b], v) for (a, b), v in zip(punkt_spans, flare, strict=True)], claims),
        "gate-sentence": claim_units([(s, d if math.isfinite(d) else -1.0) for s, d in gate], claims),
    }
    for name, value in whole.items():
        if value is not None:
            units[name] = claim_units([(s, value) for s in spacy_split], claims)
    return {
        "id": item["id"],
        "question": item["question"],
        "reply": reply,
        "units": units,
        "tokens": n,
        "seconds": round(time.monotonic() - r.started, 2),
    }


def choose_threshold(values: np.ndarray, wrong: np.ndarray, higher: bool) -> float | None:
    """The cut with the highest precision at recall >= 0.5 (ties: the higher recall) over the values seen."""
    best, best_key = None, None
    for cut in np.unique(values):
        fired = values >= cut if higher else values <= cut
        if not fired.any() or not wrong.any():
            continue
        precision = float((fired & wrong).sum() / fired.sum())
        recall = float((fired & wrong).sum() / wrong.sum())
        if recall < MIN_RECALL:
            continue
        key = (precision, recall)
        if best_key is None or key > best_key:
            best, best_key = float(cut), key
    return best


def labelled(row: dict, name: str) -> list[tuple[float, bool]]:
    """(value, wrong) for each unit a signal is judged on: the reply, or a long-form reply's claim sentences."""
    if "units" in row:
        return [(float(v), label == "wrong") for _, v, label in row["units"].get(name, [])]
    value = row["signals"].get(name)
    return [] if value is None else [(float(value), not row["correct"])]


def summarise(rows: list[dict], half_a: set[str]) -> dict:
    out: dict = {"items": len(rows), "signals": {}}
    if rows and "units" not in rows[0]:
        out["off_accuracy"] = float(np.mean([r["correct"] for r in rows]))
    for name, higher in SIGNALS.items():
        entry: dict = {}
        for half in ("A", "B"):
            pairs = [p for r in rows if (r["id"] in half_a) == (half == "A") for p in labelled(r, name)]
            pairs = [(v, w) for v, w in pairs if np.isfinite(v)]
            if not pairs:
                continue
            v = np.array([p[0] for p in pairs], dtype=np.float64)
            wrong = np.array([p[1] for p in pairs])
            score = v if higher else -v
            entry[f"units_{half}"], entry[f"wrong_{half}"] = len(pairs), int(wrong.sum())
            entry[f"auroc_{half}"] = round(auroc(score, wrong), 4) if 0 < wrong.sum() < len(wrong) else None
            if half == "A":
                cut = choose_threshold(v, wrong, higher)
                entry["threshold_from_A"] = cut
            elif entry.get("threshold_from_A") is not None:
                cut = entry["threshold_from_A"]
                fired = v >= cut if higher else v <= cut
                entry["B_fires"] = int(fired.sum())
                entry["B_precision"] = round(float((fired & wrong).sum() / fired.sum()), 4) if fired.any() else None
                entry["B_recall"] = round(float((fired & wrong).sum() / wrong.sum()), 4) if wrong.any() else None
        if entry:
            out["signals"][name] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--samples", type=int, default=8, help="SeaKR's k (theirs: 20); 0 leaves SeaKR out")
    ap.add_argument("--max-tokens", type=int, default=None, help="the reply's length (long-form: 160, as eval runs)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--write-half-b",
        type=Path,
        default=None,
        help="write half B (no threshold was chosen on it) to this JSONL file for `eval --data`, and stop",
    )
    args = ap.parse_args()
    from surprisegate.backends.transformers import from_transformers
    from surprisegate.config import ConfigLayers
    from surprisegate.runtime import model_config

    items = read_items(args.data)
    if args.sample and args.sample < len(items):
        items = random.Random(args.seed).sample(items, args.sample)  # the same items as eval --sample
    if args.write_half_b:
        half_a = halves([it["id"] for it in items], args.seed)
        rows = [it for it in items if it["id"] not in half_a]
        args.write_half_b.write_text("".join(json.dumps(it) + "\n" for it in rows))
        print(f"wrote {len(rows)} half-B items to {args.write_half_b}", file=sys.stderr)
        return
    backend = from_transformers(args.model)
    layers = ConfigLayers(overrides={"max_tokens": args.max_tokens} if args.max_tokens else {})
    config, _ = model_config(layers, backend, lambda m: print(m, file=sys.stderr))
    model = PeerModel(backend)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "signals.jsonl"
    done = {json.loads(line)["id"] for line in path.read_text().splitlines()} if path.exists() else set()
    with path.open("a") as f:
        for i, item in enumerate(items):
            if item["id"] in done:
                continue
            if is_longform(item):
                row = sentence_signals(model, item, config, args.samples)
                done_note = f"claim sentences={len(row['units']['dragin'])}"
            else:
                row = item_signals(model, item, config, args.samples)
                done_note = f"correct={row['correct']}"
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"[{i + 1}/{len(items)}] {item['id']} {row['seconds']}s {done_note}", file=sys.stderr)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ids = {it["id"] for it in items}
    rows = [r for r in rows if r["id"] in ids]
    for r in (r for r in rows if "signals" in r):  # rows written before window-plain was recorded: the same peak
        kind_cut = config.kind_thresholds.get(question_kind(r["question"]), config.threshold)
        r["signals"].setdefault("window-plain", r["signals"]["gate-window"] + kind_cut)
    summary = summarise(rows, halves([r["id"] for r in rows], args.seed)) | {
        "model": backend.model_id.rsplit("/", 1)[-1],
        "data": Path(args.data).name,
        "seakr_samples": args.samples,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

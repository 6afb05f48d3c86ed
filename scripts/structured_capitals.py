"""Grounded structured output on the factqa capital questions (issue 44): the same items answered as plain text
and as JSON under the schema {country, capital}, each with the gate off and intervening (memory = factkb).

    python scripts/structured_capitals.py [--model GGUF] [--llama-server BINARY] --sample 100 --out DIR

The user turn is the question as the dataset words it; the schema reaches the model only as the grammar
(`response_format`), as LangChain's `with_structured_output` and the OpenAI SDK's `parse` send it, unless
`--instruction` puts a system turn before it. A JSON reply is graded on its `capital` value with the dataset's
grading rule; one that does not parse counts wrong. Rows: results.jsonl (resumable); summary.json and a table on
stdout: accuracy per arm, the JSON gain as a share of the plain-text gain, regressions, parse rate, calls, and
the same for the sample's first 20 items (whose SmolLM2 replies were read while the JSON trigger rule was
developed) apart from the other 80.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from surprisegate.config import ConfigLayers  # noqa: E402
from surprisegate.gate.events import Done  # noqa: E402
from surprisegate.gate.loop import stream  # noqa: E402
from surprisegate.gate.structured import ResponseFormat, parsed  # noqa: E402
from surprisegate.research.grading import grade  # noqa: E402
from surprisegate.runtime import arms_for, assemble  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
    "required": ["country", "capital"],
    "additionalProperties": False,
}
FORMAT = ResponseFormat("json_schema", SCHEMA, "country_capital", strict=True)
ARMS = (("text", "off"), ("text", "intervene"), ("json", "off"), ("json", "intervene"))


def capital_items(data: Path, sample: int, seed: int) -> list[dict]:
    rows = [json.loads(line) for line in data.open()]
    items = [r for r in rows if r.get("relation") == "capital"]
    return random.Random(seed).sample(items, min(sample, len(items)))


def answer(runtime, item: dict, shape: str, mode: str, instruction: str, max_tokens: int) -> dict:
    config = dataclasses.replace(runtime.config, mode=mode, max_tokens=max_tokens)
    messages = [{"role": "user", "content": item["question"]}]
    if instruction and shape == "json":
        messages.insert(0, {"role": "system", "content": instruction})
    output = FORMAT if shape == "json" else None
    started = time.monotonic()
    done = None
    for event in stream(runtime.backend, messages, config, arms_for(config, runtime.arms), output=output):
        if isinstance(event, Done):
            done = event
    assert done is not None
    result = done.result
    rounds = [r.to_dict() if hasattr(r, "to_dict") else r for r in result.rounds]
    row = {
        "id": item["id"],
        "shape": shape,
        "mode": mode,
        "reply": result.reply,
        "finish_reason": result.finish_reason,
        "calls": sum(1 for r in rounds if r.get("arms")),
        "rewound": sum(1 for r in rounds if r.get("action") == "rewound"),
        "tokens": result.n_tokens,
        "seconds": round(time.monotonic() - started, 3),
    }
    if shape == "json":
        value = parsed(result.reply)
        row["parses"] = value is not None
        capital = value.get("capital") if isinstance(value, dict) else None
        row["correct"] = isinstance(capital, str) and grade(capital, item).correct
    else:
        row["correct"] = grade(result.reply, item).correct
    return row


def summary(rows: list[dict], items: list[dict]) -> dict:
    by = {(r["id"], r["shape"], r["mode"]): r for r in rows}
    ids = [it["id"] for it in items if all((it["id"], s, m) in by for s, m in ARMS)]
    out: dict = {"items": len(ids)}
    for shape, mode in ARMS:
        group = [by[(i, shape, mode)] for i in ids]
        out[f"{shape}_{mode}"] = {
            "accuracy": round(sum(r["correct"] for r in group) / max(len(group), 1), 3),
            "calls": sum(r["calls"] for r in group),
            "rewound": sum(r["rewound"] for r in group),
            **({"parses": sum(r["parses"] for r in group)} if shape == "json" else {}),
        }
    for shape in ("text", "json"):
        off, on = (sum(by[(i, shape, m)]["correct"] for i in ids) for m in ("off", "intervene"))
        fixed = sum(by[(i, shape, "intervene")]["correct"] and not by[(i, shape, "off")]["correct"] for i in ids)
        broke = sum(by[(i, shape, "off")]["correct"] and not by[(i, shape, "intervene")]["correct"] for i in ids)
        out[f"{shape}_gain"] = {"correct_off": off, "correct_intervene": on, "fixed": fixed, "regressions": broke}
    text_gain = out["text_gain"]["correct_intervene"] - out["text_gain"]["correct_off"]
    json_gain = out["json_gain"]["correct_intervene"] - out["json_gain"]["correct_off"]
    out["json_gain_share_of_text_gain"] = round(json_gain / text_gain, 3) if text_gain else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2)")
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/factqa_dev.jsonl"))
    ap.add_argument("--memory", default=str(ROOT / "factkb.sqlite"))
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--instruction", default="", help="a system turn before the question (JSON replies only)")
    ap.add_argument("--read-while-tuning", type=int, default=20, help="the sample's first N were read while tuning")
    ap.add_argument(
        "--llama-server",
        default=None,
        metavar="BINARY",
        help="decode through llama.cpp's server (this binary, started on the model): its own grammar sampler",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.llama_server:
        from surprisegate.backends.llama_server import LlamaServerProcess
        from surprisegate.backends.llamacpp import embedded_model_path

        model = Path(args.model) if args.model else embedded_model_path()
        with LlamaServerProcess(model, binary=Path(args.llama_server), n_ctx=4096, parallel=1) as process:
            run(args, {"backend": process.uri})
    else:
        run(args, {"model": args.model} if args.model else {})


def run(args: argparse.Namespace, backend: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "results.jsonl"
    rows = [json.loads(line) for line in rows_path.open()] if rows_path.exists() else []
    done = {(r["id"], r["shape"], r["mode"]) for r in rows}
    items = capital_items(Path(args.data), args.sample, args.seed)
    overrides = {"mode": "intervene"} | backend
    runtime = assemble(ConfigLayers(overrides=overrides), memory=args.memory)
    started = time.monotonic()
    with rows_path.open("a") as sink:
        for n, item in enumerate(items, 1):
            for shape, mode in ARMS:
                if (item["id"], shape, mode) in done:
                    continue
                row = answer(runtime, item, shape, mode, args.instruction, args.max_tokens)
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            print(f"[{n}/{len(items)}] {item['id']} {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    read = items[: args.read_while_tuning]  # the rule's development looked at these replies (SmolLM2's)
    result = summary(rows, items) | {
        "halves": {
            f"read_while_tuning (the sample's first {len(read)})": summary(rows, read),
            f"not_read (the other {len(items) - len(read)})": summary(rows, items[len(read) :]),
        },
        "model": runtime.backend.model_id,
        "backend": runtime.backend.name,
        "sample": args.sample,
        "seed": args.seed,
        "instruction": args.instruction,
        "response_format": FORMAT.receipt() | {"schema": SCHEMA},
        "config": runtime.config.to_dict(),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=2))


if __name__ == "__main__":
    main()

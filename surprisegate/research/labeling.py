"""`surprisegate label`: run the model in detect mode over QA items, grade each reply, keep per-token signals.

Output: DIR/labels.jsonl, one object per item, appended durably. A rerun skips items already labelled,
so a crash or Ctrl-C loses at most the item in flight.

Each row keeps, per reply token, the top-20 logprobs (`top_logprobs`: [token id, natural-log prob] pairs,
most likely first): what an inference server or cloud API streams, so `calibrate --top-k K` can measure
the signals as they would be computed there. Keeping them only reads the logits: replies are unchanged.

Through a chat API (no token ids, no assistant prefix): a cloze item is asked as its instruction alone, the
pieces are the streamed tokens' text, `top_logprobs` stays empty and `entropies` are the estimates the
backend made from the stream's top k, exactly what its trigger sees online.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from ..config import Config
from ..errors import InputError
from ..gate.receipts import ReceiptWriter, read_receipts
from .grading import grade

CLOZE_INSTRUCTION = "Complete the sentence: {question}"
LABEL_TOP_LOGPROBS = 20  # the most any server sends (OpenAI, vLLM; xAI 8): calibrate --top-k K <= 20


def read_items(path: str | Path, limit: int | None = None) -> list[dict]:
    """Evaluation items from JSONL; a malformed line is an error naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--data={str(p)!r} does not exist; pass a JSONL file of items with question and answers")
    items = []
    with open(p, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{p}:{line_no} is not valid JSON ({err.msg}); fix or remove that line") from None
            if not isinstance(item, dict) or "question" not in item or ("answers" not in item and "claims" not in item):
                raise InputError(f"{p}:{line_no} needs 'question' and 'answers' (or long-form 'claims') fields")
            item.setdefault("id", f"{p.stem}-{line_no}")
            items.append(item)
            if limit and len(items) >= limit:
                break
    return items


def prompt_for(item: dict, can_continue: bool = True) -> tuple[str, str]:
    """(user question, assistant prefix): cloze items are continued as the start of the reply, not asked;
    a backend that cannot continue an assistant turn (a chat API) gets the instruction alone."""
    if item.get("format") == "cloze":
        return CLOZE_INSTRUCTION.format(question=item["question"]), item["question"] if can_continue else ""
    return item["question"], ""


def label_item(backend, item: dict, config: Config) -> dict:
    from ..backends import SteerableBackend, VocabSize
    from ..gate.loop import generate

    steerable = isinstance(backend, SteerableBackend)
    question, prefix = prompt_for(item, can_continue=steerable)
    started = time.monotonic()
    result = generate(backend, question, config, {}, assistant_prefix=prefix)
    extra = result.receipt.get("extra", {})
    graded = grade(result.text, item)
    ids = extra.get("token_ids") or []
    pieces = [backend.token_bytes(t).decode("utf-8", "replace") for t in ids] if steerable else None
    return {
        "id": item["id"],
        "question": item["question"],
        "format": item.get("format", "qa"),
        "category": item.get("category"),
        "relation": item.get("relation"),
        "answers": item["answers"],
        "reply": result.text,
        "correct": graded.correct,
        "grade_rule": graded.rule,
        "token_ids": ids,
        "pieces": pieces if pieces is not None else extra.get("token_pieces") or [],
        "surprises": extra.get("token_surprises", []),
        "entropies": extra.get("token_entropies", []),
        "top_logprobs": extra.get("token_top_logprobs", []),
        # bounds the entropy estimated from top-k
        "vocab_size": backend.n_vocab if isinstance(backend, VocabSize) else None,
        "finish_reason": result.finish_reason,
        "seconds": round(time.monotonic() - started, 3),
    }


def done_ids(out_dir: Path) -> set[str]:
    path = out_dir / "labels.jsonl"
    if not path.exists():
        return set()
    return {r["id"] for r in read_receipts(path) if "id" in r}


# Settings that change what the model writes; a resumed run must not mix replies made under others.
REPLY_KEYS = ("backend", "model", "system_prompt", "max_tokens", "temperature", "seed", "n_ctx")
# What a labels folder records per token beside the reply: rows made with other values must not be mixed
# (an old folder without top logprobs would give `calibrate --top-k` rows it cannot use).
LABEL_KEYS = REPLY_KEYS + ("top_logprobs",)
# What a run folder records beside the config, compared when present.
_RUN_KEYS = ("data", "model", "arms", "flare_theta", "flare_mask_below", "flare_pre_retrieval")


def guard_resume(path: Path, meta: dict, compare: tuple[str, ...] | None = None) -> None:
    """Write `meta` to `path`, refusing when a previous run there used different settings.

    `meta` is {"data", "model", "config": {...}}; `compare` limits the config keys that must agree
    (None: all but `threads`, which changes speed, not output).
    """
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = None
        if isinstance(old, dict):
            keys = compare if compare is not None else tuple(k for k in meta["config"] if k != "threads")
            changed = [k for k in keys if old.get("config", {}).get(k) != meta["config"].get(k)]
            changed += [k for k in _RUN_KEYS if k in meta and old.get(k) != meta.get(k)]
            if changed:
                diffs = ", ".join(f"{k}: {_was(old, k)!r} -> {_was(meta, k)!r}" for k in changed)
                raise InputError(
                    f"--out={str(path.parent)!r} holds a run made with other settings ({diffs}); "
                    "pass a new --out, or delete that folder to start over"
                )
    path.write_text(json.dumps(meta, indent=2))


def _was(meta: dict, key: str):
    return meta.get(key) if key in _RUN_KEYS else meta.get("config", {}).get(key)


class LabelRecorder(Protocol):
    """Something that watches each labelled item's decode (probe_fit.StateRecorder keeps its hidden states)."""

    def start(self, item: dict) -> None: ...

    def keep(self, record: dict) -> None: ...


def label(
    data: str | Path,
    out_dir: str | Path,
    backend,
    config: Config,
    limit: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    recorder: LabelRecorder | None = None,
) -> dict:
    """Label the items not yet in OUT/labels.jsonl (resumable). `progress(done, total, note)` counts the whole
    job: called once before any work with the items already on disk, then after each item labelled.
    `recorder` sees each item's decode: `start(item)` before it, `keep(record)` after it is written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = read_items(data, limit)
    config = config.replace(mode="detect", top_logprobs=LABEL_TOP_LOGPROBS)
    guard_resume(
        out / "label_config.json",
        {"data": str(Path(data).resolve()), "config": config.to_dict(), "model": backend.model_id},
        compare=LABEL_KEYS,
    )
    finished = done_ids(out)
    todo = [it for it in items if it["id"] not in finished]
    writer = ReceiptWriter(out / "labels.jsonl", private=False)
    already = len(items) - len(todo)
    if progress:  # where the job starts: the items on disk count toward the total, not toward the rate
        progress(already, len(items), "")
    correct = 0
    for i, item in enumerate(todo, 1):
        if recorder:
            recorder.start(item)
        record = label_item(backend, item, config)
        writer.append(record)
        if recorder:
            recorder.keep(record)
        correct += record["correct"]
        if progress:
            progress(already + i, len(items), f"acc {correct / i:.2f}")
    return {
        "items": len(items),
        "labelled_now": len(todo),
        "already_done": already,
        "out": str(out / "labels.jsonl"),
    }


def iter_labels(label_dirs: list[str | Path]) -> Iterator[dict]:
    for d in label_dirs:
        path = Path(d) / "labels.jsonl" if Path(d).is_dir() else Path(d)
        if not path.exists():
            raise InputError(
                f"--labels={str(d)!r} holds no labels.jsonl; run: surprisegate label --data FILE --out {d}"
            )
        yield from read_receipts(path)

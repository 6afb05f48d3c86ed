"""Re-grade saved eval replies with the current grading rule and show which grades moved.

Reads one or more `results.jsonl` files written by `surprisegate eval` (fields id, mode, question, reply,
correct, ...), looks each row's item up by id in --data (for answers, category, numeric_tolerance) and
grades the reply again with surprisegate.research.grading.grade. Prints, per file and mode, the rows that moved
(right->wrong, wrong->right) with the question and the reply's first sentence under the previous and the
current sentence rule. --write rewrites the `correct` field in place (temp file + rename); summary.json
and report.md of that folder are not rebuilt.

    python scripts/regrade.py --data ../shared/data/factqa_dev.jsonl results/eval/factqa_dev/results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from surprisegate.gate.receipts import dumps_line
from surprisegate.research.grading import first_sentence, grade
from surprisegate.research.labeling import read_items

# The sentence stop before "USA." ended a sentence and Inc/Ltd/Co/Corp/No/months were abbreviations;
# only used to show the "before" sentence.
PREVIOUS_SENTENCE_END = re.compile(r"(?<![A-Z])(?<!\b(?:St|Mt|Dr|Mr|Ms|Jr|Sr|vs))(?<!\bMrs)[.!?](?=\s|$)")


def previous_first_sentence(text: str) -> str:
    text = text.strip()
    m = PREVIOUS_SENTENCE_END.search(text)
    return text[: m.end()] if m else text


def regrade_file(path: Path, items: dict[str, dict], write: bool = False) -> dict[str, list[dict]]:
    """Per mode, the rows whose grade moved (each with id, question, before, after, was, now).

    Rows whose id is not in `items` and lines that are not JSON are kept as they are (key "?" counts them).
    """
    lines = path.read_bytes().split(b"\n")
    moved: dict[str, list[dict]] = {}
    out: list[bytes] = []
    for raw in lines:
        try:
            row = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except (UnicodeDecodeError, ValueError):
            row = None
        item = items.get(row.get("id")) if isinstance(row, dict) else None
        if item is None or "reply" not in row:
            if raw.strip():
                moved.setdefault("?", []).append({"id": row.get("id") if isinstance(row, dict) else None})
            out.append(raw)
            continue
        reply = row.get("reply") or ""
        was = bool(row.get("correct"))
        now = grade(reply, item).correct
        moved.setdefault(row.get("mode", "?"), [])
        if now != was:
            moved[row.get("mode", "?")].append(
                {
                    "id": row["id"],
                    "question": row.get("question", item.get("question")),
                    "was": was,
                    "now": now,
                    "before": previous_first_sentence(reply),
                    "after": first_sentence(reply),
                }
            )
            row["correct"] = now
            out.append(dumps_line(row).rstrip("\n").encode("utf-8"))
        else:
            out.append(raw)
    if write and any(moved.get(m) for m in moved if m != "?"):
        _replace_atomically(path, b"\n".join(out))
    return moved


def _replace_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="results.jsonl file(s) of `surprisegate eval`")
    ap.add_argument("--data", action="append", required=True, help="items JSONL (repeatable), looked up by id")
    ap.add_argument("--write", action="store_true", help="rewrite the `correct` field of each file in place")
    args = ap.parse_args(argv)
    items = {it["id"]: it for d in args.data for it in read_items(d)}
    total = 0
    for path in args.results:
        moved = regrade_file(path, items, write=args.write)
        print(f"== {path}")
        unknown = moved.pop("?", [])
        if unknown:
            print(
                f"  {len(unknown)} line(s) kept as they are: not JSON, or no item with that id in --data",
                file=sys.stderr,
            )
        for mode, rows in moved.items():
            down = [r for r in rows if r["was"]]
            up = [r for r in rows if not r["was"]]
            total += len(rows)
            print(f"  {mode}: {len(rows)} changed (right->wrong {len(down)}, wrong->right {len(up)})")
            for r in down + up:
                print(f"    {'right->wrong' if r['was'] else 'wrong->right'} {r['id']}: {r['question']}")
                print(f"      before: {r['before']!r}")
                print(f"      after:  {r['after']!r}")
    print(f"{total} grade(s) changed" + (", written" if args.write and total else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Retrieval quality of the memory store's three search modes, side by side.

    python -m surprisegate.research.eval_memory [QUESTIONS.jsonl] [PASSAGES.jsonl]

Builds a store from the passages (default: shared/data/factkb_passages.jsonl) in a temporary folder
and asks every question (default: shared/data/factqa_dev.jsonl). A question counts as found when one
of the first k hits has `source` equal to the row's "kb_id".
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..store.sqlite import SEARCH_MODES, SQLiteMemory

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
DEFAULT_QUESTIONS = SHARED_DATA / "factqa_dev.jsonl"
DEFAULT_PASSAGES = SHARED_DATA / "factkb_passages.jsonl"


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def recall_at_k(store, rows: Sequence[dict], k: int = 5, mode: str = "hybrid") -> float:
    """Share of `rows` whose gold passage (row["kb_id"]) is among the first `k` hits for row["question"]."""
    if not rows:
        return 0.0
    found = sum(
        any(hit.source == row["kb_id"] for hit in store.search(row["question"], k=k, mode=mode)) for row in rows
    )
    return found / len(rows)


def evaluate(store, rows: Sequence[dict], modes: Sequence[str] = SEARCH_MODES) -> list[dict]:
    """One row per mode: recall@1, recall@5 and the mean search time."""
    table = []
    for mode in modes:
        start = time.perf_counter()
        at_5 = recall_at_k(store, rows, k=5, mode=mode)
        seconds = time.perf_counter() - start
        table.append(
            {
                "mode": mode,
                "recall@1": recall_at_k(store, rows, k=1, mode=mode),
                "recall@5": at_5,
                "ms_per_query": 1000 * seconds / max(1, len(rows)),
            }
        )
    return table


def format_table(table: list[dict], n_questions: int, n_passages: int) -> str:
    lines = [
        f"{n_questions} questions over {n_passages} passages",
        f"{'mode':<8} {'recall@1':>9} {'recall@5':>9} {'ms/query':>9}",
    ]
    lines += [
        f"{row['mode']:<8} {row['recall@1']:>9.3f} {row['recall@5']:>9.3f} {row['ms_per_query']:>9.2f}" for row in table
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    questions = Path(args[0]) if args else DEFAULT_QUESTIONS
    passages = Path(args[1]) if len(args) > 1 else DEFAULT_PASSAGES
    for path in (questions, passages):
        if not path.is_file():
            print(f"{path} does not exist; pass QUESTIONS.jsonl PASSAGES.jsonl", file=sys.stderr)
            return 2
    rows = read_jsonl(questions)
    with tempfile.TemporaryDirectory() as folder, SQLiteMemory(Path(folder) / "eval.sqlite", create=True) as store:
        store.add_jsonl(passages)
        print(format_table(evaluate(store, rows), len(rows), store.count()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

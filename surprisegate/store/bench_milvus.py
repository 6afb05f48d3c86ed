"""Milvus memory-store latency on the memory benchmark's synthetic passages and questions.

    python -m surprisegate.store.bench_milvus [N_PASSAGES] [QUERIES] [URI]

`bench_milvus(n_passages, queries, progress)` builds the same seeded world as `bench_memory` and times
it; `bench_milvus_on(passages, questions, progress)` has the shape `bench_memory(milvus_bench=...)`
calls. The store is a milvus-lite file in a temporary folder unless `uri` names a Milvus server
(milvus://HOST:19530/COLLECTION), where the collection is made fresh and dropped afterwards.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .bench_memory import PROGRESS_EVERY, SEED, TARGET_P95_MS, _in_batches, _noop, _time_searches, synthetic_world


def bench_milvus(
    n_passages: int = 100_000,
    queries: int = 200,
    progress: Callable[[str], None] = _noop,
    uri: str | None = None,
    seed: int = SEED,
) -> dict:
    """p50/p95/p99 search latency (ms, k=5 with a claim as context, as `MemoryArm` asks) and build time
    of a Milvus store of `n_passages` synthetic passages, per search mode."""
    passages, questions = synthetic_world(n_passages, seed)
    asked = random.Random(seed + 1).sample(questions, min(queries, len(questions)))  # as bench_memory picks
    return bench_milvus_on(passages, asked, progress, uri=uri)


def bench_milvus_on(
    passages: list[dict[str, str]],
    questions: list[dict[str, str]],
    progress: Callable[[str], None] = _noop,
    uri: str | None = None,
) -> dict:
    """Store `passages`, then time one search per question in each mode the store offers."""
    from .open import open_memory

    with tempfile.TemporaryDirectory(prefix="surprisegate-bench-milvus-") as folder:
        store_uri = uri or f"milvus-lite:{Path(folder) / 'bench.db'}#bench"
        with open_memory(store_uri, create=True) as store:
            if store.count():
                raise ValueError(f"uri={store_uri!r} already holds passages; name a new collection to benchmark")
            try:
                start = time.perf_counter()
                for batch in _in_batches(passages, PROGRESS_EVERY):
                    store.add_passages(batch)
                    progress(f"milvus: {store.count():,}/{len(passages):,} passages stored")
                build_s = time.perf_counter() - start
                start = time.perf_counter()
                store.search(questions[0]["question"], k=5, context=questions[0]["claim"])
                first_search_s = time.perf_counter() - start
                stats = store.stats()
                by_mode = {}
                for mode in stats["search_modes"]:
                    progress(f"milvus: {len(questions)} {mode} searches")
                    by_mode[mode] = _time_searches(store, questions, mode)
            finally:
                if uri is not None:  # a server keeps what it is given: leave it as it was
                    store._client.drop_collection(store.collection)
    mode = "hybrid" if "hybrid" in by_mode else "bm25"
    chosen = by_mode[mode]
    return {
        "p50_ms": chosen["p50_ms"],
        "p95_ms": chosen["p95_ms"],
        "p99_ms": chosen["p99_ms"],
        "mode": mode,
        "engine": _engine(stats["backend"]),
        "n_passages": stats["passages"],
        "build_s": round(build_s, 2),
        "first_search_s": round(first_search_s, 3),
        "recall@5": chosen["recall@5"],
        "meets_target": chosen["p95_ms"] <= TARGET_P95_MS,
        "embedder": stats["embedder"],
        "by_mode": by_mode,
    }


def _engine(backend: str) -> str:
    """Which engine answered: milvus-lite 2.x embeds the Milvus server; 3.x is a pure-Python rewrite."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{backend} {version('milvus-lite') if backend == 'milvus-lite' else ''}".strip()
    except PackageNotFoundError:
        return backend


def main(argv: list[str] | None = None) -> int:
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    n_passages = int(args[0]) if args else 100_000
    queries = int(args[1]) if len(args) > 1 else 200
    uri = args[2] if len(args) > 2 else None
    result = bench_milvus(n_passages, queries, progress=lambda line: print(line, file=sys.stderr), uri=uri)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
from collections.abc import Callable
from pathlib import Path

from .bench_memory import SEED, _noop, fill_and_warm, latency_summary, synthetic_world, time_modes


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
    from ..store.open import open_memory

    with tempfile.TemporaryDirectory(prefix="surprisegate-bench-milvus-") as folder:
        store_uri = uri or f"milvus-lite:{Path(folder) / 'bench.db'}#bench"
        with open_memory(store_uri, create=True) as store:
            if store.count():
                raise ValueError(f"uri={store_uri!r} already holds passages; name a new collection to benchmark")
            try:
                build_s, first_search_s = fill_and_warm(store, passages, questions[0], "milvus", progress)
                stats = store.stats()
                by_mode = time_modes(store, questions, stats["search_modes"], "milvus", progress)
            finally:
                if uri is not None:  # a server keeps what it is given: leave it as it was
                    store._client.drop_collection(store.collection)
    mode = "hybrid" if "hybrid" in by_mode else "bm25"
    return latency_summary(by_mode, mode, build_s, first_search_s, stats) | {"engine": _engine(stats["backend"])}


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

"""Memory-store latency at scale: build a 100,000-passage store, time `search()` the way the arm calls it.

The passages are templated fact sentences about synthetic entities (countries, cities, people,
companies, rivers, mountains) whose names are made of syllables, so word frequencies look like a real
knowledge base: "capital", "city" and "population" are common, each name is rare. Everything comes
from one seeded generator, so runs are comparable. Queries are questions about stored entities, asked
with a (often wrong) claim as `context`, as `MemoryArm` asks them.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SEED = 20240531
SYLLABLES = (
    "ka lo mir ta ven dor sha ri bel zan qua ol tre mon vi sar ne gal thu ren pa lis cor ath el bru fin ja mok "
    "wen ul sto ber nix ar pel dan ho kri su tam ye gor lu fa zel om bi rak"
).split()
NAME_ENDINGS = ["", "", "", "ia", "land", "stan", "burg", "ton", "ville", "or", "ar", "esh"]
CONTINENTS = ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]
JOBS = "engineer teacher nurse architect baker pilot lawyer farmer chemist librarian carpenter journalist".split()
INDUSTRIES = "shipping mining software textile brewing insurance aerospace fishing publishing railway".split()
SEAS = ["Northern Sea", "Amber Sea", "Gulf of Sarn", "Eastern Ocean", "Lake Veltra", "Bay of Kors"]

TARGET_P95_MS = 20.0
PROGRESS_EVERY = 10_000  # passages per ingest call, and so per progress line

# Share of the passages per entity kind; countries are few, as in the world.
MIX = {"country": 0.01, "city": 0.30, "person": 0.34, "company": 0.15, "river": 0.10, "mountain": 0.10}


def _noop(_: str) -> None:
    pass


class _Names:
    """Unique syllable names from one seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def __call__(self) -> str:
        while True:
            syllables = self.rng.choices(SYLLABLES, k=self.rng.randint(2, 3))
            name = ("".join(syllables) + self.rng.choice(NAME_ENDINGS)).capitalize()
            if name not in self.used:
                self.used.add(name)
                return name


def synthetic_world(n_passages: int, seed: int = SEED) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(passages, questions): `n_passages` fact passages and, per passage, one question whose gold
    source is that passage, with a plausible claim (right or wrong) to pass as context."""
    rng = random.Random(seed)
    name = _Names(rng)
    counts = {kind: max(1, int(share * n_passages)) for kind, share in MIX.items()}
    counts["person"] += n_passages - sum(counts.values())  # the rounding remainder
    countries = [name() for _ in range(counts["country"])]
    cities = [name() for _ in range(counts["city"])]
    company_kinds = ["Works", "Group", "Holdings", "Lines", "Labs"]
    companies = [f"{name()} {rng.choice(company_kinds)}" for _ in range(counts["company"])]
    rivers = [name() for _ in range(counts["river"])]
    passages: list[dict[str, str]] = []
    questions: list[dict[str, str]] = []

    def add(kind: str, title: str, text: str, question: str, claim: str) -> None:
        source = f"{kind}:{len(passages)}"
        passages.append({"source": source, "title": title, "text": text})
        questions.append({"source": source, "question": question, "claim": claim})

    for country in countries:
        capital, other = rng.sample(cities, 2)
        currency = name()
        add(
            "country",
            country,
            f"{country} is a country in {rng.choice(CONTINENTS)}. The capital of {country} is {capital}. "
            f"The currency of {country} is the {currency} crown. "
            f"The population of {country} is about {rng.randint(10**5, 10**8):,}.",
            f"What is the capital of {country}?",
            f"The capital of {country} is {other}",
        )
    for city in cities:
        country = rng.choice(countries)
        add(
            "city",
            city,
            f"{city} is a city in {country} with a population of about {rng.randint(2000, 5 * 10**6):,}. "
            f"It lies on the {rng.choice(rivers)} river.",
            f"In which country is the city of {city}?",
            f"{city} is a city in {rng.choice(countries)}",
        )
    for _ in range(counts["person"]):
        first, last = name(), name()
        birthplace = rng.choice(cities)
        add(
            "person",
            f"{first} {last}",
            f"{first} {last} was born in {birthplace} in {rng.randint(1920, 2005)}. "
            f"{first} works as {_article(rng.choice(JOBS))} at {rng.choice(companies)}.",
            f"Where was {first} {last} born?",
            f"{first} {last} was born in {rng.choice(cities)}",
        )
    for company in companies:
        boss = f"{name()} {name()}"
        add(
            "company",
            company,
            f"{company} is {_article(rng.choice(INDUSTRIES))} company founded in {rng.randint(1850, 2020)} "
            f"and based in {rng.choice(cities)}. Its chief executive is {boss}.",
            f"Who runs {company}?",
            f"The chief executive of {company} is {boss}",
        )
    for river in rivers:
        add(
            "river",
            f"{river} river",
            f"The {river} river is {rng.randint(20, 4000):,} km long and flows through {rng.choice(countries)} "
            f"into the {rng.choice(SEAS)}.",
            f"How long is the {river} river?",
            f"The {river} river is {rng.randint(20, 4000)} km long",
        )
    for _ in range(counts["mountain"]):
        mountain = name()
        add(
            "mountain",
            f"Mount {mountain}",
            f"Mount {mountain} rises {rng.randint(300, 8800):,} m above sea level in the {name()} range of "
            f"{rng.choice(countries)}.",
            f"How high is Mount {mountain}?",
            f"Mount {mountain} is {rng.randint(300, 8800)} m high",
        )
    return passages, questions


def bench_memory(
    n_passages: int = 100_000,
    queries: int = 200,
    progress: Callable[[str], None] = _noop,
    milvus_bench: Callable[[list[dict], list[dict], Callable[[str], None]], dict] | None = None,
    seed: int = SEED,
) -> dict:
    """Build a SQLite store of `n_passages` synthetic passages in a temporary folder and time
    `queries` hybrid searches (k=5, with a claim as context, as `MemoryArm` searches).

    `milvus_bench(passages, questions, progress)`, when given, runs the same passages and questions
    against Milvus and its dict fills the "milvus" slot.
    """
    from ..store.sqlite import SEARCH_MODES, SQLiteMemory

    passages, questions = synthetic_world(n_passages, seed)
    asked = random.Random(seed + 1).sample(questions, min(queries, len(questions)))
    result: dict = {"benchmark": "memory", "target": "p95 <= 20 ms", "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="surprisegate-bench-") as folder:
        with SQLiteMemory(Path(folder) / "memory.sqlite", create=True) as store:
            build_s, first_search_s = fill_and_warm(store, passages, asked[0], "sqlite", progress)
            by_mode = time_modes(
                store, asked, ("hybrid", *(m for m in SEARCH_MODES if m != "hybrid")), "sqlite", progress
            )
            stats = store.stats()
        result["sqlite"] = latency_summary(by_mode, "hybrid", build_s, first_search_s, stats) | {
            "file_bytes": stats["file_bytes"]
        }
    result["milvus"] = milvus_bench(passages, asked, progress) if milvus_bench is not None else None
    return result


def fill_and_warm(store, passages: list[dict], first: dict[str, str], label: str, progress) -> tuple[float, float]:
    """Store the passages in batches, then run one search (it loads the embedder and the vectors).

    Returns (seconds to store, seconds of that first search); shared by every store's benchmark.
    """
    start = time.perf_counter()
    for batch in _in_batches(passages, PROGRESS_EVERY):
        store.add_passages(batch)
        progress(f"{label}: {store.count():,}/{len(passages):,} passages stored")
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    store.search(first["question"], k=5, context=first["claim"])
    return build_s, time.perf_counter() - start


def time_modes(store, asked: list[dict[str, str]], modes, label: str, progress) -> dict:
    by_mode = {}
    for mode in modes:
        progress(f"{label}: {len(asked)} {mode} searches")
        by_mode[mode] = _time_searches(store, asked, mode)
    return by_mode


def latency_summary(by_mode: dict, mode: str, build_s: float, first_search_s: float, stats: dict) -> dict:
    """The headline numbers of one store: latency and recall in `mode`, with every mode under by_mode."""
    chosen = by_mode[mode]
    return {
        "p50_ms": chosen["p50_ms"],
        "p95_ms": chosen["p95_ms"],
        "p99_ms": chosen["p99_ms"],
        "mode": mode,
        "n_passages": stats["passages"],
        "build_s": round(build_s, 2),
        "first_search_s": round(first_search_s, 3),
        "recall@5": chosen["recall@5"],
        "meets_target": chosen["p95_ms"] <= TARGET_P95_MS,
        "embedder": stats["embedder"],
        "by_mode": by_mode,
    }


def _time_searches(store, asked: list[dict[str, str]], mode: str) -> dict:
    seconds: list[float] = []
    found = 0
    for question in asked:
        start = time.perf_counter()
        hits = store.search(question["question"], k=5, context=question["claim"], mode=mode)
        seconds.append(time.perf_counter() - start)
        found += any(hit.source == question["source"] for hit in hits)
    seconds.sort()
    return {
        "p50_ms": round(1000 * _percentile(seconds, 0.50), 2),
        "p95_ms": round(1000 * _percentile(seconds, 0.95), 2),
        "p99_ms": round(1000 * _percentile(seconds, 0.99), 2),
        "mean_ms": round(1000 * statistics.fmean(seconds), 2),
        "recall@5": round(found / len(asked), 4),
    }


def main() -> int:
    import json
    import sys

    print(json.dumps(bench_memory(progress=lambda line: print(line, file=sys.stderr)), indent=2))
    return 0


def _in_batches(passages: list[dict[str, str]], size: int) -> Iterator[list[dict[str, str]]]:
    for start in range(0, len(passages), size):
        yield passages[start : start + size]


def _percentile(sorted_values: list[float], share: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(share * len(sorted_values)) - 1))
    return sorted_values[index]


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


if __name__ == "__main__":
    raise SystemExit(main())

"""The peers as `eval` modes: their names, default thresholds and the one call evaluate makes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ...errors import InputError
from .common import DOCS_PER_RETRIEVAL
from .run import (
    FIX_LENGTH,
    PeerOutcome,
    run_dragin,
    run_entropy_rule,
    run_etc,
    run_fixed_retrieval,
    run_seakr,
    run_single_retrieval,
)

# Defaults from their own configs: DRAGIN 1.0 (0.6-1.5 across theirs), ETC 1.3 (config.json), SeaKR -6.0.
# The entropy rule has no published value for this model; 1.5 nats is a placeholder to tune.
DEFAULT_THRESHOLDS = {"dragin": 1.0, "etc": 1.3, "etc-trend": 1.3, "seakr": -6.0, "entropy-rule": 1.5}
SEAKR_SAMPLES = 8  # theirs is 20; fewer here to fit CPU runs (reported with every run)


# Each mode's loop. DRAGIN's own cheap baselines (SR-RAG, FL-RAG, FS-RAG under their method names) retrieve
# without a trigger.
RUNNERS: dict[str, Callable[..., PeerOutcome]] = {
    "dragin": run_dragin,
    "etc": run_etc,
    "etc-trend": partial(run_etc, use_attention=False),
    "seakr": partial(run_seakr, samples=SEAKR_SAMPLES),
    "entropy-rule": run_entropy_rule,
    "single-retrieval": run_single_retrieval,
    "fix-length-retrieval": partial(run_fixed_retrieval, fix_length=FIX_LENGTH),
    "fix-sentence-retrieval": partial(run_fixed_retrieval, fix_length=None),
}
PEER_MODES = tuple(RUNNERS)


def _runner(mode: str) -> Callable[..., PeerOutcome]:
    if mode not in RUNNERS:
        raise InputError(f"--modes contains {mode!r}; the peers are {', '.join(PEER_MODES)}")
    return RUNNERS[mode]


class FirstPassages:
    """An arm that passes on only its first `count` pieces of evidence: the peers with fewer passages than
    their retrieve_topk (--peer-passages), so that the passage count is not what separates them from the gate."""

    def __init__(self, arm: Any, count: int) -> None:
        self.arm, self.count = arm, count
        self.name = getattr(arm, "name", "")

    def ground(self, query: Any, deadline: float) -> list:
        return list(self.arm.ground(query, deadline))[: self.count]


def check_passages(passages: int) -> None:
    if isinstance(passages, bool) or not isinstance(passages, int) or not 1 <= passages <= DOCS_PER_RETRIEVAL:
        raise InputError(
            f"--peer-passages={passages!r} must be a whole number from 1 to {DOCS_PER_RETRIEVAL} (their configs' "
            f"retrieve_topk, the default); e.g. --peer-passages 1"
        )


def run_peer(
    mode: str,
    backend: Any,
    question: str,
    config: Any,
    arms: Mapping[str, Any],
    prefix: str = "",
    thresholds: Mapping[str, float] | None = None,
    passages: int = DOCS_PER_RETRIEVAL,
) -> PeerOutcome:
    """One reply by a peer; `passages` caps the passages a retrieval puts in the prompt (theirs: 3)."""
    check_passages(passages)
    threshold = (thresholds or {}).get(mode, DEFAULT_THRESHOLDS.get(mode, 0.0))
    if passages < DOCS_PER_RETRIEVAL:
        arms = {name: FirstPassages(arm, passages) for name, arm in arms.items()}
    return _runner(mode)(backend, question, config, arms, prefix, threshold=threshold)


def parse_thresholds(values: list[str] | tuple[str, ...]) -> dict[str, float]:
    """--peer-threshold dragin=0.8 --peer-threshold etc=1.1 -> {"dragin": 0.8, "etc": 1.1}."""
    out: dict[str, float] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or name not in DEFAULT_THRESHOLDS:
            raise InputError(
                f"--peer-threshold={value!r} is not NAME=NUMBER with NAME one of {', '.join(DEFAULT_THRESHOLDS)}; "
                "e.g. --peer-threshold dragin=0.8"
            )
        try:
            out[name] = float(number)
        except ValueError as err:
            raise InputError(f"--peer-threshold={value!r}: {number!r} is not a number; e.g. dragin=0.8") from err
    return out


__all__ = [
    "DEFAULT_THRESHOLDS",
    "PEER_MODES",
    "FirstPassages",
    "PeerOutcome",
    "check_passages",
    "parse_thresholds",
    "run_peer",
]

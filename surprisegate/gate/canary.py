"""The groundedness canary: was the model unsure, and is the reply anchored in accepted evidence?

Pure: it reads a reply's surprise aggregates and its convergence records and returns a small dict for
the receipt. It changes nothing about the reply.

The rule
--------
uncertainty
    The reply's most doubtful stretch, compared with the gate's own threshold (bits):
    ``logistic((stat - threshold) / UNCERTAINTY_SCALE_BITS)`` where ``stat`` is the first finite value of
    ``window_max`` (the highest rolling-window statistic seen, the very number the gate compares) or
    ``p90`` (per-token 90th percentile, the fallback). It is 0.5 exactly at the threshold, so
    "uncertain" (> 0.5) means the same as "the gate would fire". Raising the statistic never lowers it.
anchoring
    The best accepted evidence: over rounds whose action is ``rewound`` and that name a ``chosen``
    evidence, ``max(confidence × (1 - OBSERVABLE_WEIGHT + OBSERVABLE_WEIGHT × observable))``.
    A verified tool result (observable 1.0) keeps its full confidence; an unverified snippet keeps 80%.
    0 when no round injected evidence.
verdict
    ``not_scored`` when there is no surprise to read (no tokens, or a black-box API without logprobs);
    otherwise ``uncertain_*`` if uncertainty > 0.5 else ``confident_*``, and ``*_grounded`` if
    anchoring ≥ ANCHORING_FLOOR else ``*_unanchored``. ``confident_unanchored`` is the case to watch:
    the model was sure and nothing checked it.
"""

from __future__ import annotations

import math
from typing import Any

from surprisegate.errors import ConfigError

VERDICTS = ("confident_grounded", "confident_unanchored", "uncertain_grounded", "uncertain_unanchored", "not_scored")
# Aggregates read for uncertainty, in order of preference (see the module docstring).
UNCERTAINTY_STATISTICS = ("window_max", "p90")
UNCERTAINTY_SCALE_BITS = 1.0  # one bit above the threshold → uncertainty 0.73; two bits → 0.88
OBSERVABLE_WEIGHT = 0.2  # share of an evidence's weight that only a verified (observable) result earns
ANCHORING_FLOOR = 0.5


def groundedness_canary(
    surprise_aggregates: dict[str, Any] | None,
    rounds: list[Any],
    threshold: float,
) -> dict[str, Any]:
    """Return {"uncertainty", "anchoring", "verdict", "reason", "statistic", "unresolved_rounds"}.

    `surprise_aggregates` holds the reply's aggregates in bits (`window_max`, `p90`, optionally
    `n_tokens`); None or {} means nothing was measured. `rounds` are convergence records (dicts or
    objects with `to_dict()`). `threshold` is the gate's threshold in bits.
    `uncertainty` is None when the verdict is `not_scored`; `statistic` names the aggregate it used.
    `unresolved_rounds` counts rounds that resumed unmodified (a doubtful span left as written).
    """
    _check_threshold(threshold)
    records = [r.to_dict() if hasattr(r, "to_dict") else r for r in rounds or []]
    records = [r for r in records if isinstance(r, dict)]
    anchoring, source = _anchoring(records)
    # A round that found evidence already injected earlier is covered by that round, not unresolved.
    unresolved = sum(1 for r in records if r.get("action") != "rewound" and not r.get("already_grounded"))
    result: dict[str, Any] = {
        "uncertainty": None,
        "anchoring": anchoring,
        "statistic": None,
        "unresolved_rounds": unresolved,
    }

    statistic, value = _uncertainty_statistic(surprise_aggregates)
    if statistic is None:
        why = _why_not_scored(surprise_aggregates)
        return result | {"verdict": "not_scored", "reason": f"Not scored: {why}, so model uncertainty is unknown."}

    uncertainty = _logistic((value - threshold) / UNCERTAINTY_SCALE_BITS)
    uncertain = value > threshold  # same comparison as the gate; equals uncertainty > 0.5 without rounding doubt
    grounded = anchoring >= ANCHORING_FLOOR
    verdict = f"{'uncertain' if uncertain else 'confident'}_{'grounded' if grounded else 'unanchored'}"

    compared = "exceeded" if uncertain else "stayed at or below"
    surprise_part = f"Surprise {statistic} {value:.2f} bits {compared} the threshold {threshold:.2f}"
    reason = f"{surprise_part}; {_evidence_part(anchoring, source, unresolved)}."
    return result | {"uncertainty": uncertainty, "statistic": statistic, "verdict": verdict, "reason": reason}


def _check_threshold(threshold: Any) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ConfigError(
            f"threshold={threshold!r} is not a finite number of bits; set it to e.g. 3.5 or calibrate one"
        )


def _evidence_part(anchoring: float, source: str | None, unresolved: int) -> str:
    """The reason's second half: what anchors the reply, and the doubtful spans left as written."""
    if anchoring >= ANCHORING_FLOOR:
        part = f"evidence from {source} anchors the reply (anchoring {anchoring:.2f})"
    elif anchoring > 0:
        part = f"the best evidence (from {source}) is weak (anchoring {anchoring:.2f} < {ANCHORING_FLOOR})"
    else:
        part = "no evidence was injected"
    if unresolved:
        part += f"; {unresolved} doubtful span{'s' if unresolved != 1 else ''} left as written"
    return part


def _uncertainty_statistic(aggregates: dict[str, Any] | None) -> tuple[str | None, float]:
    if not aggregates or _no_tokens(aggregates):
        return None, math.nan
    for name in UNCERTAINTY_STATISTICS:
        value = aggregates.get(name)
        # NaN means "not computed"; +inf (a token of probability 0) is a real, maximal surprise.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            return name, float(value)
    return None, math.nan


def _why_not_scored(aggregates: dict[str, Any] | None) -> str:
    if not aggregates:
        return "no logprobs"
    if _no_tokens(aggregates):
        return "no tokens"
    return f"none of {', '.join(UNCERTAINTY_STATISTICS)} in the aggregates"


def _no_tokens(aggregates: dict[str, Any]) -> bool:
    n = aggregates.get("n_tokens", aggregates.get("n"))
    return isinstance(n, int) and n <= 0


def _anchoring(records: list[dict[str, Any]]) -> tuple[float, str | None]:
    """Best (weight, source) over rounds that injected evidence; (0.0, None) when none did."""
    best, best_source = 0.0, None
    for record in records:
        chosen = record.get("chosen")
        if record.get("action") != "rewound" or not isinstance(chosen, dict):
            continue
        confidence = _unit(chosen.get("confidence"))
        observable = _unit(chosen.get("observable"))
        weight = confidence * (1.0 - OBSERVABLE_WEIGHT + OBSERVABLE_WEIGHT * observable)
        if weight > best or best_source is None:
            best, best_source = weight, str(chosen.get("source") or "unknown source")
    return best, best_source


def _unit(value: Any) -> float:
    """A value clamped to [0, 1]; missing or non-numeric counts as 0 (no credit for what is not there)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, float(value)))


def _logistic(x: float) -> float:
    # One formula for every x keeps it monotone (a two-branch form can step back by an ulp at the seam);
    # below -700 exp(-x) would overflow, and the true value is under 1e-304 anyway.
    if x < -700.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))

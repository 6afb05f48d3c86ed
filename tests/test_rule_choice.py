"""research/rule_choice.py: the shipped window rule stays unless another is reliably better on half B."""

from __future__ import annotations

import numpy as np
import pytest

from surprisegate.gate.signals import SIGNALS
from surprisegate.research.probe_fit import halves
from surprisegate.research.rule_choice import MIN_WIN_RATE, choose_rule, paired_win_rate
from surprisegate.research.threshold_sweep import Labelled

SHIPPED = {"signal": "entropy", "statistic": "mean", "window": 4, "min_tokens": 4}
KIND_MIN_ITEMS = (15, 8)


def _items(n: int, informative: str, seed: int = 0, kinds: int = 4) -> list[Labelled]:
    """n replies of 12 tokens; wrong ones carry a bump of high values in the `informative` signal only."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        wrong = bool(rng.random() < 0.5)
        sequences = {}
        for sig in SIGNALS:
            values = rng.gamma(2.0, 0.5, 12)
            if sig == informative and wrong:
                start = int(rng.integers(0, 8))
                values[start : start + 4] += 2.5
            sequences[sig] = [float(v) for v in values]
        out.append(Labelled(f"q{i:04d}", not wrong, "", sequences, f"kind{i % kinds}"))
    return out


def test_a_reliably_better_rule_is_chosen_over_the_shipped_one():
    choice = choose_rule(_items(240, informative="surprise"), SHIPPED, KIND_MIN_ITEMS)
    assert choice["rule"]["signal"] == "surprise"
    assert choice["report"]["challenger_wins_b"] >= MIN_WIN_RATE
    assert "higher AUROC than the shipped rule on half B" in choice["from"]


def test_the_shipped_rule_stays_where_it_separates_best():
    choice = choose_rule(_items(240, informative="entropy"), SHIPPED, KIND_MIN_ITEMS)
    assert choice["rule"] == SHIPPED
    assert choice["from"].startswith("the shipped rule")
    shipped_row = choice["report"]["candidates"][0]
    assert shipped_row["rule"] == "entropy mean W=4 min_tokens=4" and shipped_row["auroc_b"] > 0.8


def test_noise_does_not_displace_the_shipped_rule():
    """No signal separates: whatever looks best on half A must not win on half B often enough."""
    choice = choose_rule(_items(240, informative="none", seed=3), SHIPPED, KIND_MIN_ITEMS)
    assert choice["rule"] == SHIPPED


def test_too_few_of_a_class_keeps_the_shipped_rule():
    items = [it for it in _items(120, informative="surprise") if it.correct][:40] + [
        it for it in _items(120, informative="surprise", seed=1) if not it.correct
    ][:6]
    choice = choose_rule(items, SHIPPED, KIND_MIN_ITEMS)
    assert choice["rule"] == SHIPPED and "too few" in choice["from"]


def test_the_halves_rules_are_judged_on_are_half_and_repeatable():
    ids = [f"x{i}" for i in range(101)]
    assert len(halves(ids)) == 50
    assert halves(ids) == halves(list(reversed(ids)))
    assert halves(ids, seed=1) != halves(ids)


@pytest.mark.parametrize("shift, expected", [(3.0, 1.0), (0.0, None), (-3.0, 0.0)])
def test_paired_win_rate_follows_the_gap(shift, expected):
    rng = np.random.default_rng(0)
    wrong = rng.integers(0, 2, 200)
    shipped = rng.normal(size=200) + 0.5 * wrong
    challenger = shipped + shift * wrong + 0.01 * rng.normal(size=200)
    rate = paired_win_rate(challenger, shipped, wrong, n=200)
    if expected is None:
        assert 0.1 < rate < 0.9
    else:
        assert rate == pytest.approx(expected, abs=0.02)

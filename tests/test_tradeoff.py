"""scripts/tradeoff.py: the table of operating points states each run's share of `always`'s accuracy and calls."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tradeoff.py"
spec = importlib.util.spec_from_file_location("tradeoff", SCRIPT)
tradeoff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tradeoff)


def point(acc, calls, tokens=100, regressions=0, trigger=0.5):
    return {"accuracy": acc, "grounding_calls": calls, "tokens_decoded": tokens, "regressions": regressions,
            "trigger_rate": trigger}


def test_shares_are_against_always_and_rows_sorted_by_calls(tmp_path):
    points = {"always": point(0.8, 100), "intervene a": point(0.72, 40), "off": point(0.3, 0)}
    tradeoff.write(points, tmp_path, "set")
    rows = (tmp_path / "tradeoff.md").read_text().splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == ["off", "intervene a", "always"]
    assert "| intervene a | 0.72 | 0 | 0.50 | 40 | 100 | 0.90 | 0.40 |" in rows
    assert json.loads((tmp_path / "tradeoff.json").read_text()) == points

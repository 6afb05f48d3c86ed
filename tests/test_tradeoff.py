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
    return {
        "accuracy": acc,
        "grounding_calls": calls,
        "tokens_decoded": tokens,
        "regressions": regressions,
        "trigger_rate": trigger,
    }


def test_shares_are_against_always_and_rows_sorted_by_calls(tmp_path):
    points = {"always": point(0.8, 100), "intervene a": point(0.72, 40), "off": point(0.3, 0)}
    tradeoff.write(points, tmp_path, "set")
    rows = (tmp_path / "tradeoff.md").read_text().splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == ["off", "intervene a", "always"]
    assert "| intervene a | 0.72 | 0 | 0.50 | 40 | 100 | 0.90 | 0.40 |" in rows
    assert json.loads((tmp_path / "tradeoff.json").read_text()) == points


def test_old_points_keep_the_old_table_and_oracle_points_add_two_columns(tmp_path):
    points = {"always": point(0.8, 100), "intervene a": point(0.72, 40), "off": point(0.3, 0)}
    tradeoff.write(points, tmp_path, "set")
    header = (tmp_path / "tradeoff.md").read_text().splitlines()[0]
    assert header.endswith("| share of always's accuracy | share of always's calls |")
    modes = {"off": {"accuracy": 0.3}, "intervene": {"accuracy": 0.72}, "oracle": {"accuracy": 0.9}}
    points["intervene a"] |= tradeoff.oracle_fields(modes, "intervene", 40)
    assert points["intervene a"]["trigger_efficiency"] == 0.7 and points["intervene a"]["oracle_budget"] == 40
    tradeoff.write(points, tmp_path, "set")
    lines = (tmp_path / "tradeoff.md").read_text().splitlines()
    assert lines[0].endswith("| oracle at the same replies grounded | trigger efficiency |")
    assert lines[1].count("---") == 10
    assert "| intervene a | 0.72 | 0 | 0.50 | 40 | 100 | 0.90 | 0.40 | 0.90 | 0.70 |" in lines
    assert "| off | 0.30 | 0 | 0.50 | 0 | 100 | 0.37 | 0.00 | – | – |" in lines


def test_oracle_flag_runs_the_oracle_at_each_points_own_budget(tmp_path, monkeypatch):
    from surprisegate.research.evaluate import evaluate
    from test_evaluate import Memory, config, mixed_items, mixed_script

    from scripted import ScriptedBackend

    data = mixed_items(tmp_path)
    monkeypatch.setattr(tradeoff, "load_backend", lambda c: ScriptedBackend(mixed_script))
    monkeypatch.setattr(tradeoff, "build_arms", lambda c, memory, web=None: {"memory": Memory()})
    base = tmp_path / "base"
    evaluate(data, ["off", "always"], ScriptedBackend(mixed_script), config(), {"memory": Memory()}, base)
    toml = tmp_path / "p.toml"
    toml.write_text(
        'signal = "surprise"\nstatistic = "max"\nwindow = 4\nthreshold = 3.0\nmin_tokens = 1\n'
        'system_prompt = ""\nmax_tokens = 40\n[kind_thresholds]\n'
    )
    out = tmp_path / "trade"
    assert (
        tradeoff.main(["--data", str(data), "--base", str(base), "--point", f"p={toml}", "--oracle", "--out", str(out)])
        == 0
    )
    points = json.loads((out / "tradeoff.json").read_text())
    # The gate grounds Edgy0, Hard0, Hard1 (3 replies, 5/7 right); the oracle, 3 of the 4 wrong (6/7 right).
    p = points["intervene p"]
    assert (p["oracle_budget"], p["oracle_accuracy"], p["trigger_efficiency"]) == (3, 0.8571, 0.6667)
    assert "oracle_accuracy" not in points["always"]
    assert "| 0.86 | 0.67 |" in (out / "tradeoff.md").read_text()

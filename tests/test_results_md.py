"""The README's generated Results block: rendered from saved summaries, spliced between its markers only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_md.py"
spec = importlib.util.spec_from_file_location("results_md", SCRIPT)
results_md = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results_md)


def test_splice_replaces_only_the_generated_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{results_md.BEGIN}\nold table\n{results_md.END}\noutro\n")
    results_md.splice(readme, "| new | table |")
    assert readme.read_text() == f"intro\n{results_md.BEGIN}\n| new | table |\n{results_md.END}\noutro\n"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="no <!-- results:begin"):
        results_md.splice(readme, "x")
    assert readme.read_text() == "no markers here\n"  # nothing lost


def test_eval_tables_come_from_the_summaries(tmp_path, capsys):
    summary = {
        "modes": {
            "off": {
                "n": 10,
                "accuracy": 0.3,
                "regressions": 0,
                "trigger_rate": 0.0,
                "intervention_precision": None,
                "intervention_recall": 0.0,
                "grounding_calls": 0,
                "tokens_decoded": 100,
                "tokens_prefilled": 200,
                "seconds": 3.2,
            },
            "intervene": {
                "n": 10,
                "accuracy": 0.7,
                "regressions": 1,
                "trigger_rate": 0.6,
                "intervention_precision": 0.8,
                "intervention_recall": 0.9,
                "grounding_calls": 6,
                "tokens_decoded": 90,
                "tokens_prefilled": 300,
                "seconds": 4.0,
            },
        }
    }
    (tmp_path / "eval" / "setA").mkdir(parents=True)
    (tmp_path / "eval" / "setA" / "summary.json").write_text(json.dumps(summary))
    results_md.main(str(tmp_path))
    out = capsys.readouterr().out
    assert "**setA**" in out
    assert "| intervene | 10 | 0.70 | 1 | 0.60 | 0.8 | 0.9 | 6 | 90 | 300 | 4 |" in out


OLD_SUMMARY = {
    "modes": {
        "off": {
            "n": 4,
            "accuracy": 0.25,
            "regressions": 0,
            "trigger_rate": 0.0,
            "intervention_precision": None,
            "intervention_recall": None,
            "grounding_calls": 0,
            "tokens_decoded": 40,
            "tokens_prefilled": 80,
            "seconds": 1.4,
        }
    }
}


def test_a_summary_without_oracle_renders_as_before():
    assert results_md.eval_md("old", OLD_SUMMARY) == [
        "**old**",
        "",
        "| mode | n | accuracy | regressions | trigger rate | precision | recall | grounding calls | tokens decoded | "
        "tokens prefilled | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        "| off | 4 | 0.25 | 0 | 0.00 | – | – | 0 | 40 | 80 | 1 |",
        "",
    ]


def test_the_oracle_row_and_the_trigger_efficiency_follow_the_ab_table():
    oracle_row = {
        "n": 4,
        "accuracy": 0.75,
        "regressions": 0,
        "trigger_rate": 0.5,
        "intervention_precision": 1.0,
        "intervention_recall": 0.67,
        "grounding_calls": 2,
        "tokens_decoded": 44,
        "tokens_prefilled": 120,
        "seconds": 2.0,
    }
    summary = {
        "modes": OLD_SUMMARY["modes"] | {"oracle": oracle_row},
        "oracle": {"budget": 2, "calls_source": "intervene", "chosen": 2, "off_wrong": 3, "efficiency": 0.5},
    }
    lines = results_md.eval_md("new", summary)
    assert "| oracle | 4 | 0.75 | 0 | 0.50 | 1.0 | 0.67 | 2 | 44 | 120 | 2 |" in lines
    assert lines[-2] == (
        "Oracle: grounds only replies `off` got wrong, as many replies as intervene grounded (2). "
        "Trigger efficiency (intervene's accuracy gain ÷ the oracle's): **0.50**."
    )
    summary["oracle"] |= {"calls_source": "--oracle-calls", "efficiency": None}
    assert results_md.eval_md("new", summary)[-2].endswith(
        "2 replies (--oracle-calls). Trigger efficiency (intervene's accuracy gain ÷ the oracle's): **–**."
    )

"""scripts/phrasings.py: the phrasing set asks every dev item in other words, and only the words change."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
spec = importlib.util.spec_from_file_location("phrasings", SCRIPTS / "phrasings.py")
assert spec is not None and spec.loader is not None
phrasings = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = phrasings
spec.loader.exec_module(phrasings)


@pytest.fixture(scope="module")
def dev(shared_data):
    return {
        name: [json.loads(line) for line in (shared_data / f"{name}_dev.jsonl").open()]
        for name in ("factqa", "longform")
    }


@pytest.mark.parametrize("family", phrasings.FAMILIES)
def test_every_fact_question_is_reworded_and_still_names_its_subject(dev, family):
    for row in dev["factqa"]:
        asked = phrasings.fact_question(row, family, random.Random(row["id"]))
        assert asked != row["question"] and row["subject"].lower() in asked.lower()
        if family == "lowercase":
            assert "?" not in asked and (asked == asked.lower() or row["relation"] == "element_from_symbol")


@pytest.mark.parametrize("family", phrasings.FAMILIES)
def test_every_paragraph_prompt_asks_each_of_its_items_in_other_words(dev, family):
    for row in dev["longform"]:
        asked = phrasings.long_question(row, family, random.Random(row["id"]))
        assert asked != row["question"] and row["subject"].lower() in asked.lower()
        for claim in row["claims"]:
            assert phrasings.ITEM[claim["relation"]].lower() in asked.lower()


def test_held_out_families_are_apart_from_the_tuning_ones():
    assert set(phrasings.HELD_OUT).isdisjoint(phrasings.TUNING) and set(phrasings.FAMILIES) == set(
        phrasings.FACT["capital"]
    )
    for wordings in phrasings.FACT.values():
        assert set(wordings) == set(phrasings.FAMILIES) and all(len(w) >= 2 for w in wordings.values())
        assert all(re.search(r"\{s\}", text) for family in wordings.values() for text in family)


def _load_table():
    table_spec = importlib.util.spec_from_file_location("phrasing_table", SCRIPTS / "phrasing_table.py")
    assert table_spec is not None and table_spec.loader is not None
    module = importlib.util.module_from_spec(table_spec)
    table_spec.loader.exec_module(module)
    return module


def test_the_table_puts_each_family_beside_the_template_for_both_sets(tmp_path, monkeypatch, capsys):
    def summary(off, on, calls, claims=None):
        modes = {"off": {"accuracy": off}, "intervene": {"accuracy": on}}
        modes["intervene"] |= {"grounding_calls": calls, "trigger_rate": 0.5, "regressions": 1, "n": 100}
        if claims:
            modes["off"]["claims"] = {"claim_accuracy": off}
            modes["intervene"]["claims"] = {"claim_accuracy": on, "claim_regressions": 2} | claims
        return {"modes": modes}

    runs = {
        "factqa_template": summary(0.3, 0.8, 50),
        "factqa_indirect": summary(0.2, 0.6, 75),
        "longform_template": summary(0.25, 0.5, 40, {"still_states_off_items": 0.99}),
    }
    for name, content in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(content))
    monkeypatch.setattr(sys, "argv", ["phrasing_table.py", str(tmp_path)])
    _load_table().main()
    printed = capsys.readouterr().out
    assert "| indirect (held out) | 0.20 | 0.60 | +0.40 | -0.10 | 75 (1.50×) | 0.50 | 1 |" in printed
    assert (
        "claim accuracy" in printed
        and "| template | 0.25 | 0.50 | +0.25 | +0.00 | 40 (1.00×) | 0.50 | 2 | 0.99 |" in printed
    )
    saved = json.loads((tmp_path / "table.json").read_text())
    assert set(saved) == {"factqa", "longform"} and saved["longform"]["template"]["still_states_off_items"] == 0.99

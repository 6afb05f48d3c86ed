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

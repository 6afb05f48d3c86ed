"""The A/B harness on a scripted backend: every mode runs, metrics add up, results resume."""

from __future__ import annotations

import json

import pytest

from surprisegate.arms import Evidence
from surprisegate.config import Config
from surprisegate.errors import InputError
from surprisegate.evaluate import evaluate, summarise

from scripted import ScriptedBackend, plan

WRONG, RIGHT = "The capital is Wrongville.", "The capital is Rightburg."


def script(context):
    return plan(RIGHT) if "Rightburg" in context else plan(WRONG, doubtful="Wrongville")


class Memory:
    name = "memory"

    def ground(self, query, deadline):
        return [Evidence("c", "The capital of Testland is Rightburg.", 0.9, "memory:x")]


def config():
    return Config(signal="surprise", statistic="max", window=4, threshold=3.0, min_tokens=1, kind_thresholds={},
                  system_prompt="", max_tokens=40)


def test_every_mode_runs_and_the_summary_adds_up(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"i{i}", "question": "What is the capital of Testland?",
                                          "answers": ["Rightburg"], "category": "entity"}) for i in range(3)) + "\n")
    modes = ["off", "detect", "intervene", "always", "flare"]
    summary = evaluate(data, modes, ScriptedBackend(script), config(), {"memory": Memory()}, tmp_path / "out")
    m = summary["modes"]
    assert m["off"]["accuracy"] == 0.0 and m["detect"]["accuracy"] == 0.0
    assert m["intervene"]["accuracy"] == 1.0 and m["intervene"]["fixes"] == 3 and m["intervene"]["regressions"] == 0
    assert m["always"]["accuracy"] == 1.0 and m["always"]["grounding_calls"] == 3
    assert m["flare"]["accuracy"] == 1.0 and m["flare"]["tokens_prefilled"] > m["intervene"]["tokens_prefilled"]
    assert m["detect"]["trigger_rate"] == 1.0 and m["off"]["grounding_calls"] == 0
    assert (tmp_path / "out" / "report.md").read_text().count("|") > 20
    # Rerun: nothing left to do, same summary.
    again = evaluate(data, modes, ScriptedBackend(script), config(), {"memory": Memory()}, tmp_path / "out")
    assert again == summary


def test_summarise_counts_regressions_and_intervention_precision():
    rows = [
        {"id": "a", "mode": "off", "correct": True, "triggered": False, "grounding_calls": 0, "tokens_decoded": 5, "seconds": 1},
        {"id": "b", "mode": "off", "correct": False, "triggered": False, "grounding_calls": 0, "tokens_decoded": 5, "seconds": 1},
        {"id": "a", "mode": "intervene", "correct": False, "triggered": True, "grounding_calls": 1, "tokens_decoded": 5, "seconds": 1},
        {"id": "b", "mode": "intervene", "correct": True, "triggered": True, "grounding_calls": 1, "tokens_decoded": 5, "seconds": 1},
    ]
    s = summarise(rows, ["off", "intervene"])["modes"]["intervene"]
    assert s["regressions"] == 1 and s["fixes"] == 1 and s["accuracy"] == 0.5
    assert s["intervention_precision"] == 0.5 and s["intervention_recall"] == 1.0


def test_unknown_mode_is_a_clear_error(tmp_path):
    from surprisegate.errors import InputError

    data = tmp_path / "i.jsonl"
    data.write_text(json.dumps({"question": "q", "answers": ["a"]}) + "\n")
    with pytest.raises(InputError, match="'loud'"):
        evaluate(data, ["loud"], ScriptedBackend(script), config(), {}, tmp_path / "o")


def test_resuming_with_other_settings_is_refused_and_keeps_the_results(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text(json.dumps({"id": "i0", "question": "What is the capital of Testland?",
                                "answers": ["Rightburg"], "category": "entity"}) + "\n")
    out = tmp_path / "out"
    evaluate(data, ["off", "intervene"], ScriptedBackend(script), config(), {"memory": Memory()}, out)
    before = (out / "results.jsonl").read_text()
    with pytest.raises(InputError, match=r"threshold: 3.0 -> 9.0.*pass a new --out"):
        evaluate(data, ["off", "intervene"], ScriptedBackend(script), config().replace(threshold=9.0),
                 {"memory": Memory()}, out)
    with pytest.raises(InputError, match=r"arms: \['memory'\] -> \[\]"):
        evaluate(data, ["off", "intervene"], ScriptedBackend(script), config(), {}, out)
    assert (out / "results.jsonl").read_text() == before
    # threads change speed, not replies: a resume with other threads is fine
    evaluate(data, ["off", "intervene"], ScriptedBackend(script), config().replace(threads=1), {"memory": Memory()}, out)

"""Labelling: items are read with clear errors, graded, and a rerun resumes without redoing work."""

from __future__ import annotations

import json

import pytest

from surprisegate.config import Config
from surprisegate.errors import InputError
from surprisegate.labeling import label, prompt_for, read_items

from scripted import ScriptedBackend, plan


def script(context):
    return plan("The capital is Rightburg.") if "Testland" in context else plan("Paris is nice.")


def write_items(path, n=4):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"i{i}", "question": "What is the capital of Testland?",
                                 "answers": ["Rightburg" if i % 2 == 0 else "Elsewhere"], "category": "entity"}) + "\n")


def test_read_items_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answers": ["a"]}\n{oops\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2 is not valid JSON"):
        read_items(bad)
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(InputError, match="needs 'question' and 'answers'"):
        read_items(bad)
    with pytest.raises(InputError, match="does not exist"):
        read_items(tmp_path / "missing.jsonl")


def test_cloze_items_become_the_start_of_the_reply():
    question, prefix = prompt_for({"question": "The capital of Chad is", "format": "cloze"})
    assert prefix == "The capital of Chad is" and "The capital of Chad is" in question
    assert prompt_for({"question": "Q?"}) == ("Q?", "")


def test_label_grades_keeps_signals_and_resumes(tmp_path):
    data = tmp_path / "items.jsonl"
    write_items(data)
    out = tmp_path / "out"
    backend = ScriptedBackend(script)
    config = Config(system_prompt="", max_tokens=40)
    first = label(data, out, backend, config, limit=2)
    assert first["labelled_now"] == 2
    rows = [json.loads(l) for l in open(out / "labels.jsonl")]
    assert [r["correct"] for r in rows] == [True, False]
    assert len(rows[0]["surprises"]) == len(rows[0]["entropies"]) == len(rows[0]["pieces"]) > 0
    # Simulate a crash mid-write: a torn last line must not stop the rerun.
    with open(out / "labels.jsonl", "a") as fh:
        fh.write('{"id": "i2", "tor')
    second = label(data, out, backend, config)
    assert second["already_done"] == 2 and second["labelled_now"] == 2
    ids = [json.loads(l)["id"] for l in open(out / "labels.jsonl") if l.strip().endswith("}")]
    assert sorted(ids) == ["i0", "i1", "i2", "i3"]


def test_label_refuses_to_mix_replies_of_other_settings(tmp_path):
    data = tmp_path / "items.jsonl"
    write_items(data, n=2)
    out = tmp_path / "out"
    label(data, out, ScriptedBackend(script), Config(system_prompt="", max_tokens=40))
    with pytest.raises(InputError, match=r"max_tokens: 40 -> 8"):
        label(data, out, ScriptedBackend(script), Config(system_prompt="", max_tokens=8))
    # the trigger settings do not change what the model writes: resuming with another threshold is fine
    again = label(data, out, ScriptedBackend(script), Config(system_prompt="", max_tokens=40, threshold=9.0))
    assert again["already_done"] == 2

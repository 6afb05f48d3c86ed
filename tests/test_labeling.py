"""Labelling: items are read with clear errors, graded, and a rerun resumes without redoing work."""

from __future__ import annotations

import json

import pytest

from surprisegate.config import Config
from surprisegate.errors import InputError
from surprisegate.research.labeling import label, prompt_for, read_items

from scripted import ScriptedBackend, plan


def script(context):
    return plan("The capital is Rightburg.") if "Testland" in context else plan("Paris is nice.")


def write_items(path, n=4):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {
                        "id": f"i{i}",
                        "question": "What is the capital of Testland?",
                        "answers": ["Rightburg" if i % 2 == 0 else "Elsewhere"],
                        "category": "entity",
                    }
                )
                + "\n"
            )


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
    rows = [json.loads(line) for line in open(out / "labels.jsonl")]
    assert [r["correct"] for r in rows] == [True, False]
    assert len(rows[0]["surprises"]) == len(rows[0]["entropies"]) == len(rows[0]["pieces"]) > 0
    # Simulate a crash mid-write: a torn last line must not stop the rerun.
    with open(out / "labels.jsonl", "a") as fh:
        fh.write('{"id": "i2", "tor')
    second = label(data, out, backend, config)
    assert second["already_done"] == 2 and second["labelled_now"] == 2
    ids = [json.loads(line)["id"] for line in open(out / "labels.jsonl") if line.strip().endswith("}")]
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


def test_label_keeps_top20_logprobs_per_token_without_changing_the_reply(tmp_path):
    from surprisegate.research.labeling import LABEL_TOP_LOGPROBS, label_item

    data = tmp_path / "items.jsonl"
    write_items(data, n=2)
    out = tmp_path / "out"
    config = Config(system_prompt="", max_tokens=40)
    label(data, out, ScriptedBackend(script), config)
    rows = [json.loads(line) for line in open(out / "labels.jsonl")]
    meta = json.loads((out / "label_config.json").read_text())
    assert meta["config"]["top_logprobs"] == LABEL_TOP_LOGPROBS == 20
    for row, item in zip(rows, read_items(data), strict=True):
        top = row["top_logprobs"]
        assert len(top) == len(row["token_ids"]) > 0
        for pairs, token, s in zip(top, row["token_ids"], row["surprises"], strict=True):
            assert len(pairs) == 20
            ids, lps = [p[0] for p in pairs], [p[1] for p in pairs]
            assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
            if token in ids:  # the chosen token's logprob is the one its surprise came from
                assert -lps[ids.index(token)] / 0.6931471805599453 == pytest.approx(s, abs=1e-3)
        # keeping top-k only reads the logits: the same reply, tokens and signals without it
        plain = label_item(ScriptedBackend(script), item, config.replace(mode="detect", top_logprobs=0))
        assert plain["top_logprobs"] == []
        for key in ("reply", "token_ids", "surprises", "entropies", "correct"):
            assert plain[key] == row[key]


def test_label_refuses_to_resume_a_folder_labelled_without_top_logprobs(tmp_path):
    data = tmp_path / "items.jsonl"
    write_items(data, n=2)
    out = tmp_path / "out"
    config = Config(system_prompt="", max_tokens=40)
    label(data, out, ScriptedBackend(script), config, limit=1)
    meta_path = out / "label_config.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["top_logprobs"]  # what a folder labelled before top-k were kept records
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"top_logprobs: None -> 20.*pass a new --out"):
        label(data, out, ScriptedBackend(script), config)

"""research/model_calibration.py: `calibrate --backend`, labels through a scripted model to a calibration file."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from surprisegate.config import load_config
from test_threshold_sweep import packaged_set, scripted_model


def test_calibrate_model_labels_the_set_and_writes_a_calibration_it_finds(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from surprisegate import model_calibrations
    from surprisegate.config import Config
    from surprisegate.research.model_calibration import calibrate_model

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    backend = scripted_model(packaged_set()[:45])
    result = calibrate_model(backend, Config(), limit=40, bootstrap=10)
    path = model_calibrations.user_dir(tmp_path / "home") / "scripted-test-model--full.toml"
    assert (
        result["calibration"] == str(path)
        and model_calibrations.find(backend.model_id, None, tmp_path / "home") == path
    )
    record = model_calibrations.read_record(path)
    assert (record["items"], record["signal_source"], record["top_k"], record["objective"]) == (40, "full", 0, "recall")
    assert record["model_id"] == "scripted-test-model" and record["max_tokens"] == 32 and record["auroc"] > 0.9
    config = load_config(env={}, calibration_file=path)
    assert config.threshold == result["report"]["chosen"]["threshold"]
    assert config.signal == result["report"]["chosen"]["signal"]
    # The rule was chosen on a held-back half (here: 40 replies hold too few of a class to judge another).
    choice = json.loads(Path(record["rule_choice"]).read_text())
    assert record["rule_from"] == choice["from"] and choice["from"].startswith("the shipped rule")
    assert config.signal == choice["rule"]["signal"] and config.window == choice["rule"]["window"]
    # Resumable: a longer run labels only the new items, and calibrates on all of them.
    again = calibrate_model(backend, Config(), limit=45, bootstrap=10)
    assert (again["labels"]["already_done"], again["labels"]["labelled_now"]) == (40, 5)
    assert model_calibrations.read_record(path)["items"] == 45
    # A backend without hidden states keeps the window rule, and the record says so.
    assert record["probe"].startswith("none: this backend gives no hidden states") and record["seconds"] >= 0


def scripted_chat(items: list[dict]):
    """A chat API answering like `scripted_model` (a third right, confidently), streaming 20 logprobs a token;
    it cannot continue an assistant turn, so a cloze item arrives as its instruction alone."""
    import zlib

    from scripted import ScriptedChat

    def script(messages):
        asked = messages[-1]["content"]
        item = max((it for it in items if it["question"] in asked), key=lambda it: len(it["question"]))
        right = zlib.crc32(item["id"].encode()) % 3 == 0
        reply = f"The answer is {item['answers'][0]} ." if right else "The answer is Nowhere ."
        return [(w, 0.95 if right else 0.05) for w in re.findall(r"\s*[^\s.]+|\.", reply)]

    return ScriptedChat(script, top_k=20)


def test_calibrate_model_calibrates_a_chat_api_on_the_signals_it_streams(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from surprisegate import model_calibrations
    from surprisegate.config import Config
    from surprisegate.research.model_calibration import calibrate_model

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    items = packaged_set()[:40]
    backend = scripted_chat(items)
    result = calibrate_model(backend, Config(), limit=40, bootstrap=10)
    path = model_calibrations.user_dir(tmp_path / "home") / "scripted-chat-model--top20.toml"
    assert (
        result["calibration"] == str(path) and model_calibrations.find(backend.model_id, 20, tmp_path / "home") == path
    )
    record = model_calibrations.read_record(path)
    assert (record["items"], record["signal_source"], record["top_k"]) == (40, "top20", 20)
    assert record["auroc"] > 0.9
    # No assistant prefix went to the API: a cloze item was asked as its instruction alone.
    asked = [r["messages"] for r in backend.requests]
    assert all(m[-1]["role"] == "user" for m in asked)
    cloze = [it for it in items if it.get("format") == "cloze"]
    assert cloze and any(f"Complete the sentence: {cloze[0]['question']}" == m[-1]["content"] for m in asked)
    # The rows keep the streamed text and signals (no ids to look them up by).
    rows = [json.loads(line) for line in (Path(result["labels"]["out"])).open()]
    assert all(r["pieces"] and "".join(r["pieces"]) == r["reply"] for r in rows)
    assert all(len(r["entropies"]) == len(r["surprises"]) == len(r["pieces"]) for r in rows)
    assert all(not math.isnan(h) for r in rows for h in r["entropies"])
    config = load_config(env={}, calibration_file=path)
    assert config.threshold == result["report"]["chosen"]["threshold"]


def probe_set() -> list[dict]:
    from importlib.resources import files

    text = (files("surprisegate") / "data" / "probe_questions.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class _Rows:
    """What `recording_states` yields: a row per position fed since `clear()`."""

    def __init__(self, layers) -> None:
        self.layers, self.rows, self.paused = list(layers), [], False

    def clear(self) -> None:
        self.rows.clear()

    def pause(self, paused: bool = True) -> None:
        self.paused = paused

    def states(self):
        return {layer: np.array(self.rows, dtype=np.float32).reshape(-1, 8) for layer in self.layers}


class StatesModel:
    """A scripted model that also gives hidden states (`SequenceStates`): each position's state is the one-hot
    of its token id modulo 8, so a wrong reply's letters leave their mark in the mean. `records` False: its
    recorder keeps nothing while labelling (every question is replayed instead)."""

    n_layer = 12

    def __init__(self, inner, records: bool = True) -> None:
        self._inner, self._records = inner, records
        self.passes: list[int] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def sequence_states(self, sequences, layers):
        self.passes += [len(s) for s in sequences]
        eye = np.eye(8, dtype=np.float32)
        return [{layer: eye[np.asarray(s) % 8] for layer in layers} for s in sequences]

    @contextlib.contextmanager
    def recording_states(self, layers):
        rows, inner, append = _Rows(layers), self._inner, self._inner.append
        eye = np.eye(8, dtype=np.float32)

        def recorded(tokens):
            if self._records and not rows.paused:
                rows.rows.extend(eye[t % 8] for t in tokens)
            return append(tokens)

        inner.append = recorded
        try:
            yield rows
        finally:
            inner.append = append


@pytest.mark.parametrize("records", [True, False])
def test_a_model_with_hidden_states_gets_its_probe_fitted_and_judged(tmp_path, monkeypatch, records):
    pytest.importorskip("matplotlib")
    from surprisegate import model_calibrations
    from surprisegate.backends import SequenceStates, SteerableBackend
    from surprisegate.config import Config
    from surprisegate.research.model_calibration import calibrate_model

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    items, extra = packaged_set()[:120], probe_set()[:120]
    backend = StatesModel(scripted_model(items + extra), records=records)
    assert isinstance(backend, SequenceStates) and isinstance(backend, SteerableBackend)
    result = calibrate_model(backend, Config(), limit=120, bootstrap=10)
    questions = [it for it in items if it.get("format", "qa") == "qa"] + extra  # the probe's extra ones too
    # States kept while labelling (no second pass), or one pass per labelled question and none per cloze item.
    assert len(backend.passes) == (0 if records else len(questions))
    probe = result["probe"]
    assert probe["states_recorded_while_labelling"] == (len(questions) if records else 0)
    assert probe["questions"] == len(questions) and probe["layers"] == [5, 6, 7, 8]
    assert {t["layer"] for t in probe["candidates"]} == {5, 6, 7, 8}
    extra_rows = Path(tmp_path / "home" / "calibrations" / result["slug"] / "probe_labels" / "labels.jsonl")
    assert len(extra_rows.read_text().splitlines()) == len(extra)  # its labels are kept, resumable, apart
    record = model_calibrations.read_record(result["calibration"])
    assert record["probe_why"] == probe["why"] and Path(record["probe_report"]).is_file()
    written = Path(result["calibration"]).with_name(f"{result['slug']}.probe.npz")
    assert written.is_file() == probe["written"]
    if probe["written"]:  # picked up for this model by probe = auto
        from surprisegate.gate.probe import resolve_probe

        found = resolve_probe("auto", backend.model_id)
        assert found is not None and found.layer == probe["layer"]


def test_states_kept_while_labelling_give_the_probe_a_replay_gives(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from surprisegate.config import Config
    from surprisegate.research.model_calibration import calibrate_model

    items, extra = packaged_set()[:80], probe_set()[:80]
    reports = []
    for records in (True, False):
        monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / f"home-{records}"))
        backend = StatesModel(scripted_model(items + extra), records=records)
        reports.append(calibrate_model(backend, Config(), limit=80, bootstrap=10)["probe"])
    kept, replayed = reports
    assert kept["states_recorded_while_labelling"] == kept["questions"] > 0
    same = ("candidates", "layer", "c", "half_b_window", "half_b_probe", "written", "why")
    assert {k: kept.get(k) for k in same} == {k: replayed.get(k) for k in same}

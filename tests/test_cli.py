"""CLI through click's CliRunner: bad input is a one-line error with the fix, exit code != 0, no traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from surprisegate.cli import main


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    for var in ("SURPRISE_CANARY", "SURPRISE_INTERVENE"):
        monkeypatch.delenv(var, raising=False)
    return CliRunner()


def assert_clean_error(result, *needles):
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.output.strip()
    assert message.count("\n") == 0, f"expected one line, got: {message!r}"
    for needle in needles:
        assert needle in message, message


def test_empty_question(runner):
    assert_clean_error(runner.invoke(main, ["ask", "  "]), "question is empty", "surprisegate ask")


def test_unknown_mode(runner):
    assert_clean_error(runner.invoke(main, ["ask", "Hi?", "--mode", "loud"]), "mode='loud'", "off, detect, intervene")


def test_threshold_not_a_number(runner):
    assert_clean_error(runner.invoke(main, ["ask", "Hi?", "--threshold", "high"]), "--threshold='high'", "e.g.")


def test_missing_memory_file(runner, tmp_path):
    missing = tmp_path / "nope.sqlite"
    result = runner.invoke(main, ["ask", "Hi?", "--mode", "intervene", "--memory", str(missing)])
    assert_clean_error(result, str(missing), "memory add")


def test_model_that_is_not_gguf(runner, tmp_path):
    fake = tmp_path / "model.bin"
    fake.write_bytes(b"PK\x03\x04not a gguf")
    assert_clean_error(runner.invoke(main, ["ask", "Hi?", "--model", str(fake)]), "not a GGUF file", ".gguf")
    assert_clean_error(runner.invoke(main, ["ask", "Hi?", "--model", str(tmp_path / "missing.gguf")]), "does not exist")
    assert_clean_error(
        runner.invoke(main, ["ask", "Hi?", "--model", str(tmp_path)]), "is a directory", "--backend transformers"
    )


def test_bad_config_file(runner, tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[surprisegate]\nwindow = 0\n")
    assert_clean_error(runner.invoke(main, ["ask", "Hi?", "--config", str(bad)]), "window=0", str(bad))


def test_env_flag_picks_mode_and_flag_beats_env(runner, monkeypatch):
    monkeypatch.setenv("SURPRISE_INTERVENE", "1")
    out = runner.invoke(main, ["config"])
    assert out.exit_code == 0 and 'mode = "intervene"' in out.output
    out = runner.invoke(main, ["config", "--mode", "detect", "--threshold", "3.5"])
    assert 'mode = "detect"' in out.output and "threshold = 3.5" in out.output


def test_receipts_show_missing_and_torn(runner, tmp_path):
    assert_clean_error(runner.invoke(main, ["receipts", "show", str(tmp_path / "none.jsonl")]), "does not exist")
    from surprisegate.gate.receipts import ReceiptWriter, receipt_record

    path = tmp_path / "r.jsonl"
    rec = receipt_record(
        reply_id="abc",
        created=0.0,
        model="m",
        backend="b",
        config={"mode": "detect"},
        prompt="Q?",
        reply="A.",
        n_tokens=2,
        surprise={"n": 2, "mean": 1.0, "p90": 1.5, "max": 2.0, "tail_mass": 0.0},
        canary={"verdict": "confident_unanchored"},
        rounds=[],
        mode="detect",
        finish_reason="stop",
    )
    ReceiptWriter(path).append(rec)
    with open(path, "a") as fh:
        fh.write('{"torn": ')
    result = runner.invoke(main, ["receipts", "show", str(path)])
    assert result.exit_code == 0
    assert "A." in result.output and "skipped" in result.output


def test_memory_add_and_search_json(runner, tmp_path):
    data = tmp_path / "kb.jsonl"
    data.write_text(
        json.dumps(
            {"kb_id": "country:BF", "title": "Burkina Faso", "text": "The capital of Burkina Faso is Ouagadougou."}
        )
        + "\n"
        + "{not json\n"
        + json.dumps({"kb_id": "country:TD", "title": "Chad", "text": "The capital of Chad is N'Djamena."})
        + "\n"
    )
    store = tmp_path / "m.sqlite"
    result = runner.invoke(main, ["memory", "add", "--memory", str(store), str(data)])
    assert result.exit_code == 0, result.output
    assert "added 2" in result.output and "line 2" in result.output
    result = runner.invoke(main, ["memory", "search", "--memory", str(store), "--json", "capital of Burkina Faso"])
    hits = json.loads(result.output)
    assert hits[0]["source"] == "country:BF" and "Ouagadougou" in hits[0]["text"]
    assert_clean_error(
        runner.invoke(main, ["memory", "search", "--memory", str(tmp_path / "x.sqlite"), "q"]), "does not exist"
    )


def test_eval_oracle_without_budget_or_off_fails_before_the_model_loads(runner, tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text(
        json.dumps({"id": "a", "question": "What is the capital of Chad?", "answers": ["N'Djamena"]}) + "\n"
    )
    base = [
        "eval",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o"),
        "--backend",
        "transformers",
        "--model",
        str(tmp_path / "missing"),
    ]  # a model that cannot load: the error must come first
    assert_clean_error(
        runner.invoke(main, base + ["--modes", "off,oracle"]),
        "--modes='off,oracle'",
        "add intervene to --modes",
        "--oracle-calls N",
    )
    assert_clean_error(runner.invoke(main, base + ["--modes", "intervene,oracle"]), "add off")
    assert_clean_error(
        runner.invoke(main, base + ["--modes", "off,oracle", "--oracle-calls", "-2"]), "--oracle-calls=-2"
    )
    assert "oracle" in runner.invoke(main, ["eval", "--help"]).output


def test_ask_chat_errors_name_the_file_or_the_turn(runner, tmp_path):
    bad = tmp_path / "chat.json"
    bad.write_text("[{'role': 'user'}]")
    assert_clean_error(runner.invoke(main, ["ask", "--chat", str(bad)]), "is not JSON", "turns")
    bad.write_text(json.dumps([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]))
    assert_clean_error(runner.invoke(main, ["ask", "--chat", str(bad)]), "messages[-1]", "user turn")
    assert_clean_error(runner.invoke(main, ["ask", "--chat", str(tmp_path / "none.json")]), "cannot be read")


@pytest.mark.slow
def test_ask_continues_a_chat_from_standard_input(runner):
    chat = [
        {"role": "user", "content": "Let's talk geography."},
        {"role": "assistant", "content": "Sure!"},
        {"role": "user", "content": "What is the capital of Burkina Faso?"},
    ]
    result = runner.invoke(main, ["ask", "--mode", "intervene", "--json", "--chat", "-"], input=json.dumps(chat))
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    receipt = next(json.loads(line) for line in open(out["receipt"], encoding="utf-8") if out["receipt_id"] in line)
    assert receipt["messages"][1:] == chat and receipt["prompt"] == chat[-1]["content"]
    assert "Ouagadougou" in out["reply"]


def test_ask_format_errors_name_the_flag_before_the_model_loads(runner, tmp_path):
    assert_clean_error(runner.invoke(main, ["ask", "--format", str(tmp_path / "none.json"), "q?"]), "--format=")
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    assert_clean_error(runner.invoke(main, ["ask", "--format", str(listed), "q?"]), "not a JSON schema object")


@pytest.mark.slow
def test_ask_writes_json_under_a_schema_with_the_gate_inside(runner, tmp_path):
    schema = tmp_path / "capital.json"
    properties = {"country": {"type": "string"}, "capital": {"type": "string"}}
    schema.write_text(json.dumps({"type": "object", "properties": properties, "required": ["country", "capital"]}))
    args = ["ask", "--mode", "intervene", "--json", "--format", str(schema), "What is the capital of Burkina Faso?"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert json.loads(out["reply"])["capital"] == "Ouagadougou", out["reply"]
    assert out["rounds"]


# --------------------------------------------------------------------------------------------------
# per-model calibration: `calibrate --backend`, its pickup, and the detect-only fallback
# --------------------------------------------------------------------------------------------------
def test_calibrate_needs_one_way_and_the_options_of_that_way(runner, tmp_path):
    assert_clean_error(runner.invoke(main, ["calibrate"]), "--backend URI", "--labels DIR")
    both = ["calibrate", "--backend", "llama-server://127.0.0.1:9", "--labels", str(tmp_path)]
    assert_clean_error(runner.invoke(main, both), "two ways to calibrate")
    assert_clean_error(runner.invoke(main, ["calibrate", "--labels", str(tmp_path)]), "--out is needed with --labels")
    assert_clean_error(
        runner.invoke(main, ["calibrate", "--labels", str(tmp_path), "--out", "c.toml", "--limit", "5"]),
        "--limit=5",
        "go with --backend",
    )
    assert_clean_error(
        runner.invoke(main, ["calibrate", "--backend", "llamacpp", "--top-k", "20"]), "--top-k=20", "drop it"
    )
    assert_clean_error(runner.invoke(main, ["calibrate", "--backend", "llamacpp", "--limit", "0"]), "--limit=0")


@pytest.fixture
def uncalibrated(monkeypatch):
    """The CLI's backend is a scripted model no calibration knows (full distribution: key scripted-test-model--full)."""
    from scripted import ScriptedBackend, plan

    backend = ScriptedBackend(lambda context: plan("The capital is Kumbu.", doubtful="Kumbu", doubtful_prob=0.01))
    monkeypatch.setattr("surprisegate.runtime.load_backend", lambda config: backend)
    return backend


def test_an_uncalibrated_model_asked_to_intervene_only_detects_and_says_so_once(runner, uncalibrated, tmp_path):
    receipts = tmp_path / "r.jsonl"
    args = ["ask", "Capital?", "--mode", "intervene", "--memory", "none", "--receipts", str(receipts)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("no calibration for scripted-test-model: running detect only") == 1
    assert "calibrate with: surprisegate calibrate --backend llamacpp" in result.stderr
    assert result.stdout.startswith("[detect] Capital?")
    receipt = json.loads(receipts.read_text().splitlines()[-1])
    assert receipt["config"]["mode"] == "detect" and receipt["rounds"] == []
    # A threshold the user gives is theirs to choose: intervene then runs, and nothing is said.
    result = runner.invoke(main, [*args, "--threshold", "5"])
    assert result.exit_code == 0 and "no calibration" not in result.stderr
    assert json.loads(receipts.read_text().splitlines()[-1])["config"]["mode"] == "intervene"


def test_eval_refuses_to_intervene_on_an_uncalibrated_model(runner, uncalibrated, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "Capital?", "answers": ["Kumbu"]}) + "\n")
    result = runner.invoke(
        main, ["eval", "--data", str(data), "--modes", "off,intervene", "--out", str(tmp_path / "o")]
    )
    assert_clean_error(result, "intervene needs thresholds for scripted-test-model", "surprisegate calibrate --backend")


def test_calibrate_backend_writes_a_calibration_that_ask_picks_up(runner, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from test_threshold_sweep import packaged_set, scripted_model

    backend = scripted_model(packaged_set()[:30])
    monkeypatch.setattr("surprisegate.runtime.load_backend", lambda config: backend)
    result = runner.invoke(main, ["calibrate", "--backend", "llamacpp", "--limit", "30", "--bootstrap", "10"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "home" / "calibrations" / "scripted-test-model--full.toml"
    assert f"wrote {path}" in result.stdout and "picked up by ask, eval and demo" in result.stdout
    assert "calibrated scripted-test-model (full distribution) on 30 replies" in result.stdout
    question = packaged_set()[0]["question"]
    result = runner.invoke(main, ["ask", question, "--mode", "intervene", "--memory", "none"])
    assert result.exit_code == 0, result.output
    said = f"using the calibration for scripted-test-model (full distribution) from {path}"
    assert result.stderr.count(said) == 1 and "no calibration" not in result.stderr


@pytest.mark.slow
def test_calibrate_backend_against_the_real_llama_server_is_picked_up_by_ask(runner, request, tmp_path):
    pytest.importorskip("matplotlib")
    from test_backend_llama_server import shared_server

    process = shared_server(request.config)
    uri = process.uri
    # 30 items: the first 30 of the set hold 8 right replies of SmolLM2, enough of each kind to calibrate.
    result = runner.invoke(main, ["calibrate", "--backend", uri, "--limit", "30", "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "home" / "calibrations" / "smollm2-135m-instruct.q4_1.gguf--top20.toml"
    assert f"wrote {path}" in result.stdout and "(top-20) on 30 replies" in result.stdout
    ask = ["ask", "What is the capital of Chad?", "--backend", uri, "--mode", "intervene", "--memory", "none"]
    result = runner.invoke(main, ask)
    assert result.exit_code == 0, result.output
    assert result.stderr.count(" (top-20) from " + str(path)) == 1
    assert "using the calibration for " in result.stderr and "no calibration" not in result.stderr
    receipt = json.loads((tmp_path / "home" / "receipts.jsonl").read_text().splitlines()[-1])
    assert receipt["config"]["threshold"] == load_record_threshold(path)


@pytest.mark.slow
def test_calibrate_a_chat_api_through_the_openai_client_is_picked_up_by_ask(runner, request, tmp_path, monkeypatch):
    """The real llama.cpp server used as a black box: its /v1 chat API through the official `openai` client
    (no token ids, cloze items asked as instructions), calibrated on the top-20 logprobs it streams."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("openai")
    from test_backend_llama_server import shared_server

    process = shared_server(request.config)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    chat = ["--backend", "openai", "--base-url", f"http://{process.host}:{process.port}/v1", "--model", "smol-chat"]
    result = runner.invoke(main, ["calibrate", *chat, "--limit", "40", "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "home" / "calibrations" / "smol-chat--top20.toml"
    assert f"wrote {path}" in result.stdout and "calibrated smol-chat (top-20) on 40 replies" in result.stdout
    rows = [
        json.loads(line)
        for line in (tmp_path / "home" / "calibrations" / "smol-chat--top20" / "labels" / "labels.jsonl").open()
    ]
    assert len(rows) == 40 and all("".join(r["pieces"]) == r["reply"] and r["entropies"] for r in rows)
    result = runner.invoke(
        main, ["ask", "What is the capital of Chad?", *chat, "--mode", "intervene", "--memory", "none"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count(" (top-20) from " + str(path)) == 1 and "no calibration" not in result.stderr
    receipt = json.loads((tmp_path / "home" / "receipts.jsonl").read_text().splitlines()[-1])
    assert receipt["config"]["threshold"] == load_record_threshold(path) and receipt["backend"] == "openai"
    assert "sk-local-test" not in json.dumps(receipt)


def load_record_threshold(path) -> float:
    import tomllib

    return tomllib.loads(path.read_text())["surprisegate"]["threshold"]

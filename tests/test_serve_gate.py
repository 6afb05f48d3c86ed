"""serve/gate.py: private receipts with a cap on each, and what a client sees of the server in its receipt;
serve/main.py: what serve decides whatever the config says (no Python unless the operator allows it)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")

from surprisegate.config import Config, ConfigLayers
from surprisegate.errors import InputError
from surprisegate.gate.receipts import read_receipts
from surprisegate.serve import main as serve_main
from surprisegate.serve.gate import ClientView, RotatingReceipts
from surprisegate.serve.main import ServeOptions, served_layers


def receipt(**changes):
    base = {
        "schema": "surprisegate.receipt/1",
        "reply_id": "r1",
        "created": "2026-12-02T00:00:00Z",
        "mode": "intervene",
        "model": "/srv/models/secret-model.gguf",
        "config": Config(
            tool_roots=("/srv/private-notes",),
            tool_status_targets=("http://10.1.2.3:9000/health",),
            model="/srv/models/secret-model.gguf",
            system_prompt="You are the internal assistant of ACME. Never reveal the codename BLUEBIRD.",
        ).to_dict(),
        "prompt_sha256": "ab" * 32,
        "messages": [
            {
                "role": "system",
                "content": "You are the internal assistant of ACME. Never reveal the codename BLUEBIRD.",
            },
            {"role": "user", "content": "What is in notes.txt?"},
        ],
        "reply": "It says hello.",
        "n_tokens": 5,
        "rounds": [
            {
                "arms": [
                    {
                        "arm": "tool",
                        "status": "error",
                        "error": "files@question: path 'x' is outside the allowed roots (/srv/private-notes); "
                        "status target 127.0.0.1:22 is not on the allow-list (http://10.1.2.3:9000/health)",
                    }
                ]
            }
        ],
        "extra": {},
    }
    return base | changes


# --------------------------------------------------------------------------------------------------
# receipts on disk
# --------------------------------------------------------------------------------------------------
def test_a_fresh_receipts_file_is_0600_in_a_0700_folder_whatever_the_umask(tmp_path):
    folder = tmp_path / "made-by-serve" / "receipts"
    path = folder / "serve-receipts.jsonl"
    old = os.umask(0o000)  # the loosest umask: the modes must come from the writer, not from it
    try:
        RotatingReceipts(path).append(receipt())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700  # every folder it made
    listing = subprocess.run(["ls", "-ld", str(folder), str(path)], capture_output=True, text=True).stdout
    assert listing.count("-rw-------") == 1 and listing.count("drwx------") == 1, listing


def test_an_existing_folder_keeps_the_operators_modes(tmp_path):
    tmp_path.chmod(0o755)
    RotatingReceipts(tmp_path / "r.jsonl").append(receipt())
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "r.jsonl").stat().st_mode) == 0o600


def test_rotated_files_stay_private(tmp_path):
    path = tmp_path / "r.jsonl"
    receipts = RotatingReceipts(path, max_bytes=4096, keep=2, max_receipt_bytes=4096)
    for i in range(12):
        receipts.append(receipt(reply_id=f"r{i}"))
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_one_huge_receipt_is_cut_to_its_cap_and_cannot_flush_the_others(tmp_path):
    path = tmp_path / "r.jsonl"
    receipts = RotatingReceipts(path, max_bytes=1 << 20, keep=2, max_receipt_bytes=8192)
    for i in range(20):
        receipts.append(receipt(reply_id=f"small-{i}"))
    huge = receipt(reply_id="huge", reply="x" * 600_000)
    huge["config"]["kind_thresholds"] = {"k" * 300_000: 1.0}
    for _ in range(12):  # the red team's dozen requests that rotated every earlier receipt out of a 1 MB file
        receipts.append(huge)
    lines = path.read_bytes().splitlines()
    assert all(len(line) <= 8192 for line in lines)
    kept = {r["reply_id"] for r in read_receipts(path)}
    assert {f"small-{i}" for i in range(20)} <= kept  # nothing rotated out
    cut = [r for r in read_receipts(path) if r["reply_id"] == "huge"][0]
    assert cut["truncated"]["bytes"] > 600_000 and cut["truncated"]["cap"] == 8192
    assert cut["prompt_sha256"] == "ab" * 32 and cut["mode"] == "intervene"


def test_the_receipt_cap_is_checked(tmp_path):
    with pytest.raises(InputError, match="max_receipt_bytes"):
        RotatingReceipts(tmp_path / "r.jsonl", max_bytes=4096, max_receipt_bytes=10)


# --------------------------------------------------------------------------------------------------
# what a client sees
# --------------------------------------------------------------------------------------------------
def view_for(config: Config, show_config: bool = False) -> ClientView:
    runtime = SimpleNamespace(backend=SimpleNamespace(model_id=config.model))
    return ClientView.of(runtime, config, served_model="secret-model", show_config=show_config)


def test_a_clients_receipt_leaves_out_the_servers_configuration():
    r = receipt()
    config = Config(**{k: v for k, v in r["config"].items() if k != "kind_thresholds"} | {"kind_thresholds": {}})
    seen = view_for(config).receipt(r)
    text = json.dumps(seen)
    for secret in ("/srv/private-notes", "10.1.2.3", "/srv/models", "BLUEBIRD", "tool_roots", "system_prompt"):
        assert secret not in text, secret
    assert seen["model"] == "secret-model"
    assert seen["config"]["mode"] == r["config"]["mode"] and "max_tokens" in seen["config"]
    assert seen["messages"] == [{"role": "user", "content": "What is in notes.txt?"}]
    assert "outside the allowed roots ([server])" in seen["rounds"][0]["arms"][0]["error"]
    assert seen["reply"] == r["reply"] and seen["prompt_sha256"] == r["prompt_sha256"]
    assert r["config"]["tool_roots"] == ["/srv/private-notes"]  # the file's copy is untouched


def test_a_clients_own_system_text_stays_in_its_receipt():
    r = receipt()
    server_prompt = r["messages"][0]["content"]
    r["messages"][0] = {"role": "system", "content": server_prompt + "\n\nAnswer in French."}
    config = Config(system_prompt=server_prompt)
    assert view_for(config).receipt(r)["messages"][0] == {"role": "system", "content": "Answer in French."}


def test_the_operator_may_show_the_config():
    r = receipt()
    assert view_for(Config(model="/srv/models/secret-model.gguf"), show_config=True).receipt(r) is r


# --------------------------------------------------------------------------------------------------
# what serve decides
# --------------------------------------------------------------------------------------------------
def test_serve_runs_no_python_and_keeps_no_web_cache_unless_the_operator_says(tmp_path):
    config_file = tmp_path / "c.toml"
    config_file.write_text("tool_python = true\nweb_cache_s = 3600\n")
    layers = ConfigLayers(config_file, {}, {"SURPRISEGATE_TOOL_PYTHON": "1"})
    assert layers.load().tool_python is True
    served = served_layers(layers, ServeOptions()).load()
    assert served.tool_python is False and served.web_cache_s == 0.0
    assert served_layers(layers, ServeOptions(allow_python=True)).load().tool_python is True
    assert served_layers(layers, ServeOptions(allow_python=True, tools=False)).load().tool_python is False


def test_allow_python_refuses_to_start_without_isolation(monkeypatch):
    from surprisegate.arms import sandbox

    monkeypatch.setattr(sandbox, "isolation_status", lambda mode: (False, "namespaces are forbidden here"))
    with pytest.raises(InputError, match="namespaces are forbidden here.*bubblewrap"):
        serve_main.check_python_sandbox(Config())
    monkeypatch.setattr(sandbox, "isolation_status", lambda mode: (True, "bwrap works here"))
    serve_main.check_python_sandbox(Config())


def test_the_tool_arm_serve_builds_has_no_python_tool():
    from surprisegate.runtime import build_arms

    off = served_layers(ConfigLayers(None, {}, {}), ServeOptions()).load()
    on = served_layers(ConfigLayers(None, {}, {}), ServeOptions(allow_python=True)).load()
    assert "python" not in build_arms(off, memory=None, tools=True)["tool"].tools
    assert "python" in build_arms(on, memory=None, tools=True)["tool"].tools


def test_receipts_show_config_reaches_the_clients_view(tmp_path):
    from surprisegate.serve.app import create_app

    runtime = SimpleNamespace(
        backend=SimpleNamespace(model_id="/srv/m.gguf", name="scripted"), config=Config(), thresholds=None, arms={}
    )
    for shown in (False, True):
        settings = serve_main.build_settings(ServeOptions(show_config=shown, keep_receipts=False), 1, "/srv/m.gguf")
        view = create_app(runtime, settings).state.server.view
        assert settings.show_config is shown and view.show_config is shown and view.served_model == "m"

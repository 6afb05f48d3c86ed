"""Config: precedence (argument > file > env > defaults), env flags, validation messages."""

from __future__ import annotations

import dataclasses

import pytest

from surprisegate.config import Config, load_config, to_toml
from surprisegate.errors import ConfigError


def test_defaults_are_off():
    c = load_config(env={})
    assert c.mode == "off" and c.max_rounds == 2 and c.statistic == "mean"
    assert 1 <= c.min_tokens and c.window >= 1 and c.threshold > 0


@pytest.mark.parametrize(
    "env,mode",
    [
        ({}, "off"),
        ({"SURPRISE_CANARY": "1"}, "detect"),
        ({"SURPRISE_INTERVENE": "1"}, "intervene"),
        ({"SURPRISE_CANARY": "1", "SURPRISE_INTERVENE": "1"}, "intervene"),
        ({"SURPRISE_CANARY": "0"}, "off"),
        ({"SURPRISE_INTERVENE": "true"}, "off"),  # only "1" switches it on
    ],
)
def test_env_flags(env, mode):
    assert load_config(env=env).mode == mode


def test_precedence_argument_beats_file_beats_env(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[surprisegate]\nmode = "detect"\nthreshold = 3.25\nwindow = 8\n')
    env = {"SURPRISE_INTERVENE": "1", "SURPRISEGATE_THRESHOLD": "9.0", "SURPRISEGATE_MAX_ROUNDS": "3"}
    c = load_config(toml, env=env)
    assert (c.mode, c.threshold, c.window, c.max_rounds) == ("detect", 3.25, 8, 3)
    c = load_config(toml, overrides={"mode": "off", "threshold": 1.5, "window": None}, env=env)
    assert (c.mode, c.threshold, c.window) == ("off", 1.5, 8)


def test_toml_round_trip(tmp_path):
    c = Config(
        mode="intervene", threshold=2.75, arm_order_other=("web", "memory"), evidence_template='Say "{evidence}"'
    )
    p = tmp_path / "rt.toml"
    p.write_text(to_toml(c))
    assert load_config(p, env={}) == c


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"mode": "loud"}, "mode='loud'"),
        ({"threshold": "abc"}, "threshold='abc'"),
        ({"threshold": float("nan")}, "threshold=nan"),
        ({"window": 0}, "window=0"),
        ({"window": "sixteen"}, "window='sixteen'"),
        ({"statistic": "median"}, "statistic='median'"),
        ({"max_rounds": -1}, "max_rounds=-1"),
        ({"round_deadline_s": 0}, "round_deadline_s=0"),
        ({"relevance_floor": 2}, "relevance_floor=2"),
        ({"arm_order_other": ("memory", "oracle")}, "arm_order_other="),
        ({"evidence_template": "no placeholder"}, "evidence_template="),
        ({"stream": "tty"}, "stream='tty'"),
        ({"bogus": 1}, "unknown config key 'bogus'"),
    ],
)
def test_invalid_values_name_key_value_and_fix(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides, env={})
    msg = str(err.value)
    assert needle in msg
    assert any(word in msg for word in ("use ", "expected", "known keys", "include"))


def test_bad_env_value_says_it_came_from_the_environment():
    with pytest.raises(ConfigError, match="window='0'.*environment|window=0.*env"):
        load_config(env={"SURPRISEGATE_WINDOW": "0"})


def test_bad_file_is_named(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("threshold = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p, env={})
    p.write_text("[surprisegate]\nthreshhold = 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'threshhold'.*bad.toml"):
        load_config(p, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})


def test_config_is_frozen():
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.mode = "intervene"  # type: ignore[misc]
    assert c.replace(mode="detect").mode == "detect" and c.mode == "off"


def test_tool_results_use_their_own_template():
    from surprisegate.arms import Evidence
    from surprisegate.config import evidence_text

    c = Config(evidence_template="Use: {evidence} ({source})", tool_evidence_template="Fact: {evidence}")
    assert evidence_text(c, Evidence("c", "The capital is X.", 0.9, "memory:a")) == "Use: The capital is X. (memory:a)"
    assert (
        evidence_text(c, Evidence("c", "The answer is 4.", 1.0, "tool:calculator", observable=1.0))
        == "Fact: The answer is 4."
    )
    with pytest.raises(ConfigError, match="tool_evidence_template"):
        Config(tool_evidence_template="no placeholder")


# --------------------------------------------------------------------------------------------------
# the per-model calibration layer: flag > file > env > calibration > shipped defaults
# --------------------------------------------------------------------------------------------------
def calibration_file(tmp_path, body: str = ""):
    path = tmp_path / "model--top20.toml"
    path.write_text(
        '[surprisegate]\nsignal = "surprise"\nthreshold = 2.5\nwindow = 8\n'
        + body
        + '\n[surprisegate.kind_thresholds]\ncapital = 0.5\n\n[calibration]\nmodel_id = "m"\nitems = 400\n'
    )
    return path


def test_a_calibration_beats_the_shipped_defaults(tmp_path):
    c = load_config(env={}, calibration_file=calibration_file(tmp_path))
    assert (c.signal, c.threshold, c.window, c.kind_thresholds) == ("surprise", 2.5, 8, {"capital": 0.5})
    assert c.statistic == Config().statistic  # keys it does not set keep the shipped default


def test_flag_file_and_env_each_beat_a_calibration(tmp_path):
    cal = calibration_file(tmp_path)
    assert load_config(env={"SURPRISEGATE_THRESHOLD": "7"}, calibration_file=cal).threshold == 7.0
    toml = tmp_path / "c.toml"
    toml.write_text("[surprisegate]\nwindow = 16\n")
    c = load_config(toml, env={"SURPRISEGATE_THRESHOLD": "7"}, calibration_file=cal)
    assert (c.window, c.threshold, c.signal) == (16, 7.0, "surprise")
    c = load_config(toml, overrides={"threshold": 1.25, "window": None}, env={}, calibration_file=cal)
    assert (c.threshold, c.window) == (1.25, 16)


def test_a_calibration_sets_only_the_calibrated_keys(tmp_path):
    # A full `calibrate --out` config copied into calibrations/ must not switch mode or backend.
    cal = calibration_file(tmp_path, 'mode = "intervene"\nbackend = "llama-server://127.0.0.1:1"\n')
    c = load_config(env={}, calibration_file=cal)
    assert (c.mode, c.backend, c.threshold) == ("off", "llamacpp", 2.5)


def test_a_bad_calibration_value_names_the_file(tmp_path):
    cal = calibration_file(tmp_path, "min_tokens = 0\n")
    with pytest.raises(ConfigError, match=r"min_tokens=0 \(from .*model--top20.toml\) is invalid"):
        load_config(env={}, calibration_file=cal)
    cal.write_text("[surprisegate\n")
    with pytest.raises(ConfigError, match="calibration=.*cannot be read.*calibrate --backend"):
        load_config(env={}, calibration_file=cal)


def test_layers_say_which_keys_the_user_gave(tmp_path):
    from surprisegate.config import ConfigLayers

    toml = tmp_path / "c.toml"
    toml.write_text("[surprisegate]\nkind_thresholds = {capital = 1.0}\n")
    assert ConfigLayers(env={}).given() == set()
    assert ConfigLayers(overrides={"threshold": None, "mode": "intervene"}, env={}).given() == {"mode"}
    assert ConfigLayers(env={"SURPRISEGATE_THRESHOLD": "2"}).given() == {"threshold"}
    assert ConfigLayers(toml, env={}).given() == {"kind_thresholds"}
    layers = ConfigLayers(toml, {"window": 8}, env={})
    assert layers.load(calibration_file(tmp_path)).kind_thresholds == {"capital": 1.0}

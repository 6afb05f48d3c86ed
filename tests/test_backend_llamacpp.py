"""The llama.cpp backend on the real embedded model: rewind is exact (like mlx-lm's
test_trim_cache_with_generate): decode N, trim k, re-decode -> same tokens as a fresh run, close logits."""

from __future__ import annotations

import numpy as np
import pytest

from surprisegate.gate.prompting import PromptLayout, chat_messages

pytestmark = pytest.mark.slow

N, K = 24, 8
LOGIT_TOLERANCE = 1e-3  # measured: 0.0 (same kernels, same positions); allow float noise across builds


def prompt_tokens(backend, question="What is the capital of France?"):
    layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(question))
    return layout.body_tokens(backend.tokenize) + layout.open_tokens(backend.tokenize)


def greedy(backend, logits, n):
    tokens, all_logits = [], []
    for _ in range(n):
        all_logits.append(np.array(logits, copy=True))
        t = int(np.argmax(logits))
        tokens.append(t)
        logits = backend.append([t])
    return tokens, all_logits


def test_trim_then_redecode_matches_a_fresh_run(llama_backend):
    b = llama_backend
    prompt = prompt_tokens(b, "Write a sentence about the sea.")
    b.reset()
    fresh_tokens, fresh_logits = greedy(b, b.append(prompt), N)
    assert b.n_tokens == len(prompt) + N
    assert b.trim(K) == K
    assert b.n_tokens == len(prompt) + N - K
    re_tokens, re_logits = greedy(b, b.logits(), K)
    assert re_tokens == fresh_tokens[N - K :]
    for got, want in zip(re_logits, fresh_logits[N - K :], strict=True):
        assert np.max(np.abs(got - want)) <= LOGIT_TOLERANCE


def test_trim_then_append_other_tokens_equals_fresh_prefill(llama_backend):
    b = llama_backend
    prompt = prompt_tokens(b)
    b.reset()
    tokens, _ = greedy(b, b.append(prompt), 12)
    b.trim(5)
    other = b.tokenize(" Lyon is nice.")
    spliced = b.append(other).copy()
    # The fresh run evaluates in the same schedule (prompt batch, one token at a time, then the splice):
    # llama.cpp's batched and single-token kernels round differently, so the schedule must match.
    b.reset()
    b.append(prompt)
    for t in tokens[:7]:
        b.append([t])
    fresh = b.append(other).copy()
    assert int(np.argmax(spliced)) == int(np.argmax(fresh))
    assert np.max(np.abs(spliced - fresh)) <= LOGIT_TOLERANCE


def test_trim_returns_what_it_dropped(llama_backend):
    b = llama_backend
    b.reset()
    b.append(b.tokenize("one two three"))
    n = b.n_tokens
    assert b.trim(0) == 0 and b.n_tokens == n
    assert b.trim(n + 10) == n and b.n_tokens == 0
    with pytest.raises(ValueError):
        b.trim(-1)


def test_special_tokens_and_bytes(llama_backend):
    b = llama_backend
    assert len(b.tokenize("<|im_start|>", special=True)) == 1  # template text: the control token
    assert len(b.tokenize("<|im_start|>")) > 1  # text from outside: its letters
    assert b.tokenize("<|im_end|>", special=True)[0] in b.eos_token_ids
    text = "Ouagadougou, Zürich, naïve café — 東京 🙂"
    ids = b.tokenize(text)
    assert b"".join(b.token_bytes(t) for t in ids).decode("utf-8") == text
    assert b.token_bytes(b.tokenize("<|im_end|>", special=True)[0]) == b""


def test_logits_are_a_fresh_view_per_step_and_detection_only_reads(llama_backend):
    from surprisegate.backends import Sampling

    b = llama_backend
    b.reset()
    logits = b.append(prompt_tokens(b))
    before = logits.copy()
    Sampling().step(logits, int(logits.argmax()), b"")
    np.testing.assert_array_equal(logits, before)


@pytest.fixture(scope="module")
def tapped_backend(llama_backend):
    """A second copy of the embedded model with layer 17 tapped (the shipped probe's layer)."""
    from surprisegate.backends.llamacpp import from_llamacpp

    backend = from_llamacpp(None, n_ctx=1024)
    backend.tap_layer(17)
    return backend


def test_a_layer_tap_leaves_the_logits_alone_and_its_state_follows_the_context(llama_backend, tapped_backend):
    prompt = prompt_tokens(llama_backend, "Write a sentence about the sea.")
    llama_backend.reset()
    want_tokens, want_logits = greedy(llama_backend, llama_backend.append(prompt), N)
    tapped_backend.reset()
    assert tapped_backend.hidden_state() is None  # nothing decoded yet
    logits = tapped_backend.append(prompt)
    states = []
    got_tokens, got_logits = [], []
    for _ in range(N):
        states.append(np.array(tapped_backend.hidden_state(), copy=True))
        got_logits.append(np.array(logits, copy=True))
        got_tokens.append(int(np.argmax(logits)))
        logits = tapped_backend.append([got_tokens[-1]])
    assert got_tokens == want_tokens and tapped_backend.tapped_layer == 17
    for got, want in zip(got_logits, want_logits, strict=True):
        assert np.max(np.abs(got - want)) == 0.0  # bit for bit: the tap only reads
    assert states[0].shape == (576,) and all(np.isfinite(s).all() for s in states)
    assert min(np.linalg.norm(a - b) for a, b in zip(states, states[1:], strict=False)) > 0  # a state per position
    # Trim and re-decode: the state at a position is the state a fresh run had there.
    assert tapped_backend.trim(K) == K
    assert tapped_backend.hidden_state() is None  # stale until the position is computed again
    tapped_backend.logits()
    np.testing.assert_allclose(tapped_backend.hidden_state(), states[N - K], atol=1e-3)


@pytest.mark.parametrize("native", [True, False])
def test_a_paused_tap_keeps_no_state_and_leaves_the_logits_alone(native, monkeypatch):
    from surprisegate.backends import layer_tap
    from surprisegate.backends.capabilities import PausableTap
    from surprisegate.backends.llamacpp import from_llamacpp

    if not native:
        monkeypatch.setattr(layer_tap, "native_callback", lambda: None)
    backend = from_llamacpp(None, n_ctx=1024)
    backend.tap_layer(17)
    assert isinstance(backend, PausableTap) and backend._tap.native == native
    prompt = prompt_tokens(backend, "Write a sentence about the sea.")

    def decode(paused: range) -> tuple[list[int], list[np.ndarray | None]]:
        backend.reset()
        logits = backend.append(prompt)
        tokens, states = [], []
        for i in range(6):
            backend.read_hidden(i not in paused)
            if i in paused:
                assert backend.hidden_state() is None  # what it kept is no longer current
            tokens.append(int(np.argmax(logits)))
            logits = backend.append([tokens[-1]])
            state = backend.hidden_state()
            states.append(None if state is None else np.array(state, copy=True))
        return tokens, states

    tokens, states = decode(paused=range(0))
    paused_tokens, paused_states = decode(paused=range(1, 3))
    assert paused_tokens == tokens  # the tap only reads, paused or not
    assert paused_states[1] is None and paused_states[2] is None  # a paused tap keeps nothing
    for i in (0, 3, 4, 5):  # on again: the state a tap that never paused had there
        np.testing.assert_array_equal(paused_states[i], states[i])


def test_a_session_reads_the_tap_only_for_a_decode_that_asks_for_states(tapped_backend):
    from surprisegate.backends import Sampling

    prompt = prompt_tokens(tapped_backend, "Name a river.")
    try:
        for hidden in (False, True, False):
            steps = tapped_backend.session().steps(prompt, Sampling(scored=True, hidden=hidden))
            first = next(steps)
            assert (first.hidden is not None) == hidden
            assert tapped_backend._tap._native_state.paused == (not hidden)
    finally:
        tapped_backend.read_hidden(True)


def test_the_compiled_tap_and_the_python_tap_read_the_same_state(tapped_backend, monkeypatch):
    from surprisegate.backends import layer_tap
    from surprisegate.backends.llamacpp import from_llamacpp

    # setup builds llama-cpp-python from source, so a C compiler and ggml.h are here: the tap is compiled.
    assert tapped_backend._tap.native
    monkeypatch.setattr(layer_tap, "native_callback", lambda: None)
    python_tapped = from_llamacpp(None, n_ctx=1024)
    python_tapped.tap_layer(17)
    assert not python_tapped._tap.native
    prompt = prompt_tokens(tapped_backend, "Name a river.")
    for backend in (tapped_backend, python_tapped):
        backend.reset()
        backend.append(prompt)
    for _ in range(8):
        np.testing.assert_array_equal(tapped_backend.hidden_state(), python_tapped.hidden_state())
        token = int(np.argmax(tapped_backend.logits()))
        assert token == int(np.argmax(python_tapped.logits()))
        tapped_backend.append([token])
        python_tapped.append([token])


def test_the_compiled_rows_tap_and_the_python_one_keep_the_same_rows(llama_backend, monkeypatch):
    from surprisegate.backends import layer_tap

    prompt = prompt_tokens(llama_backend, "Name a river.")
    kept = {}
    for native in (True, False):
        if not native:
            monkeypatch.setattr(layer_tap, "native_callback", lambda: None)
        with llama_backend.recording_states([4, 17]) as rows:
            assert isinstance(rows, layer_tap.NativeRowsTap) == native
            llama_backend.append(prompt[:3])  # fed before the clear: not kept
            rows.clear()
            logits = llama_backend.append(prompt[3:])
            for _ in range(6):  # decoding, one position a graph
                logits = llama_backend.append([int(np.argmax(logits))])
            kept[native] = rows.states()
            rows.pause()  # paused: fed positions keep nothing
            logits = llama_backend.append([int(np.argmax(logits))])
            assert {layer: len(r) for layer, r in rows.states().items()} == {4: len(prompt) + 3, 17: len(prompt) + 3}
            rows.pause(False)
            llama_backend.append([int(np.argmax(logits))])
            assert len(rows.states()[4]) == len(prompt) + 4
    assert {layer: r.shape for layer, r in kept[True].items()} == {
        4: (len(prompt) + 3, 576),
        17: (len(prompt) + 3, 576),
    }
    for layer in (4, 17):
        np.testing.assert_array_equal(kept[True][layer], kept[False][layer])


def test_the_compiled_rows_tap_refuses_to_read_past_its_buffers():
    import llama_cpp

    from surprisegate.backends import layer_tap

    native = layer_tap.native_callback()
    assert native is not None
    rows = layer_tap.NativeRowsTap(llama_cpp, [3], 4, capacity=2, native=native)
    rows._state.count[0] = 3  # as the callback leaves it after a third row
    with pytest.raises(RuntimeError, match="3 rows since the last clear, more than the 2 kept"):
        rows.states()
    rows.clear()
    assert rows.states()[3].shape == (0, 4)
    with pytest.raises(ValueError, match="at most 8 layers"):
        layer_tap.NativeRowsTap(llama_cpp, list(range(9)), 4, capacity=2, native=native)


def test_a_layer_outside_the_model_is_refused(tapped_backend):
    from surprisegate.errors import InputError

    with pytest.raises(InputError, match="layer=99 is outside this model's layers 0..29"):
        tapped_backend.tap_layer(99)


@pytest.fixture
def fresh_native(tmp_path, monkeypatch):
    """native_callback() with its cache emptied and a home of its own (restored for later tests)."""
    from surprisegate.backends import layer_tap

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))
    layer_tap.native_callback.cache_clear()
    yield layer_tap
    layer_tap.native_callback.cache_clear()


def test_the_tap_is_compiled_once_into_home_and_reused(fresh_native, tmp_path, monkeypatch):
    assert fresh_native.native_callback() is not None
    (built,) = (tmp_path / "lib").glob("layer_tap-*")
    fresh_native.native_callback.cache_clear()
    monkeypatch.setenv("CC", "false")  # a compiler that always fails: the built library must be reused
    assert fresh_native.native_callback() is not None
    assert list((tmp_path / "lib").glob("layer_tap-*")) == [built]


@pytest.mark.parametrize("compiler", ["false", "/no/such/compiler"])  # fails; is not there at all
def test_a_tap_that_cannot_be_compiled_falls_back_to_python_and_says_why(
    fresh_native, tmp_path, monkeypatch, caplog, compiler
):
    monkeypatch.setenv("CC", compiler)
    with caplog.at_level("WARNING", logger="surprisegate.backends.layer_tap"):
        assert fresh_native.native_callback() is None
    assert "using the Python callback" in caplog.text
    assert not list((tmp_path / "lib").glob("layer_tap-*"))  # nothing half-built is left to load

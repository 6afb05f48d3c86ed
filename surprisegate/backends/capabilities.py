"""What a backend can do beyond the seam, declared in one place (DESIGN.md §4).

Every backend gives the seam (`SteerableBackend` or `BlackBoxBackend`, and a steerable one's `Session`s).
Some give more. Each extra is one small protocol here, and the code that needs it checks it with
`isinstance` where it matters, instead of `getattr(backend, "...", None)` scattered through the loop
(as transformers checks a model's `_supports_*` flags, and mlx-lm a cache's `is_trimmable()`):

| protocol | member | who has it | checked by |
|---|---|---|---|
| `Tappable` | `tap_layer(layer)` | llama.cpp in process, one context; transformers | runtime.tap_probe_layer |
| `HiddenStates` | `tapped_layer`, `hidden_state()` | the same | gate.loop (the trigger probe), LocalSession |
| `PausableTap` | `read_hidden(on)` | the same | LocalSession (a decode no probe reads pauses the tap) |
| `SequenceStates` | `n_layer`, `sequence_states(seqs, layers)`, `recording_states(layers)` | the same | calibrate |
| `ContextSize` | `n_ctx` | llama.cpp in process, the servers | serve's check_context |
| `VocabSize` | `n_vocab` | llama.cpp in process, the servers | labeling (bounds a top-k entropy) |
| `TopKSignals` | `SIGNAL_TOP_K` | the servers (20), the chat APIs (their top k) | model_calibrations.backend_top_k |
| `RequestLog` | `last_request` (a session's) | server sessions | gate.loop (the receipt of a rewind) |
| `Grammars` | `grammar(gbnf)` -> `TokenGrammar` | llama.cpp in process | gate.structured (structured output) |

Rewinding needs no protocol: `LocalModel.can_trim()` says it, and a `Session` re-prefills where it cannot
(`last_continue`). The protocols are structural: a backend has a capability by having its members, with
nothing to register (a test's scripted backend too).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tappable(Protocol):
    """A backend that can keep one layer's hidden state at the last fed position, for a trigger probe."""

    def tap_layer(self, layer: int) -> None:
        """From now on keep layer `layer`'s state (`hidden_state()`); resets the context."""
        ...


@runtime_checkable
class HiddenStates(Protocol):
    """A model whose steps can carry its tapped layer's hidden state (`Sampling.hidden`)."""

    @property
    def tapped_layer(self) -> int | None:
        """The layer tapped (None: none yet): a probe fitted on another layer is not used."""
        ...

    def hidden_state(self) -> np.ndarray | None:
        """The tapped layer's state at the position the logits describe; None without a tap or when stale."""
        ...


@runtime_checkable
class PausableTap(Protocol):
    """A model whose tap can be paused while no step reads its hidden state: the tap then costs nothing."""

    def read_hidden(self, on: bool) -> None:
        """Whether the decodes from now on keep the tapped layer's state."""
        ...


@runtime_checkable
class SequenceStates(Protocol):
    """A model that can give every position's hidden state of several layers for a whole sequence in one pass:
    what a calibration reads, after labelling, to fit a trigger probe on the replies it labelled."""

    @property
    def n_layer(self) -> int:
        """How many layers the model has (0-based layer indices below this)."""
        ...

    def sequence_states(self, sequences: Sequence[Sequence[int]], layers: Sequence[int]) -> list[dict[int, np.ndarray]]:
        """Per sequence, layer -> (len(tokens), width) array: the state after that layer at each position of
        the sequence fed alone; resets the context."""
        ...

    def recording_states(self, layers: Sequence[int]) -> AbstractContextManager[Any]:
        """A block in which every position fed (prompts and decoded tokens alike) keeps its row of each of
        `layers`: the recorder's `clear()` forgets them, `states()` gives layer -> (positions, width) since
        then, `pause(True)` keeps none until `pause(False)`; resets the context when the block ends."""
        ...


@runtime_checkable
class ContextSize(Protocol):
    """A backend that knows how many tokens one context (one session) holds."""

    n_ctx: int | None  # None: the server did not say


@runtime_checkable
class VocabSize(Protocol):
    """A backend that knows its vocabulary size (the bound on the mass missing from a top k)."""

    n_vocab: int | None  # None: the server did not say


@runtime_checkable
class TopKSignals(Protocol):
    """A backend whose signals come from the top `SIGNAL_TOP_K` logprobs of each token, not from the whole
    distribution: entropy is estimated, and calibrations are per k (model_calibrations.backend_top_k). A backend
    that is not one (in process) computes both signals from the full distribution."""

    SIGNAL_TOP_K: int


@runtime_checkable
class RequestLog(Protocol):
    """A session that records its requests (a server's): how the latest one travelled, what was cached."""

    @property
    def last_request(self) -> dict[str, Any] | None:
        """The latest request's record (`path`, `cached`, ...); None before the first."""
        ...


@runtime_checkable
class TokenGrammar(Protocol):
    """Which tokens may come next for a reply to stay inside a grammar (`Sampling.grammar`)."""

    def follow(self, tokens: Sequence[int]) -> None:
        """The state after exactly `tokens`, the reply so far (rebuilt when the reply was cut back)."""
        ...

    def allows(self, token: int) -> bool: ...

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every rejected token at -inf (a new array)."""
        ...


@runtime_checkable
class Grammars(Protocol):
    """A model that decodes under a GBNF grammar of its own vocabulary (llama.cpp's grammar sampler)."""

    def grammar(self, gbnf: str) -> TokenGrammar:
        """A fresh grammar state for one reply; an InputError when the grammar does not parse."""
        ...

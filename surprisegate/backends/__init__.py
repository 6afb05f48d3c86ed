"""The one seam between the loop and a model: continue a context, yield steps.

A backend continues a context and yields `Step`s {token id, text piece, surprise, entropy, top-k
logprobs}; closing the iterator aborts, and "continue from this prefix" serves prefill, rewind and revert
alike (DESIGN.md §4, in the spirit of mlx-lm's `generate_step`). Two kinds, as outlines splits them:

- steerable (`SteerableBackend`): we choose where to cut and what to inject. Each request gets a
  `Session`, which holds one context; `session.steps(tokens, ...)` keeps the longest common prefix of
  what it holds and feeds the rest. In-process models implement the small `LocalModel` primitives
  (append / trim / logits) and get their sessions from `LocalSession`.
- black-box (`BlackBoxBackend`): a chat stream with logprobs only (cloud APIs, issue 12).

What some backends can do beyond the seam (tap a layer, say their context size, signals from a top k, ...)
is declared in capabilities.py (one protocol each) and checked with isinstance where it matters. The loop talks to
these protocols only; `open_backend` (registry.py) picks one (a `Backend`) by name or URI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import BackendError, InputError
from ..gate.surprise import (
    SoftmaxStats,
    signals_within,
    softmax_stats,
    surprise_bits,
    top_logprobs,
    topk_entropy,
)
from .capabilities import (
    ContextSize,
    Grammars,
    HiddenStates,
    PausableTap,
    RequestLog,
    SequenceStates,
    Tappable,
    TokenGrammar,
    TopKSignals,
    VocabSize,
)
from .samplers import Shaping

__all__ = [
    "LOGPROB_FLOOR",
    "Backend",
    "BlackBoxBackend",
    "ChatStream",
    "ContextSize",
    "HiddenStates",
    "Grammars",
    "LocalBackend",
    "LocalModel",
    "LocalSession",
    "PausableTap",
    "RequestLog",
    "Sampling",
    "Session",
    "Step",
    "SteerableBackend",
    "Steps",
    "SequenceStates",
    "Tappable",
    "TokenGrammar",
    "TopKSignals",
    "VocabSize",
    "common_prefix",
    "hidden_state_of",
]

# Servers and providers compute probabilities in float32 and report p = 0 as float's lowest (-3.4e38) or clamp
# it (vLLM: -9999): floor at the log of the smallest float32 denormal (surprise <= 149 bits), a finite lower
# bound on such a token's surprise.
LOGPROB_FLOOR = math.log(1.401298464324817e-45)
# Under a grammar the signals are taken over the allowed tokens among this many most likely (checking the
# whole vocabulary costs 13-39 ms a step on llama.cpp; these hold nearly all the mass the grammar leaves).
GRAMMAR_SIGNAL_TOP_K = 64


@dataclass(frozen=True)
class Step:
    """One decoded token, as every backend reports it."""

    token: int | None  # id, when the backend has one (black-box streams may give only text)
    piece: bytes  # the token's raw bytes (a UTF-8 character may span tokens)
    surprise: float  # bits, -log2 p of the chosen token under the raw distribution; nan when unscored
    entropy: float  # bits, of the raw distribution (exact locally, estimated from top-k elsewhere)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (id, natural-log prob), most likely first
    # The model's hidden state (its tapped layer's output) at the position that chose this token, where the
    # backend can read it and the sampling asked for it (Sampling.hidden): what a trigger probe reads.
    hidden: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass
class Sampling:
    """How a step picks its token. One per reply: the random stream runs on across rewinds."""

    temperature: float = 0.0  # 0 = greedy
    seed: int = 0
    scored: bool = True  # compute surprise and entropy (off mode skips the cost)
    top_logprobs: int = 0  # keep the k most likely tokens of each step
    hidden: bool = False  # attach the model's hidden state to each step (backends that can read it)
    # top-k/p, min-p, penalties, logit bias (samplers.py): they shape the choice, never the signals
    shaping: Shaping = field(default_factory=Shaping)
    # The reply's own tokens so far, for frequency and presence penalties (the loop sets it: it owns the reply)
    reply_tokens: Callable[[], Sequence[int]] | None = field(default=None, repr=False, compare=False)
    rng: np.random.Generator | None = field(default=None, repr=False)
    # Structured output: the tokens a reply may take (a TokenGrammar; it follows reply_tokens across rewinds)
    grammar: TokenGrammar | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rng is None and self.temperature > 0:
            self.rng = np.random.default_rng(self.seed)

    def choose(
        self,
        logits: np.ndarray,
        banned: frozenset[int] = frozenset(),
        stats: SoftmaxStats | None = None,
        context: Sequence[int] = (),
    ) -> int:
        """Pick the next token (never one of `banned`; inside `grammar` when there is one). Never writes
        `logits`. `stats`: the step's, if read already (greedy takes its argmax); `context`: the tokens the
        model holds (repeat penalty)."""
        shaped = None
        if self.temperature > 0.0 or stats is None or banned or self.shaping.reshapes:
            shaped = self._shaped(logits, banned, context)
        token = stats.argmax if shaped is None and stats is not None else self._draw(shaped)
        if self.grammar is None:
            return token
        self.grammar.follow(self.reply_tokens() if self.reply_tokens is not None else ())
        if self.grammar.allows(token):
            return token  # llama.cpp's common sampler: the settings' pick, kept when the grammar takes it
        masked = self.grammar.mask(logits if shaped is None else shaped)
        if banned and not np.isfinite(masked).any():  # the grammar is done and the ban was its end of turn
            masked = self.grammar.mask(self._shaped(logits, frozenset(), context))
        return self._draw(masked)

    def _shaped(self, logits: np.ndarray, banned: frozenset[int], context: Sequence[int]) -> np.ndarray:
        """The logits the choice is made from: reshaped by the settings, `banned` at -inf (a copy if changed)."""
        shaped = logits
        if self.shaping.reshapes:
            reply = self.reply_tokens() if self.reply_tokens is not None else ()
            shaped = self.shaping.reshape(logits, context, reply)
        if banned:  # a masked copy, only for the one step of a retry
            shaped = shaped.copy()
            shaped[list(banned)] = -np.inf
        return shaped

    def _draw(self, shaped: np.ndarray | None) -> int:
        """The greedy pick, or a draw at the temperature after the truncations."""
        assert shaped is not None
        if self.temperature <= 0.0:
            return int(shaped.argmax())
        assert self.rng is not None
        if self.shaping.truncates:
            shaped = self.shaping.truncate(shaped)
        z = shaped.astype(np.float64) / self.temperature
        p = np.exp(z - z.max())
        return int(self.rng.choice(p.size, p=p / p.sum()))

    def stats(self, logits: np.ndarray) -> SoftmaxStats | None:
        """What choose and step read of the logits, read once (None unscored: only the choice is needed)."""
        return softmax_stats(logits) if self.scored else None

    def step(
        self,
        logits: np.ndarray,
        token: int,
        piece: bytes,
        stats: SoftmaxStats | None = None,
        hidden: np.ndarray | None = None,
    ) -> Step:
        """The step for `token` drawn from `logits`: both signals come from the raw distribution
        (temperature 1) whatever the sampling temperature. `stats`: the step's, if read already; `hidden`:
        the state behind the logits, where a probe reads it (kept only on a scored step)."""
        if not self.scored:
            return Step(token, piece, math.nan, math.nan)
        stats = stats if stats is not None else softmax_stats(logits)
        top = tuple(top_logprobs(logits, self.top_logprobs)) if self.top_logprobs else ()
        if self.grammar is not None:
            surprise, entropy = signals_within(logits, token, self._allowed_among_likely(logits))
            return Step(token, piece, surprise, entropy, top, hidden)
        return Step(token, piece, stats.surprise(float(logits[token])), stats.entropy, top, hidden)

    def _allowed_among_likely(self, logits: np.ndarray) -> list[int]:
        """The grammar's allowed tokens among the GRAMMAR_SIGNAL_TOP_K most likely (the grammar was brought to
        this step's state by `choose`): where a grammar holds the reply, the signals are taken over them."""
        assert self.grammar is not None
        k = min(GRAMMAR_SIGNAL_TOP_K, logits.size)
        likely = np.argpartition(-logits, k - 1)[:k] if k < logits.size else np.arange(logits.size)
        return [int(t) for t in likely if self.grammar.allows(int(t))]

    def streamed_step(
        self,
        token: int | None,
        piece: bytes,
        logprob: float | None,
        top: Sequence[tuple[int | None, float]],
        vocab_size: int | None = None,
    ) -> Step:
        """The step for a token a server or a chat API streamed with its logprob and top k (natural logs; an
        id of the top k is None where the stream names none). Surprise is exact, from the chosen token's
        logprob; entropy is estimated from the top k (`topk_entropy`, the missing mass bounded by
        `vocab_size` where known). Logprobs are floored at LOGPROB_FLOOR (a stream may report p = 0 as a
        huge negative number). Unscored (nan, nan, no top k) where no logprob came or `scored` is off."""
        if logprob is None or not self.scored:
            return Step(token, piece, math.nan, math.nan)
        tops = sorted(((t, max(lp, LOGPROB_FLOOR)) for t, lp in top), key=lambda e: -e[1])
        try:
            entropy = topk_entropy([lp for _, lp in tops], vocab_size=vocab_size) if tops else math.nan
        except InputError:  # a rounded top k that sums above 1: no estimate rather than a wrong one
            entropy = math.nan
        known = tuple((t, lp) for t, lp in tops if t is not None)  # the ids the stream named, most likely first
        kept = known[: self.top_logprobs] if self.top_logprobs > 0 else ()
        return Step(token, piece, surprise_bits(max(logprob, LOGPROB_FLOOR)), entropy, kept)


class Steps(Iterator[Step], Protocol):
    """What `Session.steps` returns: one step per token, and `close()` to stop early (as a generator's)."""

    def close(self) -> None: ...


@runtime_checkable
class Session(Protocol):
    """One request's context on a steerable backend."""

    @property
    def tokens(self) -> Sequence[int]:
        """The token ids the session holds now (what its cache describes)."""
        ...

    @property
    def last_continue(self) -> tuple[int, str]:
        """(tokens dropped, "trim" | "reprefill") by the latest `steps` call: receipts say how a rewind ran."""
        ...

    def steps(
        self,
        tokens: Sequence[int],
        sampling: Sampling,
        *,
        batch_until: int | None = None,
        banned: frozenset[int] = frozenset(),
    ) -> Steps:
        """Continue from `tokens` (keeping the longest common prefix of what the session holds) and yield
        one step per token. A step's token is fed only when the next step is asked for, so closing the
        iterator right after a step leaves that token out of the context. `banned` applies to the first
        step. `batch_until`: tokens before this index that must be fed go in one batch, later ones one at a
        time (the schedule they were first fed with: batched and one-token kernels round differently)."""
        ...

    def close(self) -> None:
        """Give the session's context back to its model."""
        ...


@runtime_checkable
class SteerableBackend(Protocol):
    name: str  # "llamacpp" | "transformers" | ...
    model_id: str  # path or name of the loaded model, for receipts
    eos_token_ids: frozenset[int]

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`. Only the chat template's own pieces pass special=True: anything from
        outside (messages, evidence, tool output) stays plain text, never control tokens (DESIGN §8)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a UTF-8 character may span tokens)."""
        ...

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's chat template."""
        ...

    def session(self) -> Session:
        """A fresh context for one request."""
        ...


@runtime_checkable
class ChatStream(Iterator[Step], Protocol):
    """The steps of one chat completion on a black-box backend, as the provider streams them: `token` is None
    unless the provider sends ids, `surprise` / `entropy` come from its logprobs (nan where none came).
    `close()` closes the HTTP stream. Once the iterator is done: `finish_reason` (the provider's, e.g.
    "stop", "length") and `no_logprobs` (None when logprobs came; else why not, one sentence: "anthropic
    offers no logprobs", or the refusal met and the retry made without them)."""

    finish_reason: str | None
    no_logprobs: str | None

    def close(self) -> None: ...


@runtime_checkable
class BlackBoxBackend(Protocol):
    """A chat API that streams logprobs at best: we cannot cut or inject mid-reply (cloud APIs, issue 12).
    Intervention there is the revise pass (revise.py). Errors are `BackendFault`s naming provider, status and
    fix; a stream cut off raises one after the steps that arrived."""

    name: str  # "openai" | "xai" | "gemini" | "ollama-chat" | "anthropic"
    model_id: str
    top_k: int  # top logprobs asked for per token (the provider's limit; 0 where it has none)

    def chat(self, messages: list[dict[str, str]], sampling: Sampling, max_tokens: int) -> ChatStream:
        """Stream one reply to `messages` (roles system / user / assistant, system turns anywhere: the backend
        maps them to what the provider takes). `sampling`: temperature, seed, and whether to ask for logprobs
        (`scored`)."""
        ...


class LocalModel(Protocol):
    """The primitives of an in-process model with one KV cache; `LocalSession` builds the seam on them."""

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens after the current context; return the raw next-token logits, shape (vocab,). The
        array may be a view the next call overwrites: readers copy what they keep."""
        ...

    def logits(self) -> np.ndarray:
        """Next-token logits for the current context (recomputed if a trim made them stale)."""
        ...

    def can_trim(self) -> bool: ...

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens from the context and KV cache; return how many were dropped."""
        ...

    def reset(self) -> None:
        """Drop the whole context."""
        ...

    def token_bytes(self, token_id: int) -> bytes: ...


# What `open_backend` (registry.py) and `runtime.load_backend` give, and `Runtime.backend` holds.
Backend = SteerableBackend | BlackBoxBackend


def hidden_state_of(model: HiddenStates | None) -> np.ndarray | None:
    """A copy of the model's hidden state at the position its logits describe; None where there is none (a
    model that reads none, passed as None, or one with no tap yet or a stale state)."""
    state = model.hidden_state() if model is not None else None
    return None if state is None else np.array(state, dtype=np.float32)


def common_prefix(held: Sequence[int], wanted: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for have, want in zip(held, wanted, strict=False):  # stops at the shorter one
        if have != want:
            break
        n += 1
    return n


class LocalSession:
    """A `Session` over a `LocalModel`'s one KV cache (one session at a time per model)."""

    def __init__(self, model: LocalModel) -> None:
        self._model = model
        self._held: list[int] = []
        self._fresh = False  # the model's logits describe `_held` (no trim since the last append)
        self._last: tuple[int, str] = (0, "trim")
        # Whether steps can carry a hidden state, asked once (an isinstance on a protocol costs ~10 us).
        self._hidden: HiddenStates | None = model if isinstance(model, HiddenStates) else None
        self._tap: PausableTap | None = model if isinstance(model, PausableTap) else None
        model.reset()  # the cache is this session's now; an older session of this model is superseded
        # A mark on the caller's model object, which the LocalModel protocol does not declare.
        setattr(model, "_surprisegate_session", self)  # noqa: B010

    def _check_current(self) -> None:
        if getattr(self._model, "_surprisegate_session", None) is not self:
            raise BackendError(
                "this session's model has started another session since, which took its one KV "
                "cache; run one session at a time on this backend, or load the model once per "
                "concurrent request"
            )

    @property
    def tokens(self) -> Sequence[int]:
        return tuple(self._held)

    @property
    def last_continue(self) -> tuple[int, str]:
        return self._last

    def close(self) -> None:
        self._held, self._fresh = [], False

    def steps(
        self,
        tokens: Sequence[int],
        sampling: Sampling,
        *,
        batch_until: int | None = None,
        banned: frozenset[int] = frozenset(),
    ) -> Steps:
        self._check_current()
        if self._tap is not None:  # a tap no step reads splits no graph; the prefill's last state is read too
            self._tap.read_hidden(sampling.hidden and sampling.scored)
        # Eager: the context is fed (and `last_continue` set) here; the returned iterator only decodes.
        logits = self._continue_from(list(tokens), len(tokens) if batch_until is None else batch_until)
        return self._decode(logits, sampling, banned)

    def _decode(self, logits: np.ndarray, sampling: Sampling, banned: frozenset[int]) -> Generator[Step, None, None]:
        while True:
            stats = sampling.stats(logits)  # the logits read once for the choice and both signals
            token = sampling.choose(logits, banned, stats, self._held)
            banned = frozenset()
            # The state behind these logits, for a trigger probe (the step's own copy).
            hidden = hidden_state_of(self._hidden) if sampling.hidden and sampling.scored else None
            yield sampling.step(logits, token, self._model.token_bytes(token), stats, hidden)
            # Reached only when the next step is asked for: a closed iterator never feeds its last token.
            self._check_current()
            logits = self._model.append([token])
            self._held.append(token)

    def _continue_from(self, target: list[int], batch_until: int) -> np.ndarray:
        if not target:
            raise ValueError("steps() needs at least one token of context (the prompt)")
        common = common_prefix(self._held, target)
        if common == len(target) == len(self._held) and self._fresh:
            self._last = (0, "trim")
            return self._model.logits()  # nothing to feed: the same position again (a retry's ban)
        common = min(common, len(target) - 1)  # re-feed at least one token: its logits pick the next one
        dropped = len(self._held) - common
        if self._model.can_trim():
            if dropped:
                self._model.trim(dropped)
            self._last = (dropped, "trim")
        else:  # no trimmable cache: rebuild from the start (costly; the receipt says so)
            self._model.reset()
            common, self._last = 0, (dropped, "reprefill")
        logits = None
        if common < batch_until:
            logits = self._model.append(target[common:batch_until])
        for token in target[max(common, batch_until) :]:
            logits = self._model.append([token])
        assert logits is not None
        self._held, self._fresh = target, True
        return logits


class LocalBackend:
    """Mixin for in-process backends: their sessions are `LocalSession`s over the model itself."""

    def session(self) -> LocalSession:
        return LocalSession(self)  # type: ignore[arg-type]

"""One session machinery for every steerable inference-server backend (llama.cpp server, vLLM, SGLang, Ollama).

A server backend describes its dialect with two hooks; everything else (the seam's `Session`, the
bookkeeping of held tokens and `last_continue`, the per-request records, streaming, aborts, continuation
past a request's token budget, EOS, errors mid-stream, truncated streams) lives here once:

- `backend.stream_request(prompt, sampling, banned, seed) -> ServerRequest`: path, JSON body and framing of
  one streamed request that continues `prompt` (token ids; a text-only server renders them itself).
- `backend.stream_parser(request) -> ChunkParser`: a fresh parser per request; `feed(event)` turns one parsed JSON
  event into a `Chunk` (the tokens it carries, whether the request ended and why, figures for the record)
  or raises `ServerError`. Parsers hold state (SGLang streams cumulative lists: the parser takes deltas).

Shared as well: `ServerBackend` (the endpoint, a request's token budget, sessions, the chat-template cache,
`info`), `TokenIdServer` (vLLM and SGLang: the model card, tokenizer endpoints, sampling fields),
`StreamParser` (checks of streamed values, text pieces) and `server_factory` (the registry's factories:
timeouts, TLS and the key). The HTTP client and both framings are http_stream.py's; tokens, untrusted text
and chat templates http_tokens.py's.

Session semantics (as the seam's `Session`): `steps(tokens)` sends the whole context now (errors and
`last_continue` are known on return); the server's prefix cache does the trim. A step's token is fed only
when the next step is asked for; closing the iterator closes the HTTP stream, and the server cancels the
request. When a request ends on its token budget the reply goes on in a new request from the context held.
`last_continue` = (tokens dropped from what the session held, "trim"), or "reprefill" when the server
reports it recomputed a prefix we expected it to keep. Each request's figures are in `session.requests`:
`path` ("token-ids" or "text": how the prompt travelled), `cached` (prompt tokens the server reports it took
from its cache, None where it reports none), `prompt_n`/`prompt_ms` where reported, `received`, `stop_type`.

End of turn. A server that ends on its end-of-generation token either streams that token (llama.cpp server,
vLLM with `return_token_ids`) or only names it (SGLang's `finish_reason.matched`) or neither (Ollama): the
session then yields one step for it, token = the named id (else the backend's first EOS id), empty piece,
unscored, so the loop sees the turn end as it does in process.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import BackendError, InputError
from . import Sampling, Step, common_prefix
from .http_stream import Endpoint, EventStream, ServerError, endpoint_from
from .http_tokens import LRU, ServerTokenizer, load_chat_template, render_chat_template

SIGNAL_TOP_K = 20  # top-k logprobs asked for on every scored step: the entropy estimate needs them
DEFAULT_N_PREDICT = 256  # tokens per request; a reply that goes on past them continues in a new request
# Sampling from the whole distribution, as `Sampling.choose` does in process: no top-k / top-p / min-p cut and
# no penalties (vLLM and SGLang would otherwise apply the model's generation_config defaults).
FULL_DISTRIBUTION = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
BAD_EVENT_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


@dataclass
class StreamedToken:
    """One token of a stream as a dialect parser reads it."""

    token: int
    piece: bytes | None  # its bytes; None: ask the backend (token_bytes)
    logprob: float | None = None  # natural log of its probability under the raw distribution; None: unscored
    top: tuple[tuple[int | None, float], ...] = ()  # (id or None when the server names no id, logprob)


@dataclass
class Chunk:
    """What one stream event says."""

    tokens: list[StreamedToken] = field(default_factory=list)
    end: str | None = None  # None: the request goes on; "eos": the turn ended; "length" | other: budget or stop
    eos_token: int | None = None  # the id that ended the turn, where the server names it
    notes: dict[str, Any] = field(default_factory=dict)  # figures for the request record (None values ignored)


class ChunkParser(Protocol):
    def feed(self, event: Any) -> Chunk: ...


@dataclass(frozen=True)
class ServerRequest:
    """One streamed request: where, what, how it is framed, and what the record says about its prompt."""

    path: str
    body: dict[str, Any]
    framing: str = "sse"
    kind: str = "token-ids"  # how the prompt travels: "token-ids" or "text"
    n_predict: int | None = None
    top_k: int = 0  # top logprobs asked for per token (a server may send one more: the sampled token)
    record: dict[str, Any] = field(default_factory=dict)  # extra record fields (e.g. a ban the server ignored)


class StreamingServer(Protocol):
    """What `ServerSession` needs of a backend."""

    name: str
    uri: str
    endpoint: Endpoint
    n_vocab: int | None
    drain_after_end: bool  # read the stream to its end after the final chunk (vLLM's usage chunk follows it)

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def learn_eos(self, token: int) -> None: ...

    def stream_request(
        self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int
    ) -> ServerRequest: ...

    def stream_parser(self, request: ServerRequest) -> ChunkParser: ...


def bad_event(url: str, event: Any, why: str) -> ServerError:
    return ServerError(
        f"{url}: unexpected stream event ({why}): {str(event)[:160]}; the stream is corrupt or this is not the "
        "server the --backend scheme says",
        url=url,
        body=event,
        kind="bad_event",
    )


def error_event(url: str, event: dict) -> ServerError:
    """The error a server reports mid-stream (`{"error": {...}}` or `{"error": "..."}`)."""
    err = event.get("error")
    message = err.get("message", err) if isinstance(err, dict) else err
    return ServerError(
        f"{url}: the server reported an error mid-stream: {str(message)[:500]}",
        url=url,
        body=event,
        kind="stream_error",
    )


def parse_events(events: Iterator[Any], parser: ChunkParser, url: str) -> Iterator[Chunk]:
    """The chunks of a stream's events. Error events and anything a parser cannot read end it with a
    `ServerError`: never another exception, so a corrupt stream ends the reply cleanly."""
    for event in events:
        if event is None:  # [DONE]: the body ends next; a stream without its final chunk is caught by the caller
            continue
        if isinstance(event, dict) and "error" in event:
            raise error_event(url, event)
        try:
            chunk = parser.feed(event)
        except ServerError:
            raise
        except BAD_EVENT_ERRORS as err:
            raise bad_event(url, event, f"{type(err).__name__}: {err}") from None
        yield chunk


class TextPieces:
    """The pieces of streamed tokens from the text deltas that come with them. Text that comes without a
    token (held back, or flushed after its token) goes to the next token's piece; an end-of-generation
    token has no text."""

    def __init__(self) -> None:
        self.carry = ""

    def split(self, text: str, candidates: Sequence[str | None], eos_last: bool = False) -> list[bytes]:
        text, self.carry = self.carry + text, ""
        visible = len(candidates) - 1 if eos_last else len(candidates)
        if visible <= 0:
            self.carry = text
            return [b""] * len(candidates)
        return split_text(text, candidates[:visible]) + [b""] * (len(candidates) - visible)


def split_text(text: str, candidates: Sequence[str | None]) -> list[bytes]:
    """The pieces of `len(candidates)` tokens whose text together is `text` (a streamed text delta). Each
    token's own string is used when they add up to the text; otherwise the text goes to the last token (a
    server holds back an incomplete UTF-8 character, so one token's text may come with the next): joined,
    the pieces are always the text."""
    if not candidates:
        return []
    raw = text.encode("utf-8", "surrogatepass")
    if len(candidates) == 1:
        return [raw]
    if all(isinstance(c, str) for c in candidates) and "".join(c or "" for c in candidates) == text:
        return [(c or "").encode("utf-8", "surrogatepass") for c in candidates]
    return [b""] * (len(candidates) - 1) + [raw]


class ServerSession:
    """One request's context on an inference server. The server holds the KV cache; we hold the ids."""

    def __init__(self, backend: StreamingServer) -> None:
        self._backend = backend
        self._eos_ids = frozenset(backend.eos_token_ids)  # what the loop treats as end of turn (read once)
        self._held: list[int] = []  # the context as the seam sees it: prompt + tokens fed so far
        self._slot_held: list[int] = []  # what our latest request left in the server's cache (received tokens)
        self._last: tuple[int, str] = (0, "trim")
        self._stream: EventStream | None = None
        self._generation = 0  # bumped by every steps(): an older iterator may no longer feed the context
        self._n_requests = 0
        self._closed = False
        self.requests: list[dict[str, Any]] = []  # one record per HTTP request

    @property
    def tokens(self) -> Sequence[int]:
        """The ids held (the seam's `Session.tokens`)."""
        return tuple(self._held)

    @property
    def last_continue(self) -> tuple[int, str]:
        """How the latest steps() continued (the seam's `Session.last_continue`)."""
        return self._last

    @property
    def last_cached(self) -> int | None:
        """Prompt tokens the server took from its cache for the latest request (None where not reported)."""
        return self.requests[-1].get("cached") if self.requests else None

    @property
    def last_request(self) -> dict[str, Any] | None:
        return self.requests[-1] if self.requests else None

    def close(self) -> None:
        self._abort()
        self._closed = True
        self._held, self._slot_held = [], []

    def _abort(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def steps(
        self, tokens: Sequence[int], sampling: Sampling, *, banned: frozenset[int] = frozenset(), **_: Any
    ) -> ServerSteps:
        """Send the request now (errors and `last_continue` are known on return) and return its steps.
        `batch_until` does not apply (taken and ignored): the server schedules its own batches."""
        if self._closed:
            raise BackendError(f"this {self._backend.name} session is closed; open a new one with backend.session()")
        target = [int(t) for t in tokens]
        if not target:
            raise ValueError("steps() needs at least one token of context (the prompt)")
        self._abort()
        self._generation += 1
        common = common_prefix(self._held, target)
        dropped = len(self._held) - common
        expected = common_prefix(self._slot_held, target)
        first = self._open(target, sampling, frozenset(banned))
        cached = self.requests[-1].get("cached")
        # The server always recomputes at least the last prompt token; less than that from its cache means
        # it rebuilt the prefix we left there (another request took the slot, or prompt caching is off).
        rebuilt = cached is not None and expected > 1 and cached < min(expected, len(target) - 1)
        method = "reprefill" if rebuilt else "trim"
        self._last = (dropped, method)
        self.requests[-1]["dropped"], self.requests[-1]["method"] = dropped, method
        self._held = list(target)
        return ServerSteps(self, self._generation, sampling, first)

    def _open(self, prompt: list[int], sampling: Sampling, banned: frozenset[int]) -> Iterator[Chunk]:
        """Start one streamed request from `prompt`; read its first chunk (the status line comes with it) and
        return the chunks, first included."""
        backend = self._backend
        seed = (int(sampling.seed) + 1_000_003 * self._n_requests) % (2**32 - 1)
        request = backend.stream_request(prompt, sampling, banned, seed)
        self._n_requests += 1
        record: dict[str, Any] = {
            "request": self._n_requests,
            "path": request.kind,
            "prompt_tokens": len(prompt),
            "n_predict": request.n_predict,
            "banned": sorted(banned),
            "cached": None,
            "prompt_n": None,
            "prompt_ms": None,
            "received": 0,
            "stop_type": None,
            **request.record,
        }
        self.requests.append(record)
        stream = backend.endpoint.stream(request.path, request.body, framing=request.framing)
        self._stream = stream
        self._slot_held = list(prompt)
        chunks = parse_events(iter(stream), backend.stream_parser(request), stream.url)
        try:
            first = next(chunks, None)
        except ServerError:
            stream.close()
            raise
        if first is None:
            stream.close()
            message = f"{stream.url}: the stream ended before its first event; check the server's log"
            raise ServerError(message, url=stream.url, kind="truncated")
        self._note(record, first.notes)

        def chained() -> Iterator[Chunk]:
            yield first
            yield from chunks

        return chained()

    @staticmethod
    def _note(record: dict[str, Any], notes: dict[str, Any]) -> None:
        for key, value in notes.items():
            if value is not None:
                record[key] = value


class ServerSteps:
    """The steps of a session's `steps()` call: an iterator whose `close()` aborts the HTTP stream."""

    def __init__(self, session: ServerSession, generation: int, sampling: Sampling, chunks: Iterator[Chunk]):
        self._session, self._generation, self._sampling = session, generation, sampling
        self._gen: Generator[Step, None, None] = self._run(chunks)

    def __iter__(self) -> ServerSteps:
        return self

    def __next__(self) -> Step:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()
        if self._session._generation == self._generation:
            self._session._abort()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; the stream is closed either way
            pass

    def _check_current(self) -> None:
        if self._session._generation != self._generation or self._session._closed:
            raise BackendError(
                "these steps were superseded by a later steps() call (or the session was closed); "
                "continue from the newer iterator"
            )

    def _run(self, chunks: Iterator[Chunk]) -> Generator[Step, None, None]:
        session, backend = self._session, self._session._backend
        record = session.requests[-1]
        while True:
            stream = session._stream
            url = stream.url if stream else backend.uri
            finished = False
            for chunk in chunks:
                session._note(record, chunk.notes)
                if chunk.end is not None:
                    finished = True
                    if backend.drain_after_end:
                        self._drain(chunks, record)
                eos = chunk.eos_token if chunk.end == "eos" else None
                if eos is not None:
                    backend.learn_eos(eos)
                for i, tok in enumerate(chunk.tokens):
                    record["received"] += 1
                    session._slot_held.append(tok.token)
                    is_eos = eos is not None and i == len(chunk.tokens) - 1 and tok.token == eos
                    if is_eos:
                        yield self._eos_step(tok.token)
                    else:
                        piece = tok.piece if tok.piece is not None else backend.token_bytes(tok.token)
                        yield self._sampling.streamed_step(tok.token, piece, tok.logprob, tok.top, backend.n_vocab)
                    # Reached only when the next step is asked for: now the token is part of the context.
                    self._check_current()
                    session._held.append(tok.token)
                if chunk.end == "eos":
                    streamed = eos is not None and record["received"] > 0 and session._slot_held[-1] == eos
                    if not streamed:  # the server ended the turn without streaming its EOS token: one step for it
                        yield self._eos_step(eos)
                        self._check_current()
                if finished:
                    break
            if not finished:
                session._abort()
                raise ServerError(
                    f"{url}: the stream ended without its final chunk; the server closed the connection mid-reply",
                    url=url,
                    kind="truncated",
                )
            # The request is done (end of turn or its token budget): the reply goes on from the context held.
            self._check_current()
            session._abort()
            chunks = session._open(list(session._held), self._sampling, frozenset())
            record = session.requests[-1]

    def _drain(self, chunks: Iterator[Chunk], record: dict[str, Any]) -> None:
        """Read what follows the final chunk (figures such as vLLM's usage) up to the end of the body."""
        try:
            for chunk in chunks:
                self._session._note(record, chunk.notes)
        except ServerError as err:  # the reply is complete: a fault after it only goes in the record
            record["after_end"] = err.kind

    def _eos_step(self, token: int | None) -> Step:
        """The end-of-turn step: the id the server named if the loop knows it as EOS, else the first EOS id."""
        known = self._session._eos_ids
        if token is None or (known and token not in known):
            token = min(known) if known else (token if token is not None else -1)
        return Step(token, b"", math.nan, math.nan)


# --------------------------------------------------------------------------------------------------
# helpers of the dialect parsers and backends
# --------------------------------------------------------------------------------------------------
def as_int(value: Any, what: str) -> int:
    """A token id or count from a stream: an int (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is {value!r}, not a whole number")
    return value


def as_logprob(value: Any, what: str) -> float:
    """A logprob from a stream: a number <= 0 (a little above 0 is rounding), never NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-3:
        raise ValueError(f"{what} is {value!r}, not a natural-log probability")
    return min(float(value), 0.0)


def as_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise TypeError(f"{what} is {str(value)[:60]}, not a list")
    return value


class ServerBackend:
    """What every server backend shares: its endpoint, the token budget of one request, sessions, and the
    cache of chat-template renders. A backend adds its tokens, `_chat_prompt`, `stream_request` and
    `stream_parser` (the hooks of `ServerSession`)."""

    name = "server"
    SIGNAL_TOP_K = SIGNAL_TOP_K  # capabilities.TopKSignals: signals from the top 20 (which calibration applies)
    drain_after_end = False  # read past the final chunk (vLLM's usage chunk follows it)
    context_fix = "start the server with a larger context"  # how to give a request more room
    model_id = ""
    n_ctx: int | None = None
    n_vocab: int | None = None
    _template: tuple[str, str, str] | None = None  # (template, bos, eos) given by the user, if any

    def __init__(self, endpoint: Endpoint, n_predict: int = DEFAULT_N_PREDICT) -> None:
        self.endpoint = endpoint
        self.uri = endpoint.uri
        self.n_predict = int(n_predict)
        if self.n_predict < 1:
            raise InputError(f"n_predict={n_predict!r} must be a whole number >= 1 (tokens per request)")
        self._template_cache: LRU = LRU()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r}, model_id={self.model_id!r})"

    def session(self) -> ServerSession:
        return ServerSession(self)

    def close(self) -> None:
        self.endpoint.close()

    @property
    def info(self) -> dict[str, Any]:
        """What a receipt may say about the server (never the key)."""
        return {
            "uri": self.uri,
            "model_id": self.model_id,
            "n_ctx": self.n_ctx,
            "n_vocab": self.n_vocab,
            **self._info(),
        }

    def _info(self) -> dict[str, Any]:
        return {}

    # --- what each backend gives (the hooks of ServerSession, and its tokens) --------------------------
    @property
    def eos_token_ids(self) -> frozenset[int]:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        raise NotImplementedError

    def learn_eos(self, token: int) -> None:
        raise NotImplementedError

    def stream_request(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> ServerRequest:
        raise NotImplementedError

    def stream_parser(self, request: ServerRequest) -> ChunkParser:
        raise NotImplementedError

    def budget(self, prompt: Sequence[int], banned: frozenset[int]) -> int:
        """Tokens one request may generate: 1 for a ban's request, else `n_predict`, within the context."""
        n_predict = 1 if banned else self.n_predict
        if self.n_ctx:
            room = self.n_ctx - len(prompt)
            if room <= 0:
                raise BackendError(
                    f"context would hold {len(prompt) + 1} tokens, more than the server's context of {self.n_ctx}; "
                    f"{self.context_fix}, or shorten the prompt"
                )
            n_predict = min(n_predict, room)
        return n_predict

    @staticmethod
    def request_top_k(sampling: Sampling, cap: int | None = None) -> int:
        """Top logprobs to ask for per token: the entropy estimate's 20 (or the k a caller keeps, if more) when
        scored, none otherwise; at most `cap` where the server has a maximum."""
        k = max(sampling.top_logprobs, SIGNAL_TOP_K) if sampling.scored else 0
        return min(k, cap) if cap is not None else k

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's chat template (cached)."""
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        key = (tuple((m["role"], m["content"]) for m in msgs), bool(add_generation_prompt))
        return self._template_cache.get_or(key, lambda: self._chat_prompt(msgs, bool(add_generation_prompt)))

    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        raise NotImplementedError

    def _render_given(self, msgs: list[dict[str, str]], add_generation_prompt: bool, missing: str) -> str:
        """Render the template the user gave; `missing` says where the server falls short without one."""
        if self._template is None:
            raise BackendError(
                f"{self.uri}: {missing}; pass the model's tokenizer_config.json (or a .jinja file) as "
                "chat_template= or $SURPRISEGATE_CHAT_TEMPLATE"
            )
        template, bos, eos = self._template
        return render_chat_template(template, msgs, bos, eos, add_generation_prompt)


class TokenIdServer(ServerTokenizer, ServerBackend):
    """A server that takes token-id prompts and tokenizes with its own tokenizer endpoints (vLLM, SGLang):
    the model card from `/v1/models`, a chat template given by the user or the server's own."""

    model_hint = "pass a model name the server lists as --model"

    def __init__(
        self,
        endpoint: Endpoint,
        model: str | None = None,
        n_predict: int = DEFAULT_N_PREDICT,
        chat_template: str | None = None,
    ) -> None:
        super().__init__(endpoint, n_predict)
        card = choose_model(endpoint, model, self.model_hint)
        self.model_id = str(card.get("id"))
        self.n_ctx = int(card.get("max_model_len") or 0) or None  # neither server reports its vocabulary size
        self._template = load_chat_template(chat_template)
        self._init_tokens()
        self._after_init()

    def _after_init(self) -> None:
        """What a dialect adds once connected."""

    @staticmethod
    def sampling_params(sampling: Sampling, banned: frozenset[int]) -> dict[str, Any]:
        """The sampling fields both take: the temperature (0 greedy) over the whole distribution, EOS honoured,
        control tokens' text left out of the streamed text, and a ban as a logit bias of -100 (vLLM's limit)."""
        shaping = sampling.shaping
        params: dict[str, Any] = {
            "temperature": max(0.0, float(sampling.temperature)),
            **FULL_DISTRIBUTION,
            "ignore_eos": False,
            "skip_special_tokens": True,
        }
        # A client's settings (samplers.py) as theirs: repetition_penalty reads the whole prompt and output
        # (no repeat_last_n window); the streamed logprobs stay the raw model output's.
        params |= {
            "top_p": shaping.top_p,
            "top_k": shaping.top_k or -1,
            "min_p": shaping.min_p,
            "repetition_penalty": shaping.repeat_penalty,
            "presence_penalty": shaping.presence_penalty,
            "frequency_penalty": shaping.frequency_penalty,
        }
        bias = {str(int(t)): max(-100.0, min(100.0, float(b))) for t, b in sorted(shaping.logit_bias.items())}
        bias |= {str(int(t)): -100.0 for t in sorted(banned)}
        if bias:
            params["logit_bias"] = bias
        return params

    def _info(self) -> dict[str, Any]:
        return {"prompts": "token-ids", "chat_template": "given" if self._template else "server"}


class StreamParser:
    """The base of the dialect parsers: the checks of streamed values and the pieces of the text."""

    as_int = staticmethod(as_int)
    as_list = staticmethod(as_list)
    as_logprob = staticmethod(as_logprob)

    def __init__(self, uri: str, top_k: int) -> None:
        self._uri, self._top_k = uri, top_k
        self._pieces = TextPieces()


def server_factory(cls: type, scheme: str, default_port: int, doc: str) -> Any:
    """The registry factory of a server backend: `factory(model, host, port, tls, **options)` connects to
    `scheme://host:port` with the timeouts given (connect_timeout, first_byte_timeout, idle_timeout) and the
    key from $SURPRISEGATE_SERVER_KEY, and passes the options the backend takes (local-model options such as
    n_ctx, threads or seed do not apply to a server: it was started with its own)."""
    accepted = set(inspect.signature(cls).parameters) - {"endpoint", "model"}

    def factory(
        model: str | None = None,
        host: str = "127.0.0.1",
        port: int = default_port,
        tls: bool = False,
        *,
        connect_timeout: float | None = None,
        first_byte_timeout: float | None = None,
        idle_timeout: float | None = None,
        **options: Any,
    ) -> Any:
        endpoint = endpoint_from(
            scheme,
            host,
            port,
            tls,
            connect_timeout=connect_timeout,
            first_byte_timeout=first_byte_timeout,
            idle_timeout=idle_timeout,
        )
        return cls(endpoint, model, **{k: v for k, v in options.items() if k in accepted and v is not None})

    factory.__doc__ = doc
    factory.__qualname__ = factory.__name__ = f"from_{scheme.replace('-', '_')}"
    return factory


def choose_model(endpoint: Endpoint, model: str | None, hint: str) -> dict[str, Any]:
    """The model card of `model` in the server's `/v1/models` (the first one when `model` is None)."""
    body = endpoint.request_json("GET", "/v1/models")
    cards = [c for c in (body.get("data") if isinstance(body, dict) else None) or [] if isinstance(c, dict)]
    if not cards:
        raise BackendError(f"{endpoint.base}/v1/models lists no model; is --backend the right scheme for this server?")
    names = [str(c.get("id")) for c in cards]
    if model is None:
        return cards[0]
    for card in cards:
        if model in (card.get("id"), card.get("root")):
            return card
    raise BackendError(f"model={model!r} is not served by {endpoint.uri} (it serves {', '.join(names)}); {hint}")

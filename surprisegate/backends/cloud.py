"""What the cloud chat backends share (`openai`, `xai`, `gemini`, `ollama-chat`, `anthropic`; issue 12).

A cloud backend is the seam's `BlackBoxBackend`: one reply streams through the provider's official client
and each token becomes a `Step` scored from the logprobs the provider streams with it (DESIGN §4). Shared here:

- `Token`, `Parsed`, `align`: what a provider's parser makes of one stream event. Parsers are pure classes over
  the event's JSON as the provider sent it (the client's parsed objects are dumped back to dicts first), so
  they can be fuzzed offline without a client (tests/test_backend_cloud.py).
- steps: `Sampling.streamed_step`, as for the server backends: surprise = -log2 p of the chosen token
  (logprobs floored), entropy estimated from the top k (vocabulary size unknown), nan where no logprob came.
- `CloudStream`: the seam's `ChatStream`. A stream cut off raises a `CloudFault` (kind "truncated") after the
  steps that arrived; a mid-stream error event raises one (kind "stream_error") after them too.
- `CloudBackend.chat`: sends the request at once (an HTTP error is known on return) and reads the first
  event; a 429 / 5xx is retried with backoff, honouring Retry-After, within `retry_deadline_s` (the round
  deadline); a model that refuses logprobs is asked once more without them (or without streaming, where
  that is what it refuses), and the stream's `no_logprobs` names the refusal met.
- keys, base URLs, timeouts, model names and missing clients. Keys come only from the environment and
  never reach a repr, an `info` dict or a message: every `CloudFault` message is scrubbed of them.
"""

from __future__ import annotations

import email.utils
import importlib
import math
import os
import re
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import BackendError, BackendFault, ConfigError, InputError, MissingDependency
from . import Sampling, Step
from .http_session import as_logprob
from .http_stream import Timeouts

RETRY_DEADLINE_S = 2.0  # the round deadline: retries of a 429 / 5xx stop when it is spent
BACKOFF_S = 0.25  # first wait between retries when the provider names none; doubles each try
KEY_ENVS = ("OPENAI_API_KEY", "XAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_API_KEY")
# Key-shaped strings a provider may echo in an error (OpenAI's 401 shows a masked key): never passed on.
KEYLIKE = re.compile(r"\b(?:sk-|xai-|AIza)[A-Za-z0-9_*\-]{4,}")
ROLES = ("system", "user", "assistant")
# Parameters a model may refuse with "Unsupported parameter" that the request can do without (the token limit
# has two names: a refusal of one is met by sending the other).
DROPPABLE = ("temperature", "seed", "max_tokens", "max_completion_tokens")
# "Expected a value <= 20", "between 0 and 20", "maximum of 5": the limit a top-k refusal names.
LIMIT = re.compile(r"(?:<=|at most|maximum(?: value)?(?: of| is)?|between \d+ and)\s*(\d+)")
UNSUPPORTED = re.compile(r"[Uu]nsupported parameter:?\s*'?(\w+)")


class CloudFault(BackendFault):
    """A cloud provider refused a request or broke off a reply. The message names the provider, the status and
    the fix. `retryable`: a later try may pass (429, 5xx, a provider error before the first token);
    `retry_after`: seconds the provider asked to wait; `refusal`: what the model refused of the request
    ("logprobs", "stream", "top_k:N" or "param:NAME"), which `CloudBackend.chat` asks again without."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        kind: str,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        refusal: str | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(scrub(message), kind=kind, status=status)
        self.provider, self.retryable, self.retry_after, self.refusal = provider, retryable, retry_after, refusal
        self.detail = scrub(detail)


def scrub(text: str) -> str:
    """`text` without any API key of the environment, nor anything shaped like a key."""
    for name in KEY_ENVS:
        secret = os.environ.get(name) or ""
        if len(secret) >= 4:
            text = text.replace(secret, "[key]")
    return KEYLIKE.sub("[key]", text)


# --------------------------------------------------------------------------------------------------
# what a parser makes of one event
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    """One token (or, without logprobs, one text delta) of a reply as a parser reads it."""

    piece: bytes
    logprob: float | None = None  # natural log of its probability; None: unscored
    top: tuple[tuple[int | None, float], ...] = ()  # (id or None when the provider names none, logprob)
    token: int | None = None  # its id, where the provider sends one (Gemini)


@dataclass
class Parsed:
    """What one stream event says: the tokens it carries, and the finish reason if it ends the reply."""

    tokens: list[Token] = field(default_factory=list)
    finish: str | None = None


class Parser(Protocol):
    def feed(self, event: Any) -> Parsed: ...


def align(text: str, entries: Sequence[Token]) -> list[Token]:
    """The tokens of one event: its visible `text` and the logprob entries that came with it (each with its own
    bytes as its piece). The entries keep their pieces when those add up to the text; otherwise the text goes
    to the last entry (a provider may hold back part of a character, or send logprobs for text it shows
    later): joined, the pieces are always the text. No entries: the text is one unscored piece."""
    raw = text.encode("utf-8", "surrogatepass")
    if not entries:
        return [Token(raw)] if raw else []
    if b"".join(e.piece for e in entries) == raw:
        return list(entries)
    return [replace(e, piece=b"") for e in entries[:-1]] + [replace(entries[-1], piece=raw)]


def text_of(value: Any, what: str) -> str:
    """A text field of an event: a string, or nothing (None)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{what} is {str(value)[:60]}, not text")
    return value


def fields(value: Any, what: str) -> dict:
    """An object of an event: a dict, or nothing (None)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{what} is {str(value)[:60]}, not an object")
    return value


def items(value: Any, what: str) -> list:
    """A list of an event: a list, or nothing (None)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{what} is {str(value)[:60]}, not a list")
    return value


def token_bytes(value: Any, token: str, what: str) -> bytes:
    """A token's bytes: the provider's byte list where it sends one, else the UTF-8 of its string."""
    if value is None:
        return token.encode("utf-8", "surrogatepass")
    if not isinstance(value, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        raise TypeError(f"{what} is {str(value)[:60]}, not a list of bytes")
    return bytes(value)  # ValueError for a value outside 0..255


def top_entries(value: Any, what: str, id_key: str | None = None, lp_key: str = "logprob") -> tuple:
    """(id or None, logprob) of a top-k list; an entry without a logprob (the Responses API types allow
    one) is left out."""
    top = []
    for i, entry in enumerate(items(value, what)):
        entry = fields(entry, f"{what}[{i}]")
        if entry.get(lp_key) is None:
            continue
        known = token_id(entry.get(id_key), f"{what}[{i}].{id_key}") if id_key else None
        top.append((known, as_logprob(entry[lp_key], f"{what}[{i}].{lp_key}")))
    return tuple(top)


def logprob_entry(entry: Any, what: str) -> Token:
    """One token's logprob entry in OpenAI's shape {token, logprob, bytes, top_logprobs}, which Ollama and the
    Responses API share: its piece is its bytes where sent, else its string's UTF-8. llama.cpp's server adds
    each token's `id`: the step and its top k keep them."""
    entry = fields(entry, what)
    token = text_of(entry.get("token"), f"{what}.token")
    return Token(
        token_bytes(entry.get("bytes"), token, f"{what}.bytes"),
        as_logprob(entry.get("logprob"), f"{what}.logprob"),
        top_entries(entry.get("top_logprobs"), f"{what}.top_logprobs", id_key="id"),
        token_id(entry.get("id"), f"{what}.id"),
    )


def token_id(value: Any, what: str) -> int | None:
    """A token id where the provider sends one: a whole number (not a bool), or nothing."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{what} is {value!r}, not a token id")
    return value


# --------------------------------------------------------------------------------------------------
# errors: what a provider answered, as a CloudFault naming the fix
# --------------------------------------------------------------------------------------------------
def error_text(body: Any) -> str:
    """The provider's own message in an error body: OpenAI {error: {message}}, xAI {code, error: "..."},
    Anthropic {type, error: {type, message}}, Gemini {error: {code, message, status}}, Ollama {error: "..."}."""
    if isinstance(body, str):
        return body.strip()
    if isinstance(body, dict):
        for key in ("message", "error", "detail"):
            value = body.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
            if isinstance(value, dict) and (found := error_text(value)):
                return found
    return ""


def error_type(body: Any) -> str:
    """The error's type or status word where the body names one ("server_error", "overloaded_error")."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("type"), str):
            return str(inner["type"])
        for key in ("type", "status"):
            if isinstance(body.get(key), str) and body[key] != "error":
                return str(body[key])
    return ""


def refusal_of(status: int, detail: str, param: str | None = None) -> str | None:
    """What a 400 / 403 / 422 says the model refuses of the request, if it is something the request can do
    without: logprobs (or only a top k above a limit), streaming (or logprobs on streams), a parameter."""
    if status not in (400, 403, 422):
        return None
    text, param = detail.lower(), str(param or "")
    on_logprobs = "logprob" in text or "logprob" in param
    on_stream = param == "stream" or re.search(r"\bstream", text) is not None
    if on_logprobs and on_stream:
        return "stream"  # logprobs refused on streams only: the same request unstreamed may have them
    if on_logprobs:
        limit = LIMIT.search(text)
        return f"top_k:{limit.group(1)}" if limit and "top" in text + param else "logprobs"
    if on_stream:
        return "stream"
    named = UNSUPPORTED.search(detail)
    name = param if param in DROPPABLE else (named.group(1) if named else "")
    return f"param:{name}" if name in DROPPABLE else None


def http_fault(
    provider: str,
    status: int,
    detail: str,
    *,
    model: str,
    key_env: str | None,
    retry_after: float | None = None,
    param: str | None = None,
    fixes: dict[int, str] | None = None,
) -> CloudFault:
    """The fault of an HTTP error answer: the provider, the status, its message and the fix."""
    key_fix = f"set {key_env} to a valid API key" if key_env else "check the server's key"
    fix = (fixes or {}).get(status) or {
        401: key_fix,
        403: f"the key may not use model {model!r}: pass a model the account can use, or {key_fix}",
        404: f"pass a model the account can use (--model {model!r} is not one), or check --base-url",
        429: "wait and retry, or raise the account's rate limit or quota",
    }.get(status)
    if fix is None:
        fix = "the provider failed: retry later" if status >= 500 else "fix the request (the message names what)"
    kind = {401: "auth", 403: "auth", 404: "not_found", 429: "rate_limited"}.get(
        status, "server" if status >= 500 else "http"
    )
    detail = detail[:500] or "(no message)"
    return CloudFault(
        f"{provider}: HTTP {status} for model {model!r}: {detail}; {fix}",
        provider=provider,
        kind=kind,
        status=status,
        retryable=status == 429 or status >= 500,
        retry_after=retry_after,
        refusal=refusal_of(status, detail, param),
        detail=detail,
    )


def stream_fault(provider: str, model: str, detail: str, *, retryable: bool = False, status: int | None = None):
    """The fault of an error event in a stream (the HTTP status was 200)."""
    return CloudFault(
        f"{provider}: model {model!r} reported an error mid-stream: {detail[:500] or '(no message)'}; the "
        "steps before it are kept; retry the request",
        provider=provider,
        kind="stream_error",
        status=status,
        retryable=retryable,
        detail=detail,
    )


RETRYABLE_TYPES = ("server_error", "overloaded_error", "api_error", "rate_limit_error", "internal", "unavailable")


def transport_fault(provider: str, err: BaseException, *, streaming: bool, base_url: str) -> CloudFault | None:
    """The fault of a network failure, whichever HTTP package raised it: the clients use httpx or its fork
    httpx2, whose classes are not each other's, so they are told apart by name."""
    names = {c.__name__ for c in type(err).__mro__}
    if names & {"TimeoutException", "APITimeoutError", "TimeoutError"}:
        return CloudFault(
            f"{provider}: no answer from {base_url} within the timeout ({type(err).__name__}); retry, or raise "
            "first_byte_timeout / idle_timeout",
            provider=provider,
            kind="timeout",
        )
    if names & {"TransportError", "APIConnectionError", "ConnectionError", "NetworkError", "ProtocolError"}:
        if streaming:
            return CloudFault(
                f"{provider}: the connection to {base_url} broke mid-reply ({type(err).__name__}); the steps "
                "before it are kept; retry",
                provider=provider,
                kind="truncated",
            )
        return CloudFault(
            f"{provider}: cannot reach {base_url} ({type(err).__name__}: {str(err)[:200]}); check --base-url "
            "and the network",
            provider=provider,
            kind="connect",
        )
    return None


def retry_after_of(headers: Any) -> float | None:
    """Seconds a Retry-After (or retry-after-ms) header asks to wait; None where there is none."""
    try:
        if headers is None:
            return None
        ms = headers.get("retry-after-ms")
        if ms:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None


# --------------------------------------------------------------------------------------------------
# the stream of one reply
# --------------------------------------------------------------------------------------------------
END: Any = object()  # no first event: the stream was empty


@dataclass(frozen=True)
class Plan:
    """What one request asks for; a refusal changes it for the next try."""

    logprobs: bool
    top_k: int
    stream: bool = True
    dropped: frozenset[str] = frozenset()  # parameters the model refused: sent without them


@dataclass
class Opened:
    """A request that was sent: its events (the provider's JSON objects, in order) and how to close it."""

    events: Iterator[Any]
    close: Callable[[], None] = lambda: None


class CloudStream:
    """The seam's `ChatStream` over one provider stream. `requests` records each request that was sent
    for this reply (what it asked for, the fault it met); `notes` the refusals met on the way."""

    def __init__(
        self,
        backend: CloudBackend,
        opened: Opened,
        first: Any,
        sampling: Sampling,
        plan: Plan,
        notes: list[str],
        requests: list[dict[str, Any]],
        refused: str | None = None,
    ) -> None:
        self.finish_reason: str | None = None
        self.no_logprobs: str | None = backend.no_logprobs_reason or refused  # the logprobs refusal met, if any
        self.notes, self.requests = notes, requests
        self._backend, self._opened, self._sampling, self._plan = backend, opened, sampling, plan
        self._parser = backend.parser(plan)
        self._closed = False
        self._gen: Generator[Step, None, None] = self._run(first)

    def __iter__(self) -> CloudStream:
        return self

    def __next__(self) -> Step:
        return next(self._gen)

    def close(self) -> None:
        """Close the HTTP stream (the provider stops generating)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._gen.close()
        finally:
            self._close_request()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; the stream is closed either way
            pass

    def _close_request(self) -> None:
        try:
            self._opened.close()
        except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is closed either way
            pass

    def _run(self, first: Any) -> Generator[Step, None, None]:
        backend = self._backend
        received = scored = 0
        finished = False
        try:
            for event in self._events(first):
                parsed = self._feed(event)
                for tok in parsed.tokens:
                    step = self._sampling.streamed_step(tok.token, tok.piece, tok.logprob, tok.top)
                    received += 1
                    scored += not math.isnan(step.surprise)
                    yield step
                if parsed.finish is not None:
                    self.finish_reason, finished = parsed.finish, True
                    break  # the reply is whole: what follows (usage figures) is not read
        finally:
            self._settle(received, scored)
            self._close_request()
        if not finished:
            raise CloudFault(
                f"{backend.name}: the stream of model {backend.model_id!r} ended before the reply did "
                f"({received} pieces arrived and are kept); the connection was cut: retry",
                provider=backend.name,
                kind="truncated",
            )

    def _events(self, first: Any) -> Iterator[Any]:
        if first is END:
            return
        yield first
        events = self._opened.events
        while True:
            try:
                event = next(events)
            except StopIteration:
                return
            except Exception as err:  # noqa: BLE001 - clients raise many types on a broken stream; the seam raises BackendFault only
                raise self._backend.fault(err, streaming=True) from None
            yield event

    def _feed(self, event: Any) -> Parsed:
        try:
            return self._parser.feed(event)
        except CloudFault:
            raise
        except Exception as err:  # noqa: BLE001 - a parser reads untrusted JSON: anything it raises means a bad event
            name = self._backend.name
            raise CloudFault(
                f"{name}: unexpected stream event ({type(err).__name__}: {str(err)[:160]}): {str(event)[:160]}; "
                f"the stream is corrupt or --base-url is not a {name} endpoint",
                provider=name,
                kind="bad_event",
            ) from None

    def _settle(self, received: int, scored: int) -> None:
        """Say why the reply came without logprobs, where it did."""
        if self.no_logprobs is not None or scored:
            return
        backend = self._backend
        if not self._plan.logprobs:
            self.no_logprobs = "logprobs were not asked for (sampling.scored is False)"
        elif received:
            self.no_logprobs = (
                f"{backend.name} streamed model {backend.model_id!r}'s reply without logprobs (top "
                f"{self._plan.top_k} were asked for): this model or server does not send them"
            )


# --------------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------------
class CloudBackend:
    """What every cloud backend shares: the request with its retries and refusals, faults, `info`.
    A provider adds `_open` (send one request), `parser` and `_client_fault` (its client's exceptions)."""

    name = "cloud"
    key_env: str | None = None
    no_logprobs_reason: str | None = None  # a provider that has none says so here (Anthropic)

    def __init__(
        self,
        client: Any,
        model: str | None,
        *,
        top_k: int,
        base_url: str,
        retry_deadline_s: float = RETRY_DEADLINE_S,
        timeouts: Timeouts | None = None,
    ) -> None:
        self._client = client  # holds the key: never shown (repr, info)
        self.model_id = require_model(self.name, model)
        self.top_k = int(top_k)
        self.SIGNAL_TOP_K = self.top_k  # capabilities.TopKSignals: signals from this top k (which calibration applies)
        self.base_url = base_url
        if isinstance(retry_deadline_s, bool) or not isinstance(retry_deadline_s, (int, float)) or retry_deadline_s < 0:
            raise ConfigError(f"retry_deadline_s={retry_deadline_s!r} must be seconds >= 0 (0: no retries)")
        self.retry_deadline_s = float(retry_deadline_s)
        self.timeouts = timeouts or Timeouts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, base_url={self.base_url!r})"

    @property
    def info(self) -> dict[str, Any]:
        """What a receipt may say about the backend (never the key)."""
        return {
            "backend": self.name,
            "model_id": self.model_id,
            "base_url": self.base_url,
            "top_k": self.top_k,
            "retry_deadline_s": self.retry_deadline_s,
            "timeouts": {
                "connect": self.timeouts.connect,
                "first_byte": self.timeouts.first_byte,
                "idle": self.timeouts.idle,
            },
            "key_env": self.key_env,
            **self._info(),
        }

    def _info(self) -> dict[str, Any]:
        return {}

    # --- the request --------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], sampling: Sampling, max_tokens: int) -> CloudStream:
        """Stream one reply to `messages` (see `BlackBoxBackend.chat`). The request is sent now and its first
        event read: an HTTP error raises here, after the retries and refusals below."""
        msgs = check_messages(messages)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InputError(f"max_tokens={max_tokens!r} must be a whole number >= 1 (tokens in the reply)")
        asked = bool(sampling.scored) and self.top_k > 0
        plan = Plan(logprobs=asked, top_k=self.top_k if asked else 0)
        notes: list[str] = []
        refused: str | None = None  # the note of a logprobs refusal: the stream's `no_logprobs`
        requests: list[dict[str, Any]] = []
        deadline, tries = time.monotonic() + self.retry_deadline_s, 0
        while True:
            record: dict[str, Any] = {"stream": plan.stream, "logprobs": plan.logprobs, "top_k": plan.top_k}
            requests.append(record)
            try:
                opened, first = self._first(msgs, sampling, max_tokens, plan)
                return CloudStream(self, opened, first, sampling, plan, notes, requests, refused)
            except Exception as err:  # noqa: BLE001 - each client raises its own types; all become CloudFaults
                fault = self.fault(err, streaming=False)
            record["fault"], record["status"] = fault.kind, fault.status
            replanned = self._replan(plan, fault)
            if replanned is not None:
                if plan.logprobs and not replanned[0].logprobs:
                    refused = replanned[1]
                plan, note = replanned
                if note:
                    notes.append(note)
                continue
            wait = self._backoff(fault, tries, deadline)
            if wait is None:
                raise self._gave_up(fault, tries, deadline) from None
            time.sleep(wait)
            tries += 1

    def _first(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> tuple:
        """Send the request and read its first event (a client that sends lazily sends it now)."""
        opened = self._open(msgs, sampling, max_tokens, plan)
        try:
            return opened, next(opened.events, END)
        except BaseException:
            try:
                opened.close()
            except Exception:  # noqa: BLE001 - the first fault is the one to report
                pass
            raise

    def _replan(self, plan: Plan, fault: CloudFault) -> tuple[Plan, str | None] | None:
        """The request to try next after a refusal, with a note for the receipt; None: not a refusal the
        request can do without."""
        refusal = fault.refusal or ""
        if refusal.startswith("top_k:"):
            limit = int(refusal.partition(":")[2])
            if plan.logprobs and 0 < limit < plan.top_k:
                return replace(plan, top_k=limit), None
            refusal = "logprobs"
        met = f"(HTTP {fault.status}: {fault.detail[:200]})"
        who = f"{self.name} refused"
        if refusal == "logprobs" and plan.logprobs:
            note = f"{who} logprobs for model {self.model_id!r} {met}; the reply was asked again without them"
            return replace(plan, logprobs=False, top_k=0), note
        if refusal == "stream" and plan.stream:
            return replace(plan, stream=False), f"{who} to stream model {self.model_id!r} {met}; asked again unstreamed"
        name = refusal.partition(":")[2] if refusal.startswith("param:") else ""
        if name and name not in plan.dropped:
            return replace(plan, dropped=plan.dropped | {name}), f"{who} {name!r} {met}; asked again without it"
        return None

    @staticmethod
    def _backoff(fault: CloudFault, tries: int, deadline: float) -> float | None:
        """Seconds to wait before the next try of a retryable fault; None: give up (not retryable, or the
        round deadline comes first)."""
        if not fault.retryable:
            return None
        wait = fault.retry_after if fault.retry_after is not None else BACKOFF_S * 2**tries
        return wait if time.monotonic() + wait <= deadline else None

    def _gave_up(self, fault: CloudFault, tries: int, deadline: float) -> CloudFault:
        if not fault.retryable:
            return fault
        n = f"{tries + 1} {'try' if tries == 0 else 'tries'}"
        why = f"gave up after {n} within retry_deadline_s={self.retry_deadline_s:g} (the round deadline)"
        if fault.retry_after is not None and time.monotonic() + fault.retry_after > deadline:
            why += f"; the provider asked to wait {fault.retry_after:g} s"
        return CloudFault(
            f"{fault}; {why}",
            provider=fault.provider,
            kind=fault.kind,
            status=fault.status,
            retryable=True,
            retry_after=fault.retry_after,
            detail=fault.detail,
        )

    # --- faults -------------------------------------------------------------------------------------
    def fault(self, err: BaseException, *, streaming: bool) -> CloudFault:
        """Any exception of the client (or of reading its events) as a CloudFault naming provider and fix."""
        if isinstance(err, CloudFault):
            return err
        mapped = self._client_fault(err, streaming=streaming) or transport_fault(
            self.name, err, streaming=streaming, base_url=self.base_url
        )
        if mapped is not None:
            return mapped
        return CloudFault(
            f"{self.name}: the reply of model {self.model_id!r} could not be read ({type(err).__name__}: "
            f"{str(err)[:200]}); the stream is corrupt or --base-url is not a {self.name} endpoint",
            provider=self.name,
            kind="bad_event",
        )

    def _http(self, status: int, body: Any, headers: Any = None, param: str | None = None) -> CloudFault:
        return http_fault(
            self.name,
            status,
            error_text(body),
            model=self.model_id,
            key_env=self.key_env,
            retry_after=retry_after_of(headers),
            param=param,
            fixes=self.fixes(),
        )

    def fixes(self) -> dict[int, str]:
        """Fixes of this provider's own by HTTP status, where the general ones do not fit."""
        return {}

    # --- what each provider gives ------------------------------------------------------------------------
    def _open(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> Opened:
        raise NotImplementedError

    def parser(self, plan: Plan) -> Parser:
        raise NotImplementedError

    def _client_fault(self, err: BaseException, *, streaming: bool) -> CloudFault | None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# messages, models, keys, base URLs, timeouts, clients
# --------------------------------------------------------------------------------------------------
def check_messages(messages: Any) -> list[dict[str, str]]:
    """The messages as {role, content} dicts; roles system / user / assistant, at least one not system."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"messages={str(messages)[:60]} must be a non-empty list of {{role, content}} dicts")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ROLES or not isinstance(content, str):
            raise InputError(
                f"messages[{i}]={str(m)[:80]} needs a role (system, user or assistant) and its content as text"
            )
        out.append({"role": str(role), "content": content})
    if all(m["role"] == "system" for m in out):
        raise InputError("messages hold only system turns; add the user's turn")
    return out


def split_system(msgs: list[dict[str, str]]) -> tuple[str | None, list[dict[str, str]]]:
    """(the system turns joined, in order; the other turns) for a provider that takes one system text."""
    system = [m["content"] for m in msgs if m["role"] == "system"]
    return ("\n\n".join(system) if system else None), [m for m in msgs if m["role"] != "system"]


def require_model(backend: str, model: str | None, example: str = "") -> str:
    if model is None or not str(model).strip():
        hint = f", e.g. --model {example}" if example else ""
        raise ConfigError(f"backend={backend!r} needs a model name: pass --model, the provider's model name{hint}")
    return str(model).strip()


def env_key(*names: str) -> str | None:
    """The first of these environment variables that is set (keys never come from a config)."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def base_url_of(given: str | None, env_names: Sequence[str], default: str) -> tuple[str, bool]:
    """(the endpoint: `given`, else the provider's usual variable, else its default; whether it is the default)."""
    url = (given or "").strip() or env_key(*env_names)
    return (url.rstrip("/"), False) if url else (default, True)


def top_k_of(backend: str, top_k: int | None, limit: int) -> int:
    """Top logprobs to ask for per token: the provider's limit, or fewer when asked (`calibrate --top-k`)."""
    if top_k is None:
        return limit
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= limit:
        raise ConfigError(f"top_k={top_k!r} for backend={backend!r} must be a whole number from 0 to {limit}")
    return top_k


def timeouts_of(connect: float | None, first_byte: float | None, idle: float | None) -> Timeouts:
    """The config keys connect_timeout, first_byte_timeout, idle_timeout (None: the default)."""
    defaults = Timeouts()
    return Timeouts(connect or defaults.connect, first_byte or defaults.first_byte, idle or defaults.idle)


def read_timeout(timeouts: Timeouts) -> float:
    """The clients' one read timeout covers both the wait for the first byte and the gaps between chunks."""
    return max(timeouts.first_byte, timeouts.idle)


def import_client(module: str, extra: str, backend: str) -> Any:
    """The provider's client package, or a MissingDependency naming the pip command."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(
            f"backend={backend!r} needs the {module!r} package, which is not installed; "
            f"pip install 'surprisegate[{extra}]'"
        ) from None


def need_key(backend: str, key: str | None, key_env: str, default_url: bool) -> str:
    """The key for the client. The provider's own endpoint needs one; a server at another base URL may not
    (the client still wants a string)."""
    if key:
        return key
    if default_url:
        raise BackendError(f"backend={backend!r} needs an API key: set {key_env} (or pass base_url for another server)")
    return "no-key"

"""Running the gate for requests: admission, one worker thread per reply, receipts.

The loop (gate.loop.stream) is blocking Python; each admitted request runs it in its own thread, which
hands events to the request's asyncio side through a queue. `slots` requests run at once (the backend's
sessions; in-process they decode together in one batch) and at most `queue` more wait; beyond that a
request is refused at once (429), so a burst never piles up unbounded work. A request whose client goes
away sets its cancel flag: its thread closes the event iterator, which closes the session, and only then
gives its slot back (so the next request always finds a free session).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from ..backends import Grammars, SteerableBackend
from ..backends.http_session import ServerBackend
from ..config import SAMPLING_KEYS, Config
from ..errors import InputError
from ..gate.events import Done, Event
from ..gate.loop import stream
from ..gate.prompting import Continuation, ReplyPrompt, conversation, has_tool_turns
from ..gate.receipts import ReceiptWriter, fit_receipt
from ..gate.result import build_receipt
from ..gate.structured import ResponseFormat, told_format
from ..gate.structured import parsed as parsed_json
from ..gate.tools import ParsedReply, ToolUse, call_scores, parse_tool_calls
from ..paths import home
from ..runtime import arms_for
from .replies import cut_at_stop
from .wire import REQUEST_KEYS, ApiError, GateRequest, Limits, chat_turns

_END = object()  # the worker thread is finished (after its last event or error)
DEFAULT_MAX_RECEIPT_BYTES = 256 << 10  # one receipt in the file; a bigger one keeps its ids and hashes, text cut
MIN_RECEIPT_BYTES = 4096


class Admission:
    """`slots` requests run, at most `queue` more wait (FIFO, asyncio.Semaphore's order); the rest get 429.
    Lives on the event loop: its counters need no lock."""

    def __init__(self, slots: int, queue: int) -> None:
        self.slots, self.queue = slots, queue
        self._sem = asyncio.Semaphore(slots)
        self.active = 0
        self.waiting = 0
        self._recent_s: list[float] = []  # durations of the latest replies, for Retry-After

    async def acquire(self) -> None:
        self.enqueue()
        await self.admitted()

    def enqueue(self) -> None:
        """Take a place in the queue now, or a 429 when there is none (before any response has started)."""
        if self.active + self.waiting >= self.slots + self.queue:
            raise ApiError(
                f"the server is busy: {self.active} replies running and {self.waiting} waiting (queue of "
                f"{self.queue}); retry after the Retry-After seconds",
                status=429,
                code="queue_full",
                kind="rate_limit_error",
                headers={"Retry-After": str(self.retry_after())},
            )
        self.waiting += 1

    async def admitted(self) -> None:
        """Wait in the place `enqueue` took for a slot (a cancelled wait gives the place back)."""
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.active += 1

    def release(self, seconds: float | None = None) -> None:
        self.active -= 1
        self._sem.release()
        if seconds is not None:
            self._recent_s = (self._recent_s + [seconds])[-32:]

    def retry_after(self) -> int:
        """Seconds until a place frees up, from recent reply times (1 to 60)."""
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        return max(1, min(60, math.ceil(mean * (self.waiting + 1) / self.slots)))


class RotatingReceipts:
    """Receipts appended as `receipts.ReceiptWriter` does (one durable line each); once the file passes
    `max_bytes` it becomes FILE.1 (FILE.1 becomes FILE.2, ... up to `keep`), so prompts never pile up
    without bound. Thread-safe: worker threads append."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_bytes: int = 64 << 20,
        keep: int = 3,
        max_receipt_bytes: int | None = None,  # None: DEFAULT_MAX_RECEIPT_BYTES, at most the file's size
    ) -> None:
        if max_bytes < 1024 or keep < 1:
            raise InputError(
                f"receipts max_bytes={max_bytes}, keep={keep}: keep at least 1 KiB and 1 rotated file "
                "(or pass --no-receipts)"
            )
        if max_receipt_bytes is None:
            max_receipt_bytes = max(MIN_RECEIPT_BYTES, min(DEFAULT_MAX_RECEIPT_BYTES, max_bytes))
        if not MIN_RECEIPT_BYTES <= max_receipt_bytes <= max(max_bytes, MIN_RECEIPT_BYTES):
            raise InputError(
                f"max_receipt_bytes={max_receipt_bytes}: cap one receipt at {MIN_RECEIPT_BYTES} bytes to the "
                f"file's {max_bytes} bytes, e.g. {DEFAULT_MAX_RECEIPT_BYTES}"
            )
        self.writer = ReceiptWriter(path)  # private: 0600 file, 0700 folders it makes
        self.path, self.max_bytes, self.keep = Path(path), max_bytes, keep
        self.max_receipt_bytes = max_receipt_bytes
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        # One request's receipt never pushes more than its cap into the file, so it cannot rotate others out.
        record = fit_receipt(record, self.max_receipt_bytes)
        with self._lock:
            if self.path.exists() and self.path.stat().st_size >= self.max_bytes:
                self._rotate()
            self.writer.append(record)

    def _rotate(self) -> None:
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))


def continuation_for(backend: Any, request: GateRequest, limits: Limits) -> GateRequest:
    """A completion's raw prompt made ready for this backend: token ids checked against the vocabulary and
    decoded (their text is the arms' question); a backend that writes chat replies only gets the text as a
    user turn, said in the notes, and cannot take token ids (400)."""
    cont = request.continuation
    if cont is None:
        return request
    if not isinstance(backend, SteerableBackend):
        name = getattr(backend, "name", "remote")
        if cont.token_ids is not None:
            raise ApiError(
                f"prompt is token ids, but the {name} backend writes chat replies from text only; send the prompt "
                "as a string",
                param="prompt",
                code="token_ids_unsupported",
            )
        note = f"the {name} backend writes chat replies only: the prompt was asked as a user turn, not continued"
        messages = chat_turns([{"role": "user", "content": cont.text}], limits, request.config.system_prompt)
        return replace(request, messages=messages, continuation=None, notes=(*request.notes, note))
    if cont.token_ids is not None:
        past = past_vocabulary(backend, cont.token_ids)
        if past is not None:
            raise ApiError(
                f"prompt holds token id {past[0]}, past this model's vocabulary of {past[1]} tokens; send ids the "
                "model's tokenizer gives",
                param="prompt",
            )
        text = b"".join(backend.token_bytes(t) for t in cont.token_ids).decode("utf-8", "replace")
        cont = Continuation(text, cont.token_ids)
    # A raw text has no turns to put a system turn between: evidence goes inline (gate.loop; said in the receipt).
    asked = request.overrides.get("injection", "inline")
    if asked != "inline":
        raise ApiError(
            f"surprisegate.injection={asked!r}: a raw prompt has no chat turns to put evidence between; send "
            "injection 'inline' or leave it out (or ask through /v1/chat/completions)",
            param="surprisegate.injection",
        )
    config = replace(request.config, injection="inline")
    return replace(request, messages=cont.messages, continuation=cont, config=config)


def check_context(backend: Any, request: GateRequest) -> None:
    """A chat that cannot fit the model's context with its max_tokens is the client's to fix (400), not
    a failure halfway through the reply. Checked where the backend says its context size (a
    `capabilities.ContextSize`: llama.cpp in process, a server that reports one)."""
    from ..backends import ContextSize

    n_ctx = backend.n_ctx if isinstance(backend, ContextSize) else None
    if not isinstance(n_ctx, int):
        return
    if request.continuation is not None:
        n = len(ReplyPrompt.continuing(backend, request.continuation).tokens)
        return _check_fits(n, request.config.max_tokens, n_ctx, "prompt")
    chat = conversation(request.messages, request.config.system_prompt)
    if request.response_format is not None:  # the reply's chat says the format (structured.told_format)
        chat, _ = told_format(chat, request.response_format, request.config)
    tools = request.tool_use.tools if request.tool_use is not None else None
    try:
        prompt = backend.chat_prompt(chat, tools=tools) if tools or has_tool_turns(chat) else backend.chat_prompt(chat)
    except InputError as err:  # the template refused the chat (tools.ToolTemplate): the client's to fix
        raise ApiError(str(err)[:600], param="messages", code="template_refused") from None
    _check_fits(len(backend.tokenize(prompt, special=True)), request.config.max_tokens, n_ctx, "messages")


def _check_fits(n: int, max_tokens: int, n_ctx: int, param: str) -> None:
    what = "chat" if param == "messages" else param
    if n + max_tokens > n_ctx:
        raise ApiError(
            f"the {what} is {n} tokens and max_tokens={max_tokens}: over the model's context of "
            f"{n_ctx} tokens; shorten the {what} or lower max_tokens",
            param=param,
            code="context_length_exceeded",
        )


def check_logit_bias(backend: Any, request: GateRequest) -> None:
    """A biased token id past the model's vocabulary is the client's to fix (400); checked where the backend
    says its vocabulary size (`capabilities.VocabSize`)."""
    past = past_vocabulary(backend, sorted(request.config.logit_bias))
    if past is not None:
        bad, n_vocab = past
        raise ApiError(
            f"logit_bias names token id {bad}, past this model's vocabulary of {n_vocab} tokens (ids 0 to "
            f"{n_vocab - 1}); send ids the model's tokenizer gives",
            param=f"logit_bias.{bad}",
        )


def past_vocabulary(backend: Any, ids: Sequence[int]) -> tuple[int, int] | None:
    """(the first of `ids` past the model's vocabulary, its size), or None: all inside it, or the backend does
    not say its size (`capabilities.VocabSize`)."""
    n_vocab = getattr(backend, "n_vocab", None)
    if not isinstance(n_vocab, int):
        return None
    return next(((t, n_vocab) for t in ids if t >= n_vocab), None)


def tool_use(backend: Any, request: GateRequest, model: str) -> ToolUse | None:
    """The tools this request's reply may call, or None (none offered, or tool_choice "none"); a 400 when
    the model cannot render them (no tool support in its template) or the backend cannot."""
    turns = has_tool_turns(request.messages)
    wanted = bool(request.tools) and request.tool_choice != "none"
    if not (wanted or turns):
        return None
    fmt = getattr(backend, "tool_format", None)
    if not getattr(backend, "renders_tools", False):
        raise ApiError(
            f"model {model!r} is served through the {getattr(backend, 'name', 'remote')} backend, which does not "
            "take tools or tool turns here yet; serve a GGUF in process (--backend llamacpp) or through llama.cpp's "
            "server (--backend llama-server://HOST:PORT) for tool calls",
            param="tools" if wanted else "messages",
            code="tools_unsupported",
        )
    if fmt is None:
        raise ApiError(
            f"model {model!r} has a chat template without tool calls this server can read (Hermes "
            "<tool_call> format); serve a model whose template offers tools (e.g. Qwen2.5) or drop tools",
            param="tools" if wanted else "messages",
            code="tools_unsupported",
        )
    if not wanted:
        return None
    return ToolUse(request.tools, fmt, request.tool_choice, request.parallel_tool_calls)


def check_response_format(backend: Any, request: GateRequest, model: str) -> None:
    """A JSON format needs a backend that decodes under a grammar: a 400 naming the model otherwise."""
    if request.response_format is not None and not isinstance(backend, Grammars):
        raise ApiError(
            f"response_format={request.response_format.kind}: model {model!r} is served through the "
            f"{getattr(backend, 'name', 'remote')} backend, which takes no grammar here; serve a GGUF in process "
            "(--backend llamacpp), or through llama.cpp's server, vLLM or SGLang (llama-server://, vllm://, "
            "sglang://), for JSON output",
            param="response_format" if request.endpoint != "responses" else "text.format",
            code="response_format_unsupported",
        )


SIGNAL_UNDER_GRAMMAR = {
    "in_process": "under the grammar: surprise and entropy over the tokens it allows (of the 64 most likely); "
    "each JSON value judged when it closes",
    "server": "the server's grammar sampler: surprise and entropy from the model's own top logprobs; each JSON "
    "value judged when it closes, and a doubtful reply rewound whole once it ends (the server's grammar starts "
    "at its root each request)",
}


def structured_receipt(output: ResponseFormat, text: str, receipt: dict[str, Any], server: bool = False) -> None:
    """What the format was and whether the reply parses (`extra.response_format`): a reply cut at max_tokens
    does not; the client's finish_reason "length" says so too. `server`: a server's grammar sampler held it."""
    receipt.setdefault("extra", {})["response_format"] = output.receipt() | {
        "parses": parsed_json(text) is not None,
        "signal": SIGNAL_UNDER_GRAMMAR["server" if server else "in_process"],
    }


def parse_calls(tools: ToolUse, text: str, receipt: dict[str, Any], token_bytes: Any) -> ParsedReply:
    """The reply's tool calls (a forced call's opening is ours: it stands before the reply's text), each
    scored in the receipt (`extra.tool_calls`): its tokens' surprise, never rewound."""
    parsed = parse_tool_calls(tools.opening + text, tools.format, tools.parallel)
    extra = receipt.setdefault("extra", {})
    pieces = [tools.opening] + [token_bytes(t).decode("utf-8", "replace") for t in extra.get("token_ids", [])]
    surprises = [math.nan, *extra.get("token_surprises", [])]
    extra["tool_calls"] = [call_scores(c, pieces, surprises) for c in parsed.calls]
    extra["tools"] = {
        "offered": [t["function"]["name"] for t in tools.tools],
        "choice": tools.choice,
        "parallel": tools.parallel,
        "format": tools.format.family,
        "unparsed": parsed.unparsed,
    }
    return parsed


@dataclass
class Finished:
    """The Done event with the receipt built (and written) in the worker thread. `receipt` is what the
    client is sent (client_receipt); the file keeps the whole one. `parsed`: the reply as content and tool
    calls, when tools were offered."""

    done: Done
    receipt: dict[str, Any]
    parsed: ParsedReply | None = None


class Generation:
    """One reply running in its own thread; `events()` yields its events on the asyncio side."""

    def __init__(
        self,
        runtime: Any,
        request: GateRequest,
        receipts: RotatingReceipts | None,
        on_end: Any,
        view: ClientView | None = None,
    ) -> None:
        self.runtime, self.request, self.receipts, self.on_end = runtime, request, receipts, on_end
        self.view = view
        self.reply_id = uuid.uuid4().hex
        self.cancelled = threading.Event()
        self.started = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def start(self) -> None:
        self.started = time.monotonic()  # a stream may have waited in the queue since it was made
        threading.Thread(target=self._run, name=f"surprisegate-reply-{self.reply_id[:8]}", daemon=True).start()

    def cancel(self) -> None:
        """The client went away: the thread stops at its next event and frees the session."""
        self.cancelled.set()

    async def events(self) -> AsyncIterator[Event | Finished]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    # --- the worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        r = self.request
        arms = arms_for(r.config, self.runtime.arms)
        # gate.loop.stream is a generator: close() runs its finally, which closes the reply's session.
        # A stop string ends the reply's decoding too, not only what the client is sent.
        asked = r.continuation if r.continuation is not None else r.messages
        reply = stream(
            self.runtime.backend, asked, r.config, arms, stop=r.stops, tools=r.tool_use, output=r.response_format
        )
        events = cast(Generator[Event, None, None], reply)
        try:
            for event in events:
                if self.cancelled.is_set():
                    break
                self._push(self._finish(event) if isinstance(event, Done) else event)
        except Exception as err:  # noqa: BLE001 - handed to the request, which answers 500 and the metrics count it
            self._push(err)
        finally:
            events.close()
            self._push(_END)
            self._call_soon(self.on_end, self)

    def _finish(self, done: Done) -> Finished:
        served = {
            "endpoint": self.request.endpoint,
            "request": self.request.overrides,
            "stop": list(self.request.stops),
            "notes": list(self.request.notes),
        }
        # The id is known from the start: the stream's header carries it.
        receipt = build_receipt(
            done.result, self.runtime.backend, self.request.config, reply_id=self.reply_id, extra={"serve": served}
        )
        if self.request.response_format is not None:
            text = cut_at_stop(done.text, self.request.stops)[0]
            server = isinstance(self.runtime.backend, ServerBackend)
            structured_receipt(self.request.response_format, text, receipt, server)
        parsed = None
        if self.request.tool_use is not None:
            text, _ = cut_at_stop(done.text, self.request.stops)
            parsed = parse_calls(self.request.tool_use, text, receipt, self.runtime.backend.token_bytes)
        if self.receipts is not None:
            self.receipts.append(receipt)
        view = self.view or ClientView.of(self.runtime, self.request.config)
        return Finished(done, view.receipt(receipt), parsed)

    def _push(self, item: Any) -> None:
        self._call_soon(self._queue.put_nowait, item)

    def _call_soon(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop has closed (server shut down): nobody is listening
            pass


# --------------------------------------------------------------------------------------------
# what a client sees of the server
# --------------------------------------------------------------------------------------------
# Config keys a client may see in its receipt: what a request may set, and its sampling. The rest (system
# prompt, tool roots and allow-lists, model path, backend URI, templates, timeouts) is the operator's.
CLIENT_CONFIG_KEYS = (
    *(k for k in REQUEST_KEYS if k != "events"),
    "max_tokens",
    "temperature",
    "seed",
    *SAMPLING_KEYS,
    "top_logprobs",
    "tail_cut",
    "claim_scope",
    "paragraph_rounds",
)
REDACTED = "[server]"


@dataclass(frozen=True)
class ClientView:
    """The receipt a client is sent: its own reply's record without the server's configuration (unless the
    operator opts in with `show_config`). Server strings (roots, status targets, the model's path, the
    backend URI, home, the system prompt) are cut out of every text, tool errors included."""

    served_model: str
    system_prompt: str
    secrets: tuple[str, ...]  # longest first, so a root inside home is cut as a whole
    show_config: bool = False

    @classmethod
    def of(cls, runtime: Any, config: Config, served_model: str = "", show_config: bool = False) -> ClientView:
        model_id = str(runtime.backend.model_id)
        served = served_model or (Path(model_id).stem if model_id.endswith(".gguf") else model_id)
        return cls(served, config.system_prompt, server_strings(runtime, config), show_config)

    def receipt(self, receipt: dict[str, Any]) -> dict[str, Any]:
        if self.show_config:
            return receipt
        view = dict(receipt)
        view["config"] = {k: v for k, v in receipt.get("config", {}).items() if k in CLIENT_CONFIG_KEYS}
        view["model"] = self.served_model
        if view.get("messages"):
            view["messages"] = self._messages(view["messages"])
        return cast(dict[str, Any], self._scrub(view))

    def _messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The chat without the server's system prompt (a client's own system text stays)."""
        first, rest = messages[0], messages[1:]
        if (
            first.get("role") != "system"
            or not self.system_prompt
            or not first["content"].startswith(self.system_prompt)
        ):
            return messages
        own = first["content"][len(self.system_prompt) :].lstrip("\n")
        return ([{"role": "system", "content": own}] if own else []) + rest

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self.secrets:
                if secret in value:
                    value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        return value


def server_strings(runtime: Any, config: Config) -> tuple[str, ...]:
    """Texts that tell a client about the server's machine or deployment, longest first."""
    from ..arms.status import parse_target

    # A model named by path shows where the server keeps its files; a served name (vLLM's) is public.
    found = {m for m in (str(runtime.backend.model_id), config.model) if os.path.isabs(m) or os.path.exists(m)}
    found |= {config.base_url, str(home())}
    if "://" in config.backend:
        found.add(config.backend)
    for root in config.tool_roots:
        found |= {root, os.path.realpath(root)}
    for target in config.tool_status_targets:
        found.add(target)
        try:
            found.add(parse_target(target).label)
        except Exception:  # noqa: BLE001 - a target the tool refuses anyway; its raw text is still cut
            pass
    if config.system_prompt and len(config.system_prompt) >= 16:
        found.add(config.system_prompt)
    # Short strings ("/", "a") would cut ordinary words out of the reply: only paths and names worth hiding.
    return tuple(sorted((s for s in found if s and len(s) >= 4 and s != "/"), key=len, reverse=True))

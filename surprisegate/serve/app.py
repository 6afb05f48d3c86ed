"""The ASGI app: OpenAI-compatible routes on Starlette, SSE from sse-starlette.

Read like llama-cpp-python's server/app.py: a few routes over one loaded model, here with the gate in
the loop, several sessions instead of one lock, and every error OpenAI-shaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backends import SteerableBackend
from ..gate.events import Grounding, Rewind, Token, Trigger
from ..receipt_view import render_page
from ..text import first_stop
from .gate import (
    Admission,
    ClientView,
    Finished,
    Generation,
    RotatingReceipts,
    check_context,
    check_logit_bias,
    check_response_format,
    continuation_for,
    tool_use,
)
from .metrics import CONTENT_TYPE, Metrics
from .replies import ReplyShape, StopCutter, cut_at_stop, finish_reason, token_info, token_infos
from .ui import PAGE, PAGE_POLICY, SCRIPT
from .wire import ApiError, GateRequest, Limits, parse_chat, parse_completion, parse_json, parse_responses, shown

# An unread body would be parsed as the next request on a kept-alive connection: close it after the error.
CLOSE = {"Connection": "close"}
log = logging.getLogger("surprisegate.serve")
DISCONNECTED = 499  # nginx's "client closed request": counted, never seen by the client
# A stream's keep-alive: an SSE comment this often, so that while text is held back (grounding, a rewrite)
# the wire is never silent for longer; clients skip comments, proxies and read timeouts see bytes.
KEEPALIVE_S = 1.0


@dataclass
class ServeSettings:
    """What `surprisegate serve` adds to the gate's config: admission, limits, receipts, auth."""

    slots: int = 1  # replies written at once (the backend's sessions)
    queue: int = 32  # requests waiting for a slot before 429
    limits: Limits = field(default_factory=Limits)
    body_timeout_s: float = 10.0  # a request body must arrive within this (slow clients get 408)
    receipts: RotatingReceipts | None = None  # None: keep no receipts (they hold users' prompts)
    api_key: str | None = None  # from SURPRISEGATE_API_KEY; never in a config or a receipt
    model_name: str | None = None  # the id clients send; default: the model file's stem
    show_config: bool = False  # clients' receipts carry the server's config too (--receipts-show-config)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call (--cors-origin); none by default
    recent_receipts: int = 1024  # client receipts kept in memory for GET /v1/receipts/{id} (with receipts on)
    ui: bool = False  # the chat page at / (--ui; ui.py)


# A round's events, sent as they happen to a stream that asks ("surprisegate": {"events": true}).
ROUND_EVENTS = (Trigger, Grounding, Rewind)


def served_name(model_id: str) -> str:
    """The model id clients send: a GGUF path's file stem, a served name as it is."""
    path = Path(model_id)
    return path.stem if path.suffix == ".gguf" else model_id


class Server:
    """One app's state: the loaded runtime (backend, arms, config), admission, metrics and receipts."""

    def __init__(self, runtime: Any, settings: ServeSettings) -> None:
        self.runtime, self.settings = runtime, settings
        self.admission = Admission(settings.slots, settings.queue)
        self.metrics = Metrics()
        self.metrics.queue_depth.set_function(lambda: self.admission.waiting)
        self.metrics.active.set_function(lambda: self.admission.active)
        self.model = settings.model_name or served_name(str(runtime.backend.model_id))
        # What a client sees of the server: the same for every request (they cannot change what it hides).
        self.view = ClientView.of(runtime, runtime.config, self.model, settings.show_config)
        self.started = int(time.time())
        self.live: set[Generation] = set()
        self.token_bytes = runtime.backend.token_bytes if isinstance(runtime.backend, SteerableBackend) else None
        thresholds = runtime.thresholds
        self.detect_only = bool(thresholds is not None and thresholds.detect_only)
        self.recent = RecentReceipts(settings.recent_receipts if settings.receipts is not None else 0)

    # --- routes -----------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._complete(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, parse_completion)

    async def responses(self, request: Request) -> Response:
        return await self._complete(request, parse_responses)

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> Response:
        """GET /v1/models/{id} (the SDK's models.retrieve)."""
        self.authorize(request)
        asked = request.path_params["model_id"]
        if asked != self.model:
            raise ApiError(
                f"model {shown(asked)} is not served here; this server serves {self.model} (GET /v1/models)",
                status=404,
                param="model",
                code="model_not_found",
            )
        return JSONResponse(self._card())

    def _card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.started, "owned_by": "surprisegate"}

    async def receipt(self, request: Request) -> Response:
        """GET /v1/receipts/{id}: a reply's receipt (as its caller was sent it) for the caller that made it."""
        return JSONResponse(self._callers_receipt(request))

    async def receipt_page(self, request: Request) -> Response:
        """GET /receipts/{id}: the same receipt as a page (receipt_view.py), for the same caller. It may load
        nothing: the policy forbids every request, styles inline aside."""
        page = render_page([self._callers_receipt(request)])
        policy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
        return Response(page, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": policy})

    def _callers_receipt(self, request: Request) -> dict[str, Any]:
        self.authorize(request)
        reply_id = request.path_params["reply_id"]
        if not self.recent.capacity:
            raise ApiError(
                "this server keeps no receipts (--no-receipts); read the receipt from the reply itself",
                status=404,
                code="receipts_off",
            )
        receipt = self.recent.get(reply_id, caller_of(request))
        if receipt is None:
            raise ApiError(
                f"no receipt {shown(reply_id)} for this caller: the id is the reply's X-Surprisegate-Receipt header "
                f"(or its receipt's reply_id); the server keeps the last {self.recent.capacity} in memory",
                status=404,
                code="receipt_not_found",
            )
        return receipt

    async def ui_page(self, request: Request) -> Response:
        """GET / (with --ui): the chat page; its policy lets it run this server's script and call this server only."""
        return Response(PAGE, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": PAGE_POLICY})

    async def ui_script(self, request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript; charset=utf-8")

    async def health(self, request: Request) -> Response:
        a = self.admission
        return JSONResponse(
            {"status": "ok", "model": self.model, "slots": a.slots, "active": a.active, "queued": a.waiting}
        )

    async def metrics_text(self, request: Request) -> Response:
        self.authorize(request)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    # --- one completion -------------------------------------------------------------------------------
    async def _complete(self, request: Request, parse: Callable[..., GateRequest]) -> Response:
        self.authorize(request)  # before the body: an unknown caller costs no buffering
        raw = await read_body(request, self.settings.limits.max_body_bytes, self.settings.body_timeout_s)
        config = self.runtime.config
        parsed = parse(parse_json(raw), config, self.settings.limits, (self.model,), self.detect_only)
        parsed = continuation_for(self.runtime.backend, parsed, self.settings.limits)
        parsed = replace(parsed, tool_use=tool_use(self.runtime.backend, parsed, self.model))
        check_response_format(self.runtime.backend, parsed, self.model)
        await anyio.to_thread.run_sync(check_context, self.runtime.backend, parsed)  # tokenizing: off the loop
        check_logit_bias(self.runtime.backend, parsed)
        if parsed.stream:
            return self._stream_response(request, parsed)
        gen = await self._admit(request, parsed)
        if gen is None:
            return Response(status_code=DISCONNECTED)
        shape = ReplyShape(parsed, gen.reply_id, self.model)
        return await self._collect(request, gen, shape, {"X-Surprisegate-Receipt": gen.reply_id})

    def _stream_response(self, request: Request, parsed: GateRequest) -> Response:
        """A stream starts at once, before its turn comes: the place in the queue is taken now (or a 429), and
        keep-alive comments go out while it waits, so a client's read timeout never sees a queued stream as
        silent."""
        self.admission.enqueue()
        gen = Generation(self.runtime, parsed, self.settings.receipts, self._ended, self.view)
        shape = ReplyShape(parsed, gen.reply_id, self.model)
        caller = caller_of(request)
        events = self._response_events if parsed.endpoint == "responses" else self._sse

        async def queued_then_streamed() -> AsyncIterator[Any]:
            yield ServerSentEvent(comment="queued", sep="\n")  # the first byte, whatever the wait (clients skip it)
            try:
                await self.admission.admitted()
            except asyncio.CancelledError:  # the client left while queued
                self.metrics.disconnects.inc()
                raise
            self.live.add(gen)
            gen.start()
            async for item in events(gen, shape, caller):
                yield item

        headers = {"X-Surprisegate-Receipt": gen.reply_id}
        return EventSourceResponse(queued_then_streamed(), headers=headers, sep="\n", ping=KEEPALIVE_S)

    async def _admit(self, request: Request, parsed: GateRequest) -> Generation | None:
        """A slot (or 429), then the reply's thread; None when the client left while queued."""
        waiting = asyncio.ensure_future(self.admission.acquire())
        if not await _first_or_disconnect(request, waiting):
            self.metrics.disconnects.inc()
            return None
        gen = Generation(self.runtime, parsed, self.settings.receipts, self._ended, self.view)
        self.live.add(gen)
        gen.start()
        return gen

    def _ended(self, gen: Generation) -> None:
        """The reply's thread has finished (its session is closed): the slot is free again."""
        self.live.discard(gen)
        seconds = time.monotonic() - gen.started
        self.admission.release(seconds)
        self.metrics.reply_seconds.observe(seconds)

    async def _collect(self, request: Request, gen: Generation, shape: ReplyShape, headers: dict) -> Response:
        """The whole reply as one body; a client that leaves cancels it."""
        finished: list[Finished] = []

        async def collect() -> None:
            async for item in gen.events():
                if isinstance(item, Finished):
                    finished.append(item)

        if not await _first_or_disconnect(request, asyncio.ensure_future(collect())):
            gen.cancel()
            self.metrics.disconnects.inc()
            return Response(status_code=DISCONNECTED)
        if not finished:
            raise ApiError("the reply ended without a result; retry", status=500, kind="server_error")
        done, receipt, parsed = finished[0].done, finished[0].receipt, finished[0].parsed
        self.metrics.reply(receipt)
        self.recent.put(gen.reply_id, caller_of(request), receipt)
        text, cut = cut_at_stop(done.text, shape.request.stops)
        tokens = token_infos(receipt, self.token_bytes, cut) if shape.request.logprobs else []
        calls = [c.wire() for c in parsed.calls] if parsed is not None else []
        finish = finish_reason(done.finish_reason, cut is not None, bool(calls))
        content = parsed.content if calls and parsed else text  # with calls: the text before them (may be None)
        if shape.request.endpoint == "responses":
            return JSONResponse(shape.response(content, receipt, finish, calls), headers=headers)
        return JSONResponse(shape.body(content, finish, receipt, tokens, calls), headers=headers)

    async def _sse(self, gen: Generation, shape: ReplyShape, caller: str) -> AsyncIterator[str]:
        """The reply as chunks; rewound text never reaches them (holdback: Token events are final)."""
        left = True  # until the stream ends or fails on our side, an exit here means the client went away
        try:
            async for chunk in self._chunks(gen, shape, caller):
                yield json.dumps(chunk, ensure_ascii=False)
            left = False
            yield "[DONE]"
        except ApiError as err:  # after the 200: the error goes as an event (the openai client raises it)
            left = False
            yield json.dumps(err.body())
        except Exception as err:  # noqa: BLE001 - a fault in the reply's thread: said in the stream, not a dropped connection
            left = False
            yield json.dumps(internal_error(err, f"stream {gen.reply_id}").body())
        finally:
            gen.cancel()  # a no-op once the reply is done; else its thread stops and frees its session
            if left:
                self.metrics.disconnects.inc()

    async def _chunks(self, gen: Generation, shape: ReplyShape, caller: str) -> AsyncIterator[dict]:
        r, tools = shape.request, shape.request.tool_use
        # With tools, content streams up to a call's opening (held like a stop string); the calls follow whole.
        cutter = StopCutter(r.stops + ((tools.format.open,) if tools is not None else ()))
        # Top logprobs go with their tokens where the events carry them (a model with token ids); a chat API's
        # reach only the receipt, so that reply is sent whole at the end with them. A forced call is all call.
        buffered = r.logprobs and r.top_logprobs > 0 and not isinstance(self.runtime.backend, SteerableBackend)
        buffered = buffered or (tools is not None and bool(tools.opening))
        yield shape.chunk("" if r.endpoint == "chat" else shape.echoed or None, role=True)
        async for item in gen.events():
            if isinstance(item, Finished) and item.parsed is not None:
                async for chunk in self._tool_chunks(gen, shape, caller, cutter, item):
                    yield chunk
            elif isinstance(item, ROUND_EVENTS) and r.events:
                yield shape.event_chunk(item)
            elif isinstance(item, Token) and not buffered:
                top = item.top_logprobs[: r.top_logprobs]
                info = token_info(item.token_id, item.surprise, top, self.token_bytes) if r.logprobs else None
                text, held = cutter.feed(item.text, info)
                if text or held:
                    yield shape.chunk(text, [t for _, t in held], offset=held[0][0] if held else 0)
            elif isinstance(item, Finished):
                tail = held_chunk(shape, cutter, item, self.token_bytes, buffered)
                if tail is not None:
                    yield tail
                self.metrics.reply(item.receipt)
                self.recent.put(gen.reply_id, caller, item.receipt)
                stopped = cutter.cut is not None or first_stop(item.done.text, r.stops) is not None
                # The receipt rides on the stream's last chunk: the usage chunk when one was asked for.
                last = None if r.include_usage else item.receipt
                yield shape.chunk(None, finish_reason=finish_reason(item.done.finish_reason, stopped), receipt=last)
                if r.include_usage:
                    yield shape.usage_chunk(item.receipt)

    async def _tool_chunks(
        self, gen: Generation, shape: ReplyShape, caller: str, cutter: StopCutter, item: Finished
    ) -> AsyncIterator[dict]:
        """The end of a reply that was offered tools: the content not yet sent (all of it when no call parsed,
        so nothing is lost), the calls, then the finish chunk."""
        r, parsed = shape.request, item.parsed
        assert parsed is not None
        text, cut = cut_at_stop(item.done.text, r.stops)
        rest = text[cutter.sent :] if not parsed.calls else parsed.content[len(text[: cutter.sent].lstrip()) :]
        if rest:
            yield shape.chunk(rest)
        calls = [c.wire(i) for i, c in enumerate(parsed.calls)]
        if calls:
            yield shape.chunk(None, calls=calls)
        self.metrics.reply(item.receipt)
        self.recent.put(gen.reply_id, caller, item.receipt)
        finish = finish_reason(item.done.finish_reason, cut is not None, bool(calls))
        yield shape.chunk(None, finish_reason=finish, receipt=None if r.include_usage else item.receipt)
        if r.include_usage:
            yield shape.usage_chunk(item.receipt)

    async def _response_events(self, gen: Generation, shape: ReplyShape, caller: str) -> AsyncIterator[dict]:
        """A Responses stream: typed events (`event:` and a `data:` holding the same `type`), numbered, the
        reply's text as output_text deltas once it can no longer change, the receipt on response.completed."""
        numbered = ResponseEvents(shape)
        tools = shape.request.tool_use
        cutter = StopCutter((tools.format.open,) if tools is not None else ())  # a call's text is never content
        left = True
        try:
            yield numbered("response.created", response=shape.response(None, None))
            yield numbered("response.in_progress", response=shape.response(None, None))
            item = shape.response_message("", "in_progress") | {"content": []}
            yield numbered("response.output_item.added", output_index=0, item=item)
            part = shape.response_text("")
            yield numbered("response.content_part.added", **numbered.where, part=part)
            sent = ""
            async for event in gen.events():
                if isinstance(event, Token) and event.text:
                    delta = cutter.feed(event.text, None)[0]
                    if delta:
                        sent += delta
                        yield numbered("response.output_text.delta", **numbered.where, delta=delta, logprobs=[])
                elif isinstance(event, Finished):
                    async for done in self._response_done(numbered, shape, caller, gen, event, sent):
                        yield done
            left = False
        except ApiError as err:
            left = False
            yield numbered("error", **err.body()["error"])
        except Exception as err:  # noqa: BLE001 - a fault in the reply's thread: said in the stream
            left = False
            yield numbered("error", **internal_error(err, f"stream {gen.reply_id}").body()["error"])
        finally:
            gen.cancel()
            if left:
                self.metrics.disconnects.inc()

    # --- auth -------------------------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if not key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                "no API key: send the header Authorization: Bearer KEY (the server's SURPRISEGATE_API_KEY)",
                status=401,
                code="missing_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                "wrong API key: send the server's SURPRISEGATE_API_KEY as Authorization: Bearer KEY",
                status=401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def shutdown(self) -> None:
        for gen in list(self.live):
            gen.cancel()

    async def _response_done(
        self, numbered: ResponseEvents, shape: ReplyShape, caller: str, gen: Generation, event: Finished, sent: str
    ) -> AsyncIterator[dict]:
        """A Responses stream's last events: the text held back (up to a call), the message done, each tool call
        as a function_call item with its arguments, then response.completed (the receipt rides on it)."""
        self.metrics.reply(event.receipt)
        self.recent.put(gen.reply_id, caller, event.receipt)
        calls = [c.wire() for c in event.parsed.calls] if event.parsed is not None else []
        text = (event.parsed.content or "") if calls and event.parsed is not None else event.done.text
        if text.startswith(sent) and text != sent:
            yield numbered("response.output_text.delta", **numbered.where, delta=text[len(sent) :], logprobs=[])
        finish = finish_reason(event.done.finish_reason, False, bool(calls))
        yield numbered("response.output_text.done", **numbered.where, text=text, logprobs=[])
        yield numbered("response.content_part.done", **numbered.where, part=shape.response_text(text))
        whole = shape.response(text, event.receipt, finish, calls, message=True)
        yield numbered("response.output_item.done", output_index=0, item=whole["output"][0])
        for index, call in enumerate(calls, 1):
            started = shape.function_call_item(call, arguments="")
            yield numbered("response.output_item.added", output_index=index, item=started)
            where = {"item_id": started["id"], "output_index": index}
            arguments = call["function"]["arguments"]
            yield numbered("response.function_call_arguments.delta", **where, delta=arguments)
            yield numbered("response.function_call_arguments.done", **where, arguments=arguments)
            yield numbered("response.output_item.done", output_index=index, item=whole["output"][index])
        kind = "response.completed" if whole["status"] == "completed" else "response.incomplete"
        yield numbered(kind, response=whole)


class ResponseEvents:
    """Numbers a Responses stream's events (sequence_number from 0) and shapes each as an SSE event."""

    def __init__(self, shape: ReplyShape) -> None:
        self.next = 0
        self.where = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}

    def __call__(self, kind: str, **fields: Any) -> dict[str, str]:
        data = {"type": kind, "sequence_number": self.next, **fields}
        self.next += 1
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}


def held_chunk(
    shape: ReplyShape, cutter: StopCutter, item: Finished, token_bytes: Any, buffered: bool
) -> dict[str, Any] | None:
    """The held text at the end of a stream: the tail no stop string claimed, or, with top logprobs, the
    whole reply with them (they come from the receipt)."""
    if not buffered:
        tail, held = cutter.finish()
        return shape.chunk(tail, [t for _, t in held], offset=held[0][0] if held else 0) if tail or held else None
    text, cut = cut_at_stop(item.done.text, shape.request.stops)
    return shape.chunk(text, token_infos(item.receipt, token_bytes, cut))


# --------------------------------------------------------------------------------------------
# request plumbing
# --------------------------------------------------------------------------------------------
async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body, at most `max_bytes` (413) and within `timeout_s` (408: a slow client cannot hold us)."""
    too_big = ApiError(
        f"the request body is over this server's limit of {max_bytes} bytes; send a shorter chat",
        status=413,
        code="request_too_large",
        headers=CLOSE,
    )
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        raise too_big
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {timeout_s} s; send it at once",
            status=408,
            code="request_timeout",
            headers=CLOSE,
        ) from None
    except ClientDisconnect:
        raise ApiError(
            "the client disconnected while sending the body", status=400, code="client_disconnected"
        ) from None
    return b"".join(chunks)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_or_disconnect(request: Request, task: asyncio.Future) -> bool:
    """Wait for `task` unless the client disconnects first (then cancel it and return False). Its
    exception, if any, is raised."""
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()
    return True


# --------------------------------------------------------------------------------------------
# errors and metrics around every route
# --------------------------------------------------------------------------------------------
async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method[:16]} {shown(request.url.path)}: {exc.detail}"  # a path can be kilobytes long
    error = ApiError(message, status=exc.status_code, code=str(exc.status_code), kind=kind)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


def internal_error(exc: BaseException, where: str) -> ApiError:
    """A fault of ours: the client gets a generic message with an id, the log gets the traceback under that
    id (the exception's text may hold paths, config or another request's data)."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s (%s)", error_id, where, exc_info=(type(exc), exc, exc.__traceback__))
    return ApiError(
        f"internal error {error_id}: the server could not finish this request and logged why; retry, or give "
        "the operator this id",
        status=500,
        kind="server_error",
        code="internal_error",
    )


def guarded(route: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """The route, its faults turned into the generic 500 (logged once, with its id, here; Starlette's last-resort
    handler would log the traceback again without it)."""

    async def run(request: Request) -> Response:
        try:
            return await route(request)
        except (ApiError, HTTPException):
            raise
        except Exception as exc:  # noqa: BLE001 - a fault of ours, never a client's to read
            raise internal_error(exc, f"{request.method} {request.url.path[:200]}") from None

    return run


async def _server_error(request: Request, exc: Exception) -> Response:
    error = internal_error(exc, f"{request.method} {request.url.path[:200]}")
    return JSONResponse(error.body(), status_code=500)


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health", "/metrics")


def caller_of(request: Request) -> str:
    """Who made a request, as far as this server can tell: a digest of its bearer key ("" without one)."""
    _, _, token = request.headers.get("authorization", "").partition(" ")
    return hashlib.sha256(token.strip().encode()).hexdigest()[:32] if token.strip() else ""


class RecentReceipts:
    """The last `capacity` client receipts by reply id, each readable only by the caller that made it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, reply_id: str, caller: str, receipt: dict[str, Any]) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._kept[reply_id] = (caller, receipt)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def get(self, reply_id: str, caller: str) -> dict[str, Any] | None:
        with self._lock:
            kept = self._kept.get(reply_id)
        if kept is None or not hmac.compare_digest(kept[0], caller):
            return None
        return kept[1]


class CountRequests:
    """Counts every answered request by route and status (a pure ASGI middleware: streams pass through)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            endpoint = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.requests.labels(endpoint, str(status[0])).inc()


def cors(origins: tuple[str, ...]) -> list[Middleware]:
    """CORS for the origins the operator named (none: no CORS headers, so browsers keep other pages out).
    The receipt id header is exposed so a page can read its reply's receipt."""
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],  # the SDKs send their own (x-stainless-*); credentials are never allowed
            expose_headers=["X-Surprisegate-Receipt"],
            max_age=600,
        )
    ]


def create_app(runtime: Any, settings: ServeSettings | None = None) -> Starlette:
    """The OpenAI-compatible app over a loaded runtime (runtime.assemble: backend, arms, config)."""
    server = Server(runtime, settings or ServeSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.shutdown()  # replies still running stop at their next event and free their sessions

    ui = [Route("/", guarded(server.ui_page), methods=["GET"]), Route("/ui.js", guarded(server.ui_script))]
    app = Starlette(
        routes=[
            *(ui if server.settings.ui else []),
            Route("/v1/chat/completions", guarded(server.chat), methods=["POST"]),
            Route("/v1/completions", guarded(server.completions), methods=["POST"]),
            Route("/v1/responses", guarded(server.responses), methods=["POST"]),
            Route("/v1/models", guarded(server.models), methods=["GET"]),
            Route("/v1/models/{model_id:path}", guarded(server.model_card), methods=["GET"]),
            Route("/v1/receipts/{reply_id}", guarded(server.receipt), methods=["GET"]),
            Route("/receipts/{reply_id}", guarded(server.receipt_page), methods=["GET"]),
            Route("/health", guarded(server.health), methods=["GET"]),
            Route("/metrics", guarded(server.metrics_text), methods=["GET"]),
        ],
        middleware=[Middleware(CountRequests, metrics=server.metrics), *cors(server.settings.cors_origins)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.server = server
    return app

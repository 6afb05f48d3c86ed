"""The OpenAI response side: reply bodies, stream chunks, logprobs and stop strings.

Logprobs come from the loop's own measurements: a token's surprise is -log2 p, so its logprob is
-surprise * ln 2 (natural log, as OpenAI sends); top logprobs are the receipt's `token_top_logprobs`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..gate.receipts import to_jsonable
from ..text import first_stop
from .wire import GateRequest

LN2 = math.log(2.0)
TokenBytes = Callable[[int], bytes]


def logprob(surprise: float) -> float:
    """Natural-log probability of a token from its surprise in bits."""
    return -surprise * LN2 if math.isfinite(surprise) else -9999.0


# --------------------------------------------------------------------------------------------
# stop strings
# --------------------------------------------------------------------------------------------
def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, int | None]:
    """The reply as its client gets it (up to the first stop string) and where it was cut (None: not)."""
    cut = first_stop(text, stops)
    return (text, None) if cut is None else (text[:cut], cut)


@dataclass
class StopCutter:
    """Streams text up to the first stop string: text that may be the start of a stop string is held
    until the next piece says whether it is one. Tokens given with their pieces (for logprobs) are held
    and released with their text; a token that starts at or after the cut is never released."""

    stops: tuple[str, ...]
    text: str = ""
    sent: int = 0  # characters of `text` released
    cut: int | None = None  # where the reply ends, once a stop string was seen
    held: list[tuple[int, Any]] = field(default_factory=list)  # (start in `text`, token) not yet released

    def feed(self, piece: str, token: Any = None) -> tuple[str, list[Any]]:
        """Add a piece (and its token); return the text and the (start, token) pairs now safe to send."""
        if self.cut is not None:
            return "", []
        if token is not None:
            self.held.append((len(self.text), token))
        self.text += piece
        longest = max((len(s) for s in self.stops), default=0)
        hit = first_stop(self.text, self.stops, max(0, self.sent - longest))
        if hit is not None:
            self.cut = hit
            return self._release(hit)
        return self._release(len(self.text) - self._partial())

    def finish(self) -> tuple[str, list[Any]]:
        """The reply ended: whatever was held is not a stop string after all."""
        if self.cut is not None:
            return "", []
        text, tokens = self._release(len(self.text))
        tokens += self.held  # tokens without text (a split UTF-8 character at the very end)
        self.held = []
        return text, tokens

    def _partial(self) -> int:
        """Length of the longest end of `text` that begins a stop string."""
        for n in range(min(len(self.text), max((len(s) for s in self.stops), default=0)), 0, -1):
            if any(s.startswith(self.text[-n:]) for s in self.stops):
                return n
        return 0

    def _release(self, upto: int) -> tuple[str, list[Any]]:
        out = self.text[self.sent : max(self.sent, upto)]
        self.sent = max(self.sent, upto)
        ready = [(start, t) for start, t in self.held if start < self.sent]
        self.held = [(start, t) for start, t in self.held if start >= self.sent]
        if self.cut is not None:
            self.held = []  # they start at or after the stop string
        return out, ready


# --------------------------------------------------------------------------------------------
# logprobs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenInfo:
    """One visible reply token as the logprobs fields describe it."""

    token_id: int | None
    text: str
    raw: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


def token_infos(receipt: dict[str, Any], token_bytes: TokenBytes | None, upto_chars: int | None) -> list[TokenInfo]:
    """The reply's tokens from the receipt, those starting before `upto_chars` (a stop cut) only."""
    extra = receipt.get("extra", {})
    ids, surprises = extra.get("token_ids", []), extra.get("token_surprises", [])
    tops = extra.get("token_top_logprobs", [])
    out, at = [], 0
    for i, (token_id, surprise) in enumerate(zip(ids, surprises, strict=False)):
        if upto_chars is not None and at >= upto_chars:
            break
        out.append(token_info(token_id, surprise, tops[i] if i < len(tops) else (), token_bytes))
        at += len(out[-1].text)
    return out


def token_info(token_id: int | None, surprise: float, top: Sequence, token_bytes: TokenBytes | None) -> TokenInfo:
    raw = token_bytes(token_id) if token_bytes is not None and token_id is not None else b""
    alternatives = tuple(
        (_piece(token_bytes, int(t)), token_bytes(int(t)) if token_bytes else b"", float(lp)) for t, lp in top
    )
    return TokenInfo(token_id, raw.decode("utf-8", "replace"), raw, logprob(surprise), alternatives)


def _piece(token_bytes: TokenBytes | None, token_id: int) -> str:
    return token_bytes(token_id).decode("utf-8", "replace") if token_bytes else str(token_id)


def chat_logprobs(tokens: Sequence[TokenInfo], top: int) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat completion."""
    return {
        "content": [
            {
                "token": t.text,
                "logprob": t.logprob,
                "bytes": list(t.raw),
                "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, b, lp in t.top[:top]],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[TokenInfo], top: int, offset: int = 0) -> dict[str, Any]:
    """`choices[i].logprobs` of a (legacy) completion: parallel lists."""
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{s: lp for s, _, lp in t.top[:top]} for t in tokens] if top else None,
        "text_offset": offsets,
    }


# --------------------------------------------------------------------------------------------
# bodies
# --------------------------------------------------------------------------------------------
def response_tool_choice(choice: str) -> Any:
    """A checked tool_choice as the Responses API writes it ("auto", "none", "required" or a named function)."""
    return choice if choice in ("auto", "none", "required") else {"type": "function", "name": choice}


@dataclass
class ReplyShape:
    """What every body and chunk of one reply shares."""

    request: GateRequest
    reply_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object_id(self) -> str:
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_"}[self.request.endpoint]
        return prefix + self.reply_id

    @property
    def echoed(self) -> str:
        """What comes before a completion's text: its prompt, where `echo` asked for it."""
        r = self.request
        if not r.echo:
            return ""
        return r.continuation.text if r.continuation is not None else r.messages[-1]["content"]  # asked as a turn

    @property
    def message_id(self) -> str:
        return "msg_" + self.reply_id

    def usage(self, receipt: dict[str, Any]) -> dict[str, int]:
        prompt = int(receipt.get("extra", {}).get("prompt_tokens", 0))
        completion = int(receipt.get("n_tokens", 0))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extension(self, receipt: dict[str, Any]) -> dict[str, Any]:
        """The `surprisegate` field: this reply's receipt (only ever sent to its own caller)."""
        return {"receipt": receipt, "notes": list(self.request.notes)}

    def body(
        self,
        text: str,
        finish_reason: str,
        receipt: dict[str, Any],
        tokens: Sequence[TokenInfo],
        calls: Sequence[dict[str, Any]] = (),
    ) -> dict:
        """The whole (non-streaming) response; `calls` are the reply's tool calls (its content then may be null)."""
        r = self.request
        if r.endpoint == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": (text or None) if calls else text,
                "refusal": None,
            }
            if calls:
                message["tool_calls"] = list(calls)
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(tokens, r.top_logprobs) if r.logprobs else None,
                "finish_reason": finish_reason,
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": self.echoed + text,
                "logprobs": completion_logprobs(tokens, r.top_logprobs) if r.logprobs else None,
                "finish_reason": finish_reason,
            }
            kind = "text_completion"
        return {
            "id": self.object_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(receipt),
            "system_fingerprint": None,
            "surprisegate": self.extension(receipt),
        }

    def chunk(
        self,
        text: str | None,
        tokens: Sequence[TokenInfo] = (),
        finish_reason: str | None = None,
        receipt: dict[str, Any] | None = None,
        role: bool = False,
        offset: int = 0,
        calls: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """One stream chunk: a piece of text (with its tokens' logprobs), the reply's tool calls (each with its
        index, whole), or the last one (finish reason, receipt)."""
        r = self.request
        if r.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = list(calls)
            lp = chat_logprobs(tokens, r.top_logprobs) if r.logprobs and tokens else None
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
        else:
            lp = completion_logprobs(tokens, r.top_logprobs, offset) if r.logprobs and tokens else None
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish_reason}
        out = self._chunk_of([choice])
        if receipt is not None:
            out["surprisegate"] = self.extension(receipt)
        return out

    def _chunk_of(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A stream chunk's envelope around its choices (none for a usage or an event chunk)."""
        kind = "chat.completion.chunk" if self.request.endpoint == "chat" else "text_completion"
        return {"id": self.object_id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def event_chunk(self, event: Any) -> dict[str, Any]:
        """A round's event as it happens (`"surprisegate": {"events": true}`): a chunk with no choices, as a usage
        chunk is, so a client that did not ask for events would skip it."""
        record = {"type": type(event).__name__.lower(), **to_jsonable(dataclasses.asdict(event))}
        return self._chunk_of([]) | {"surprisegate": {"event": record}}

    def usage_chunk(self, receipt: dict[str, Any]) -> dict[str, Any]:
        """The extra last chunk `stream_options.include_usage` asks for: no choices, the usage, and the receipt
        (a stream's receipt is always on its last chunk)."""
        return self._chunk_of([]) | {"usage": self.usage(receipt), "surprisegate": self.extension(receipt)}

    # --- POST /v1/responses ------------------------------------------------------------------------
    def response(
        self,
        text: str | None,
        receipt: dict[str, Any] | None,
        finish: str | None = None,
        calls: Sequence[dict[str, Any]] = (),
        message: bool = False,
    ) -> dict[str, Any]:
        """The Response object: in progress (no text yet), or completed with one output_text message
        (`incomplete` when the token limit cut it) and the reply's tool calls as function_call items after it
        (`calls` in the chat form; the message only where there is text, or no call, or `message`: a stream
        announced it first)."""
        done = receipt is not None
        status = "in_progress" if not done else ("incomplete" if finish == "length" else "completed")
        r = self.request
        output: list[dict[str, Any]] = []
        if done:
            output = [self.response_message(text or "", status)] if text or message or not calls else []
            output += [self.function_call_item(call) for call in calls]
        out: dict[str, Any] = {
            "id": self.object_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": None,
            "max_output_tokens": self.request.config.max_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls and bool(r.tools),
            "temperature": self.request.config.temperature,
            "tool_choice": response_tool_choice(r.tool_choice) if r.tools else "none",
            "tools": [{"type": "function", **t["function"]} for t in r.tools],
            "top_p": self.request.config.top_p,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": self.response_usage(receipt) if receipt is not None else None,
        }
        if receipt is not None:
            out["surprisegate"] = self.extension(receipt)
        return out

    @staticmethod
    def function_call_item(call: Mapping[str, Any], arguments: str | None = None) -> dict[str, Any]:
        """A chat-form tool call as a Responses function_call output item (`arguments`: as streamed so far)."""
        function = call["function"]
        return {
            "type": "function_call",
            "id": "fc_" + str(call["id"]).removeprefix("call_"),
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"] if arguments is None else arguments,
            "status": "completed" if arguments is None else "in_progress",
        }

    def response_message(self, text: str, status: str = "completed") -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [self.response_text(text)],
        }

    @staticmethod
    def response_text(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response_usage(self, receipt: dict[str, Any]) -> dict[str, Any]:
        usage = self.usage(receipt)
        return {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }


def finish_reason(done_reason: str, stopped: bool, called: bool = False) -> str:
    """OpenAI's finish reason: a reply that ends in tool calls is "tool_calls", a stop string or the end of
    turn "stop", the token limit "length"."""
    if called:
        return "tool_calls"
    if stopped or done_reason == "stop":
        return "stop"
    return "length" if done_reason == "length" else done_reason

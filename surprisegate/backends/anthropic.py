"""Anthropic's Messages API through the `anthropic` client (`--backend anthropic --model NAME`).

The API has no logprobs at all (neither a request field nor a response field): the reply streams through
unchanged, every step unscored (nan), and the stream's `no_logprobs` is "anthropic offers no logprobs", so
both modes are a no-op with that reason in the receipt. Each `content_block_delta` text delta is one step
(../shared/wire/anthropic_messages_stream.sse); `message_delta`'s stop_reason ends the reply. System turns
go in `system` (one text); no sampling settings are sent (the current Messages API takes no temperature:
the model samples as it does). An `event: error` mid-stream (e.g. overloaded_error, HTTP status still 200) is a
"stream_error" fault after the steps before it. Key: $ANTHROPIC_API_KEY; base URL: `base_url` /
$ANTHROPIC_BASE_URL. The client's own retries are off (ours keep to the round deadline).
"""

from __future__ import annotations

from typing import Any

from . import Sampling
from .cloud import (
    RETRY_DEADLINE_S,
    RETRYABLE_TYPES,
    CloudBackend,
    CloudFault,
    Opened,
    Parsed,
    Plan,
    align,
    base_url_of,
    env_key,
    error_text,
    error_type,
    fields,
    import_client,
    items,
    need_key,
    read_timeout,
    require_model,
    split_system,
    stream_fault,
    text_of,
    timeouts_of,
)

ANTHROPIC_URL = "https://api.anthropic.com"
ANTHROPIC_NO_LOGPROBS = "anthropic offers no logprobs"
STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


class AnthropicParser:
    """Messages stream events: text deltas (unscored), the stop reason, errors."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model

    def feed(self, event: Any) -> Parsed:
        event = fields(event, "event")
        kind = text_of(event.get("type"), "type")
        if kind == "content_block_start":
            block = fields(event.get("content_block"), "content_block")
            text = text_of(block.get("text"), "content_block.text") if block.get("type") == "text" else ""
            return Parsed(align(text, []))
        if kind == "content_block_delta":
            delta = fields(event.get("delta"), "delta")
            text = text_of(delta.get("text"), "delta.text") if delta.get("type") == "text_delta" else ""
            return Parsed(align(text, []))
        if kind == "message_delta":
            stop = text_of(fields(event.get("delta"), "delta").get("stop_reason"), "delta.stop_reason")
            return Parsed(finish=STOP.get(stop, stop) if stop else None)
        if kind == "message_stop":
            return Parsed(finish="stop")  # a stream whose message_delta named no stop reason
        if kind == "error":  # the client raises these first; kept for a server it lets through
            retryable = error_type(event) in RETRYABLE_TYPES
            raise stream_fault(self.provider, self.model, error_text(event), retryable=retryable)
        return Parsed()


def message_events(message: dict) -> list[dict]:
    """A whole (unstreamed) message as the events that stream it."""
    events: list[dict] = []
    for block in items(message.get("content"), "content"):
        block = fields(block, "content block")
        if block.get("type") == "text":
            events.append({"type": "content_block_delta", "delta": {"type": "text_delta", "text": block.get("text")}})
    return [*events, {"type": "message_delta", "delta": {"stop_reason": message.get("stop_reason") or "end_turn"}}]


def wire(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    return to_dict(warnings=False) if callable(to_dict) else obj


class AnthropicBackend(CloudBackend):
    """Anthropic through the `anthropic` client (`client`: an `anthropic.Anthropic`). No logprobs: top_k 0."""

    name = "anthropic"
    key_env = "ANTHROPIC_API_KEY"
    no_logprobs_reason = ANTHROPIC_NO_LOGPROBS

    def __init__(self, client: Any, model: str | None, **options: Any) -> None:
        super().__init__(client, model, top_k=0, **options)

    def parser(self, plan: Plan) -> AnthropicParser:
        return AnthropicParser(self.name, self.model_id)

    def request(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> dict:
        system, turns = split_system(msgs)
        request: dict[str, Any] = {
            "model": self.model_id,
            "max_tokens": int(max_tokens),
            "messages": turns,
            "stream": plan.stream,
        }
        if system is not None:
            request["system"] = system
        return request  # no temperature: the current client and API take none (the reply is scored by nothing)

    def _open(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> Opened:
        reply = self._client.messages.create(**self.request(msgs, sampling, max_tokens, plan))
        if not plan.stream:
            return Opened(iter(message_events(wire(reply))))
        return Opened((wire(event) for event in reply), reply.close)

    def _client_fault(self, err: BaseException, *, streaming: bool) -> CloudFault | None:
        import anthropic

        if isinstance(err, anthropic.APIStatusError):
            if err.status_code < 400:  # an `event: error` in the stream: the client gives it the stream's status
                retryable = error_type(err.body) in RETRYABLE_TYPES
                return stream_fault(self.name, self.model_id, error_text(err.body) or err.message, retryable=retryable)
            return self._http(err.status_code, err.body or err.message, err.response.headers)
        return None


def from_anthropic(
    model: str | None = None,
    *,
    base_url: str | None = None,
    retry_deadline_s: float = RETRY_DEADLINE_S,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
    **_local: Any,
) -> AnthropicBackend:
    """`--backend anthropic --model NAME [--base-url URL]` (key $ANTHROPIC_API_KEY). Local-model options and
    `top_k` (there are no logprobs) are ignored."""
    model = require_model("anthropic", model, "claude-haiku-4-5")
    anthropic = import_client("anthropic", "anthropic", "anthropic")
    url, default = base_url_of(base_url, ("ANTHROPIC_BASE_URL",), ANTHROPIC_URL)
    key = need_key("anthropic", env_key("ANTHROPIC_API_KEY"), "ANTHROPIC_API_KEY", default)
    timeouts = timeouts_of(connect_timeout, first_byte_timeout, idle_timeout)
    timeout = anthropic.Timeout(read_timeout(timeouts), connect=timeouts.connect)
    client = anthropic.Anthropic(api_key=key, base_url=url, timeout=timeout, max_retries=0)
    return AnthropicBackend(client, model, base_url=url, retry_deadline_s=retry_deadline_s, timeouts=timeouts)

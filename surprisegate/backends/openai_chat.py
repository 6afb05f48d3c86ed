"""OpenAI, xAI and any OpenAI-compatible chat server through the `openai` client (`--backend openai | xai`).

- Chat Completions (the default): `stream: true, logprobs: true, top_logprobs: 20` (OpenAI's maximum; xAI's
  is 8). Each chunk's `choices[0].logprobs.content[]` gives the tokens {token, logprob, bytes, top_logprobs}
  of its `delta.content` (../shared/wire/openai_chat_stream_logprobs.sse); a refusal's text and tokens count
  as the reply's. `base_url` (or $OPENAI_BASE_URL) points the client at another server: llama.cpp server's
  /v1, vLLM, Ollama's /v1 (the key may then be absent).
- Responses API (`api="responses"`, and "auto" for the models only it serves): `include:
  ["message.output_text.logprobs"], top_logprobs: 20`; each `response.output_text.delta` event carries its
  tokens' {token, logprob, top_logprobs} (openai-python's `ResponseTextDeltaEvent`; tests/wire_inferred).
- The token limit: `max_completion_tokens` on OpenAI's and xAI's own endpoints, `max_tokens` elsewhere (every
  compatible server knows it); a model that refuses one is asked again with the other.
- Errors: OpenAI nests them ({error: {message, type, param, code}}), xAI does not ({code, error: "..."});
  an `{"error": ...}` event mid-stream is raised by the client and becomes a "stream_error" fault.
Keys: $OPENAI_API_KEY / $XAI_API_KEY; the client's own retries are off (ours keep to the round deadline).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
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
    logprob_entry,
    need_key,
    read_timeout,
    require_model,
    stream_fault,
    text_of,
    timeouts_of,
    top_k_of,
)

OPENAI_URL = "https://api.openai.com/v1"
XAI_URL = "https://api.x.ai/v1"
OPENAI_TOP_K = 20  # Chat Completions and Responses: top_logprobs 0..20
XAI_TOP_K = 8  # xAI: top_logprobs 0..8
APIS = ("auto", "chat", "responses")
# Models only the Responses API serves: "auto" sends them there.
RESPONSES_ONLY = (
    "o1-pro",
    "o3-pro",
    "o3-deep-research",
    "o4-mini-deep-research",
    "gpt-5-pro",
    "gpt-5-codex",
    "codex-mini",
    "computer-use-preview",
)
# The Responses API takes no max_output_tokens below 16.
RESPONSES_MIN_TOKENS = 16
# The endpoints that take max_completion_tokens (other compatible servers may know only max_tokens).
COMPLETION_TOKENS_HOSTS = ("api.openai.com", "api.x.ai")
FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


# --------------------------------------------------------------------------------------------------
# parsers: pure, over the events' JSON
# --------------------------------------------------------------------------------------------------
class ChatParser:
    """Chat Completions chunks (streamed, or one whole response turned into a chunk): choice 0's text and
    its tokens' logprobs; the chunk with a `finish_reason` ends the reply."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model

    def feed(self, event: Any) -> Parsed:
        event = fields(event, "event")
        if event.get("error"):  # the client raises these first; a server may still send one it lets through
            raise stream_fault(self.provider, self.model, error_text(event), retryable=True)
        parsed = Parsed()
        for i, choice in enumerate(items(event.get("choices"), "choices")):
            choice = fields(choice, f"choices[{i}]")
            if choice.get("index", 0) != 0:
                continue  # one reply: choice 0 (n = 1)
            delta = fields(choice.get("delta"), f"choices[{i}].delta")
            text = text_of(delta.get("content"), "delta.content") + text_of(delta.get("refusal"), "delta.refusal")
            logprobs = fields(choice.get("logprobs"), f"choices[{i}].logprobs")
            entries = items(logprobs.get("content"), "logprobs.content") + items(
                logprobs.get("refusal"), "logprobs.refusal"
            )
            parsed.tokens += align(text, [logprob_entry(e, f"logprobs.content[{j}]") for j, e in enumerate(entries)])
            finish = choice.get("finish_reason")
            if finish is not None:
                parsed.finish = text_of(finish, "finish_reason") or "stop"
        return parsed


class ResponsesParser:
    """Responses API stream events: text deltas with their logprobs, refusal deltas, and the event that ends
    the response (completed, incomplete, failed, error)."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model

    def feed(self, event: Any) -> Parsed:
        event = fields(event, "event")
        kind = text_of(event.get("type"), "type")
        if kind == "response.output_text.delta":
            entries = items(event.get("logprobs"), "logprobs")
            text = text_of(event.get("delta"), "delta")
            return Parsed(align(text, [logprob_entry(e, f"logprobs[{j}]") for j, e in enumerate(entries)]))
        if kind == "response.refusal.delta":
            return Parsed(align(text_of(event.get("delta"), "delta"), []))
        if kind == "response.completed":
            return Parsed(finish="stop")
        if kind == "response.incomplete":
            details = fields(fields(event.get("response"), "response").get("incomplete_details"), "incomplete_details")
            reason = text_of(details.get("reason"), "incomplete_details.reason")
            return Parsed(finish=FINISH.get(reason, reason or "incomplete"))
        if kind == "response.failed":
            error = fields(fields(event.get("response"), "response").get("error"), "response.error")
            raise stream_fault(self.provider, self.model, error_text(error), retryable=True)
        if kind == "error":
            retryable = str(event.get("code") or "") in RETRYABLE_TYPES
            raise stream_fault(self.provider, self.model, error_text(event), retryable=retryable)
        return Parsed()


def chat_chunk(response: dict) -> dict:
    """A whole (unstreamed) chat completion as the one chunk that streams it."""
    choices = []
    for choice in items(response.get("choices"), "choices"):
        choice = fields(choice, "choice")
        message = fields(choice.get("message"), "message")
        delta = {"content": message.get("content"), "refusal": message.get("refusal")}
        choices.append({**choice, "delta": delta, "finish_reason": choice.get("finish_reason") or "stop"})
    return {"choices": choices}


def responses_events(response: dict) -> list[dict]:
    """A whole (unstreamed) Responses API response as the events that stream it."""
    events: list[dict] = []
    for item in items(response.get("output"), "output"):
        for part in items(fields(item, "output item").get("content"), "content"):
            part = fields(part, "content part")
            if part.get("type") == "output_text":
                events.append(
                    {"type": "response.output_text.delta", "delta": part.get("text"), "logprobs": part.get("logprobs")}
                )
            elif part.get("type") == "refusal":
                events.append({"type": "response.refusal.delta", "delta": part.get("refusal")})
    ended = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    return [*events, {"type": ended, "response": response}]


def wire(obj: Any) -> Any:
    """An event the client parsed, as the JSON the server sent (the parsers read that)."""
    to_dict = getattr(obj, "to_dict", None)
    return to_dict(warnings=False) if callable(to_dict) else obj


# --------------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------------
class OpenAIBackend(CloudBackend):
    """An OpenAI-compatible chat API through the `openai` client (`client`: an `openai.OpenAI`)."""

    def __init__(
        self,
        client: Any,
        model: str | None,
        *,
        name: str = "openai",
        api: str = "auto",
        top_k: int = OPENAI_TOP_K,
        base_url: str = OPENAI_URL,
        key_env: str = "OPENAI_API_KEY",
        **options: Any,
    ) -> None:
        self.name, self.key_env = name, key_env
        super().__init__(client, model, top_k=top_k, base_url=base_url, **options)
        if api not in APIS:
            why = "auto: chat, or responses for the models only it serves"
            raise ConfigError(f"api={api!r} must be one of {', '.join(APIS)} ({why})")
        if api == "auto":
            api = "responses" if self.model_id.startswith(RESPONSES_ONLY) else "chat"
        self.api = api
        host = urlsplit(base_url).hostname or ""
        self.max_field = "max_completion_tokens" if host in COMPLETION_TOKENS_HOSTS else "max_tokens"

    def _info(self) -> dict[str, Any]:
        return {"api": self.api}

    def parser(self, plan: Plan) -> ChatParser | ResponsesParser:
        return (ResponsesParser if self.api == "responses" else ChatParser)(self.name, self.model_id)

    def _open(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> Opened:
        if self.api == "responses":
            body = self.responses_body(msgs, sampling, max_tokens, plan)
            reply = self._client.responses.create(**body)
            if not plan.stream:
                return Opened(iter(responses_events(wire(reply))))
        else:
            body = self.chat_body(msgs, sampling, max_tokens, plan)
            reply = self._client.chat.completions.create(**body)
            if not plan.stream:
                return Opened(iter([chat_chunk(wire(reply))]))
        return Opened((wire(event) for event in reply), reply.close)

    def chat_body(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> dict:
        body: dict[str, Any] = {"model": self.model_id, "messages": msgs, "stream": plan.stream}
        if "temperature" not in plan.dropped:
            body["temperature"] = max(0.0, float(sampling.temperature))
        if sampling.temperature > 0 and "seed" not in plan.dropped:
            body["seed"] = int(sampling.seed)
        limit = self.max_field
        if limit in plan.dropped:
            limit = "max_tokens" if limit == "max_completion_tokens" else "max_completion_tokens"
        body[limit] = int(max_tokens)
        if plan.logprobs:
            body["logprobs"], body["top_logprobs"] = True, plan.top_k
        return body

    def responses_body(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> dict:
        body: dict[str, Any] = {
            "model": self.model_id,
            "input": [{"role": m["role"], "content": m["content"]} for m in msgs],
            "stream": plan.stream,
            "store": False,  # nothing kept on the provider's side
            "max_output_tokens": max(RESPONSES_MIN_TOKENS, int(max_tokens)),
        }
        if "temperature" not in plan.dropped:
            body["temperature"] = max(0.0, float(sampling.temperature))
        if plan.logprobs:
            body["include"], body["top_logprobs"] = ["message.output_text.logprobs"], plan.top_k
        return body

    def _client_fault(self, err: BaseException, *, streaming: bool) -> CloudFault | None:
        import openai

        if isinstance(err, openai.APIStatusError):
            body = err.body
            param = body.get("param") if isinstance(body, dict) else None
            return self._http(err.status_code, body or err.message, err.response.headers, param)
        if isinstance(err, openai.APIConnectionError):
            return None  # a network failure: transport_fault says which
        if isinstance(err, openai.APIError):  # an error event in the stream (HTTP status 200)
            retryable = error_type({"error": err.body}) in RETRYABLE_TYPES
            return stream_fault(self.name, self.model_id, error_text(err.body) or err.message, retryable=retryable)
        return None


def _factory(
    name: str,
    model: str | None,
    *,
    default_url: str,
    url_envs: tuple[str, ...],
    key_env: str,
    limit: int,
    base_url: str | None,
    api: str,
    top_k: int | None,
    retry_deadline_s: float,
    connect_timeout: float | None,
    first_byte_timeout: float | None,
    idle_timeout: float | None,
) -> OpenAIBackend:
    model = require_model(name, model, "gpt-4o-mini" if name == "openai" else "grok-3")
    openai = import_client("openai", "openai", name)
    url, default = base_url_of(base_url, url_envs, default_url)
    key = need_key(name, env_key(key_env), key_env, default)
    timeouts = timeouts_of(connect_timeout, first_byte_timeout, idle_timeout)
    timeout = openai.Timeout(read_timeout(timeouts), connect=timeouts.connect)
    client = openai.OpenAI(api_key=key, base_url=url, timeout=timeout, max_retries=0)
    return OpenAIBackend(
        client,
        model,
        name=name,
        api=api,
        top_k=top_k_of(name, top_k, limit),
        base_url=url,
        key_env=key_env,
        retry_deadline_s=retry_deadline_s,
        timeouts=timeouts,
    )


def from_openai(
    model: str | None = None,
    *,
    base_url: str | None = None,
    api: str = "auto",
    top_k: int | None = None,
    retry_deadline_s: float = RETRY_DEADLINE_S,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
    **_local: Any,
) -> OpenAIBackend:
    """`--backend openai --model NAME [--base-url URL]`: OpenAI (key $OPENAI_API_KEY), or any OpenAI-compatible
    chat server at `base_url` / $OPENAI_BASE_URL. `api`: "chat", "responses" or "auto". Local-model options
    (n_ctx, threads, seed, sessions) do not apply and are ignored."""
    return _factory(
        "openai",
        model,
        default_url=OPENAI_URL,
        url_envs=("OPENAI_BASE_URL",),
        key_env="OPENAI_API_KEY",
        limit=OPENAI_TOP_K,
        base_url=base_url,
        api=api,
        top_k=top_k,
        retry_deadline_s=retry_deadline_s,
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
    )


def from_xai(
    model: str | None = None,
    *,
    base_url: str | None = None,
    api: str = "chat",
    top_k: int | None = None,
    retry_deadline_s: float = RETRY_DEADLINE_S,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
    **_local: Any,
) -> OpenAIBackend:
    """`--backend xai --model NAME`: xAI's OpenAI-compatible API (https://api.x.ai/v1, key $XAI_API_KEY, top
    logprobs at most 8). Options as `from_openai`."""
    return _factory(
        "xai",
        model,
        default_url=XAI_URL,
        url_envs=("XAI_BASE_URL",),
        key_env="XAI_API_KEY",
        limit=XAI_TOP_K,
        base_url=base_url,
        api=api,
        top_k=top_k,
        retry_deadline_s=retry_deadline_s,
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
    )

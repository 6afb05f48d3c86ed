"""Ollama's chat API through the `ollama` client (`--backend ollama-chat --model NAME [--base-url URL]`).

`POST /api/chat` with `logprobs: true, top_logprobs: 20` (Ollama's maximum; v0.12.11 or later, an older one
streams no logprobs and the stream says so). NDJSON: each line's `message.content` comes with `logprobs[]`
{token, logprob, top_logprobs} for its tokens (../shared/wire/ollama_chat_logprobs.ndjson); the line with
`done: true` ends the reply. Tokens of a thinking model's thoughts (a line with `message.thinking` and no
content) are not the reply and are left out. Errors: HTTP 4xx/5xx with {"error": "..."} before the stream, an
{"error": "..."} line in it. Sampling goes in `options` (temperature, seed, num_predict). The endpoint:
`base_url`, else $OLLAMA_HOST, else http://127.0.0.1:11434; no key (the client sends $OLLAMA_API_KEY if set).
This is the black-box chat route; `ollama://HOST:PORT` is the steerable one (ollama.py).
"""

from __future__ import annotations

from typing import Any

from . import Sampling
from .cloud import (
    RETRY_DEADLINE_S,
    CloudBackend,
    CloudFault,
    Opened,
    Parsed,
    Plan,
    align,
    base_url_of,
    fields,
    import_client,
    items,
    logprob_entry,
    read_timeout,
    require_model,
    stream_fault,
    text_of,
    timeouts_of,
    top_k_of,
)

OLLAMA_URL = "http://127.0.0.1:11434"
OLLAMA_TOP_K = 20  # "top_logprobs must be between 0 and 20"


class OllamaChatParser:
    """/api/chat NDJSON lines: the message's content with its tokens' logprobs; `done: true` ends the reply."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model

    def feed(self, event: Any) -> Parsed:
        event = fields(event, "event")
        if event.get("error"):  # the client raises these first; kept for a server it lets through
            raise stream_fault(self.provider, self.model, str(event["error"]))
        message = fields(event.get("message"), "message")
        content = text_of(message.get("content"), "message.content")
        entries = [logprob_entry(e, f"logprobs[{i}]") for i, e in enumerate(items(event.get("logprobs"), "logprobs"))]
        if text_of(message.get("thinking"), "message.thinking") and not content:
            entries = []  # the logprobs of thoughts: not the reply's tokens
        done = event.get("done")
        if done is not None and not isinstance(done, bool):
            raise TypeError(f"done is {done!r}, not true or false")
        finish = (text_of(event.get("done_reason"), "done_reason") or "stop") if done else None
        return Parsed(align(content, entries), finish)


def wire(obj: Any) -> Any:
    """A line the client parsed, as the JSON Ollama sent (the parser reads that)."""
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else obj


class OllamaChatBackend(CloudBackend):
    """Ollama's /api/chat through the `ollama` client (`client`: an `ollama.Client`)."""

    name = "ollama-chat"
    key_env = "OLLAMA_API_KEY"

    def fixes(self) -> dict[int, str]:
        pull = f"pull it first (`ollama pull {self.model_id}`), or pass a model `ollama list` shows"
        return {404: pull, 401: "set OLLAMA_API_KEY to a key this server takes"}

    def parser(self, plan: Plan) -> OllamaChatParser:
        return OllamaChatParser(self.name, self.model_id)

    def request(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> dict:
        options: dict[str, Any] = {"num_predict": int(max_tokens)}
        if "temperature" not in plan.dropped:
            options["temperature"] = max(0.0, float(sampling.temperature))
        if sampling.temperature > 0 and "seed" not in plan.dropped:
            options["seed"] = int(sampling.seed)
        request: dict[str, Any] = {"model": self.model_id, "messages": msgs, "stream": plan.stream, "options": options}
        if plan.logprobs:
            request["logprobs"], request["top_logprobs"] = True, plan.top_k
        return request

    def _open(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> Opened:
        reply = self._client.chat(**self.request(msgs, sampling, max_tokens, plan))  # a stream is sent when first read
        if not plan.stream:
            return Opened(iter([wire(reply)]))
        return Opened((wire(line) for line in reply), reply.close)

    def _client_fault(self, err: BaseException, *, streaming: bool) -> CloudFault | None:
        import ollama

        if isinstance(err, ollama.ResponseError):
            if err.status_code < 400:  # an {"error": ...} line in the stream: the client gives it status -1
                return stream_fault(self.name, self.model_id, str(err.error))
            return self._http(err.status_code, str(err.error))
        refused = isinstance(err, ConnectionError) or type(err).__name__ == "ConnectError"  # builtin or httpx's
        if refused and not streaming:
            return CloudFault(
                f"{self.name}: cannot connect to Ollama at {self.base_url}; start it (`ollama serve`) or fix "
                "--base-url / $OLLAMA_HOST",
                provider=self.name,
                kind="connect",
            )
        return None


def from_ollama_chat(
    model: str | None = None,
    *,
    base_url: str | None = None,
    top_k: int | None = None,
    retry_deadline_s: float = RETRY_DEADLINE_S,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
    **_local: Any,
) -> OllamaChatBackend:
    """`--backend ollama-chat --model NAME [--base-url URL]`. Local-model options are ignored (Ollama loads the
    model itself)."""
    model = require_model("ollama-chat", model, "llama3.2")
    ollama = import_client("ollama", "ollama", "ollama-chat")
    import httpx  # the ollama client's HTTP package

    url, _ = base_url_of(base_url, ("OLLAMA_HOST",), OLLAMA_URL)
    timeouts = timeouts_of(connect_timeout, first_byte_timeout, idle_timeout)
    client = ollama.Client(host=url, timeout=httpx.Timeout(read_timeout(timeouts), connect=timeouts.connect))
    return OllamaChatBackend(
        client,
        model,
        top_k=top_k_of("ollama-chat", top_k, OLLAMA_TOP_K),
        base_url=url,
        retry_deadline_s=retry_deadline_s,
        timeouts=timeouts,
    )

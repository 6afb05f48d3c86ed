"""Gemini through the `google-genai` client (`--backend gemini --model NAME`).

`generationConfig.responseLogprobs: true, logprobs: 19` (AI Studio documents logprobs in [0, 20), Vertex 1..20:
19 fits both) on `v1beta/models/NAME:streamGenerateContent?alt=sse`. Each chunk's `candidates[0].logprobsResult`
gives the chunk's tokens: `chosenCandidates[i]` {token, tokenId, logProbability} with `topCandidates[i].candidates`
(../shared/wire/gemini_stream_logprobs.sse). Gemini sends token ids, so steps carry them (and their top
logprobs keep theirs). System turns become the `system_instruction` (Gemini takes one), assistant turns the
"model" role. Some models answer 400 "Logprobs is not enabled for models/...": the reply is asked again
without logprobs and streams unscored. Key: $GEMINI_API_KEY (or $GOOGLE_API_KEY); base URL:
`base_url` / $GOOGLE_GEMINI_BASE_URL. The client's own retries are off (ours keep to the round deadline).
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
    Token,
    align,
    as_logprob,
    base_url_of,
    env_key,
    error_text,
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
    token_id,
    top_entries,
    top_k_of,
)

GEMINI_URL = "https://generativelanguage.googleapis.com"
GEMINI_TOP_K = 19
FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "FINISH_REASON_UNSPECIFIED": None}
RETRYABLE_STATUSES = ("UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED")  # google.rpc codes a later try may pass


def chosen_entry(entry: Any, top: Any, what: str) -> Token:
    """One chosen token with its id and its step's top candidates. A logProbability of 0 (a certain token)
    may be left out of the JSON, as proto3 leaves out zero values."""
    entry = fields(entry, what)
    token = text_of(entry.get("token"), f"{what}.token")
    logprob = as_logprob(entry.get("logProbability", 0.0), f"{what}.logProbability")
    candidates = fields(top, f"topCandidates of {what}").get("candidates")
    tops = top_entries(candidates, f"topCandidates of {what}", id_key="tokenId", lp_key="logProbability")
    known = token_id(entry.get("tokenId"), f"{what}.tokenId")
    return Token(token.encode("utf-8", "surrogatepass"), logprob, tops, known)


class GeminiParser:
    """`GenerateContentResponse` chunks: candidate 0's text parts (thoughts left out), its logprobs, and the
    finish reason on the last chunk."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider, self.model = provider, model

    def feed(self, event: Any) -> Parsed:
        event = fields(event, "event")
        if event.get("error"):  # the client raises these first; kept for a server it lets through
            error = event["error"] if isinstance(event["error"], dict) else {"message": str(event["error"])}
            code = error.get("code")
            retryable = str(error.get("status")) in RETRYABLE_STATUSES or (isinstance(code, int) and code >= 500)
            raise stream_fault(self.provider, self.model, error_text(error), retryable=retryable)
        candidates = items(event.get("candidates"), "candidates")
        if not candidates:
            blocked = fields(event.get("promptFeedback"), "promptFeedback").get("blockReason")
            return Parsed(finish="content_filter" if blocked else None)
        candidate = fields(candidates[0], "candidates[0]")
        parts = items(fields(candidate.get("content"), "content").get("parts"), "parts")
        text = "".join(
            text_of(part.get("text"), f"parts[{i}].text")
            for i, part in enumerate(fields(p, "part") for p in parts)
            if not part.get("thought")
        )
        result = fields(candidate.get("logprobsResult"), "logprobsResult")
        chosen = items(result.get("chosenCandidates"), "chosenCandidates")
        tops = items(result.get("topCandidates"), "topCandidates")
        entries = [
            chosen_entry(c, tops[i] if i < len(tops) else None, f"chosenCandidates[{i}]") for i, c in enumerate(chosen)
        ]
        finish = candidate.get("finishReason")
        reason = None if finish is None else FINISH.get(text_of(finish, "finishReason"), str(finish).lower())
        return Parsed(align(text, entries), reason)


def wire(obj: Any) -> Any:
    """A response the client parsed, as the camelCase JSON the API sent (the parser reads that)."""
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", by_alias=True, exclude_none=True) if callable(dump) else obj


class GeminiBackend(CloudBackend):
    """Gemini through `google-genai` (`client`: a `genai.Client`)."""

    name = "gemini"
    key_env = "GEMINI_API_KEY"

    def parser(self, plan: Plan) -> GeminiParser:
        return GeminiParser(self.name, self.model_id)

    def request(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> dict:
        """The contents and config of one request: system turns as the system instruction."""
        system, turns = split_system(msgs)
        contents = [
            {"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]} for m in turns
        ]
        config: dict[str, Any] = {"max_output_tokens": int(max_tokens)}
        if system is not None:
            config["system_instruction"] = system
        if "temperature" not in plan.dropped:
            config["temperature"] = max(0.0, float(sampling.temperature))
        if sampling.temperature > 0 and "seed" not in plan.dropped:
            config["seed"] = int(sampling.seed)
        if plan.logprobs:
            config["response_logprobs"], config["logprobs"] = True, plan.top_k
        return {"model": self.model_id, "contents": contents, "config": config}

    def _open(self, msgs: list[dict[str, str]], sampling: Sampling, max_tokens: int, plan: Plan) -> Opened:
        request = self.request(msgs, sampling, max_tokens, plan)
        if not plan.stream:
            return Opened(iter([wire(self._client.models.generate_content(**request))]))
        chunks = self._client.models.generate_content_stream(**request)  # sent when first read
        return Opened((wire(chunk) for chunk in chunks), chunks.close)

    def _client_fault(self, err: BaseException, *, streaming: bool) -> CloudFault | None:
        from google.genai import errors

        if isinstance(err, errors.APIError):
            body = err.details if err.details is not None else err.message
            code = err.code if isinstance(err.code, int) else 0
            headers = getattr(getattr(err, "response", None), "headers", None)
            if streaming or code < 400:  # an error object inside the stream
                retryable = code >= 500 or code == 429 or str(err.status) in RETRYABLE_STATUSES
                return stream_fault(self.name, self.model_id, error_text(body) or str(body), retryable=retryable)
            return self._http(code, body, headers)
        return None


def from_gemini(
    model: str | None = None,
    *,
    base_url: str | None = None,
    top_k: int | None = None,
    retry_deadline_s: float = RETRY_DEADLINE_S,
    connect_timeout: float | None = None,
    first_byte_timeout: float | None = None,
    idle_timeout: float | None = None,
    **_local: Any,
) -> GeminiBackend:
    """`--backend gemini --model NAME [--base-url URL]`: the Gemini API (key $GEMINI_API_KEY). The client takes
    one timeout: the larger of first_byte_timeout and idle_timeout. Local-model options are ignored."""
    model = require_model("gemini", model, "gemini-2.0-flash")
    genai = import_client("google.genai", "gemini", "gemini")
    url, default = base_url_of(base_url, ("GOOGLE_GEMINI_BASE_URL",), GEMINI_URL)
    key = need_key("gemini", env_key("GEMINI_API_KEY", "GOOGLE_API_KEY"), "GEMINI_API_KEY", default)
    timeouts = timeouts_of(connect_timeout, first_byte_timeout, idle_timeout)
    # v1beta: the version whose generationConfig documents responseLogprobs / logprobs (the SDK may default to v1)
    options = {"base_url": url + "/", "api_version": "v1beta", "timeout": int(read_timeout(timeouts) * 1000)}
    client = genai.Client(api_key=key, vertexai=False, http_options=options)
    return GeminiBackend(
        client,
        model,
        top_k=top_k_of("gemini", top_k, GEMINI_TOP_K),
        base_url=url,
        retry_deadline_s=retry_deadline_s,
        timeouts=timeouts,
    )

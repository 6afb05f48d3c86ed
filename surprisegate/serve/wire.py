"""The OpenAI request side: read a request body and check every field before anything runs.

Like vLLM's OpenAI layer, each field is validated at the edge and a bad one gets a 400 naming it; a field
we cannot serve (`n` > 1, `tools`, ...) is named too, rather than silently ignored. What survives becomes
a `GateRequest`: the chat to answer and the per-request `Config` (server defaults, then the request's
sampling fields, then its `"surprisegate": {...}` extension).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import Config
from ..errors import ConfigError, InputError
from ..prompting import conversation

# Gate settings a request may change: they shape only its own reply. Backend, model, tools' reach,
# sessions, threads and prompts stay the server's (one config per deployment, DESIGN §3).
REQUEST_KEYS = (
    "mode",
    "signal",
    "statistic",
    "window",
    "threshold",
    "min_tokens",
    "kind_thresholds",
    "max_rounds",
    "round_deadline_s",
    "relevance_floor",
    "arbitration_margin",
    "ground_closed_questions",
    "revert_unused_evidence",
    "retry_failed_rewrite",
    "injection",
    "arm_order_computable",
    "arm_order_other",
    "stream",
)
# Fields an OpenAI client may send that this server cannot honour: a 400 names them.
UNSERVED = {
    "tools": "tool calls",
    "tool_choice": "tool calls",
    "functions": "function calls",
    "function_call": "function calls",
    "parallel_tool_calls": "tool calls",
    "response_format": "structured output",
    "logit_bias": "logit bias",
    "audio": "audio output",
    "modalities": "other modalities",
    "prediction": "predicted outputs",
    "web_search_options": "the provider's web search",
    "reasoning_effort": "reasoning models",
    "suffix": "insertion",
}
IGNORED = ("user", "metadata", "store", "service_tier")  # bookkeeping fields with no effect on the reply
CHAT_FIELDS = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "surprisegate",
)
COMPLETION_FIELDS = (
    "model",
    "prompt",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "n",
    "best_of",
    "echo",
    "presence_penalty",
    "frequency_penalty",
    "surprisegate",
)


class ApiError(InputError):
    """A request the server answers with an OpenAI-shaped error: status, type, the field (`param`), code."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the server's flags)."""

    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_tokens: int = 1024  # most reply tokens a request may ask for
    max_rounds: int = 4  # most grounding rounds a request may ask for
    max_round_deadline_s: float = 10.0


@dataclass(frozen=True)
class GateRequest:
    """One checked request: what to answer, with which config, and how to shape the reply."""

    endpoint: str  # "chat" | "completion"
    messages: list[dict[str, str]]
    config: Config
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    stops: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)  # what this request changed, for its receipt
    notes: tuple[str, ...] = ()  # adjustments the server made, said back in the response


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(
            f"the request body is not valid JSON ({err}); send a JSON object such as "
            '{"model": "...", "messages": [{"role": "user", "content": "..."}]}',
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body is a JSON {type(body).__name__}, not an object; send a JSON object")
    return body


# --------------------------------------------------------------------------------------------
# typed fields
# --------------------------------------------------------------------------------------------
def _int(body: dict, name: str, low: int, high: int, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(f"{name}={value!r} must be a whole number from {low} to {high}", param=name)
    return value


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{name}={value!r} must be a number from {low} to {high}", param=name)
    if not low <= value <= high:
        raise ApiError(f"{name}={value!r} must be a number from {low} to {high}", param=name)
    return float(value)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{name}={value!r} must be true or false", param=name)
    return value


def _text(value: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts (the newer OpenAI form)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(
                    f"{param}[{i}]={str(part)[:80]!r}: only text parts are served; send "
                    '{"type": "text", "text": "..."}',
                    param=f"{param}[{i}]",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"{param}={str(value)[:80]!r} must be a string or a list of text parts", param=param)


# --------------------------------------------------------------------------------------------
# the fields every endpoint shares
# --------------------------------------------------------------------------------------------
def check_fields(body: dict, allowed: tuple[str, ...]) -> None:
    """Unservable fields and unknown ones get a 400 that names them (never silently ignored)."""
    unserved = [k for k in body if k in UNSERVED and body[k] not in (None, [], {}, {"type": "text"})]
    if unserved:
        what = ", ".join(f"{k} ({UNSERVED[k]})" for k in unserved)
        raise ApiError(f"this server cannot serve {what}; drop {', '.join(unserved)}", param=unserved[0])
    unknown = [k for k in body if k not in allowed and k not in IGNORED and k not in UNSERVED]
    if unknown:
        raise ApiError(
            f"unrecognized request field(s) {', '.join(unknown)}; drop them (gate settings go in "
            '"surprisegate": {...})',
            param=unknown[0],
        )
    if _int(body, "n", 1, 128, 1) != 1 or _int(body, "best_of", 1, 128, 1) != 1:
        name = "n" if body.get("n", 1) != 1 else "best_of"
        raise ApiError(
            f"{name}={body[name]!r}: one reply per request is served; drop {name} or set it to 1", param=name
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, -2.0, 2.0) not in (None, 0.0):
            raise ApiError(f"{name}={body[name]!r} is not served (the gate decodes unpenalized); drop it", param=name)
    if _number(body, "top_p", 0.0, 1.0) not in (None, 1.0):
        raise ApiError(
            f"top_p={body['top_p']!r}: only top_p=1 is served exactly (sampling uses the whole distribution "
            "at the given temperature); drop top_p or set it to 1",
            param="top_p",
        )


def check_model(body: dict, served: tuple[str, ...]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(f"model={model!r} must name a served model: {', '.join(served)}", param="model")
    if model not in served:
        raise ApiError(
            f"model={model!r} is not served here; use {', '.join(served)} (GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )


def stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 4 or not all(isinstance(s, str) and s for s in items):
        raise ApiError(f"stop={value!r} must be a non-empty string or a list of up to 4 of them", param="stop")
    return tuple(items)


def stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError("stream_options is only allowed with stream=true", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise ApiError(f"stream_options={options!r}: only include_usage is served", param="stream_options")
    return stream, _bool(options, "include_usage")


# --------------------------------------------------------------------------------------------
# the config of one request
# --------------------------------------------------------------------------------------------
_FIELDS = {f.name: f for f in fields(Config)}


def _typed(key: str, value: Any) -> Any:
    """A JSON value of the config field's own type (no string coercion: JSON has real types)."""
    default = _FIELDS[key].default if key != "kind_thresholds" else {}
    param = f"surprisegate.{key}"
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        tuple: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        dict: lambda v: isinstance(v, dict),
    }[type(default)]
    if not ok(value):
        kind = {tuple: "list of strings", dict: "object", float: "number"}.get(type(default), type(default).__name__)
        raise ApiError(f"{param}={value!r} must be a {kind}, e.g. {default!r}", param=param)
    return tuple(value) if isinstance(default, tuple) else value


def gate_overrides(body: dict, limits: Limits) -> dict[str, Any]:
    """The request's `"surprisegate": {...}` gate settings, typed and within the server's limits."""
    ext = body.get("surprisegate")
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise ApiError(f'surprisegate={ext!r} must be an object, e.g. {{"mode": "intervene"}}', param="surprisegate")
    unknown = [k for k in ext if k not in REQUEST_KEYS]
    if unknown:
        raise ApiError(
            f"surprisegate: unknown or server-only setting(s) {', '.join(unknown)}; a request may set "
            f"{', '.join(REQUEST_KEYS)}",
            param=f"surprisegate.{unknown[0]}",
        )
    out = {k: _typed(k, v) for k, v in ext.items()}
    if out.get("stream", "holdback") != "holdback":
        raise ApiError(
            f"surprisegate.stream={out['stream']!r}: an OpenAI stream cannot take text back, so only "
            "'holdback' is served (clients never see rewound text)",
            param="surprisegate.stream",
        )
    if out.get("max_rounds", 0) > limits.max_rounds:
        raise ApiError(
            f"surprisegate.max_rounds={out['max_rounds']} is over this server's limit of {limits.max_rounds}"
        )
    if out.get("round_deadline_s", 0) > limits.max_round_deadline_s:
        raise ApiError(
            f"surprisegate.round_deadline_s={out['round_deadline_s']} is over this server's limit of "
            f"{limits.max_round_deadline_s} s",
            param="surprisegate.round_deadline_s",
        )
    return out


def sampling_overrides(body: dict, limits: Limits) -> dict[str, Any]:
    """max_tokens, temperature and seed as config values (absent: the server's defaults)."""
    out: dict[str, Any] = {}
    tokens = {k: body.get(k) for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None}
    if len(set(map(repr, tokens.values()))) > 1:
        raise ApiError(f"{tokens}: max_tokens and max_completion_tokens differ; send one", param="max_tokens")
    for name in tokens:
        out["max_tokens"] = _int(body, name, 1, limits.max_tokens)
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        out["temperature"] = temperature
    seed = _int(body, "seed", 0, 2**63 - 1)
    if seed is not None:
        out["seed"] = seed
    return out


def request_config(
    base: Config, overrides: dict[str, Any], top_logprobs: int, logprobs: bool, detect_only: bool
) -> tuple[Config, tuple[str, ...]]:
    """The server's config under the request's changes, and notes on what the server adjusted."""
    changes = dict(overrides) | {"stream": "holdback"}
    if top_logprobs:
        changes["top_logprobs"] = top_logprobs
    try:
        config = base.replace(**changes)
    except ConfigError as err:
        key = next((k for k in overrides if str(err).startswith(f"{k}=")), None)
        raise ApiError(f"surprisegate: {err}", param=f"surprisegate.{key}" if key else "surprisegate") from None
    notes = []
    if config.mode == "intervene" and detect_only and not {"threshold", "kind_thresholds"} & set(overrides):
        # The model has no calibration: another model's thresholds would trigger at random (runtime.model_config).
        config = config.replace(mode="detect")
        notes.append("no calibration for this model: intervene ran as detect; pass surprisegate.threshold")
    if logprobs and config.mode == "off":
        # Detection only reads logprobs (DESIGN §1): the reply is the one `off` writes.
        config = config.replace(mode="detect")
        notes.append("logprobs need scoring: mode off ran as detect (detection never changes the reply)")
    return config, tuple(notes)


# --------------------------------------------------------------------------------------------
# the endpoints
# --------------------------------------------------------------------------------------------
def chat_turns(value: Any, limits: Limits, system_prompt: str) -> list[dict[str, str]]:
    """The chat's turns as {"role", "content"}; a "developer" turn is a system turn (newer OpenAI name)."""
    if not isinstance(value, list) or not value:
        raise ApiError(
            f'messages={str(value)[:80]!r} must be a non-empty list of {{"role": "user", "content": "..."}} turns',
            param="messages",
        )
    if len(value) > limits.max_messages:
        raise ApiError(
            f"messages holds {len(value)} turns, over this server's limit of {limits.max_messages}; send fewer",
            param="messages",
        )
    turns = []
    for i, m in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            extra = sorted(set(m) - {"role", "content", "name"}) if isinstance(m, dict) else None
            raise ApiError(
                f"{param}={str(m)[:80]!r} must be {{'role', 'content'}}" + (f"; drop {extra}" if extra else ""),
                param=param,
            )
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ("system", "user", "assistant"):
            raise ApiError(
                f"{param}.role={m.get('role')!r}: use system, developer, user or assistant (tool turns are not served)",
                param=f"{param}.role",
            )
        turns.append({"role": role, "content": _text(m.get("content"), f"{param}.content")})
    try:
        conversation(turns, system_prompt)  # the loop's own check: the last turn is a non-empty user turn
    except InputError as err:
        raise ApiError(str(err), param="messages") from None
    return turns


def parse_chat(
    body: dict, base: Config, limits: Limits, served: tuple[str, ...], detect_only: bool = False
) -> GateRequest:
    """POST /v1/chat/completions."""
    check_fields(body, CHAT_FIELDS)
    check_model(body, served)
    messages = chat_turns(body.get("messages"), limits, base.system_prompt)
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20, 0) or 0
    if top and not logprobs:
        raise ApiError(f"top_logprobs={top} needs logprobs=true", param="top_logprobs")
    return _gate_request("chat", body, base, limits, messages, logprobs, top, detect_only)


def parse_completion(
    body: dict, base: Config, limits: Limits, served: tuple[str, ...], detect_only: bool = False
) -> GateRequest:
    """POST /v1/completions: the prompt is asked as one user turn (the gate's loop writes chat replies)."""
    check_fields(body, COMPLETION_FIELDS)
    check_model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(f"prompt={str(prompt)[:80]!r} must be one non-empty string", param="prompt")
    if _bool(body, "echo"):
        raise ApiError("echo=true is not served (the prompt is asked as a chat turn); drop echo", param="echo")
    top = _int(body, "logprobs", 0, 5)
    messages = chat_turns([{"role": "user", "content": prompt}], limits, base.system_prompt)
    return _gate_request("completion", body, base, limits, messages, top is not None, top or 0, detect_only)


def _gate_request(
    endpoint: str,
    body: dict,
    base: Config,
    limits: Limits,
    messages: list[dict[str, str]],
    logprobs: bool,
    top: int,
    detect_only: bool,
) -> GateRequest:
    stream, include_usage = stream_flags(body)
    stop = stops(body)
    overrides = sampling_overrides(body, limits) | gate_overrides(body, limits)
    config, notes = request_config(base, overrides, top, logprobs, detect_only)
    return GateRequest(endpoint, messages, config, stream, include_usage, logprobs, top, stop, overrides, notes)

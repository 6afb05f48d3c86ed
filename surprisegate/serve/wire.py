"""The OpenAI request side: read a request body and check every field before anything runs.

Like vLLM's OpenAI layer, each field is validated at the edge and a bad one gets a 400 naming it; a field
we cannot serve (`n` > 1, `tools`, ...) is named too, rather than silently ignored. What survives becomes
a `GateRequest`: the chat to answer and the per-request `Config` (server defaults, then the request's
sampling fields, then its `"surprisegate": {...}` extension).

The body is checked before it is trusted: valid UTF-8 (or UTF-16/32) JSON, at most `MAX_DEPTH` deep (a
scan over the text before parsing, so no input can exhaust the parser's stack), no NaN or Infinity, and
no lone surrogate in any string or key. Every gate setting is of a known kind and within bounds: choices
from their lists, numbers in ranges, kind thresholds only for question kinds the server knows, and the
request's grounding (max_rounds x round_deadline_s) within the operator's budget. Error messages name the
field and show at most a short prefix of its value (`shown`); a body is never over `MAX_ERROR_BYTES`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, cast

from .. import shipped_thresholds
from ..config import ARM_NAMES, INJECTIONS, MODES, Config
from ..errors import ConfigError, InputError
from ..gate.prompting import Continuation, conversation
from ..gate.signals import SIGNALS
from ..gate.structured import ResponseFormat
from ..gate.surprise import STATISTICS
from ..gate.tools import TOOL_NAME

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
    "events",  # not a config key: the stream also carries the rounds' events as they happen (gate_events)
)
# Fields an OpenAI client may send that this server cannot honour: a 400 names them.
UNSERVED = {
    "functions": "the legacy function calls (send tools)",
    "function_call": "the legacy function calls (send tool_choice)",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "web_search_options": "the provider's web search",
    "reasoning_effort": "reasoning models",
    "suffix": "insertion",
}
IGNORED = ("user", "metadata", "store", "service_tier")  # bookkeeping fields with no effect on the reply
# Sampling fields beyond OpenAI's own that vLLM, llama.cpp's server and Ollama-minded clients send
# (repetition_penalty is vLLM's and HF's name for llama.cpp's repeat_penalty).
SAMPLING_FIELDS = ("top_k", "min_p", "repeat_penalty", "repetition_penalty", "repeat_last_n", "logit_bias")
MAX_LOGIT_BIAS = 300  # entries, OpenAI's own limit
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
    *SAMPLING_FIELDS,
    "modalities",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "surprisegate",
)
MAX_TOOLS = 128  # OpenAI's own limit
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
    *SAMPLING_FIELDS,
    "surprisegate",
)

# POST /v1/responses (OpenAI's newer API): text in, text out. Tools, stored state and non-text formats are named
# in a 400 like the chat endpoint's unserved fields.
RESPONSES_FIELDS = (
    "model",
    "input",
    "instructions",
    "stream",
    "max_output_tokens",
    "temperature",
    "top_p",
    "seed",
    "text",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "truncation",
    "include",
    *SAMPLING_FIELDS,
    "surprisegate",
)
RESPONSES_UNSERVED = {
    "previous_response_id": "stored conversations (send the whole conversation in input)",
    "conversation": "stored conversations (send the whole conversation in input)",
    "reasoning": "reasoning models",
    "background": "background responses",
    "prompt": "stored prompt templates",
}
RESPONSES_IGNORED = (*IGNORED, "prompt_cache_key", "safety_identifier", "stream_options")

MAX_DEPTH = 32  # JSON nesting a body may have: a chat needs 5 (body, messages, turn, content parts, part)
SHOWN_CHARS = 60  # most characters of a client's value an error message shows
NAME_CHARS = 40  # most characters of a client's key shown in a message or `param`
MAX_ERROR_BYTES = 2000  # an error body is never bigger (a client's long value cannot make it long)
THRESHOLD_BITS = 64.0  # |threshold| a request may set: a window statistic in bits is far inside it
MAX_STOP_CHARS = 256  # a stop string is held back while it may be starting: longer ones hold the reply
CLIENT_SYSTEM = ("append", "replace", "refuse")  # what a client's system (or developer) turns do


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A client's value as an error message shows it: as JSON, at most `limit` characters, then an
    ellipsis and its whole length, so a long value is never echoed and no Python repr of ours leaks."""
    if isinstance(value, str):
        text = json.dumps(value[: limit + 1], ensure_ascii=False)
        return text if len(value) <= limit else f'{text[: limit + 1]}…" ({len(value)} characters)'
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def clip(text: str, limit: int = 300) -> str:
    """One of our own messages (which may quote a client's value) cut to `limit` characters."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def name(key: Any, sized: bool = False) -> str:
    """A client's key (a field name) as a `param` (or, `sized`, a message) names it: cut to NAME_CHARS,
    then an ellipsis (and, `sized`, its whole length)."""
    text = key if isinstance(key, str) else str(key)
    if len(text) <= NAME_CHARS:
        return text
    return f"{text[:NAME_CHARS]}… ({len(text)} characters)" if sized else f"{text[:NAME_CHARS]}…"


def _names(keys: list[Any], most: int = 5) -> str:
    listed = ", ".join(name(k, sized=True) for k in keys[:most])
    return listed + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _clean(text: str) -> str:
    """Text that encodes as UTF-8: a lone surrogate becomes its escape (it would fail the response)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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
        """{"error": {...}}, at most MAX_ERROR_BYTES as JSON: a long message is cut, the cut said."""
        message = _clean(str(self))
        param = None if self.param is None else _clean(self.param)[: NAME_CHARS * 3]
        error = {"message": message, "type": self.kind, "param": param, "code": self.code}
        keep = len(message)
        while len(json.dumps({"error": error}, ensure_ascii=False).encode()) > MAX_ERROR_BYTES:
            keep = keep * 3 // 4
            error["message"] = message[:keep] + "… (message cut)"
        return {"error": error}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the server's flags)."""

    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_tokens: int = 1024  # most reply tokens a request may ask for
    max_rounds: int = 4  # most grounding rounds a request may ask for
    max_round_deadline_s: float = 10.0
    # Most grounding one request may ask for: its max_rounds x round_deadline_s, in seconds of arm time.
    max_grounding_s: float = 8.0
    # A client's system/developer turns: "append" (after the server's system prompt, in one system turn),
    # "replace" (they stand instead of it) or "refuse" (a 400).
    client_system: str = "append"

    def __post_init__(self) -> None:
        if self.client_system not in CLIENT_SYSTEM:
            raise InputError(
                f"client_system={self.client_system!r} (--client-system) must be one of {', '.join(CLIENT_SYSTEM)}"
            )
        budget = self.max_grounding_s
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 3600:
            raise InputError(
                f"max_grounding_s={budget!r} (--max-grounding-s) must be seconds over 0, at most 3600, e.g. 8"
            )


@dataclass(frozen=True)
class GateRequest:
    """One checked request: what to answer, with which config, and how to shape the reply."""

    endpoint: str  # "chat" | "completion" | "responses"
    messages: list[dict[str, Any]]
    config: Config
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    stops: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)  # what this request changed, for its receipt
    notes: tuple[str, ...] = ()  # adjustments the server made, said back in the response
    tools: tuple[dict[str, Any], ...] = ()  # offered tools, as the client sent them (checked)
    tool_choice: str = "auto"  # "auto", "none", "required" or one function's name
    parallel_tool_calls: bool = True
    tool_use: Any = None  # the tools.ToolUse the server made of them for its model (serve/gate.tool_use)
    response_format: ResponseFormat | None = None  # JSON output under a grammar (None: text)
    continuation: Continuation | None = None  # /v1/completions: the raw prompt the reply continues
    echo: bool = False  # /v1/completions: the prompt comes back before the reply's text
    events: bool = False  # a stream also carries the rounds' events as they happen (gate_events)


# --------------------------------------------------------------------------------------------
# the body
# --------------------------------------------------------------------------------------------
EXAMPLE = '{"model": "...", "messages": [{"role": "user", "content": "..."}]}'
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"?', re.S)  # a JSON string; unclosed: to the end
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it: checked for depth before it is
    parsed, and for lone surrogates (which no response or receipt could encode) after."""
    text = _decoded(raw)
    check_depth(text)
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except ApiError:
        raise
    except json.JSONDecodeError as err:
        raise ApiError(
            f"the request body is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
            f"send a JSON object such as {EXAMPLE}",
            code="invalid_json",
        ) from None
    except (ValueError, RecursionError):  # an integer of more digits than Python converts
        raise ApiError(
            "the request body holds a number too long to read; send numbers of at most a few dozen digits",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise ApiError(
            f"the request body is a JSON {type(body).__name__}, not an object; send a JSON object such as {EXAMPLE}",
            code="invalid_json",
        )
    check_strings(body)
    return body


def _decoded(raw: bytes) -> str:
    try:
        return raw.decode(json.detect_encoding(raw))
    except UnicodeDecodeError as err:
        raise ApiError(
            f"the request body is not valid {err.encoding.upper()} (byte {err.start}: {err.reason}); "
            "send JSON in UTF-8",
            code="invalid_json",
        ) from None


def _no_constant(word: str) -> float:
    raise ApiError(f"the request body holds {word}, which is not JSON; send a finite number", code="invalid_json")


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """A 400 when the JSON text nests deeper than `limit` (strings skipped): a linear scan that stops at
    the first level too deep, so 50,000 `[` cost nothing and never reach the parser's recursion."""
    depth = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > limit:
            raise ApiError(
                f"the request body nests arrays or objects more than {limit} deep; a chat needs 5, "
                f"send a flatter body such as {EXAMPLE}",
                code="invalid_json",
            )


def check_strings(value: Any, path: str = "") -> None:
    """A 400 naming the first string or key holding a lone surrogate (a \\ud800 escape with no pair):
    it is not Unicode text, so the model, a stop string, a receipt or a reply cannot hold it."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            raise _surrogate(path or "the request body", found, what="a string")
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _SURROGATE.search(key)
            if found:
                raise _surrogate(path or "the request body", found, what="a key")
            check_strings(item, f"{path}.{name(key)}" if path else name(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_strings(item, f"{path}[{i}]")


def _surrogate(where: str, found: re.Match, what: str) -> ApiError:
    escape = f"\\u{ord(found.group()):04x}"
    return ApiError(
        f"{where}: {what} holds a lone surrogate ({escape}) at character {found.start()}, which is not "
        "Unicode text; send the character itself (UTF-8) or a complete surrogate pair",
        param=where if where != "the request body" else None,
        code="invalid_unicode",
    )


# --------------------------------------------------------------------------------------------
# typed fields
# --------------------------------------------------------------------------------------------
def _int(
    body: dict, key: str, low: int, high: int, default: int | None = None, param: str | None = None, why: str = ""
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    param = param or key
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(f"{param}={shown(value)} must be a whole number from {low} to {high}{why}", param=param)
    return value


def _number(body: dict, key: str, low: float, high: float, param: str | None = None, why: str = "") -> float | None:
    value = body.get(key)
    if value is None:
        return None
    param = param or key
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{param}={shown(value)} must be a number from {low:g} to {high:g}{why}", param=param)
    if not low <= value <= high:
        raise ApiError(f"{param}={shown(value)} must be a number from {low:g} to {high:g}{why}", param=param)
    return float(value)


def _bool(body: dict, key: str, param: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{param or key}={shown(value)} must be true or false", param=param or key)
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
                    f'{param}[{i}]={shown(part)}: only text parts are served; send {{"type": "text", "text": "..."}}',
                    param=f"{param}[{i}]",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"{param}={shown(value)} must be a string or a list of text parts", param=param)


# --------------------------------------------------------------------------------------------
# the fields every endpoint shares
# --------------------------------------------------------------------------------------------
def check_names(
    body: dict, allowed: tuple[str, ...], unserved: dict[str, str], ignored: tuple[str, ...], unset: tuple
) -> None:
    """Unservable fields (set to anything but one of `unset`) and unknown ones get a 400 that names them
    (never silently ignored)."""
    refused = [k for k in body if k in unserved and body[k] not in unset]
    if refused:
        what = ", ".join(f"{k} ({unserved[k]})" for k in refused)
        raise ApiError(f"this server cannot serve {what}; drop {', '.join(refused)}", param=refused[0])
    unknown = [k for k in body if k not in allowed and k not in ignored and k not in unserved]
    if unknown:
        raise ApiError(
            f'unrecognized request field(s) {_names(unknown)}; drop them (gate settings go in "surprisegate": {{...}})',
            param=name(unknown[0]),
        )


def check_fields(body: dict, allowed: tuple[str, ...]) -> None:
    """The chat and completion endpoints' fields: names, one reply, text only."""
    check_names(body, allowed, UNSERVED, IGNORED, (None, [], {}, {"type": "text"}))
    if _int(body, "n", 1, 128, 1) != 1 or _int(body, "best_of", 1, 128, 1) != 1:
        key = "n" if body.get("n", 1) != 1 else "best_of"
        raise ApiError(
            f"{key}={shown(body[key])}: one reply per request is served; drop {key} or set it to 1", param=key
        )
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise ApiError(
            f'modalities={shown(modalities)}: this server writes text only; send ["text"] or drop modalities',
            param="modalities",
        )


def check_model(body: dict, served: tuple[str, ...]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(f"model={shown(model)} must name a served model: {', '.join(served)}", param="model")
    if model not in served:
        raise ApiError(
            f"model={shown(model)} is not served here; use {', '.join(served)} (GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )


def stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 4:
        raise ApiError(f"stop={shown(value)} must be a non-empty string or a list of up to 4 of them", param="stop")
    for i, item in enumerate(items):
        param = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(item, str) or not item or len(item) > MAX_STOP_CHARS:
            raise ApiError(f"{param}={shown(item)} must be a string of 1 to {MAX_STOP_CHARS} characters", param=param)
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
        raise ApiError(f"stream_options={shown(options)}: only include_usage is served", param="stream_options")
    return stream, _bool(options, "include_usage", "stream_options.include_usage")


# --------------------------------------------------------------------------------------------
# the config of one request
# --------------------------------------------------------------------------------------------
CHOICES = {"mode": MODES, "signal": SIGNALS, "statistic": STATISTICS, "injection": INJECTIONS}
FLAGS = ("ground_closed_questions", "revert_unused_evidence", "retry_failed_rewrite")
ARM_ORDERS = ("arm_order_computable", "arm_order_other")
WHOLE = {"window": (1, 512), "min_tokens": (1, 512)}  # Config's own bounds
NUMBERS = {
    "threshold": (-THRESHOLD_BITS, THRESHOLD_BITS),
    "relevance_floor": (0.0, 1.0),
    "arbitration_margin": (0.0, 1.0),
}


def known_kinds(base: Config) -> frozenset[str]:
    """The question kinds (signals.question_kind) a request may give its own threshold: those the server's
    config and the shipped calibration know. Any other key could never match a question's kind."""
    return frozenset(base.kind_thresholds) | frozenset(shipped_thresholds.KIND_THRESHOLDS)


def _setting(key: str, value: Any, limits: Limits, kinds: frozenset[str]) -> Any:
    """One `surprisegate.KEY` value, of its kind and within its bounds, or a 400 naming it."""
    param, box = f"surprisegate.{key}", {key: value}
    if key in CHOICES:
        if not isinstance(value, str) or value not in CHOICES[key]:
            raise ApiError(f"{param}={shown(value)} must be one of {', '.join(CHOICES[key])}", param=param)
        return value
    if key in FLAGS:
        return _bool(box, key, param)
    if key in WHOLE:
        return _int(box, key, *WHOLE[key], param=param)
    if key in NUMBERS:
        bits = " bits" if key == "threshold" else ""
        return _number(box, key, *NUMBERS[key], param=param, why=bits)
    if key == "max_rounds":
        return _int(box, key, 0, limits.max_rounds, param=param, why=" (this server's limit)")
    if key == "round_deadline_s":
        return _number(box, key, 0.01, limits.max_round_deadline_s, param=param, why=" s (this server's limit)")
    if key in ARM_ORDERS:
        return _arm_order(param, value)
    if key == "kind_thresholds":
        return _kind_thresholds(param, value, kinds)
    if value != "holdback":  # stream
        raise ApiError(
            f"{param}={shown(value)}: an OpenAI stream cannot take text back, so only 'holdback' is served "
            "(clients never see rewound text)",
            param=param,
        )
    return value


def _arm_order(param: str, value: Any) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(a, str) and a in ARM_NAMES for a in value)
        or len(set(value)) != len(value)
    ):
        raise ApiError(
            f"{param}={shown(value)} must be a list of distinct arm names from {', '.join(ARM_NAMES)}, "
            'e.g. ["memory", "web"]',
            param=param,
        )
    return tuple(value)


def _kind_thresholds(param: str, value: Any, kinds: frozenset[str]) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ApiError(
            f'{param}={shown(value)} must be an object of question kind: bits, e.g. {{"capital": 1.5}}', param=param
        )
    out = {}
    for kind, bits in value.items():
        if kind not in kinds:
            listed = ", ".join(sorted(kinds))
            listed = listed if len(listed) <= 700 else listed[:700].rsplit(", ", 1)[0] + ", …"
            raise ApiError(
                f"{param}.{name(kind, sized=True)} is not a question kind this server knows; use one of {listed}",
                param=f"{param}.{name(kind)}",
            )
        where = f"{param}.{kind}"
        threshold = _number({kind: bits}, kind, -THRESHOLD_BITS, THRESHOLD_BITS, param=where, why=" bits")
        if threshold is None:
            raise ApiError(
                f"{where}=null must be a number from {-THRESHOLD_BITS:g} to {THRESHOLD_BITS:g} bits", param=where
            )
        out[kind] = threshold
    return out


def gate_overrides(body: dict, limits: Limits, base: Config | None = None) -> dict[str, Any]:
    """The request's `"surprisegate": {...}` gate settings, typed and within the server's limits."""
    ext = body.get("surprisegate")
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise ApiError(
            f'surprisegate={shown(ext)} must be an object, e.g. {{"mode": "intervene"}}', param="surprisegate"
        )
    unknown = [k for k in ext if k not in REQUEST_KEYS]
    if unknown:
        raise ApiError(
            f"surprisegate: unknown or server-only setting(s) {_names(unknown)}; a request may set "
            f"{', '.join(REQUEST_KEYS)}",
            param=f"surprisegate.{name(unknown[0])}",
        )
    base = base or Config()
    kinds = known_kinds(base)
    out = {k: _setting(k, v, limits, kinds) for k, v in ext.items() if v is not None and k != "events"}
    check_budget(out, base, limits)
    return out


def gate_events(body: dict) -> bool:
    """`"surprisegate": {"events": true}`: a stream also sends each round's trigger, grounding and rewind as it
    happens (chunks with no choices, the event under "surprisegate"); the chat page of `serve --ui` asks so."""
    ext = body.get("surprisegate")
    if not isinstance(ext, dict) or ext.get("events") is None:
        return False
    return _bool(ext, "events", "surprisegate.events")


def check_budget(out: dict[str, Any], base: Config, limits: Limits) -> None:
    """A request that sets max_rounds or round_deadline_s asks for at most their product in grounding time
    (the server's value for the one it did not set): over `limits.max_grounding_s` is a 400 saying how to fit."""
    if not {"max_rounds", "round_deadline_s"} & set(out):
        return
    rounds = out.get("max_rounds", base.max_rounds)
    deadline = out.get("round_deadline_s", base.round_deadline_s)
    budget = limits.max_grounding_s
    if rounds * deadline <= budget + 1e-9:
        return
    fit = math.floor(budget / rounds * 100) / 100
    param = "surprisegate.round_deadline_s" if "round_deadline_s" in out else "surprisegate.max_rounds"
    raise ApiError(
        f"surprisegate: max_rounds={rounds} x round_deadline_s={deadline:g} s asks for up to "
        f"{rounds * deadline:g} s of grounding, over this server's budget of {budget:g} s per request; keep "
        f"max_rounds x round_deadline_s within {budget:g}, e.g. round_deadline_s={fit:g} with max_rounds={rounds}",
        param=param,
        code="grounding_budget_exceeded",
    )


def sampling_overrides(body: dict, limits: Limits) -> dict[str, Any]:
    """max_tokens, temperature and seed as config values (absent: the server's defaults)."""
    out: dict[str, Any] = {}
    tokens = {k: body.get(k) for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None}
    if len(set(map(repr, tokens.values()))) > 1:
        given = ", ".join(f"{k}={shown(v)}" for k, v in tokens.items())
        raise ApiError(f"{given}: max_tokens and max_completion_tokens differ; send one", param="max_tokens")
    for key in tokens:
        out["max_tokens"] = _int(body, key, 1, limits.max_tokens)
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        out["temperature"] = temperature
    seed = _int(body, "seed", 0, 2**63 - 1)
    if seed is not None:
        out["seed"] = seed
    return out | shaping_overrides(body)


def shaping_overrides(body: dict) -> dict[str, Any]:
    """top_p, top_k, min_p, the penalties and logit_bias as config values (backends/samplers.py); the
    defaults of each (1, 0 or -1, 0, 0, 1, {}) change nothing and are left out."""
    out: dict[str, Any] = {}
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError("top_p=0 leaves no token to sample; send a number over 0 (1 = off), e.g. 0.9", param="top_p")
    top_k = _int(body, "top_k", -1, 1_000_000, why=" (0 or -1 = off)")
    min_p = _number(body, "min_p", 0.0, 1.0)
    names = [k for k in ("repeat_penalty", "repetition_penalty") if body.get(k) is not None]
    if len(names) == 2 and body["repeat_penalty"] != body["repetition_penalty"]:
        raise ApiError(
            "repeat_penalty and repetition_penalty are one setting (llama.cpp's and vLLM's name) and differ; send one",
            param="repetition_penalty",
        )
    repeat = _number(body, names[0], 0.0, 10.0) if names else None
    if repeat == 0.0:
        raise ApiError(f"{names[0]}=0 divides by zero; send a number over 0 (1 = off), e.g. 1.1", param=names[0])
    values = {
        "top_p": top_p,
        "top_k": None if top_k is None else max(top_k, 0),
        "min_p": min_p,
        "repeat_penalty": repeat,
        "repeat_last_n": _int(body, "repeat_last_n", 0, 1_000_000),
        "frequency_penalty": _number(body, "frequency_penalty", -2.0, 2.0),
        "presence_penalty": _number(body, "presence_penalty", -2.0, 2.0),
    }
    out |= {k: v for k, v in values.items() if v is not None}
    bias = logit_bias(body.get("logit_bias"))
    if bias:
        out["logit_bias"] = bias
    return out


def logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's logit_bias: {"token id": bias from -100 to 100}, at most MAX_LOGIT_BIAS entries."""
    if value is None:
        return {}
    example = 'e.g. {"1234": -100}'
    if not isinstance(value, dict):
        raise ApiError(f"logit_bias={shown(value)} must map token ids to biases, {example}", param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise ApiError(f"logit_bias has {len(value)} entries, over {MAX_LOGIT_BIAS}; send fewer", param="logit_bias")
    out: dict[int, float] = {}
    for key in value:
        param = f"logit_bias.{name(key)}"
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise ApiError(f"logit_bias key {shown(key)} is not a token id; use ids as strings, {example}", param=param)
        number = _number(value, key, -100.0, 100.0, param=param)
        assert number is not None
        out[int(key)] = number
    return out


def request_config(
    base: Config,
    overrides: dict[str, Any],
    top_logprobs: int,
    logprobs: bool,
    detect_only: bool,
    grounding_budget_s: float | None = None,
) -> tuple[Config, tuple[str, ...]]:
    """The server's config under the request's changes, and notes on what the server adjusted."""
    changes = dict(overrides) | {"stream": "holdback"}
    if top_logprobs:
        changes["top_logprobs"] = top_logprobs
    try:
        config = base.replace(**changes)
    except ConfigError as err:  # every setting was checked above: this is a combination the config refuses
        key = next((k for k in overrides if str(err).startswith(f"{k}=")), None)
        raise ApiError(
            f"surprisegate: {clip(str(err))}", param=f"surprisegate.{key}" if key else "surprisegate"
        ) from None
    notes = []
    if config.mode == "intervene" and detect_only and not {"threshold", "kind_thresholds"} & set(overrides):
        # The model has no calibration: another model's thresholds would trigger at random (runtime.model_config).
        config = config.replace(mode="detect")
        notes.append("no calibration for this model: intervene ran as detect; pass surprisegate.threshold")
    rounds = config.paragraph_rounds
    if (
        grounding_budget_s is not None
        and config.sentence_scope
        and rounds * config.round_deadline_s > grounding_budget_s
    ):
        # A paragraph-sized max_tokens turns on sentence scope (claim_scope auto): the client chose the length,
        # not more grounding than the server grants one request.
        fit = max(0, math.floor(grounding_budget_s / config.round_deadline_s + 1e-9))
        config = config.replace(paragraph_rounds=fit)
        notes.append(f"paragraph_rounds {rounds} -> {fit}: this server's grounding budget per request")
    if logprobs and config.mode == "off":
        # Detection only reads logprobs (DESIGN §1): the reply is the one `off` writes.
        config = config.replace(mode="detect")
        notes.append("logprobs need scoring: mode off ran as detect (detection never changes the reply)")
    return config, tuple(notes)


# --------------------------------------------------------------------------------------------
# the endpoints
# --------------------------------------------------------------------------------------------
def chat_turns(value: Any, limits: Limits, system_prompt: str) -> list[dict[str, str]]:
    """The chat's turns as {"role", "content"}; a "developer" turn is a system turn (newer OpenAI name).
    A client's system turns go by `limits.client_system` (with_client_system)."""
    if not isinstance(value, list) or not value:
        raise ApiError(
            f'messages={shown(value)} must be a non-empty list of {{"role": "user", "content": "..."}} turns',
            param="messages",
        )
    if len(value) > limits.max_messages:
        raise ApiError(
            f"messages holds {len(value)} turns, over this server's limit of {limits.max_messages}; send fewer",
            param="messages",
        )
    turns = [_turn(i, m) for i, m in enumerate(value)]
    last = turns[-1]
    if last["role"] not in ("user", "tool") or not last["content"].strip():
        raise ApiError(
            f"messages[{len(turns) - 1}] has role {last['role']} and {len(last['content'].strip())} characters of "
            "text: the last turn must be a non-empty user turn or a tool's result (the reply answers it)",
            param="messages",
        )
    turns = with_client_system(turns, limits.client_system, system_prompt)
    try:
        conversation(turns, system_prompt)  # the loop's own check
    except InputError as err:
        raise ApiError(clip(str(err)), param="messages") from None
    return turns


TURN_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}


def _turn(i: int, m: Any) -> dict[str, Any]:
    """One turn as {"role", "content"}; an assistant turn's `tool_calls` (content may then be null) and a tool
    turn's `tool_call_id` are kept. A tool's result is untrusted text, like memory and web pages."""
    param = f"messages[{i}]"
    if not isinstance(m, dict) or set(m) - TURN_KEYS:
        extra = sorted(set(m) - TURN_KEYS) if isinstance(m, dict) else None
        raise ApiError(
            f"{param}={shown(m)} must be {{'role', 'content'}}" + (f"; drop {_names(extra)}" if extra else ""),
            param=param,
        )
    role = "system" if m.get("role") == "developer" else m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ApiError(
            f"{param}.role={shown(m.get('role'))}: use system, developer, user, assistant or tool",
            param=f"{param}.role",
        )
    calls = m.get("tool_calls")
    if calls is not None and role != "assistant":
        raise ApiError(f"{param}.tool_calls: only an assistant turn holds tool calls", param=f"{param}.tool_calls")
    content = m.get("content")
    if content is None and role == "assistant" and calls:
        content = ""
    turn: dict[str, Any] = {"role": role, "content": _text(content, f"{param}.content")}
    if calls:
        turn["tool_calls"] = _turn_calls(calls, f"{param}.tool_calls")
    if role == "tool":
        call = m.get("tool_call_id")
        if not isinstance(call, str) or not call or len(call) > 256:
            raise ApiError(
                f"{param}.tool_call_id={shown(call)} must name the call this result answers (its id)",
                param=f"{param}.tool_call_id",
            )
        turn["tool_call_id"] = call
    return turn


def _turn_calls(value: Any, param: str) -> list[dict[str, Any]]:
    """An assistant turn's earlier calls, as OpenAI sends them (arguments as JSON text of an object)."""
    example = '[{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]'
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ApiError(f"{param}={shown(value)} must be a list of calls, e.g. {example}", param=param)
    out = []
    for j, call in enumerate(value):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ApiError(f"{where}={shown(call)} must be a function call, e.g. {example}", param=where)
        name_ = _function_name(function, where)
        arguments = function.get("arguments", "{}")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ApiError(
                f"{where}.function.arguments={shown(arguments)} must be the JSON text of an object, e.g. "
                '"{\\"city\\": \\"Paris\\"}"',
                param=f"{where}.function.arguments",
            )
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ApiError(f"{where}.id={shown(call_id)} must be a string", param=f"{where}.id")
        out.append(
            {"id": call_id or f"call_{j}", "type": "function", "function": {"name": name_, "arguments": arguments}}
        )
    return out


def _function_name(function: dict, where: str) -> str:
    """A tool's or an earlier call's function name, by OpenAI's rule."""
    name_ = function.get("name")
    if not isinstance(name_, str) or not TOOL_NAME.fullmatch(name_):
        raise ApiError(
            f"{where}.function.name={shown(name_)} must be 1 to 64 letters, digits, _ or - (OpenAI's rule)",
            param=f"{where}.function.name",
        )
    return name_


def tools_of(body: dict) -> tuple[tuple[dict[str, Any], ...], str, bool]:
    """(tools, tool_choice, parallel_tool_calls) of a chat request, checked. tool_choice is "auto", "none",
    "required" or one offered function's name."""
    value = body.get("tools")
    example = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]'
    if value is None:
        value = []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ApiError(
            f"tools={shown(value)} must be a list of at most {MAX_TOOLS} tools, e.g. {example}", param="tools"
        )
    names: list[str] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or set(tool) - {"type", "function"}:
            raise ApiError(f"{where}={shown(tool)} must be a function tool, e.g. {example[1:-1]}", param=where)
        extra = set(function) - {"name", "description", "parameters", "strict"}
        if extra:
            raise ApiError(f"{where}.function: unknown key(s) {_names(sorted(extra))}; drop them", param=where)
        name_ = _function_name(function, where)
        if name_ in names:
            raise ApiError(f"{where}.function.name={shown(name_)} is offered twice; name each tool once", param=where)
        if not isinstance(function.get("description", ""), str):
            raise ApiError(f"{where}.function.description must be a string", param=f"{where}.function.description")
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(
                f'{where}.function.parameters must be a JSON schema object, e.g. {{"type": "object"}}',
                param=f"{where}.function.parameters",
            )
        names.append(name_)
    choice = _tool_choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(f"parallel_tool_calls={shown(parallel)} must be true or false", param="parallel_tool_calls")
    return tuple(value), choice, parallel is not False


def _tool_choice(value: Any, names: list[str]) -> str:
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        if value == "required" and not names:
            raise ApiError("tool_choice=required needs tools to choose from; send tools", param="tool_choice")
        return cast(str, value)
    function = value.get("function") if isinstance(value, dict) else None
    chosen = function.get("name") if isinstance(function, dict) else None
    if not isinstance(chosen, str) or value.get("type") != "function":
        raise ApiError(
            f'tool_choice={shown(value)} must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": "..."}}',
            param="tool_choice",
        )
    if chosen not in names:
        raise ApiError(
            f"tool_choice names {shown(chosen)}, which is not among the tools sent; send it in tools",
            param="tool_choice",
        )
    return chosen


def with_client_system(turns: list[dict[str, str]], policy: str, system_prompt: str) -> list[dict[str, str]]:
    """The chat with the client's system (and developer) turns under the operator's rule:

    - "append" (default): one system turn first, the server's prompt, a blank line, then the client's
      system texts in order (each separated by a blank line); the server's prompt stays first.
    - "replace": one system turn first holding only the client's texts (the server's prompt is dropped).
    - "refuse": a client system turn is a 400.
    A chat without system turns is left as it is (the loop puts the server's prompt first)."""
    own = [i for i, t in enumerate(turns) if t["role"] == "system"]
    if not own:
        return turns
    if policy == "refuse":
        raise ApiError(
            f"messages[{own[0]}] is a system (or developer) turn: this server keeps its own system prompt and "
            "refuses a client's; put the instruction in the user turn",
            param=f"messages[{own[0]}].role",
            code="system_turn_refused",
        )
    texts = [turns[i]["content"] for i in own]
    if policy == "append":
        texts = [t for t in (system_prompt, *texts) if t.strip()]
    rest = [t for t in turns if t["role"] != "system"]
    if not texts:
        return rest
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


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
    request = _gate_request("chat", body, base, limits, messages, logprobs, top, detect_only)
    tools, choice, parallel = tools_of(body)
    output = response_format_of(body.get("response_format"), "response_format")
    if output is not None and tools and choice != "none":
        raise ApiError(
            "tools and response_format together are not served (the grammar holds the whole reply to the JSON "
            "format, so no call could open); send one of them",
            param="response_format",
        )
    return replace(request, tools=tools, tool_choice=choice, parallel_tool_calls=parallel, response_format=output)


def response_format_of(value: Any, param: str, responses: bool = False) -> ResponseFormat | None:
    """OpenAI's response_format (chat: {"type", "json_schema": {"name", "schema", "strict"}}) or a Responses
    request's text.format (the same keys, flat): None for text, else the checked format."""
    if value is None or value == {"type": "text"}:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    example = (
        '{"type": "json_schema", "name": "answer", "schema": {"type": "object", ...}}'
        if responses
        else '{"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", ...}}}'
    )
    if kind == "json_object" and set(value) == {"type"}:
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise ApiError(
            f'{param}={shown(value)} must be {{"type": "text"}}, {{"type": "json_object"}} or {example}', param=param
        )
    spec = value if responses else value.get("json_schema")
    where = param if responses else f"{param}.json_schema"
    if not isinstance(spec, dict):
        raise ApiError(f"{where} must be an object with name and schema, e.g. {example}", param=where)
    extra = set(spec) - {"name", "schema", "strict", "description"} - ({"type"} if responses else set())
    if extra:
        raise ApiError(f"{where}: unknown key(s) {_names(sorted(extra))}; drop them", param=where)
    name_ = spec.get("name")
    if not isinstance(name_, str) or not TOOL_NAME.fullmatch(name_):
        raise ApiError(
            f"{where}.name={shown(name_)} must be 1 to 64 letters, digits, _ or - (OpenAI's rule)",
            param=f"{where}.name",
        )
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise ApiError(f"{where}.schema={shown(schema)} must be a JSON schema object", param=f"{where}.schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(f"{where}.strict={shown(strict)} must be true or false", param=f"{where}.strict")
    output = ResponseFormat("json_schema", schema, name_, bool(strict))
    try:
        output.gbnf()  # a schema llama.cpp's converter cannot take is the client's to fix, before any decoding
    except InputError as err:
        raise ApiError(str(err)[:600], param=f"{where}.schema") from None
    return output


def parse_completion(
    body: dict, base: Config, limits: Limits, served: tuple[str, ...], detect_only: bool = False
) -> GateRequest:
    """POST /v1/completions: the prompt is continued as raw text, with no chat template (as OpenAI and vLLM
    serve it): a string, or token ids; a list holding one of either. The arms' question is the prompt.
    `echo` puts the prompt before the reply's text. A backend that writes chat replies only (a chat API) gets
    the prompt as a user turn instead (Server.completion_for says so in the notes)."""
    check_fields(body, COMPLETION_FIELDS)
    check_model(body, served)
    prompt = completion_prompt(body.get("prompt"))
    echo = _bool(body, "echo")
    top = _int(body, "logprobs", 0, 5)
    if echo and top is not None:
        raise ApiError(
            "echo=true with logprobs: the prompt's own logprobs are not computed here; drop echo or logprobs",
            param="echo",
        )
    text = prompt if isinstance(prompt, str) else ""  # token ids: their text is the backend's (Server.continuation)
    messages = [{"role": "user", "content": text or "(token ids)"}]
    request = _gate_request("completion", body, base, limits, messages, top is not None, top or 0, detect_only)
    ids = tuple(prompt) if isinstance(prompt, list) else None
    return replace(request, continuation=Continuation(text, ids), echo=echo)


def completion_prompt(value: Any) -> str | list[int]:
    """A completion's one prompt: a non-empty string or a non-empty list of token ids, alone or in a list of one.
    Several prompts are refused: the gate writes one reply a request (as with n=1)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise ApiError(
            f"prompt holds {len(value)} prompts: one prompt a request is served (the gate writes one reply a "
            "request, as with n=1); send each prompt in its own request",
            param="prompt",
        )
    if isinstance(value, str) and value.strip():
        return value  # its length is bounded by the body's and checked against the context (check_context)
    if isinstance(value, list) and value and all(type(t) is int and t >= 0 for t in value):
        return value
    raise ApiError(
        f"prompt={shown(value)} must be a non-empty string or a non-empty list of token ids (integers >= 0)",
        param="prompt",
    )


def parse_responses(
    body: dict, base: Config, limits: Limits, served: tuple[str, ...], detect_only: bool = False
) -> GateRequest:
    """POST /v1/responses: `input` (a string, or message items) and `instructions` as the chat; the reply is
    one output_text message. `max_output_tokens` is max_tokens."""
    check_names(body, RESPONSES_FIELDS, RESPONSES_UNSERVED, RESPONSES_IGNORED, (None, [], {}, False))
    check_model(body, served)
    text = body.get("text")
    if text is not None and (not isinstance(text, dict) or set(text) - {"format", "verbosity"}):
        raise ApiError(f'text={shown(text)} must be {{"format": {{...}}}}', param="text")
    output = response_format_of((text or {}).get("format"), "text.format", responses=True)
    tools, choice, parallel = tools_of(responses_tools(body))
    if output is not None and tools and choice != "none":
        raise ApiError(
            "tools and text.format together are not served (the grammar holds the whole reply to the JSON format, "
            "so no call could open); send one of them",
            param="text.format",
        )
    turns = response_turns(body.get("input"), body.get("instructions"))
    messages = chat_turns(turns, limits, base.system_prompt)
    chat_like = {k: v for k, v in body.items() if k not in ("max_output_tokens", "stream_options")}
    if body.get("max_output_tokens") is not None:
        chat_like["max_tokens"] = body["max_output_tokens"]
    request = _gate_request("responses", chat_like, base, limits, messages, False, 0, detect_only)
    return replace(request, response_format=output, tools=tools, tool_choice=choice, parallel_tool_calls=parallel)


def responses_tools(body: dict) -> dict[str, Any]:
    """A Responses request's tools and tool_choice in the chat form `tools_of` checks: a function tool is
    {"type": "function", "name", "description", "parameters", "strict"} there, nested under "function" here.
    Built-in tools (web search, file search, computer use...) are the provider's own: a 400 naming them."""
    value = body.get("tools")
    chat: dict[str, Any] = {k: body[k] for k in ("tool_choice", "parallel_tool_calls") if k in body}
    if isinstance(value, list):
        tools: list[Any] = []
        for i, tool in enumerate(value):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ApiError(
                    f"tools[{i}]={shown(tool)}: only function tools are served"
                    + (f" ({shown(kind)} is a provider's built-in tool)" if isinstance(kind, str) else "")
                    + '; send {"type": "function", "name": "...", "parameters": {...}}',
                    param=f"tools[{i}]",
                )
            tools.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
        value = tools
    chat["tools"] = value
    choice = chat.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return chat


def response_turns(value: Any, instructions: Any) -> list[dict[str, Any]]:
    """The chat from a Responses request: `instructions` first as a system turn (the server's rule for a
    client's system text applies), then `input`: a string is one user turn; a list holds message items
    ({"role", "content": a string or input_text/output_text parts})."""
    turns: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(f"instructions={shown(instructions)} must be a string", param="instructions")
        if instructions.strip():
            turns.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        return [*turns, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(
            f'input={shown(value)} must be a string or a non-empty list of {{"role": "user", "content": "..."}} items',
            param="input",
        )
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
            _add_call_turn(turns, item, param)
            continue
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            kind = item.get("type") if isinstance(item, dict) else None
            raise ApiError(
                f"{param}={shown(item)}: only message items are served"
                + (f" ({kind} items are not)" if isinstance(kind, str) else "")
                + '; send {"role": "user", "content": "..."}',
                param=param,
            )
        content = item.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                    raise ApiError(
                        f"{param}.content[{j}]={shown(part)}: only text parts are served; send "
                        '{"type": "input_text", "text": "..."}',
                        param=f"{param}.content[{j}]",
                    )
                texts.append({"type": "text", "text": part.get("text")})
            content = texts
        turns.append({"role": item["role"], "content": content})
    return turns


def _add_call_turn(turns: list[dict[str, Any]], item: dict, param: str) -> None:
    """A Responses function_call item as the chat's assistant turn calling it (calls in a row, and an assistant
    message right before them, make one turn), or a function_call_output as the tool's turn."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(f"{param}.call_id={shown(call_id)} must be the call's id (a string)", param=f"{param}.call_id")
    if item["type"] == "function_call_output":
        turns.append({"role": "tool", "tool_call_id": call_id, "content": item.get("output")})
        return
    function = {"name": item.get("name"), "arguments": item.get("arguments")}
    call = {"id": call_id, "type": "function", "function": function}
    if turns and turns[-1].get("role") == "assistant":  # calls go on the assistant turn they follow
        turns[-1] = {**turns[-1], "tool_calls": [*(turns[-1].get("tool_calls") or []), call]}
    else:
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})


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
    overrides = sampling_overrides(body, limits) | gate_overrides(body, limits, base)
    config, notes = request_config(base, overrides, top, logprobs, detect_only, limits.max_grounding_s)
    request = GateRequest(endpoint, messages, config, stream, include_usage, logprobs, top, stop, overrides, notes)
    return replace(request, events=gate_events(body))

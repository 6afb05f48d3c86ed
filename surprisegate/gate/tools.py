"""Tool calls: the tools a chat offers, rendered by the model's own template, and the calls a reply makes.

A model writes a call in its template family's own format. This module reads the Hermes family
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Qwen2.5, Hermes 2 and 3 and the templates that
name `<tool_call>`), as llama.cpp's server and vLLM's `hermes` parser do. A template that offers tools in
another format is said to be unsupported rather than guessed at.

Where the gate stops: it grounds the reply's prose. Once a call opens, the rest is arguments for the
client's own code, so a rewrite there would change what runs, not what is claimed: the arguments are scored
(their surprise goes in the receipt) but never rewound.

Everything a client sends here (tool definitions, earlier calls' arguments, tool results) is data: the
renderer wraps what `tojson` writes in DATA marks, and prompting tokenizes it without special tokens.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import InputError
from .prompting import DATA_CLOSE, DATA_OPEN, has_tool_turns, unmark

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's own rule for function names


@dataclass(frozen=True)
class ToolFormat:
    """How one template family writes a call: between `open` and `close`, a JSON object of name and arguments."""

    family: str
    open: str
    close: str

    def opening(self, name: str | None = None) -> str:
        """The text a forced call starts with (tool_choice required, or one named function). It goes as far
        as the name's opening quote: after `<tool_call>` and a newline alone, Qwen2.5-Coder-0.5B ends its turn."""
        return self.open + '\n{"name": "' + ("" if name is None else name + '", "arguments": ')


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class CallWatch:
    """Whether a reply has opened a tool call (a forced call is open from its start). The loop grounds nothing
    after that: the rest is arguments, scored but never rewound. Without tools: never."""

    tools: ToolUse | None = None

    def opened(self, reply: Any) -> bool:
        if self.tools is None:
            return False
        return bool(self.tools.opening) or self.tools.format.open in reply.text()


@dataclass(frozen=True)
class ToolUse:
    """The tools one reply may call: their definitions (as the client sent them), the model's call format,
    `choice` ("auto", "required" or one function's name: a forced call starts with its opening) and whether
    several calls may come at once."""

    tools: tuple[dict[str, Any], ...]
    format: ToolFormat
    choice: str = "auto"
    parallel: bool = True

    @property
    def opening(self) -> str:
        if self.choice == "auto":
            return ""
        return self.format.opening(None if self.choice == "required" else self.choice)

    @property
    def stops(self) -> tuple[str, ...]:
        """One call only: the reply ends where the first call closes."""
        return () if self.parallel else (self.format.close,)

    def call_grammar(self) -> str | None:
        """GBNF for what follows a forced call's opening (None when no call is forced): an offered function's
        name (or the named one's arguments), arguments that fit its parameters' schema and the object's close;
        then the call's closing tag, which may be left off at the end of the turn (llama.cpp's parser closes
        such a call too), and more whole calls where parallel calls are allowed. llama.cpp's server holds a
        forced call to such a grammar; without one, Qwen2.5-Coder-0.5B named a function never offered."""
        if self.choice == "auto":
            return None
        from llama_cpp.llama_grammar import SchemaConverter

        converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        bodies = {}
        for i, tool in enumerate(self.tools):
            function = tool["function"]
            schema = converter.resolve_refs(function.get("parameters") or {"type": "object"}, f"tool{i}")
            bodies[function["name"]] = converter.visit(schema, f"args{i}")
        converter._add_rule("call-ws", "[ \\t\\n]{0,8}")
        converter._add_rule("call-close", f"call-ws {json.dumps(self.format.close)}")
        if self.choice != "required":  # one named function: its arguments follow the opening
            converter._add_rule("root", f'{bodies[self.choice]} call-ws "}}" call-close?')
            return converter.format_grammar()
        after_name = '", "arguments": '
        named = " | ".join(f"{json.dumps(name + after_name)} {rule}" for name, rule in bodies.items())
        converter._add_rule("call", f'({named}) call-ws "}}"')
        name_opens = json.dumps('{"name": "')
        again = f"call-close call-ws {json.dumps(self.format.open)} call-ws {name_opens}"
        converter._add_rule("root", f"call ({again} call)* call-close?" if self.parallel else "call call-close?")
        return converter.format_grammar()


def tool_format(template: str | None) -> ToolFormat | None:
    """The call format of a chat template, or None when it offers no tools (or offers them in a format this
    module cannot read). A template offers tools when it renders the `tools` variable (as minja's probe finds)."""
    if not template or not re.search(r"\btools\b", template):
        return None
    return HERMES if HERMES.open in template else None


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------
class ToolTemplate:
    """A chat template compiled once, rendered with `tools` and tool turns (as transformers and minja do:
    sandboxed, trim_blocks and lstrip_blocks, `tojson` without HTML escaping). With `mark_data`, what
    `tojson` writes (the client's tool definitions and arguments) is wrapped in DATA marks."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _marked_json
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template)
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        mark_data: bool = False,
    ) -> str:
        from jinja2.exceptions import TemplateError

        turns = [template_turn(m) for m in messages]
        offered = [dict(t) for t in tools] if tools else None
        try:
            text = self._template.render(
                messages=turns, tools=offered, add_generation_prompt=add_generation_prompt, **self._tokens
            )
        except TemplateError as err:  # the template's own raise_exception, or a chat shape it cannot render
            raise InputError(
                f"the model's chat template cannot render this chat with tools ({str(err)[:200]}); "
                "send the turns in the order the model expects (user, assistant with tool_calls, tool results)"
            ) from None
        return text if mark_data else unmark(text)


class ToolRendering:
    """A model's chat template rendered with tools, for the backends that render it themselves (llama.cpp in
    process, llama.cpp's server): a chat with tools or tool turns goes through `ToolTemplate` (compiled once,
    from the class's `_tool_template_parts`), any other through the class's own `_plain_chat_prompt`."""

    _chat_template: str | None
    _tools_template: ToolTemplate | None = None

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Any = None,
        mark_data: bool = False,
    ) -> str:
        if tools or mark_data or has_tool_turns(messages):
            return self._tool_template().render(messages, add_generation_prompt, tools, mark_data)
        return self._plain_chat_prompt(messages, add_generation_prompt)

    @property
    def tool_format(self) -> ToolFormat | None:
        """How this model writes a tool call (its template's family); None: it offers no tools."""
        return tool_format(self._chat_template)

    def _tool_template(self) -> ToolTemplate:
        if self._tools_template is None:
            self._tools_template = ToolTemplate(*self._tool_template_parts())
        return self._tools_template

    def _tool_template_parts(self) -> tuple[str, str, str]:
        """(template, bos text, eos text); a BackendError naming the model where it has no template."""
        raise NotImplementedError

    def _plain_chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        raise NotImplementedError


def _marked_json(value: Any, indent: int | None = None, **_: Any) -> str:
    return DATA_OPEN + json.dumps(value, ensure_ascii=False, indent=indent) + DATA_CLOSE


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def template_turn(m: Mapping[str, Any]) -> dict[str, Any]:
    """A turn as templates read it: an earlier call's `arguments` as an object (templates `tojson` them),
    as llama.cpp's server hands them over."""
    turn = dict(m)
    calls = m.get("tool_calls")
    if calls:
        turn["tool_calls"] = [_call_for_template(c) for c in calls]
    return turn


def _call_for_template(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # wire.py refuses these; a library caller's text is rendered as it is
    return {**call, "function": function}


# --------------------------------------------------------------------------------------------
# parsing a reply
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One call the reply makes, as OpenAI's `tool_calls[i]`; `start`/`end` are its characters in the reply."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    start: int
    end: int

    def wire(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ParsedReply:
    """The reply as content and calls. A block that does not parse as a call stays in the content, word for word."""

    content: str
    calls: tuple[ToolCall, ...]
    unparsed: int = 0


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_tool_calls(
    text: str, fmt: ToolFormat, parallel: bool = True, new_id: Callable[[], str] = call_id
) -> ParsedReply:
    """The calls in `text` (a reply the model wrote): every `open … close` block holding a JSON object with a
    string `name` and object (or JSON-text) `arguments`; a last block cut off before `close` counts when its JSON
    is whole, or whole once the brackets it left open are closed. With `parallel` False only the first call is
    kept (the rest stays out of the reply)."""
    calls: list[ToolCall] = []
    content, at, unparsed = [], 0, 0
    for start, end, body, cut_off in _blocks(text, fmt):
        parsed = _call(body, heal=cut_off)
        if parsed is None:
            unparsed += 1
            continue
        content.append(text[at:start])
        at = end
        if parallel or not calls:
            calls.append(ToolCall(new_id(), parsed[0], parsed[1], start, end))
    content.append(text[at:])
    return ParsedReply("".join(content).strip() if calls else text, tuple(calls), unparsed)


def _blocks(text: str, fmt: ToolFormat) -> Iterator[tuple[int, int, str, bool]]:
    """Each `open … close` block: (start, end, the text between, cut off before its close). A block whose JSON
    object is whole ends at the close after it, so a close tag inside an argument's string stays in it (vLLM's
    `hermes` regex would cut there); otherwise it ends at the next close, or at the end of the text."""
    decoder = json.JSONDecoder()
    at = text.find(fmt.open)
    while at >= 0:
        inside = at + len(fmt.open)
        body_at = len(text) - len(text[inside:].lstrip()) if text[inside:].strip() else len(text)
        try:
            _, object_end = decoder.raw_decode(text, body_at)
        except json.JSONDecodeError:
            object_end = -1
        after = text[object_end:].lstrip() if object_end >= 0 else ""
        if object_end >= 0 and after.startswith(fmt.close):
            end = len(text) - len(after) + len(fmt.close)
            yield at, end, text[inside:object_end], False
        else:
            close = text.find(fmt.close, inside)
            end = len(text) if close < 0 else close + len(fmt.close)
            yield at, end, text[inside : close if close >= 0 else len(text)], close < 0
        at = text.find(fmt.open, end)


def _call(body: str, heal: bool = False) -> tuple[str, str] | None:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError:
        closed = closing(body) if heal else None
        if closed is None:
            return None
        try:
            value = json.loads(body.strip() + closed)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def closing(text: str) -> str | None:
    """The brackets that close what `text` left open, outside strings (the model ended its turn one `}` short
    of a whole call, as llama.cpp's server heals it); None inside a string or with a stray closer."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
    return None if in_string or not stack else "".join(reversed(stack))


def call_scores(call: ToolCall, pieces: Sequence[str], surprises: Sequence[float]) -> dict[str, Any]:
    """A call's record for the receipt: its name and arguments, and the surprise of the tokens that wrote
    it (scored, never rewound)."""
    at, tokens, inside = 0, 0, []
    for piece, surprise in zip(pieces, surprises, strict=False):
        if at < call.end and at + len(piece) > call.start and piece:
            tokens += 1
            inside += [surprise] if math.isfinite(surprise) else []  # unscored (mode off): NaN
        at += len(piece)
    return {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "tokens": tokens,
        "surprise_mean": round(sum(inside) / len(inside), 4) if inside else None,
        "surprise_max": round(max(inside), 4) if inside else None,
    }

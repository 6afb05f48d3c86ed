"""Prompt layout and the grounding segment, built from the model's own chat template.

The segment for `system_turn` injection closes the assistant turn, adds a system turn holding the
evidence and reopens the assistant turn (DESIGN.md §2: on SmolLM2-135M this beat an inline
`[evidence: ...]` line, 0.84 vs 0.63 accuracy with gold evidence). Pieces are found by diffing renders
of the template, so any prefix-stable chat template works without knowing its tokens by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError, InputError
from ..text import current_sentence

ROLES = ("system", "user", "assistant", "tool")
Tokenize = Callable[..., list[int]]  # backend.tokenize(text, special=False)
# A render may wrap data it wrote itself (the JSON of a client's tools and call arguments: tools.py) in
# these marks: that text is tokenized plain, like message contents.
DATA_OPEN, DATA_CLOSE = "\x00D\x00", "\x00d\x00"


def chat_messages(question: str, system_prompt: str = "") -> list[dict[str, str]]:
    """The messages of a one-question chat (the `ask` form)."""
    if not isinstance(question, str) or not question.strip():
        raise InputError(
            'question is empty; pass the question to ask, e.g. surprisegate ask "What is the capital of Chad?"'
        )
    return conversation([{"role": "user", "content": question.strip()}], system_prompt)


def conversation(messages: Sequence[dict[str, str]] | str, system_prompt: str = "") -> list[dict[str, str]]:
    """Checked chat messages, with the configured system prompt first unless the chat brings its own.
    A string is one user question. The last turn must be the user's: it is what the reply answers."""
    if isinstance(messages, str):
        return chat_messages(messages, system_prompt)
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError(
            f"messages={messages!r} is not a chat; pass a list of "
            '{"role": "user", "content": "..."} turns (or a question string)'
        )
    checked = [_turn(i, m) for i, m in enumerate(messages)]
    last = checked[-1]
    if last["role"] not in ("user", "tool") or not last["content"].strip():
        raise InputError(
            f"messages[-1]={last!r} must be a non-empty user turn (or a tool's result): the reply answers it"
        )
    if not any(m["role"] == "user" for m in checked):
        raise InputError("messages has no user turn: the arms ground the user's question; add it")
    if system_prompt and checked[0]["role"] != "system":
        checked.insert(0, {"role": "system", "content": system_prompt})
    return checked


def _turn(i: int, m: Any) -> dict[str, Any]:
    """One checked turn: role and text, and for tool use the assistant's `tool_calls` or a tool turn's
    `tool_call_id` (wire.py checks their shape)."""
    if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
        raise InputError(
            f'messages[{i}]={m!r} is not a chat turn; use {{"role": one of {", ".join(ROLES)}, "content": text}}'
        )
    turn = {"role": m["role"], "content": m["content"]}
    if m["role"] == "assistant" and m.get("tool_calls"):
        turn["tool_calls"] = m["tool_calls"]
    if m["role"] == "tool" and m.get("tool_call_id") is not None:
        turn["tool_call_id"] = m["tool_call_id"]
    return turn


def has_tool_turns(messages: Sequence[Any]) -> bool:
    """Whether the chat holds a tool's result or an assistant turn that called tools."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


@dataclass(frozen=True)
class Continuation:
    """A raw prompt the reply continues, with no chat template (POST /v1/completions): the client's text,
    tokenized plain like every message (never special tokens), or the client's own token ids. The arms'
    question is the prompt; evidence goes in inline (a raw text has no turns to put a system turn between)."""

    text: str
    token_ids: tuple[int, ...] | None = None  # sent as ids: fed as they are (`text` is their decoding)

    @property
    def messages(self) -> list[dict[str, str]]:
        """What a receipt records of it: one turn of role "prompt"."""
        return [{"role": "prompt", "content": self.text}]


def last_user_turn(messages: Sequence[dict[str, str]] | Continuation) -> str:
    """The question the reply answers: the last user turn's text (a raw prompt's whole text)."""
    if isinstance(messages, Continuation):
        return messages.text.strip()
    return next(m["content"] for m in reversed(messages) if m["role"] == "user").strip()


def render_pieces(render, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[tuple[str, bool]]:
    """The rendered prompt as (text, is_template) pieces: each message's content stands apart from the
    template around it, so only the template's own text may become control tokens (DESIGN §8)."""
    # An empty content (an assistant turn that only calls tools) has nothing to protect and no marker: a
    # template may skip it (`if message.content`).
    markers = [f"\x00C{i}\x00" if m["content"] else "" for i, m in enumerate(messages)]
    rendered = render([{**m, "content": mk} for m, mk in zip(messages, markers, strict=True)], add_generation_prompt)
    pieces: list[tuple[str, bool]] = []
    for m, marker in zip(messages, markers, strict=True):
        if not marker:
            continue
        before, found, rendered = rendered.partition(marker)
        if not found:
            raise BackendError("the chat template rewrites message contents; use a template that inserts them verbatim")
        pieces += [*data_pieces(before), (m["content"], False)]
    pieces += data_pieces(rendered)
    return [(text, is_template) for text, is_template in pieces if text]


def data_pieces(text: str) -> list[tuple[str, bool]]:
    """Template text as (text, is_template) pieces: what stands between DATA marks is data."""
    pieces: list[tuple[str, bool]] = []
    while DATA_OPEN in text:
        before, _, rest = text.partition(DATA_OPEN)
        data, found, text = rest.partition(DATA_CLOSE)
        if not found:
            raise BackendError("the chat template cut a data mark in two; use a template that inserts JSON whole")
        pieces += [(before, True), (data, False)]
    return [*pieces, (text, True)]


def unmark(text: str) -> str:
    """The rendered text with the DATA marks taken out (the text as the model reads it)."""
    return text.replace(DATA_OPEN, "").replace(DATA_CLOSE, "")


def unmarked(render):
    """`render` with the DATA marks taken out."""

    def clean(messages, add_generation_prompt):
        return unmark(render(messages, add_generation_prompt))

    return clean


def encode(tokenize: Tokenize, pieces: Sequence[tuple[str, bool]]) -> list[int]:
    """Token ids of (text, is_template) pieces: template text with special tokens, the rest plain."""
    ids: list[int] = []
    for text, is_template in pieces:
        ids += tokenize(text, special=is_template)
    return ids


def _strip_prefix(full: str, prefix: str, what: str) -> str:
    if not full.startswith(prefix):
        raise BackendError(
            f"the chat template is not prefix-stable when adding {what}; use injection='inline' for this model"
        )
    return full[len(prefix) :]


@dataclass(frozen=True)
class PromptLayout:
    """The prompt split where the reply starts, plus the template pieces a grounding segment needs."""

    body: str  # everything before the assistant turn opens
    body_pieces: tuple[tuple[str, bool], ...]  # the same as (text, is_template) pieces
    open_assistant: str  # e.g. "<|im_start|>assistant\n"
    close_assistant: str  # e.g. "<|im_end|>\n"
    system_turn_prefix: str  # text before the evidence in a system turn, e.g. "<|im_start|>system\n"
    system_turn_suffix: str  # e.g. "<|im_end|>\n"

    @classmethod
    def from_template(cls, render, messages: list[dict[str, str]]) -> PromptLayout:
        """`render(messages, add_generation_prompt)` is the backend's chat_prompt (it may mark data)."""
        marked, render = render, unmarked(render)
        body = render(messages, False)
        with_gen = render(messages, True)
        open_assistant = _strip_prefix(with_gen, body, "the generation prompt")
        marker = "\x00REPLY\x00"
        closed = render(messages + [{"role": "assistant", "content": marker}], False)
        after_reply = _strip_prefix(closed, with_gen, "an assistant message")
        if not after_reply.startswith(marker):
            raise BackendError("the chat template rewrites assistant messages; use injection='inline' for this model")
        close_assistant = after_reply[len(marker) :]
        sys_marker = "\x00EVIDENCE\x00"
        with_system = render(
            messages + [{"role": "assistant", "content": marker}, {"role": "system", "content": sys_marker}], False
        )
        system_turn = _strip_prefix(with_system, closed, "a system message")
        if sys_marker not in system_turn:
            raise BackendError("the chat template drops later system messages; use injection='inline' for this model")
        pre, post = system_turn.split(sys_marker, 1)
        # A template that trims contents renders them trimmed in `body`; the pieces keep them verbatim.
        pieces = tuple(render_pieces(marked, messages, False))
        return cls(body, pieces, open_assistant, close_assistant, pre, post)

    def body_tokens(self, tokenize: Tokenize) -> list[int]:
        return encode(tokenize, self.body_pieces)

    def open_tokens(self, tokenize: Tokenize) -> list[int]:
        return tokenize(self.open_assistant, special=True)

    def segment_tokens(self, tokenize: Tokenize, evidence_text: str, injection: str) -> list[int]:
        """Token ids of `segment`: the evidence (from outside) as plain text, the template's pieces special.
        `system_turn` is the system turn only: the caller opens the assistant turn after it."""
        if injection == "inline":
            return encode(tokenize, [(f" [evidence: {evidence_text}] ", False)])
        turn = [(self.system_turn_prefix, True), (evidence_text, False), (self.system_turn_suffix, True)]
        if injection == "system_turn":
            return encode(tokenize, turn)
        return encode(tokenize, [(self.close_assistant, True), *turn, (self.open_assistant, True)])

    @property
    def prompt(self) -> str:
        return self.body + self.open_assistant

    def segment(self, evidence_text: str, injection: str) -> str:
        """Text put into the context (never into the visible reply) before the kept prefix is re-fed."""
        if injection == "inline":
            return f" [evidence: {evidence_text}] "
        # close_reopen: close the assistant turn, a system turn, reopen (the kept prefix is re-fed after).
        return (
            self.close_assistant
            + self.system_turn_prefix
            + evidence_text
            + self.system_turn_suffix
            + self.open_assistant
        )


@dataclass(frozen=True)
class ReplyPrompt:
    """One reply's prompt as tokens: the chat's body, the open assistant turn and a cloze prefix (the user's
    text: plain tokens, like every message), and how an evidence segment goes in after it."""

    layout: PromptLayout
    body: list[int]
    open: list[int]
    prefix: list[int]
    lead: list[int] | None = None  # a raw prompt's unfinished last sentence, said again after evidence (None: a chat)

    @classmethod
    def build(
        cls, backend, messages: list[dict[str, Any]] | Continuation, assistant_prefix: str, tools: Any = None
    ) -> ReplyPrompt:
        """`backend` renders (`chat_prompt`) and tokenizes: a server may fail here, and the receipt says so.
        `tools` (a tools.ToolUse) offers tools; a forced call's opening (our text) comes before the prefix."""
        if isinstance(messages, Continuation):
            return cls.continuing(backend, messages, assistant_prefix)
        render = backend.chat_prompt
        if tools is not None or has_tool_turns(messages):
            if not getattr(backend, "renders_tools", False):
                raise BackendError(
                    f"backend {getattr(backend, 'name', type(backend).__name__)!r} cannot render tools or tool "
                    "turns; use the llamacpp backend with a model whose chat template offers tools"
                )

            def render(msgs, add_generation_prompt):
                offered = tools.tools if tools is not None else None
                return backend.chat_prompt(msgs, add_generation_prompt, tools=offered, mark_data=True)

        layout = PromptLayout.from_template(render, messages)
        opening = backend.tokenize(tools.opening, special=True) if tools is not None and tools.opening else []
        prefix = opening + (backend.tokenize(assistant_prefix) if assistant_prefix else [])
        return cls(layout, layout.body_tokens(backend.tokenize), layout.open_tokens(backend.tokenize), prefix)

    @classmethod
    def continuing(cls, backend, prompt: Continuation, assistant_prefix: str = "") -> ReplyPrompt:
        """A raw prompt's tokens: the model's begin-of-text token where its tokenizer adds one (as llama.cpp's
        server does for a text prompt), then the text as plain tokens; token ids are taken as sent."""
        if prompt.token_ids is not None:
            body = list(prompt.token_ids)
        else:
            body = list(getattr(backend, "begin_tokens", ())) + backend.tokenize(prompt.text)
        layout = PromptLayout(prompt.text, ((prompt.text, False),), "", "", "", "")
        prefix = backend.tokenize(assistant_prefix) if assistant_prefix else []
        unfinished = "" if prompt.text.rstrip()[-1:] in (".", "!", "?", "\n", "") else current_sentence(prompt.text)
        return cls(layout, body, [], prefix, backend.tokenize(unfinished) if unfinished else [])

    @property
    def tokens(self) -> list[int]:
        return self.body + self.open + self.prefix

    @property
    def turn_start(self) -> int:
        """Where the assistant turn's header begins."""
        return len(self.body)

    def segment(
        self, tokenize: Tokenize, injected: str, injection: str, keep: int, kept_reply: list[int]
    ) -> tuple[list[int], list[int], int | None]:
        """(evidence segment, tokens re-fed after it, where the new assistant turn starts or None) for a rewind
        that keeps `keep` context tokens and `kept_reply` of the reply. A raw prompt (`lead` set) has no
        turns: the evidence goes on a line of its own, then the unfinished sentence is said again from its start
        ("...Faso is [Kouilou dropped]\n[evidence: ...]\nThe capital of Burkina Faso is"), so the model goes on
        writing the sentence rather than whatever follows a bracket."""
        if self.lead is not None:
            line = encode(tokenize, [(f"\n[evidence: {injected}]\n", False)])
            return line, self.lead + self.prefix + kept_reply, None
        if injection == "system_turn":
            turn = self.layout.segment_tokens(tokenize, injected, "system_turn")
            return turn + self.open, self.prefix + kept_reply, keep + len(turn)
        if injection == "close_reopen":
            return self.layout.segment_tokens(tokenize, injected, "close_reopen"), self.prefix + kept_reply, None
        if injection == "sentence_turn":  # the turn closed before the doubtful sentence: its words alone re-fed
            return self.layout.segment_tokens(tokenize, injected, "close_reopen"), kept_reply, None
        return self.layout.segment_tokens(tokenize, injected, "inline"), [], None

"""Prompt layout and the grounding segment, built from the model's own chat template.

The segment for `system_turn` injection closes the assistant turn, adds a system turn holding the
evidence and reopens the assistant turn (DESIGN.md §2: on SmolLM2-135M this beat an inline
`[evidence: ...]` line, 0.84 vs 0.63 accuracy with gold evidence). Pieces are found by diffing renders
of the template, so any prefix-stable chat template works without knowing its tokens by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BackendError, InputError


def chat_messages(question: str, system_prompt: str = "") -> list[dict[str, str]]:
    if not isinstance(question, str) or not question.strip():
        raise InputError("question is empty; pass the question to ask, e.g. surprisegate ask \"What is the capital of Chad?\"")
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": question.strip()})
    return messages


def _strip_prefix(full: str, prefix: str, what: str) -> str:
    if not full.startswith(prefix):
        raise BackendError(
            f"the chat template is not prefix-stable when adding {what}; use injection='inline' for this model"
        )
    return full[len(prefix):]


@dataclass(frozen=True)
class PromptLayout:
    """The prompt split where the reply starts, plus the template pieces a grounding segment needs."""

    body: str  # everything before the assistant turn opens
    open_assistant: str  # e.g. "<|im_start|>assistant\n"
    close_assistant: str  # e.g. "<|im_end|>\n"
    system_turn_prefix: str  # text before the evidence in a system turn, e.g. "<|im_start|>system\n"
    system_turn_suffix: str  # e.g. "<|im_end|>\n"

    @classmethod
    def from_template(cls, render, messages: list[dict[str, str]]) -> "PromptLayout":
        """`render(messages, add_generation_prompt)` is the backend's chat_prompt."""
        body = render(messages, False)
        with_gen = render(messages, True)
        open_assistant = _strip_prefix(with_gen, body, "the generation prompt")
        marker = "\x00REPLY\x00"
        closed = render(messages + [{"role": "assistant", "content": marker}], False)
        after_reply = _strip_prefix(closed, with_gen, "an assistant message")
        if not after_reply.startswith(marker):
            raise BackendError("the chat template rewrites assistant messages; use injection='inline' for this model")
        close_assistant = after_reply[len(marker):]
        sys_marker = "\x00EVIDENCE\x00"
        with_system = render(messages + [{"role": "assistant", "content": marker},
                                         {"role": "system", "content": sys_marker}], False)
        system_turn = _strip_prefix(with_system, closed, "a system message")
        if sys_marker not in system_turn:
            raise BackendError("the chat template drops later system messages; use injection='inline' for this model")
        pre, post = system_turn.split(sys_marker, 1)
        return cls(body, open_assistant, close_assistant, pre, post)

    @property
    def prompt(self) -> str:
        return self.body + self.open_assistant

    def segment(self, evidence_text: str, injection: str) -> str:
        """Text put into the context (never into the visible reply) before the kept prefix is re-fed."""
        if injection == "inline":
            return f" [evidence: {evidence_text}] "
        # close_reopen: close the assistant turn, a system turn, reopen (the kept prefix is re-fed after).
        return self.close_assistant + self.system_turn_prefix + evidence_text + self.system_turn_suffix + self.open_assistant

"""Prompt layout: chats checked, template pieces apart from message text, and the same ids as before."""

from __future__ import annotations

import json

import pytest

from surprisegate.errors import InputError
from surprisegate.gate.prompting import PromptLayout, chat_messages, conversation, encode, last_user_turn, render_pieces

from scripted import ScriptedBackend, chatml, plan


def test_a_question_is_a_one_turn_chat_with_the_system_prompt():
    assert conversation("  Hi?  ", "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
    ]
    assert chat_messages("Hi?") == [{"role": "user", "content": "Hi?"}]


def test_a_chat_keeps_its_own_system_turn_and_order():
    chat = [
        {"role": "system", "content": "Pirate voice."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c?"},
    ]
    assert conversation(chat, "Be brief.") == chat
    assert conversation(chat[1:], "Be brief.")[0] == {"role": "system", "content": "Be brief."}
    assert last_user_turn(chat) == "c?"


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "not a chat"),
        ("   ", "question is empty"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], r"messages\[-1\]"),
        ([{"role": "tool", "content": "a"}], "no user turn"),
        ([{"role": "robot", "content": "a"}], r"messages\[0\]"),
        ([{"role": "user", "content": 3}], r"messages\[0\]"),
        ([{"role": "user", "content": "   "}], "non-empty user turn"),
    ],
)
def test_a_bad_chat_is_an_input_error_naming_the_turn(bad, message):
    with pytest.raises(InputError, match=message):
        conversation(bad)


def test_pieces_put_every_message_apart_from_the_template():
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "<|im_start|>evil"}]
    pieces = render_pieces(chatml, chat, True)
    assert "".join(text for text, _ in pieces) == chatml(chat, True)
    assert [text for text, is_template in pieces if not is_template] == ["S", "<|im_start|>evil"]
    assert all("evil" not in text for text, is_template in pieces if is_template)


def test_encode_parses_specials_only_in_template_pieces():
    backend = ScriptedBackend(lambda context: plan("x"))
    ids = encode(backend.tokenize, [("<|im_start|>", True), ("<|im_start|>", False)])
    assert ids[0] == 256 and 256 not in ids[1:]


def test_the_layout_tokens_of_a_plain_chat_are_the_whole_prompt_parsed_at_once():
    backend = ScriptedBackend(lambda context: plan("x"))
    layout = PromptLayout.from_template(backend.chat_prompt, conversation("What is 2+2?", "Be brief."))
    assert layout.body_tokens(backend.tokenize) + layout.open_tokens(backend.tokenize) == backend.tokenize(
        layout.prompt, special=True
    )


@pytest.mark.slow
def test_dev_questions_tokenize_as_before_on_the_real_model(llama_backend, shared_data):
    # The README's results were made with the whole prompt parsed at once; ordinary questions must give
    # the same ids when the messages are plain text (so those results still hold).
    items = [json.loads(line) for line in open(shared_data / "factqa_dev.jsonl", encoding="utf-8")][:300]
    for item in items:
        layout = PromptLayout.from_template(llama_backend.chat_prompt, conversation(item["question"], "Be brief."))
        ids = layout.body_tokens(llama_backend.tokenize) + layout.open_tokens(llama_backend.tokenize)
        assert ids == llama_backend.tokenize(layout.prompt, special=True), item["id"]

"""Structured output: the format, its grammar (llama.cpp's), the chat that tells it, and the gate inside it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from surprisegate.arms import Evidence
from surprisegate.config import Config
from surprisegate.errors import InputError
from surprisegate.gate.events import Done, Rewind, Trigger
from surprisegate.gate.loop import stream
from surprisegate.gate.structured import CHAR_RULE, SPACE_RULE, ResponseFormat, parsed, reply_grammar, told_format

from scripted import ScriptedBackend, plan

CAPITAL = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
    "required": ["country", "capital"],
    "additionalProperties": False,
}


def test_a_format_names_its_kind_and_says_itself_in_a_receipt():
    assert ResponseFormat("json_object").receipt() == {"type": "json_object"}
    fmt = ResponseFormat("json_schema", CAPITAL, "capital", strict=True)
    assert fmt.receipt() == {"type": "json_schema", "name": "capital", "strict": True}
    with pytest.raises(InputError, match="json_object, json_schema"):
        ResponseFormat("yaml")


def test_the_grammar_takes_llama_servers_space_and_char_rules():
    pytest.importorskip("llama_cpp")
    grammar = ResponseFormat("json_schema", CAPITAL).gbnf()
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines() if " ::= " in line)
    assert rules["space"] == SPACE_RULE and rules["char"] == CHAR_RULE
    assert '"\\"country\\""' in rules["country-kv"] and "root" in rules


def test_a_schema_the_converter_cannot_take_is_an_input_error_naming_it():
    pytest.importorskip("llama_cpp")
    with pytest.raises(InputError, match="json_schema=.*cannot turn it into a grammar"):
        ResponseFormat("json_schema", {"$ref": "https://example.com/remote.json"}).gbnf()


def test_the_chat_is_told_the_schema_in_its_system_turn_and_the_evidence_asks_it_to_go_on():
    config = Config()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Peru?"}]
    told, run_config = told_format(chat, ResponseFormat("json_schema", CAPITAL), config)
    assert told[0]["content"].startswith("Be brief.\n\nReply with JSON only")
    assert json.loads(told[0]["content"].split("\n", 3)[-1]) == CAPITAL
    assert told[1:] == chat[1:] and chat[0]["content"] == "Be brief."  # the caller's chat is not written
    assert run_config.evidence_template == config.sentence_evidence_template
    bare, _ = told_format(chat[1:], ResponseFormat("json_object"), config)
    assert bare[0] == {"role": "system", "content": config.json_object_template}  # no schema to copy back
    silent, _ = told_format(chat, ResponseFormat("json_schema", CAPITAL), Config(structured_output_template=""))
    assert silent == chat


def test_a_template_without_the_schema_placeholder_is_refused():
    from surprisegate.config import load_config
    from surprisegate.errors import ConfigError

    with pytest.raises(ConfigError, match="structured_output_template.*{schema}"):
        load_config(None, {"structured_output_template": "JSON please"}, env={})


def test_a_backend_without_grammars_is_refused_with_what_to_use():
    with pytest.raises(InputError, match="response_format=json_object needs a backend that decodes under a grammar"):
        reply_grammar(ScriptedBackend(lambda context: plan("x")), ResponseFormat("json_object"))


def test_parsed_is_none_for_text_that_is_not_json():
    assert parsed('{"a": 1}') == {"a": 1} and parsed('{"a": ') is None


# --- on the real models ----------------------------------------------------------------------------------


class OneEvidence:
    name = "memory"

    def __init__(self, text):
        self.evidence, self.queries = text, []

    def ground(self, query, deadline):
        self.queries.append(query)
        return [Evidence(claim=self.evidence, evidence=self.evidence, confidence=0.95, source="memory:test")]


def capital_config(**kw):
    base = dict(mode="intervene", max_tokens=48, threshold=0.0, kind_thresholds={}, max_rounds=1)
    return Config(**(base | kw))


@pytest.mark.slow
def test_the_grammar_follows_a_reply_and_is_rebuilt_for_a_cut(llama_backend):
    grammar = llama_backend.grammar(ResponseFormat("json_schema", CAPITAL).gbnf())
    tokens = llama_backend.tokenize('{"country": "Chad", "capital": "N\'Djamena"}')
    probe = np.zeros(llama_backend.n_vocab, dtype=np.float32)
    fresh = llama_backend.grammar(ResponseFormat("json_schema", CAPITAL).gbnf())
    grammar.follow(tokens)
    done = np.isfinite(grammar.mask(probe))
    ends = {int(t) for t in np.flatnonzero(done)}
    assert all(t in llama_backend.eos_token_ids or not llama_backend.token_bytes(t).strip() for t in ends)
    grammar.follow(tokens[:5])  # cut back: rebuilt from the root, as a fresh grammar that followed the same tokens
    fresh.follow(tokens[:5])
    assert np.array_equal(np.isfinite(grammar.mask(probe)), np.isfinite(fresh.mask(probe)))
    assert not grammar.allows(next(iter(llama_backend.eos_token_ids)))  # no end of turn inside an object


@pytest.mark.slow
def test_a_token_outside_the_grammar_is_a_clear_error_not_a_crash(llama_backend):
    from surprisegate.errors import BackendError

    grammar = llama_backend.grammar(ResponseFormat("json_object").gbnf())
    with pytest.raises(BackendError, match="outside the grammar"):
        grammar.follow(llama_backend.tokenize("Hello"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "schema",
    [
        CAPITAL,
        {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n"]},
        {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}},
        {"type": "object"},
    ],
)
def test_every_reply_under_a_schema_parses_off_and_intervening(llama_backend, schema):
    fmt = ResponseFormat("json_schema", schema)
    for mode in ("off", "intervene"):
        config = capital_config(mode=mode, max_tokens=96)
        arms = {"memory": OneEvidence("The capital of Chad is N'Djamena.")} if mode == "intervene" else {}
        done = [e for e in stream(llama_backend, "Describe Chad as JSON.", config, arms, output=fmt)][-1]
        assert isinstance(done, Done)
        assert done.finish_reason == "stop", done.text  # the grammar closed the object and ended the turn
        value = parsed(done.text)
        assert isinstance(value, dict), done.text
        assert set(schema.get("required", [])) <= set(value)


@pytest.mark.slow
def test_a_doubtful_value_is_grounded_rewound_and_rewritten_inside_the_json(llama_backend):
    # Threshold 0: every value the question does not hold is doubtful; one round, one value rewritten.
    arm = OneEvidence("The capital of Burkina Faso is Ouagadougou.")
    events = list(
        stream(
            llama_backend,
            "What is the capital of Burkina Faso?",
            capital_config(),
            {"memory": arm},
            output=ResponseFormat("json_schema", CAPITAL),
        )
    )
    done = events[-1]
    value = parsed(done.text)
    assert value is not None and value["capital"] == "Ouagadougou", done.text
    trigger = next(e for e in events if isinstance(e, Trigger))
    assert trigger.statistic.startswith("value:")
    assert any(isinstance(e, Rewind) for e in events)
    record = done.result.rounds[0].to_dict()
    assert record["action"] == "rewound"
    assert '"capital"' not in record["dropped_text"]  # only the value went: the keys before it stayed
    assert arm.queries[0].question == "What is the capital of Burkina Faso?"


@pytest.mark.slow
def test_the_second_model_writes_parsing_json_under_the_gate(second_backend):
    arm = OneEvidence("The capital of Burkina Faso is Ouagadougou.")
    done = list(
        stream(
            second_backend,
            "What is the capital of Burkina Faso?",
            capital_config(),
            {"memory": arm},
            output=ResponseFormat("json_schema", CAPITAL),
        )
    )[-1]
    value = parsed(done.text)
    assert value is not None and value["capital"] == "Ouagadougou", done.text


def test_generate_passes_the_format_on_to_the_loop():
    from surprisegate.gate.loop import generate

    with pytest.raises(InputError, match="needs a backend that decodes under a grammar"):
        generate(ScriptedBackend(lambda context: plan("x")), "q?", Config(), output=ResponseFormat("json_object"))

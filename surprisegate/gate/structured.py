"""Structured output: a reply decoded under a JSON grammar (serve's `response_format`), with the gate inside it.

The grammar constrains which token is chosen (`Sampling.grammar`); the gate reads the model's own
distribution as always, so a doubtful string value (`{"capital": "Kouar-Boukoula"}`) crosses the window like
a doubtful word in prose, and is grounded, rewound and written again. The grammar's state follows the reply
(`TokenGrammar.follow`): after a rewind it is rebuilt for the kept prefix, so the output parses whatever the
gate did.

The grammar is llama.cpp's: its JSON-schema converter (the Python twin in llama-cpp-python) with the two
primitive rules that the C++ converter llama.cpp's server runs has since changed, taken from it: `space`
(llama.cpp lets a model break lines and indent, which small models like to do) and `char` (no raw control
characters in a string: `json.loads` refuses them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends import Grammars, TokenGrammar
from ..config import Config
from ..errors import InputError

# llama.cpp common/json-schema-to-grammar.cpp (the build the project's llama-server comes from): SPACE_RULE and
# PRIMITIVE_RULES["char"].
SPACE_RULE = r'| " " | "\n"{1,2} [ \t]{0,20}'
CHAR_RULE = r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'
KINDS = ("json_object", "json_schema")
ANY_OBJECT: Mapping[str, Any] = {"type": "object"}  # OpenAI's json_object: one JSON object, any keys


@dataclass(frozen=True)
class ResponseFormat:
    """What a reply must be: any JSON object (`json_object`) or an instance of `schema` (`json_schema`)."""

    kind: str
    schema: Mapping[str, Any] = field(default_factory=lambda: dict(ANY_OBJECT))
    name: str = ""  # the schema's name, as the client sent it (receipts)
    strict: bool = False  # OpenAI's flag: the grammar holds every reply to the schema either way

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"response format kind={self.kind!r} must be one of {', '.join(KINDS)}")

    def gbnf(self) -> str:
        """The GBNF grammar of this format (llama.cpp's converter; see the module's note)."""
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        try:
            grammar = json_schema_to_gbnf(json.dumps(dict(self.schema)))
        except Exception as err:
            raise InputError(
                f"json_schema={_shown(self.schema)}: llama.cpp's converter cannot turn it into a grammar ({err}); "
                "simplify the schema (local $refs, no remote ones)"
            ) from err
        return with_llama_server_rules(grammar)

    def receipt(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "json_schema":
            out |= {"name": self.name, "strict": self.strict}
        return out


def with_llama_server_rules(grammar: str) -> str:
    """`grammar` with its `space` and `char` rules as llama.cpp's C++ converter writes them."""
    rules = {"space": SPACE_RULE, "char": CHAR_RULE}
    lines = []
    for line in grammar.splitlines():
        name = line.split(" ::= ", 1)[0]
        lines.append(f"{name} ::= {rules[name]}" if name in rules and " ::= " in line else line)
    return "\n".join(lines) + "\n"


def told_format(chat: list[dict[str, Any]], output: ResponseFormat, config: Config) -> tuple[list, Config]:
    """The chat with the format said in its system turn (config.structured_output_template; the schema as JSON
    text in the turn's content, tokenized plain like any message), and the config the reply runs under: a
    rewrite goes on inside the JSON, so the evidence asks it to go on (the sentence template), not for a
    short sentence."""
    config = replace(config, evidence_template=config.sentence_evidence_template)
    schema = json.dumps(dict(output.schema), ensure_ascii=False)
    template = config.structured_output_template if output.kind == "json_schema" else config.json_object_template
    if not template:
        return chat, config
    note = template.replace("{schema}", schema)
    if chat and chat[0]["role"] == "system":
        first = chat[0] | {"content": f"{chat[0]['content']}\n\n{note}" if chat[0]["content"].strip() else note}
        return [first, *chat[1:]], config
    return [{"role": "system", "content": note}, *chat], config


def reply_grammar(backend: Any, output: ResponseFormat) -> TokenGrammar:
    """A fresh grammar state for one reply on `backend`; an InputError naming the backend where it has none."""
    if not isinstance(backend, Grammars):
        raise InputError(
            f"response_format={output.kind} needs a backend that decodes under a grammar; "
            f"{getattr(backend, 'name', type(backend).__name__)!r} does not here (serve a GGUF in process: "
            "--backend llamacpp)"
        )
    return backend.grammar(output.gbnf())


def parsed(text: str) -> Any | None:
    """The reply as JSON, or None when it does not parse (a reply cut at max_tokens)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _shown(schema: Mapping[str, Any]) -> str:
    text = json.dumps(dict(schema))
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["ANY_OBJECT", "CHAR_RULE", "KINDS", "SPACE_RULE", "ResponseFormat", "parsed", "reply_grammar", "told_format"]

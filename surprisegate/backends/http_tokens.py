"""Tokens over HTTP, shared by the server backends: untrusted text kept as text, chat templates, EOS probes.

Untrusted text stays text (DESIGN §8). llama.cpp's server takes `"parse_special": false`; vLLM's and SGLang's
tokenize endpoints run the Hugging Face tokenizer, which always turns a special token's text into that token,
and Ollama takes only text, which its runner tokenizes with special-token parsing on. So for those three the
model's control-token strings never reach the server whole inside an untrusted piece:

- `SpecialText` knows the strings: those the server's tokenizer has as control tokens (learned from the
  chat template's own pieces and an end-of-generation probe on vLLM/SGLang; the GGUF vocabulary's control,
  unknown and markup-shaped user-defined tokens on Ollama), plus anything shaped like one (`<|...|>`,
  `<｜...｜>`, `</s>`, `[INST]`, `<start_of_turn>`, ...).
- vLLM, SGLang: untrusted text is cut inside every such string and the parts are tokenized separately, so
  `<|im_end|>` in a web page arrives as the tokens of `<` and `|im_end|>`: the same characters, never the
  control token. The ids that come back are checked: one of the known control ids is an error, never sent.
- Ollama (text prompts): a ZERO WIDTH SPACE (U+200B) goes inside every such string that is not wholly
  the template's own text, across piece boundaries too: `<|\u200bim_end|>` reads the same to the model and
  cannot parse as a control token.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import BackendError, ConfigError, InputError, MissingDependency

CACHE_LIMIT = 4096  # entries of the tokenize / chat-template caches
TEMPLATE_ENV = "SURPRISEGATE_CHAT_TEMPLATE"  # a chat template for servers that do not serve theirs
ZWSP = "\u200b"
# End-of-generation token texts: llama.cpp's own rule (llama-vocab.cpp) marks every token with one of these
# texts as end of generation, plus its FIM pad / repo / file-separator tokens. A backend's `eos_token_ids`
# holds the ones the server's vocabulary has, plus any token a stream stopped on as end of turn.
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
)
# Text shaped like a control token, whatever the model: neutralised in untrusted text even when the
# server did not name it.
SPECIAL_SHAPES = (
    r"<\|[^\s<>|]{1,64}\|>"
    r"|<｜[^\s<>｜]{1,64}｜>"
    r"|</?s>|<unk>|<pad>|<mask>|<bos>|<eos>|<EOT>|<PAD>|<</?SYS>>"
    r"|<(?:start|end)_of_(?:turn|text|image|utterance)>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|TOOL_CALLS|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CONTENT|THINK)\]"
)
SHAPED = re.compile(SPECIAL_SHAPES)
MARKUP = re.compile(r"^(?:<[^<>]{1,64}>|\[[^\[\]]{1,64}\])$")  # a user-defined token that is markup


class LRU(OrderedDict):
    """A small least-recently-used cache."""

    def get_or(self, key: Any, make: Callable[[], Any]) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > CACHE_LIMIT:
            self.popitem(last=False)
        return value


class SpecialText:
    """The control-token strings of one model, and how to keep them out of untrusted text."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self._texts: set[str] = set()
        self._known: re.Pattern[str] | None = None
        self.add(texts)

    def __contains__(self, text: object) -> bool:
        return text in self._texts

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, texts: Iterable[str]) -> None:
        new = {t for t in texts if isinstance(t, str) and len(t) >= 2 and ZWSP not in t} - self._texts
        if new:
            self._texts |= new
            alternation = "|".join(re.escape(t) for t in sorted(self._texts, key=len, reverse=True))
            self._known = re.compile(f"(?=({alternation}))")

    @staticmethod
    def shaped(text: str) -> list[str]:
        """The substrings of `text` shaped like a control token (for probing a template piece)."""
        return list(dict.fromkeys(m.group(1) for m in re.finditer(f"(?=({SPECIAL_SHAPES}))", text)))

    def occurrences(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every known or control-token-shaped string in `text`, overlapping ones included."""
        found = {(m.start(), m.start() + len(m.group(1))) for m in re.finditer(f"(?=({SPECIAL_SHAPES}))", text)}
        if self._known is not None:
            found |= {(m.start(), m.start() + len(m.group(1))) for m in self._known.finditer(text)}
        return sorted(found)

    def split(self, text: str) -> list[str]:
        """`text` cut inside every control-token string (after its first character): tokenized one by one,
        the parts give the same characters and no control token."""
        cuts = sorted({start + 1 for start, _ in self.occurrences(text)})
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    def neutralise(self, runs: Sequence[tuple[str, bool]]) -> str:
        """The text of (text, trusted) runs with a ZERO WIDTH SPACE inside every control-token string that
        is not wholly trusted (the template's own), so a text-only server cannot parse it as one."""
        text = "".join(t for t, _ in runs)
        trusted = [ok for t, ok in runs for _ in t]
        for _ in range(8):  # each pass breaks every occurrence; an inserted ZWSP creates none
            inserts: set[int] = set()
            for start, end in self.occurrences(text):
                untrusted = [i for i in range(start, end) if not trusted[i]]
                if not untrusted:
                    continue
                first = untrusted[0]
                inserts.add(first if first > start else first + 1)
            if not inserts:
                return text
            for pos in sorted(inserts, reverse=True):
                text = text[:pos] + ZWSP + text[pos:]
                trusted.insert(pos, False)
        raise BackendError("could not neutralise the control-token strings of an untrusted text; report this text")


def load_chat_template(spec: str | None) -> tuple[str, str, str] | None:
    """(template, bos text, eos text) from `spec` or $SURPRISEGATE_CHAT_TEMPLATE: Jinja text, a .jinja
    file, or a Hugging Face tokenizer_config.json (whose bos/eos tokens come along). None when neither."""
    spec = spec or os.environ.get(TEMPLATE_ENV) or None
    if not spec:
        return None
    if "{%" in spec or "{{" in spec:
        return spec, "", ""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"chat_template={spec!r} is neither a Jinja template nor a file; pass a .jinja file or the "
            f"model's tokenizer_config.json (also as ${TEMPLATE_ENV})"
        )
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text, "", ""
    try:
        config = json.loads(text)
    except ValueError as err:
        raise ConfigError(
            f"chat_template={spec!r} is not valid JSON ({err}); pass the model's tokenizer_config.json"
        ) from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    if not isinstance(template, str):
        raise ConfigError(f"chat_template={spec!r} holds no chat_template; pass a tokenizer_config.json that has one")

    def token_text(value: Any) -> str:
        return value.get("content", "") if isinstance(value, dict) else value if isinstance(value, str) else ""

    return template, token_text(config.get("bos_token")), token_text(config.get("eos_token"))


def render_chat_template(
    template: str, messages: list[dict[str, str]], bos_token: str, eos_token: str, add_generation_prompt: bool
) -> str:
    """Render a Jinja chat template as transformers and llama-cpp-python do (sandboxed)."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise MissingDependency(
            "rendering a chat template needs jinja2: pip install 'surprisegate[llama-server]' (or jinja2)"
        ) from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: time.strftime(fmt))
    try:
        return env.from_string(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=add_generation_prompt
        )
    except jinja2.exceptions.TemplateError as err:
        raise BackendError(f"the chat template failed to render ({err}); pass another chat_template") from None


def check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise InputError(f"text={text!r} must be a string to tokenize")
    return text


class ServerTokenizer:
    """`tokenize`, `token_bytes`, `eos_token_ids` through a server's own tokenizer (vLLM, SGLang), whose
    tokenize endpoint parses special tokens in any text. Subclasses give `_encode` (texts -> ids, and the
    token strings where the server returns them) and `_decode` (ids -> text)."""

    uri: str

    def _init_tokens(self) -> None:
        self._tokenize_cache: LRU = LRU()
        self._token_bytes: dict[int, bytes] = {}
        self.specials = SpecialText(EOG_TEXTS)
        self._control_ids: set[int] = set()  # ids of control tokens learned from the template and the probe
        self._probed: set[str] = set()
        self._learned_eos: set[int] = set()
        self._eos_base: frozenset[int] | None = None

    def _encode(self, texts: list[str]) -> list[tuple[list[int], list[str] | None]]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    # --- tokens -------------------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if not check_text(text):
            return []
        return list(self._tokenize_cache.get_or((text, bool(special)), lambda: tuple(self._tokenize(text, special))))

    def _tokenize(self, text: str, special: bool) -> list[int]:
        if special:  # the chat template's own pieces: control tokens wanted; learn which strings they are
            self._learn_specials(SpecialText.shaped(text))
            return self._encode([text])[0][0]
        for _ in range(4):
            parts = self.specials.split(text)
            encoded = self._encode(parts)
            unknown = {
                s
                for part, (_, strs) in zip(parts, encoded, strict=True)
                for s in strs or ()
                if len(s) >= 2 and s in part and SHAPED.fullmatch(s) and s not in self.specials
            }
            if not unknown:
                break
            self._learn_specials(sorted(unknown))  # a control token the patterns missed: cut it too, again
        ids = [t for part_ids, _ in encoded for t in part_ids]
        leaked = sorted(set(ids) & (self._control_ids | self.eos_token_ids))
        if leaked:
            raise BackendError(
                f"{self.uri}: plain text {text[:80]!r} tokenized to control token(s) {leaked}; "
                "untrusted text is never sent as control tokens (report this text)"
            )
        return ids

    def _learn_specials(self, candidates: Sequence[str]) -> None:
        fresh = [c for c in candidates if c not in self._probed]
        if not fresh:
            return
        self._probed.update(fresh)
        found = self._single_ids(fresh)
        self.specials.add(found)
        self._control_ids.update(found.values())
        for token in found.values():
            self._token_bytes[token] = b""

    def _single_ids(self, texts: Sequence[str]) -> dict[str, int]:
        """The texts that are one token of the server's vocabulary (with special parsing), and their ids."""
        out: dict[str, int] = {}
        for text, (ids, _) in zip(texts, self._encode(list(texts)), strict=True):
            if len(ids) == 1:
                out[text] = ids[0]
        return out

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._token_bytes.get(token_id)
        if cached is not None:
            return cached
        if token_id in self.eos_token_ids or token_id in self._control_ids:
            raw = b""
        else:
            # /detokenize gives text: a byte fragment of a UTF-8 character comes back as U+FFFD (the
            # streamed pieces, which steps carry, are exact).
            raw = self._decode([int(token_id)]).encode("utf-8", "surrogatepass")
        self._token_bytes[token_id] = raw
        return raw

    def resolve_token(self, text: str) -> int | None:
        """The id of one token given only as text (streams without ids): None when it is not one token."""
        ids = self.tokenize(text, special=True)
        return ids[0] if len(ids) == 1 else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        if self._eos_base is None:
            self._eos_base = frozenset(self._single_ids(list(EOG_TEXTS)).values())
            self._control_ids.update(self._eos_base)
        return self._eos_base | frozenset(self._learned_eos)

    @property
    def control_token_ids(self) -> frozenset[int]:
        """The control tokens known so far (end of generation, and those the chat template uses)."""
        return frozenset(self._control_ids) | self.eos_token_ids

    def learn_eos(self, token: int) -> None:
        if token not in self.eos_token_ids:
            self._learned_eos.add(token)
            self._token_bytes.setdefault(token, b"")

"""llama.cpp's grammar sampler as a `TokenGrammar` (capabilities.py): which tokens may come next for the
reply to stay inside a GBNF grammar (structured output, serve's `response_format`).

It constrains the *choice* only, as llama.cpp's common sampler does: the token the settings would pick is
checked first and kept when the grammar allows it; otherwise the grammar masks the whole distribution and
the pick is made again (`Sampling.choose`). The grammar's state follows the reply's tokens: after a rewind,
a revert or a cut it is rebuilt for the kept prefix (`follow`), so the output parses whatever the gate did.

llama.cpp aborts the process when its grammar is made to accept a token it rejects (an end of turn before
the grammar is done, a byte it cannot take): every token is checked before it is accepted.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, InputError

# llama_token_data as llama.h lays it out: the array the sampler reads and writes in place.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class LlamaGrammar:
    """One reply's grammar state over a loaded llama.cpp model's vocabulary (`vocab`: llama_model_get_vocab)."""

    def __init__(self, lib: Any, vocab: Any, n_vocab: int, gbnf: str, root: str = "root") -> None:
        self._lib = lib
        self._sampler = lib.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not self._sampler:
            raise InputError(
                f"grammar={gbnf[:80]!r}: llama.cpp could not parse it (its log says where); "
                "send a JSON schema it can convert, or fix the grammar"
            )
        self.gbnf = gbnf
        self._accepted: list[int] = []
        self._all = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._one = (lib.llama_token_data * 1)()

    def follow(self, tokens: Sequence[int]) -> None:
        """Bring the grammar to the state after exactly `tokens` (the reply so far): accept what was added,
        or start again from the root when the reply was cut back or changed."""
        n = len(self._accepted)
        if n <= len(tokens) and self._accepted == list(tokens[:n]):
            new = tokens[n:]
        else:
            self._lib.llama_sampler_reset(self._sampler)
            self._accepted, new = [], tokens
        for token in new:
            if not self.allows(token):
                raise BackendError(
                    f"token {token} of the reply is outside the grammar at position {len(self._accepted)}; "
                    "the reply was not decoded under this grammar (report this: it is a bug)"
                )
            self._lib.llama_sampler_accept(self._sampler, int(token))
            self._accepted.append(int(token))

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (llama.cpp's check of one candidate)."""
        self._one[0].id, self._one[0].logit, self._one[0].p = int(token), 0.0, 0.0
        array = self._lib.llama_token_data_array(self._one, 1, -1, False)
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return bool(np.isfinite(self._one[0].logit))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every token the grammar rejects at -inf (a new array; `logits` is never written)."""
        n = min(logits.size, self._all.size)
        data = self._all[:n]
        data["id"], data["logit"], data["p"] = self._ids[:n], 0.0, 0.0
        array = self._lib.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(self._lib.llama_token_data)), n, -1, False
        )
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(array))
        out = logits.astype(np.float64, copy=True)
        out[:n][~np.isfinite(data["logit"])] = -np.inf
        out[n:] = -np.inf  # padded logits past the vocabulary (some models) are never text
        return out

    def close(self) -> None:
        if self._sampler:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
            pass


class ServerGrammar:
    """A grammar an inference server samples under (llama.cpp server's `grammar` field). The server's grammar
    state starts at its root for each request's generated tokens and cannot be rebuilt for a kept prefix, so a
    reply under it is judged whole when it ends and rewound from its start (`restarts_at_reply_start`: the loop
    reads it; json_values.ValueJudge whole_reply). A request that goes on after a reply already complete (a
    restore at its end) may add only whitespace before its end of turn."""

    restarts_at_reply_start = True

    def __init__(self, gbnf: str, token_bytes: Any) -> None:
        self.gbnf = gbnf
        self._token_bytes = token_bytes
        self._written: list[str] = []  # complete replies seen at a request (the text a restore brings back)

    def follow(self, tokens: Sequence[int]) -> None:  # the server keeps the state: nothing to rebuild here
        pass

    def allows(self, token: int) -> bool:  # the server chose the token under the grammar
        return True

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return logits.copy()

    def after(self, prompt: Sequence[int], reply_tokens: Sequence[int]) -> str:
        """The grammar for a request from `prompt`, where the reply so far is `reply_tokens`: the whole grammar
        when the prompt holds none of the reply (a reply rewound whole, or its start); after a complete reply,
        whitespace; after part of a reply once written whole (restored as it was), the rest of it, literally."""
        reply = self._text(reply_tokens)
        if reply and _parses(reply) and reply not in self._written:
            self._written.append(reply)  # a restore may bring back part of it (a trigger's token is not kept)
        held = self._text(reply_tokens[: _overlap(prompt, reply_tokens)])
        if not held:
            return self.gbnf
        if _parses(held):
            return WHITESPACE_ONLY
        whole = next((w for w in reversed(self._written) if w.startswith(held)), None)
        if whole is None:
            raise BackendError(
                f"a reply under the server's grammar cannot go on from inside its JSON ({held[-40:]!r}): the "
                "server's grammar starts at its root each request; this is a bug to report"
            )
        return f"root ::= {gbnf_literal(whole[len(held) :])} [ \\t\\n]*"

    def _text(self, tokens: Sequence[int]) -> str:
        return b"".join(self._token_bytes(t) for t in tokens).decode("utf-8", "replace")


class ServerGrammars:
    """The `Grammars` capability through a server that samples under a GBNF grammar sent with each request:
    llama.cpp's server (`grammar`), vLLM (`structured_outputs.grammar`, xgrammar reads GBNF) and SGLang
    (`sampling_params.ebnf`). A server that takes none (Ollama's `format` is a JSON schema only) lacks it."""

    token_bytes: Callable[[int], bytes]  # the server backend's own (an annotation: nothing shadowed in the MRO)

    def grammar(self, gbnf: str) -> ServerGrammar:
        """A reply's grammar, sent with its requests (a grammar the server refuses is that request's 400)."""
        return ServerGrammar(gbnf, self.token_bytes)


def request_grammar(prompt: Sequence[int], sampling: Any) -> str | None:
    """The grammar text for one request from `prompt` (None: the reply is free). Under a grammar a ban holds
    for the whole request (the caller's budget): a one-token request would leave the reply inside its JSON."""
    grammar = sampling.grammar
    if not isinstance(grammar, ServerGrammar):
        return None
    return grammar.after(prompt, sampling.reply_tokens() if sampling.reply_tokens is not None else ())


WHITESPACE_ONLY = "root ::= [ \\t\\n]*"  # GBNF: what may follow a complete JSON reply before its end of turn


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal (llama.cpp's escapes: \\" \\\\ \\n \\r \\t, \\xHH for other controls)."""
    escaped = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = (escaped.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x20 else ch) for ch in text)
    return '"' + "".join(out) + '"'


def _overlap(prompt: Sequence[int], reply: Sequence[int]) -> int:
    """How many of the reply's first tokens end the prompt (0: none of the reply is in it)."""
    for k in range(min(len(prompt), len(reply)), 0, -1):
        if list(prompt[len(prompt) - k :]) == list(reply[:k]):
            return k
    return 0


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


__all__ = ["TOKEN_DATA", "LlamaGrammar", "ServerGrammar", "ServerGrammars", "gbnf_literal", "request_grammar"]

"""Ollama as a steerable backend (text prompts): `--backend ollama://HOST:PORT --model NAME` (`ollama+https://`).

The whole gate over Ollama's native API (DESIGN §4; wire samples ../shared/wire/ollama_*):

- decoding: `POST /api/generate` with `raw: true` (our own rendering of the chat template, no Ollama
  template around it), `stream` (NDJSON: one JSON object a line, the last one `done: true`), `logprobs: true`,
  `top_logprobs: 20` (Ollama's maximum; it needs v0.12.11 or later: an older one streams no logprobs and the
  backend says so), `truncate: false` and `shift: false` (an over-long context is an error, never silently
  cut). Ollama takes no token ids: every request carries the whole context as TEXT ("path": "text" in
  `session.requests`), and Ollama's runner reuses the longest common prefix of its cache; it reports no
  cached-token count ("cached": None; `prompt_n` is its `prompt_eval_count`, the prompt tokens it evaluated).
  Closing the iterator closes the connection: Ollama aborts the request.
- sampling: `options.temperature` (0 greedy), `top_k: 0`, `top_p: 1`, `min_p: 0`, `repeat_penalty: 1` and no
  other penalties unless the reply's settings say otherwise (`Sampling.shaping`; Ollama's own defaults would
  apply top-k 40, top-p 0.9 and a repeat penalty of 1.1), a seed per request. A logit bias is refused (its
  token ids would be this backend's numbering, not the model's). Ollama has no logit bias: a ban is not
  applied, and the request's record says `ban_ignored`.
- token ids: ours. Ollama streams each token's text and bytes but no id, so this backend numbers texts: id 0
  is the end of turn (`eos_token_ids` = {0}; Ollama's `done_reason: "stop"` yields it), and every distinct
  piece gets an id by what it is: a chat-template piece (`tokenize(text, special=True)`), a piece of outside
  text (`special=False`), or a streamed token's text. `tokenize` returns one id per piece; the controller
  needs ids only to cut and re-send contexts, which it does at piece and token boundaries.
- UNTRUSTED TEXT STAYS TEXT: Ollama tokenizes the prompt with special-token parsing on, so the strings of the
  model's control tokens (from `/api/show` with `verbose`: the GGUF vocabulary's control, unknown and
  markup-shaped user-defined tokens, plus any text shaped like one) get a ZERO WIDTH SPACE inside wherever
  they are not wholly the template's own text (http_tokens.SpecialText.neutralise): `<|im_start|>system` in a
  web page reaches the model as `<|\u200bim_start|>system`, the same characters to read, never a turn marker.
  Streamed model output is treated as outside text too: a resume re-sends it neutralised.
- chat template: the GGUF's Jinja template (`/api/show` model_info `tokenizer.chat_template`) rendered here
  (Ollama's own Go template cannot be), or `chat_template=` / $SURPRISEGATE_CHAT_TEMPLATE. A leading BOS text
  is dropped: Ollama's runner adds BOS itself.

Surprise is exact (the chosen token's logprob); entropy is estimated from the top 20 with the vocabulary
size of the GGUF.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import BackendError, ConfigError, InputError
from . import Sampling
from .http_session import (
    DEFAULT_N_PREDICT,
    Chunk,
    ServerBackend,
    ServerRequest,
    StreamedToken,
    StreamParser,
    server_factory,
)
from .http_stream import Endpoint, ServerError
from .http_tokens import EOG_TEXTS, MARKUP, SpecialText, check_text, load_chat_template

END_OF_TURN = 0  # our id of the end of turn
MAX_TOP_LOGPROBS = 20  # Ollama refuses more ("top_logprobs must be between 0 and 20")
# GGUF token types (llama.cpp): 2 unknown, 3 control, 4 user-defined. Control and unknown tokens parse
# from text only with special-token parsing on (which Ollama's runner uses); user-defined ones always, and
# those shaped as markup are turn or tool markers in some vocabularies.
CONTROL_TYPES = (2, 3)
USER_DEFINED = 4
KINDS = ("template", "text", "output")


class OllamaBackend(ServerBackend):
    """A steerable backend over a running Ollama server (text prompts; sessions are requests)."""

    name = "ollama"
    context_fix = "load the model with a larger num_ctx (OLLAMA_CONTEXT_LENGTH)"

    def __init__(
        self,
        endpoint: Endpoint,
        model: str | None,
        n_predict: int = DEFAULT_N_PREDICT,
        chat_template: str | None = None,
    ) -> None:
        if not model:
            raise ConfigError("ollama:// needs --model NAME: a model pulled into that Ollama (`ollama list`)")
        super().__init__(endpoint, n_predict)
        self.model_id = str(model)
        try:
            show = endpoint.request_json("POST", "/api/show", {"model": self.model_id, "verbose": True})
        except ServerError as err:
            if err.status in (400, 404):
                raise BackendError(
                    f"{self.uri}: model {self.model_id!r} is not there ({err}); run `ollama pull "
                    f"{self.model_id}` on that server, or pass a name from `ollama list`"
                ) from None
            raise
        if not isinstance(show, dict):
            raise BackendError(f"{endpoint.base}/api/show: unexpected answer {str(show)[:200]}; is this Ollama?")
        capabilities = show.get("capabilities")
        if isinstance(capabilities, list) and capabilities and "completion" not in capabilities:
            raise BackendError(
                f"{self.uri}: {self.model_id!r} cannot generate text (capabilities: {capabilities}); "
                "pass a chat model as --model"
            )
        info: dict[str, Any] = show["model_info"] if isinstance(show.get("model_info"), dict) else {}
        vocab = info.get("tokenizer.ggml.tokens") or []
        types = info.get("tokenizer.ggml.token_type") or []
        vocab = vocab if isinstance(vocab, list) else []
        types = types if isinstance(types, list) and len(types) == len(vocab) else []
        controls = [
            t
            for t, kind in zip(vocab, types, strict=True)
            if isinstance(t, str) and (kind in CONTROL_TYPES or (kind == USER_DEFINED and MARKUP.match(t)))
        ]
        self.specials = SpecialText([*EOG_TEXTS, *controls])
        self.specials_source = "vocabulary" if types else "patterns"  # the vocabulary was not served: shapes only
        self.n_vocab = len(vocab) or None

        def token_text(key: str) -> str:
            index = info.get(key)
            return vocab[index] if isinstance(index, int) and 0 <= index < len(vocab) else ""

        self._bos_text, self._eos_text = (
            token_text("tokenizer.ggml.bos_token_id"),
            token_text("tokenizer.ggml.eos_token_id"),
        )
        self._add_bos = info.get("tokenizer.ggml.add_bos_token", True) is not False
        arch = info.get("general.architecture")
        n_ctx = info.get(f"{arch}.context_length") if isinstance(arch, str) else None
        self.n_ctx = n_ctx if isinstance(n_ctx, int) else None
        given = load_chat_template(chat_template)
        gguf = info.get("tokenizer.chat_template")
        self._template = given or ((gguf, self._bos_text, self._eos_text) if isinstance(gguf, str) and gguf else None)
        self._lock = threading.Lock()
        self._pieces: list[tuple[bytes, str]] = [(b"", "end")]  # our vocabulary: id -> (bytes, kind)
        self._ids: dict[tuple[bytes, str], int] = {}

    def _info(self) -> dict[str, Any]:
        return {"prompts": "text", "control_strings": self.specials_source}

    # --- our text vocabulary ------------------------------------------------------------------------
    def intern(self, piece: bytes, kind: str) -> int:
        """The id of `piece` as a template piece, outside text or model output."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}")
        key = (bytes(piece), kind)
        with self._lock:
            token = self._ids.get(key)
            if token is None:
                token = self._ids[key] = len(self._pieces)
                self._pieces.append(key)
            return token

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if not check_text(text):
            return []
        return [self.intern(text.encode("utf-8", "surrogatepass"), "template" if special else "text")]

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._pieces):
            raise InputError(f"token_id={token_id} is not an id of this Ollama backend's pieces")
        return self._pieces[token_id][0]

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({END_OF_TURN})

    def learn_eos(self, token: int) -> None:
        """Ollama names no end-of-turn id: nothing to learn."""

    def render(self, tokens: list[int]) -> str:
        """The prompt text of a context: the pieces joined, control-token strings of every piece that is not
        the template's own neutralised, a leading BOS dropped (the runner adds it)."""
        runs: list[tuple[bytes, bool]] = []
        for token in tokens:
            piece, kind = self._pieces[token] if 0 <= token < len(self._pieces) else (None, "")
            if piece is None:
                raise InputError(f"token id {token} is not an id of this Ollama backend's pieces")
            trusted = kind == "template"
            if runs and runs[-1][1] == trusted:
                runs[-1] = (runs[-1][0] + piece, trusted)
            else:
                runs.append((piece, trusted))
        text = self.specials.neutralise([(raw.decode("utf-8", "replace"), trusted) for raw, trusted in runs])
        if self._add_bos and self._bos_text and text.startswith(self._bos_text) and runs and runs[0][1]:
            text = text[len(self._bos_text) :]
        return text

    # --- chat template ------------------------------------------------------------------------------
    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        missing = f"{self.model_id!r} carries no Jinja chat template (GGUF tokenizer.chat_template)"
        return self._render_given(msgs, add_generation_prompt, missing)

    # --- one streamed request (the hooks of http_session.ServerSession) ------------------------------
    def stream_request(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> ServerRequest:
        shaping = sampling.shaping
        if shaping.logit_bias:
            raise InputError(
                f"logit_bias={dict(shaping.logit_bias)!r}: Ollama's API takes no logit bias; drop it, or serve the "
                "model with llama.cpp's server (--backend llama-server://...), which does"
            )
        options: dict[str, Any] = {
            "num_predict": self.n_predict,
            "temperature": max(0.0, float(sampling.temperature)),
            "top_k": shaping.top_k,
            "top_p": shaping.top_p,
            "min_p": shaping.min_p,
            "repeat_penalty": shaping.repeat_penalty,
            "repeat_last_n": shaping.repeat_last_n,
            "presence_penalty": shaping.presence_penalty,
            "frequency_penalty": shaping.frequency_penalty,
            "seed": seed,
        }
        body: dict[str, Any] = {
            "model": self.model_id,
            "prompt": self.render(prompt),
            "raw": True,
            "stream": True,
            "options": options,
            "truncate": False,
            "shift": False,
        }
        top_k = self.request_top_k(sampling, MAX_TOP_LOGPROBS)
        if sampling.scored:
            body.update(logprobs=True, top_logprobs=top_k)
        record: dict[str, Any] = {
            "prompt_tokens": None,
            "prompt_pieces": len(prompt),
            "prompt_chars": len(body["prompt"]),
        }
        if banned:
            record["ban_ignored"] = sorted(banned)  # Ollama has no logit bias
        return ServerRequest("/api/generate", body, "ndjson", "text", self.n_predict, top_k, record)

    def stream_parser(self, request: ServerRequest) -> NdjsonStreamParser:
        return NdjsonStreamParser(self, request.top_k, bool(request.body.get("logprobs")))


class NdjsonStreamParser(StreamParser):
    """The chunks of one Ollama NDJSON stream: `response` (or chat's `message.content`) text, `logprobs[]`
    {token, logprob, bytes, top_logprobs[]}, and the last line `done: true` with `done_reason` and counts."""

    def __init__(self, backend: OllamaBackend, top_k: int, scored: bool) -> None:
        super().__init__(backend.uri, top_k)
        self._backend, self._scored = backend, scored

    def feed(self, event: Any) -> Chunk:
        if not isinstance(event, dict):
            raise TypeError("a line is not a JSON object")
        text = event.get("response")
        if text is None and isinstance(event.get("message"), dict):
            text = event["message"].get("content")
        text = text or ""
        if not isinstance(text, str):
            raise TypeError(f"the text is {text!r}")
        entries = [self._entry(e) for e in self.as_list(event.get("logprobs") or [], "logprobs")]
        tokens = self._tokens(entries, text)
        done = event.get("done")
        if not isinstance(done, bool):
            raise TypeError(f"done is {done!r}")
        if not done:
            return Chunk(tokens)
        notes: dict[str, Any] = {"stop_type": event.get("done_reason")}
        if event.get("prompt_eval_count") is not None:
            notes["prompt_n"] = self.as_int(event["prompt_eval_count"], "prompt_eval_count")
        if event.get("prompt_eval_duration") is not None:
            notes["prompt_ms"] = self.as_int(event["prompt_eval_duration"], "prompt_eval_duration") / 1e6
        end = "length" if event.get("done_reason") == "length" else "eos"
        return Chunk(tokens, end, None, notes)

    def _entry(self, entry: Any) -> tuple[str, bytes, float, list[tuple[bytes, float]]]:
        if not isinstance(entry, dict):
            raise TypeError("a logprob is not an object")
        tops = [
            (self._bytes(a), self.as_logprob(a["logprob"], "a top logprob"))
            for a in self.as_list(entry.get("top_logprobs") or [], "top_logprobs")
        ]
        return str(entry["token"]), self._bytes(entry), self.as_logprob(entry["logprob"], "a logprob"), tops

    def _bytes(self, entry: Any) -> bytes:
        """A token's raw bytes (`bytes`, else its string's)."""
        if not isinstance(entry, dict):
            raise TypeError("a logprob is not an object")
        raw = entry.get("bytes")
        if raw is None:
            return str(entry["token"]).encode("utf-8", "surrogatepass")
        return bytes(self.as_int(b, "a byte") for b in self.as_list(raw, "bytes"))

    def _tokens(self, entries: list, text: str) -> list[StreamedToken]:
        text, self._pieces.carry = self._pieces.carry + text, ""
        backend = self._backend
        if not entries:
            if text and self._scored:
                raise ServerError(
                    f"{backend.uri}: Ollama streamed text without logprobs; the gate needs Ollama "
                    "v0.12.11 or later (logprobs on /api/generate)",
                    url=backend.uri,
                    kind="no_logprobs",
                )
            if text:  # unscored: one piece for the text
                return [
                    StreamedToken(
                        backend.intern(text.encode("utf-8", "surrogatepass"), "output"),
                        text.encode("utf-8", "surrogatepass"),
                    )
                ]
            return []
        if "".join(s for s, _, _, _ in entries) == text:
            pieces = [raw for _, raw, _, _ in entries]
        else:  # text held back or flushed apart from its tokens: the text decides the pieces
            pieces = self._pieces.split(text, [s for s, _, _, _ in entries])
        out = []
        for (_, _, logprob, alts), piece in zip(entries, pieces, strict=True):
            tops = sorted(((backend.intern(raw, "output"), lp) for raw, lp in alts), key=lambda e: -e[1])
            out.append(StreamedToken(backend.intern(piece, "output"), piece, logprob, tuple(tops[: self._top_k])))
        return out


from_ollama = server_factory(
    OllamaBackend,
    "ollama",
    11434,
    """Connect to a running Ollama (registry: `ollama://HOST:PORT`, `+https` for TLS) for model `model`.

    Options: n_predict (tokens per request), chat_template (else the GGUF's). The key, for an Ollama behind a
    proxy that wants one, comes from $SURPRISEGATE_SERVER_KEY only.""",
)

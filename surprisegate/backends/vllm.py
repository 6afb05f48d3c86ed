"""vLLM as a steerable backend: `--backend vllm://HOST:PORT --model SERVED_NAME` (`vllm+https://` for TLS).

The whole gate over vLLM's OpenAI server (DESIGN §4; wire samples ../shared/wire/vllm_*, and
tests/wire_inferred/vllm_* for the token-id exchange, written from vLLM's source):

- decoding: `POST /v1/completions` with the context as a token-id `prompt`, `stream`, `logprobs: 20` (top-k
  of the raw distribution: vLLM's default logprobs mode is the raw model output, before temperature and
  penalties), `return_token_ids` (each chunk's `token_ids`: its tokens' ids, the end-of-generation token
  included; vLLM >= 0.10.2) and `return_tokens_as_token_ids` (logprob keys `token_id:N`, so top-k entries
  carry ids and equal strings never collapse). `stream_options.include_usage` brings a final usage chunk:
  `usage.prompt_tokens_details.cached_tokens` is the prefix-cache hit (vLLM reports it when started with
  `--enable-prompt-tokens-details`; the record says None otherwise). Automatic prefix caching (on by default
  in V1) reuses whole KV blocks of the earlier request: a resume after a rewind recomputes from the block
  holding the rewind point. Closing the iterator closes the connection: vLLM aborts the request.
- sampling: `temperature` (0 greedy), `top_p: 1`, `top_k: -1`, `min_p: 0`, no penalties (overriding the
  model's generation_config defaults vLLM would apply) unless the reply's settings (`Sampling.shaping`) say
  otherwise, and a seed per request (`Sampling.seed` and the request's number). A ban is a 1-token request
  with `logit_bias` -100 (the largest vLLM allows).
- tokens: `POST /tokenize` (`add_special_tokens: false`, `return_token_strs`) and `POST /detokenize`. The
  tokenizer parses special tokens in any text, so untrusted text is cut inside control-token strings and the
  parts tokenized apart (http_tokens.py); the ids are checked against the known control tokens (those of
  the chat template, the end-of-generation probe, and `/tokenizer_info` when vLLM serves it).
- chat template: the server's own, rendered by `POST /tokenize` with `messages` and turned back into text by
  `/detokenize`; or a template given as `chat_template=` / $SURPRISEGATE_CHAT_TEMPLATE (a tokenizer_config.json).
- streams without ids (an older vLLM: neither `token_ids` nor `token_id:N` keys) map each token's text to its
  id with `/tokenize` (one token, special parsing on); top-k entries without ids count for the entropy.

Surprise is exact (the chosen token's logprob, floored at -9999 by vLLM); entropy is estimated from the top
20 with `surprise.topk_entropy` (vLLM does not report the vocabulary size: the estimate assumes 131,072).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import BackendError
from . import Sampling
from .grammar import ServerGrammars, request_grammar
from .http_session import Chunk, ServerRequest, StreamedToken, StreamParser, TokenIdServer, server_factory
from .http_stream import ServerError

TOKEN_ID_PREFIX = "token_id:"  # return_tokens_as_token_ids: a token is written "token_id:N"


class VllmBackend(ServerGrammars, TokenIdServer):
    """A steerable backend over a running vLLM OpenAI server (one served model; sessions are requests)."""

    name = "vllm"
    drain_after_end = True  # the usage chunk (cached tokens) follows the final content chunk
    context_fix = "start vLLM with a larger --max-model-len"
    model_hint = "pass a served model name as --model (vllm serve --served-model-name)"

    def _after_init(self) -> None:
        """The special tokens `/tokenizer_info` lists (vLLM started with --enable-tokenizer-info-endpoint):
        their strings are cut in untrusted text and their ids refused there, template or not."""
        try:
            body = self.endpoint.request_json("GET", "/tokenizer_info")
        except ServerError:
            return  # not enabled: the template, the probe and the shapes name them
        added = body.get("added_tokens_decoder") if isinstance(body, dict) else None
        for key, token in (added or {}).items() if isinstance(added, dict) else ():
            if isinstance(token, dict) and token.get("special") and isinstance(token.get("content"), str):
                try:
                    self._control_ids.add(int(key))
                except ValueError:
                    continue
                self.specials.add([token["content"]])
                self._token_bytes[int(key)] = b""

    # --- the server's tokenizer ---------------------------------------------------------------------
    def _encode(self, texts: list[str]) -> list[tuple[list[int], list[str] | None]]:
        out = []
        for text in texts:
            body = self.endpoint.request_json(
                "POST",
                "/tokenize",
                {"model": self.model_id, "prompt": text, "add_special_tokens": False, "return_token_strs": True},
            )
            out.append(self._tokens_of(body))
        return out

    def _tokens_of(self, body: Any) -> tuple[list[int], list[str] | None]:
        try:
            ids = [int(t) for t in body["tokens"]]
            strs = body.get("token_strs")
            if strs is not None and (not isinstance(strs, list) or len(strs) != len(ids)):
                strs = None
        except (KeyError, TypeError, ValueError):
            raise BackendError(
                f"{self.endpoint.base}/tokenize: unexpected answer {str(body)[:200]}; is this a vLLM server?"
            ) from None
        return ids, [str(s) for s in strs] if strs is not None else None

    def _single_ids(self, texts: Sequence[str]) -> dict[str, int]:
        """One request: the texts joined by newlines; a text is one token when a token's string is it."""
        ids, strs = self._encode(["\n".join(texts)])[0]
        if strs is None:  # an older vLLM without token strings: one request per text
            return super()._single_ids(texts)
        wanted = set(texts)
        return {s: t for t, s in zip(ids, strs, strict=True) if s in wanted}

    def _decode(self, ids: list[int]) -> str:
        body = self.endpoint.request_json("POST", "/detokenize", {"model": self.model_id, "tokens": ids})
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BackendError(f"{self.endpoint.base}/detokenize: unexpected answer {str(body)[:200]}")
        return body["prompt"]

    # --- chat template ------------------------------------------------------------------------------
    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if self._template is not None:
            return self._render_given(msgs, add_generation_prompt, "")
        body = self.endpoint.request_json(
            "POST",
            "/tokenize",
            {
                "model": self.model_id,
                "messages": msgs,
                "add_generation_prompt": add_generation_prompt,
                "continue_final_message": False,
                "add_special_tokens": False,
            },
        )
        ids, _ = self._tokens_of(body)
        return self._decode(ids)

    # --- one streamed request (the hooks of http_session.ServerSession) ------------------------------
    def stream_request(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> ServerRequest:
        grammar = request_grammar(prompt, sampling)  # a ban then holds for the request (grammar.request_grammar)
        n_predict = self.budget(prompt, banned if grammar is None else frozenset())
        top_k = self.request_top_k(sampling)
        body: dict[str, Any] = {
            "model": self.model_id,
            "prompt": prompt,
            "max_tokens": n_predict,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "seed": seed,
            **self.sampling_params(sampling, banned),
        }
        if top_k:
            body.update(logprobs=top_k, return_tokens_as_token_ids=True)
        if grammar is not None:  # structured output: vLLM's structured-output backend (xgrammar) samples under it
            body["structured_outputs"] = {"grammar": grammar}
        return ServerRequest("/v1/completions", body, "sse", "token-ids", n_predict, top_k)

    def stream_parser(self, request: ServerRequest) -> OpenAIStreamParser:
        return OpenAIStreamParser(self, request.top_k)


class OpenAIStreamParser(StreamParser):
    """The chunks of an OpenAI-shaped stream: /v1/completions (`choices[].text`, `logprobs.tokens /
    token_logprobs / top_logprobs` dicts) and, read the same way, chat chunks (`choices[].delta.content`,
    `logprobs.content[]`); vLLM's `token_ids`; a usage chunk with `choices: []`."""

    def __init__(self, backend: TokenIdServer, top_k: int) -> None:
        super().__init__(backend.uri, top_k)
        self._backend = backend

    def feed(self, event: Any) -> Chunk:
        if not isinstance(event, dict):
            raise TypeError("an event is not a JSON object")
        notes: dict[str, Any] = {}
        usage = event.get("usage")
        if usage is not None:
            notes.update(self._usage(usage))
        choices = event.get("choices")
        if not choices:
            if usage is None:
                raise KeyError("an event without choices or usage")
            return Chunk(notes=notes)
        choice = self.as_list(choices, "choices")[0]
        if not isinstance(choice, dict):
            raise TypeError("a choice is not an object")
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        if not isinstance(text, str):
            raise TypeError(f"the text is {text!r}")
        entries = self._entries(choice.get("logprobs"))
        field_ids = choice.get("token_ids")
        ids: list[int | None]
        if field_ids is not None:
            ids = [self.as_int(t, "a token id") for t in self.as_list(field_ids, "token_ids")]
            if entries is not None and len(entries) != len(ids):
                raise ValueError(f"{len(ids)} token ids but {len(entries)} logprobs")
        elif entries is not None:
            ids = [_id_of(s) for s, _, _ in entries]
        else:
            ids = []
            if text:
                raise ServerError(
                    f"{self._backend.uri}: the stream carries text but neither token ids nor logprobs; this server "
                    "or endpoint cannot drive the gate (vLLM: use >= 0.10.2 for return_token_ids; Ollama: use "
                    "ollama:// for /api/generate)",
                    url=self._backend.uri,
                    kind="no_ids",
                )
        end, eos = self._finish(choice, field_ids is not None and bool(ids), ids)
        tokens = self._tokens(ids, entries, text, eos is not None and bool(ids) and ids[-1] == eos)
        return Chunk(tokens, end, eos, notes)

    def _usage(self, usage: Any) -> dict[str, Any]:
        if not isinstance(usage, dict):
            raise TypeError("usage is not an object")
        notes: dict[str, Any] = {}
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            notes["cached"] = self.as_int(details["cached_tokens"], "cached_tokens")
        if usage.get("prompt_tokens") is not None:
            notes["prompt_tokens_reported"] = self.as_int(usage["prompt_tokens"], "prompt_tokens")
        return notes

    def _entries(self, logprobs: Any) -> list[tuple[str, float | None, list[tuple[str, float]]]] | None:
        """(token string, its logprob, [(alternative string, logprob)]) per token, or None without logprobs."""
        if logprobs is None:
            return None
        if not isinstance(logprobs, dict):
            raise TypeError("logprobs is not an object")
        out: list[tuple[str, float | None, list[tuple[str, float]]]] = []
        if "content" in logprobs:  # chat shape
            for item in self.as_list(logprobs["content"], "logprobs.content"):
                tops = [
                    (str(a["token"]), self.as_logprob(a["logprob"], "a top logprob"))
                    for a in self.as_list(item.get("top_logprobs") or [], "top_logprobs")
                ]
                out.append((str(item["token"]), self.as_logprob(item["logprob"], "a logprob"), tops))
            return out
        tokens = self.as_list(logprobs.get("tokens") or [], "logprobs.tokens")
        values = self.as_list(logprobs.get("token_logprobs") or [None] * len(tokens), "token_logprobs")
        alts = self.as_list(logprobs.get("top_logprobs") or [None] * len(tokens), "top_logprobs")
        if not len(tokens) == len(values) == len(alts):
            raise ValueError("logprobs.tokens, token_logprobs and top_logprobs differ in length")
        for token, value, alt in zip(tokens, values, alts, strict=True):
            if not isinstance(token, str):
                raise TypeError(f"a token is {token!r}")
            if alt is not None and not isinstance(alt, dict):
                raise TypeError("a top_logprobs entry is not an object")
            tops = [(str(k), self.as_logprob(v, "a top logprob")) for k, v in (alt or {}).items()]
            out.append((token, None if value is None else self.as_logprob(value, "a logprob"), tops))
        return out

    def _finish(self, choice: dict, ids_streamed: bool, ids: list[int | None]) -> tuple[str | None, int | None]:
        reason, stop = choice.get("finish_reason"), choice.get("stop_reason", choice.get("matched_stop"))
        if reason is None:
            return None, None
        if reason == "length":
            return "length", None
        if reason in ("abort", "error"):
            raise ServerError(
                f"{self._backend.uri}: the server ended the request with finish_reason {reason!r}",
                url=self._backend.uri,
                body=choice,
                kind="stream_error",
            )
        if isinstance(stop, int) and not isinstance(stop, bool):
            return "eos", stop  # a stop token
        if stop is None and ids_streamed and ids[-1] is not None:
            return "eos", ids[-1]  # vLLM streams the end-of-generation token's id (its text is skipped)
        return "eos", None  # a stop string, or no ids: the end of turn is not a streamed token

    def _tokens(self, ids: list[int | None], entries: list | None, text: str, eos_last: bool) -> list[StreamedToken]:
        strs: list[str | None] = [None] * len(ids)
        if entries is not None:
            strs = [None if s.startswith(TOKEN_ID_PREFIX) else s for s, _, _ in entries]
        pieces = self._pieces.split(text, strs, eos_last)
        out = []
        for i, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
            resolved = token if token is not None else self._resolve(strs[i] or "")
            if entries is None:
                out.append(StreamedToken(resolved, piece))
                continue
            _, logprob, alts = entries[i]
            tops = sorted(((_id_of(k), lp) for k, lp in alts), key=lambda e: -e[1])
            out.append(StreamedToken(resolved, piece, logprob, tuple(tops[: self._top_k] if self._top_k else tops)))
        return out

    def _resolve(self, text: str) -> int:
        token = self._backend.resolve_token(text) if text else None
        if token is None:
            raise ServerError(
                f"{self._backend.uri}: a streamed token {text!r} has no id and is not one token of the "
                "server's vocabulary; use a vLLM with return_token_ids (>= 0.10.2)",
                url=self._backend.uri,
                kind="no_ids",
            )
        return token


def _id_of(token: str) -> int | None:
    """The id in a `token_id:N` string (return_tokens_as_token_ids), else None."""
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        return int(token[len(TOKEN_ID_PREFIX) :])
    return None


from_vllm = server_factory(
    VllmBackend,
    "vllm",
    8000,
    """Connect to a running vLLM OpenAI server (registry: `vllm://HOST:PORT`, `+https` for TLS).

    `model`: the served model name (default: the first the server lists). Options: n_predict (tokens per
    request), chat_template (else the server's own). The key, if the server wants one (`vllm serve
    --api-key`), comes from $SURPRISEGATE_SERVER_KEY only.""",
)

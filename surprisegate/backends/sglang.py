"""SGLang as a steerable backend: `--backend sglang://HOST:PORT [--model SERVED_NAME]` (`sglang+https://`).

The whole gate over SGLang's native API (DESIGN §4; wire samples ../shared/wire/sglang_*, and
tests/wire_inferred/sglang_* for the `input_ids` exchange, written from SGLang's source):

- decoding: `POST /generate` with the context as `input_ids`, `stream`, `return_logprob`, `top_logprobs_num: 20`,
  `logprob_start_len: -1` (output tokens only) and `return_text_in_logprobs`. Each event is
  `data: {"text", "output_ids", "meta_info"}` (then `data: [DONE]`); `meta_info.output_token_logprobs` holds
  `[logprob, id, text]` per token and `output_top_logprobs` the top-k of each position. By default these
  lists, `output_ids` and `text` are CUMULATIVE (every event repeats the request's whole output so far):
  the parser takes the new part. A server started with `--incremental-streaming-output` sends deltas; the
  parser tells the two apart by `meta_info.completion_tokens`. The end-of-generation token is named in
  `finish_reason: {"type": "stop", "matched": ID}` (and is the last output id where the server streams it).
  `meta_info.cached_tokens` is the RadixAttention prefix-cache hit, in every event. Closing the iterator
  closes the connection: SGLang aborts the request.
- sampling: `temperature` (0 greedy: logprobs are the raw log-softmax), `top_p: 1`, `top_k: -1`, `min_p: 0`,
  no penalties (overriding the model's generation_config defaults SGLang applies) unless the reply's settings
  (`Sampling.shaping`) say otherwise; at temperature T > 0 SGLang
  reports logprobs after temperature scaling unless the server runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1
  (DESIGN §1: calibrate with the same setting). `sampling_seed` per request when sampling. A ban is a 1-token
  request with `logit_bias` -100 (that one step's logprobs then include the bias).
- tokens: `POST /v1/tokenize` (a list of texts in one request, `add_special_tokens: false`) and
  `POST /v1/detokenize` (`skip_special_tokens: false`). The tokenizer parses special tokens in any text, so
  untrusted text is cut inside control-token strings and the parts tokenized apart (http_tokens.py).
- chat template: SGLang does not serve the template's text. Give it as `chat_template=` or
  $SURPRISEGATE_CHAT_TEMPLATE (the model's tokenizer_config.json, whose bos/eos tokens come along); a server
  started with `--chat-template` holding Jinja text is used as is.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError
from . import Sampling
from .grammar import ServerGrammars, request_grammar
from .http_session import Chunk, ServerRequest, StreamedToken, StreamParser, TokenIdServer, server_factory
from .http_stream import ServerError


class SglangBackend(ServerGrammars, TokenIdServer):
    """A steerable backend over a running SGLang server (one served model; sessions are requests)."""

    name = "sglang"
    context_fix = "start SGLang with a larger --context-length"
    model_hint = "pass the served model name as --model (--served-model-name), or omit it"

    def _after_init(self) -> None:
        self._template_looked_up = self._template is not None  # else: /server_info, on first use

    # --- the server's tokenizer ---------------------------------------------------------------------
    def _encode(self, texts: list[str]) -> list[tuple[list[int], list[str] | None]]:
        if not texts:
            return []
        body = self.endpoint.request_json(
            "POST", "/v1/tokenize", {"model": self.model_id, "prompt": list(texts), "add_special_tokens": False}
        )
        try:
            lists = body["tokens"]
            if not isinstance(lists, list) or len(lists) != len(texts):
                raise ValueError("one token list per text")
            return [([int(t) for t in ids], None) for ids in lists]
        except (KeyError, TypeError, ValueError):
            raise BackendError(
                f"{self.endpoint.base}/v1/tokenize: unexpected answer {str(body)[:200]}; is this an "
                "SGLang server (/v1/tokenize needs SGLang >= 0.5)?"
            ) from None

    def _decode(self, ids: list[int]) -> str:
        body = self.endpoint.request_json(
            "POST", "/v1/detokenize", {"model": self.model_id, "tokens": ids, "skip_special_tokens": False}
        )
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise BackendError(f"{self.endpoint.base}/v1/detokenize: unexpected answer {str(body)[:200]}")
        return body["text"]

    # --- chat template ------------------------------------------------------------------------------
    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if not self._template_looked_up:
            self._template_looked_up = True
            self._template = self._server_template()
        return self._render_given(msgs, add_generation_prompt, "SGLang does not serve its chat template's text")

    def _server_template(self) -> tuple[str, str, str] | None:
        """The `--chat-template` the server was started with, when it is Jinja text (not a name or a path)."""
        try:
            info = self.endpoint.request_json("GET", "/server_info")
        except ServerError:
            return None
        template = info.get("chat_template") if isinstance(info, dict) else None
        if isinstance(template, str) and ("{%" in template or "{{" in template):
            return template, "", ""
        return None

    # --- one streamed request (the hooks of http_session.ServerSession) ------------------------------
    def stream_request(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> ServerRequest:
        grammar = request_grammar(prompt, sampling)  # a ban then holds for the request (grammar.request_grammar)
        n_predict = self.budget(prompt, banned if grammar is None else frozenset())
        params: dict[str, Any] = {"max_new_tokens": n_predict, **self.sampling_params(sampling, banned)}
        if grammar is not None:  # structured output: SGLang's grammar backend (xgrammar) samples under it
            params["ebnf"] = grammar
        if params["temperature"] > 0:
            params["sampling_seed"] = seed
        top_k = self.request_top_k(sampling)
        body: dict[str, Any] = {"input_ids": prompt, "sampling_params": params, "stream": True}
        if top_k:
            body.update(return_logprob=True, top_logprobs_num=top_k, logprob_start_len=-1, return_text_in_logprobs=True)
        return ServerRequest("/generate", body, "sse", "token-ids", n_predict, top_k)

    def stream_parser(self, request: ServerRequest) -> GenerateStreamParser:
        return GenerateStreamParser(self.uri, request.top_k)


class GenerateStreamParser(StreamParser):
    """The chunks of one streamed SGLang /generate: new tokens from cumulative (or, with
    --incremental-streaming-output, delta) `output_ids`, `output_token_logprobs`, `output_top_logprobs`, `text`."""

    def __init__(self, uri: str, top_k: int) -> None:
        super().__init__(uri, top_k)
        self._seen: list[int] = []  # the ids this request has streamed so far
        self._text_len = 0  # characters of the cumulative text read so far
        self._mode: str | None = None  # "cumulative" | "delta", known from the second event with tokens on

    def feed(self, event: Any) -> Chunk:
        if not isinstance(event, dict) or not isinstance(event.get("meta_info"), dict):
            raise TypeError("an event is not an object with meta_info")
        meta = event["meta_info"]
        notes = self._notes(meta)
        entries = self._entries(event, meta)
        new, start = self._new(entries, meta.get("completion_tokens"))
        text = event.get("text") or ""
        if not isinstance(text, str):
            raise TypeError(f"text is {text!r}")
        if self._mode == "delta":
            delta = text
        else:
            if len(text) < self._text_len:
                raise ValueError("the cumulative text got shorter")
            delta, self._text_len = text[self._text_len :], len(text)
        end, eos = self._finish(meta.get("finish_reason"))
        tops = self._tops(meta.get("output_top_logprobs"), start, len(new)) if self._top_k else [()] * len(new)
        self._seen += [token for token, _, _ in new]
        eos_last = eos is not None and bool(new) and new[-1][0] == eos
        return Chunk(self._tokens(new, tops, delta, eos_last), end, eos, notes)

    def _notes(self, meta: dict) -> dict[str, Any]:
        notes: dict[str, Any] = {}
        if meta.get("cached_tokens") is not None:
            notes["cached"] = self.as_int(meta["cached_tokens"], "cached_tokens")
        if meta.get("prompt_tokens") is not None:
            notes["prompt_tokens_reported"] = self.as_int(meta["prompt_tokens"], "prompt_tokens")
            if "cached" in notes:
                notes["prompt_n"] = notes["prompt_tokens_reported"] - notes["cached"]
        return notes

    def _entries(self, event: dict, meta: dict) -> list[tuple[int, float | None, str | None]]:
        """(id, logprob, text) per output token in this event (as sent: cumulative or delta)."""
        logprobs = meta.get("output_token_logprobs")
        if logprobs is not None:
            out = []
            for triple in self.as_list(logprobs, "output_token_logprobs"):
                triple = self.as_list(triple, "a logprob entry")
                value = None if triple[0] is None else self.as_logprob(triple[0], "a logprob")
                text = triple[2] if len(triple) > 2 and isinstance(triple[2], str) else None
                out.append((self.as_int(triple[1], "a token id"), value, text))
            ids = event.get("output_ids")
            if ids is not None and len(self.as_list(ids, "output_ids")) == len(out):
                if [self.as_int(t, "an output id") for t in ids] != [t for t, _, _ in out]:
                    raise ValueError("output_ids and output_token_logprobs name different tokens")
            return out
        ids = event.get("output_ids")
        if ids is None:
            if event.get("text"):
                raise ServerError(
                    f"{self._uri}: the stream carries text but no output ids or logprobs; is this "
                    "SGLang's native /generate?",
                    url=self._uri,
                    kind="no_ids",
                )
            return []
        return [(self.as_int(t, "an output id"), None, None) for t in self.as_list(ids, "output_ids")]

    def _new(self, entries: list, completion: Any) -> tuple[list, int]:
        """The entries not streamed before, and the index of the first of them in `entries`."""
        seen = len(self._seen)
        if self._mode is None and seen:
            total = completion if isinstance(completion, int) and not isinstance(completion, bool) else None
            prefix = len(entries) >= seen and [t for t, _, _ in entries[:seen]] == self._seen
            if total is not None and len(entries) == total and prefix:
                self._mode = "cumulative"
            elif total is not None and len(entries) == total - seen:
                self._mode = "delta"
            elif total is None:
                self._mode = "cumulative" if prefix else "delta"
            else:
                raise ValueError(
                    f"{len(entries)} output tokens fit neither cumulative nor delta streaming of "
                    f"{total} completion tokens"
                )
        if self._mode == "delta" or not seen:
            return entries, 0
        if len(entries) < seen or [t for t, _, _ in entries[:seen]] != self._seen:
            raise ValueError("a cumulative event does not repeat the tokens streamed before")
        return entries[seen:], seen

    def _tops(self, tops: Any, start: int, n: int) -> list[tuple[tuple[int | None, float], ...]]:
        if tops is None:
            return [()] * n
        rows = self.as_list(tops, "output_top_logprobs")
        out: list[tuple[tuple[int | None, float], ...]] = []
        for i in range(start, start + n):
            row = self.as_list(rows[i], "a top-logprobs row") if i < len(rows) and rows[i] is not None else []
            pairs = sorted((self._top(e) for e in row), key=lambda p: -p[1])
            out.append(tuple(pairs[: self._top_k]))
        return out

    def _top(self, entry: Any) -> tuple[int | None, float]:
        entry = self.as_list(entry, "a top entry")
        return self.as_int(entry[1], "a top id"), self.as_logprob(entry[0], "a top logprob")

    def _finish(self, finish: Any) -> tuple[str | None, int | None]:
        if finish is None:
            return None, None
        if not isinstance(finish, dict):
            raise TypeError(f"finish_reason is {finish!r}")
        kind = finish.get("type")
        if kind == "length":
            return "length", None
        if kind == "abort":
            raise ServerError(
                f"{self._uri}: SGLang aborted the request: {str(finish.get('message'))[:300]}",
                url=self._uri,
                body=finish,
                kind="stream_error",
            )
        matched = finish.get("matched")
        if isinstance(matched, int) and not isinstance(matched, bool):
            return "eos", matched
        return "eos", None  # a stop string or an unnamed stop: the end of the turn

    def _tokens(self, new: list, tops: list, delta: str, eos_last: bool) -> list[StreamedToken]:
        pieces = self._pieces.split(delta, [t for _, _, t in new], eos_last)
        return [
            StreamedToken(token, piece, logprob, top)
            for (token, logprob, _), piece, top in zip(new, pieces, tops, strict=True)
        ]


from_sglang = server_factory(
    SglangBackend,
    "sglang",
    30000,
    """Connect to a running SGLang server (registry: `sglang://HOST:PORT`, `+https` for TLS).

    `model`: the served model name (optional: SGLang serves one). Options: n_predict (tokens per request),
    chat_template (the model's tokenizer_config.json or a .jinja file; else $SURPRISEGATE_CHAT_TEMPLATE). The
    key, if the server wants one (`--api-key`), comes from $SURPRISEGATE_SERVER_KEY only.""",
)

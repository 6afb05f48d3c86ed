"""llama.cpp's `llama-server` as a steerable backend: `--backend llama-server://HOST:PORT` (`+https` for TLS).

The whole gate runs over HTTP on the server's native endpoints (DESIGN §4; wire samples in
../shared/wire/captured/):

- tokenize: `POST /tokenize {"content", "parse_special", "with_pieces": true}`. The server's default is
  `parse_special: true`; we always send it, false for everything except the chat template's own pieces,
  so untrusted text never becomes control tokens (DESIGN §8).
- chat template: `POST /apply-template`. One exception: a message list that ends with an assistant
  message. The server then *continues* that message (its assistant prefill) instead of closing it, so the
  template's closing piece cannot be read from it; that one render is made here with the server's own
  template (`/props` chat_template, as llama-cpp-python renders it in process) and checked against the
  server's render of the same prefix.
- decoding: `POST /completion` with the context as a token-id array, `stream`, `cache_prompt` (the server
  keeps the longest common prefix of its slot's KV cache: a resume after a rewind re-processes only the
  new tokens), `n_probs` (top-k logprobs of the raw distribution), `return_tokens` and
  `timings_per_token` (so the first chunk already says how many prompt tokens came from the cache).
  Closing the iterator closes the connection; the server cancels the request at its next write.

Signals. Surprise is exact: the stream carries the chosen token's own logprob under the raw (temperature
1, unbiased) distribution, whatever was sampled. Entropy is estimated from the top `SIGNAL_TOP_K` (20)
logprobs with `surprise.topk_entropy` (midpoint of the tight bounds for the missing mass, with the
server's vocabulary size from `/v1/models`); calibrate per model and per k (DESIGN §4).

Sampling. The server samples: greedy is `temperature: 0` (its temperature sampler keeps the first
highest logit, as numpy's argmax); a temperature T > 0 samples softmax(logits / T) with `samplers:
["temperature"]` (no top-k/top-p/min-p truncation, as `Sampling.choose` in process) and a seed per request
derived from `Sampling.seed` and the request's number in the session: reproducible run to run, not the
in-process random stream.

Bans. `banned` applies to the first step only: that step is a request of its own with `n_predict: 1` and
`logit_bias: [[id, false], ...]` (-inf, a sampler stage: the reported logprobs stay those of the raw
distribution); when the next step is asked for, a new request continues from the context plus that token
without the bias. The prefix cache makes the second request cost one token of prompt processing.

Token bytes. Every streamed token carries its raw bytes (`completion_probabilities[].bytes`, also for its
top-k alternatives) and `/tokenize` with `with_pieces` gives the bytes of the tokens of plain text: both are
cached. An id seen in neither is asked of `/detokenize` (a control token, such as <|im_end|>, has no
visible bytes: b"", as in process); a byte fragment of a UTF-8 character, which `/detokenize` cannot
return, comes from the vocabulary table (`vocab_bytes`: one 1-token request with `n_probs` = the
vocabulary size, loaded once).

Rewinds. `session.steps(tokens)` always sends the whole context; the server's prefix cache does the trim.
`last_continue` = (tokens dropped from what the session held, "trim"), or "reprefill" when the server
reports it recomputed the prefix we expected it to keep (another client took the slot, or `cache_prompt`
is off on the server). Each request's figures (prompt tokens, `cache_n`, prompt milliseconds, why it
stopped) are in `session.requests`; `session.last_cached` is the latest request's cached prompt tokens.

The key: `SURPRISEGATE_SERVER_KEY` is sent as `Authorization: Bearer` and never kept in a config, a
receipt or a repr.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import BackendError, InputError, MissingDependency
from ..surprise import surprise_bits, topk_entropy
from . import Sampling, Step, common_prefix
from .http_stream import KEY_ENV, Endpoint, EventStream, ServerError, Timeouts

SIGNAL_TOP_K = 20  # top-k logprobs asked for on every step: the entropy estimate needs them
DEFAULT_N_PREDICT = 256  # tokens per request; a reply that goes on past them continues in a new request
# The server computes probabilities in float32 and reports p = 0 as float's lowest (-3.4e38): clamp to the
# log of the smallest float32 denormal (surprise >= 149 bits), a finite lower bound on such a token's surprise.
LOGPROB_FLOOR = math.log(1.401298464324817e-45)
CACHE_LIMIT = 4096  # entries of the tokenize / chat-template caches
# End-of-generation token texts: llama.cpp's own rule (llama-vocab.cpp) marks every token with one of these
# texts as end of generation, plus its FIM pad / repo / file-separator tokens. `eos_token_ids` holds the
# ones the server's vocabulary has (one tokenize call), plus any token a stream stopped on as "eos".
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
             "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
             "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
             "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
             "<REPO>", "<reponame>", "<|file_sep|>")


class _LRU(OrderedDict):
    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > CACHE_LIMIT:
            self.popitem(last=False)
        return value


class LlamaServerBackend:
    """A steerable backend over a running llama.cpp server (one model; sessions are HTTP requests)."""

    name = "llama-server"

    def __init__(self, endpoint: Endpoint, model: str | None = None, n_predict: int = DEFAULT_N_PREDICT) -> None:
        self.endpoint = endpoint
        self.uri = endpoint.uri
        self.n_predict = int(n_predict)
        if self.n_predict < 1:
            raise InputError(f"n_predict={n_predict!r} must be a whole number >= 1 (tokens per request)")
        props = endpoint.request_json("GET", "/props")
        models = endpoint.request_json("GET", "/v1/models")
        if not isinstance(props, dict) or not isinstance(models, dict):
            raise BackendError(f"{endpoint.base}: /props or /v1/models is not a llama.cpp server's answer; "
                               "is --backend the right scheme for this server?")
        served = [m for m in models.get("data") or [] if isinstance(m, dict)]
        names = [str(m.get("id")) for m in served] + [str(a) for m in served for a in (m.get("aliases") or [])]
        if model and served and model not in names and Path(model).name not in names:
            raise BackendError(f"model={model!r} is not served by {self.uri} (it serves {', '.join(names)}); omit "
                               "--model for the server's own model, or start the server with that model")
        info = next((m for m in served if model in (m.get("id"), *(m.get("aliases") or []))),
                    served[0] if served else {})
        meta = info.get("meta") or {}
        self.model_id = str(info.get("id") or props.get("model_alias") or props.get("model_path") or "llama-server")
        self.n_vocab = int(meta.get("n_vocab") or 0) or None
        settings = props.get("default_generation_settings") or {}
        self.n_ctx = int(settings.get("n_ctx") or meta.get("n_ctx") or 0) or None
        self.build_info = props.get("build_info")
        self.total_slots = props.get("total_slots")
        self._chat_template = props.get("chat_template") or None
        self._bos_text = props.get("bos_token") or ""
        self._eos_text = props.get("eos_token") or ""
        self._lock = threading.Lock()
        self._token_bytes: dict[int, bytes] = {}
        self._tokenize_cache: _LRU = _LRU()
        self._template_cache: _LRU = _LRU()
        self._vocab_bytes: list[bytes] | None = None
        self._learned_eos: set[int] = set()
        self._eos_base: frozenset[int] | None = None  # found on first use

    def __repr__(self) -> str:
        return f"LlamaServerBackend({self.uri!r}, model_id={self.model_id!r})"

    @property
    def info(self) -> dict[str, Any]:
        """What a receipt may say about the server (never the key)."""
        return {"uri": self.uri, "model_id": self.model_id, "build_info": self.build_info, "n_ctx": self.n_ctx,
                "n_vocab": self.n_vocab, "slots": self.total_slots}

    # --- tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"text={text!r} must be a string to tokenize")
        if not text:
            return []
        return list(self._tokenize_cache.get_or((text, bool(special)), lambda: tuple(self._tokenize(text, special))))

    def _tokenize(self, text: str, special: bool) -> list[int]:
        body = self.endpoint.request_json("POST", "/tokenize", {"content": text, "add_special": False,
                                                               "parse_special": bool(special), "with_pieces": True})
        try:
            entries = body["tokens"]
            ids = [int(e["id"]) if isinstance(e, dict) else int(e) for e in entries]
        except (KeyError, TypeError, ValueError):
            raise BackendError(f"{self.endpoint.base}/tokenize: unexpected answer {str(body)[:200]}; is this a "
                               "llama.cpp server?") from None
        if not special:  # pieces of plain text: never a control token, safe to keep as the token's bytes
            for e in entries:
                if isinstance(e, dict) and "piece" in e:
                    piece = e["piece"]
                    raw = piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)
                    self._token_bytes.setdefault(int(e["id"]), raw)
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._token_bytes.get(token_id)
        if cached is not None:
            return cached
        if token_id in self.eos_token_ids:
            raw = b""
        else:
            raw = self._lookup_bytes(int(token_id))
        self._token_bytes[token_id] = raw
        return raw

    def _lookup_bytes(self, token_id: int) -> bytes:
        if self._vocab_bytes is None:
            body = self.endpoint.request_json("POST", "/detokenize", {"tokens": [token_id]})
            text = body.get("content", "") if isinstance(body, dict) else ""
            if text and "\ufffd" not in text:
                # /detokenize renders control tokens as their text: one that only parses as itself with
                # special-token parsing on is a control token, invisible in a reply (b"", as in process).
                if self.tokenize(text, special=True) == [token_id] and self.tokenize(text) != [token_id]:
                    return b""
                return text.encode("utf-8")
        table = self.vocab_bytes()
        if not 0 <= token_id < len(table):
            raise InputError(f"token_id={token_id} is outside the server's vocabulary of {len(table)} tokens")
        return table[token_id]

    def vocab_bytes(self) -> list[bytes]:
        """Every token's raw bytes (b"" for control tokens), from one 1-token request with `n_probs` = the
        vocabulary size (a few MB once; it reuses a slot, so the server's prefix cache is lost once)."""
        with self._lock:
            if self._vocab_bytes is None:
                if not self.n_vocab:
                    raise BackendError(f"{self.uri} did not report its vocabulary size (/v1/models meta.n_vocab)")
                probe = self.tokenize("a") or [0]
                body = self.endpoint.request_json("POST", "/completion", {
                    "prompt": probe[:1], "n_predict": 1, "n_probs": self.n_vocab, "temperature": 0,
                    "cache_prompt": False, "stream": False})
                table: list[bytes | None] = [None] * self.n_vocab
                for entry in (body.get("completion_probabilities") or [{}])[0].get("top_logprobs") or []:
                    table[int(entry["id"])] = bytes(entry.get("bytes") or [])
                missing = sum(b is None for b in table)
                if missing:
                    raise BackendError(f"{self.uri} returned the bytes of {self.n_vocab - missing} of {self.n_vocab} "
                                       "tokens for n_probs = the vocabulary size; this server caps n_probs")
                self._vocab_bytes = [b or b"" for b in table]
            return self._vocab_bytes

    @property
    def control_token_ids(self) -> frozenset[int]:
        """Tokens with no visible bytes: control (turn markers, end of text) and unknown tokens."""
        return frozenset(i for i, b in enumerate(self.vocab_bytes()) if not b)

    def _find_eos(self) -> frozenset[int]:
        texts = [t for t in dict.fromkeys((self._eos_text, *EOG_TEXTS)) if t]
        body = self.endpoint.request_json("POST", "/tokenize", {"content": "\n".join(texts), "add_special": False,
                                                               "parse_special": True, "with_pieces": True})
        found = {int(e["id"]) for e in body.get("tokens") or []
                 if isinstance(e, dict) and isinstance(e.get("piece"), str) and e["piece"] in texts}
        return frozenset(found)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        if self._eos_base is None:
            self._eos_base = self._find_eos()
        return self._eos_base | frozenset(self._learned_eos)

    def _learn_eos(self, token: int) -> None:
        if token not in self.eos_token_ids:
            self._learned_eos.add(token)
            self._token_bytes.setdefault(token, b"")

    # --- chat template ------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        key = (tuple((m["role"], m["content"]) for m in msgs), bool(add_generation_prompt))
        return self._template_cache.get_or(key, lambda: self._chat_prompt(msgs, bool(add_generation_prompt)))

    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if msgs and msgs[-1]["role"] == "assistant":
            # The server would continue this message (assistant prefill) rather than close it: render here
            # with its template, after checking that our render agrees with the server's where both apply.
            local = self._render_local(msgs, add_generation_prompt)
            continued = self._apply_template(msgs, True)
            if not local.startswith(continued.rstrip()):
                raise BackendError(f"{self.uri}: rendering its chat template here gave {local[:80]!r}, the server "
                                   f"gave {continued[:80]!r}; this template is not supported over HTTP yet "
                                   "(use injection='inline')")
            return local
        return self._apply_template(msgs, add_generation_prompt)

    def _apply_template(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        body = self.endpoint.request_json("POST", "/apply-template",
                                          {"messages": msgs, "add_generation_prompt": add_generation_prompt})
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BackendError(f"{self.endpoint.base}/apply-template: unexpected answer {str(body)[:200]}")
        return body["prompt"]

    def _render_local(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if not self._chat_template:
            raise BackendError(f"{self.uri} reports no chat template (/props chat_template); serve a chat model")
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise MissingDependency("rendering a closed assistant turn of the server's chat template needs jinja2: "
                                    "pip install 'surprisegate[llama-server]' (or jinja2)") from None

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: time.strftime(fmt))
        return env.from_string(self._chat_template).render(
            messages=msgs, bos_token=self._bos_text, eos_token=self._eos_text,
            add_generation_prompt=add_generation_prompt)

    # --- sessions -----------------------------------------------------------------------------------
    def session(self) -> "LlamaServerSession":
        return LlamaServerSession(self)

    def close(self) -> None:
        self.endpoint.close()

    # --- one streamed request -------------------------------------------------------------------------
    def _request_body(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> dict:
        n_predict = 1 if banned else self.n_predict
        if self.n_ctx:
            room = self.n_ctx - len(prompt)
            if room <= 0:
                raise BackendError(f"context would hold {len(prompt) + 1} tokens, more than the server's "
                                   f"n_ctx={self.n_ctx} per slot; start llama-server with a larger -c, or shorten "
                                   "the prompt")
            n_predict = min(n_predict, room)
        body: dict[str, Any] = {
            "prompt": prompt, "n_predict": n_predict, "stream": True, "cache_prompt": True,
            "return_tokens": True, "timings_per_token": True,
            # Bytes ride on the probabilities: at least the chosen token's, the top 20 when scored.
            "n_probs": max(sampling.top_logprobs, SIGNAL_TOP_K) if sampling.scored else 1,
            "temperature": max(0.0, float(sampling.temperature)), "samplers": ["temperature"],
            "seed": seed, "ignore_eos": False,
        }
        if banned:
            body["logit_bias"] = [[int(t), False] for t in sorted(banned)]
        return body


class LlamaServerSession:
    """One request's context on a llama.cpp server. The server's slot holds the KV cache; we hold the ids."""

    def __init__(self, backend: LlamaServerBackend) -> None:
        self._backend = backend
        self._held: list[int] = []  # the context as the seam sees it: prompt + tokens fed so far
        self._slot_held: list[int] = []  # what our latest request left in the server's slot (received tokens)
        self._last: tuple[int, str] = (0, "trim")
        self._stream: EventStream | None = None
        self._generation = 0  # bumped by every steps(): an older iterator may no longer feed the context
        self._n_requests = 0
        self._closed = False
        self.requests: list[dict[str, Any]] = []  # one record per HTTP request (see _record)

    @property
    def tokens(self) -> Sequence[int]:
        return tuple(self._held)

    @property
    def last_continue(self) -> tuple[int, str]:
        return self._last

    @property
    def last_cached(self) -> int | None:
        """Prompt tokens the server took from its cache for the latest request (`timings.cache_n`)."""
        return self.requests[-1].get("cached") if self.requests else None

    @property
    def last_request(self) -> dict[str, Any] | None:
        return self.requests[-1] if self.requests else None

    def close(self) -> None:
        self._abort()
        self._closed = True
        self._held, self._slot_held = [], []

    def _abort(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def steps(self, tokens: Sequence[int], sampling: Sampling, *, batch_until: int | None = None,
              banned: frozenset[int] = frozenset()) -> "_Steps":
        """Send the request now (errors and `last_continue` are known on return) and return its steps.
        `batch_until` does not apply: the server schedules its own batches."""
        if self._closed:
            raise BackendError("this llama-server session is closed; open a new one with backend.session()")
        target = [int(t) for t in tokens]
        if not target:
            raise ValueError("steps() needs at least one token of context (the prompt)")
        self._abort()
        self._generation += 1
        common = common_prefix(self._held, target)
        dropped = len(self._held) - common
        expected = common_prefix(self._slot_held, target)
        first = self._open(target, sampling, frozenset(banned))
        cached = self.requests[-1].get("cached")
        # The server always recomputes at least the last prompt token; less than that from its cache means
        # it rebuilt the prefix we left there (another request took the slot, or prompt caching is off).
        rebuilt = cached is not None and expected > 1 and cached < min(expected, len(target) - 1)
        method = "reprefill" if rebuilt else "trim"
        self._last = (dropped, method)
        self.requests[-1]["dropped"], self.requests[-1]["method"] = dropped, method
        self._held = list(target)
        return _Steps(self, self._generation, sampling, first)

    def _open(self, prompt: list[int], sampling: Sampling, banned: frozenset[int]) -> Iterator[Any]:
        """Start one streamed /completion from `prompt`; read its first event (the status line comes with
        it) and return the events, first included."""
        backend = self._backend
        seed = (int(sampling.seed) + 1_000_003 * self._n_requests) % (2**32 - 1)
        body = backend._request_body(prompt, sampling, banned, seed)
        self._n_requests += 1
        record: dict[str, Any] = {"request": self._n_requests, "path": "token-ids", "prompt_tokens": len(prompt),
                                  "n_predict": body["n_predict"], "banned": sorted(banned), "cached": None,
                                  "prompt_n": None, "prompt_ms": None, "received": 0, "stop_type": None}
        self.requests.append(record)
        stream = backend.endpoint.stream("/completion", body)
        self._stream = stream
        self._slot_held = list(prompt)
        events = iter(stream)
        try:
            first = next(events)
        except StopIteration:
            stream.close()
            raise ServerError(f"{stream.url}: the stream ended before its first event; check the server's log",
                              url=stream.url, kind="truncated") from None
        self._note(record, first)

        def chained() -> Iterator[Any]:
            yield first
            yield from events
        return chained()

    def _note(self, record: dict[str, Any], event: Any) -> None:
        if isinstance(event, dict):
            timings = event.get("timings")
            if isinstance(timings, dict):
                record["cached"] = timings.get("cache_n", record["cached"])
                record["prompt_n"] = timings.get("prompt_n", record["prompt_n"])
                record["prompt_ms"] = timings.get("prompt_ms", record["prompt_ms"])
            if event.get("stop"):
                record["stop_type"] = event.get("stop_type")
                record["tokens_cached"] = event.get("tokens_cached")
                record["id_slot"] = event.get("id_slot")


class _Steps:
    """The steps of a session's `steps()` call: an iterator whose `close()` aborts the HTTP stream."""

    def __init__(self, session: LlamaServerSession, generation: int, sampling: Sampling, events: Iterator[Any]):
        self._session, self._generation, self._sampling = session, generation, sampling
        self._gen = self._run(events)

    def __iter__(self) -> "_Steps":
        return self

    def __next__(self) -> Step:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()
        if self._session._generation == self._generation:
            self._session._abort()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check_current(self) -> None:
        if self._session._generation != self._generation or self._session._closed:
            raise BackendError("these steps were superseded by a later steps() call (or the session was closed); "
                               "continue from the newer iterator")

    def _run(self, events: Iterator[Any]) -> Iterator[Step]:
        session, backend = self._session, self._session._backend
        record = session.requests[-1]
        while True:
            stream = session._stream
            finished = False
            for event in events:
                if event is None:  # [DONE]: not sent by /completion, tolerated
                    continue
                if not isinstance(event, dict):
                    raise ServerError(f"{stream.url if stream else backend.uri}: unexpected stream event "
                                      f"{str(event)[:120]}", url=backend.endpoint.base, kind="bad_event")
                if "error" in event:
                    err = event["error"]
                    message = err.get("message", err) if isinstance(err, dict) else err
                    session._abort()
                    raise ServerError(f"{backend.endpoint.base}/completion: the server reported an error mid-stream: "
                                      f"{message}", url=backend.endpoint.base + "/completion", body=event,
                                      kind="stream_error")
                session._note(record, event)
                for token, entry in _tokens_of(event):
                    record["received"] += 1
                    session._slot_held.append(token)
                    step = self._step(token, entry)
                    yield step
                    # Reached only when the next step is asked for: now the token is part of the context.
                    self._check_current()
                    session._held.append(token)
                if event.get("stop"):
                    if event.get("stop_type") == "eos" and session._slot_held:
                        backend._learn_eos(session._slot_held[-1])
                    finished = True
                    break
            if not finished:
                url = stream.url if stream else backend.uri
                session._abort()
                raise ServerError(f"{url}: the stream ended without its final chunk (stop: true); the server closed "
                                  "the connection mid-reply", url=url, kind="truncated")
            # The request is done (end of turn or n_predict): the reply goes on from what the context holds.
            self._check_current()
            session._abort()
            events = session._open(list(session._held), self._sampling, frozenset())
            record = session.requests[-1]

    def _step(self, token: int, entry: dict | None) -> Step:
        backend, sampling = self._session._backend, self._sampling
        if entry is None:  # no probabilities in the chunk: bytes from the cache, signals unknown
            return Step(token, backend.token_bytes(token), math.nan, math.nan)
        piece = bytes(entry.get("bytes") or [])
        backend._token_bytes.setdefault(token, piece)
        tops: list[tuple[int, float]] = []
        for alt in entry.get("top_logprobs") or []:
            tid = int(alt["id"])
            tops.append((tid, max(float(alt["logprob"]), LOGPROB_FLOOR)))
            if "bytes" in alt:
                backend._token_bytes.setdefault(tid, bytes(alt["bytes"]))
        if not sampling.scored:
            return Step(token, piece, math.nan, math.nan)
        logprob = max(float(entry["logprob"]), LOGPROB_FLOOR)
        try:
            entropy = topk_entropy([lp for _, lp in tops], vocab_size=backend.n_vocab) if tops else math.nan
        except InputError:
            entropy = math.nan
        top = tuple(tops[:sampling.top_logprobs]) if sampling.top_logprobs else ()
        return Step(token, piece, surprise_bits(logprob), entropy, top)


def _tokens_of(event: dict) -> list[tuple[int, dict | None]]:
    """(token id, its probabilities entry) for each token a /completion chunk carries (one, or several with
    speculative decoding; none in the final chunk)."""
    probs = event.get("completion_probabilities") or []
    ids = event.get("tokens")
    if not isinstance(ids, list) or (not ids and probs):
        ids = [p.get("id") for p in probs]
    out = []
    for i, token in enumerate(ids):
        entry = probs[i] if i < len(probs) and isinstance(probs[i], dict) else None
        out.append((int(token), entry))
    return out


# --------------------------------------------------------------------------------------------------
# the factory
# --------------------------------------------------------------------------------------------------
def from_llama_server(model: str | None = None, host: str = "127.0.0.1", port: int = 8080, tls: bool = False,
                      *, n_predict: int = DEFAULT_N_PREDICT, connect_timeout: float | None = None,
                      first_byte_timeout: float | None = None, idle_timeout: float | None = None,
                      **_: Any) -> LlamaServerBackend:
    """Connect to a running llama.cpp server (registry: `llama-server://HOST:PORT`, `+https` for TLS).

    `model` is optional: the server serves its own; if given it must be one the server names. The key, if the
    server wants one, comes from $SURPRISEGATE_SERVER_KEY only. Local-model options (n_ctx, threads, seed)
    do not apply: the server was started with its own.
    """
    defaults = Timeouts()
    timeouts = Timeouts(connect=connect_timeout or defaults.connect,
                        first_byte=first_byte_timeout or defaults.first_byte, idle=idle_timeout or defaults.idle)
    endpoint = Endpoint(host, port, tls=tls, key=os.environ.get(KEY_ENV) or None, timeouts=timeouts)
    return LlamaServerBackend(endpoint, model=model, n_predict=n_predict)


# --------------------------------------------------------------------------------------------------
# a llama-server process on loopback (tests, `bench http`, users who want one)
# --------------------------------------------------------------------------------------------------
BINARY_ENV = "SURPRISEGATE_LLAMA_SERVER"  # path of a llama-server binary to use
BIN_DIR_ENV = "SURPRISEGATE_BIN"  # where scripts/build_llama_server.sh caches it


def find_llama_server() -> Path | None:
    """The llama-server binary: $SURPRISEGATE_LLAMA_SERVER, else the one `make llama-server` cached in
    $SURPRISEGATE_BIN (default ~/.cache/surprisegate/bin), else one on PATH."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    cached = Path(os.environ.get(BIN_DIR_ENV) or Path.home() / ".cache" / "surprisegate" / "bin") / "llama-server"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LlamaServerProcess:
    """Start `llama-server` on a free loopback port with a GGUF (default: the embedded SmolLM2-135M), wait
    until `/health` says ok, stop it on `stop()` / leaving the `with` block.

    `flash_attn` defaults to "off", as llama-cpp-python's default in process: the server's own default
    ("auto") turns flash attention on for the CPU, which moved the embedded model's surprises by up to
    0.27 bits and changed 1 of 3 greedy replies; with it off, the replies were the same and the surprises
    within 0.0003 bits (3 questions, 24 tokens each).
    """

    def __init__(self, model: str | os.PathLike | None = None, *, binary: str | os.PathLike | None = None,
                 host: str = "127.0.0.1", port: int | None = None, threads: int | None = None, n_ctx: int = 4096,
                 parallel: int = 1, flash_attn: str = "off", extra_args: Sequence[str] = (),
                 log_path: str | os.PathLike | None = None, startup_timeout: float = 120.0) -> None:
        found = Path(binary) if binary else find_llama_server()
        if found is None or not found.is_file():
            raise MissingDependency("llama-server is not built: run `make llama-server` "
                                    "(scripts/build_llama_server.sh, about 7.5 minutes once) or set "
                                    f"${BINARY_ENV} to a llama-server binary")
        if model is None:
            from .llamacpp import embedded_model_path

            model = embedded_model_path()
        self.binary, self.model, self.host = found, Path(model), host
        self.port = port
        self.threads = threads or os.cpu_count() or 1
        self.n_ctx, self.parallel, self.flash_attn, self.extra_args = n_ctx, parallel, flash_attn, list(extra_args)
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def uri(self) -> str:
        return f"llama-server://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [str(self.binary), "-m", str(self.model), "--host", self.host, "--port", str(self.port),
                "-t", str(self.threads), "-c", str(self.n_ctx), "-np", str(self.parallel), "-fa", self.flash_attn,
                "--no-webui", *self.extra_args]

    def start(self) -> "LlamaServerProcess":
        if self.process is not None:
            return self
        for attempt in range(3):  # a free port can be taken between probing and binding: try another
            if self.port is None or attempt:
                self.port = free_port(self.host)
            self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=self._log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_healthy():
                return self
            self.stop()
        raise BackendError(f"llama-server did not come up on {self.host} ({' '.join(self.argv())}); "
                           f"see {self.log_path or 'its log (pass log_path)'}")

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        endpoint = Endpoint(self.host, int(self.port), timeouts=Timeouts(connect=1.0, first_byte=5.0, idle=5.0))
        try:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    return False
                try:
                    if (endpoint.request_json("GET", "/health") or {}).get("status") == "ok":
                        return True
                except ServerError:
                    pass
                time.sleep(0.1)
        finally:
            endpoint.close()
        return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except OSError:
                process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    process.kill()
                process.wait(timeout=10)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None

    def __enter__(self) -> "LlamaServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

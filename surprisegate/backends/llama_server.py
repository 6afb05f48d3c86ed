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
["temperature"]` and a seed per request derived from `Sampling.seed` and the request's number in the
session: reproducible run to run, not the in-process random stream. A client's top-k, top-p, min-p,
penalties and logit bias (`Sampling.shaping`) go in as the server's own sampler stages (`sampler_chain`);
the logprobs it streams stay the raw distribution's, so the signal does not move with them.

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

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import BackendError, InputError, MissingDependency
from ..gate.tools import ToolRendering
from . import LOGPROB_FLOOR, Sampling
from .grammar import ServerGrammars, request_grammar
from .http_session import (
    DEFAULT_N_PREDICT,
    SIGNAL_TOP_K,
    Chunk,
    ServerBackend,
    ServerRequest,
    ServerSession,
    StreamedToken,
    server_factory,
)
from .http_stream import Endpoint, ServerError, Timeouts
from .http_tokens import EOG_TEXTS, LRU, render_chat_template
from .samplers import Shaping

__all__ = [
    "DEFAULT_N_PREDICT",
    "EOG_TEXTS",
    "LOGPROB_FLOOR",
    "SIGNAL_TOP_K",
    "LlamaServerBackend",
    "LlamaServerProcess",
    "find_llama_server",
    "free_port",
    "from_llama_server",
]
LlamaServerSession = ServerSession  # the session of this backend is the shared one (http_session.py)


class LlamaServerBackend(ToolRendering, ServerGrammars, ServerBackend):
    """A steerable backend over a running llama.cpp server (one model; sessions are HTTP requests)."""

    name = "llama-server"
    context_fix = "start llama-server with a larger -c (n_ctx per slot)"

    def __init__(self, endpoint: Endpoint, model: str | None = None, n_predict: int = DEFAULT_N_PREDICT) -> None:
        super().__init__(endpoint, n_predict)
        props = endpoint.request_json("GET", "/props")
        models = endpoint.request_json("GET", "/v1/models")
        if not isinstance(props, dict) or not isinstance(models, dict):
            raise BackendError(
                f"{endpoint.base}: /props or /v1/models is not a llama.cpp server's answer; "
                "is --backend the right scheme for this server?"
            )
        served = [m for m in models.get("data") or [] if isinstance(m, dict)]
        names = [str(m.get("id")) for m in served] + [str(a) for m in served for a in (m.get("aliases") or [])]
        if model and served and model not in names and Path(model).name not in names:
            raise BackendError(
                f"model={model!r} is not served by {self.uri} (it serves {', '.join(names)}); omit "
                "--model for the server's own model, or start the server with that model"
            )
        info = next(
            (m for m in served if model in (m.get("id"), *(m.get("aliases") or []))), served[0] if served else {}
        )
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
        self._tokenize_cache: LRU = LRU()
        self._vocab_bytes: list[bytes] | None = None
        self._learned_eos: set[int] = set()
        self._eos_base: frozenset[int] | None = None  # found on first use

    def _info(self) -> dict[str, Any]:
        return {"prompts": "token-ids", "build_info": self.build_info, "slots": self.total_slots}

    # --- tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"text={text!r} must be a string to tokenize")
        if not text:
            return []
        return list(self._tokenize_cache.get_or((text, bool(special)), lambda: tuple(self._tokenize(text, special))))

    def _tokenize(self, text: str, special: bool) -> list[int]:
        body = self.endpoint.request_json(
            "POST",
            "/tokenize",
            {"content": text, "add_special": False, "parse_special": bool(special), "with_pieces": True},
        )
        try:
            entries = body["tokens"]
            ids = [int(e["id"]) if isinstance(e, dict) else int(e) for e in entries]
        except (KeyError, TypeError, ValueError):
            raise BackendError(
                f"{self.endpoint.base}/tokenize: unexpected answer {str(body)[:200]}; is this a llama.cpp server?"
            ) from None
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
                body = self.endpoint.request_json(
                    "POST",
                    "/completion",
                    {
                        "prompt": probe[:1],
                        "n_predict": 1,
                        "n_probs": self.n_vocab,
                        "temperature": 0,
                        "cache_prompt": False,
                        "stream": False,
                    },
                )
                table: list[bytes | None] = [None] * self.n_vocab
                for entry in (body.get("completion_probabilities") or [{}])[0].get("top_logprobs") or []:
                    table[int(entry["id"])] = bytes(entry.get("bytes") or [])
                missing = sum(b is None for b in table)
                if missing:
                    raise BackendError(
                        f"{self.uri} returned the bytes of {self.n_vocab - missing} of {self.n_vocab} "
                        "tokens for n_probs = the vocabulary size; this server caps n_probs"
                    )
                self._vocab_bytes = [b or b"" for b in table]
            return self._vocab_bytes

    @property
    def control_token_ids(self) -> frozenset[int]:
        """Tokens with no visible bytes: control (turn markers, end of text) and unknown tokens."""
        return frozenset(i for i, b in enumerate(self.vocab_bytes()) if not b)

    def _find_eos(self) -> frozenset[int]:
        texts = [t for t in dict.fromkeys((self._eos_text, *EOG_TEXTS)) if t]
        body = self.endpoint.request_json(
            "POST",
            "/tokenize",
            {"content": "\n".join(texts), "add_special": False, "parse_special": True, "with_pieces": True},
        )
        found = {
            int(e["id"])
            for e in body.get("tokens") or []
            if isinstance(e, dict) and isinstance(e.get("piece"), str) and e["piece"] in texts
        }
        return frozenset(found)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        if self._eos_base is None:
            self._eos_base = self._find_eos()
        return self._eos_base | frozenset(self._learned_eos)

    def learn_eos(self, token: int) -> None:
        if token not in self.eos_token_ids:
            self._learned_eos.add(token)
            self._token_bytes.setdefault(token, b"")

    # --- chat template ------------------------------------------------------------------------------
    renders_tools = True  # tools and tool turns: the server's template rendered here (tools.ToolRendering)

    def _plain_chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return ServerBackend.chat_prompt(self, messages, add_generation_prompt)  # the server renders it (cached)

    def _tool_template_parts(self) -> tuple[str, str, str]:
        """The server's template with tools, rendered as llama.cpp's server renders it (`--jinja`)."""
        if not self._chat_template:
            raise BackendError(f"{self.uri} reports no chat template (/props chat_template); serve a chat model")
        return self._chat_template, self._bos_text, self._eos_text

    def _chat_prompt(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if msgs and msgs[-1]["role"] == "assistant":
            # The server would continue this message (assistant prefill) rather than close it: render here
            # with its template, after checking that our render agrees with the server's where both apply.
            local = self._render_local(msgs, add_generation_prompt)
            continued = self._apply_template(msgs, True)
            if not local.startswith(continued.rstrip()):
                raise BackendError(
                    f"{self.uri}: rendering its chat template here gave {local[:80]!r}, the server "
                    f"gave {continued[:80]!r}; this template is not supported over HTTP yet "
                    "(use injection='inline')"
                )
            return local
        return self._apply_template(msgs, add_generation_prompt)

    def _apply_template(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        body = self.endpoint.request_json(
            "POST", "/apply-template", {"messages": msgs, "add_generation_prompt": add_generation_prompt}
        )
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BackendError(f"{self.endpoint.base}/apply-template: unexpected answer {str(body)[:200]}")
        return body["prompt"]

    def _render_local(self, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if not self._chat_template:
            raise BackendError(f"{self.uri} reports no chat template (/props chat_template); serve a chat model")
        return render_chat_template(self._chat_template, msgs, self._bos_text, self._eos_text, add_generation_prompt)

    # --- one streamed request (the hooks of http_session.ServerSession) --------------------------------
    def stream_request(self, prompt: list[int], sampling: Sampling, banned: frozenset[int], seed: int) -> ServerRequest:
        grammar = request_grammar(prompt, sampling)  # a ban then holds for the request (grammar.request_grammar)
        n_predict = self.budget(prompt, banned if grammar is None else frozenset())
        body: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": n_predict,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
            "timings_per_token": True,
            # Bytes ride on the probabilities: at least the chosen token's, the top 20 when scored.
            "n_probs": max(sampling.top_logprobs, SIGNAL_TOP_K) if sampling.scored else 1,
            "temperature": max(0.0, float(sampling.temperature)),
            "seed": seed,
            "ignore_eos": False,
        } | sampler_chain(sampling.shaping)
        if grammar is not None:  # structured output: the server samples under it
            body["grammar"] = grammar
        bias = [[int(t), float(b)] for t, b in sorted(sampling.shaping.logit_bias.items()) if t not in banned]
        bias += [[int(t), False] for t in sorted(banned)]
        if bias:
            body["logit_bias"] = bias
        return ServerRequest("/completion", body, "sse", "token-ids", n_predict, body["n_probs"])

    def stream_parser(self, request: ServerRequest) -> _CompletionParser:
        return _CompletionParser(self)


def sampler_chain(shaping: Shaping) -> dict[str, Any]:
    """llama.cpp's sampler stages for a reply's settings, in its default order (penalties, top-k, top-p,
    min-p, temperature); with none set the chain is the temperature alone, as in process. Its penalties read
    the context's last repeat_last_n tokens for all three (OpenAI's frequency and presence count the reply's
    own tokens in process: within a short reply the two agree where the prompt does not repeat the token)."""
    stages: list[str] = []
    fields: dict[str, Any] = {}
    if shaping.penalises:
        stages.append("penalties")
        fields |= {
            "repeat_penalty": shaping.repeat_penalty,
            "repeat_last_n": shaping.repeat_last_n,
            "frequency_penalty": shaping.frequency_penalty,
            "presence_penalty": shaping.presence_penalty,
        }
    for stage, value, off in (
        ("top_k", shaping.top_k, 0),
        ("top_p", shaping.top_p, 1.0),
        ("min_p", shaping.min_p, 0.0),
    ):
        if value != off:
            stages.append(stage)
            fields[stage] = value
    return {"samplers": [*stages, "temperature"], **fields}


class _CompletionParser:
    """The chunks of one streamed /completion: per chunk `tokens` and `completion_probabilities[{id, token,
    bytes, logprob, top_logprobs}]`; the final chunk has `stop: true`, `stop_type`, `timings` and no tokens."""

    def __init__(self, backend: LlamaServerBackend) -> None:
        self._backend = backend
        self._last: int | None = None  # the request's last token: the one a stop of type "eos" stopped on

    def feed(self, event: Any) -> Chunk:
        if not isinstance(event, dict):
            raise ServerError(
                f"{self._backend.endpoint.base}/completion: unexpected stream event {str(event)[:120]}",
                url=self._backend.endpoint.base,
                kind="bad_event",
            )
        notes: dict[str, Any] = {}
        timings = event.get("timings")
        if isinstance(timings, dict):
            notes.update(
                cached=timings.get("cache_n"), prompt_n=timings.get("prompt_n"), prompt_ms=timings.get("prompt_ms")
            )
        tokens = [self._token(token, entry) for token, entry in _tokens_of(event)]
        if tokens:
            self._last = tokens[-1].token
        if not event.get("stop"):
            return Chunk(tokens, notes=notes)
        stop_type = event.get("stop_type")
        notes.update(stop_type=stop_type, tokens_cached=event.get("tokens_cached"), id_slot=event.get("id_slot"))
        end = "eos" if stop_type == "eos" else "length" if stop_type == "limit" else str(stop_type or "stop")
        return Chunk(tokens, end, self._last if end == "eos" else None, notes)

    def _token(self, token: int, entry: dict | None) -> StreamedToken:
        backend = self._backend
        if entry is None:  # no probabilities in the chunk: bytes from the cache, signals unknown
            return StreamedToken(token, None)
        piece = bytes(entry.get("bytes") or [])
        backend._token_bytes.setdefault(token, piece)
        tops: list[tuple[int | None, float]] = []
        for alt in entry.get("top_logprobs") or []:
            tid = int(alt["id"])
            tops.append((tid, max(float(alt["logprob"]), LOGPROB_FLOOR)))
            if "bytes" in alt:
                backend._token_bytes.setdefault(tid, bytes(alt["bytes"]))
        return StreamedToken(token, piece, float(entry["logprob"]), tuple(tops))


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
from_llama_server = server_factory(
    LlamaServerBackend,
    "llama-server",
    8080,
    """Connect to a running llama.cpp server (registry: `llama-server://HOST:PORT`, `+https` for TLS).

    `model` is optional: the server serves its own; if given it must be one the server names. The key, if the
    server wants one, comes from $SURPRISEGATE_SERVER_KEY only. Local-model options (n_ctx, threads, seed)
    do not apply: the server was started with its own.""",
)


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

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        binary: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        threads: int | None = None,
        n_ctx: int = 4096,
        parallel: int = 1,
        flash_attn: str = "off",
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        found = Path(binary) if binary else find_llama_server()
        if found is None or not found.is_file():
            raise MissingDependency(
                "llama-server is not built: run `make llama-server` "
                "(scripts/build_llama_server.sh, about 7.5 minutes once) or set "
                f"${BINARY_ENV} to a llama-server binary"
            )
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
        self._log: Any = None  # the log file, or subprocess.DEVNULL

    @property
    def uri(self) -> str:
        return f"llama-server://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "-t",
            str(self.threads),
            "-c",
            str(self.n_ctx),
            "-np",
            str(self.parallel),
            "-fa",
            self.flash_attn,
            "--no-webui",
            *self.extra_args,
        ]

    def start(self) -> LlamaServerProcess:
        if self.process is not None:
            return self
        for attempt in range(3):  # a free port can be taken between probing and binding: try another
            if self.port is None or attempt:
                self.port = free_port(self.host)
            self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            self.process = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            if self._wait_healthy():
                return self
            self.stop()
        raise BackendError(
            f"llama-server did not come up on {self.host} ({' '.join(self.argv())}); "
            f"see {self.log_path or 'its log (pass log_path)'}"
        )

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        assert self.port is not None  # start() chose it
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

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""One registry of backends, addressed by name or URI (DESIGN.md §4), like `store/open.py` for stores.

`--backend llamacpp` or `--backend transformers` load an in-process model; `llama-server://HOST:PORT`,
`vllm://…`, `sglang://…`, `ollama://…` address inference servers and `openai`, `xai`, `gemini`,
`ollama-chat`, `anthropic` cloud chat APIs. Heavy dependencies are imported inside the factory.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from . import Backend


@dataclass(frozen=True)
class BackendEntry:
    name: str  # the name, or the URI scheme without "+https"
    kind: str  # "in-process" | "server" | "cloud"
    steerable: bool  # we choose where to cut and what to inject
    factory: str  # "module:function", imported on use; "" = not in this version yet
    model_help: str  # what --model means for it

    @property
    def addressed_by_uri(self) -> bool:
        return self.kind == "server"


BACKENDS: dict[str, BackendEntry] = {
    e.name: e
    for e in (
        BackendEntry(
            "llamacpp",
            "in-process",
            True,
            "surprisegate.backends.llamacpp:from_llamacpp",
            "GGUF path (default: the embedded SmolLM2-135M-Instruct)",
        ),
        BackendEntry(
            "transformers",
            "in-process",
            True,
            "surprisegate.backends.transformers:from_transformers",
            "Hugging Face model directory (default: the embedded model's directory, if converted)",
        ),
        BackendEntry(
            "llama-server",
            "server",
            True,
            "surprisegate.backends.llama_server:from_llama_server",
            "optional: the server's own model",
        ),
        BackendEntry("vllm", "server", True, "surprisegate.backends.vllm:from_vllm", "served model name"),
        BackendEntry("sglang", "server", True, "surprisegate.backends.sglang:from_sglang", "served model name"),
        BackendEntry("ollama", "server", True, "surprisegate.backends.ollama:from_ollama", "model name"),
        BackendEntry(
            "openai",
            "cloud",
            False,
            "surprisegate.backends.openai_chat:from_openai",
            "model name (e.g. gpt-4o-mini; any OpenAI-compatible server with --base-url)",
        ),
        BackendEntry("xai", "cloud", False, "surprisegate.backends.openai_chat:from_xai", "model name (e.g. grok-3)"),
        BackendEntry(
            "gemini", "cloud", False, "surprisegate.backends.gemini:from_gemini", "model name (e.g. gemini-2.0-flash)"
        ),
        BackendEntry(
            "ollama-chat",
            "cloud",
            False,
            "surprisegate.backends.ollama_chat:from_ollama_chat",
            "model name (e.g. llama3.2)",
        ),
        BackendEntry(
            "anthropic",
            "cloud",
            False,
            "surprisegate.backends.anthropic:from_anthropic",
            "model name (e.g. claude-haiku-4-5)",
        ),
    )
}


def parse_backend(spec: str) -> tuple[BackendEntry, dict[str, Any]]:
    """The registry entry for a `--backend` value and what its URI says (host, port, tls)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"backend={spec!r} is empty; use one of: {', '.join(names())}")
    spec = spec.strip()
    if "://" not in spec:
        entry = BACKENDS.get(spec)
        if entry is None or entry.addressed_by_uri:
            raise ConfigError(f"backend={spec!r} is not a known backend; use one of: {', '.join(names())}")
        return entry, {}
    parts = urlsplit(spec)
    scheme, _, transport = parts.scheme.partition("+")
    entry = BACKENDS.get(scheme)
    if entry is None or not entry.addressed_by_uri or transport not in ("", "https"):
        raise ConfigError(
            f"backend={spec!r}: {parts.scheme!r} is not a server scheme; use one of: "
            f"{', '.join(n + '://HOST:PORT' for n, e in BACKENDS.items() if e.addressed_by_uri)}"
            " (add +https for TLS)"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ConfigError(f"backend={spec!r} needs a host and a port, e.g. {scheme}://127.0.0.1:8080")
    return entry, {"host": parts.hostname, "port": port, "tls": transport == "https"}


def names() -> list[str]:
    return [n + ("://HOST:PORT" if e.addressed_by_uri else "") for n, e in BACKENDS.items()]


def open_backend(spec: str, model: str | None = None, **options: Any) -> Backend:
    """Load the backend `spec` names (a name or a URI) with `model` and backend options: a `SteerableBackend`
    where the entry says steerable, else a `BlackBoxBackend` (what it can do beyond: capabilities.py)."""
    entry, address = parse_backend(spec)
    if not entry.factory:
        raise ConfigError(
            f"backend={spec!r} ({entry.kind}) is not available in this version yet; "
            "use --backend llamacpp or --backend transformers"
        )
    module_name, _, function = entry.factory.partition(":")
    factory: Callable[..., Backend] = getattr(importlib.import_module(module_name), function)
    return factory(model, **address, **options)

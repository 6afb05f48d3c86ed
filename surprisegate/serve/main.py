"""From the command line's choices to a running server: the runtime (runtime.assemble), the admission
slots the backend allows, receipts and auth. cli.py's `serve` command calls `serve_forever`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.registry import parse_backend
from ..config import Config, ConfigLayers
from ..errors import InputError
from ..paths import home
from ..runtime import Runtime, assemble
from .app import ServeSettings, create_app, served_name
from .gate import RotatingReceipts
from .http import uvicorn_config
from .wire import Limits

DEFAULT_SESSIONS = 4  # concurrent replies on the embedded model: 4 x 4096-token KV streams, about 0.4 GB


@dataclass(frozen=True)
class ServeOptions:
    """The `serve` command's own options (the gate's are in the config layers)."""

    host: str = "127.0.0.1"
    port: int = 8000
    memory: str | None = "demo"
    tools: bool = True
    web: str | None = None
    sessions: int | None = None  # None: the config's, else DEFAULT_SESSIONS
    queue: int = 32
    receipts: str | None = None  # None: $SURPRISEGATE_HOME/serve-receipts.jsonl
    keep_receipts: bool = True
    receipts_max_mb: int = 64
    model_name: str | None = None
    allow_python: bool = False  # run clients' Python snippets: the operator's decision, off by default
    show_config: bool = False  # receipts sent to clients include the server's config (roots, prompts, paths)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (none by default)
    ui: bool = False  # the chat page at / (--ui)
    limits: Limits = field(default_factory=Limits)


def slots_for(layers: ConfigLayers, sessions: int | None, say: Callable[[str], None]) -> tuple[ConfigLayers, int]:
    """How many replies run at once, and the layers that give the backend that many sessions: the embedded
    llama.cpp model holds N sequences (config `sessions`); a server or cloud backend takes N requests at
    once (serve holds no model); another in-process model has one context, so one reply at a time."""
    base = layers.load()
    wanted = sessions if sessions is not None else (base.sessions if "sessions" in layers.given() else DEFAULT_SESSIONS)
    if not 1 <= wanted <= 64:
        raise InputError(f"--sessions={wanted} must be a whole number from 1 to 64, e.g. --sessions 4")
    entry, _ = parse_backend(base.backend)
    if entry.name == "llamacpp":
        return ConfigLayers(layers.config_file, {**layers.overrides, "sessions": wanted}, layers.env), wanted
    if entry.kind == "in-process":
        if wanted > 1:
            say(
                f"--backend {base.backend} holds one context: serving one reply at a time (--sessions {wanted} ignored)"
            )
        return layers, 1
    return layers, wanted


def build_settings(options: ServeOptions, slots: int, model_id: str) -> ServeSettings:
    receipts = None
    if options.keep_receipts:
        path = Path(options.receipts) if options.receipts else home() / "serve-receipts.jsonl"
        receipts = RotatingReceipts(path, max_bytes=options.receipts_max_mb << 20)
    if options.queue < 0:
        raise InputError(f"--queue={options.queue} must be 0 or more requests waiting, e.g. --queue 32")
    return ServeSettings(
        slots=slots,
        queue=options.queue,
        limits=options.limits,
        receipts=receipts,
        api_key=os.environ.get("SURPRISEGATE_API_KEY") or None,  # never in the config, so never in a receipt
        model_name=options.model_name or served_name(model_id),
        show_config=options.show_config,
        cors_origins=check_origins(options.cors_origins),
        ui=options.ui,
    )


def check_origins(origins: tuple[str, ...]) -> tuple[str, ...]:
    """--cors-origin values: '*' or scheme://host[:port], nothing after it (a browser's Origin has no path)."""
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise InputError(
                f"--cors-origin={origin!r} is not an origin; use scheme://host[:port] with no path, e.g. "
                "--cors-origin http://localhost:3000 (or '*' for any)"
            )
    return tuple(origins)


def served_layers(layers: ConfigLayers, options: ServeOptions) -> ConfigLayers:
    """What serve decides whatever the config says: Python only when the operator allows it, and no web
    cache shared between clients."""
    python = options.tools and options.allow_python
    forced = {"tool_python": python, "tool_python_require_isolation": True, "web_cache_s": 0.0}
    return ConfigLayers(layers.config_file, {**layers.overrides, **forced}, layers.env)


def check_python_sandbox(config: Config) -> None:
    """--allow-python runs code a remote client sends: only in a sandbox that isolates files, processes and the
    network here (never the in-process guard alone); else serve does not start."""
    from ..arms.sandbox import isolation_status

    usable, why = isolation_status(config.tool_python_sandbox)
    if not usable:
        raise InputError(
            f"--allow-python: the {config.tool_python_sandbox!r} python sandbox cannot isolate snippets here ({why}); "
            "install bubblewrap (apt-get install bubblewrap) or drop --allow-python"
        )


def build_app(layers: ConfigLayers, options: ServeOptions, say: Callable[[str], None]) -> tuple[Any, Runtime]:
    """The app over a freshly assembled runtime (arms first, the model last, its calibration applied)."""
    layers, slots = slots_for(layers, options.sessions, say)
    layers = served_layers(layers, options)
    if options.tools and options.allow_python:
        check_python_sandbox(layers.load())
    runtime = assemble(layers, options.memory, options.tools, options.web, say)
    settings = build_settings(options, slots, str(runtime.backend.model_id))
    app = create_app(runtime, settings)
    receipts = settings.receipts.path if settings.receipts else "kept nowhere (--no-receipts)"
    say(
        f"serving {settings.model_name} ({runtime.backend.name}, mode {runtime.config.mode} by default) on "
        f"http://{options.host}:{options.port}/v1 — {slots} at once, {settings.queue} queued; receipts: {receipts}; "
        f"auth: {'bearer key' if settings.api_key else 'none (set SURPRISEGATE_API_KEY)'}; "
        f"python snippets: {python_line(runtime.config, options)}"
        + (f"; chat page: http://{options.host}:{options.port}/" if options.ui else "")
    )
    return app, runtime


def python_line(config: Config, options: ServeOptions) -> str:
    if not options.tools:
        return "off (--no-tools)"
    if not config.tool_python:
        return "off (--allow-python runs them, sandboxed)"
    from ..arms.sandbox import sandbox_mode

    return f"on, in the {sandbox_mode(config.tool_python_sandbox)} sandbox"


def serve_forever(layers: ConfigLayers, options: ServeOptions, say: Callable[[str], None]) -> None:
    import uvicorn

    app, _ = build_app(layers, options, say)
    uvicorn.Server(uvicorn_config(app, options.host, options.port)).run()

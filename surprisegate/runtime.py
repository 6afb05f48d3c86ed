"""Runtime assembly: from a Config and the user's choice of arms to a loaded backend and its arms.

One place, used by every command that answers (`ask`, `demo`, `eval`, `label`, `calibrate --backend`,
`serve`). Arms are built from one registry (`ARMS`): the config's arm orders name arms from it, and each
entry says how to build its arm from what the user pointed at (a memory store, a search URL, tool
settings). Heavy imports stay inside the builders. Once the backend is loaded its model id is known, and
`model_config` puts that model's calibration (model_calibrations.py) under the user's flags, file and
environment. `arms_for` is the rule that only intervene uses arms.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .arms import Arm
from .config import THRESHOLD_KEYS, Config, ConfigLayers
from .errors import InputError
from .paths import home

if TYPE_CHECKING:
    from .backends import Backend


def demo_memory(quiet: bool = True, say: Callable[[str], None] = lambda message: None) -> Path:
    """The demo knowledge base, built once into home()."""
    from .local.demo_kb import ensure_demo_memory

    path = home() / "demo-memory.sqlite"
    if not path.exists() and not quiet:
        say(f"building the demo knowledge base at {path} (once) ...")
    return ensure_demo_memory(path)


def check_memory(memory: str) -> None:
    """A missing SQLite file is a user mistake worth catching before the model loads."""
    if (
        memory in ("demo", "none")
        or re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", memory)
        or memory.startswith("milvus-lite:")
    ):
        return
    if not Path(memory).exists():
        raise InputError(
            f"--memory={memory!r} does not exist; build it with: surprisegate memory add --memory {memory} FILE.jsonl"
        )


# --------------------------------------------------------------------------------------------
# the arm registry
# --------------------------------------------------------------------------------------------
def _memory_arm(config: Config, target: str, say: Callable[[str], None]) -> Arm:
    from .arms.memory import MemoryArm
    from .store.open import open_memory

    path = str(demo_memory(quiet=False, say=say)) if target == "demo" else target
    store = open_memory(path)
    # The first search loads what searching needs (the embedder, the index pages): ~0.6 s here. Paid now,
    # while the model loads, not inside the first reply's grounding round, where it is a pause a reader sees.
    threading.Thread(target=_first_search, args=(store,), daemon=True, name="surprisegate-memory-warm").start()
    return MemoryArm(store, floor=config.relevance_floor)


def _first_search(store) -> None:
    try:
        store.search("warm up", k=1)
    except Exception:  # noqa: BLE001 - a store that cannot search says so on the first real query, with its error
        pass


def _web_arm(config: Config, target: str, say: Callable[[str], None]) -> Arm:
    from .arms.web import build_web_arm

    arm = build_web_arm(target, cache_ttl_s=config.web_cache_s)
    problem = arm.problem()
    if problem:
        say(f"warning: web arm: {problem}")
    return arm


def _tool_arm(config: Config, target: str, say: Callable[[str], None]) -> Arm:
    from .arms.tools import TOOL_NAMES, ToolArm

    # Running code is the operator's decision (config tool_python; serve turns it off by default).
    tools = tuple(name for name in TOOL_NAMES if name != "python" or config.tool_python)
    return ToolArm(
        tools=tools,
        roots=config.tool_roots,
        allowed_status_targets=config.tool_status_targets,
        python_sandbox=config.tool_python_sandbox,
        python_require_isolation=config.tool_python_require_isolation,
        default_timezone=config.tool_timezone,
        word_problems=config.tool_programs,
        program_max_tokens=config.program_max_tokens,
    )


@dataclass(frozen=True)
class ArmEntry:
    name: str
    what: str  # what the user points it at
    build: Callable[[Config, str, Callable[[str], None]], Arm]


ARMS: dict[str, ArmEntry] = {
    e.name: e
    for e in (
        ArmEntry("memory", "a memory store: SQLite file, milvus:// URI or 'demo'", _memory_arm),
        ArmEntry("web", "a SearxNG-compatible URL, or brave | tavily | wikipedia", _web_arm),
        ArmEntry("tool", "on unless --no-tools: calculator, dates, units, python, files, status", _tool_arm),
    )
}


def build_arms(
    config: Config,
    memory: str | None = None,
    tools: bool = True,
    web: str | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> dict[str, Arm]:
    """The arms the user asked for: memory unless 'none', the tools unless disabled, the web if given."""
    targets = {"memory": memory if memory and memory != "none" else None, "tool": "on" if tools else None, "web": web}
    return {name: ARMS[name].build(config, target, say) for name, target in targets.items() if target}


def load_backend(config: Config) -> Backend:
    """The backend the config names (registry: backends/registry.py)."""
    from .backends.registry import open_backend, parse_backend

    # Only a backend that holds several sessions takes the option (the others keep their signature).
    options: dict[str, Any] = {"sessions": config.sessions} if config.sessions > 1 else {}
    kind = parse_backend(config.backend)[0].kind
    if kind in ("server", "cloud"):
        options |= {
            "connect_timeout": config.connect_timeout,
            "first_byte_timeout": config.first_byte_timeout,
            "idle_timeout": config.idle_timeout,
        }
    if kind == "cloud":  # retries of a 429/5xx stay within a round's deadline
        options |= {"base_url": config.base_url or None, "retry_deadline_s": config.round_deadline_s}
    backend = open_backend(
        config.backend, config.model or None, n_ctx=config.n_ctx, seed=config.seed, threads=config.threads, **options
    )
    tap_probe_layer(backend, config)
    return backend


def tap_probe_layer(backend: Backend, config: Config) -> None:
    """Give the backend the hidden states the config's trigger probe reads (an in-process llama.cpp model with
    one session, or a transformers model); where it cannot, the window rule triggers alone and the receipt's
    `probe` is null."""
    from .backends import Tappable
    from .gate.probe import resolve_probe

    probe = resolve_probe(config.probe, backend.model_id, config.sentence_scope)
    if probe is None:
        return  # 'off', or 'auto' and no probe ships for this model
    if isinstance(backend, Tappable) and config.sessions == 1:
        backend.tap_layer(probe.layer)
    elif config.probe != "auto":  # asked for by path: say why it is not used ('auto' falls back quietly)
        logging.getLogger(__name__).warning(
            "probe=%r needs the model's hidden states, which only an in-process model (llama.cpp with "
            "sessions=1, or transformers) gives; the window rule triggers alone (set probe = 'off' to silence this)",
            config.probe,
        )


# --------------------------------------------------------------------------------------------
# the loaded model's calibration
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ThresholdSource:
    """Where the loaded model's detection thresholds come from."""

    model_id: str
    top_k: int | None  # signals from the top k logprobs; None: the full distribution
    # "calibration": its own file (path) | "shipped": shipped_thresholds.py, measured on this very model |
    # "given": a threshold set by a flag, the config file or the environment | "none": another model's
    source: str
    path: Path | None = None

    @property
    def detect_only(self) -> bool:
        """Nothing calibrated for this model: its triggers would fall at random, so it must not intervene."""
        return self.source == "none"


def model_config(
    layers: ConfigLayers, backend: Any, say: Callable[[str], None], intervene: bool | None = None
) -> tuple[Config, ThresholdSource]:
    """The config for the loaded model: flag > file > environment > its calibration > shipped defaults.

    With no calibration and no threshold given, a config asking for intervene runs detect instead; when
    intervene is asked (`intervene`, default: the config's mode) that is said once, through `say`.
    """
    from . import model_calibrations

    top_k = model_calibrations.backend_top_k(backend)
    model_id = str(backend.model_id)
    path = model_calibrations.find(model_id, top_k, home())
    if path is not None:
        say(f"using the calibration for {model_id} ({model_calibrations.source_label(top_k)}) from {path}")
        return layers.load(path), ThresholdSource(model_id, top_k, "calibration", path)
    config = layers.load()
    if model_calibrations.covered_by_defaults(model_id, top_k):
        return config, ThresholdSource(model_id, top_k, "shipped")
    if set(THRESHOLD_KEYS) & layers.given():
        return config, ThresholdSource(model_id, top_k, "given")
    source = ThresholdSource(model_id, top_k, "none")
    asked = config.mode == "intervene" if intervene is None else intervene
    if asked:
        say(no_calibration_message(config, model_id))
    if config.mode == "intervene":
        config = config.replace(mode="detect")
    return config, source


def no_calibration_message(config: Config, model_id: str) -> str:
    model = f" --model {config.model}" if config.model else ""
    return (
        f"no calibration for {model_id}: running detect only (another model's thresholds would trigger at "
        f"random); calibrate with: surprisegate calibrate --backend {config.backend}{model}"
    )


# --------------------------------------------------------------------------------------------
# a runtime
# --------------------------------------------------------------------------------------------
def arms_for(config: Config, arms: Mapping[str, Arm]) -> dict[str, Arm]:
    """The arms a reply in this config's mode may use: all of them in intervene, none otherwise (detect
    measures and records; off only decodes). The one place this rule lives."""
    return dict(arms) if config.mode == "intervene" else {}


@dataclass
class Runtime:
    """A loaded backend, its arms and the config they were built from: what answers requests."""

    config: Config
    backend: Backend
    arms: dict[str, Arm] = field(default_factory=dict)
    thresholds: ThresholdSource | None = None  # None: the caller fixed the config (assemble got a Config)

    def generate(self, messages: Sequence[dict[str, str]] | str, config: Config | None = None, **kwargs: Any):
        """One reply (gate.loop.generate) with this runtime's backend; arms only in intervene mode."""
        from .gate.loop import generate

        config = config or self.config
        return generate(self.backend, messages, config, arms_for(config, self.arms), **kwargs)


def assemble(
    config: Config | ConfigLayers,
    memory: str | None = None,
    tools: bool = True,
    web: str | None = None,
    say: Callable[[str], None] = lambda message: None,
    *,
    arms_if_intervening: bool = False,
    intervene: bool | None = None,
    loading: str | None = None,
) -> Runtime:
    """Check the arm targets, build the arms, then load the backend (slowest last, so mistakes fail fast).

    Given the user's ConfigLayers, the config is resolved again for the loaded model (model_config, which
    `intervene` is passed to); a Config is used as it is. `arms_if_intervening`: build the arms only when the
    config asks for intervene (a plain `ask` opens no store). `loading` is said just before the model loads."""
    base = config.load() if isinstance(config, ConfigLayers) else config
    if memory:
        check_memory(memory)
    wanted = not arms_if_intervening or base.mode == "intervene"
    arms = build_arms(base, memory, tools, web, say) if wanted else {}
    if loading:
        say(loading)
    backend = load_backend(base)
    if not isinstance(config, ConfigLayers):
        return Runtime(base, backend, arms)
    resolved, thresholds = model_config(config, backend, say, intervene)
    return Runtime(resolved, backend, arms, thresholds)

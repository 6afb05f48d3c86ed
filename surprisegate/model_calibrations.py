"""Per-model calibrations: a model's own detection thresholds, found by its model id and signal source.

`surprisegate calibrate --backend URI` writes one (a TOML file: the calibrated keys under [surprisegate], a
record of how they were measured under [calibration]). Once a backend is loaded, runtime.model_config looks
one up for (model id, signal source): first in home()/calibrations, then among the calibrations shipped in
the package (surprisegate/data/calibrations). The key is the basename of a path-like model id (a llama.cpp
server may report the GGUF's full path; in process the id is the path), lower-cased, plus the signal
source: `full` (the whole distribution, in process) or `top20` (a server's top-20 logprobs, entropy
estimated). The embedded model in process needs no file: the shipped defaults (shipped_thresholds.py) are its own.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import re
from collections.abc import Iterator, Mapping
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

from .backends.capabilities import TopKSignals
from .backends.llamacpp import EMBEDDED_FILE  # a constant: llama_cpp itself is imported on load only
from .config import CALIBRATED_KEYS, Config, to_toml

PACKAGE_DATA = files("surprisegate") / "data"
CALIBRATION_SET = "calibration_set.jsonl"  # 400 graded dev items (data/CALIBRATION_SET.md)
PROBE_QUESTIONS = "probe_questions.jsonl"  # 400 more fact questions, labelled where a probe is fitted


def backend_top_k(backend: object) -> int | None:
    """How many logprobs per token the backend's signals come from; None: the full distribution.

    A backend (or backend class) whose signals come from a top k says so as a `capabilities.TopKSignals`
    (`SIGNAL_TOP_K`: the servers' 20, a chat API's top k); one that is not (in process) computes both
    signals from the full distribution.
    """
    k = backend.SIGNAL_TOP_K if isinstance(backend, TopKSignals) else None
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def source_name(top_k: int | None) -> str:
    """The signal source as it appears in a file name: `full` or `top20`."""
    return "full" if top_k is None else f"top{top_k}"


def source_label(top_k: int | None) -> str:
    """The signal source for people: `full distribution` or `top-20`."""
    return "full distribution" if top_k is None else f"top-{top_k}"


def model_key(model_id: str) -> str:
    """The basename of a path-like id, lower-cased, with anything but letters, digits, `.`, `_`, `-` as `-`."""
    base = re.split(r"[/\\]", str(model_id).rstrip("/\\"))[-1]
    return re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-.") or "model"


def slug(model_id: str, top_k: int | None) -> str:
    """The file stem of a model's calibration, e.g. `smollm2-135m-instruct.q4_1.gguf--top20`."""
    return f"{model_key(model_id)}--{source_name(top_k)}"


def user_dir(home: Path) -> Path:
    """Where `calibrate --backend` writes calibrations, looked in first: paths.home()/calibrations."""
    return Path(home) / "calibrations"


def shipped_dir() -> Path:
    """The calibrations shipped in the package (looked in after user_dir)."""
    return Path(str(PACKAGE_DATA / "calibrations"))


def probe_beside(calibration: Path) -> Path:
    """Where a model's own trigger probe goes: beside its calibration file, `<stem>.probe.npz`."""
    return calibration.with_name(calibration.stem + ".probe.npz")


def user_probe(model_id: str, home: Path) -> Path:
    """The probe `calibrate --backend` fits for a model in process (full distribution): beside its calibration."""
    return probe_beside(user_dir(home) / f"{slug(model_id, None)}.toml")


def find(model_id: str, top_k: int | None, home: Path) -> Path | None:
    """The calibration for this model and signal source: the user's own (under `home`) first, then a shipped one."""
    name = slug(model_id, top_k) + ".toml"
    for folder in (user_dir(home), shipped_dir()):
        if (folder / name).is_file():
            return folder / name
    return None


def covered_by_defaults(model_id: str, top_k: int | None) -> bool:
    """The embedded model with the full distribution: the shipped defaults were measured on exactly that."""
    return top_k is None and model_key(model_id) == model_key(EMBEDDED_FILE)


@contextlib.contextmanager
def calibration_set() -> Iterator[Path]:
    """The packaged calibration set as a file on disk (labeling reads a path)."""
    with as_file(PACKAGE_DATA / CALIBRATION_SET) as path:
        yield Path(path)


@contextlib.contextmanager
def probe_questions() -> Iterator[Path]:
    """The packaged extra questions for a model's trigger probe, as a file on disk."""
    with as_file(PACKAGE_DATA / PROBE_QUESTIONS) as path:
        yield Path(path)


def write(path: str | Path, config: Config, record: Mapping[str, Any]) -> Path:
    """A calibration file: the calibrated keys of `config` under [surprisegate], `record` under [calibration]."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = record.get("key") or record.get("model_id")
    header = (
        f"# written by `surprisegate calibrate --backend` for {name!s}: picked up for that model and\n"
        "# signal source, under flags, --config and SURPRISEGATE_* settings\n"
    )
    lines = ["", "[calibration]"] + [f"{key} = {_toml_value(value)}" for key, value in record.items()]
    out.write_text(header + to_toml(config, keys=CALIBRATED_KEYS) + "\n".join(lines) + "\n", encoding="utf-8")
    return out


def read_record(path: str | Path) -> dict[str, Any]:
    """The [calibration] table of a calibration file (empty when it has none)."""
    import tomllib

    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    record = data.get("calibration")
    return dict(record) if isinstance(record, dict) else {}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # nan and inf are TOML too; float() drops numpy's repr
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string (ASCII, escaped) is a TOML basic string

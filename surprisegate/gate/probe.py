"""A trigger probe: the window's margin over its kind's threshold, weighed with a linear probe on the model's
hidden state, for the kinds of question the probe was fitted on.

The window rule fires when the mean next-token entropy of the last W tokens crosses its kind's threshold. A
reply the model writes confidently wrong and one it writes hesitantly right can look alike there; the
model's own state while it writes tells them apart better (issue 9: `scripts/hidden_probe.py`, then
`scripts/fit_probe.py`). The probe scores the reply's first sentence once it has ended,

    score = w_margin * (highest window statistic in it - kind threshold) + w_state . standardised(state) + bias

where `state` is the mean over the sentence's tokens of the tapped layer's output (the residual stream
after `layer`), and fires when score > cut (trigger.py). Replies of other kinds keep the window rule.

A probe belongs to one model (its hidden states) and one set of thresholds (its margin): it is a small .npz
file: the embedded model's ships in surprisegate/data/probes/ (fitted by `scripts/fit_probe.py` on 1,309
factqa replies); `calibrate --backend` fits one for any in-process model on its labels (research/probe_fit.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ConfigError

PROBES = "probes"  # package data folder: <model file name>.npz (first sentence), .sentence.npz (every sentence)
FORMAT = 1
SENTENCE_KIND = "sentence"  # a probe with this kind judges every sentence of a paragraph (claim_scope sentence)


@dataclass(frozen=True, eq=False)
class TriggerProbe:
    """Weights of one fitted probe (see the module docstring) and what it applies to."""

    model: str  # the model file it was fitted on (its hidden states), e.g. SmolLM2-135M-Instruct.Q4_1.gguf
    layer: int  # the layer whose output it reads (llama.cpp's l_out-<layer>, 0-based)
    kinds: frozenset[str]  # question kinds it was fitted on; others keep the window rule
    center: np.ndarray  # per-dimension mean of the state (standardisation)
    scale: np.ndarray  # per-dimension spread of the state
    w_margin: float
    w_state: np.ndarray
    bias: float
    cut: float  # fires when score > cut
    name: str = ""  # where it came from, for receipts
    sha256: str = ""

    def applies_to(self, kind: str) -> bool:
        return kind in self.kinds

    def score(self, margin: float, state: np.ndarray) -> float:
        """The probe's score for a window `margin` bits above its kind's threshold and a mean state."""
        z = (state - self.center) / self.scale
        return float(self.w_margin * margin + self.w_state @ z + self.bias)

    def to_dict(self) -> dict:
        """What a receipt records of the probe (the weights stay in their file; the hash names them)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "model": self.model,
            "layer": self.layer,
            "cut": round(self.cut, 4),
        }

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            format=np.array(FORMAT),
            model=np.array(self.model),
            layer=np.array(self.layer),
            kinds=np.array(sorted(self.kinds)),
            center=self.center.astype(np.float32),
            scale=self.scale.astype(np.float32),
            w_margin=np.array(self.w_margin),
            w_state=self.w_state.astype(np.float32),
            bias=np.array(self.bias),
            cut=np.array(self.cut),
        )


def load_probe(path: str | Path) -> TriggerProbe:
    """Read a probe file; a missing or malformed one is an error naming it and the fix."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"probe={str(p)!r} does not exist; pass a file written by scripts/fit_probe.py, 'auto' or 'off'"
        )
    return _load(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=8)
def _load(path: str, _mtime: int) -> TriggerProbe:
    raw = Path(path).read_bytes()
    try:
        with np.load(path, allow_pickle=False) as f:
            if int(f["format"]) != FORMAT:
                raise ValueError(f"format {int(f['format'])}, this version reads {FORMAT}")
            center, scale, w_state = (np.asarray(f[k], dtype=np.float32) for k in ("center", "scale", "w_state"))
            if not center.shape == scale.shape == w_state.shape or center.ndim != 1:
                raise ValueError("center, scale and w_state must be vectors of one length")
            return TriggerProbe(
                model=str(f["model"]),
                layer=int(f["layer"]),
                kinds=frozenset(str(k) for k in f["kinds"]),
                center=center,
                scale=np.where(scale > 0, scale, 1.0).astype(np.float32),
                w_margin=float(f["w_margin"]),
                w_state=w_state,
                bias=float(f["bias"]),
                cut=float(f["cut"]),
                name=Path(path).name,
                sha256=hashlib.sha256(raw).hexdigest(),
            )
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(
            f"probe={path!r} is not a probe file ({err}); refit it with scripts/fit_probe.py or pass probe='off'"
        ) from None


def shipped_probe_path(model_id: str, sentence: bool = False) -> Path | None:
    """The probe that ships for this model file (by file name), if any: its first-sentence probe, or with
    `sentence` the one that judges every sentence of a paragraph."""
    name = Path(model_id).name + (".sentence" if sentence else "")
    candidate = resources.files("surprisegate") / "data" / PROBES / f"{name}.npz"
    return Path(str(candidate)) if candidate.is_file() else None


def user_probe_path(model_id: str) -> Path | None:
    """The probe `calibrate --backend` fitted for this model in process, beside its calibration, if any."""
    from .. import model_calibrations
    from ..paths import home

    path = model_calibrations.user_probe(model_id, home())
    return path if path.is_file() else None


def resolve_probe(setting: str, model_id: str, sentence: bool = False) -> TriggerProbe | None:
    """The probe a config's `probe` setting names for a model: 'off' none, 'auto' the one `calibrate --backend`
    fitted for it, else the shipped one (none if neither), else the file at that path (it must have been
    fitted on this model). `sentence` (claim_scope sentence): 'auto' names the shipped sentence probe
    (`calibrate` fits none), and a path is used as given (its kinds say which scope it judges)."""
    if setting == "off":
        return None
    if setting == "auto" and sentence:
        path = shipped_probe_path(model_id, sentence=True)
        return load_probe(path) if path is not None else None
    if setting == "auto":
        path = user_probe_path(model_id) or shipped_probe_path(model_id)
        return load_probe(path) if path is not None else None
    probe = load_probe(setting)
    if Path(probe.model).name != Path(model_id).name:
        raise ConfigError(
            f"probe={setting!r} was fitted on {probe.model!r}, not on the loaded model {Path(model_id).name!r}: "
            "hidden states of another model mean nothing to it; fit one for this model or pass probe='off'"
        )
    return probe

"""`calibrate --backend`: a model's own calibration in one command (model_calibrations.py picks it up).

Label the packaged calibration set through the model (labeling.py, resumable), choose the window rule (the
shipped one unless another is reliably better on a held-back half of the labels: rule_choice.py), fit its
per-kind thresholds on the signals it gives (threshold_sweep.py), and, for a model that gives its hidden
states, fit and judge its own trigger probe on the same labels (probe_fit.py). One TOML file records the
thresholds and how they and the probe were measured, and the wall time of the whole command.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import __version__, model_calibrations
from ..backends.registry import parse_backend
from ..config import Config, load_config
from ..paths import home
from .labeling import iter_labels, read_items
from .labeling import label as label_items
from .probe_fit import StateRecorder, candidate_layers, fit_model_probe
from .rule_choice import MODEL_KIND_MIN_ITEMS, MODEL_RULE, choose_rule, rule_name
from .threshold_sweep import MIN_PRECISION, calibrate, load_items

LABEL_MAX_TOKENS = 32  # as the labels behind the shipped defaults: a reply is graded on its first sentence


def calibrate_model(
    backend,
    config: Config,
    out: str | Path | None = None,
    limit: int | None = None,
    objective: str = "recall",
    min_precision: float = MIN_PRECISION,
    bootstrap: int = 500,
    progress: Callable[[str], None] = lambda m: None,
    label_progress: Callable[[int, int, str], None] | None = None,
    probe_progress: Callable[[int, int, str], None] | None = None,
    probe_label_progress: Callable[[int, int, str], None] | None = None,
) -> dict:
    """Label the packaged calibration set through `backend` (resumable, in home()/calibrations/SLUG/labels),
    calibrate on the signals it gives (its top k, or the full distribution in process) and write the
    model's calibration file: `out`, by default home()/calibrations/SLUG.toml, where the runtime finds it.

    A chat API's label rows hold the entropies it estimated from the stream's top k (no ids to recompute
    them from): they are calibrated as they are, and the file is named for that top k.

    `label_progress(done, total, note)` follows the label phase over the whole set (labeling.label): its
    first call gives the labels already on disk, so a resumed run's rate counts only the labels it makes.

    A model that gives its hidden states (`SequenceStates`: in process) also gets its own trigger probe
    (probe_fit.py), written beside the thresholds when it beats the window rule on the half of the labelled
    questions it was not fitted on. For it the 400 packaged probe questions are labelled too (resumable, in
    SLUG/probe_labels; `probe_label_progress`), the states the probe reads kept as each reply is written;
    `probe_progress` follows the replay of any question labelled before (a resumed run)."""
    from ..backends import SequenceStates, SteerableBackend

    top_k = model_calibrations.backend_top_k(backend)
    from_rows = not isinstance(backend, SteerableBackend)  # a chat API: signals as streamed
    stem = model_calibrations.slug(backend.model_id, top_k)
    work = model_calibrations.user_dir(home()) / stem
    label_config = config.replace(max_tokens=LABEL_MAX_TOKENS)
    started = time.monotonic()
    extra_ids: set[str] = set()  # the probe's extra questions, labelled only where a probe is fitted
    with _label_recorder(backend, label_config) as recorder:
        with model_calibrations.calibration_set() as data:
            ids = {it["id"] for it in read_items(data, limit)}
            progress(f"labelling {len(ids)} items of the calibration set through {backend.model_id} into {work}/labels")
            labelled = label_items(
                data, work / "labels", backend, label_config, limit=limit, progress=label_progress, recorder=recorder
            )
        if recorder is not None:  # a probe will be fitted: label its extra questions in the same pass
            with model_calibrations.probe_questions() as extra:
                extra_ids = {it["id"] for it in read_items(extra, limit)}
                progress(f"labelling {len(extra_ids)} more questions for its trigger probe into {work}/probe_labels")
                label_items(
                    extra,
                    work / "probe_labels",
                    backend,
                    label_config,
                    limit=limit,
                    progress=probe_label_progress,
                    recorder=recorder,
                )
    signals_top_k = None if from_rows else top_k
    progress("choosing the window rule on a held-back half of the labels ...")
    choice = choose_rule(load_items([work / "labels"], signals_top_k, ids), MODEL_RULE, MODEL_KIND_MIN_ITEMS)
    (work / "rule_choice.json").write_text(json.dumps(choice, indent=2))
    progress(f"rule: {choice['from']}")
    report = calibrate(
        [work / "labels"],
        work / "config.toml",
        base=label_config,
        bootstrap=bootstrap,
        objective=objective,
        min_precision=min_precision,
        progress=progress,
        top_k=signals_top_k,
        only=ids,
        fixed_rule=choice["rule"],
        kind_min_items=MODEL_KIND_MIN_ITEMS,
    )
    report["top_k"] = top_k
    labelled_s = time.monotonic() - started
    target = Path(out) if out else model_calibrations.user_dir(home()) / f"{stem}.toml"
    calibrated = load_config(work / "config.toml", env={})
    probe = None
    if isinstance(backend, SequenceStates):
        rows = [r for r in iter_labels([work / "labels"]) if r.get("id") in ids]
        rows += [r for r in iter_labels([work / "probe_labels"]) if r.get("id") in extra_ids]
        probe_config = calibrated.replace(mode="detect", max_tokens=LABEL_MAX_TOKENS)
        probe = fit_model_probe(
            backend,
            rows,
            probe_config,
            model_calibrations.probe_beside(target),
            progress=probe_progress,
            recorded=recorder.steps if recorder is not None else None,
        )
        (work / "probe_fit.json").write_text(json.dumps(probe, indent=2))
    record = calibration_record(backend, label_config, report, stem, work, limit)
    record |= {"rule_from": choice["from"], "rule_choice": str(work / "rule_choice.json")}
    record |= probe_record(probe, work)
    record |= {"seconds": round(time.monotonic() - started, 1), "seconds_labels_and_thresholds": round(labelled_s, 1)}
    model_calibrations.write(target, calibrated, record)
    return {
        "calibration": str(target),
        "slug": stem,
        "labels": labelled,
        "report": report,
        "record": record,
        "probe": probe,
    }


@contextlib.contextmanager
def _label_recorder(backend, config: Config) -> Iterator[StateRecorder | None]:
    """For a model that gives its hidden states, a recorder of the candidate layers' step states while it
    labels (what its probe is fitted on: no second pass over the replies); None for any other backend."""
    from ..backends import SequenceStates

    if not isinstance(backend, SequenceStates):
        yield None
        return
    with backend.recording_states(candidate_layers(backend.n_layer)) as rows:
        yield StateRecorder(backend, rows, config)


def probe_record(probe: dict | None, work: Path) -> dict:
    """The probe's lines of the [calibration] table (none for a backend without hidden states)."""
    if probe is None:
        return {"probe": "none: this backend gives no hidden states; the window rule triggers"}
    record: dict[str, Any] = {"probe": probe.get("path", "") or f"none: {probe['why']}", "probe_why": probe["why"]}
    if "auroc_b" in probe:
        record |= {
            "probe_layer": probe["layer"],
            "probe_c": probe["c"],
            "probe_questions": probe["questions"],
            "probe_auroc_cv_half_a": probe["auroc_cv_a"],
            "window_margin_auroc_half_a": probe["auroc_cv_a_window_margin"],
            "probe_auroc_half_b": probe["auroc_b"]["probe"],
            "window_margin_auroc_half_b": probe["auroc_b"]["window_margin"],
            "half_b_window_precision_recall": [probe["half_b_window"]["precision"], probe["half_b_window"]["recall"]],
            "half_b_probe_precision_recall": [probe["half_b_probe"]["precision"], probe["half_b_probe"]["recall"]],
        }
    return record | {"probe_report": str(work / "probe_fit.json")}


def calibration_record(backend, config: Config, report: dict, stem: str, work: Path, limit: int | None) -> dict:
    """The [calibration] table: what was calibrated, on what, how well, and when."""
    best, chosen = report["best"], report["chosen"]
    return {
        "model_id": backend.model_id,
        "key": stem,
        "backend": config.backend,
        "backend_kind": parse_backend(config.backend)[0].kind,
        "signal_source": model_calibrations.source_name(report["top_k"]),
        "top_k": report["top_k"] or 0,  # 0: the full distribution
        "items": report["n"],
        "wrong": report["wrong"],
        "calibration_set": model_calibrations.CALIBRATION_SET + (f" (first {limit})" if limit else ""),
        "rule": rule_name(chosen),
        "per_kind": bool(chosen.get("per_kind")),
        "kinds_with_own_threshold": len(report["per_kind"]["kind_thresholds"]) if chosen.get("per_kind") else 0,
        "min_kind_items": report["per_kind"]["min_kind_items"],
        "auroc": round(best["auroc"], 4),
        "auroc_ci": [round(best["ci_low"], 4), round(best["ci_high"], 4)],
        "auroc_is": "5-fold cross-validated" if chosen.get("per_kind") else "in sample",
        "objective": report["objective"],
        "min_precision": report["min_precision"],
        "precision": round(chosen["precision"], 4),
        "recall": round(chosen["recall"], 4),
        "trigger_rate": round(chosen["trigger_rate"], 4),
        "max_tokens": config.max_tokens,
        "report": str(work / "calibration.json"),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "surprisegate": __version__,
    }

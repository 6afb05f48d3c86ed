"""A model's own trigger probe, fitted on its calibration labels (`calibrate --backend`, issue 24).

The probe (gate/probe.py) judges a fact question's finished first sentence by the window's margin over the
kind's threshold and the mean hidden state of the sentence's tokens at one layer. For a model of its own:

- Features. The labels hold each reply's tokens and signals (labeling.py); the questions are the calibration
  set's and 400 more fact questions (data/probe_questions.jsonl: 235 of one model's were too few to tell a
  probe from noise). While the model writes them, `SequenceStates.recording_states` keeps every fed
  position's state at a few candidate layers (StateRecorder); a question labelled before (a resumed run) is
  fed again in one pass over prompt + reply (`sequence_states`), which gives the same rows. Each reply is
  replayed through the loop's own TriggerPolicy fed those states: step k's state is the one at the position
  whose logits chose token k, as online, so the features are computed by the code that uses them.
- Regression. The window's margin is the rule the probe must beat: its weight is not penalised, the
  state's are (L2), so a strong penalty gives back the window rule and the state adds only what the labels
  support (with every weight penalised, 116 questions of one model gave 0.80 cross-validated AUROC where
  the margin alone gave 0.86).
- Choice. The labelled questions (not the cloze items: a continued sentence is never the probe's) are split
  in seeded halves. On half A, the layer and the L2 strength are chosen by 5-fold cross-validated AUROC,
  and the cut on cross-fitted scores: as precise as the window rule is there, and as far below the cut
  that keeps its recall as that precision allows, so the probe spends what it knows on catching more wrong
  replies, never fewer (keeping the window rule's recall instead, the second model's probe caught 0.83 of
  the A/B's wrong replies, as the window rule did).
- Judgement. On half B, which nothing above saw, the probe rule (the probe on the first sentence, the
  window rule after it) against the window rule alone, at equal recall: the probe is written beside the
  model's thresholds only when, cut to catch as many wrong replies as the window rule does there, it is
  more precise in MIN_WIN_RATE of paired bootstrap resamples (a bare "higher" is a coin flip for a probe
  that reads noise). Otherwise the model keeps the window rule, and the report says why. The probe ships
  with its half-A cut; half B only judges it.

A logistic regression in numpy (Newton's method): the runtime needs no scikit-learn for this.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import Config
from ..gate.probe import TriggerProbe
from ..gate.prompting import ReplyPrompt, conversation
from ..gate.signals import question_kind
from ..gate.trigger import TriggerPolicy
from .threshold_sweep import auroc, precision_recall

CANDIDATE_DEPTHS = (0.45, 0.55, 0.65, 0.75)  # of the model's layers; SmolLM2's shipped probe reads 17 of 30
L2_STRENGTHS = (0.003, 0.01, 0.03, 0.1)  # inverse L2 strength C, as scikit-learn's LogisticRegression
FOLDS = 5
SEED = 0
MIN_WIN_RATE = 0.9  # half B: the probe more precise than the window rule in this share of paired resamples
MIN_WRONG_PER_HALF = 10  # fewer judged replies of a class than this in a half: too few to fit or judge a probe
REPLAY_BATCH = 16  # replies replayed between progress reports (one context is made for the whole replay)


# ------------------------------------------------------------------------------------------------
# the logistic regression (pure)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Logistic:
    """A fitted L2 logistic regression on standardised features: score = w . (x - center) / scale + bias."""

    center: np.ndarray
    scale: np.ndarray
    w: np.ndarray
    bias: float

    def score(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.center) / self.scale) @ self.w + self.bias


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float, free: int = 0, iterations: int = 50) -> Logistic:
    """Minimise c * sum(log loss) + |w|^2 / 2 over standardised x by Newton's method; the bias and the first
    `free` weights are not penalised."""
    center = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    z = np.hstack([(x - center) / scale, np.ones((len(x), 1))])
    penalty = np.eye(z.shape[1])
    penalty[-1, -1] = 1e-8  # the bias: (almost) free
    penalty[np.arange(free), np.arange(free)] = 1e-8
    theta = np.zeros(z.shape[1])
    for _ in range(iterations):
        p = _sigmoid(z @ theta)
        gradient = c * z.T @ (p - y) + penalty @ theta
        hessian = c * (z.T * (p * (1 - p))) @ z + penalty
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-7:
            break
    return Logistic(center, scale, theta[:-1], float(theta[-1]))


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -t))


def fold_of(n: int, seed: int, folds: int = FOLDS) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, folds, n)


def cross_fitted(x: np.ndarray, y: np.ndarray, c: float, seed: int = SEED, folds: int = FOLDS) -> np.ndarray:
    """Each row's score from a regression fitted without its fold."""
    fold = fold_of(len(y), seed, folds)
    out = np.zeros(len(y))
    for k in range(folds):
        held = fold == k
        if held.any() and (~held).any():
            out[held] = fit_logistic(x[~held], y[~held], c, free=1).score(x[held])
    return out


def cut_keeping_recall(scores: np.ndarray, later: np.ndarray, wrong: np.ndarray, recall: float) -> float:
    """The highest cut at which (score > cut or a later window crossed) still finds `recall` of the wrong replies."""
    for cut in np.sort(np.unique(scores))[::-1]:
        if precision_recall((scores > cut) | later, wrong)[1] >= recall:
            return float(cut)
    return float(scores.min()) - 1.0 if len(scores) else 0.0


def cut_keeping_precision(
    scores: np.ndarray, later: np.ndarray, wrong: np.ndarray, precision: float, highest: float
) -> float:
    """The cut, at most `highest`, that finds the most wrong replies while (score > cut or a later window
    crossed) stays at least `precision` precise; `highest` itself when no lower cut keeps it."""
    best, best_recall = highest, precision_recall((scores > highest) | later, wrong)[1]
    for cut in np.sort(np.unique(scores[scores < highest]))[::-1]:
        p, r = precision_recall((scores > cut) | later, wrong)
        if p >= precision and r > best_recall:
            best, best_recall = float(cut), r
    return float(best)


def as_probe(fit: Logistic, model: str, layer: int, kinds: set[str], cut: float) -> TriggerProbe:
    """The regression as one probe: the margin's standardisation folds into its weight and the bias."""
    w, mu, sd = fit.w, fit.center, fit.scale
    return TriggerProbe(
        model=model,
        layer=layer,
        kinds=frozenset(kinds),
        center=mu[1:].astype(np.float32),
        scale=sd[1:].astype(np.float32),
        w_margin=float(w[0] / sd[0]),
        w_state=w[1:].astype(np.float32),
        bias=float(fit.bias - w[0] * mu[0] / sd[0]),
        cut=float(cut),
    )


# ------------------------------------------------------------------------------------------------
# replaying a labelled reply through the trigger policy
# ------------------------------------------------------------------------------------------------
def feature_probe(layer: int, width: int, kinds: set[str]) -> TriggerProbe:
    """A probe that never fires: a reply replayed with it leaves the judged features in the policy."""
    zero = np.zeros(width, dtype=np.float32)
    return TriggerProbe("", layer, frozenset(kinds), zero, zero + 1, 0.0, zero, 0.0, math.inf)


def replay(
    config: Config,
    row: dict,
    hidden: Callable[[int], np.ndarray | None],
    probe: TriggerProbe | None,
) -> tuple[TriggerPolicy, bool]:
    """The policy after a labelled reply's tokens, and whether it fired (a trigger records and resets, as
    detect does); `hidden(k)`: the state step k carried."""
    policy, fired = TriggerPolicy(config, row["question"], "", probe), False
    for n, (piece, surprise, entropy) in enumerate(
        zip(row["pieces"], row["surprises"], row["entropies"], strict=False)
    ):
        _, crossed = policy.push(n, piece, surprise, entropy, hidden(n))
        if crossed:
            fired = True
            policy.reset()
    if row.get("finish_reason") == "stop":
        fired |= policy.end_of_turn()
    return policy, fired


@dataclass
class Replayed:
    """One labelled question's reply, replayed: its grade, the window rule's verdict, and per layer what the
    probe would judge (window margin and mean state of the first sentence) and whether a later window fired."""

    id: str
    kind: str
    wrong: bool
    window_fired: bool
    judged: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [margin, *mean state]
    later: dict[int, bool] = field(default_factory=dict)


def is_asked(item: dict) -> bool:
    """An item asked as a question (not a cloze sentence continued): the only kind a probe judges."""
    return item.get("format", "qa") == "qa"


def is_question(row: dict) -> bool:
    """A labelled question the probe may judge: asked, with its tokens."""
    return is_asked(row) and bool(row.get("token_ids"))


def prompt_tokens(backend, row: dict, config: Config) -> list[int]:
    """The prompt the labelled reply was written after, as the loop builds it."""
    return ReplyPrompt.build(backend, conversation(row["question"], config.system_prompt), "").tokens


def replay_row(row: dict, steps: dict[int, np.ndarray], config: Config, kinds: set[str]) -> Replayed:
    """Replay a labelled reply once per layer, step k carrying `steps[layer][k]`: the state at the position
    whose logits chose token k (`step_states`)."""
    _, window_fired = replay(config, row, lambda k: None, None)
    out = Replayed(row["id"], question_kind(row["question"]), not row["correct"], window_fired)
    for layer, rows in steps.items():
        policy, later = replay(config, row, _rows_of(rows), feature_probe(layer, rows.shape[1], kinds))
        if policy.judged is not None:
            out.judged[layer] = np.concatenate([[policy.judged[0]], policy.judged[1]])
            out.later[layer] = later
    return out


def step_states(states: dict[int, np.ndarray], n_prompt: int, n_reply: int) -> dict[int, np.ndarray] | None:
    """The rows of a pass over prompt + reply that the reply's steps carried: step k was chosen by the logits
    at position n_prompt - 1 + k. None when the pass holds too few positions (or more than prompt + reply:
    not the pass these tokens came from)."""
    lengths = {len(rows) for rows in states.values()}
    if not lengths or not lengths <= {n_prompt + n_reply - 1, n_prompt + n_reply}:
        return None  # the last reply token is fed only when its successor was asked for
    first = n_prompt - 1
    return {layer: rows[first : first + n_reply] for layer, rows in states.items()}


class StateRecorder:
    """Keeps, while a calibration labels its items, the step states of each labelled question's reply at the
    candidate layers (`SequenceStates.recording_states` during the label pass): what the replay would
    otherwise compute with a second pass over prompt + reply. Items it could not align are replayed."""

    def __init__(self, backend, rows, config: Config) -> None:
        self._backend, self._rows, self._config = backend, rows, config
        self.steps: dict[str, dict[int, np.ndarray]] = {}
        self.unaligned = 0

    def start(self, item: dict) -> None:
        self._rows.clear()
        # Only a question's reply is judged by a probe: a cloze item decodes untapped, at full speed.
        self._rows.pause(not is_asked(item))

    def keep(self, record: dict) -> None:
        if not is_question(record):
            return
        n_prompt = len(prompt_tokens(self._backend, record, self._config))
        steps = step_states(self._rows.states(), n_prompt, len(record["token_ids"]))
        if steps is None:
            self.unaligned += 1
        else:
            self.steps[record["id"]] = {layer: rows.copy() for layer, rows in steps.items()}


def _rows_of(states: np.ndarray) -> Callable[[int], np.ndarray | None]:
    return lambda k: states[k]


def candidate_layers(n_layer: int) -> list[int]:
    """A few layers through the middle and upper part of the stack (never the last: see sequence_states)."""
    return sorted({min(n_layer - 2, max(0, round(d * (n_layer - 1)))) for d in CANDIDATE_DEPTHS})


# ------------------------------------------------------------------------------------------------
# choosing, fitting and judging
# ------------------------------------------------------------------------------------------------
def halves(ids: Sequence[str], seed: int = SEED) -> set[str]:
    """Seeded half A of the ids (random.Random(seed) over the sorted ids, as scripts/trigger_features.py)."""
    ordered = sorted(ids)
    return set(random.Random(seed).sample(ordered, len(ordered) // 2))


def _judged(replayed: list[Replayed], layer: int) -> tuple[list[Replayed], np.ndarray, np.ndarray, np.ndarray]:
    rows = [r for r in replayed if layer in r.judged]
    x = np.array([r.judged[layer] for r in rows]) if rows else np.zeros((0, 1))
    return rows, x, np.array([r.wrong for r in rows], dtype=float), np.array([r.later[layer] for r in rows])


def choose(replayed_a: list[Replayed], layers: Sequence[int]) -> tuple[int, float, list[dict]]:
    """The (layer, C) with the best 5-fold cross-validated AUROC on half A, and every candidate's figure."""
    table: list[dict] = []
    for layer in layers:
        _, x, y, _ = _judged(replayed_a, layer)
        for c in L2_STRENGTHS:
            value = auroc(cross_fitted(x, y, c), y) if 0 < y.sum() < len(y) else math.nan
            table.append({"layer": layer, "c": c, "auroc_cv": round(float(value), 4), "n": len(y)})
    best = max((t for t in table if not math.isnan(t["auroc_cv"])), key=lambda t: t["auroc_cv"], default=None)
    if best is None:
        return layers[0], L2_STRENGTHS[0], table
    return int(best["layer"]), float(best["c"]), table


def precision_at_recall(scores: np.ndarray, later: np.ndarray, wrong: np.ndarray, recall: float) -> float:
    """The probe rule's precision at its highest cut that still finds `recall` of the wrong replies."""
    cut = cut_keeping_recall(scores, later, wrong, recall)
    return precision_recall((scores > cut) | later, wrong)[0]


def matched_win_rate(
    scores: np.ndarray, later: np.ndarray, window: np.ndarray, wrong: np.ndarray, n: int = 1000, seed: int = SEED
) -> float:
    """How often, over paired bootstrap resamples of the replies, the probe rule at the window rule's recall
    is more precise than the window rule (a cut matched per resample: precision at equal recall)."""
    rng = np.random.default_rng(seed)
    wins = 0
    for _ in range(n):
        pick = rng.integers(0, len(wrong), len(wrong))
        precision, recall = precision_recall(window[pick], wrong[pick])
        wins += precision_at_recall(scores[pick], later[pick], wrong[pick], recall) > precision
    return wins / n


def _rule(fired: np.ndarray, wrong: np.ndarray) -> dict:
    p, r = precision_recall(fired, wrong)
    return {"precision": round(p, 4), "recall": round(r, 4), "fired": int(fired.sum()), "n": len(wrong)}


def fit_and_judge(replayed: list[Replayed], model: str, layers: Sequence[int]) -> tuple[TriggerProbe | None, dict]:
    """Choose and fit on half A, judge on half B; the probe (None when it is not the better rule) and a report."""
    in_a = halves([r.id for r in replayed])
    a = [r for r in replayed if r.id in in_a]
    b = [r for r in replayed if r.id not in in_a]
    report: dict = {"questions": len(replayed), "half_a": len(a), "half_b": len(b), "layers": list(layers)}
    layer, c, table = choose(a, layers)
    report |= {"layer": layer, "c": c, "candidates": table}
    y_a, y_b = _judged(a, layer)[2], _judged(b, layer)[2]
    if min(y_a.sum(), y_b.sum(), len(y_a) - y_a.sum()) < MIN_WRONG_PER_HALF:
        why = f"fewer than {MIN_WRONG_PER_HALF} judged replies of a class in a half"
        return None, report | {"written": False, "why": why}
    fit, probe, report = _fit_on_a(a, layer, c, model, report)
    report = _judge_on_b(b, layer, fit, probe, report)
    return (probe if report["written"] else None), report


def _fit_on_a(a: list[Replayed], layer: int, c: float, model: str, report: dict) -> tuple[Logistic, TriggerProbe, dict]:
    """The regression on half A and its cut (cross-fitted scores): as precise as the window rule is on the
    replies the probe judges there, catching as many more wrong ones as that allows, and at least as many."""
    rows_a, x_a, y_a, later_a = _judged(a, layer)
    wrong_a = np.array([r.wrong for r in a])
    recall_a = precision_recall(np.array([r.window_fired for r in a]), wrong_a)[1]
    need = recall_a * wrong_a.sum() / max(1.0, y_a.sum())  # never-judged wrong replies count in the recall
    scores = cross_fitted(x_a, y_a, c)
    precision_a = precision_recall(np.array([r.window_fired for r in rows_a]), y_a)[0]
    keeping_recall = cut_keeping_recall(scores, later_a, y_a, need)
    cut = cut_keeping_precision(scores, later_a, y_a, precision_a, keeping_recall)
    fit = fit_logistic(x_a, y_a, c, free=1)
    probe = as_probe(fit, Path(model).name, layer, {r.kind for r in rows_a}, cut)
    report |= {
        "cut": round(cut, 4),
        "cut_keeping_recall": round(keeping_recall, 4),
        "half_a_window_precision_judged": round(precision_a, 4),
        "half_a_window_recall": round(recall_a, 4),
        "auroc_cv_a": next(t["auroc_cv"] for t in report["candidates"] if t["layer"] == layer and t["c"] == c),
        "auroc_cv_a_window_margin": round(auroc(x_a[:, 0], y_a), 4),
    }
    return fit, probe, report


def fired_as_run(replayed: Replayed, layer: int, probe: TriggerProbe) -> bool:
    """Whether the probe rule fires on a replayed reply: the probe on its judged first sentence, or a later
    window; where the probe does not judge (another kind, no eligible window), the window rule alone. The same
    as replaying the reply with the probe, without keeping its states."""
    if not probe.applies_to(replayed.kind) or layer not in replayed.judged:
        return replayed.window_fired
    features = replayed.judged[layer]
    return probe.score(features[0], features[1:]) > probe.cut or replayed.later[layer]


def _judge_on_b(b: list[Replayed], layer: int, fit: Logistic, probe: TriggerProbe, report: dict) -> dict:
    """Half B: AUROCs, both rules as they would run (the probe at its half-A cut), and the probe's precision at
    the window rule's recall, bootstrapped: written when it wins in MIN_WIN_RATE of the resamples."""
    _, x_b, y_b, _ = _judged(b, layer)
    wrong = np.array([r.wrong for r in b])
    window = np.array([r.window_fired for r in b])
    scores = np.array([fit.score(r.judged[layer][None, :])[0] if layer in r.judged else -np.inf for r in b])
    later = np.array([r.later.get(layer, False) for r in b])
    as_run = np.array([fired_as_run(r, layer, probe) for r in b])
    recall = precision_recall(window, wrong)[1]
    wins = matched_win_rate(scores, later, window, wrong)
    better = wins >= MIN_WIN_RATE
    return report | {
        "auroc_b": {"probe": round(auroc(fit.score(x_b), y_b), 4), "window_margin": round(auroc(x_b[:, 0], y_b), 4)},
        "half_b_window": _rule(window, wrong),
        "half_b_probe": _rule(as_run, wrong),
        "half_b_probe_at_window_recall": round(precision_at_recall(scores, later, wrong, recall), 4),
        "half_b_probe_wins": round(wins, 3),
        "written": better,
        "why": f"more precise at the window rule's recall on half B in {wins:.0%} of its resamples"
        if better
        else f"not reliably more precise at the window rule's recall on half B ({wins:.0%} of its resamples)",
    }


def fit_model_probe(
    backend,
    rows: list[dict],
    config: Config,
    out: str | Path,
    progress: Callable[[int, int, str], None] | None = None,
    recorded: dict[str, dict[int, np.ndarray]] | None = None,
) -> dict:
    """Fit and judge a probe on the labelled questions of `rows`; write it to `out` when it is the better rule
    on half B. Their step states come from `recorded` (kept while labelling: StateRecorder) or, for the
    questions it lacks, from a replay through `backend` (a `SequenceStates`). The report says what was chosen
    and measured."""
    questions = [r for r in rows if is_question(r)]
    layers = candidate_layers(backend.n_layer)
    kinds = {question_kind(r["question"]) for r in questions}
    recorded = {i: s for i, s in (recorded or {}).items() if set(s) == set(layers)}
    replayed = [replay_row(r, recorded[r["id"]], config, kinds) for r in questions if r["id"] in recorded]
    todo = [r for r in questions if r["id"] not in recorded]
    if progress and todo:  # a resumed calibration: the questions labelled before it are replayed
        progress(0, len(todo), "")
    for start in range(0, len(todo), REPLAY_BATCH):
        batch = todo[start : start + REPLAY_BATCH]
        prompts = [prompt_tokens(backend, row, config) for row in batch]
        states = backend.sequence_states(
            [p + list(r["token_ids"]) for p, r in zip(prompts, batch, strict=True)], layers
        )
        for row, prompt, state in zip(batch, prompts, states, strict=True):
            steps = step_states(state, len(prompt), len(row["token_ids"]))
            assert steps is not None, "a pass over prompt + reply holds a row per position"
            replayed.append(replay_row(row, steps, config, kinds))
        if progress:
            progress(min(start + REPLAY_BATCH, len(todo)), len(todo), f"layers {','.join(map(str, layers))}")
    order = {r["id"]: i for i, r in enumerate(questions)}  # the folds follow the order: the rows', however made
    replayed.sort(key=lambda r: order[r.id])
    probe, report = fit_and_judge(replayed, backend.model_id, layers)
    report["states_recorded_while_labelling"] = len(questions) - len(todo)
    target = Path(out)
    if probe is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe.save(target)
        report["path"] = str(target)
    elif target.exists():
        target.unlink()  # an earlier calibration's probe must not outlive the labels that no longer support it
    return report

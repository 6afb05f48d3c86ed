"""`surprisegate eval`: the A/B. Same items, same model, several modes; accuracy, regressions, cost.

Modes
  off        plain decoding
  detect     score every token, never intervene (the reply must equal `off`)
  intervene  the surprise-gated loop with the configured arms
  always     ground every reply before it is written (evidence as a system turn), then decode plainly; in
             sentence scope (a paragraph, config.claim_scope), the gate grounding every sentence that
             states something (has a claim token), whatever its doubt
  flare      FLARE's trigger (Jiang et al. 2023): decode a look-ahead sentence; if any token has
             p < theta, retrieve with the low-probability tokens masked and regenerate the sentence by
             re-prefilling the whole prompt (no KV reuse); in sentence scope its query names the subject
             the way the gate's does, and it may retrieve paragraph_rounds times
  dragin, etc, etc-trend, seakr, entropy-rule
             the field's triggers (research/peers, each pinned to its authors' code): DRAGIN's RIND with
             its QFS query, ETC's entropy trend (x attention as their code; etc-trend without), SeaKR's
             EigenScore over sampled answers with its passage re-ranking; entropy-rule, the question-level
             mean-entropy rule (Moskvoretskii et al. 2025). They re-send the whole prompt on every
             generation; --backend transformers (attention, hidden states)
  single-retrieval, fix-length-retrieval, fix-sentence-retrieval
             DRAGIN's own cheap baselines (SR-RAG, FL-RAG, FS-RAG): retrieve once with the question; or
             before every stretch of 16 tokens, or every sentence, with the last stretch as the query
  oracle     the gate's intervene path forced to ground at its first eligible window on exactly the items
             `off` got wrong (a seeded choice among them when the budget is smaller), never on others; the
             budget is the number of replies `intervene` grounded, or --oracle-calls. Runs after the other
             modes. summary["oracle"]["efficiency"] = (intervene - off) / (oracle - off) accuracy

Results go to OUT/results.jsonl (one line per item × mode, resumable) and OUT/report.md (+ PNG).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..arms import Arm, Evidence, Query
from ..backends import Sampling, SteerableBackend
from ..config import Config, evidence_text
from ..errors import InputError
from ..gate.claims import subject_of
from ..gate.grounding import arm_order, ground_round
from ..gate.loop import generate
from ..gate.prompting import PromptLayout, chat_messages
from ..gate.receipts import ReceiptWriter, read_receipts
from ..gate.router import route
from ..text import ends_sentence
from .grading import grade
from .labeling import guard_resume, prompt_for, read_items
from .longform import grade_claims, is_longform, score_claims
from .peers.common import DOCS_PER_RETRIEVAL
from .peers.modes import PEER_MODES, check_passages, run_peer

MODES = ("off", "detect", "intervene", "always", "flare", *PEER_MODES, "oracle")
FLARE_THETA = 0.4  # FLARE's probability threshold for a "low-confidence" token (paper default range 0.4-0.8)
# Below every window statistic (bits are never negative): the oracle's trigger fires at the first eligible window.
ORACLE_THRESHOLD = -1.0


class CountingArm:
    """Wraps an arm to count grounding calls (the cost `always` pays on every reply)."""

    def __init__(self, arm: Arm):
        self.arm = arm
        self.name = arm.name
        self.calls = 0

    def ground(self, query, deadline):
        self.calls += 1
        return self.arm.ground(query, deadline)


@dataclass(frozen=True)
class FlareSettings:
    """FLARE's knobs. theta: a look-ahead sentence with a token of probability <= theta triggers retrieval.
    mask_below: their reading (jzbjyb/FLARE configs: theta 0.8, mask 0.4): the query masks tokens of
    probability <= it, each replaced by a space as their `use_as_query` does, and a look-ahead sentence ends
    where the character after its stop confirms it, as their cut of the whole look-ahead does. None: the
    reading this project ran before issue 43 (the README's earlier flare rows): mask at theta, drop the
    masked tokens, stop at the first stop. pre_retrieval: retrieve with the question before the first
    sentence (their configs' look_ahead_pre_retrieval "first")."""

    theta: float = FLARE_THETA
    mask_below: float | None = None
    pre_retrieval: bool = False

    @property
    def theirs(self) -> bool:
        return self.mask_below is not None

    def meta(self) -> dict:
        """For eval_config.json: theta always (older folders have only it), the rest when set."""
        extra = {"flare_mask_below": self.mask_below} if self.mask_below is not None else {}
        return {"flare_theta": self.theta, **extra, **({"flare_pre_retrieval": True} if self.pre_retrieval else {})}


def flare_query(pieces: Sequence[str], probs: Sequence[float], settings: FlareSettings) -> str:
    """The look-ahead as a query, "" when no token is at or under theta (their ApiReturn.use_as_query; as theirs,
    theta 0 filters nothing: every look-ahead is a query)."""
    if settings.theta and not any(p <= settings.theta for p in probs):
        return ""
    if settings.mask_below is None:
        return "".join("" if p <= settings.theta else t for t, p in zip(pieces, probs, strict=True)).strip()
    return "".join(t if p > settings.mask_below else " " for t, p in zip(pieces, probs, strict=True)).strip()


@dataclass
class Outcome:
    reply: str
    grounding_calls: int
    triggered: bool
    tokens_decoded: int
    tokens_prefilled: int
    rounds: list = field(default_factory=list)
    queries: list[str] = field(default_factory=list)  # a peer's retrieval queries, as it sent them


# ------------------------------------------------------------------------------------------------
# baselines that need their own decoding loop
# ------------------------------------------------------------------------------------------------
FLARE_MIN_SENT_LEN = 5  # their ApiReturn.min_sent_len: a first "sentence" shorter than this is not cut at


@functools.lru_cache(maxsize=1)
def _punkt():
    """nltk's Punkt, untrained, as their ApiReturn.psentencizer (no data files: nothing to download)."""
    try:
        from nltk.tokenize.punkt import PunktSentenceTokenizer
    except ImportError as err:
        raise InputError(
            "FLARE with their settings (--flare-mask-below) cuts a look-ahead with nltk's Punkt, as their code "
            "does, and nltk is not installed: pip install 'surprisegate[peers]' (or nltk)"
        ) from err
    return PunktSentenceTokenizer()


def look_ahead_cut(pieces: Sequence[str]) -> int | None:
    """How many of a look-ahead's pieces their truncate_at_boundary keeps: the first Punkt sentence at least
    FLARE_MIN_SENT_LEN characters from the start, up to the first piece that starts at or after its end. None
    while that sentence is the text's last: Punkt decides a stop by the word after it ("a U.S." is cut before
    " state", "50." is not an end before "5"), and their cut sees the whole look-ahead."""
    text = "".join(pieces)
    spans = list(_punkt().span_tokenize(text))
    stops = [start + len(text[start:end].rstrip()) for start, end in spans]  # trailing spaces dropped, as theirs
    first = next((n for n, stop in enumerate(stops) if stop >= FLARE_MIN_SENT_LEN), None)
    if first is None or first == len(spans) - 1:
        return None
    starts = itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)  # where each piece begins
    return next((index for index, start in enumerate(starts) if start >= stops[first]), None)


def _decode(
    backend, prompt_tokens: list[int], max_tokens: int, stop_at_sentence: bool = False, confirm_stop: bool = False
) -> tuple[list[int], list[float], str, bool]:
    """Greedy decode in a fresh session; returns (tokens, probabilities, text, whether it stopped at a sentence
    end rather than the end of turn or the budget). stop_at_sentence stops at the first sentence end;
    confirm_stop cuts where their look-ahead cut does (look_ahead_cut), and the tokens past the cut are decoded
    but not returned."""
    session = backend.session()
    tokens, probs, pieces = [], [], []
    piece_texts: list[str] = []  # each piece decoded on its own, for look_ahead_cut
    stopped = False
    steps = session.steps(prompt_tokens, Sampling())
    try:
        for _, step in zip(range(max_tokens), steps, strict=False):  # at most max_tokens steps
            if step.token in backend.eos_token_ids:
                break
            tokens.append(step.token)
            probs.append(2.0**-step.surprise)
            pieces.append(step.piece)
            text = b"".join(pieces).decode("utf-8", "replace")
            if stop_at_sentence and confirm_stop:
                piece_texts.append(step.piece.decode("utf-8", "replace"))
                cut = look_ahead_cut(piece_texts)
                if cut is not None and len(text.strip()) > 1:
                    tokens, probs, pieces = tokens[:cut], probs[:cut], pieces[:cut]
                    stopped = True
                    break
            elif stop_at_sentence and ends_sentence(text) and len(text.strip()) > 1:
                stopped = True
                break
    finally:
        steps.close()
        session.close()
    return tokens, probs, b"".join(pieces).decode("utf-8", "replace"), stopped


def _prompt_tokens(backend, layout: PromptLayout, evidence: Evidence | None, config: Config, prefix: str) -> list[int]:
    """The prompt with the evidence in a system turn before the reply: template pieces special, the rest plain."""
    tokens = layout.body_tokens(backend.tokenize)
    if evidence:
        tokens += layout.segment_tokens(backend.tokenize, evidence_text(config, evidence), "system_turn")
    return tokens + layout.open_tokens(backend.tokenize) + (backend.tokenize(prefix) if prefix else [])


def run_always(backend, question: str, config: Config, arms: Mapping[str, CountingArm], prefix: str = "") -> Outcome:
    layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(question, config.system_prompt))
    r = route("", question, prefix)
    order = arm_order(config, r.span_class, arms)
    q = Query(span="", question=question, sentence=prefix, span_class=r.span_class)
    evidence, _ = ground_round(
        arms, order, q, time.monotonic() + config.round_deadline_s, margin=config.arbitration_margin
    )
    prompt = _prompt_tokens(backend, layout, evidence, config, prefix)
    tokens, _, text, _ = _decode(backend, prompt, config.max_tokens)
    return Outcome(text, sum(a.calls for a in arms.values()), True, len(tokens), len(prompt))


def _flare_ground(
    arms, config: Config, masked: str, question: str, accepted: str, by_sentence: bool
) -> Evidence | None:
    r = route(masked, question, accepted)
    # A paragraph: ask about the sentence with its subject named, as the gate does.
    subject = subject_of(question) if by_sentence else ""
    asked = f"{subject}: {masked}" if by_sentence else question
    q = Query(span=masked, question=asked, sentence=masked, span_class=r.span_class, subject=subject)
    found, _ = ground_round(
        arms,
        arm_order(config, r.span_class, arms),
        q,
        time.monotonic() + config.round_deadline_s,
        margin=config.arbitration_margin,
    )
    return found


def run_flare(
    backend,
    question: str,
    config: Config,
    arms: Mapping[str, CountingArm],
    prefix: str = "",
    settings: FlareSettings = FlareSettings(),
) -> Outcome:
    """Sentence by sentence: decode a look-ahead; if flare_query gives a query, ground it and regenerate the
    sentence with the evidence, re-sending the whole prompt. (Their loop decodes every sentence again after its
    look-ahead; greedy on an unchanged prompt that is the same sentence, so it is kept, not re-decoded.)"""
    layout = PromptLayout.from_template(backend.chat_prompt, chat_messages(question, config.system_prompt))
    accepted, accepted_tokens = prefix, 0
    evidence: Evidence | None = None
    decoded = prefilled = retrievals = 0
    triggered = False
    if settings.pre_retrieval:
        evidence = _flare_ground(arms, config, question, question, "", by_sentence=False)
    while accepted_tokens < config.max_tokens:
        budget = config.max_tokens - accepted_tokens
        prompt = _prompt_tokens(backend, layout, evidence, config, accepted)
        tokens, probs, sentence, stopped = _decode(backend, prompt, budget, True, settings.theirs)
        decoded += len(tokens)
        prefilled += len(prompt)
        pieces = [backend.token_bytes(t).decode("utf-8", "replace") for t in tokens]
        masked = flare_query(pieces, probs, settings)
        if masked and retrievals < (config.paragraph_rounds if config.sentence_scope else config.max_rounds):
            triggered = True
            retrievals += 1
            found = _flare_ground(arms, config, masked, question, accepted, config.sentence_scope)
            if found:
                # Regenerate the sentence from scratch: FLARE re-sends the whole prompt with the evidence.
                evidence = found
                prompt = _prompt_tokens(backend, layout, evidence, config, accepted)
                tokens, probs, sentence, stopped = _decode(backend, prompt, budget, True, settings.theirs)
                decoded += len(tokens)
                prefilled += len(prompt)
        accepted += sentence
        accepted_tokens += len(tokens)
        # Their loop goes on until the end of turn or the budget; a cut of theirs may end without a stop of
        # ours ("became a U.S."). The earlier reading stopped where its own sentence rule saw no end.
        if not tokens or not (stopped if settings.theirs else ends_sentence(sentence)):
            break
    return Outcome(accepted[len(prefix) :], sum(a.calls for a in arms.values()), triggered, decoded, prefilled)


# ------------------------------------------------------------------------------------------------
# the oracle: where the gate should have grounded, at the gate's cost
# ------------------------------------------------------------------------------------------------
def oracle_config(config: Config) -> Config:
    """intervene with a trigger that fires at the first eligible window, whatever the question kind."""
    # One round: at this threshold every later window would fire too, grounding the rewrite itself again.
    # No probe: the oracle grounds at the first window whatever trigger the gate uses.
    return config.replace(
        mode="intervene",
        threshold=ORACLE_THRESHOLD,
        kind_thresholds={},
        max_rounds=min(config.max_rounds, 1),
        probe="off",
    )


def always_config(config: Config) -> Config:
    """Sentence scope: the gate grounding every sentence with a claim token (their doubt is never negative; no
    probe, which would judge them)."""
    return config.replace(
        mode="intervene",
        sentence_threshold=ORACLE_THRESHOLD,
        paragraph_rounds=64,
        sentence_asked_only=False,
        probe="off",
    )


def check_modes(modes: Sequence[str], flare: FlareSettings = FlareSettings(), oracle_calls: int | None = None) -> None:
    """Refuse unknown modes, FLARE settings that are not probabilities and an oracle without `off` or without a
    budget, before anything is decoded."""
    for m in modes:
        if m not in MODES:
            raise InputError(f"--modes contains {m!r}; use any of {', '.join(MODES)}")
    if not 0.0 < flare.theta < 1.0:
        raise InputError(f"--flare-theta={flare.theta!r} is not a probability in (0, 1); FLARE's paper uses 0.4-0.8")
    if flare.mask_below is not None and not 0.0 <= flare.mask_below < 1.0:
        raise InputError(
            f"--flare-mask-below={flare.mask_below!r} is not a probability in [0, 1); FLARE's configs use 0.4"
        )
    if "flare" in modes and flare.theirs:
        _punkt()  # nltk is there, before the model loads
    if oracle_calls is not None and oracle_calls < 0:
        raise InputError(
            f"--oracle-calls={oracle_calls!r} is negative; pass how many replies the oracle may ground, "
            "e.g. --oracle-calls 20"
        )
    if "oracle" not in modes:
        return
    listed = ",".join(modes)
    if "off" not in modes:
        raise InputError(
            f"--modes={listed!r} asks for oracle, which grounds the items `off` got wrong; "
            f"add off, e.g. --modes off,{listed}"
        )
    if oracle_calls is None and "intervene" not in modes:
        raise InputError(
            f"--modes={listed!r} asks for oracle but gives it no budget; add intervene to --modes "
            "(the oracle grounds as many replies as the gate did) or pass --oracle-calls N"
        )


def check_backend_modes(modes: Sequence[str], backend) -> None:
    """always, flare and oracle decode token by token with their own injections: a steerable backend's work.
    A chat API (no sessions) runs off, detect and intervene (its revise pass)."""
    peers = [m for m in modes if m in PEER_MODES]
    if peers and not hasattr(backend, "hf_model"):
        raise InputError(
            f"--modes {','.join(peers)} read attention, hidden states or samples from the model itself, which "
            f"backend {backend.name!r} does not give; run them with --backend transformers (the same GGUF)"
        )
    if isinstance(backend, SteerableBackend):
        return
    steerable_only = [m for m in modes if m in ("always", "flare", "oracle")]
    if steerable_only:
        raise InputError(
            f"--modes {','.join(steerable_only)} need a steerable backend (in process or an inference server), "
            f"not the chat API {backend.name!r}; use --modes off,detect,intervene"
        )


def oracle_budget(intervene_rows: Mapping[str, dict], oracle_calls: int | None) -> tuple[int, str]:
    """(replies the oracle may ground, where that number came from): --oracle-calls wins over the gate's count."""
    if oracle_calls is not None:
        return oracle_calls, "--oracle-calls"
    return sum(1 for r in intervene_rows.values() if r["grounding_calls"] > 0), "intervene"


def choose_oracle_items(off_rows: Mapping[str, dict], budget: int, seed: int) -> set[str]:
    """The ids `off` got wrong, or a seeded choice of `budget` of them when there are more."""
    wrong = sorted(i for i, r in off_rows.items() if not r["correct"])  # sorted: the choice ignores file order
    if budget >= len(wrong):
        return set(wrong)
    return set(random.Random(seed).sample(wrong, budget))


def oracle_row_fits(row: dict, chosen: bool) -> bool:
    """Whether a saved oracle row matches this run's choice (a resume with another budget redoes the rest)."""
    if chosen:
        return bool(row["triggered"])  # decoded with the forced trigger (a reply too short to trigger is redone)
    return not row["triggered"] and row["grounding_calls"] == 0


def trigger_efficiency(off_accuracy: float, gate_accuracy: float, oracle_accuracy: float) -> float | None:
    """The gate's accuracy gain over `off` as a share of the oracle's gain with as many grounded replies."""
    oracle_gain = oracle_accuracy - off_accuracy
    if oracle_gain == 0:
        return None
    return round((gate_accuracy - off_accuracy) / oracle_gain, 4)


def _latest(rows: Sequence[dict], mode: str) -> dict[str, dict]:
    """id -> the last row of `mode` (a redone row is appended after the one it replaces)."""
    return {r["id"]: r for r in rows if r["mode"] == mode}


def _accuracy(rows: Mapping[str, dict]) -> float:
    return sum(r["correct"] for r in rows.values()) / len(rows) if rows else math.nan


def _oracle_pass(
    items: list[dict],
    rows: list[dict],
    budget: int,
    seed: int,
    run: Callable[[dict], dict],
    writer: ReceiptWriter,
    tick: Callable[[str], None],
) -> set[str]:
    """Write an oracle row per item: a forced-trigger decode for the chosen ones, the `off` row for the rest."""
    off, saved = _latest(rows, "off"), _latest(rows, "oracle")
    chosen = choose_oracle_items(off, budget, seed)
    for item in items:
        pick = item["id"] in chosen
        if item["id"] in saved and oracle_row_fits(saved[item["id"]], pick):
            continue
        # Not chosen: the oracle leaves the reply alone, so it is the `off` reply; no need to decode it again.
        writer.append(
            run(item)
            if pick
            else off[item["id"]] | {"mode": "oracle", "triggered": False, "grounding_calls": 0, "rounds": []}
        )
        tick(f"oracle {item['id']}")
    return chosen


def oracle_summary(rows: list[dict], budget: int, source: str, chosen: set[str]) -> dict:
    """summary["oracle"]: the budget, its source, and intervene's share of the oracle's gain (None without one)."""
    off, gate, oracle = _latest(rows, "off"), _latest(rows, "intervene"), _latest(rows, "oracle")
    efficiency = trigger_efficiency(_accuracy(off), _accuracy(gate), _accuracy(oracle)) if gate else None
    return {
        "budget": budget,
        "calls_source": source,
        "chosen": len(chosen),
        "off_wrong": sum(1 for r in off.values() if not r["correct"]),
        "efficiency": efficiency,
    }


# ------------------------------------------------------------------------------------------------
# the A/B
# ------------------------------------------------------------------------------------------------
def run_mode(
    mode: str,
    backend,
    item: dict,
    config: Config,
    arms: Mapping[str, Arm],
    flare: FlareSettings = FlareSettings(),
    peer_thresholds: Mapping[str, float] | None = None,
    peer_passages: int = DOCS_PER_RETRIEVAL,
) -> Outcome:
    question, prefix = prompt_for(item)
    counted = {name: CountingArm(arm) for name, arm in arms.items()}
    gated = ("off", "detect", "intervene", "oracle") + (("always",) if config.sentence_scope else ())
    if mode in gated:
        grounds = mode in ("intervene", "oracle", "always")
        run_config = {"oracle": oracle_config, "always": always_config}.get(mode, lambda c: c.replace(mode=mode))(
            config
        )
        result = generate(backend, question, run_config, counted if grounds else {}, assistant_prefix=prefix)
        extra = result.receipt.get("extra", {})
        triggered = bool(result.rounds) or bool(extra.get("would_trigger"))
        return Outcome(
            result.text,
            sum(a.calls for a in counted.values()),
            triggered,
            extra.get("tokens_decoded", result.n_tokens),
            extra.get("prompt_tokens", 0) + extra.get("tokens_injected", 0),
            result.rounds,
        )
    if mode == "always":
        return run_always(backend, question, config, counted, prefix)
    if mode == "flare":
        return run_flare(backend, question, config, counted, prefix, flare)
    if mode in PEER_MODES:
        peer = run_peer(mode, backend, question, config, counted, prefix, peer_thresholds, peer_passages)
        calls = sum(a.calls for a in counted.values())
        costs = peer.costs
        return Outcome(peer.reply, calls, peer.triggered, costs.decoded, costs.prefilled, queries=costs.queries)
    raise InputError(f"--modes contains {mode!r}; use any of {', '.join(MODES)}")


def evaluate(
    data: str | Path,
    modes: Sequence[str],
    backend,
    config: Config,
    arms: Mapping[str, Arm],
    out_dir: str | Path,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
    flare: FlareSettings = FlareSettings(),
    oracle_calls: int | None = None,
    peer_thresholds: Mapping[str, float] | None = None,
    peer_passages: int = DOCS_PER_RETRIEVAL,
) -> dict:
    check_modes(modes, flare, oracle_calls)
    check_passages(peer_passages)
    check_backend_modes(modes, backend)
    items = read_items(data, limit)
    if sample and sample < len(items):
        # A seeded random subset: the files are ordered (by entity, by subtask), so the first N are not typical.
        items = random.Random(seed).sample(items, sample)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    meta = {
        "data": str(Path(data).resolve()),
        "config": config.to_dict(),
        "model": backend.model_id,
        "arms": sorted(arms),
        **flare.meta(),
    }
    if any(m in PEER_MODES for m in modes):
        meta["peer_thresholds"] = dict(sorted((peer_thresholds or {}).items()))
        if peer_passages != DOCS_PER_RETRIEVAL:  # recorded only when changed: older folders still resume
            meta["peer_passages"] = peer_passages
    if "oracle" in modes:
        # Recorded, not compared: older folders lack it, and oracle rows that no longer fit the budget are redone.
        meta["oracle_calls"] = oracle_calls
    guard_resume(out / "eval_config.json", meta)
    done = {(r["id"], r["mode"]) for r in read_receipts(results_path)} if results_path.exists() else set()
    writer = ReceiptWriter(results_path, private=False)  # the data set's questions, not users' prompts
    # Two passes: the oracle needs every item's `off` reply and the gate's count of grounded replies first.
    todo = [(it, m) for it in items for m in modes if m != "oracle" and (it["id"], m) not in done]
    oracle_left = sum(1 for it in items if (it["id"], "oracle") not in done) if "oracle" in modes else 0
    # progress(done, total, note) counts the whole job, the rows already on disk included: once before any
    # work (the resumed count), then per row. The oracle pass may redo saved rows that no longer fit its
    # budget, so `total` can grow as it runs.
    total = len(items) * len(modes)
    steps = itertools.count(total - len(todo) - oracle_left)
    if progress:
        progress(next(steps), total, "")

    def tick(note: str) -> None:
        nonlocal total
        step = next(steps)
        total = max(total, step)
        if progress:
            progress(step, total, note)

    def run(item: dict, mode: str) -> dict:
        started = time.monotonic()
        return _row(
            item, mode, run_mode(mode, backend, item, config, arms, flare, peer_thresholds, peer_passages), started
        )

    for item, mode in todo:
        writer.append(run(item, mode))
        tick(f"{mode} {item['id']}")
    ids = {it["id"] for it in items}

    def saved_rows() -> list[dict]:
        return [r for r in read_receipts(results_path) if r["id"] in ids and r["mode"] in modes]

    rows = saved_rows()
    oracle = None
    if "oracle" in modes:
        budget, source = oracle_budget(_latest(rows, "intervene"), oracle_calls)
        chosen = _oracle_pass(items, rows, budget, seed, lambda it: run(it, "oracle"), writer, tick)
        rows = saved_rows()
        oracle = oracle_summary(rows, budget, source, chosen)
    summary = summarise(rows, modes)
    if oracle is not None:
        summary["oracle"] = oracle
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(summary, rows, out, data, config, model=f"{backend.name} · {backend.model_id}")
    return summary


def _row(item: dict, mode: str, outcome: Outcome, started: float) -> dict:
    """One line of results.jsonl: the same fields for every mode."""
    claims = [g.verdict for g in grade_claims(outcome.reply, item)] if is_longform(item) else None
    correct = all(v == "right" for v in claims) if claims is not None else grade(outcome.reply, item).correct
    return {
        "id": item["id"],
        "mode": mode,
        "category": item.get("category") or item.get("type"),
        "relation": item.get("relation"),
        "question": item["question"],
        "answers": item.get("answers") or [],
        "reply": outcome.reply,
        "correct": correct,  # a long-form reply: every claim right
        **({"claims": claims, "relations": [c["relation"] for c in item["claims"]]} if claims is not None else {}),
        "grounding_calls": outcome.grounding_calls,
        "triggered": outcome.triggered,
        "tokens_decoded": outcome.tokens_decoded,
        "tokens_prefilled": outcome.tokens_prefilled,
        "rounds": [_round_summary(r, item) for r in outcome.rounds],
        **({"queries": outcome.queries} if outcome.queries else {}),
        "seconds": round(time.monotonic() - started, 3),
    }


def _round_summary(record: dict, item: dict) -> dict:
    """A round in a results row; a dropped rewrite keeps its text and grade (what the check cost, if anything)."""
    out = {k: record.get(k) for k in ("action", "reason", "tokens_dropped", "span_class")}
    out["source"] = (record.get("chosen") or {}).get("source")
    out["retries"] = [
        {
            "how": t["how"],
            "problem": t.get("problem"),
            "rewrite": t["rewrite"],
            "rewrite_correct": grade(t["rewrite"], item).correct,
        }
        for t in record.get("retries", [])
    ]
    if record.get("went_on_for"):  # a paragraph went on for these unsaid asked items after the rewrite
        out["went_on_for"] = record["went_on_for"]
    if record.get("action") == "reverted":
        out["rewritten_text"] = record.get("rewritten_text")
        out["rewrite_correct"] = grade(record.get("rewritten_text") or "", item).correct
    return out


def summarise(rows: list[dict], modes: Sequence[str]) -> dict:
    by_mode: dict[str, dict[str, dict]] = {m: {} for m in modes}
    for r in rows:
        by_mode.setdefault(r["mode"], {})[r["id"]] = r
    off = by_mode.get("off", {})
    out: dict = {"modes": {}}
    for m in modes:
        rs = by_mode.get(m, {})
        n = len(rs)
        if not n:
            continue
        correct = sum(r["correct"] for r in rs.values())
        regressions = sum(1 for i, r in rs.items() if i in off and off[i]["correct"] and not r["correct"])
        fixes = sum(1 for i, r in rs.items() if i in off and not off[i]["correct"] and r["correct"])
        triggered = [i for i, r in rs.items() if r["triggered"]]
        wrong_off = [i for i in rs if i in off and not off[i]["correct"]]
        precision = (
            sum(1 for i in triggered if i in off and not off[i]["correct"]) / len(triggered)
            if triggered and off
            else math.nan
        )
        recall = sum(1 for i in wrong_off if rs[i]["triggered"]) / len(wrong_off) if wrong_off else math.nan
        out["modes"][m] = {
            "n": n,
            "accuracy": round(correct / n, 4),
            "regressions": regressions,
            "regression_rate": round(regressions / n, 4),
            "fixes": fixes,
            "grounding_calls": sum(r["grounding_calls"] for r in rs.values()),
            "trigger_rate": round(len(triggered) / n, 4),
            "intervention_precision": None if math.isnan(precision) else round(precision, 4),
            "intervention_recall": None if math.isnan(recall) else round(recall, 4),
            "tokens_decoded": sum(r["tokens_decoded"] for r in rs.values()),
            "tokens_prefilled": sum(r.get("tokens_prefilled", 0) for r in rs.values()),
            "seconds": round(sum(r["seconds"] for r in rs.values()), 2),
        }
        if all("claims" in r for r in rs.values()):
            off_claims = {i: r["claims"] for i, r in off.items() if "claims" in r}
            out["modes"][m]["claims"] = score_claims({i: r["claims"] for i, r in rs.items()}, off_claims).to_dict()
    return out


def claims_table(summary: dict) -> list[str]:
    """The long-form table: claim accuracy, precision, coverage and regressions per mode, with the cost."""
    lines = [
        "| mode | prompts | claims | claim accuracy | precision | coverage | regressions (share of claims) | "
        "fixes | grounding calls | tokens decoded | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in summary["modes"].items():
        c = s.get("claims")
        if c is None:
            continue
        precision = "–" if c["claim_precision"] is None else f"{c['claim_precision']:.3f}"
        lines.append(
            f"| {m} | {s['n']} | {c['claims']} | {c['claim_accuracy']:.3f} | {precision} | {c['coverage']:.3f} | "
            f"{c['claim_regressions']} ({c['claim_regression_rate']:.1%}) | {c['claim_fixes']} | "
            f"{s['grounding_calls']} | {s['tokens_decoded']} | {s['seconds']} |"
        )
    return lines


def oracle_line(oracle: dict) -> str:
    """The report's sentence on the oracle: what it grounded, on which budget, and the gate's efficiency."""
    efficiency = "–" if oracle["efficiency"] is None else f"{oracle['efficiency']:.2f}"
    return (
        f"oracle: forced to ground {oracle['chosen']} of the {oracle['off_wrong']} replies `off` got wrong "
        f"(budget {oracle['budget']} replies, from {oracle['calls_source']}); trigger efficiency "
        f"(intervene − off) ÷ (oracle − off) accuracy = {efficiency}"
    )


def write_report(summary: dict, rows: list[dict], out: Path, data, config: Config, model: str = "") -> None:
    kinds = f" (+{len(config.kind_thresholds)} per-kind)" if config.kind_thresholds else ""
    lines = [
        f"# surprisegate eval: {Path(str(data)).name}",
        "",
        f"model: {model or 'not recorded'} · "
        f"signal {config.signal} {config.statistic} W={config.window} threshold {config.threshold}{kinds}",
        "",
        "| mode | n | accuracy | regressions | fixes | trigger rate | precision | recall | grounding calls | "
        "tokens decoded | tokens prefilled | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in summary["modes"].items():
        lines.append(
            f"| {m} | {s['n']} | {s['accuracy']:.3f} | {s['regressions']} | {s['fixes']} | "
            f"{s['trigger_rate']:.2f} | {s['intervention_precision']} | {s['intervention_recall']} | "
            f"{s['grounding_calls']} | {s['tokens_decoded']} | {s['tokens_prefilled']} | {s['seconds']} |"
        )
    if "oracle" in summary:
        lines += ["", oracle_line(summary["oracle"])]
    if any("claims" in s for s in summary["modes"].values()):
        lines += ["", "Claim by claim (long-form grading, shared/data/README.md):", "", *claims_table(summary)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    modes = list(summary["modes"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    longform = all("claims" in summary["modes"][m] for m in modes)
    accuracy = [
        summary["modes"][m]["claims"]["claim_accuracy"] if longform else summary["modes"][m]["accuracy"] for m in modes
    ]
    axes[0].bar(modes, accuracy, color="#4c72b0")
    axes[0].set_ylim(0, 1)
    axes[0].set_title(f"{'claim accuracy' if longform else 'accuracy'} · {Path(str(data)).stem}")
    axes[1].bar(modes, [summary["modes"][m]["grounding_calls"] for m in modes], color="#dd8452")
    axes[1].set_title("grounding calls")
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)

"""The trigger probe: its file, its score, and the policy that lets it judge a reply's first sentence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.config import Config
from surprisegate.errors import ConfigError
from surprisegate.gate.probe import TriggerProbe, load_probe, resolve_probe, shipped_probe_path
from surprisegate.gate.surprise import window_peak
from surprisegate.gate.trigger import TriggerPolicy

WIDTH = 3


def probe(w_margin=0.0, w_state=(1.0, 0.0, 0.0), bias=0.0, cut=0.0, kinds=("capital",), model="m.gguf"):
    return TriggerProbe(
        model=model,
        layer=5,
        kinds=frozenset(kinds),
        center=np.zeros(WIDTH, np.float32),
        scale=np.ones(WIDTH, np.float32),
        w_margin=w_margin,
        w_state=np.array(w_state, np.float32),
        bias=bias,
        cut=cut,
    )


def cfg(**kw):
    base = dict(mode="detect", signal="entropy", statistic="mean", window=2, min_tokens=2, max_tokens=40)
    return Config(**(base | {"threshold": 1.0, "kind_thresholds": {"capital": 1.0}} | kw))


QUESTION = "What is the capital of Chad?"


def state(x):
    return np.array([x, 0.0, 0.0], np.float32)


def push_all(policy, pieces, entropies, states, start=0):
    rows = zip(pieces, entropies, states, strict=True)
    return [policy.push(i, p, 0.0, e, h)[1] for i, (p, e, h) in enumerate(rows, start)]


# --- the file --------------------------------------------------------------------------------------
def test_a_saved_probe_loads_with_the_same_score_and_names_its_file(tmp_path):
    p = probe(w_margin=0.5, w_state=(1.0, -2.0, 0.25), bias=-0.3, cut=0.1)
    path = tmp_path / "p.npz"
    p.save(path)
    q = load_probe(path)
    rng = np.random.default_rng(0)
    for _ in range(20):
        margin, s = float(rng.normal()), rng.normal(size=WIDTH).astype(np.float32)
        assert q.score(margin, s) == pytest.approx(p.score(margin, s), abs=1e-5)
    assert (q.model, q.layer, q.kinds, q.cut) == ("m.gguf", 5, frozenset({"capital"}), pytest.approx(0.1))
    assert q.name == "p.npz" and len(q.sha256) == 64
    assert q.to_dict() == {"name": "p.npz", "sha256": q.sha256, "model": "m.gguf", "layer": 5, "cut": 0.1}


def test_the_score_is_the_standardised_linear_form():
    p = TriggerProbe(
        "m", 0, frozenset(), np.array([1.0, 2.0]), np.array([2.0, 4.0]), 3.0, np.array([1.0, -1.0]), 0.5, 0.0
    )
    # z = ((5-1)/2, (2-2)/4) = (2, 0): 3*0.25 + 2 - 0 + 0.5
    assert p.score(0.25, np.array([5.0, 2.0])) == pytest.approx(3.25)


def test_missing_or_malformed_probe_files_are_errors_that_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*fit_probe.py"):
        load_probe(tmp_path / "nope.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="is not a probe file.*refit"):
        load_probe(bad)
    partial = tmp_path / "partial.npz"
    np.savez(partial, format=np.array(1), model=np.array("m"))
    with pytest.raises(ConfigError, match="is not a probe file"):
        load_probe(partial)


def test_resolve_probe_off_auto_and_a_path_fitted_on_another_model(tmp_path):
    assert resolve_probe("off", "/x/m.gguf") is None
    assert shipped_probe_path("no-such-model.gguf") is None and resolve_probe("auto", "no-such-model.gguf") is None
    path = tmp_path / "p.npz"
    probe().save(path)
    assert resolve_probe(str(path), "/models/m.gguf").model == "m.gguf"
    with pytest.raises(ConfigError, match="fitted on 'm.gguf', not on the loaded model 'other.gguf'"):
        resolve_probe(str(path), "/models/other.gguf")


def test_auto_takes_the_probe_calibrate_fitted_for_the_model_before_a_shipped_one(tmp_path, monkeypatch):
    from surprisegate.gate.probe import user_probe_path

    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))
    assert user_probe_path("/models/My-Model.Q4.gguf") is None
    target = tmp_path / "calibrations" / "my-model.q4.gguf--full.probe.npz"  # beside its calibration's TOML
    target.parent.mkdir()
    probe(model="My-Model.Q4.gguf").save(target)
    assert user_probe_path("/elsewhere/My-Model.Q4.gguf") == target
    assert resolve_probe("auto", "/elsewhere/My-Model.Q4.gguf").sha256
    assert resolve_probe("off", "/elsewhere/My-Model.Q4.gguf") is None
    # The embedded model: the user's own fit wins over the shipped probe, as its calibration would.
    embedded = tmp_path / "calibrations" / "smollm2-135m-instruct.q4_1.gguf--full.probe.npz"
    probe(model="SmolLM2-135M-Instruct.Q4_1.gguf").save(embedded)
    assert resolve_probe("auto", "SmolLM2-135M-Instruct.Q4_1.gguf").name == embedded.name


def test_config_refuses_an_empty_probe_setting():
    with pytest.raises(ConfigError, match="probe"):
        Config(probe="")


# --- the policy ------------------------------------------------------------------------------------
def test_the_first_sentence_is_judged_once_it_ends_and_rewound_from_its_start():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=0.5))
    assert policy.probe is not None
    crossed = push_all(policy, ["The", " capital", " is", " Abeche", "."], [3.0] * 5, [state(1.0)] * 5)
    # every window is far above the threshold, but nothing fires before the sentence ends
    assert crossed == [False, False, False, False, True]
    assert policy.crossing == ("probe", pytest.approx(1.0), 0.5) and policy.span_start == 0
    assert policy.judged is not None and policy.judged[0] == pytest.approx(2.0)  # peak 3.0 - threshold 1.0


def test_a_doubtful_sentence_is_rewound_whole_but_the_arms_are_asked_about_its_highest_window():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=0.5))
    pieces = ["The", " capital", " is", " Abeche", ",", " a", " town", "."]
    entropies = [0.2, 0.4, 0.6, 3.5, 2.5, 0.3, 0.2, 0.1]
    assert push_all(policy, pieces, entropies, [state(1.0)] * 8)[-1]
    assert policy.span_start == 0  # rewound from the sentence's start
    assert policy.query_span(8) == (3, 5)  # [" Abeche", ","]: the window of mean 3.0


def test_the_window_rule_asks_the_arms_about_the_window_that_crossed():
    policy = TriggerPolicy(cfg(), QUESTION)
    crossed = push_all(policy, ["The", " capital", " is", " Abeche"], [0.2, 0.4, 0.6, 3.5], [None] * 4)
    assert crossed[-1] and policy.query_span(4) == (policy.span_start, 4) == (2, 4)


@settings(max_examples=150, deadline=None)
@given(entropies=st.lists(st.floats(0, 8, allow_nan=False), min_size=2, max_size=12))
def test_the_asked_window_is_the_first_sentences_highest(entropies):
    """Whatever the probe decides, the span it would ask about is a window of the sentence with the peak mean."""
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=-math.inf))
    pieces = ["w"] * (len(entropies) - 1) + ["."]
    assert push_all(policy, pieces, entropies, [state(0.0)] * len(entropies))[-1]
    start, end = policy.query_span(len(entropies))
    assert 0 <= start < end <= len(entropies) and end - start == 2
    assert np.mean(entropies[start:end]) == pytest.approx(window_peak(entropies, 2, "mean", 2))


def test_a_confident_probe_lets_a_doubtful_looking_window_pass_and_later_sentences_use_the_window_rule():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=0.5))
    first = push_all(policy, ["The", " capital", " is", " Abeche", "."], [3.0] * 5, [state(0.0)] * 5)
    assert not any(first) and policy.probe_score == pytest.approx(0.0)
    # the window starts afresh after the judgement: the next sentence needs two values above 1.0
    later = push_all(policy, [" It", " is", " big"], [0.5, 1.2, 3.0], [state(0.0)] * 3, start=5)
    assert later == [False, False, True] and policy.crossing[0] == "entropy:mean" and policy.span_start == 6


def test_a_pending_sentence_is_held_back_whole():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe())
    push_all(policy, ["The", " capital", " is"], [0.1] * 3, [state(0.0)] * 3)
    assert policy.first_rewindable(3) == 0  # a window rule would free token 0 already (window 2)


def test_the_end_of_turn_or_max_tokens_judges_a_sentence_without_a_full_stop():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=0.5))
    assert not any(push_all(policy, ["N", "D", "jamena"], [0.1] * 3, [state(2.0)] * 3))
    assert policy.end_of_turn() and policy.crossing[0] == "probe"
    capped = TriggerPolicy(cfg(max_tokens=3), QUESTION, probe=probe(cut=0.5))
    assert push_all(capped, ["N", "D", "jamena"], [0.1] * 3, [state(2.0)] * 3) == [False, False, True]
    too_short = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=-9.0))
    push_all(too_short, ["N"], [9.0], [state(9.0)])
    assert not too_short.end_of_turn()  # no eligible window: it could not have fired on the window rule either


def test_other_kinds_cloze_replies_and_backends_without_hidden_states_keep_the_window_rule():
    other = TriggerPolicy(cfg(), "Who wrote Hamlet?", probe=probe(cut=99.0))
    assert other.probe is None
    assert push_all(other, ["S", "h"], [3.0, 3.0], [state(0.0)] * 2) == [False, True]
    cloze = TriggerPolicy(cfg(), QUESTION, copied_from="The capital of Chad is", probe=probe(cut=99.0))
    assert cloze.probe is None
    blind = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=99.0))
    assert push_all(blind, ["S", "h"], [3.0, 3.0], [None, None]) == [False, True]
    assert blind.pending is None


def test_reset_drops_a_pending_sentence():
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe())
    push_all(policy, ["The", " capital"], [0.1, 0.1], [state(0.0)] * 2)
    policy.reset()
    assert policy.pending is None and not policy.end_of_turn()


@settings(max_examples=150, deadline=None)
@given(
    entropies=st.lists(st.floats(0, 8, allow_nan=False), min_size=2, max_size=12),
    threshold=st.floats(0, 6, allow_nan=False),
)
def test_a_margin_only_probe_is_the_window_rule_on_the_first_sentence(entropies, threshold):
    """w_margin 1, no state weight, cut 0: the first sentence fires exactly when its highest window crosses."""
    config = cfg(kind_thresholds={"capital": threshold})
    policy = TriggerPolicy(config, QUESTION, probe=probe(w_margin=1.0, w_state=(0.0, 0.0, 0.0)))
    pieces = ["w"] * (len(entropies) - 1) + ["."]
    fired = any(push_all(policy, pieces, entropies, [state(0.0)] * len(entropies)))
    assert fired == (window_peak(entropies, 2, "mean", 2) > threshold)
    assert policy.judged is not None and policy.judged[0] == pytest.approx(
        window_peak(entropies, 2, "mean", 2) - threshold
    )


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(st.floats(-4, 4, allow_nan=False), min_size=2, max_size=10))
def test_the_judged_state_is_the_mean_over_the_sentence(xs):
    policy = TriggerPolicy(cfg(), QUESTION, probe=probe(cut=math.inf))
    pieces = ["w"] * (len(xs) - 1) + ["."]
    push_all(policy, pieces, [2.0] * len(xs), [state(x) for x in xs])
    assert policy.judged is not None and policy.judged[1][0] == pytest.approx(np.mean(xs), abs=1e-5)


# --- the shipped probe ------------------------------------------------------------------------------
def test_the_shipped_probe_is_found_for_the_embedded_model_and_reads_its_layer():
    path = shipped_probe_path("/anywhere/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert path is not None
    shipped = load_probe(path)
    assert shipped.model == "SmolLM2-135M-Instruct.Q4_1.gguf" and shipped.layer == 17
    assert shipped.w_state.shape == shipped.center.shape == (576,) and np.isfinite(shipped.w_state).all()
    assert "capital" in shipped.kinds and math.isfinite(shipped.cut)


def test_the_shipped_probe_judges_fact_questions_only(shared_data):
    """It was fitted on factqa_dev's kinds of question: arithmetic and multi-hop questions keep the window rule."""
    import json

    from surprisegate.gate.signals import question_kind

    shipped = load_probe(shipped_probe_path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    for name, expect_any in (("factqa_dev", True), ("arith_dev", False), ("halueval_qa_dev", False)):
        kinds = {question_kind(json.loads(line)["question"]) for line in open(shared_data / f"{name}.jsonl")}
        assert bool(kinds & shipped.kinds) is expect_any, name


def test_sentence_scope_resolves_the_shipped_sentence_probe_and_never_a_calibrate_fit(tmp_path, monkeypatch):
    from surprisegate.gate.probe import SENTENCE_KIND

    embedded = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    shipped = resolve_probe("auto", embedded, sentence=True)
    assert shipped.kinds == {SENTENCE_KIND} and shipped.name.endswith(".sentence.npz")
    assert shipped.applies_to(SENTENCE_KIND) and not resolve_probe("auto", embedded).applies_to(SENTENCE_KIND)
    assert shipped_probe_path("no-such-model.gguf", sentence=True) is None
    assert resolve_probe("auto", "no-such-model.gguf", sentence=True) is None
    # calibrate's fit is a first-sentence probe: it does not stand in for a sentence probe
    monkeypatch.setenv("SURPRISEGATE_HOME", str(tmp_path))
    own = tmp_path / "calibrations" / "smollm2-135m-instruct.q4_1.gguf--full.probe.npz"
    own.parent.mkdir()
    probe(model="SmolLM2-135M-Instruct.Q4_1.gguf").save(own)
    assert resolve_probe("auto", embedded, sentence=True).sha256 == shipped.sha256
    assert resolve_probe("off", embedded, sentence=True) is None


@pytest.mark.slow
def test_in_the_loop_the_sentence_probe_scores_what_its_fit_replays():
    """Online (the loop decoding with the tap on) and offline (scripts/sentence_probe.py: one pass over prompt +
    reply, replayed through the judge) the sentence probe fires on the same sentences with the same scores."""
    pytest.importorskip("llama_cpp")
    from surprisegate.backends.llamacpp import from_llamacpp
    from surprisegate.gate.loop import generate
    from surprisegate.gate.trigger import SentenceJudge, sentence_value
    from surprisegate.research.probe_fit import prompt_tokens, step_states

    backend = from_llamacpp(None, n_ctx=2048)
    probe = resolve_probe("auto", backend.model_id, sentence=True)
    backend.tap_layer(probe.layer)
    config = Config(mode="detect", claim_scope="sentence", max_tokens=100, probe="auto")
    question = (
        "Write a short paragraph about Andorra: its capital, its currency, its official languages and the countries "
        "it borders."
    )
    result = generate(backend, question, config).result
    online = {t["token_index"]: t for t in result.would_trigger}
    assert online and {t["statistic"] for t in online.values()} == {"sentence:probe"}
    prompt = prompt_tokens(backend, {"question": question}, config)
    states = backend.sequence_states([prompt + list(result.token_ids)], [probe.layer])[0]
    steps = step_states(states, len(prompt), len(result.token_ids))[probe.layer]
    judge = SentenceJudge(question, config.sentence_threshold, config.max_tokens, probe=probe)
    offline = {}
    for i, token in enumerate(result.token_ids):
        piece = backend.token_bytes(token).decode("utf-8", "replace")
        value = sentence_value(config.signal, result.token_surprises[i], result.token_entropies[i])
        if judge.push(i, piece, value, steps[i]):
            offline[i] = judge.probe_score
    if result.finish_reason == "stop" and judge.end_of_turn():  # the last sentence, judged at the end of the turn
        offline[len(result.token_ids) - 1] = judge.probe_score
    assert sorted(offline) == sorted(online)
    for i, score in offline.items():
        assert online[i]["value"] == pytest.approx(score, abs=0.05)

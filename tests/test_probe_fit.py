"""research/probe_fit.py: a model's own trigger probe from its calibration labels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.config import Config
from surprisegate.research import probe_fit
from surprisegate.research.probe_fit import (
    Replayed,
    as_probe,
    candidate_layers,
    cut_keeping_recall,
    fit_and_judge,
    fit_logistic,
    halves,
    replay,
)
from surprisegate.research.threshold_sweep import precision_recall


def blobs(n: int, d: int, shift: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(float)
    x = rng.normal(size=(n, d)) + shift * y[:, None] * np.eye(d)[0]
    return x, y


@settings(max_examples=25, deadline=None)
@given(st.integers(20, 80), st.integers(1, 12), st.floats(0.01, 10.0), st.integers(0, 10_000))
def test_the_fit_is_where_the_penalised_loss_is_flat(n, d, c, seed):
    x, y = blobs(n, d, 1.5, seed)
    fit = fit_logistic(x, y, c)
    z = (x - fit.center) / fit.scale
    p = 1 / (1 + np.exp(-(z @ fit.w + fit.bias)))
    assert np.abs(c * z.T @ (p - y) + fit.w).max() < 1e-4  # the gradient of c*loss + |w|^2/2
    assert abs(c * (p - y).sum()) < 1e-4  # the bias is not penalised


def test_a_free_weight_survives_a_penalty_that_silences_the_rest():
    x, y = blobs(200, 8, 2.0, 5)
    silenced = fit_logistic(x, y, 1e-6)
    assert np.abs(silenced.w).max() < 1e-3
    kept = fit_logistic(x, y, 1e-6, free=1)
    assert kept.w[0] > 1.0 and np.abs(kept.w[1:]).max() < 1e-3  # the window rule alone, as logistic regression


def test_the_fit_agrees_with_scikit_learn():
    sklearn = pytest.importorskip("sklearn.linear_model")
    preprocessing = pytest.importorskip("sklearn.preprocessing")
    x, y = blobs(120, 30, 1.0, 3)
    scaler = preprocessing.StandardScaler().fit(x)
    reference = sklearn.LogisticRegression(C=0.05, max_iter=10_000, tol=1e-10).fit(scaler.transform(x), y)
    ours = fit_logistic(x, y, 0.05)
    assert ours.w == pytest.approx(reference.coef_[0], abs=1e-4)
    assert ours.bias == pytest.approx(reference.intercept_[0], abs=1e-4)


def test_the_probe_scores_as_the_regression_does():
    x, y = blobs(60, 9, 2.0, 1)
    fit = fit_logistic(x, y, 0.1)
    probe = as_probe(fit, "m.gguf", 5, {"capital"}, cut=0.0)
    ours = np.array([probe.score(row[0], row[1:].astype(np.float32)) for row in x])
    assert ours == pytest.approx(fit.score(x), abs=1e-3)


@pytest.mark.parametrize("n_layer", [2, 3, 12, 24, 30, 32, 80])
def test_candidate_layers_are_real_and_never_the_last(n_layer):
    layers = candidate_layers(n_layer)
    assert layers == sorted(set(layers)) and layers
    assert all(0 <= layer <= n_layer - 2 for layer in layers)


def test_candidate_layers_of_the_embedded_model_surround_its_shipped_probe():
    layers = candidate_layers(30)
    assert min(layers) < 17 < max(layers)


def test_halves_are_seeded_and_split_evenly():
    ids = [f"q{i}" for i in range(41)]
    a = halves(ids)
    assert a == halves(list(reversed(ids))) and len(a) == 20 and a <= set(ids)
    assert halves(ids, seed=1) != a


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.booleans(), st.booleans()), min_size=1, max_size=40), st.floats(0, 1))
def test_the_cut_keeps_the_recall_asked_for_when_it_can(rows, recall):
    scores = np.array([r[0] for r in rows])
    later, wrong = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    cut = cut_keeping_recall(scores, later, wrong, recall)
    if wrong.any():
        assert precision_recall((scores > cut) | later, wrong)[1] >= recall or cut < scores.min()


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.booleans(), st.booleans()), min_size=1, max_size=40),
    st.floats(0, 1),
    st.floats(-6, 6),
)
def test_the_cut_buys_recall_at_the_precision_asked_for(rows, precision, highest):
    scores = np.array([r[0] for r in rows])
    later, wrong = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    cut = probe_fit.cut_keeping_precision(scores, later, wrong, precision, highest)
    assert cut <= highest
    if wrong.any():
        p, r = precision_recall((scores > cut) | later, wrong)
        assert r >= precision_recall((scores > highest) | later, wrong)[1]  # never fewer wrong replies caught
        if cut < highest:
            assert p >= precision
            # and no cut between keeps that precision with more recall
            for other in scores[scores < highest]:
                p2, r2 = precision_recall((scores > other) | later, wrong)
                assert not (p2 >= precision and r2 > r)


def test_the_cut_goes_as_low_as_the_precision_allows():
    scores = np.array([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    wrong = np.array([True, True, True, False, True, False])
    later = np.zeros(6, dtype=bool)
    assert probe_fit.cut_keeping_precision(scores, later, wrong, 0.8, 2.5) == -2.0  # 4 of 5 fired are wrong
    assert probe_fit.cut_keeping_precision(scores, later, wrong, 0.9, 2.5) == 0.0  # the three top ones only
    assert probe_fit.cut_keeping_precision(scores, later, wrong, 1.01, 2.5) == 2.5  # nothing keeps it: as asked


def row(question: str, pieces: list[str], entropies: list[float], correct: bool, ident: str = "r") -> dict:
    return {
        "id": ident,
        "question": question,
        "format": "qa",
        "correct": correct,
        "token_ids": list(range(len(pieces))),
        "pieces": pieces,
        "surprises": [1.0] * len(pieces),
        "entropies": entropies,
        "finish_reason": "stop",
    }


SENTENCE = ["The", " capital", " of", " Chad", " is", " N", "'D", "jam", "ena", ".", " It", " is", " big", "."]


def test_replay_judges_the_first_sentence_with_the_states_the_steps_carried():
    config = Config(mode="detect", threshold=1.0, kind_thresholds={}, max_tokens=32)
    states = np.arange(len(SENTENCE), dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    probe = probe_fit.feature_probe(4, 3, {"capital"})
    labelled = row("What is the capital of Chad?", SENTENCE, [2.0] * len(SENTENCE), False)
    policy, _ = replay(config, labelled, lambda k: states[k], probe)
    assert policy.judged is not None
    margin, mean_state = policy.judged
    assert margin == pytest.approx(2.0 - 1.0)
    assert mean_state == pytest.approx(np.full(3, np.arange(10).mean()))  # the ten steps up to "."


def test_replay_without_a_probe_is_the_window_rule():
    config = Config(mode="detect", threshold=1.0, kind_thresholds={}, max_tokens=32)
    calm = row("What is the capital of Chad?", SENTENCE, [0.2] * len(SENTENCE), True)
    doubt = row("What is the capital of Chad?", SENTENCE, [0.2] * 5 + [3.0] * 9, False)
    assert replay(config, calm, lambda k: None, None)[1] is False
    assert replay(config, doubt, lambda k: None, None)[1] is True


@pytest.mark.parametrize("cut", [-5.0, 0.0, 0.4, 2.0, 50.0])
@pytest.mark.parametrize("question", ["What is the capital of Chad?", "What is the official language of Chad?"])
def test_the_rule_as_run_is_the_reply_replayed_with_the_probe(cut, question):
    config = Config(mode="detect", threshold=1.0, kind_thresholds={}, max_tokens=32)
    entropies = [0.5, 2.5, 2.0, 3.0, 0.2, 0.1, 2.2, 2.4, 2.6, 0.3, 0.1, 0.1, 0.1, 0.1]  # doubt in sentence 1 only
    labelled = row(question, SENTENCE, entropies, False)
    states = np.random.default_rng(3).normal(size=(1 + len(SENTENCE), 3)).astype(np.float32)
    kinds = {"capital", "official language"}  # judged for both; the probe applies to capitals only
    steps = probe_fit.step_states({4: states}, 1, len(SENTENCE))  # a one-token prompt: step k at position k
    assert steps is not None
    replayed = probe_fit.replay_row(labelled, steps, config, kinds)
    probe = as_probe(fit_logistic(np.eye(4), np.array([0.0, 1, 0, 1]), 1.0), "m.gguf", 4, {"capital"}, cut)
    assert replayed.kind in kinds and replayed.judged  # the sentence was judged...
    online = replay(config, labelled, lambda k: states[k], probe)[1]
    assert probe_fit.fired_as_run(replayed, 4, probe) == online  # ...and the derived verdict is the replayed one
    assert replayed.window_fired and not replayed.later[4]
    if "capital" in question:
        assert online == (cut < -0.38)  # the probe decides (its score here: -0.38), whatever the window said
    else:
        assert online  # not the probe's kind: the window rule, which fired


@pytest.mark.parametrize("n_prompt", [1, 5, 30])
@pytest.mark.parametrize("n_reply", [1, 2, 9])
def test_step_states_are_the_rows_whose_logits_chose_each_token(n_prompt, n_reply):
    rows = np.arange(n_prompt + n_reply, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    for fed in (n_prompt + n_reply, n_prompt + n_reply - 1):  # the last token is fed only when asked past it
        steps = probe_fit.step_states({3: rows[:fed], 9: rows[:fed]}, n_prompt, n_reply)
        assert steps is not None and set(steps) == {3, 9}
        assert steps[3][:, 0].tolist() == list(range(n_prompt - 1, n_prompt - 1 + n_reply))
    for fed in (n_prompt + n_reply - 2, n_prompt + n_reply + 1):  # another pass than these tokens' own
        states = {3: np.zeros((fed, 2), np.float32)}
        assert probe_fit.step_states(states, n_prompt, n_reply) is None
    assert probe_fit.step_states({}, n_prompt, n_reply) is None


def synthetic(n: int, separable: bool, seed: int) -> list[Replayed]:
    """Replayed questions whose window margin tells wrong from right somewhat, and whose state tells them apart
    well (`separable`) or not at all."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        wrong = bool(rng.random() < 0.5)
        state = rng.normal(size=6) + (2.5 * wrong if separable else 0.0) * np.eye(6)[0]
        margin = rng.normal() + 0.8 * wrong - 0.4
        replayed = Replayed(f"q{i}", "capital", wrong, window_fired=bool(margin > 0))
        replayed.judged[7] = np.concatenate([[margin], state])
        replayed.later[7] = False
        out.append(replayed)
    return out


def test_a_probe_that_reads_the_answer_in_the_state_is_written():
    probe, report = fit_and_judge(synthetic(160, True, 0), "/m/model.gguf", [7])
    assert report["written"] and probe is not None and probe.layer == 7 and probe.model == "model.gguf"
    assert report["auroc_b"]["probe"] > 0.9 > report["auroc_b"]["window_margin"] > 0.6
    assert report["half_b_probe"]["precision"] > report["half_b_window"]["precision"]


def test_a_probe_that_reads_nothing_the_window_does_not_is_not_written_and_says_why():
    wins = 0
    for seed in range(3):
        probe, report = fit_and_judge(synthetic(160, False, seed), "/m/model.gguf", [7])
        wins += report["written"]
        assert report["why"] and (probe is None) == (not report["written"])
        assert not math.isnan(report["auroc_b"]["probe"])
    assert wins == 0  # a precision higher by chance is not a win


@pytest.mark.parametrize("seed", range(5))
def test_a_win_rate_is_a_coin_for_a_rule_as_good_and_near_one_for_a_sharper_one(seed):
    rng = np.random.default_rng(seed)
    wrong = rng.random(200) < 0.5
    window = wrong & (rng.random(200) < 0.7) | ~wrong & (rng.random(200) < 0.3)  # an imperfect window rule
    later = np.zeros(200, dtype=bool)
    as_good = window + rng.normal(0, 0.01, 200)  # ranks replies as the window rule splits them
    assert 0.02 < probe_fit.matched_win_rate(as_good, later, window, wrong, n=200) < 0.98
    sharper = wrong + rng.normal(0, 0.3, 200)
    assert probe_fit.matched_win_rate(sharper, later, window, wrong, n=200) > 0.99


def test_precision_at_recall_cuts_where_the_recall_is_kept():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    wrong = np.array([True, True, False, True, False, False])
    later = np.zeros(6, dtype=bool)
    assert probe_fit.precision_at_recall(scores, later, wrong, 2 / 3) == 1.0
    assert probe_fit.precision_at_recall(scores, later, wrong, 1.0) == 0.75


def test_too_few_labels_write_no_probe():
    probe, report = fit_and_judge(synthetic(16, True, 0), "/m/model.gguf", [7])
    assert probe is None and not report["written"] and "fewer than" in report["why"]


@pytest.mark.slow
def test_one_pass_over_a_reply_gives_the_states_its_steps_carried():
    """The features a calibration replays must be the ones the loop reads while it decodes: step k's state at
    the position whose logits chose token k (the prompt's last for the first step)."""
    pytest.importorskip("llama_cpp")
    from surprisegate.backends import Sampling
    from surprisegate.backends.llamacpp import from_llamacpp
    from surprisegate.gate.prompting import ReplyPrompt, conversation

    backend = from_llamacpp(None, n_ctx=1024)
    prompt = ReplyPrompt.build(backend, conversation("What is the capital of Chad?", "Be brief."), "").tokens
    backend.tap_layer(10)
    session = backend.session()
    steps = session.steps(prompt, Sampling(hidden=True))
    decoded = [next(steps) for _ in range(10)]
    steps.close()
    session.close()
    states, alone = backend.sequence_states([prompt + [s.token for s in decoded], prompt[:5]], [10, 20])
    assert alone[10].shape == (5, 576)
    assert {layer: rows.shape for layer, rows in states.items()} == {
        10: (len(prompt) + 10, 576),
        20: (len(prompt) + 10, 576),
    }

    def cosine(u, v):
        return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))

    # A batch and one token at a time round differently (up to ~0.5 in a state of norm ~150): the same
    # direction, and the neighbouring position is far from it.
    for k, step in enumerate(decoded):
        assert cosine(states[10][len(prompt) - 1 + k], step.hidden) > 0.999
        assert cosine(states[10][len(prompt) + k], step.hidden) < 0.95
    # The tap made for the loop stays, and the model decodes as before.
    assert backend.tapped_layer == 10
    again = backend.session()
    steps = again.steps(prompt, Sampling(hidden=True))
    assert [next(steps).token for _ in range(10)] == [s.token for s in decoded]
    steps.close()
    again.close()
    with pytest.raises(Exception, match="last"):
        backend.sequence_states([prompt], [backend.n_layer - 1])


@pytest.mark.slow
def test_states_recorded_while_labelling_are_the_replayed_ones():
    """calibrate keeps each labelled reply's step states as it decodes it (`recording_states`) instead of a
    second pass: the same rows as the replay's, for a one-sentence reply and for one cut by max_tokens."""
    pytest.importorskip("llama_cpp")
    from surprisegate.backends.llamacpp import from_llamacpp
    from surprisegate.config import Config
    from surprisegate.research.labeling import label_item
    from surprisegate.research.probe_fit import StateRecorder, prompt_tokens, step_states

    backend = from_llamacpp(None, n_ctx=1024)
    items = [
        {"id": "q1", "question": "What is the capital of Chad?", "answers": ["N'Djamena"]},
        {"id": "q2", "question": "Which chemical element has the symbol Ge?", "answers": ["Germanium"]},
        {"id": "c1", "question": "The capital of France is", "answers": ["Paris"], "format": "cloze"},
    ]
    layers = [10, 20]

    def least_cosine(u, v):  # over the rows
        unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
        return float((unit(u) * unit(v)).sum(axis=1).min())

    replies = {}
    for max_tokens in (32, 5):
        config = Config(mode="detect", max_tokens=max_tokens)
        with backend.recording_states(layers) as rows:
            recorder = StateRecorder(backend, rows, config)
            records = []
            for item in items:
                recorder.start(item)
                records.append(label_item(backend, item, config))
                recorder.keep(records[-1])
        replies[max_tokens] = records[0]["reply"]
        assert set(recorder.steps) == {"q1", "q2"} and recorder.unaligned == 0  # a cloze item is never judged
        for record in records[:2]:
            prompt = prompt_tokens(backend, record, config)
            (states,) = backend.sequence_states([prompt + record["token_ids"]], layers)
            replayed = step_states(states, len(prompt), len(record["token_ids"]))
            assert replayed is not None
            for layer in layers:
                kept, again = recorder.steps[record["id"]][layer], replayed[layer]
                assert kept.shape == again.shape == (len(record["token_ids"]), 576)
                assert least_cosine(kept, again) > 0.999  # decoding and a batch round differently
    # Recording leaves the model decoding as before.
    assert label_item(backend, items[0], Config(mode="detect", max_tokens=32))["reply"] == replies[32]
    assert replies[5] != replies[32]  # the cut reply was the other case: its last token never fed

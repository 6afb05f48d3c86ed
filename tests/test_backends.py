"""The backend seam's shared parts: sampling, LocalSession bookkeeping, and the registry."""

from __future__ import annotations

import numpy as np
import pytest

from surprisegate.backends import LocalSession, Sampling, common_prefix
from surprisegate.backends.registry import BACKENDS, names, open_backend, parse_backend
from surprisegate.errors import BackendError, ConfigError

from scripted import ScriptedBackend, plan


def test_sampling_is_greedy_at_zero_and_seeded_above():
    logits = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    assert Sampling().choose(logits) == 1
    assert Sampling().choose(logits, frozenset({1})) == 2
    draws = [Sampling(temperature=1.0, seed=7).choose(logits) for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed, the same first draw
    unscored = Sampling(scored=False).step(logits, 1, b"x")
    assert np.isnan(unscored.surprise) and unscored.top_logprobs == ()
    top = Sampling(top_logprobs=2).step(logits, 1, b"x").top_logprobs
    assert [t for t, _ in top] == [1, 2] and top[0][1] > top[1][1]


def test_the_logits_read_once_give_the_same_choice_and_step_as_reading_them_again():
    """A step reads its logits once (Sampling.stats) for the greedy choice and both signals: the same token
    and signals as choose and step reading them on their own; a retry's ban and sampling above zero still
    choose from the logits, and an unscored step reads nothing."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        logits = (rng.standard_normal(5000) * 4).astype(np.float32)
        sampling = Sampling(top_logprobs=3)
        stats = sampling.stats(logits)
        assert stats is not None
        token = sampling.choose(logits, stats=stats)
        assert token == sampling.choose(logits) == int(logits.argmax())
        assert sampling.step(logits, token, b"x", stats) == sampling.step(logits, token, b"x")
        banned = frozenset({token})
        assert sampling.choose(logits, banned, stats) == int(np.argsort(-logits, kind="stable")[1])
    hot = Sampling(temperature=1.0, seed=11)
    logits = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    assert hot.choose(logits, stats=hot.stats(logits)) == Sampling(temperature=1.0, seed=11).choose(logits)
    assert Sampling(scored=False).stats(logits) is None


@pytest.mark.parametrize("a, b, n", [([], [1], 0), ([1, 2, 3], [1, 2, 4], 2), ([1, 2], [1, 2, 3], 2), ([5], [6], 0)])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n


def test_a_session_without_a_trimmable_cache_reprefills_and_says_so():
    backend = ScriptedBackend(lambda context: plan("Hello there."), trimmable=False)
    session = backend.session()
    prompt = backend.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", special=True)
    steps = session.steps(prompt, Sampling())
    ids = [next(steps).token for _ in range(4)]
    session.steps(prompt + ids[:2], Sampling())
    assert session.last_continue == (len(prompt) + 3 - (len(prompt) + 1), "reprefill")
    assert backend.context == prompt + ids[:2]


def test_an_older_session_of_a_one_cache_model_is_superseded_with_a_clear_error():
    backend = ScriptedBackend(lambda context: plan("Hello."))
    old = backend.session()
    backend.session()
    with pytest.raises(BackendError, match="another session"):
        old.steps([1, 2], Sampling())


def test_an_empty_context_is_refused():
    session = LocalSession(ScriptedBackend(lambda context: plan("x")))
    with pytest.raises(ValueError, match="at least one token"):
        session.steps([], Sampling())


@pytest.mark.parametrize(
    "spec, name, address",
    [
        ("llamacpp", "llamacpp", {}),
        ("transformers", "transformers", {}),
        ("llama-server://127.0.0.1:8080", "llama-server", {"host": "127.0.0.1", "port": 8080, "tls": False}),
        ("vllm+https://gpu.example:443", "vllm", {"host": "gpu.example", "port": 443, "tls": True}),
        (" openai ", "openai", {}),
    ],
)
def test_the_registry_reads_names_and_uris(spec, name, address):
    entry, parsed = parse_backend(spec)
    assert entry.name == name and parsed == address


@pytest.mark.parametrize(
    "spec, message",
    [
        ("llamacp", "not a known backend"),
        ("", "empty"),
        ("vllm", "not a known backend"),  # a server needs its address
        ("openai://api.openai.com:443", "not a server scheme"),
        ("vllm+ftp://h:1", "not a server scheme"),
        ("vllm://host-only", "needs a host and a port"),
    ],
)
def test_bad_backend_specs_are_config_errors_naming_the_fix(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_backend(spec)


def test_a_cloud_backend_without_a_model_says_which_flag_to_pass():
    with pytest.raises(ConfigError, match="needs a model name: pass --model"):
        open_backend("openai")


def test_every_entry_is_listed_with_its_address_form():
    assert "llama-server://HOST:PORT" in names() and "openai" in names()
    assert {e.kind for e in BACKENDS.values()} == {"in-process", "server", "cloud"}


def test_capabilities_are_protocols_a_backend_has_by_its_members():
    from surprisegate.backends import (
        ContextSize,
        HiddenStates,
        SteerableBackend,
        Tappable,
        TopKSignals,
        VocabSize,
    )
    from surprisegate.model_calibrations import backend_top_k

    plain = ScriptedBackend(lambda context: plan("Hi."))
    assert isinstance(plain, SteerableBackend)
    assert not any(isinstance(plain, c) for c in (Tappable, HiddenStates, ContextSize, VocabSize, TopKSignals))
    assert backend_top_k(plain) is None  # the full distribution

    class Stateful(ScriptedBackend):  # a model that reads a hidden state: its steps carry a copy when asked
        tapped_layer = 0

        def hidden_state(self):
            return self.state

    stateful = Stateful(lambda context: plan("Hi."))
    stateful.state = np.array([1.0, 2.0], np.float32)
    assert isinstance(stateful, HiddenStates) and not isinstance(stateful, Tappable)
    prompt = stateful.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", special=True)
    step = next(stateful.session().steps(prompt, Sampling(hidden=True)))
    assert step.hidden is not None and step.hidden.tolist() == [1.0, 2.0] and step.hidden is not stateful.state
    assert next(stateful.session().steps(prompt, Sampling())).hidden is None  # not asked for
    assert next(plain.session().steps(prompt, Sampling(hidden=True))).hidden is None  # nothing to read

    class TopK:
        SIGNAL_TOP_K = 8

    assert isinstance(TopK(), TopKSignals) and backend_top_k(TopK()) == 8 and backend_top_k(TopK) == 8


class SetGrammar:
    """A grammar that allows a fixed set of tokens after any prefix, and records what it was made to follow."""

    def __init__(self, allowed):
        self.allowed, self.followed, self.masks = set(allowed), [], 0

    def follow(self, tokens):
        self.followed.append(list(tokens))

    def allows(self, token):
        return token in self.allowed

    def mask(self, logits):
        self.masks += 1
        out = np.full(logits.shape, -np.inf)
        ids = sorted(self.allowed)
        out[ids] = logits[ids]
        return out


def test_a_grammar_keeps_the_settings_pick_when_it_allows_it_and_masks_only_when_it_does_not():
    from surprisegate.gate.surprise import softmax_stats

    logits = np.array([0.0, 5.0, 3.0, 1.0], dtype=np.float32)
    reply = [7, 8]
    allowing = SetGrammar({1, 2})
    s = Sampling(temperature=0.0, grammar=allowing, reply_tokens=lambda: reply)
    assert s.choose(logits, stats=softmax_stats(logits)) == 1 and allowing.masks == 0
    assert allowing.followed == [[7, 8]]  # brought to the reply's state before the check
    refusing = SetGrammar({2, 3})
    s = Sampling(temperature=0.0, grammar=refusing, reply_tokens=lambda: reply)
    assert s.choose(logits, stats=softmax_stats(logits)) == 2 and refusing.masks == 1
    for seed in range(20):  # sampled: never outside the grammar
        s = Sampling(temperature=1.5, seed=seed, grammar=SetGrammar({0, 3}), reply_tokens=lambda: reply)
        assert s.choose(logits) in (0, 3)


def test_a_ban_that_would_leave_the_grammar_nothing_gives_way_to_the_grammar():
    logits = np.array([0.0, 5.0, 3.0], dtype=np.float32)
    s = Sampling(temperature=0.0, grammar=SetGrammar({0}), reply_tokens=lambda: [])
    assert s.choose(logits, banned=frozenset({0})) == 0  # the grammar is done: its end of turn stands


def test_under_a_grammar_the_signals_are_taken_over_what_it_allows():
    logits = np.array([10.0, 0.0, 0.0, 0.0], dtype=np.float32)
    free = Sampling(temperature=0.0).step(logits, 1, b"x")
    held = Sampling(temperature=0.0, grammar=SetGrammar({1}), reply_tokens=lambda: []).step(logits, 1, b"x")
    assert free.surprise > 10 and held.surprise == 0.0 and held.entropy == 0.0  # forced: no doubt
    two = Sampling(temperature=0.0, grammar=SetGrammar({1, 2}), reply_tokens=lambda: []).step(logits, 1, b"x")
    assert two.surprise == pytest.approx(1.0) and two.entropy == pytest.approx(1.0)

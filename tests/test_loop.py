"""Controller behaviour on a scripted backend with fixed logits: every surprise is known exactly."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from surprisegate.arms import Evidence
from surprisegate.backends import Sampling
from surprisegate.config import Config
from surprisegate.errors import BackendFault, InputError
from surprisegate.gate.events import Rewind, Token, Trigger
from surprisegate.gate.loop import generate, stream
from surprisegate.gate.prompting import Continuation
from surprisegate.gate.reply import Reply
from surprisegate.gate.rewrite import EvidenceOpeners, UnsaidItems, needs_space
from surprisegate.gate.structured import ResponseFormat
from surprisegate.gate.surprise import RollingWindow

from scripted import VOCAB, ScriptedBackend, bits, plan

QUESTION = "What is the capital of Testland?"
WRONG = "The capital is Wrongville."
RIGHT = "The capital is Rightburg."


def script_testland(context: str):
    if (
        "Rightburg" in context.split("<|im_start|>assistant\n", 1)[-1]
        or "The capital of Testland is Rightburg.\nAnswer the user" in context
    ):
        return plan(RIGHT)
    return plan(WRONG, doubtful="Wrongville")


class StaticArm:
    def __init__(self, name, evidence=(), delay=0.0, error=None):
        self.name, self.evidence, self.delay, self.error = name, list(evidence), delay, error
        self.calls = []

    def ground(self, query, deadline):
        self.calls.append(query)
        if self.delay:
            time.sleep(self.delay)
        if self.error:
            raise self.error
        return self.evidence


RIGHT_EVIDENCE = Evidence(
    claim="capital of Testland",
    evidence="The capital of Testland is Rightburg.",
    confidence=0.9,
    source="memory:country:TL",
)


def cfg(**kw):
    base = dict(
        mode="intervene",
        signal="surprise",
        statistic="max",
        window=4,
        threshold=3.0,
        min_tokens=1,
        max_tokens=60,
        system_prompt="",
        kind_thresholds={},
    )
    return Config(**(base | kw))


def run(config, arms=None, script=script_testland, backend=None):
    backend = backend or ScriptedBackend(script)
    events = list(stream(backend, QUESTION, config, arms or {}))
    return backend, events, events[-1]


def test_a_step_reads_logits_without_writing():
    logits = np.array([0.0, 2.0, -1.0, 0.5], dtype=np.float32)
    before = logits.copy()
    sampling = Sampling()
    token = sampling.choose(logits)
    step = sampling.step(logits, token, b"x")
    s, h = step.surprise, step.entropy
    assert token == 1
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert s == pytest.approx(-np.log2(p[1]), rel=1e-6)
    assert h == pytest.approx(-(p * np.log2(p)).sum(), rel=1e-6)
    np.testing.assert_array_equal(logits, before)


def test_detect_mode_scores_every_token_with_the_scripted_surprise():
    _, events, done = run(cfg(mode="detect"))
    tokens = [e for e in events if isinstance(e, Token)]
    assert done.text == WRONG and "".join(t.text for t in tokens) == WRONG
    wrong_start = WRONG.index("Wrongville")
    for t in tokens:
        expected = bits(0.02) if wrong_start <= t.index < wrong_start + 10 else bits(0.95)
        assert t.surprise == pytest.approx(expected, abs=1e-3)
    assert done.rounds == []  # detect never intervenes
    assert done.result.would_trigger[0]["token_index"] == wrong_start


@pytest.mark.parametrize(
    "statistic,window,threshold", [("max", 4, 3.0), ("mean", 4, 3.0), ("mean", 8, 2.0), ("p90", 6, 4.0)]
)
def test_trigger_fires_at_the_exact_token(statistic, window, threshold):
    config = cfg(statistic=statistic, window=window, threshold=threshold)
    _, events, _ = run(config, {"memory": StaticArm("memory", [RIGHT_EVIDENCE])})
    trigger = next(e for e in events if isinstance(e, Trigger))
    # Recompute the expected crossing with a fresh window over the scripted surprises.
    w = RollingWindow(window, statistic)
    surprises = [s for _, s in [(c, bits(p)) for c, p in plan(WRONG, doubtful="Wrongville")]]
    expected = next(i for i, s in enumerate(surprises) if w.push(s) > threshold)
    assert trigger.token_index == expected
    assert trigger.span_start == max(0, expected - window + 1)
    assert trigger.value > threshold


def test_min_tokens_delays_the_first_possible_trigger():
    def early_doubt(context):
        if "Rightburg" in context:
            return plan(RIGHT)
        return plan("Wrongville is the capital.", doubtful="Wrongville")

    _, events, _ = run(cfg(min_tokens=1), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=early_doubt)
    assert next(e for e in events if isinstance(e, Trigger)).token_index == 0
    _, events, _ = run(cfg(min_tokens=3), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=early_doubt)
    assert next(e for e in events if isinstance(e, Trigger)).token_index == 2


@pytest.mark.parametrize("injection", ["system_turn", "close_reopen", "inline"])
def test_rewind_drops_the_span_injects_evidence_and_fixes_the_reply(injection):
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    # This pins the rewind's bookkeeping, so the rewrite stands even where it ignores the evidence.
    backend, events, done = run(cfg(injection=injection, revert_unused_evidence=False), {"memory": arm})
    # (The scripted model reads its position from the turn text, which inline evidence shifts.)
    assert done.text == RIGHT if injection != "inline" else "evidence" not in done.text
    (record,) = done.rounds
    trigger = next(e for e in events if isinstance(e, Trigger))
    assert record["action"] == "rewound"
    assert record["tokens_dropped"] == trigger.token_index - trigger.span_start + 1
    assert record["dropped_text"] == WRONG[trigger.span_start : trigger.token_index + 1]
    # The triggering token was never fed, so the cache loses one token fewer than the span; system_turn
    # also drops the assistant header and the kept prefix, to put the evidence before a fresh turn.
    # The session keeps the longest common prefix: the new system turn starts with the same <|im_start|>.
    header_and_prefix = len(backend.tokenize("<|im_start|>assistant\n", special=True)) - 1 + trigger.span_start
    expected = record["tokens_dropped"] - 1 + (header_and_prefix if injection == "system_turn" else 0)
    assert backend.trim_calls == [expected] and record["tokens_trimmed"] == expected
    text = backend.detokenize(backend.context)
    if injection == "system_turn":  # the evidence turn comes right before the (only) open assistant turn
        assert text.count("<|im_start|>assistant\n") == 1
        assert text.index("using the text above") < text.index("<|im_start|>assistant\n")
    # Injected text is in the model's context but never in the visible reply.
    assert "Rightburg." in backend.detokenize(backend.context)
    assert "using the text above" in backend.detokenize(backend.context) and "using the text above" not in done.text
    assert record["chosen"]["source"] == "memory:country:TL"
    assert arm.calls[0].question == QUESTION


RAW = "Q: What is the capital of Testland?\nA: The capital of Testland is"


def script_raw(context: str):
    """A raw prompt (no chat turns): the scripted model plans the whole text. After the evidence line it
    writes the sentence it is given again with the right town; before, the wrong one."""
    if "[evidence:" not in context:
        return plan(RAW + " Wrongville.", doubtful="Wrongville")
    line = "A: The capital of Testland is"
    said_again = context.index(line, context.index("[evidence:")) + len(line)
    return plan(context[:said_again] + " Rightburg.")


def test_a_raw_prompt_is_continued_and_its_rewind_says_the_sentence_again():
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    backend = ScriptedBackend(script_raw)
    done = generate(backend, Continuation(RAW), cfg(injection="system_turn"), {"memory": arm})
    assert done.text == " Rightburg." and done.receipt["config"]["injection"] == "inline"
    (record,) = done.rounds
    assert record["action"] == "rewound" and arm.calls[0].question == RAW.strip()
    # The prompt went in as plain text (no template), then the evidence on its own line and the unfinished
    # line said again: the context is what a fresh run on that text would hold, token for token.
    evidence = record["tokens_injected"]
    context = backend.detokenize(backend.context)
    assert context.startswith(RAW + " Wrongville"[: record["trigger"]["span_start"]] + "\n[evidence: ")
    assert context.endswith("]\nA: The capital of Testland is Rightburg.") and evidence > 0
    fresh = ScriptedBackend(script_raw)
    seeded = context[: -len(" Rightburg.")]
    again = generate(fresh, Continuation(seeded), cfg(mode="off"), {})
    assert again.text == " Rightburg." and fresh.context == backend.context
    assert done.receipt["messages"] == [{"role": "prompt", "content": RAW}]


def test_a_raw_prompt_takes_no_tools_or_format_and_no_chat_api():
    with pytest.raises(InputError, match="raw prompt"):
        list(stream(ScriptedBackend(script_raw), Continuation(RAW), cfg(), {}, output=ResponseFormat("json_object")))


def test_rewind_keeps_the_cache_prompt_is_fed_once():
    backend, events, done = run(cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])})
    (record,) = done.rounds
    prompt_len = backend.append_calls[0]
    assert prompt_len == done.result.prompt_tokens
    # After the prompt: one token per decode step and one batch for the injected segment, never a re-prefill.
    # (The segment's first token, <|im_start|>, is already in the cache: the longest common prefix stays.)
    later = backend.append_calls[1:]
    segment = record["tokens_injected"] - 1
    assert sorted(set(later)) == sorted({1, segment})
    assert later.count(segment) == 1
    assert backend.fed_tokens == prompt_len + segment + later.count(1)


def test_max_rounds_bounds_interventions():
    def stubborn(context):
        return plan(WRONG, doubtful="Wrongville")  # evidence never helps

    for max_rounds in (0, 1, 2, 3):
        _, events, done = run(
            cfg(max_rounds=max_rounds), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=stubborn
        )
        assert len(done.rounds) == max_rounds
        assert sum(isinstance(e, Trigger) for e in events) == max_rounds
        assert done.text == WRONG


@pytest.mark.parametrize(
    "arm",
    [
        StaticArm("memory", []),  # empty grounding
        StaticArm("memory", [RIGHT_EVIDENCE], delay=0.6),  # slower than the round deadline
        StaticArm("memory", [RIGHT_EVIDENCE], error=RuntimeError("store offline")),
    ],
)
def test_failed_grounding_gives_the_detect_mode_reply(arm):
    _, _, detect = run(cfg(mode="detect"))
    started = time.monotonic()
    _, _, done = run(cfg(round_deadline_s=0.3, max_rounds=1), {"memory": arm})
    elapsed = time.monotonic() - started
    assert done.text == detect.text == WRONG
    (record,) = done.rounds
    assert record["action"] == "resumed_unmodified"
    assert record["tokens_dropped"] == 0
    status = record["arms"][0]["status"]
    assert status in ("empty", "timeout", "error")
    assert status in record["reason"]
    if arm.delay:
        assert elapsed < 0.3 + 0.1 + 0.2  # deadline + slack for decoding the scripted reply


def test_arm_order_falls_through_to_the_next_arm():
    empty_memory = StaticArm("memory", [])
    tool = StaticArm("tool", [RIGHT_EVIDENCE])
    _, _, done = run(cfg(), {"memory": empty_memory, "tool": tool})
    (record,) = done.rounds
    assert [a["arm"] for a in record["arms"]][-1] == "tool"
    assert record["arms"][0]["status"] == "empty"
    assert done.text == RIGHT


def test_holdback_stream_never_shows_rewound_text():
    _, events, done = run(cfg(stream="holdback"), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])})
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == done.text == RIGHT
    assert "Wrong" not in shown
    assert all(e.n_tokens == 0 for e in events if isinstance(e, Rewind))
    # Shown in order, each index once.
    indices = [e.index for e in events if isinstance(e, Token)]
    assert indices == list(range(len(indices)))


def test_emit_stream_sends_rewind_events_a_consumer_can_apply():
    _, events, done = run(cfg(stream="emit", statistic="mean"), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])})
    screen: list[str] = []
    saw_wrong = False
    for e in events:
        if isinstance(e, Token):
            screen.append(e.text)
            saw_wrong |= "W" in e.text
        elif isinstance(e, Rewind):
            assert e.n_tokens > 0
            del screen[len(screen) - e.n_tokens :]
    assert saw_wrong  # emit shows tokens at once ...
    assert "".join(screen) == done.text == RIGHT  # ... and the rewind retracts them


def test_off_and_detect_give_identical_tokens():
    _, _, off = run(cfg(mode="off"))
    _, _, detect = run(cfg(mode="detect"))
    assert off.text == detect.text
    assert off.result.surprise is None and detect.result.surprise["n"] == len(WRONG)


def test_window_resets_after_a_round_and_the_receipt_records_it():
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    result = generate(ScriptedBackend(script_testland), QUESTION, cfg(), {"memory": arm})
    assert result.text == RIGHT
    receipt = result.receipt
    assert receipt["config"]["threshold"] == 3.0 and receipt["mode"] == "intervene"
    (record,) = receipt["rounds"]
    for key in (
        "trigger",
        "span_class",
        "arm_order",
        "arms",
        "chosen",
        "action",
        "tokens_dropped",
        "tokens_injected",
        "latency_ms",
    ):
        assert key in record
    assert receipt["canary"]["verdict"] != "not_scored"


def test_empty_question_is_a_clear_error():
    from surprisegate.errors import InputError

    with pytest.raises(InputError, match="question is empty"):
        list(stream(ScriptedBackend(script_testland), "   ", cfg()))


def test_backend_that_cannot_trim_falls_back_to_reprefill_and_says_so():
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    trimmable, _, with_trim = run(cfg(), arms)
    fixed = ScriptedBackend(script_testland, trimmable=False)
    _, _, without_trim = run(cfg(), arms, backend=fixed)
    assert without_trim.text == with_trim.text == RIGHT
    assert fixed.trim_calls == []
    (record,) = without_trim.rounds
    assert record["rewind_method"] == "reprefill" and with_trim.rounds[0]["rewind_method"] == "trim"
    assert fixed.context == trimmable.context  # the same context either way
    assert fixed.fed_tokens > trimmable.fed_tokens  # ... paid for with a re-prefill


def test_novel_signal_skips_tokens_copied_from_the_question():
    _, events, done = run(
        cfg(signal="novel", statistic="max", window=4, min_tokens=1), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    )
    trigger = next(e for e in events if isinstance(e, Trigger))
    # "The capital is " copies the question: never in the window, so the span starts inside the answer.
    assert trigger.span_start >= WRONG.index("Wrongville")
    assert trigger.statistic == "novel:max"
    assert done.rounds[0]["dropped_text"] in "Wrongville"


def test_per_kind_threshold_overrides_the_global_one():
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, _, high = run(cfg(threshold=3.0, kind_thresholds={"capital": 100.0}), arms)
    assert high.rounds == [] and high.text == WRONG
    _, events, low = run(cfg(threshold=100.0, kind_thresholds={"capital": 3.0}), arms)
    assert low.rounds and next(e for e in events if isinstance(e, Trigger)).threshold == 3.0


def test_a_later_round_reuses_the_arm_answer_instead_of_calling_again():
    def stubborn(context):
        return plan(WRONG, doubtful="Wrongville")

    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    _, _, done = run(cfg(max_rounds=2), {"memory": arm}, script=stubborn)
    assert len(done.rounds) == 2 and len(arm.calls) == 1
    second = done.rounds[1]
    assert second["arms"][0]["cached"] is True and second["action"] == "resumed_unmodified"


def test_a_closed_question_is_left_as_answered_unless_configured():
    question = "Is Rightburg or Wrongville the capital of Testland?"
    detect_backend = ScriptedBackend(script_testland)
    detect = list(stream(detect_backend, question, cfg(mode="detect"), {}))[-1]
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    done = list(stream(ScriptedBackend(script_testland), question, cfg(max_rounds=1), {"memory": arm}))[-1]
    assert done.text == detect.text == WRONG and arm.calls == []  # no grounding call spent on it
    (record,) = done.rounds
    assert record["action"] == "resumed_unmodified" and record["closed_question"] == "yes_no"
    assert "ground_closed_questions" in record["reason"]
    grounded = list(
        stream(
            ScriptedBackend(script_testland), question, cfg(max_rounds=1, ground_closed_questions=True), {"memory": arm}
        )
    )[-1]
    assert grounded.text == RIGHT and len(arm.calls) == 1


# A model that, shown the evidence, stops answering: the rewrite uses none of the evidence's words.
IGNORED = "The capital is a fine topic. What is your question?"


def script_ignores_evidence(context: str, ignored: str = IGNORED):
    if "The capital of Testland is Rightburg.\nAnswer the user" in context:
        return plan(ignored)
    return plan(WRONG, doubtful="Wrongville")


@pytest.mark.parametrize("trimmable", [True, False])
def test_a_rewrite_that_ignores_the_evidence_is_reverted_to_the_unintervened_reply(trimmable):
    off_backend, _, off = run(cfg(mode="off"), script=script_ignores_evidence)
    backend = ScriptedBackend(script_ignores_evidence, trimmable=trimmable)
    # The retry is pinned by its own tests below; here the revert alone.
    _, events, done = run(
        cfg(retry_failed_rewrite=False), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, backend=backend
    )
    assert off.text == WRONG
    assert done.text == WRONG  # never worse than the reply written without the evidence
    (record,) = done.rounds
    assert record["action"] == "reverted"
    assert record["rewritten_text"].endswith("a fine topic.")  # up to the end of the checked sentence
    assert "used none of the evidence" in record["reason"]
    assert backend.context == off_backend.context  # the cache holds exactly what the plain run held
    # Holdback streaming never showed the ignored rewrite, and showed each index once, in order.
    shown = [e for e in events if isinstance(e, Token)]
    assert "".join(e.text for e in shown) == WRONG and "topic" not in "".join(e.text for e in shown)
    assert [e.index for e in shown] == list(range(len(shown)))
    rewinds = [e for e in events if isinstance(e, Rewind)]
    assert [e.reverted for e in rewinds] == [False, True] and all(e.n_tokens == 0 for e in rewinds)
    # The canary does not count a reverted round as anchoring.
    assert (
        generate(
            ScriptedBackend(script_ignores_evidence),
            QUESTION,
            cfg(retry_failed_rewrite=False),
            {"memory": StaticArm("memory", [RIGHT_EVIDENCE])},
        ).receipt["canary"]["anchoring"]
        == 0
    )


def test_revert_is_also_judged_at_the_end_of_a_reply_without_a_full_stop():
    script = lambda context: script_ignores_evidence(context, ignored="The capital is a fine topic")  # noqa: E731
    _, _, done = run(cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=script)
    assert done.text == WRONG and done.rounds[0]["action"] == "reverted"


def test_revert_in_emit_streaming_retracts_the_shown_rewrite():
    _, events, done = run(
        cfg(stream="emit"), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=script_ignores_evidence
    )
    screen: list[str] = []
    for e in events:
        if isinstance(e, Token):
            screen.append(e.text)
        elif isinstance(e, Rewind):
            del screen[len(screen) - e.n_tokens :]
    assert "".join(screen) == done.text == WRONG
    assert next(e for e in events if isinstance(e, Rewind) and e.reverted).n_tokens > 0


def test_revert_can_be_turned_off_and_a_used_evidence_rewrite_stands():
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, _, kept = run(cfg(revert_unused_evidence=False), arms, script=script_ignores_evidence)
    assert kept.text == IGNORED and kept.rounds[0]["action"] == "rewound"
    _, _, fixed = run(cfg(), arms)  # the rewrite names Rightburg, the evidence's own word
    assert fixed.text == RIGHT and fixed.rounds[0]["action"] == "rewound"


# --- one more try before a failed rewrite is dropped ----------------------------------------------------
GATEWAY_QUESTION = "What port does the gateway listen on?"
GATEWAY_EVIDENCE = Evidence(
    claim="gateway port", evidence="The gateway is gw.example.org on port 8443.", confidence=0.9, source="memory:notes"
)


def script_cut_short(context: str):
    """Shown the evidence, the model would end its turn right after "gw." (end of turn outranks the next byte)."""
    if "The gateway is gw.example.org" not in context:
        return plan("443 is its port.", doubtful="443")
    reply = "It is gw.example.org on port 8443."
    steps = [(c, 0.95) for c in reply]
    steps[reply.index("example")] = ("e", 0.3, {"<eos>": 0.6})  # the end of turn outranks the rest of the host
    return steps


def test_a_rewrite_cut_short_by_an_end_of_turn_gets_one_more_try_past_it():
    backend = ScriptedBackend(script_cut_short)
    events = list(stream(backend, GATEWAY_QUESTION, cfg(), {"memory": StaticArm("memory", [GATEWAY_EVIDENCE])}))
    done = events[-1]
    assert done.text == "It is gw.example.org on port 8443."
    (record,) = done.rounds
    assert record["action"] == "rewound"
    (retry,) = record["retries"]
    assert retry["how"] == "continued past the end of turn" and retry["rewrite"] == "It is gw."
    assert "does not answer what was asked" in retry["problem"]  # "gw." holds no port number
    # Without the retry the cut rewrite is dropped and the reply written without evidence comes back.
    plain = list(
        stream(
            ScriptedBackend(script_cut_short),
            GATEWAY_QUESTION,
            cfg(retry_failed_rewrite=False),
            {"memory": StaticArm("memory", [GATEWAY_EVIDENCE])},
        )
    )[-1]
    assert plain.text == "443 is its port." and plain.rounds[0]["action"] == "reverted"


def script_wrong_start(context: str):
    """Shown the evidence, the model's first choice chats; its runner-up start answers from the evidence."""
    turn = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "The capital of Testland is Rightburg.\nAnswer the user" not in context:
        return plan("Wrongville is the capital.", doubtful="Wrongville")
    if turn.startswith("R"):
        return plan("Rightburg is the capital.")
    chat = [(c, 0.95) for c in IGNORED]
    chat[0] = ("T", 0.6, {"R": 0.3})
    return chat


def test_a_rewrite_that_failed_its_check_is_written_again_with_its_first_token_banned():
    _, events, done = run(cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=script_wrong_start)
    assert done.text == "Rightburg is the capital."
    (record,) = done.rounds
    assert record["action"] == "rewound"
    assert record["retries"][0]["how"].startswith("rewritten from the rewind point")
    assert record["retries"][0]["rewrite"].startswith("The capital is a fine topic.")
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == done.text  # holdback never showed the failed rewrite


def test_a_retry_that_fails_again_is_reverted_to_the_plain_reply():
    off_backend, _, off = run(cfg(mode="off"), script=script_ignores_evidence)
    backend, events, done = run(
        cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script=script_ignores_evidence
    )
    assert done.text == off.text == WRONG
    record = done.rounds[0]
    assert record["action"] == "reverted" and len(record["retries"]) == 1
    assert backend.context == off_backend.context
    assert all(r["action"] != "rewound" for r in done.rounds)


def script_chats_until_forced(context: str):
    """Shown the evidence, the model chats, and after its chat is banned it would chat another way ("I'm …");
    only a start the evidence opens ("R") leads it to answer from it."""
    turn = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "The capital of Testland is Rightburg.\nAnswer the user" not in context:
        return plan("Wrongville is the capital.", doubtful="Wrongville")
    if turn.startswith("R"):
        return plan("Rightburg is the capital.")
    if turn.startswith("I"):
        return plan("I'm ready to help.")
    chat = [(c, 0.9) for c in IGNORED]
    chat[0] = ("T", 0.6, {"I": 0.2, "R": 0.01})
    return chat


class VocabScripted(ScriptedBackend):
    n_vocab = VOCAB  # as llama.cpp in process says it: a retry may ban all but the evidence's openers


@pytest.mark.parametrize("opens_evidence", [True, False])
def test_a_retry_opens_with_a_word_of_its_evidence(opens_evidence):
    config = cfg(retry_opens_evidence=opens_evidence)
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, events, done = run(config, arms, backend=VocabScripted(script_chats_until_forced))
    record = done.rounds[0]
    if opens_evidence:  # every first token but " " and "R" (of "Rightburg") banned for that one step
        assert done.text == "Rightburg is the capital." and record["action"] == "rewound"
        assert record["retries"][0]["rewrite"].startswith("The capital is a fine topic.")
    else:  # its first token alone banned, it chats again ("I'm ready to help.") and the plain reply comes back
        assert done.text == "Wrongville is the capital." and record["action"] == "reverted"
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.text


def script_shouts(context: str):
    """Shown the evidence, the model uses it but shouts it ("RIGHTBURG IS THE CAPITAL.": a miscased word fails the
    check); its runner-up start chats."""
    turn = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "The capital of Testland is Rightburg.\nAnswer the user" not in context:
        return plan("Wrongville is the capital.", doubtful="Wrongville")
    if turn.startswith("I"):
        return plan("I'm ready to help.")
    shout = [(c, 0.9) for c in "RIGHTBURG IS THE CAPITAL."]
    shout[0] = ("R", 0.6, {"I": 0.2})
    return shout


def test_a_rewrite_that_used_its_evidence_is_tried_again_unconstrained():
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, _, done = run(cfg(retry_opens_evidence=True), arms, backend=VocabScripted(script_shouts))
    record = done.rounds[0]
    (retry,) = record["retries"]
    assert retry["how"] == "rewritten from the rewind point with its first token banned"  # no opening imposed
    assert record["action"] == "reverted" and done.text == "Wrongville is the capital."


@pytest.mark.parametrize(
    "text, spaced",
    [
        ("Its capital is", True),
        ("… is the Kwacha (MWK).", True),
        ("Its code is 12,", True),
        ("", False),
        ("Hello ", False),
        ("Line\n", False),
        ('He said "', False),
        ("(", False),
    ],
)
def test_a_word_after_a_word_or_a_stop_opens_with_a_space(text, spaced):
    assert needs_space(text) is spaced


def test_only_a_backend_that_bans_in_process_opens_with_evidence():
    config = cfg(retry_opens_evidence=True)
    assert EvidenceOpeners.of(VocabScripted(script_testland), config) is not None
    assert EvidenceOpeners.of(ScriptedBackend(script_testland), config) is None  # no vocabulary size
    assert EvidenceOpeners.of(VocabScripted(script_testland), cfg(item_retry_opens_evidence=False)) is None  # both off
    openers = EvidenceOpeners.of(VocabScripted(script_testland), config)
    assert openers.openers(["The capital of Testland is Rightburg."], QUESTION) == {ord(" "), ord("R")}
    assert openers.openers(["The capital of Testland is Rightburg."], QUESTION, spaced=True) == {ord(" ")}
    assert openers.bans(["Testland."], QUESTION) == frozenset()  # nothing of its own: no ban at all
    assert len(openers.bans(["Rightburg."], QUESTION)) == VOCAB - 2


class JoinedSpaces:
    """A vocabulary that joins a space to the word after it (" Rightburg" one token) but writes digits apart, a
    bare space before them (" 1889" -> " ", "1889"), as SmolLM2's does."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {" ": 0}

    def tokenize(self, text: str) -> list[int]:
        pieces = [" ", text[1:]] if text[1:2].isdigit() else [text]
        return [self.ids.setdefault(piece, len(self.ids)) for piece in pieces]

    def token_bytes(self, token: int) -> bytes:
        return next(piece for piece, i in self.ids.items() if i == token).encode()


def test_a_bare_space_opens_no_word_where_the_vocabulary_joins_spaces_to_words():
    vocab = JoinedSpaces()
    openers = EvidenceOpeners(vocab.tokenize, 100, vocab.token_bytes)
    found = openers.openers(["Pierre, 1889."], "Write about it.", spaced=True)
    assert found == {vocab.ids[" Pierre"]} and vocab.ids[" "] not in found  # " " + "1889" would open anything
    assert openers.openers(["In 1889."], "Write about it.", spaced=True) == frozenset()
    assert openers.bans(["In 1889."], "Write about it.", spaced=True) == frozenset()  # no ban


BOOKS_QUESTION = (
    "Roger had 25 books. If he sold 21 of them and used the money he earned to buy 30 new books, "
    "how many books would Roger have?"
)
BOOKS_ANSWER = Evidence(claim="56", evidence="The answer is 34.", confidence=1.0, source="tool:program")
BOOKS_TAIL = "Roger would have 34 books after selling 21 and buying 30 new books."


def script_books(context: str):
    """Shown the computed answer, the model states it and goes on restating the question's numbers; a full
    stop is its runner-up right after the answer's noun."""
    if "The answer is 34." not in context:
        return plan("Roger would have 56 books.", doubtful="56")
    if context.endswith("Roger would have 34 books."):
        return plan("Roger would have 34 books.")
    tail = plan(BOOKS_TAIL)
    at = BOOKS_TAIL.index(" after")
    tail[at] = (" ", 0.6, {".": 0.35})
    return tail


@pytest.mark.parametrize("answer_last", [True, False])
def test_a_computed_answer_ends_its_claim(answer_last):
    backend = ScriptedBackend(script_books)
    config = cfg(answer_last=answer_last, max_tokens=120)
    events = list(stream(backend, BOOKS_QUESTION, config, {"tool": StaticArm("tool", [BOOKS_ANSWER])}))
    done = events[-1]
    (record,) = done.rounds
    assert record["action"] == "rewound" and record["span_class"] == "computable"
    if not answer_last:
        assert done.text == BOOKS_TAIL and not record.get("retries")
        return
    assert done.text == "Roger would have 34 books."
    (retry,) = record["retries"]
    assert retry["rewrite"] == " after selling 21 and buying 30 new books."
    assert retry["how"].startswith("cut at the clause boundary after the computed answer")
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == done.text  # holdback never showed the cut tail
    assert backend.detokenize(backend.context).endswith("Roger would have 34 books.")  # the cache holds the kept text


NATIONALITY_QUESTION = "What nationality is the singer Tom Example?"
PERSON_EVIDENCE = Evidence(
    claim="Tom Example", evidence="Tom Example is the son of Harold Example.", confidence=0.9, source="web:test"
)


def script_nationality(context: str):
    if "Harold Example" in context:
        return plan("Tom Example is the son of Harold Example.")
    return plan("Tom Example is Zorbish.", doubtful="Zorbish")


def test_a_rewrite_that_answers_another_kind_of_question_is_reverted():
    _, _, off = run(cfg(mode="off"), script=script_nationality)
    backend = ScriptedBackend(script_nationality)
    done = list(stream(backend, NATIONALITY_QUESTION, cfg(), {"web": StaticArm("web", [PERSON_EVIDENCE])}))[-1]
    assert done.rounds[0]["action"] == "reverted"
    assert "does not answer what was asked" in done.rounds[0]["reason"]
    assert "nationality" in done.rounds[0]["reason"]


# --- arm arbitration ------------------------------------------------------------------------------------


GATE = Path(__file__).resolve().parents[1] / "surprisegate" / "gate"


def _lengths(kind) -> dict[str, int]:
    """Lines of every function (or class) in the gate's modules, by module:name."""
    out = {}
    for path in sorted(GATE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, kind):
                out[f"{path.stem}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_the_loop_reads_in_one_sitting():
    # Issue 23: the loop and its parts are short named pieces: no function over 40 lines, the loops under 250.
    functions = _lengths((ast.FunctionDef, ast.AsyncFunctionDef))
    assert "loop:_decode" in functions and "rewrite:_try_again" in functions  # the walk sees the loop's parts
    assert {k: v for k, v in functions.items() if v > 40} == {}
    classes = _lengths(ast.ClassDef)
    assert classes["loop:_ReplyLoop"] < 250 and classes["revise:_Revision"] < 250, classes


# --------------------------------------------------------------------------------------------
# a backend that fails mid-reply (a server breaking off): the reply ends cleanly with what it had
# --------------------------------------------------------------------------------------------
class FailingBackend(ScriptedBackend):
    """Raises a BackendFault the first time its context text satisfies `fails(text)`."""

    def __init__(self, script, fails, kind="reset"):
        super().__init__(script)
        self.fails, self.kind, self.failed = fails, kind, False

    def logits(self):
        if not self.failed and self.fails(self.detokenize(self.context)):
            self.failed = True
            raise BackendFault(f"http://127.0.0.1:1/completion: the stream broke off ({self.kind})", kind=self.kind)
        return super().logits()


def assistant_text(context: str) -> str:
    return context.rsplit("<|im_start|>assistant\n", 1)[-1] if "<|im_start|>assistant\n" in context else ""


def test_a_fault_mid_reply_keeps_what_arrived_and_the_receipt_says_what_happened():
    backend = FailingBackend(script_testland, lambda text: assistant_text(text) == "The capital")
    _, events, done = run(cfg(mode="detect"), backend=backend)
    assert done.text == "The capital" and done.finish_reason == "error"
    assert "".join(e.text for e in events if isinstance(e, Token)) == "The capital"  # every received token shown
    fault = done.result.fault
    assert fault["kind"] == "reset" and fault["at_token"] == len("The capital") and "broke off" in fault["message"]


def test_a_fault_before_the_first_token_ends_with_an_empty_reply_and_its_fault():
    backend = FailingBackend(script_testland, lambda text: True, kind="refused")
    _, _, done = run(cfg(), backend=backend)
    assert done.text == "" and done.finish_reason == "error" and done.result.fault["kind"] == "refused"


def test_a_fault_while_a_rewrite_is_unchecked_goes_back_to_the_reply_written_without_it():
    # The rewrite breaks off at "The capital is Ri": its sentence never showed it used the evidence.
    backend = FailingBackend(script_testland, lambda text: assistant_text(text).endswith("The capital is Ri"))
    _, events, done = run(cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, backend=backend)
    trigger = next(e for e in events if isinstance(e, Trigger))
    assert done.text == WRONG[: trigger.token_index]  # the reply as written up to the trigger, nothing rewritten
    assert "Ri" not in "".join(e.text for e in events if isinstance(e, Token))  # holdback never showed it
    (record,) = done.rounds
    assert record["action"] == "reverted" and "backend failed (reset)" in record["reason"]
    assert done.result.fault["at_token"] == trigger.token_index


def test_a_fault_on_the_resume_request_keeps_the_reply_and_its_round():
    # Fails on the context that holds the injected evidence: the resume request itself.
    backend = FailingBackend(script_testland, lambda text: "Answer the user" in text, kind="http")
    _, events, done = run(cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, backend=backend)
    trigger = next(e for e in events if isinstance(e, Trigger))
    assert done.text == WRONG[: trigger.token_index + 1]  # what arrived, the triggering token included
    (record,) = done.rounds
    assert record["action"] == "resumed_unmodified" and "the resume failed (http)" in record["reason"]
    assert done.result.fault["kind"] == "http"


# --------------------------------------------------------------------------------------------------
# stop strings
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream_mode", ["holdback", "emit"])
def test_a_stop_string_ends_decoding_once_it_can_no_longer_be_rewound(stream_mode):
    config = cfg(mode="detect", stream=stream_mode)
    full = list(stream(ScriptedBackend(script_testland), QUESTION, config))[-1]
    backend = ScriptedBackend(script_testland)
    events = list(stream(backend, QUESTION, config, stop=["capital"]))
    done = events[-1]
    assert full.text == WRONG and full.finish_reason == "stop"  # the end of turn
    # decoding stopped on the token that completed "capital", well before the reply's end
    assert done.finish_reason == "stop" and done.text == "The capital"
    assert done.n_tokens == len("The capital") < full.n_tokens
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.text


def test_a_stop_string_inside_a_span_that_may_still_be_rewound_does_not_end_the_reply():
    # "Wrongville" is doubtful: the window fires there and the span is rewritten to "Rightburg"
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    backend = ScriptedBackend(script_testland)
    done = list(stream(backend, QUESTION, cfg(), {"memory": arm}, stop=["Wrong"]))[-1]
    assert done.text == RIGHT  # "Wrong" was written, then rewound away: never final, never a stop
    done = list(stream(ScriptedBackend(script_testland), QUESTION, cfg(), {"memory": arm}, stop=["Right"]))[-1]
    assert done.text.startswith("The capital is Right") and done.finish_reason == "stop"


def test_no_stop_strings_change_nothing():
    a = list(stream(ScriptedBackend(script_testland), QUESTION, cfg(mode="detect")))
    b = list(stream(ScriptedBackend(script_testland), QUESTION, cfg(mode="detect"), stop=["", "zzz"]))
    assert a[-1].text == b[-1].text and a[-1].n_tokens == b[-1].n_tokens and a[-1].finish_reason == "stop"


class _StatefulBackend(ScriptedBackend):
    """The scripted model with a one-number "hidden state": 1.0 once its reply has started writing "W"."""

    tapped_layer = 0

    def hidden_state(self):
        reply = self.detokenize(self.context).split("<|im_start|>assistant\n")[-1]
        return np.array([1.0 if "W" in reply else 0.0, 0.0], np.float32)


def probe_file(tmp_path, cut):
    """A probe for the scripted model: its score is the sentence's mean state, in "capital" questions."""
    from surprisegate.gate.probe import TriggerProbe

    path = tmp_path / "probe.npz"
    TriggerProbe(
        "scripted-test-model", 0, frozenset({"capital"}), np.zeros(2), np.ones(2), 0.0, np.array([1.0, 0.0]), 0.0, cut
    ).save(path)
    return path


def test_a_probe_judges_the_first_sentence_at_its_end_and_rewinds_it_whole(tmp_path):
    path = probe_file(tmp_path, cut=0.2)
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    backend, events, done = run(cfg(probe=str(path)), {"memory": arm}, backend=_StatefulBackend(script_testland))
    trigger = next(e for e in events if isinstance(e, Trigger))
    # The window rule alone fires inside "Wrongville"; the probe waits for the full stop and takes the sentence.
    assert trigger.statistic == "probe" and trigger.token_index == len(WRONG) - 1 and trigger.span_start == 0
    # The mean state over the sentence: the states that chose "rongville." (10 of its 26 tokens) read 1.
    assert trigger.value == pytest.approx(10 / 26, abs=1e-4) and trigger.threshold == pytest.approx(0.2)
    assert done.text == RIGHT and done.rounds[0]["action"] == "rewound"
    assert done.result.probe["score"] == pytest.approx(trigger.value, abs=1e-4)
    # The arms are asked about the sentence's highest window, not the whole restating sentence.
    asked = done.rounds[0]["arms"][0]["query"]["span"]
    assert asked == "is W" and asked in trigger.span_text  # the window where "Wrongville" began
    # Off, the same reply is judged by the window rule at the doubtful token.
    _, events, _ = run(
        cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, backend=_StatefulBackend(script_testland)
    )
    assert next(e for e in events if isinstance(e, Trigger)).token_index == WRONG.index("Wrongville")


def test_a_probe_that_finds_the_sentence_sound_leaves_the_reply_alone(tmp_path):
    path = probe_file(tmp_path, cut=0.9)
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    _, events, done = run(cfg(probe=str(path)), {"memory": arm}, backend=_StatefulBackend(script_testland))
    assert done.text == WRONG and done.rounds == [] and arm.calls == []
    assert done.result.probe["score"] < 0.9


def test_a_probe_judges_a_first_sentence_left_open_at_the_end_of_turn(tmp_path):
    unfinished = "The capital is Wrongville"

    def script(context):
        return plan(RIGHT) if "Rightburg" in context else plan(unfinished, doubtful="Wrongville")

    path = probe_file(tmp_path, cut=0.2)
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    _, events, done = run(cfg(probe=str(path)), {"memory": arm}, backend=_StatefulBackend(script))
    trigger = next(e for e in events if isinstance(e, Trigger))
    assert trigger.statistic == "probe" and trigger.token_index == len(unfinished) - 1 and trigger.span_start == 0
    assert done.text == RIGHT and done.rounds[0]["action"] == "rewound"
    # detect: the same judgement is recorded, the reply stays as written
    _, _, done = run(cfg(mode="detect", probe=str(path)), {}, backend=_StatefulBackend(script))
    assert done.text == unfinished and done.result.would_trigger[0]["statistic"] == "probe"


# --------------------------------------------------------------------------------------------
# sentence scope: every sentence of a paragraph judged on its own claim
# --------------------------------------------------------------------------------------------
PARAGRAPH_Q = "Write a short paragraph about Testland: its capital and its currency."
OPENING = "Testland is a small and quiet country."
WRONG_PARAGRAPH = f"{OPENING} Its capital is Wrongville. Its currency is the Testmark."
RIGHT_PARAGRAPH = f"{OPENING} Its capital is Rightburg. Its currency is the Testmark."


def script_paragraph(context: str, ignore_evidence: bool = False):
    """A paragraph whose opening is uncertain (wording, not fact), whose capital is a doubtful name, and
    whose currency is written confidently. With the capital's evidence in context (or Rightburg already
    written) the capital comes out right, unless `ignore_evidence`, when a rewrite names nothing."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or ("Rightburg." in context and not ignore_evidence):
        return plan(RIGHT_PARAGRAPH)
    if "Rightburg." in context and ignore_evidence:
        return plan(f"{OPENING} Its capital is a lovely place. Its currency is the Testmark.")
    out = plan(WRONG_PARAGRAPH, doubtful="Wrongville")
    for i in range(4):  # "Testland is": an uncertain opening, copied from the question anyway
        out[i] = (out[i][0], 0.05)
    return out


def paragraph_cfg(**kw):
    return cfg(**({"max_tokens": 160, "sentence_threshold": 3.0} | kw))


def run_paragraph(config, arms=None, script=script_paragraph, turns_join=False):
    backend = ScriptedBackend(script, turns_join=turns_join)
    events = list(stream(backend, PARAGRAPH_Q, config, arms or {}))
    return backend, events, events[-1]


def test_claim_scope_auto_is_sentence_for_a_paragraph_budget():
    assert cfg(max_tokens=160).sentence_scope and not cfg(max_tokens=64).sentence_scope
    assert cfg(max_tokens=64, claim_scope="sentence").sentence_scope
    assert not cfg(max_tokens=160, claim_scope="reply").sentence_scope


def test_sentence_scope_grounds_the_doubtful_claim_not_the_opening():
    arm = StaticArm("memory", [RIGHT_EVIDENCE])
    backend, events, done = run_paragraph(paragraph_cfg(), {"memory": arm})
    assert done.text == RIGHT_PARAGRAPH
    (trigger,) = [e for e in events if isinstance(e, Trigger)]
    # The rewind starts at the sentence's first claim word, on a word boundary; the words before it stay.
    kept = f"{OPENING} Its capital is "
    assert trigger.span_start == len(kept) and trigger.span_text.startswith("Wrongville.")
    assert trigger.statistic == "sentence:surprise" and trigger.value == pytest.approx(bits(0.02))
    (query,) = arm.calls
    assert query.subject == "Testland" and "Wrongville" not in query.question and "capital" in query.question
    (record,) = done.rounds
    assert record["action"] == "rewound"
    # The evidence left with its sentence: the model wrote the rest from the prompt and the reply alone.
    assert "Rightburg." not in backend.detokenize(backend.context).split("<|im_start|>assistant\n")[0]


LONGER_OPENING = f"{OPENING} It lies by the sea."


def script_longer_paragraph(context: str):
    """script_paragraph with one more sentence before the doubtful one."""
    return _longer(script_paragraph(context.replace(LONGER_OPENING, OPENING)))


def _longer(planned: list) -> list:
    at = len(OPENING)
    return planned[:at] + [(c, 0.95) for c in " It lies by the sea."] + planned[at:]


def test_sentence_turn_feeds_the_doubtful_sentence_alone_and_writes_the_same_paragraph():
    """injection = sentence_turn: the turn closes before the doubtful sentence, the evidence goes in a system
    turn, and a fresh assistant turn holds only that sentence's kept words; the sentences before it are never fed
    again, at the rewind or when the evidence leaves."""
    runs = {}
    for injection in ("system_turn", "sentence_turn"):
        contexts: list[str] = []

        def seen(context: str, contexts: list[str] = contexts) -> list:
            contexts.append(context)
            return script_longer_paragraph(context)

        backend = ScriptedBackend(seen, turns_join=True)
        arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
        events = list(stream(backend, PARAGRAPH_Q, paragraph_cfg(injection=injection), arms))
        runs[injection] = (backend, events[-1], next(c for c in contexts if "Rightburg." in c))
    (system, system_done, _), (sentence, sentence_done, at_rewind) = runs["system_turn"], runs["sentence_turn"]
    right = RIGHT_PARAGRAPH.replace(OPENING, LONGER_OPENING)
    assert sentence_done.text == system_done.text == right
    # The context the rewrite was decoded from: the two sentences in a closed turn, the evidence, the kept words.
    before, evidence_turn, rewrite_turn = at_rewind.rsplit("<|im_start|>", 2)
    assert before.endswith(f"<|im_start|>assistant\n{LONGER_OPENING}<|im_end|>\n")
    assert evidence_turn.startswith("system\n") and "Rightburg." in evidence_turn
    assert rewrite_turn == "assistant\n Its capital is "
    (record,) = sentence_done.rounds
    closed = len(sentence.tokenize("<|im_end|>\n", special=True))  # their turn closed: 2 tokens, not 58
    assert record["tokens_injected"] == system_done.rounds[0]["tokens_injected"] - len(LONGER_OPENING) + closed
    # Everything fed over the whole reply: those sentences once, not again at the rewind nor when the evidence left.
    assert sentence.fed_tokens <= system.fed_tokens - 2 * len(LONGER_OPENING)
    assert "Rightburg." not in sentence.detokenize(sentence.context).split("<|im_start|>assistant\n")[0]


def test_sentence_turn_acts_as_system_turn_on_the_first_sentence_and_in_reply_scope():
    """The reply's first sentence has nothing before it to keep, and one-sentence answers (reply scope) keep
    the layout their figures were measured with: both go exactly as under system_turn."""
    for config in (paragraph_cfg(injection="sentence_turn"), cfg(injection="sentence_turn")):
        done, fed = {}, {}
        for injection in ("sentence_turn", "system_turn"):
            backend = ScriptedBackend(script_testland)
            arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
            done[injection] = list(stream(backend, QUESTION, config.replace(injection=injection), arms))[-1]
            fed[injection] = backend.fed_tokens
        (first, *_), (reference, *_) = done["sentence_turn"].rounds, done["system_turn"].rounds
        assert first["tokens_injected"] == reference["tokens_injected"] > 0
        assert done["sentence_turn"].text == done["system_turn"].text and fed["sentence_turn"] == fed["system_turn"]


def test_sentence_scope_holds_back_one_sentence_at_a_time():
    _, events, done = run_paragraph(paragraph_cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])})
    shown_before_trigger = "".join(
        e.text
        for e in events[: events.index(next(e for e in events if isinstance(e, Trigger)))]
        if isinstance(e, Token)
    )
    assert shown_before_trigger == OPENING  # the finished opening was shown; the doubtful sentence never
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == RIGHT_PARAGRAPH and "Wrongville" not in shown


def test_detect_in_sentence_scope_records_each_doubtful_sentence_and_changes_nothing():
    _, _, off = run_paragraph(paragraph_cfg(mode="off"))
    _, _, detect = run_paragraph(paragraph_cfg(mode="detect"))
    assert off.text == detect.text == WRONG_PARAGRAPH
    (crossing,) = detect.result.would_trigger
    assert crossing["span_start"] == len(f"{OPENING} Its capital is ")


def test_a_reverted_sentence_stops_only_itself():
    script = lambda context: script_paragraph(context, ignore_evidence=True)  # noqa: E731

    class OnceArm(StaticArm):  # the capital's evidence, then nothing for the currency
        def ground(self, query, deadline):
            return super().ground(query, deadline) if not self.calls else (self.calls.append(query) or [])

    arm = OnceArm("memory", [RIGHT_EVIDENCE])
    config = paragraph_cfg(retry_failed_rewrite=False, sentence_threshold=0.01)
    _, events, done = run_paragraph(config, {"memory": arm}, script)
    assert done.text == WRONG_PARAGRAPH  # never worse than the paragraph written without evidence
    # The capital's rewrite dropped its claim and went back; the currency sentence was still judged.
    assert [r["action"] for r in done.rounds] == ["reverted", "resumed_unmodified"]
    assert "lovely place" in done.rounds[0]["rewritten_text"]
    assert [e.span_text.strip() for e in events if isinstance(e, Trigger)][1] == "Testmark."


def test_paragraph_rounds_caps_a_reply():
    _, _, done = run_paragraph(
        paragraph_cfg(sentence_threshold=0.0, paragraph_rounds=1), {"memory": StaticArm("memory", [])}
    )
    assert len(done.rounds) == 1


def test_an_unchecked_paragraph_rewrite_still_takes_its_evidence_out_when_its_sentence_ends():
    # revert_unused_evidence off: nothing is checked, but the paragraph must not end on the evidence turn.
    backend, _, done = run_paragraph(
        paragraph_cfg(revert_unused_evidence=False), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    )
    assert done.text == RIGHT_PARAGRAPH and [r["action"] for r in done.rounds] == ["rewound"]
    assert "Rightburg." not in backend.detokenize(backend.context).split("<|im_start|>assistant\n")[0]


BRIDGES_PARAGRAPH = f"{OPENING} Its capital is Rightburg. It is a city of bridges."


def script_diverging(context: str):
    """A paragraph whose rest depends on the capital in its context: after Rightburg the model writes about
    bridges and never states the currency; after its own Wrongville it states the currency."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or "Rightburg." in context:
        return plan(BRIDGES_PARAGRAPH)
    return script_paragraph(context)


@pytest.mark.parametrize("goes_on, text", [("own_sentence", RIGHT_PARAGRAPH), ("rewrite", BRIDGES_PARAGRAPH)])
def test_a_patched_sentence_leaves_the_rest_of_the_paragraph_as_the_model_wrote_it(goes_on, text):
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, _, off = run_paragraph(paragraph_cfg(mode="off"), script=script_diverging)
    # The bridges paragraph never states the currency: it does not go on for it here (unsaid_items_go_on = 0).
    config = paragraph_cfg(paragraph_goes_on=goes_on, unsaid_items_go_on=0)
    backend, events, done = run_paragraph(config, arms, script_diverging)
    assert done.text == text and [r["went_on_from"] for r in done.rounds] == [goes_on]
    if goes_on == "own_sentence":
        # Only the claim changed: the rest is off's, and the context holds the model's own sentence, no evidence.
        assert done.text == off.text.replace("Wrongville", "Rightburg")
        context = backend.detokenize(backend.context)
        assert "Its capital is Wrongville. Its currency" in context and "Rightburg" not in context
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert shown == text and "Wrongville" not in shown


LOOPING_PARAGRAPH = f"{OPENING} Its capital is Rightburg." + " It is a city of many old bridges and towers." * 3


def script_looping(context: str):
    """After Rightburg the model loses its plan and repeats itself; after its own Wrongville it states the currency."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or "Rightburg." in context:
        return plan(LOOPING_PARAGRAPH)
    return script_paragraph(context)


@pytest.mark.parametrize("guard", [3, 0])
def test_a_paragraph_that_loops_after_a_rewrite_goes_on_from_the_models_own_sentence(guard):
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    _, _, off = run_paragraph(paragraph_cfg(mode="off"), script=script_looping)
    config = paragraph_cfg(paragraph_loop_guard=guard, unsaid_items_go_on=0)  # the loop owes the currency
    backend, events, done = run_paragraph(config, arms, script_looping)
    shown = "".join(e.text for e in events if isinstance(e, Token))
    (record,) = done.rounds
    if guard == 0:  # off: the loop stands
        assert done.text == shown and LOOPING_PARAGRAPH.startswith(done.text)  # to max_tokens
        assert done.text.count("old bridges") == 2 and record["went_on_from"] == "rewrite"
        return
    # The rewrite stays, the rest is what the model wrote without the round; the loop was never shown.
    assert done.text == shown == off.text.replace("Wrongville", "Rightburg") == RIGHT_PARAGRAPH
    assert record["went_on_from"] == "own_sentence" and "bridges" in record["went_back_from"]
    assert "bridges" not in shown and any(isinstance(e, Rewind) and "bridges" in e.dropped_text for e in events)
    context = backend.detokenize(backend.context)
    assert "Its capital is Wrongville. Its currency" in context and "bridges" not in context


def test_a_paragraph_that_goes_on_from_a_rewrite_without_a_loop_is_shown_once_the_watch_ends():
    # Past the watched sentences the text is no longer held: it streams sentence by sentence again.
    facts = [
        "The river Testa runs north.",
        "Its people speak Testish.",
        "Most towns sit by the sea.",
        "The winters are long and dark.",
        "Its flag is blue and green.",
    ]
    long_tail = f"{OPENING} Its capital is Rightburg. " + " ".join(facts)

    def script(context: str):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        return plan(long_tail) if "Rightburg" in reply or "Rightburg." in context else script_paragraph(context)

    backend = ScriptedBackend(script)
    config = paragraph_cfg(paragraph_loop_guard=2, max_tokens=400, unsaid_items_go_on=0)
    shown, fed_when_shown = "", {}
    for event in stream(backend, PARAGRAPH_Q, config, {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}):
        if isinstance(event, Token):
            shown += event.text
            fed_when_shown.setdefault(sum(fact in shown for fact in facts), len(backend.context))
        done = event
    assert done.text == shown == long_tail and done.rounds[0]["went_on_from"] == "rewrite"
    # The third sentence after the rewrite's was shown while the model was still writing the rest.
    assert fed_when_shown[3] < len(backend.context)


def test_a_patch_in_place_is_not_made_where_the_sentences_end_differently():
    # The model's own sentence ends with a line break, the rewrite with a stop: the rest cannot join both.
    def script(context: str):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "Rightburg" in reply or "Rightburg." in context:
            return plan(RIGHT_PARAGRAPH)
        return plan(f"{OPENING} Its capital is Wrongville\nIts currency is the Testmark.", doubtful="Wrongville")

    config = paragraph_cfg(paragraph_goes_on="own_sentence")
    _, _, done = run_paragraph(config, {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script)
    assert done.text == RIGHT_PARAGRAPH and [r["went_on_from"] for r in done.rounds] == ["rewrite"]


def test_the_sentence_after_a_patch_is_judged_even_when_the_rewrite_ends_on_an_initial():
    # "Port F." does not end a sentence by the text rule (an initial), but the patched sentence ended there:
    # the model's own next sentence, a doubtful currency, must still be judged.
    port = Evidence(
        claim="capital of Testland", evidence="The capital of Testland is Port F.", confidence=0.9, source="memory:x"
    )
    wrong = f"{OPENING} Its capital is Wrongville. Its currency is the Wrongmark."

    def script(context: str):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "Port F." in context and "Wrongville" not in reply:
            return plan(f"{OPENING} Its capital is Port F.")  # the rewrite ends the turn
        out = plan(wrong, doubtful="Wrongville")
        at = wrong.index("Wrongmark")
        return [(c, 0.02) if at <= i < at + 9 else (c, p) for i, (c, p) in enumerate(out)]

    config = paragraph_cfg(paragraph_goes_on="own_sentence")
    _, events, done = run_paragraph(config, {"memory": StaticArm("memory", [port])}, script)
    triggers = [e.span_text.strip() for e in events if isinstance(e, Trigger)]
    assert triggers == ["Wrongville.", "Wrongmark."]
    assert done.text.startswith(f"{OPENING} Its capital is Port F. Its currency is the ")


@pytest.mark.parametrize("keeps_asked, splice", [(False, False), (True, False), (True, True)])
def test_rewrite_keeps_asked_drops_a_rewrite_that_stops_speaking_of_an_asked_item(keeps_asked, splice):
    wrong = f"{OPENING} Its capital is Wrongville, and its currency is the Testmark."
    bridges = f"{OPENING} Its capital is Rightburg, a city of bridges."

    def script(context: str):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "Rightburg" in reply or "Rightburg." in context:
            return plan(bridges)
        return plan(wrong, doubtful="Wrongville")

    config = paragraph_cfg(
        rewrite_keeps_asked=keeps_asked, retry_failed_rewrite=False, splice_own_clause=splice, unsaid_items_go_on=0
    )
    _, _, done = run_paragraph(config, {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, script)
    # The rewrite fixed the capital but no longer speaks of the currency the question asks for: dropped, or
    # spliced with the sentence's own later clause.
    spliced = wrong.replace("Wrongville", "Rightburg")
    assert done.text == (bridges if not keeps_asked else spliced if splice else wrong)
    assert done.rounds[0]["action"] == ("reverted" if keeps_asked and not splice else "rewound")


TWO_CLAIMS = f"{OPENING} Its capital is Wrongville, and its currency is the Testmark. It has many bridges."
BOTH_EVIDENCE = Evidence(
    claim="Testland",
    evidence="The capital of Testland is Rightburg; its currency is the Testmark.",
    confidence=0.9,
    source="memory:country:TL",
)


def script_fixes_and_stops(context: str):
    """The capital's rewrite names Rightburg and ends the sentence there, dropping the currency the model's own
    sentence went on to state; after the sentence the paragraph goes on as the model wrote it."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg, and" in reply:
        return plan(TWO_CLAIMS.replace("Wrongville", "Rightburg"))
    if "Rightburg" in context:
        return plan(f"{OPENING} Its capital is Rightburg, which is an island.")
    return plan(TWO_CLAIMS, doubtful="Wrongville")


@pytest.mark.parametrize("stream_mode", ["holdback", "emit"])
def test_a_rewrite_that_fixes_its_claim_and_stops_keeps_the_sentences_own_later_clause(stream_mode):
    config = paragraph_cfg(stream=stream_mode, retry_failed_rewrite=False)
    _, events, done = run_paragraph(config, {"memory": StaticArm("memory", [BOTH_EVIDENCE])}, script_fixes_and_stops)
    assert done.text == TWO_CLAIMS.replace("Wrongville", "Rightburg")  # the fix, then the model's own words
    record = done.rounds[0]
    assert record["action"] == "rewound" and record["went_on_from"] == "rewrite"
    assert record["retries"][0]["how"] == "kept its first clause and the sentence's own later clause"
    assert "no longer says" in record["retries"][0]["problem"] and "island" in record["retries"][0]["rewrite"]
    screen: list[str] = []  # what a consumer shows: emit retracts the rewrite's tail it had shown
    for e in events:
        if isinstance(e, Token):
            screen.append(e.text)
        elif isinstance(e, Rewind):
            del screen[len(screen) - e.n_tokens :]
    assert "".join(screen) == done.text
    if stream_mode == "emit":
        assert any(isinstance(e, Rewind) and "island" in e.dropped_text for e in events)
    # Off: the sentence's rewrite is dropped and the wrong capital stands, as before.
    _, _, kept = run_paragraph(
        paragraph_cfg(stream=stream_mode, retry_failed_rewrite=False, splice_own_clause=False),
        {"memory": StaticArm("memory", [BOTH_EVIDENCE])},
        script_fixes_and_stops,
    )
    assert kept.text == TWO_CLAIMS and kept.rounds[0]["action"] == "reverted"


@pytest.mark.parametrize(
    "rewrite",
    [
        "Wrongville, a city of bridges.",  # the model's own claim again: the splice would give its sentence back
        "the capital of Testland, Rightburg.",  # a first clause that names nothing of the evidence
    ],
)
def test_a_splice_whose_first_clause_is_no_fix_is_not_made_and_the_rewrite_is_dropped(rewrite):
    def restates(context: str):
        if "Rightburg" in context:
            return plan(f"{OPENING} Its capital is {rewrite}")
        return plan(TWO_CLAIMS, doubtful="Wrongville")

    config = paragraph_cfg(retry_failed_rewrite=False)
    _, _, done = run_paragraph(config, {"memory": StaticArm("memory", [BOTH_EVIDENCE])}, restates)
    assert done.text == TWO_CLAIMS and done.rounds[0]["action"] == "reverted"  # fed back exactly, not spliced


ENDS_EARLY = f"{OPENING} Its capital is Rightburg. It is a city of bridges. Its currency is the Testmark."


def script_ends_early(context: str):
    """The model's own paragraph states the capital (wrong) and the currency; after the capital's rewrite it
    would end its turn before the currency (an end of turn outranks the next sentence), and goes on to it when
    that end is banned."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or "Rightburg." in context:
        out = plan(ENDS_EARLY)
        at = ENDS_EARLY.index(" Its currency")
        out[at] = (" ", 0.3, {"<eos>": 0.6})
        return out
    return plan(f"{OPENING} Its capital is Wrongville. Its currency is the Testmark.", doubtful="Wrongville")


@pytest.mark.parametrize("times", [0, 1, 2])
def test_a_paragraph_a_rewrite_changed_goes_on_while_an_asked_item_is_unsaid(times):
    arms = {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}
    config = paragraph_cfg(unsaid_items_go_on=times, ground_unsaid_items=False)
    _, _, done = run_paragraph(config, arms, script_ends_early)
    before_currency = ENDS_EARLY[: ENDS_EARLY.index(" Its currency")]
    assert done.text == (ENDS_EARLY if times else before_currency)
    assert done.finish_reason == "stop" and [r["action"] for r in done.rounds] == ["rewound"]
    assert done.rounds[0].get("went_on_for") == (["currency"] if times else None)  # the receipt says why
    # Asked for by name, the currency's round gets the capital's sentence, which its sentence does not use: the
    # round is dropped and the paragraph goes on past its end of turn as it did without it.
    _, _, asked = run_paragraph(paragraph_cfg(unsaid_items_go_on=times), arms, script_ends_early)
    assert asked.text == done.text and [r["action"] for r in asked.rounds] == ["rewound"] + ["reverted"][:times]
    # Off is the model's own paragraph, which stated the currency; nothing goes on there.
    _, _, off = run_paragraph(paragraph_cfg(mode="off", unsaid_items_go_on=times), arms, script_ends_early)
    assert off.text == f"{OPENING} Its capital is Wrongville. Its currency is the Testmark."


def test_a_paragraph_no_rewrite_changed_ends_where_the_model_ends_it():
    def ends_early(context: str):  # no doubtful claim: no round; the model ends before the currency
        own = ENDS_EARLY.replace("Rightburg", "Wrongville")
        out = plan(own)
        out[own.index(" Its currency")] = (" ", 0.3, {"<eos>": 0.6})
        return out

    _, _, done = run_paragraph(paragraph_cfg(), {"memory": StaticArm("memory", [RIGHT_EVIDENCE])}, ends_early)
    assert done.text == f"{OPENING} Its capital is Wrongville. It is a city of bridges." and not done.rounds


def reply_of(text: str) -> Reply:
    """A reply of one token per byte (the scripted backend's tokens), its signals zero."""
    data = text.encode("utf-8")
    n = len(data)
    return Reply(list(data), [0.0] * n, [0.0] * n, [0.0] * n, [bytes([b]) for b in data])


def test_unsaid_items_go_on_counts_its_times_and_needs_a_rewrite_that_stood():
    def records():
        return SimpleNamespace(action="rewound", went_on_for=[]), SimpleNamespace(action="reverted", went_on_for=[])

    rewound, reverted = records()
    unsaid = UnsaidItems("Write a short paragraph about Testland: its capital and its currency.", times=2)
    capital = reply_of("Its capital is Rightburg.")
    assert not unsaid.owes(capital, [reverted])  # the reply is the model's own
    assert not unsaid.owes(reply_of("Its capital is Rightburg. Its currency is the Testmark."), [rewound])  # all said
    assert unsaid.owes(capital, [reverted, rewound]) and unsaid.from_token == len(capital.tokens)
    assert unsaid.owes(reply_of("Its capital is Rightburg. It has bridges."), [rewound])
    assert unsaid.from_token == len(capital.tokens)  # held back from the first time it went on
    assert not unsaid.owes(capital, [rewound])  # twice at most
    assert rewound.went_on_for == ["currency", "currency"] and reverted.went_on_for == []
    assert not UnsaidItems("Write about Testland: its capital.", times=0).owes(
        reply_of("Testland is small."), [rewound]
    )


def test_what_a_paragraph_wrote_after_it_went_on_is_cut_at_its_first_repeated_sentence():
    unsaid = UnsaidItems("Write a short paragraph about Testland: its capital and its currency.", times=1)
    said = "Testland is a small country in the north. Its capital is Rightburg."
    assert unsaid.owes(reply_of(said), [SimpleNamespace(action="rewound", went_on_for=[])])
    new = " It has many old bridges and towers. Testland is a small country in the far north. Its currency is odd."
    reply = reply_of(said + new)
    cut = unsaid.repeat_cut(reply)
    assert reply.text(cut) == said + " It has many old bridges and towers."  # the repeat and all after it go
    assert unsaid.repeat_cut(reply_of(said + " It has many old bridges and towers.")) is None
    glued = reply_of(said + "Testland is a small country in the north.")  # no space: the cut keeps said's stop
    assert glued.text(unsaid.repeat_cut(glued)) == said
    assert UnsaidItems("Write about Testland: its capital.", times=1).repeat_cut(reply_of(said + new)) is None


CURRENCY_EVIDENCE = Evidence(
    claim="currency of Testland",
    evidence="The currency of Testland is the Testmark.",
    confidence=0.9,
    source="memory:c",
)
BRIDGES = " It is a city of many old bridges and towers."
LOOPED_THEN_CURRENCY = f"{OPENING} Its capital is Rightburg.{BRIDGES} Its currency is the Testmark."


class ItemArm(StaticArm):
    """Memory that holds the capital's sentence and, asked about the currency by name, the currency's."""

    def ground(self, query, deadline):
        self.calls.append(query)
        return [CURRENCY_EVIDENCE] if "currency" in query.sentence else [RIGHT_EVIDENCE]


def script_loops_owing_currency(context: str):
    """After Rightburg the model repeats its bridges sentence and never states the currency, unless the
    currency's evidence is in its context; its own paragraph (Wrongville) states it."""
    reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "Rightburg" in reply or "Rightburg." in context:
        return plan(
            LOOPED_THEN_CURRENCY if "Testmark." in context else f"{OPENING} Its capital is Rightburg." + BRIDGES * 3
        )
    return plan(WRONG_PARAGRAPH, doubtful="Wrongville")


@pytest.mark.parametrize("grounds", [True, False])
def test_a_paragraph_that_loops_owing_an_asked_item_is_cut_and_asks_the_arms_for_it(grounds):
    arm = ItemArm("memory")
    config = paragraph_cfg(paragraph_loop_guard=0, ground_unsaid_items=grounds)
    # turns joined: an item round's sentence is written in a turn of its own (config.item_round_fresh_turn)
    backend, events, done = run_paragraph(config, {"memory": arm}, script_loops_owing_currency, turns_join=True)
    shown = "".join(e.text for e in events if isinstance(e, Token))
    assert done.text == shown and done.text.count("bridges") == 1  # the repeat was cut before it was shown
    if not grounds:  # it went on without evidence: the model never comes back to the currency
        assert [r["action"] for r in done.rounds] == ["rewound"] and "Testmark" not in done.text
        return
    assert done.text == LOOPED_THEN_CURRENCY
    first, item = done.rounds
    assert first["went_on_for"] == ["currency"] and item["action"] == "rewound" and item["tokens_dropped"] == 0
    assert item["trigger"]["statistic"] == "asked item unsaid" and item["trigger"]["span_text"] == "its currency"
    assert [q.sentence for q in arm.calls][-1] == "its currency"  # asked in the question's own words


def test_an_asked_item_is_asked_for_where_the_paragraph_ends_owing_it():
    def ends_early(context: str):  # after the capital's rewrite the model ends; with the currency's evidence it goes on
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "Rightburg" in reply or "Rightburg." in context:
            if "Testmark." in context:
                return plan(LOOPED_THEN_CURRENCY)
            own = plan(f"{OPENING} Its capital is Rightburg.{BRIDGES}")
            own[len(own) - len(BRIDGES)] = (" ", 0.3, {"<eos>": 0.6})  # it would end before the bridges
            return own
        return plan(WRONG_PARAGRAPH, doubtful="Wrongville")

    arm = ItemArm("memory")
    _, _, done = run_paragraph(paragraph_cfg(), {"memory": arm}, ends_early, turns_join=True)
    assert done.text == LOOPED_THEN_CURRENCY and done.finish_reason == "stop"
    assert [r["trigger"]["statistic"] for r in done.rounds][1:] == ["asked item unsaid"]
    assert done.rounds[0]["went_on_for"] == ["currency"] and done.rounds[1]["tokens_dropped"] == 0
    _, _, plain = run_paragraph(paragraph_cfg(ground_unsaid_items=False), {"memory": ItemArm("memory")}, ends_early)
    assert "Testmark" not in plain.text and len(plain.rounds) == 1  # pushed on without it, the model had nothing


@pytest.mark.parametrize("injection", ["system_turn", "sentence_turn"])
def test_an_item_round_in_a_fresh_turn_feeds_no_reply_again(injection):
    """config.item_round_fresh_turn: the turn closes before the reply's last sentence, the item's evidence turn
    follows and a fresh assistant turn holds that sentence, after which the item's is written: the same paragraph as
    system_turn's, the reply but its last sentence not fed again (the evidence leaves as from any round, patch.py)."""
    runs = {}
    for fresh in (False, True):
        contexts: list[str] = []

        def seen(context: str, contexts: list[str] = contexts) -> list:
            contexts.append(context)
            return script_loops_owing_currency(context)

        backend = ScriptedBackend(seen, turns_join=True)
        config = paragraph_cfg(paragraph_loop_guard=0, injection=injection, item_round_fresh_turn=fresh)
        done = list(stream(backend, PARAGRAPH_Q, config, {"memory": ItemArm("memory")}))[-1]
        runs[fresh] = (backend, done, next((c for c in contexts if "Testmark." in c), ""))
    (plain, plain_done, _), (fresh, fresh_done, at_item) = runs[False], runs[True]
    if injection == "sentence_turn":  # without a fresh turn no item round goes in under sentence_turn
        assert [r["trigger"]["statistic"] for r in plain_done.rounds] == ["sentence:surprise"]
    else:
        assert plain_done.text == LOOPED_THEN_CURRENCY
    assert fresh_done.text == LOOPED_THEN_CURRENCY and fresh_done.rounds[1]["action"] == "rewound"
    before, evidence_turn, item_turn = at_item.rsplit("<|im_start|>", 2)
    assert before.endswith("Its capital is Rightburg. <|im_end|>\n") and "Testmark." in evidence_turn
    assert item_turn == f"assistant\n{BRIDGES.strip()}"  # the reply's last sentence, and the item's goes on after it
    reply_tokens = len(fresh.tokenize(f"{OPENING} Its capital is Rightburg.{BRIDGES}"))
    if injection == "system_turn":  # the round fed the evidence turn and the whole reply again; now its last sentence
        saved = reply_tokens - len(BRIDGES.strip()) - 4
        assert fresh_done.rounds[1]["tokens_injected"] <= plain_done.rounds[1]["tokens_injected"] - saved
        assert fresh.fed_tokens <= plain.fed_tokens - saved


NOTE_EVIDENCE = Evidence(
    claim="currency of Testland",
    evidence="The currency of Testland is the Testmark, a paper note.",
    confidence=0.9,
    source="memory:c",
)
ENDED_EARLY = f"{OPENING} Its capital is Rightburg.{BRIDGES}"


def script_item_says_nothing(context: str):
    """After the capital's rewrite the model would end; given the currency's evidence it writes of a paper note
    (an evidence word, but no name), and tried again freely, of bills of paper; only a start its evidence's unsaid
    words open (" " of " Testmark", not "B") leads it to the Testmark. (Byte tokens: the sentences run together.)"""
    turn = "".join(t.split("<|im_end|>", 1)[0] for t in context.split("<|im_start|>assistant\n")[1:])
    if "Rightburg" not in turn and "Rightburg." not in context:
        return plan(WRONG_PARAGRAPH, doubtful="Wrongville")
    if "Testmark, a paper note." not in context:
        own = plan(ENDED_EARLY + " It has parks.")
        own[len(ENDED_EARLY)] = (" ", 0.3, {"<eos>": 0.6})  # it would end before its parks
        return own
    if turn.startswith(ENDED_EARLY + " "):
        return plan(ENDED_EARLY + " Testmark is its currency.")
    if turn.startswith(ENDED_EARLY + "B"):
        return plan(ENDED_EARLY + "Bills of paper are its currency.")
    note = plan(ENDED_EARLY + "A paper note is its currency.")
    note[len(ENDED_EARLY)] = ("A", 0.6, {"B": 0.25, " ": 0.1})
    return note


@pytest.mark.parametrize("opens_evidence", [True, False])
def test_an_item_rounds_sentence_must_state_what_its_evidence_gives(opens_evidence):
    class NoteArm(ItemArm):
        def ground(self, query, deadline):
            self.calls.append(query)
            return [NOTE_EVIDENCE] if "currency" in query.sentence else [RIGHT_EVIDENCE]

    config = paragraph_cfg(item_retry_opens_evidence=opens_evidence)
    backend = VocabScripted(script_item_says_nothing, turns_join=True)
    events = list(stream(backend, PARAGRAPH_Q, config, {"memory": NoteArm("memory")}))
    done = events[-1]
    item = done.rounds[1]
    assert item["trigger"]["statistic"] == "asked item unsaid"
    first = item["retries"][0]
    assert first["rewrite"] == "A paper note is its currency." and first["problem"].startswith("states nothing")
    if opens_evidence:  # one more try, every first token but those its evidence's unsaid words open banned
        assert item["action"] == "rewound" and done.text == ENDED_EARLY + " Testmark is its currency."
        assert first["how"] == "rewritten from the rewind point, opening with a word of its evidence"
    else:  # tried again freely it says the same; dropped, the reply goes on past its end as without the round
        assert item["action"] == "reverted" and "paper" not in done.text and "Testmark" not in done.text
        assert done.text.startswith(ENDED_EARLY)
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.text


def script_item_doubted(context: str):
    """As script_item_says_nothing, but the item round's sentence names a currency of its own, doubtfully: the
    trigger that judges it would take over the item round (and its check) if it came first."""
    turn = "".join(t.split("<|im_end|>", 1)[0] for t in context.split("<|im_start|>assistant\n")[1:])
    if "Testmark, a paper note." in context and not turn.startswith((ENDED_EARLY + " ", ENDED_EARLY + "B")):
        return plan(ENDED_EARLY + "Its currency is the Papermark. It is old.", doubtful="Papermark")
    return script_item_says_nothing(context)


def test_an_item_rounds_sentence_is_checked_before_a_trigger_judges_it():
    class NoteArm(ItemArm):
        def ground(self, query, deadline):
            self.calls.append(query)
            return [NOTE_EVIDENCE] if "currency" in query.sentence else [RIGHT_EVIDENCE]

    arm = NoteArm("memory")
    backend = VocabScripted(script_item_doubted, turns_join=True)
    done = list(stream(backend, PARAGRAPH_Q, paragraph_cfg(), {"memory": arm}))[-1]
    item = done.rounds[1]
    assert item["trigger"]["statistic"] == "asked item unsaid" and len(done.rounds) == 2  # no round took it over
    assert item["retries"][0]["rewrite"].endswith("currency is the Papermark. ")  # checked as its own sentence
    assert item["action"] == "rewound" and done.text == ENDED_EARLY + " Testmark is its currency."
    assert len(arm.calls) == 2


@pytest.mark.parametrize(
    "question, reply, asking",
    [
        (  # "state" is in every sentence about a state: it does not say the year it became one
            "Write a few sentences about the US state of Ohio: its capital and the year it became a state.",
            "Ohio is a state in the U.S. Its capital is Columbus.",
            "the year it became a state",
        ),
        (
            "Write a few sentences about the US state of Ohio: its capital and the year it became a state.",
            "Ohio became a state in 1803. Its capital is Columbus.",
            None,
        ),
        (  # what the reply calls its subject ("a landlocked country") does not say the countries it borders
            "Write a short paragraph about Bhutan: its capital and the countries it borders.",
            "It is a landlocked country. Its capital is Thimphu.",
            "the countries it borders",
        ),
        (
            "Write a short paragraph about Bhutan: its capital and the countries it borders.",
            "It is a landlocked country. Its capital is Thimphu. It borders India.",
            None,
        ),
    ],
)
def test_unsaid_items_are_not_said_by_a_shared_word_or_the_subjects_kind(question, reply, asking):
    rewound = SimpleNamespace(action="rewound", went_on_for=[])
    unsaid = UnsaidItems(question, times=1)
    assert unsaid.owes(reply_of(reply), [rewound]) is (asking is not None)
    assert unsaid.asking == asking


def test_unsaid_items_see_a_loop_at_the_token_that_finishes_the_repeated_sentence():
    rewound = SimpleNamespace(action="rewound", went_on_for=[])
    said = "Its capital is Rightburg. It has many old bridges and towers."
    unsaid = UnsaidItems(PARAGRAPH_Q, times=1)
    assert unsaid.looped(reply_of(said + " It has many old bridges and towers."), [rewound], 0) is None  # open
    assert unsaid.open_from == len(said)  # the open sentence is held back (its leading space with it)
    assert unsaid.looped(reply_of(said + " It has many old bridges."), [SimpleNamespace(action="reverted")], 0) is None
    looped = reply_of(said + " It has many old bridges and towers. ")
    assert unsaid.looped(looped, [rewound], len(looped.tokens)) is None  # already shown: never cut
    at = unsaid.looped(looped, [rewound], 0)
    assert looped.text(at) == said and unsaid.asking == "its currency" and rewound.went_on_for == ["currency"]
    assert unsaid.looped(looped, [rewound], 0) is None  # once at most (times=1)
    # After a blank line the model starts the reply over: the paragraph ends there (whole_end), nothing is cut.
    over = reply_of(f"{said}\n\n{said} ")
    assert UnsaidItems(PARAGRAPH_Q, times=1).looped(over, [rewound], 0) is None


# --------------------------------------------------------------------------------------------
# a long reply ends whole: at its paragraph's end, or at its last finished sentence at max_tokens
# --------------------------------------------------------------------------------------------
def test_a_long_reply_ends_at_its_paragraphs_end_in_both_modes():
    def starts_over(context):
        return plan(f"{OPENING} Its currency is the Testmark.\n\n{OPENING} Its currency is the Testmark again.")

    for mode in ("off", "intervene"):
        _, events, done = run_paragraph(paragraph_cfg(mode=mode), script=starts_over)
        assert done.text.rstrip() == f"{OPENING} Its currency is the Testmark." and done.finish_reason == "stop"
        assert "".join(e.text for e in events if isinstance(e, Token)) == done.text  # nothing shown was cut
    _, _, kept = run_paragraph(paragraph_cfg(long_reply_ends_whole=False), script=starts_over)
    assert "\n\n" in kept.text


def test_a_long_reply_cut_by_max_tokens_ends_at_its_last_finished_sentence():
    def long_winded(context):
        return plan(f"{OPENING} Its currency is the Testmark. It is " + "very " * 60 + "big.")

    for mode in ("off", "intervene"):
        config = paragraph_cfg(mode=mode, claim_scope="sentence", max_tokens=len(OPENING) + 60)  # cut in "very very"
        _, events, done = run_paragraph(config, script=long_winded)
        assert done.text == f"{OPENING} Its currency is the Testmark. " and done.finish_reason == "length"
        assert "".join(e.text for e in events if isinstance(e, Token)) == done.text  # the cut part was never shown
        assert done.result.n_tokens == len(done.text.encode())  # the receipt's tokens are the reply's

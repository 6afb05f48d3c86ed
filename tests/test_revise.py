"""The revise pass on a black-box chat backend (revise.py): draft, flagged windows, grounding, at most one
revise request, the loop's check on the revision, and the no-op where no logprobs come."""

from __future__ import annotations

import math

import pytest

from surprisegate.arms import Evidence
from surprisegate.backends import BlackBoxBackend, SteerableBackend
from surprisegate.config import Config
from surprisegate.errors import BackendFault, InputError
from surprisegate.gate.events import Done, Grounding, Rewind, Token, Trigger
from surprisegate.gate.loop import generate, stream
from surprisegate.gate.revise import revise_messages

from scripted import ScriptedChat, bits

QUESTION = "What is the capital of Testland?"
DRAFT = [("The", 0.9), (" capital", 0.9), (" is", 0.9), (" Wrong", 0.01), ("ville", 0.02), (".", 0.9)]
REVISION = [("The", 0.9), (" capital", 0.9), (" is", 0.9), (" Rightburg", 0.8), (".", 0.9)]
EVIDENCE = Evidence(
    claim="capital of Testland", evidence="The capital of Testland is Rightburg.", confidence=0.9, source="memory:TL"
)


class StaticArm:
    def __init__(self, evidence=()):
        self.evidence, self.calls = list(evidence), []

    def ground(self, query, deadline):
        self.calls.append(query)
        return self.evidence


def script(revision=REVISION):
    def reply(messages):
        return revision if messages[-1]["content"].startswith("Check your previous answer") else DRAFT

    return reply


def cfg(**kw):
    base = dict(
        mode="intervene",
        signal="surprise",
        statistic="max",
        window=4,
        threshold=3.0,
        min_tokens=1,
        max_rounds=1,
        system_prompt="",
        kind_thresholds={},
    )
    return Config(**(base | kw))


def run(config, backend=None, arms=None):
    backend = backend or ScriptedChat(script())
    events = list(stream(backend, QUESTION, config, arms if arms is not None else {"memory": StaticArm([EVIDENCE])}))
    return backend, events, events[-1]


def shown(events) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


def test_the_scripted_chat_is_a_black_box_not_a_steerable_backend():
    backend = ScriptedChat(script())
    assert isinstance(backend, BlackBoxBackend) and not isinstance(backend, SteerableBackend)


def test_detect_streams_the_draft_as_it_arrives_and_records_the_crossing():
    backend, events, done = run(cfg(mode="detect"))
    tokens = [e for e in events if isinstance(e, Token)]
    assert done.text == shown(events) == "The capital is Wrongville." and len(backend.requests) == 1
    assert [t.surprise for t in tokens] == pytest.approx([bits(p) for _, p in DRAFT])
    assert all(t.token_id is None for t in tokens)  # a chat API streams text, no ids
    (would,) = done.result.would_trigger
    assert would["token_index"] == 3 and would["span_text"] == "The capital is Wrong" and done.rounds == []


def test_intervene_grounds_the_flagged_span_and_one_revision_stands_when_it_uses_the_evidence():
    arm = StaticArm([EVIDENCE])
    backend, events, done = run(cfg(), arms={"memory": arm})
    assert done.text == shown(events) == "The capital is Rightburg."
    # Held until the revise decision: the caller never saw the draft.
    assert "Wrong" not in shown(events) and not any(isinstance(e, Rewind) for e in events)
    assert [type(e) for e in events if isinstance(e, (Trigger, Grounding))] == [Trigger, Grounding]
    (record,) = done.rounds
    assert record["action"] == "revised" and record["chosen"]["source"] == "memory:TL"
    assert arm.calls[0].question == QUESTION and arm.calls[0].span == "The capital is Wrong"
    revise = done.result.revise
    assert revise["outcome"] == "revised" and revise["draft"] == "The capital is Wrongville."
    assert revise["flagged"] == ["The capital is Wrong"] and revise["evidence"] == [EVIDENCE.evidence]
    assert revise["revision"] == "The capital is Rightburg."
    draft_request, revise_request = backend.requests
    assert revise_request["messages"] == revise_messages(
        cfg(), draft_request["messages"], "The capital is Wrongville.", [EVIDENCE]
    )
    roles = [m["role"] for m in revise_request["messages"]]
    assert (
        roles[-3:] == ["assistant", "system", "user"] and EVIDENCE.evidence in revise_request["messages"][-2]["content"]
    )
    # The receipt's signals are the draft's: what the gate measured.
    assert done.result.token_surprises == [round(bits(p), 4) for _, p in DRAFT]


def test_a_revision_that_ignores_the_evidence_leaves_the_draft_and_says_why():
    ignored = [("I", 0.9), (" am", 0.9), (" not", 0.9), (" sure", 0.9), (".", 0.9)]
    _, events, done = run(cfg(), backend=ScriptedChat(script(ignored)))
    assert done.text == shown(events) == "The capital is Wrongville."
    (record,) = done.rounds
    assert record["action"] == "reverted" and "used none of the evidence" in record["reason"]
    assert record["rewritten_text"] == "I am not sure." and done.result.revise["outcome"] == "draft_stands"


def test_emit_streaming_shows_the_draft_then_retracts_it_for_the_revision():
    _, events, done = run(cfg(stream="emit"))
    rewind = next(e for e in events if isinstance(e, Rewind))
    before, after = events[: events.index(rewind)], events[events.index(rewind) :]
    assert shown(before) == "The capital is Wrongville." and rewind.n_tokens == len(DRAFT)
    assert shown(after) == done.text == "The capital is Rightburg."


@pytest.mark.parametrize("mode", ["detect", "intervene"])
def test_without_logprobs_the_reply_passes_through_unchanged_with_the_reason(mode):
    backend, events, done = run(cfg(mode=mode), backend=ScriptedChat(script(), logprobs=False))
    assert done.text == shown(events) == "The capital is Wrongville." and len(backend.requests) == 1
    assert done.rounds == [] and done.result.no_logprobs == "scripted-chat offers no logprobs"
    assert done.result.surprise is None and done.result.would_trigger == []


def test_nothing_flagged_or_no_evidence_means_no_revise_request():
    calm = [(t, 0.9) for t, _ in REVISION]
    backend, _, done = run(cfg(), backend=ScriptedChat(lambda messages: calm))
    assert len(backend.requests) == 1 and done.result.revise["outcome"] == "nothing_flagged"
    backend, _, done = run(cfg(), arms={"memory": StaticArm([])})
    assert len(backend.requests) == 1 and done.text == "The capital is Wrongville."
    assert done.result.revise["outcome"] == "no_evidence" and "no grounding found" in done.rounds[0]["reason"]


def test_several_flagged_spans_are_grounded_but_revised_in_one_request():
    doubtful_twice = DRAFT[:-1] + [(" or", 0.9), (" Other", 0.01), ("town", 0.02), (".", 0.9)]
    backend = ScriptedChat(lambda m: REVISION if m[-1]["content"].startswith("Check") else doubtful_twice)
    _, _, done = run(cfg(max_rounds=2, window=2), backend=backend)
    assert len(done.rounds) == 2 and len(backend.requests) == 2  # one draft, one revise request
    assert done.rounds[1]["already_grounded"] and done.text == "The capital is Rightburg."


def test_a_draft_cut_off_keeps_what_arrived_and_is_not_revised():
    fault = BackendFault("openai: the stream broke off", kind="truncated")
    backend, events, done = run(cfg(), backend=ScriptedChat(script(), faults={0: (fault, 4)}))
    assert done.text == shown(events) == "The capital is Wrong" and done.finish_reason == "error"
    assert done.result.fault == {"kind": "truncated", "status": None, "message": str(fault), "at_token": 4}
    assert len(backend.requests) == 1 and done.rounds == []


@pytest.mark.parametrize("after", [0, None])  # mid-stream, or at request time
def test_a_failed_revise_request_leaves_the_draft(after):
    fault = BackendFault("openai: HTTP 500", kind="http", status=500)
    _, _, done = run(cfg(), backend=ScriptedChat(script(), faults={1: (fault, after)}))
    assert done.text == "The capital is Wrongville." and done.finish_reason == "stop"
    assert done.result.fault is None
    assert done.rounds[0]["action"] == "reverted" and "the revise request failed (http)" in done.rounds[0]["reason"]


def test_off_scores_nothing_and_grounds_nothing():
    backend, events, done = run(cfg(mode="off"))
    assert done.text == shown(events) == "The capital is Wrongville." and done.rounds == []
    assert backend.requests[0]["scored"] is False and done.result.surprise is None
    assert all(math.isnan(e.surprise) for e in events if isinstance(e, Token))


def test_generate_builds_a_receipt_with_the_revise_record():
    result = generate(ScriptedChat(script()), QUESTION, cfg(), {"memory": StaticArm([EVIDENCE])})
    assert result.receipt["backend"] == "scripted-chat" and result.receipt["model"] == "scripted-chat-model"
    assert result.receipt["extra"]["revise"]["outcome"] == "revised" and result.text == "The capital is Rightburg."
    assert result.receipt["rounds"][0]["action"] == "revised"


def test_a_chat_api_takes_no_assistant_prefix():
    with pytest.raises(InputError, match="assistant_prefix"):
        list(stream(ScriptedChat(script()), QUESTION, cfg(), {}, assistant_prefix="The capital is"))


def test_done_is_last_and_unique():
    _, events, _ = run(cfg())
    assert [isinstance(e, Done) for e in events].count(True) == 1 and isinstance(events[-1], Done)


def test_a_draft_refused_at_request_time_ends_cleanly_with_its_fault():
    fault = BackendFault("openai: HTTP 401: invalid key; set OPENAI_API_KEY", kind="auth", status=401)
    _, events, done = run(cfg(), backend=ScriptedChat(script(), faults={0: (fault, None)}))
    assert done.text == "" and done.finish_reason == "error" and done.result.fault["status"] == 401

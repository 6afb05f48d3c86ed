"""Receipts: durable JSONL appends, forgiving reads, the record builders and the text rendering."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.arms import Evidence, Query
from surprisegate.errors import InputError
from surprisegate.gate import receipts
from surprisegate.gate.events import Trigger
from surprisegate.gate.receipts import (
    SCHEMA,
    ArmAttempt,
    ConvergenceRecord,
    ReceiptWriter,
    format_receipt,
    iter_receipts,
    read_receipts,
    receipt_record,
)


def make_round(action: str = "rewound") -> ConvergenceRecord:
    trigger = Trigger(
        token_index=7, statistic="mean", value=4.25, threshold=3.5, span_start=5, span_text="Bobo-Dioulasso", round=1
    )
    evidence = Evidence(
        claim="The capital of Burkina Faso is Ouagadougou.",
        evidence="Burkina Faso: capital Ouagadougou.",
        confidence=0.91,
        source="memory:country:BF",
    )
    query = Query(span="Bobo-Dioulasso", question="What is the capital of Burkina Faso?", sentence="The capital is")
    record = ConvergenceRecord(round=1, trigger=trigger, span_class="entity", route_rule="capitalised-name")
    record.arm_order = ["memory", "web", "tool"]
    record.arms.append(ArmAttempt(arm="memory", query=query, status="ok", latency_ms=12.4, results=[evidence]))
    record.arms.append(ArmAttempt(arm="web", query=query, status="skipped"))
    if action == "rewound":
        record.chosen = evidence
        record.action = "rewound"
        record.reason = "memory evidence above floor"
        record.tokens_dropped = 5
        record.tokens_injected = 23
        record.dropped_text = " Bobo-Dioulasso"
    else:
        record.arms[0] = ArmAttempt(arm="memory", query=query, status="timeout", latency_ms=800.0, error="deadline")
        record.reason = "no arm returned evidence before the deadline"
    record.latency_ms = 31.0
    return record


def make_receipt(**overrides) -> dict:
    fields = dict(
        reply_id="r-1",
        created=dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        model="SmolLM2-135M-Instruct",
        backend="llamacpp",
        config={"threshold": 3.5, "window": 16, "statistic": "mean", "store": Path("/tmp/kb.sqlite")},
        prompt="What is the capital of Burkina Faso?",
        reply="The capital of Burkina Faso is Ouagadougou.",
        n_tokens=11,
        surprise={"mean": 1.2, "p90": 3.1, "max": 9.5, "tail_mass": 0.09, "window_max": 4.25},
        canary={"verdict": "uncertain_grounded", "uncertainty": 0.68, "anchoring": 0.73, "reason": "it was checked"},
        rounds=[make_round()],
        mode="intervene",
        finish_reason="stop",
    )
    fields.update(overrides)
    return receipt_record(**fields)


# --- writing and reading --------------------------------------------------------------------------


def test_round_trip_preserves_records_in_order(tmp_path):
    path = tmp_path / "nested" / "dir" / "receipts.jsonl"  # parents are created
    writer = ReceiptWriter(path)
    first, second = make_receipt(), make_receipt(reply_id="r-2", rounds=[])
    writer.append(first)
    writer.append(second)

    result = read_receipts(path)
    assert list(result) == [first, second]
    assert result.skipped_lines == []
    assert path.read_bytes().count(b"\n") == 2 and path.read_bytes().endswith(b"\n")


def test_torn_last_line_is_skipped_and_next_append_is_readable(tmp_path):
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    writer.append({"n": 1})
    line = receipts.dumps_line({"n": 2, "reply": "cut off here"})
    with open(path, "ab") as f:
        f.write(line.encode()[: len(line) // 2])  # a crash in the middle of a write

    assert read_receipts(path) == [{"n": 1}]
    assert read_receipts(path).skipped_lines == [2]

    writer.append({"n": 3})
    result = read_receipts(path)
    assert result == [{"n": 1}, {"n": 3}]
    assert result.skipped_lines == [2]


def test_undecodable_lines_are_skipped_not_fatal(tmp_path):
    path = tmp_path / "receipts.jsonl"
    path.write_bytes(b'{"n": 1}\n\xff\xfe garbage\n12\n\n{"n": 2}\n')
    skipped: list[int] = []
    assert list(iter_receipts(path, skipped)) == [{"n": 1}, {"n": 2}]
    assert skipped == [2, 3]  # invalid UTF-8, and valid JSON that is no receipt; the blank line is ignored


def test_append_flushes_and_fsyncs_the_file(tmp_path, monkeypatch):
    path = tmp_path / "receipts.jsonl"
    synced: list[bytes] = []
    real_fsync = os.fsync

    def spy_fsync(fd):
        real_fsync(fd)
        synced.append(path.read_bytes() if path.exists() else b"")  # what is on disk when fsync runs

    monkeypatch.setattr(receipts.os, "fsync", spy_fsync)
    ReceiptWriter(path).append({"n": 1})
    assert synced, "append must fsync"
    assert synced[0] == b'{"n":1}\n'  # the line was flushed before the fsync


def test_non_serialisable_record_raises_and_leaves_file_unchanged(tmp_path):
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    writer.append({"n": 1})
    before = path.read_bytes()

    with pytest.raises(TypeError, match="not JSON-serialisable"):
        writer.append({"n": 2, "handle": object()})
    with pytest.raises(TypeError, match="key"):
        writer.append({("a", "b"): 1})
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="circular"):
        writer.append(cyclic)
    with pytest.raises(TypeError, match="must be a dict"):
        writer.append([1, 2])  # type: ignore[arg-type]
    assert path.read_bytes() == before


def test_non_serialisable_record_does_not_create_the_file(tmp_path):
    path = tmp_path / "receipts.jsonl"
    with pytest.raises(TypeError):
        ReceiptWriter(path).append({"x": {1, 2}})
    assert not path.exists()


def test_non_finite_floats_become_null(tmp_path):
    path = tmp_path / "receipts.jsonl"
    ReceiptWriter(path).append({"mean": math.nan, "max": math.inf, "min": -math.inf, "ok": 1.5, "xs": [math.nan]})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert read_receipts(path) == [{"mean": None, "max": None, "min": None, "ok": 1.5, "xs": [None]}]


def test_common_python_values_are_converted(tmp_path):
    import numpy as np

    path = tmp_path / "receipts.jsonl"
    when = dt.datetime(2025, 1, 2, tzinfo=dt.UTC)
    ReceiptWriter(path).append(
        {"path": Path("/a/b"), "when": when, "tuple": (1, 2), "np": np.float32(0.5), "arr": np.array([1.0, np.nan])}
    )
    assert read_receipts(path) == [
        {"path": "/a/b", "when": "2025-01-02T00:00:00+00:00", "tuple": [1, 2], "np": 0.5, "arr": [1.0, None]}
    ]


def test_text_that_is_hard_for_json_lines_round_trips(tmp_path):
    # Line separators inside text must not split a record; a lone surrogate (half a character) survives.
    path = tmp_path / "receipts.jsonl"
    record = {"reply": "a\nb\rc\u2028d\u2029e \u00e9\u4e2d\U0001f600", "half": "x\ud800y"}
    ReceiptWriter(path).append(record)
    assert read_receipts(path) == [record]


def test_missing_file_is_an_input_error(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(InputError, match=r"receipts='.*nope\.jsonl' does not exist"):
        read_receipts(missing)
    with pytest.raises(InputError):
        iter_receipts(missing)  # fails on the call, not on the first next()


def test_writer_rejects_a_directory(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        ReceiptWriter(tmp_path)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(st.dictionaries(st.text(), json_values, max_size=5), max_size=5))
def test_any_list_of_json_dicts_round_trips(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("prop") / "receipts.jsonl"
    path.touch()  # an empty file reads as no receipts
    writer = ReceiptWriter(path)
    for record in records:
        writer.append(record)
    result = read_receipts(path)
    assert list(result) == records
    assert result.skipped_lines == []


# --- builders ------------------------------------------------------------------------------------


def test_receipt_record_adds_schema_hash_ids_and_time():
    receipt = make_receipt()
    assert receipt["schema"] == SCHEMA
    assert receipt["reply_id"] == "r-1"
    assert receipt["created"] == "2025-01-02T03:04:05Z"
    assert receipt["created_unix"] == dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp()
    assert receipt["prompt_sha256"] == hashlib.sha256(b"What is the capital of Burkina Faso?").hexdigest()
    assert receipt["config"]["store"] == "/tmp/kb.sqlite"
    assert receipt["rounds"][0]["chosen"]["source"] == "memory:country:BF"
    json.dumps(receipt, allow_nan=False)  # already plain JSON data


def test_receipt_record_draws_an_id_hides_prompt_and_keeps_extra_apart():
    receipt = make_receipt(reply_id=None, created=0.0, store_prompt=False, extra={"schema": "mine", "trace": 1})
    assert len(receipt["reply_id"]) == 32
    assert receipt["created"] == "1970-01-01T00:00:00Z"
    assert receipt["prompt"] is None and len(receipt["prompt_sha256"]) == 64
    assert receipt["schema"] == SCHEMA and receipt["extra"] == {"schema": "mine", "trace": 1}


@pytest.mark.parametrize("bad", [{"mode": "loud"}, {"created": "yesterday"}, {"created": math.nan}])
def test_receipt_record_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        make_receipt(**bad)


def test_convergence_record_to_dict_has_the_documented_shape():
    d = make_round().to_dict()
    assert set(d) == {
        "round", "trigger", "span_class", "route_rule", "arm_order", "arms", "chosen", "action", "reason",
        "tokens_dropped", "tokens_injected", "dropped_text", "latency_ms", "closed_question",
    }  # fmt: skip
    assert d["trigger"] == {
        "token_index": 7, "statistic": "mean", "value": 4.25, "threshold": 3.5, "span_start": 5,
        "span_text": "Bobo-Dioulasso",
    }  # fmt: skip
    assert set(d["arms"][0]) == {"arm", "query", "status", "latency_ms", "results"}  # error: only when set
    assert d["arms"][0]["query"]["question"] == "What is the capital of Burkina Faso?"
    assert {"claim", "evidence", "confidence", "source", "observable"} <= set(d["chosen"])
    assert d["action"] == "rewound" and d["tokens_dropped"] == 5 and d["tokens_injected"] == 23


def test_convergence_record_defaults_to_the_safe_outcome():
    d = ConvergenceRecord(round=1, trigger={"token_index": 3}).to_dict()
    assert d["action"] == "resumed_unmodified" and d["chosen"] is None and d["tokens_dropped"] == 0
    assert d["trigger"]["span_text"] is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"action": "retried"}, "action='retried'"),
        ({"action": "rewound", "chosen": None}, "chosen=None"),
        ({"tokens_dropped": -1}, "negative"),
    ],
)
def test_convergence_record_rejects_inconsistent_rounds(change, message):
    record = make_round(action="resumed_unmodified")
    for key, value in change.items():
        setattr(record, key, value)
    with pytest.raises(ValueError, match=message):
        record.to_dict()


def test_arm_attempt_rejects_unknown_status():
    with pytest.raises(ValueError, match="status='maybe'"):
        ArmAttempt(arm="web", query="q", status="maybe").to_dict()


# --- rendering -----------------------------------------------------------------------------------


def test_format_receipt_shows_the_key_facts():
    text = format_receipt(make_receipt())
    for fact in [
        "r-1", "2025-01-02T03:04:05Z", "SmolLM2-135M-Instruct", "llamacpp", "intervene", "11 tokens", "stop",
        "What is the capital of Burkina Faso?", "The capital of Burkina Faso is Ouagadougou.",
        "p90 3.10", "uncertain_grounded", "it was checked",
        "token 7", "mean=4.25 > 3.50", '"Bobo-Dioulasso"', "entity", "capitalised-name", "memory → web → tool",
        "ok", "12 ms", "skipped", "Burkina Faso: capital Ouagadougou.", "memory:country:BF", "confidence 0.91",
        "rewound", "memory evidence above floor", "dropped 5 tokens", "injected 23",
    ]:  # fmt: skip
        assert fact in text, fact
    assert "\033[" not in text


def test_format_receipt_colour_only_when_asked():
    assert "\033[" in format_receipt(make_receipt(), color=True)


def test_format_receipt_truncates_long_questions_and_shows_failed_rounds():
    text = format_receipt(make_receipt(prompt="why " * 200, rounds=[make_round(action="resumed_unmodified")]))
    question_line = next(line for line in text.splitlines() if line.startswith("question"))
    assert question_line.endswith("…") and len(question_line) < 230
    assert "timeout" in text and "deadline" in text and "resumed_unmodified" in text and "chosen  nothing" in text


def test_format_receipt_neutralises_terminal_escapes_in_model_text():
    text = format_receipt(make_receipt(reply="ok \033[2J\033]0;pwned\007 done"))
    assert "\033" not in text and "\\x1b[2J" in text


def test_format_receipt_survives_partial_records():
    text = format_receipt({"reply": "hi", "rounds": [{"round": 1}, "junk"]})
    assert "hi" in text and "round 1" in text and "not measured" in text
    assert format_receipt({})  # never raises


def test_optional_round_fields_appear_only_when_they_happened():
    record = make_round()
    plain = record.to_dict()
    assert not {
        "tokens_trimmed",
        "rewind_method",
        "injected_text",
        "retries",
        "rewritten_text",
        "already_grounded",
    } & set(plain)
    record.tokens_trimmed, record.rewind_method, record.injected_text = 9, "trim", "Fact: x"
    record.retries.append({"problem": "ignores its evidence", "rewrite": "I'm ready.", "how": "banned"})
    d = record.to_dict()
    assert d["tokens_trimmed"] == 9 and d["rewind_method"] == "trim" and d["injected_text"] == "Fact: x"
    assert d["retries"][0]["how"] == "banned"
    assert ConvergenceRecord.from_dict(d).to_dict() == d


def test_from_dict_rejects_unknown_round_fields():
    d = make_round().to_dict() | {"tokens_dropped_typo": 1}
    with pytest.raises(ValueError, match="tokens_dropped_typo"):
        ConvergenceRecord.from_dict(d)


# --------------------------------------------------------------------------------------------------
# a cap on one receipt


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.text(max_size=3000) | st.integers() | st.floats(allow_nan=False) | st.booleans() | st.none(),
        lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=2000), inner, max_size=20),
        max_leaves=200,
    ),
    st.integers(1024, 20_000),
)
def test_fit_receipt_always_fits_and_keeps_the_ids(payload, cap):
    from surprisegate.gate.receipts import fit_receipt

    record = {"schema": SCHEMA, "reply_id": "r", "prompt_sha256": "0" * 64, "mode": "off", "payload": payload}
    fitted = fit_receipt(record, cap)
    size = len(receipts.dumps_line(record).encode("utf-8"))
    assert len(receipts.dumps_line(fitted).encode("utf-8")) <= cap
    if size <= cap:
        assert fitted is record
    else:
        assert fitted["reply_id"] == "r" and fitted["prompt_sha256"] == "0" * 64
        assert fitted["truncated"]["bytes"] == size and fitted["truncated"]["cap"] == cap

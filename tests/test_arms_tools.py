"""The tool arm: which tool a span and its context ask for (`extract_tool_calls`), and `ToolArm`, which runs it."""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest

from surprisegate.arms import Arm, Query
from surprisegate.arms.dates import DateQuestion
from surprisegate.arms.files import FileRequest
from surprisegate.arms.sandbox import Snippet
from surprisegate.arms.status import StatusRequest
from surprisegate.arms.tools import TOOL_NAMES, ToolArm, ToolCall, extract_tool_calls
from surprisegate.arms.units import Conversion
from surprisegate.errors import ArmError, ConfigError, InputError
from surprisegate.gate.router import classify_span

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
FAR_DEADLINE = float("inf")


def _load_jsonl(name: str) -> list[dict]:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is absent (shared evaluation data)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# --------------------------------------------------------------------------------------------------
# extract_tool_calls: which tool, with what input, from which field

# (span, question, sentence so far, expected tool, expected canonical input): the tool arm's dispatch.
LABELLED_TOOL_CALLS = [
    # calculator
    ("1776", "What is 37 times 48?", "", "calculator", "37 * 48"),
    ("1766", "", "37 times 48 is 1766", "calculator", "37 * 48"),
    ("", "What is the sum of 3 and 4?", "", "calculator", "3 + 4"),
    ("12", "What is 15% of 80?", "", "calculator", "15 / 100 * 80"),
    ("", "Calculate 2 + 3 * 4.", "", "calculator", "2 + 3 * 4"),
    # dates
    ("44", "How many days between 1 March and 14 April 2024?", "", "dates", "days_between(1 March, 14 April 2024)"),
    ("", "What date is 100 days after 2024-01-15?", "", "dates", "add_days(2024-01-15, +100 days)"),
    ("Tuesday", "What day of the week was July 4, 1976?", "", "dates", "weekday(July 4, 1976)"),
    ("", "What is the date today in Asia/Tokyo?", "", "dates", "today(Asia/Tokyo)"),
    ("", "How many days until Christmas?", "", "dates", "days_between(today, Christmas)"),
    ("", "What was the date 3 days before March 1st, 2024?", "", "dates", "add_days(March 1st, 2024, -3 days)"),
    # units
    ("42", "How many kilometres is 26.2 miles?", "", "units", "26.2 mile -> kilometer"),
    ("", "Convert 100 F to C", "", "units", "100 degree_Fahrenheit -> degree_Celsius"),
    ("", "What is 5 feet in cm?", "", "units", "5 foot -> centimeter"),
    ("", "How many seconds are there in a day?", "", "units", "1 day -> second"),
    ("", "60 mph in km/h?", "", "units", "60 mile / hour -> kilometer / hour"),
    # python: backticks or an explicit "what does X return"
    ("3", "What does `sorted([3,1,2])[0]` return?", "", "python", "sorted([3,1,2])[0]"),
    ("3", "What does len('abc') return in Python?", "", "python", "len('abc')"),
    ("", "What does x[0] return?", "", "python", "x[0]"),
    ("", "What will `'abc'.upper()` print?", "", "python", "'abc'.upper()"),
    (
        "",
        "What does this print?\n```python\nfor i in range(3):\n    print(i)\n```",
        "",
        "python",
        "for i in range(3):\n    print(i)",
    ),
    # files
    ("localhost", "What are the contents of /etc/hosts?", "", "files", "/etc/hosts"),
    ("debug = true", "What is in file config.toml?", "", "files", "config.toml"),
    ("42", "How many lines are in ./data/notes.txt?", "", "files", "./data/notes.txt"),
    ("", "What's in `notes.txt; rm -rf /`?", "", "files", "notes.txt; rm -rf /"),  # taken whole, never a shell
    ("", "Show me data/notes.txt", "", "files", "data/notes.txt"),
    # status
    ("up", "Is example.com up?", "", "status", "example.com"),
    ("open", "Is port 8080 open?", "", "status", "port 8080"),
    ("down", "Is https://api.example.org/health responding?", "", "status", "https://api.example.org/health"),
    ("200", "What is the status of localhost:8000?", "", "status", "localhost:8000"),
    ("", "Is 127.0.0.1:5432 reachable?", "", "status", "127.0.0.1:5432"),
    # no tool
    ("Paris", "What is the capital of France?", "", None, None),
    ("happy", "How are you today?", "", None, None),
    ("", "What does the fox say?", "", None, None),
    ("", "Run `pip install foo` please", "", None, None),  # not Python
    ("", "Read me `ls -la`", "", None, None),  # a shell line parses as Python but computes nothing
    ("4", "How many legs does a dog have?", "", None, None),
    ("", "He ran 5 km in 30 minutes.", "", None, None),
]


def _first_call(span: str, question: str = "", sentence: str = "", tools=TOOL_NAMES) -> ToolCall | None:
    """The call the arm tries first."""
    calls = extract_tool_calls(span, question, sentence, tools)
    return calls[0] if calls else None


@pytest.mark.parametrize(
    ("span", "question", "sentence", "tool", "expected_input"),
    LABELLED_TOOL_CALLS,
    ids=[f"{i}-{case[3]}-{(case[1] or case[2])[:24]}" for i, case in enumerate(LABELLED_TOOL_CALLS)],
)
def test_labelled_tool_calls(span, question, sentence, tool, expected_input):
    call = _first_call(span, question, sentence)
    if tool is None:
        assert call is None
    else:
        assert call is not None
        assert (call.tool, call.input) == (tool, expected_input)


def test_every_tool_has_labelled_calls():
    counts = {name: sum(case[3] == name for case in LABELLED_TOOL_CALLS) for name in TOOL_NAMES}
    assert all(count >= 5 for count in counts.values()), counts


def test_labelled_tool_calls_are_computable():
    for span, question, sentence, tool, _ in LABELLED_TOOL_CALLS:
        if tool is not None:
            assert classify_span(span, question, sentence)[0] == "computable", question


def test_tool_calls_carry_the_parsed_request():
    kinds = {
        "python": Snippet,
        "files": FileRequest,
        "status": StatusRequest,
        "dates": DateQuestion,
        "units": Conversion,
        "calculator": str,
    }
    for span, question, sentence, tool, _ in LABELLED_TOOL_CALLS:
        if tool is not None:
            call = _first_call(span, question, sentence)
            assert isinstance(call, ToolCall)
            assert isinstance(call.request, kinds[tool])


def test_a_snippet_is_taken_only_from_the_users_turn():
    # The span and the sentence are the model's own reply, which retrieved text may have steered: code in them
    # is never a tool call. Files, status, dates, units and the calculator still read every field.
    code = "What does `sorted([3,1,2])[0]` return?"
    assert extract_tool_calls(code, "", code) == []  # in the span and the sentence: not a call at all
    assert [(c.tool, c.field, c.input) for c in extract_tool_calls("", code, "")] == [
        ("python", "question", "sorted([3,1,2])[0]")
    ]
    others = extract_tool_calls("What is in notes.txt?", "", "Is example.com up?")
    assert [(c.tool, c.field) for c in others] == [("files", "span"), ("status", "sentence")]
    assert (_first_call("", "", "37 times 48 is 1766").tool, _first_call("", "", "37 times 48 is 1766").field) == (
        "calculator",
        "sentence",
    )


def test_tool_arm_never_runs_code_from_the_models_text(tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')"
    arm = ToolArm(tools=("python",), warm_up=False)
    for span, sentence in ((f"`{code}`", ""), ("", f"Let me check: `{code}`"), (f"```python\n{code}\n```", "")):
        assert _ground(arm, "What does the code give?", span=span, sentence=sentence) == []
    assert not marker.exists()
    # The same snippet in the user's own question is run (in the sandbox, where the path does not exist or
    # the guard refuses it): a tool call from the question, not the model's text.
    with pytest.raises(ArmError, match="python@question"):
        _ground(arm, f"What does `{code}` return?")
    [found] = _ground(arm, "What does `sorted([3,1,2])[0]` return?", span="`sorted([9])[0]`", sentence="`len('xy')`")
    assert (found.detail["field"], found.detail["input"], found.detail["output"]) == (
        "question",
        "sorted([3,1,2])[0]",
        "1",
    )


def test_tool_calls_are_ordered_span_then_sentence_then_question():
    calls = extract_tool_calls("6 x 7", question="What is 1 plus 1?", sentence="2 plus 2 is")
    assert [(c.field, c.input) for c in calls] == [("span", "6 * 7"), ("sentence", "2 + 2"), ("question", "1 + 1")]


def test_specific_tools_come_before_the_calculator_in_a_field():
    # A date offset is not a subtraction, and a backticked snippet is not arithmetic.
    call = _first_call("", "What date is 100 days after 2024-01-15?")
    assert call.tool == "dates"
    call = _first_call("", "What does `2 ** 10` return?")
    assert call.tool == "python"
    assert [c.tool for c in extract_tool_calls("", "What does `2 ** 10` return?")] == ["python", "calculator"]


def test_tool_calls_can_be_limited_to_some_tools():
    assert _first_call("", "What does `2 ** 10` return?", tools=("calculator",)).tool == "calculator"
    assert _first_call("", "How many kilometres is 26.2 miles?", tools=("calculator", "dates")) is None


def test_tool_calls_reject_unknown_tool_names():
    with pytest.raises(InputError, match="unknown tool names"):
        extract_tool_calls("", "What is 2 plus 2?", tools=("calculator", "shell"))
    with pytest.raises(InputError):
        extract_tool_calls("", "What is 2 plus 2?", tools="calculator")


def test_tool_call_extraction_is_fast_on_long_text():
    text = ("Is example.com up? What does `f(` return 1 March 2024 5 km in " * 400)[:15_000]
    started = time.perf_counter()
    extract_tool_calls(text[:2000], text, text)
    assert time.perf_counter() - started < 2.0


# --------------------------------------------------------------------------------------------------
# ToolArm: every Act tool behind one arm

NOW = datetime(2025, 6, 10, 20, 0, tzinfo=UTC)
needs_pint = pytest.mark.skipif(importlib.util.find_spec("pint") is None, reason="pint is not installed")


@pytest.fixture
def file_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nbeta\n", encoding="utf-8")
    return root


@pytest.fixture
def tool_arm(file_root):
    return ToolArm(roots=[file_root], clock=lambda: NOW, warm_up=False)


def _ground(arm: ToolArm, question: str = "", span: str = "", sentence: str = "", seconds: float = 5.0):
    return arm.ground(
        Query(span=span, question=question, sentence=sentence, span_class="computable"), time.monotonic() + seconds
    )


def test_tool_arm_is_an_arm(tool_arm):
    assert isinstance(tool_arm, Arm)
    assert tool_arm.name == "tool"


@pytest.mark.parametrize(
    ("question", "tool", "claim", "evidence"),
    [
        ("What is 37 times 48?", "calculator", "37 * 48 = 1776", "The answer is 1776."),
        (
            "How many days between 1 March and 14 April 2024?",
            "dates",
            "days(2024-03-01, 2024-04-14) = 44",
            "From 1 March 2024 to 14 April 2024 is 44 days.",
        ),
        (
            "What date is 100 days after 2024-01-15?",
            "dates",
            "2024-01-15 +100 days = 2024-04-24",
            "100 days after 15 January 2024 is Wednesday, 24 April 2024.",
        ),
        (
            "What is the date today in Asia/Tokyo?",
            "dates",
            "today(Asia/Tokyo) = 2025-06-11",
            "Today in Asia/Tokyo is Wednesday, 11 June 2025.",
        ),
        (
            "What does `sorted([3,1,2])[0]` return?",
            "python",
            "python: sorted([3,1,2])[0] -> 1",
            "`sorted([3,1,2])[0]` evaluates to 1.",
        ),
        (
            "How many lines are in notes.txt?",
            "files",
            "contents of notes.txt (11 bytes)",
            "The file notes.txt has 2 lines.",
        ),
    ],
)
def test_tool_arm_dispatches_to_each_tool(tool_arm, question, tool, claim, evidence):
    [found] = _ground(tool_arm, question, span="wrong draft")
    assert found.source == f"tool:{tool}"
    assert (found.claim, found.evidence) == (claim, evidence)
    assert found.observable == 1.0
    assert {"tool", "input", "output", "sandbox"} <= set(found.detail)
    assert found.detail["tool"] == tool
    assert found.detail["field"] == "question"


@needs_pint
def test_tool_arm_converts_units(tool_arm):
    [found] = _ground(tool_arm, "How many kilometres is 26.2 miles?")
    assert found.evidence == "26.2 mi is about 42.1648 km."
    assert found.detail["tool"] == "units"


def test_tool_arm_python_result_names_its_sandbox(tool_arm):
    [found] = _ground(tool_arm, "What does `1/0` return?")
    assert found.evidence == "`1/0` raises ZeroDivisionError: division by zero."
    assert found.detail["sandbox"] in ("bwrap", "rlimits")
    assert found.detail["status"] == "error"


def test_tool_arm_checks_allow_listed_status(file_root):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        arm = ToolArm(allowed_status_targets=[f"127.0.0.1:{port}"], warm_up=False)
        [found] = _ground(arm, f"Is 127.0.0.1:{port} up?")
        assert found.claim == f"127.0.0.1:{port} is up"
        [by_port] = _ground(arm, f"Is port {port} open?")
        assert by_port.detail["input"] == f"127.0.0.1:{port}"
    finally:
        server.close()


def test_tool_arm_returns_nothing_when_no_tool_applies(tool_arm):
    assert _ground(tool_arm, "What is the capital of France?", span="Paris") == []
    assert _ground(tool_arm) == []


def test_tool_arm_reports_every_refusal(tool_arm):
    with pytest.raises(ArmError) as caught:
        _ground(tool_arm, "What's in ../secret.txt?")
    assert str(caught.value).startswith("tool: files@question: parent_escape: ")
    with pytest.raises(ArmError, match="status@question: not_allowed"):
        _ground(tool_arm, "Is example.com up?")


def test_tool_arm_falls_back_to_a_later_call(file_root):
    # The snippet (from the question) times out; the calculator call in the span is tried after it.
    arm = ToolArm(python_timeout_s=0.3, warm_up=False)
    [found] = _ground(arm, "What does `while True: pass` return?", span="6 times 7")
    assert found.claim == "6 * 7 = 42"
    assert found.detail["field"] == "span"


def test_tool_arm_respects_the_deadline(tool_arm):
    with pytest.raises(ArmError, match="deadline"):
        tool_arm.ground(Query("", "What is 6 times 7?", ""), time.monotonic() - 1)
    # Too little time left to start an interpreter: refused rather than overrunning the round.
    with pytest.raises(ArmError, match="python@question: timeout"):
        _ground(tool_arm, "What does `sorted([3,1,2])[0]` return?", seconds=0.1)


def test_tool_arm_python_is_bounded_by_the_deadline(tool_arm):
    started = time.monotonic()
    with pytest.raises(ArmError, match="timeout"):
        _ground(tool_arm, "What does `while True: pass` return?", seconds=0.8)
    assert time.monotonic() - started < 1.5


def test_tool_arm_can_be_limited_to_some_tools(file_root):
    arm = ToolArm(tools=("calculator",), warm_up=False)
    [found] = _ground(arm, "What does `2 ** 10` return?")
    assert found.source == "tool:calculator"
    assert _ground(arm, "How many lines are in notes.txt?") == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"tools": ("calculator", "shell")}, "tools="),
        ({"tools": "calculator"}, "tools="),
        ({"roots": ["/definitely/not/here"]}, "not a directory"),
        ({"allowed_status_targets": ["not a target"]}, "status target"),
        ({"default_timezone": "Mars/Base"}, "default_timezone"),
        ({"python_sandbox": "docker"}, "unknown"),
        ({"python_timeout_s": 0}, "timeout_s"),
        ({"file_max_bytes": 0}, "file_max_bytes"),
    ],
)
def test_tool_arm_validates_its_config(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ToolArm(warm_up=False, **kwargs)


def test_tool_arm_computes_bigbench_arithmetic():
    # The brief's bar is 95% of the items whose question states the computation; all of them pass.
    rows = [row for row in _load_jsonl("arith_dev.jsonl") if row["source"].startswith("BIG-bench")]
    arm = ToolArm(warm_up=False)
    right = 0
    for row in rows:
        draft = str(int(row["answers"][0]) + 10)
        found = arm.ground(Query(span=draft, question=row["question"], sentence=f"The answer is {draft}"), FAR_DEADLINE)
        right += bool(found) and found[0].detail["output"] == row["answers"][0]
    assert right == len(rows)


def test_tool_arm_never_grounds_word_problems_wrong():
    rows = [row for row in _load_jsonl("arith_dev.jsonl") if not row["source"].startswith("BIG-bench")]
    arm = ToolArm(tools=("dates", "units", "calculator"), warm_up=False)
    wrong = []
    for row in rows:
        try:
            found = arm.ground(Query(span="", question=row["question"], sentence=""), FAR_DEADLINE)
        except ArmError:
            continue
        if (
            found
            and found[0].source == "tool:calculator"
            and Fraction(found[0].detail["output"]) != Fraction(row["answers"][0])
        ):
            wrong.append(row["question"])
        elif found and found[0].source != "tool:calculator":
            wrong.append(f"{found[0].source}: {row['question']}")
    assert wrong == []


# --------------------------------------------------------------------------------------------------
# word problems: the model writes a program (through the query's scribe), the calculator runs it

WORD_PROBLEM = (
    "Paige had 43 math problems and 12 science problems for homework. If she finished 44 of the problems at "
    "school, how many problems did she have to do for homework?"
)


class WritingScribe:
    """A Scribe that writes a fixed text and records what it was asked."""

    def __init__(self, text: str):
        self.text, self.asked, self.tokens_written = text, [], 0

    def write(self, messages, lead, *, max_tokens, stops, deadline):
        self.asked.append({"messages": messages, "lead": lead, "max_tokens": max_tokens, "stops": stops})
        self.tokens_written += len(self.text.split())
        return self.text


def _word_problem(arm: ToolArm, scribe, question: str = WORD_PROBLEM, span: str = "12 problems"):
    query = Query(span=span, question=question, sentence=f"Paige had {span}", span_class="computable", scribe=scribe)
    return arm.ground(query, time.monotonic() + 5)


def test_a_word_problem_is_answered_by_a_program_the_model_writes(tool_arm):
    scribe = WritingScribe("total = 43 + 12\nfinished = 44\nanswer = total - finished\n```")
    [found] = _word_problem(tool_arm, scribe)
    assert found.source == "tool:program" and found.claim == "43 + 12 - 44 = 11"
    assert found.evidence == "The answer is 11." and found.detail["scratch_tokens"] == scribe.tokens_written
    [asked] = scribe.asked
    # A fresh chat about the user's question only: never the model's reply or the span.
    assert WORD_PROBLEM in asked["messages"][-1]["content"]
    assert all("12 problems" not in m["content"] for m in asked["messages"])
    assert asked["lead"].startswith("```") and asked["max_tokens"] == 192


def test_a_refused_program_is_reported_and_nothing_is_evidence(tool_arm):
    with pytest.raises(ArmError, match=r"program@question: invented_number: .*\b50\b"):
        _word_problem(tool_arm, WritingScribe("answer = 43 + 12 - 50\n```"))


def test_a_program_is_written_only_when_no_tool_call_is_found(tool_arm):
    scribe = WritingScribe("answer = 6 * 7\n```")
    [found] = _word_problem(tool_arm, scribe, question="What is 6 times 7?", span="41")
    assert found.source == "tool:calculator" and scribe.asked == []


def test_no_program_without_a_scribe_or_when_turned_off(file_root):
    assert _word_problem(ToolArm(warm_up=False), None) == []
    scribe = WritingScribe("answer = 43 + 12 - 44\n```")
    assert _word_problem(ToolArm(warm_up=False, word_problems=False), scribe) == [] and scribe.asked == []
    entity = Query("Tripoli", "What is the capital of Burkina Faso?", "", span_class="entity", scribe=scribe)
    assert ToolArm(warm_up=False).ground(entity, time.monotonic() + 5) == [] and scribe.asked == []


def test_program_max_tokens_is_checked():
    with pytest.raises(ConfigError, match="program_max_tokens=4"):
        ToolArm(warm_up=False, program_max_tokens=4)

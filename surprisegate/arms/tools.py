"""The tool arm (Act): `ToolArm` puts every Act tool behind one arm.

`extract_tool_calls` finds which tool the span and its context ask for, with what input, from which field
("37 times 48" -> calculator "37 * 48"; "days between 1 March and 14 April 2024" -> dates); a Python snippet
only ever from the user's own turn (the question), never from the model's text (span, sentence), which
retrieved text may have talked it into writing. `ToolArm` runs them: the calculator (arms/calculator.py),
dates (arms/dates.py), units (arms/units.py), a sandboxed Python snippet (arms/sandbox.py), file contents
under allowed roots (arms/files.py) and live status of allow-listed targets (arms/status.py). A word problem
that states no computation is last: the model writes a program for it, which the calculator runs and
checks (arms/programs.py; only where the query lends the model).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from surprisegate.arms import Evidence, Query, dates, files, programs, sandbox, status, units
from surprisegate.arms.calculator import CalculatorTool, calculate, extract_computation
from surprisegate.arms.toolkit import ToolRefused
from surprisegate.errors import ArmError, ConfigError, InputError, SurpriseGateError

# --------------------------------------------------------------------------------------------------
# tool calls: which tool to run, with what input

# Tried in this order within each field: specific requests first, so that `notes.txt` is read as a file
# rather than run as Python, and "100 days after 2024-01-15" is date math rather than subtraction.
TOOL_NAMES = ("files", "python", "status", "dates", "units", "calculator")
# The fields each tool may take its input from. Code runs only when the user wrote it: the span and the
# sentence are the model's own reply, which retrieved text can steer.
TOOL_FIELDS = {name: ("span", "sentence", "question") for name in TOOL_NAMES} | {"python": ("question",)}


@dataclass(frozen=True)
class ToolCall:
    tool: str  # one of TOOL_NAMES
    request: Any  # the tool's parsed request: Snippet, FileRequest, StatusRequest, DateQuestion, Conversion, str
    field: str  # "span" | "sentence" | "question": where it was found
    input: str  # canonical and readable, for receipts and tests: "37 * 48", "sorted([3,1,2])[0]"


def _python_call(text: str) -> tuple[Any, str] | None:
    snippet = sandbox.extract_snippet(text)
    return (snippet, snippet.code) if snippet else None


def _files_call(text: str) -> tuple[Any, str] | None:
    request = files.extract_file_request(text)
    return (request, request.path) if request else None


def _status_call(text: str) -> tuple[Any, str] | None:
    request = status.extract_status_request(text)
    return (request, request.describe()) if request else None


def _dates_call(text: str) -> tuple[Any, str] | None:
    question = dates.extract_date_question(text)
    return (question, question.describe()) if question else None


def _units_call(text: str) -> tuple[Any, str] | None:
    conversion = units.extract_conversion(text)
    return (conversion, conversion.describe()) if conversion else None


def _calculator_call(text: str) -> tuple[Any, str] | None:
    expression = extract_computation(text)
    return (expression, expression) if expression else None


_EXTRACTORS: dict[str, Callable[[str], tuple[Any, str] | None]] = {
    "files": _files_call,
    "python": _python_call,
    "status": _status_call,
    "dates": _dates_call,
    "units": _units_call,
    "calculator": _calculator_call,
}


def extract_tool_calls(
    span: str, question: str = "", sentence: str = "", tools: Sequence[str] = TOOL_NAMES
) -> list[ToolCall]:
    """Every tool call the span and its context state, best first: fields in the order span, sentence,
    question (the span is the doubtful text itself; the question usually states the computation), and
    tools in TOOL_NAMES order within a field. The tool arm runs the first one that succeeds.

    A Python snippet is taken from the question (the user's turn) only: code in the span or the sentence is
    the model's and is never run (TOOL_FIELDS).
    """
    unknown = [name for name in tools if name not in _EXTRACTORS]
    if unknown or isinstance(tools, str):
        raise InputError(f"tools={tools!r}: unknown tool names {unknown}; use some of {', '.join(TOOL_NAMES)}")
    calls: list[ToolCall] = []
    seen: set[tuple[str, str]] = set()
    for field_name, text in (("span", span or ""), ("sentence", sentence or ""), ("question", question or "")):
        if not text.strip():
            continue
        for name in TOOL_NAMES:
            if name not in tools or field_name not in TOOL_FIELDS[name]:
                continue
            found = _EXTRACTORS[name](text)
            if found is None or (name, found[1]) in seen:
                continue
            if name == "python" and ("files", found[1]) in seen:  # a backticked path is a file, never code
                continue
            seen.add((name, found[1]))
            calls.append(ToolCall(name, found[0], field_name, found[1]))
    return calls


def _failure(tool: str, field_name: str, err: SurpriseGateError) -> str:
    reason = getattr(err, "reason", None)
    return f"{tool}@{field_name}: {reason + ': ' if reason else ''}{err}"


# --------------------------------------------------------------------------------------------------
# ToolArm: every Act tool behind one arm

MIN_PYTHON_SECONDS = 0.2  # below this a snippet cannot even start its interpreter: refuse instead


class ToolArm:
    """Arm that grounds computable spans with the right tool: calculator, dates, units, Python (sandboxed),
    files (only under `roots`) or live status (only `allowed_status_targets`).

    `extract_tool_calls` finds the calls in the span, sentence and question; they are tried in
    order until one succeeds. Every result is evidence with `observable: 1.0` and the tool's input and
    output in `detail`. A tool that refuses (file outside the roots, target off the allow-list, snippet
    blocked or timed out) is reported in the ArmError when nothing else succeeds.
    """

    name = "tool"

    def __init__(
        self,
        *,
        roots: Sequence[str | os.PathLike] = (),
        allowed_status_targets: Sequence[str] = (),
        python_timeout_s: float = 2.0,
        python_memory_mb: int = 256,
        python_sandbox: str = "auto",
        python_require_isolation: bool = False,
        tools: Sequence[str] = TOOL_NAMES,
        file_max_bytes: int = 64 * 1024,
        default_timezone: str = "UTC",
        clock: Callable[[], datetime] | None = None,
        warm_up: bool = True,
        word_problems: bool = True,
        program_max_tokens: int = 192,
    ):
        if isinstance(tools, str) or any(name not in TOOL_NAMES for name in tools):
            raise ConfigError(f"tools={tools!r}: use some of {', '.join(TOOL_NAMES)}")
        if isinstance(roots, (str, os.PathLike)):
            roots = [roots]
        missing = [str(root) for root in roots if not os.path.isdir(root)]
        if missing:
            raise ConfigError(f"roots: {', '.join(missing)} is not a directory; give existing directories")
        if isinstance(allowed_status_targets, str):
            allowed_status_targets = [allowed_status_targets]
        if not (0 < file_max_bytes <= 16 * 2**20):
            raise ConfigError(f"file_max_bytes={file_max_bytes!r}: use 1 to {16 * 2**20} bytes")
        zone = dates.resolve_zone(default_timezone)
        if zone is None:
            raise ConfigError(f"default_timezone={default_timezone!r} is unknown; use an IANA name such as 'UTC'")
        sandbox.sandbox_mode(python_sandbox)  # validates the name
        if not 16 <= program_max_tokens <= 2048:
            raise ConfigError(f"program_max_tokens={program_max_tokens!r}: use 16 to 2048 tokens, e.g. 192")
        self.word_problems, self.program_max_tokens = word_problems, program_max_tokens
        self.tools = tuple(tools)
        self.roots = tuple(os.fspath(root) for root in roots)
        self.allowed_status_targets = tuple(status.parse_target(target) for target in allowed_status_targets)
        self.python_limits = sandbox.SandboxLimits(timeout_s=python_timeout_s, memory_bytes=python_memory_mb * 2**20)
        self.python_sandbox = python_sandbox
        # True: a snippet runs only with full isolation (namespaces), never in the weaker no-namespace fallback.
        self.python_require_isolation = python_require_isolation
        self.file_max_bytes = file_max_bytes
        self.default_timezone = zone
        self.clock = clock
        if warm_up:
            # pint's registry (about a second) and the bwrap probe: done now, not inside a round's deadline.
            if "units" in self.tools:
                units.warm_up()
            if "python" in self.tools and (python_sandbox == "auto" or python_require_isolation):
                probe = functools.partial(sandbox.isolation_status, python_sandbox)
                threading.Thread(target=probe, daemon=True, name="surprisegate-sandbox-probe").start()

    def ground(self, query: Query, deadline: float) -> list[Evidence]:
        """Return one verified result, [] when no tool applies, or raise ArmError when every tool that
        applied refused or failed (the message lists each tool's reason)."""
        if time.monotonic() >= deadline:
            raise ArmError("tool: the round's deadline passed before it could run")
        calls = extract_tool_calls(query.span, query.question, query.sentence, tools=self.tools)
        failures: list[str] = []
        for call in calls:
            if time.monotonic() >= deadline:
                failures.append(f"{call.tool}@{call.field}: the round's deadline passed")
                break
            try:
                return [self._run(call, deadline)]
            except SurpriseGateError as err:  # a refusal or bad input: a later call may still work
                failures.append(_failure(call.tool, call.field, err))
        if not calls and self._writes_program(query):
            try:
                return [self._run_program(query, deadline)]
            except SurpriseGateError as err:
                failures.append(_failure("program", "question", err))
        if failures:
            raise ArmError("tool: " + "; ".join(failures))
        return []

    def _writes_program(self, query: Query) -> bool:
        return self.word_problems and query.scribe is not None and programs.is_word_problem(query)

    def _run_program(self, query: Query, deadline: float) -> Evidence:
        """The model writes a program for the word problem (a fresh chat: the question, never the reply or
        retrieved text); the calculator runs and checks it."""
        assert query.scribe is not None
        messages = [
            {"role": "system", "content": programs.PROGRAM_SYSTEM},
            {"role": "user", "content": programs.PROGRAM_INSTRUCTION.format(question=query.question)},
        ]
        before = query.scribe.tokens_written
        written = query.scribe.write(
            messages,
            programs.PROGRAM_LEAD,
            max_tokens=self.program_max_tokens,
            stops=programs.PROGRAM_STOPS,
            deadline=deadline,
        )
        answer = programs.evaluate_program(written, query.question)
        return programs.program_evidence(answer, query.scribe.tokens_written - before)

    def _run(self, call, deadline: float) -> Evidence:
        runner = getattr(self, f"_run_{call.tool}")
        return runner(call, deadline)

    def _run_calculator(self, call, deadline: float) -> Evidence:
        return CalculatorTool._evidence(call.request, calculate(call.request), call.field)

    def _run_dates(self, call, deadline: float) -> Evidence:
        now = self.clock() if self.clock else None
        answer = dates.answer_date_question(call.request, now=now, default_zone=self.default_timezone)
        return dates.date_evidence(answer, call.field)

    def _run_units(self, call, deadline: float) -> Evidence:
        return units.conversion_evidence(units.convert_conversion(call.request), call.field)

    def _run_python(self, call, deadline: float) -> Evidence:
        remaining = deadline - time.monotonic() - 0.05  # leave time to turn the result into evidence
        if remaining < MIN_PYTHON_SECONDS:
            raise ToolRefused(
                "timeout",
                f"only {max(remaining, 0):.2f} s left before the round's deadline; not enough to run a snippet",
            )
        limits = dataclasses.replace(self.python_limits, timeout_s=min(self.python_limits.timeout_s, remaining))
        result = sandbox.run_python(
            call.request.code, limits, mode=self.python_sandbox, require_isolation=self.python_require_isolation
        )
        if result.status not in ("ok", "error"):  # contained, not an answer: say what happened
            raise ToolRefused(result.status, f"snippet {call.request.code[:80]!r} in {result.sandbox}: {result.reason}")
        return sandbox.snippet_evidence(call.request.code, result, call.field)

    def _run_files(self, call, deadline: float) -> Evidence:
        contents = files.read_file(call.request.path, self.roots, self.file_max_bytes)
        return files.file_evidence(contents, call.request.wants_line_count, call.field)

    def _run_status(self, call, deadline: float) -> Evidence:
        target = status.resolve_request(call.request, self.allowed_status_targets)
        return status.status_evidence(status.check_status(target, self.allowed_status_targets, deadline), call.field)

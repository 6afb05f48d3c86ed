"""The Python tool: REPL-style results, isolation of each run, bounded output, snippet extraction, evidence.

Runs in every sandbox this machine offers: "rlimits" always, "bwrap" when bubblewrap works here.
The attacks themselves are in test_sandbox_attacks.py.
"""

from __future__ import annotations

import statistics
import sys
import time

import pytest

from surprisegate.arms import sandbox
from surprisegate.arms.sandbox import (
    SandboxLimits,
    SandboxResult,
    bwrap_status,
    extract_snippet,
    isolation_status,
    run_python,
    sandbox_mode,
    snippet_evidence,
)
from surprisegate.errors import ConfigError

MODES = ["rlimits"] + (["bwrap"] if bwrap_status()[0] else [])
FAST = SandboxLimits(timeout_s=3.0)


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def run(code: str, mode: str, limits: SandboxLimits = FAST) -> SandboxResult:
    return run_python(code, limits, mode=mode)


def test_final_expression_value_is_reported_like_a_repl(mode):
    result = run("sorted([3, 1, 2])[0]", mode)
    assert result.status == "ok"
    assert result.value == "1"
    assert result.sandbox == mode
    assert result.stdout == ""


def test_statements_then_an_expression(mode):
    result = run("x = [3, 1, 2]\nprint('sorting')\nsorted(x)", mode)
    assert (result.status, result.value, result.stdout) == ("ok", "[1, 2, 3]", "sorting\n")


def test_statements_only_have_no_value(mode):
    result = run("for i in range(3):\n    print(i)", mode)
    assert (result.status, result.value, result.stdout) == ("ok", None, "0\n1\n2\n")


def test_stdlib_is_available(mode):
    assert run("import math, json, itertools\njson.dumps([math.factorial(5)])", mode).value == "'[120]'"


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_everyday_snippets_work_with_and_without_the_guard(mode, guard):
    code = (
        "import datetime, decimal, fractions, statistics, re, collections, random\n"
        "print(datetime.date(2024, 3, 1) - datetime.date(2024, 1, 1))\n"
        "(str(decimal.Decimal('1.1') + decimal.Decimal('2.2')), fractions.Fraction(3, 6), statistics.mean([1, 2, 3]),"
        " re.findall(r'\\d+', 'a1b22'), collections.Counter('aab').most_common(1), random.Random(1).randint(1, 9))"
    )
    result = run_python(code, FAST, mode=mode, guard=guard)
    assert result.status == "ok", result
    assert result.stdout == "60 days, 0:00:00\n"
    assert result.value == "('3.3', Fraction(1, 2), 2, ['1', '22'], [('a', 2)], 3)"
    assert result.violations == ()
    raised = run_python("import json\njson.loads('{')", FAST, mode=mode, guard=guard)
    assert (raised.status, raised.exception) == ("error", "JSONDecodeError")


def test_per_snippet_overhead_stays_small(mode):
    # The tool runs inside a 2 s grounding round: starting the sandbox must take a small part of it.
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        assert run("sorted([3, 1, 2])[0]", mode).value == "1"
        timings.append(time.perf_counter() - started)
    assert statistics.median(timings) < 0.75, timings  # about 0.05-0.1 s on an idle machine


def test_exceptions_are_results(mode):
    result = run("1 / 0", mode)
    assert result.status == "error"
    assert result.exception == "ZeroDivisionError"
    assert result.reason == "ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in result.stderr


def test_syntax_errors_are_results(mode):
    result = run("def (:", mode)
    assert result.status == "error"
    assert result.exception == "SyntaxError"


def test_each_run_is_isolated(mode):
    first = run("open('left-behind.txt', 'w').write('x')\nimport os\nsorted(os.listdir('.'))", mode)
    assert first.value == "['left-behind.txt']"
    second = run("import os\nos.listdir('.')", mode)  # a fresh, empty working directory every time
    assert second.value == "[]"


def test_interpreter_is_isolated_with_an_empty_environment(mode):
    # Not inherited: LC_CTYPE is the interpreter's own (PEP 538 coerces the C locale), PWD is bwrap's --chdir.
    code = "import os, sys\n(sorted(set(os.environ) - {'LC_CTYPE', 'PWD'}), sys.flags.isolated, sys.flags.no_site)"
    assert run(code, mode).value == "([], 1, 1)"


def test_third_party_packages_are_not_importable(mode):
    result = run("import pytest", mode)
    assert result.status in ("error", "blocked")


def test_site_packages_stay_hidden_even_from_sys_path_edits(mode):
    site_packages = [*sandbox._site_package_dirs(), *(p for p in sys.path if "-packages" in p)]
    code = f"import sys\nsys.path[:0] = {site_packages!r}\nimport pytest"
    result = run_python(code, FAST, mode=mode, guard=False)
    if not result.isolation.get("full"):
        pytest.skip("no namespaces here: only the guard keeps third-party packages out")
    assert result.status == "error"
    assert result.exception == "ModuleNotFoundError"


def test_output_is_bounded(mode):
    result = run("print('x' * 20000)", mode, SandboxLimits(timeout_s=3.0, max_output_chars=1000))
    assert result.status == "ok"
    assert result.stdout == "x" * 1000
    assert result.truncated


def test_large_values_are_cut():
    result = run_python("'y' * 100_000", FAST)
    assert result.status == "ok"
    assert len(result.value) == sandbox.MAX_REPR_CHARS


@pytest.mark.parametrize(
    ("code", "fragment"),
    [("", "empty"), ("   ", "empty"), ("x" * 5000, "too long"), ("1\x002", "NUL"), (42, "must be a string")],
)
def test_bad_snippets_are_refused_without_running(code, fragment):
    result = run_python(code)  # type: ignore[arg-type]
    assert result.status == "refused"
    assert fragment in result.reason
    assert result.sandbox == "none"


def test_mode_names_are_checked():
    with pytest.raises(ConfigError, match="unknown"):
        sandbox_mode("docker")
    assert sandbox_mode("rlimits") == "rlimits"
    assert sandbox_mode("auto") in ("bwrap", "rlimits")


def test_demanding_bwrap_where_it_is_unusable_is_reported(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_result", (False, "bwrap is not installed"))
    result = run_python("1 + 1", mode="bwrap")
    assert result.status == "unavailable"
    assert "not installed" in result.reason
    assert run_python("1 + 1", mode="auto").sandbox == "rlimits"  # auto falls back


@pytest.mark.parametrize(
    "limits",
    [{"timeout_s": 0}, {"timeout_s": 120}, {"memory_bytes": 2**20}, {"max_processes": 0}],
)
def test_limits_are_validated(limits):
    with pytest.raises(ConfigError):
        SandboxLimits(**limits)


def test_result_reports_the_isolation_used(mode):
    result = run("1", mode)
    assert result.isolation["mode"] == mode
    assert result.isolation["network"] in ("netns", "audit-hook")
    assert result.isolation["filesystem"] in ("mount-ns", "none")
    assert result.isolation["pid"] in ("pid-ns", "none")
    assert result.isolation["guard"] == "audit-hook"
    assert result.isolation["full"] is (result.isolation["filesystem"] == "mount-ns")
    if sys.platform == "linux" and mode == "bwrap":
        assert result.isolation["network"] == "netns"
        assert result.isolation["full"] is True
    assert run_python("1", FAST, mode=mode, guard=False).isolation["guard"] == "off"


def test_isolation_status_names_the_sandbox_and_why():
    for mode in ("auto", "bwrap", "rlimits"):
        usable, why = isolation_status(mode)
        assert isinstance(usable, bool) and why
    if bwrap_status()[0]:
        assert isolation_status("auto") == isolation_status("bwrap")
        assert isolation_status("bwrap")[0] is True
    with pytest.raises(ConfigError, match="unknown"):
        isolation_status("docker")


def test_isolation_status_without_bwrap_or_namespaces(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_result", (False, "bwrap is not installed"))
    assert isolation_status("bwrap") == (False, "bwrap is not installed")
    monkeypatch.setattr(sandbox, "_NAMESPACES", False)
    monkeypatch.setattr(sandbox, "_isolation_probes", {})
    usable, why = isolation_status("auto")  # falls back to rlimits, which cannot isolate now
    assert usable is False and "namespaces" in why
    result = run_python("1 + 1", mode="auto", require_isolation=True)
    assert (result.status, result.sandbox) == ("unavailable", "rlimits")


# --------------------------------------------------------------------------------------------------
# extraction


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("What does `sorted([3,1,2])[0]` return?", "sorted([3,1,2])[0]"),
        ("What does len('abc') return in Python?", "len('abc')"),
        ("what would the expression 2 ** 10 evaluate to", "2 ** 10"),
        ("What will `'abc'.upper()` print?", "'abc'.upper()"),
        ("Run this:\n```python\nx = 2\nprint(x * 3)\n```", "x = 2\nprint(x * 3)"),
        ("`__import__('os').system('touch /tmp/pwned')`", "__import__('os').system('touch /tmp/pwned')"),
    ],
)
def test_extract_snippet(text, code):
    snippet = extract_snippet(text)
    assert snippet is not None
    assert snippet.code == code


@pytest.mark.parametrize(
    "text",
    [
        "",
        "What is 37 times 48?",
        "What does the fox say?",
        "What's in `notes.txt`?",
        "Run `ls -la`",
        "Use `pip install foo`",
        "What does `config` return?",
        "What does it return?",
    ],
)
def test_no_snippet(text):
    assert extract_snippet(text) is None


# --------------------------------------------------------------------------------------------------
# evidence


def test_snippet_evidence_for_a_value():
    result = run_python("sorted([3,1,2])[0]", FAST)
    evidence = snippet_evidence("sorted([3,1,2])[0]", result, "question")
    assert evidence.evidence == "`sorted([3,1,2])[0]` evaluates to 1."
    assert evidence.source == "tool:python"
    assert evidence.observable == 1.0
    assert evidence.detail["tool"] == "python"
    assert evidence.detail["input"] == "sorted([3,1,2])[0]"
    assert evidence.detail["output"] == "1"
    assert evidence.detail["sandbox"] == result.sandbox
    assert evidence.detail["field"] == "question"


def test_snippet_evidence_for_prints_and_errors():
    printed = snippet_evidence("print('a')", run_python("print('a')", FAST))
    assert printed.evidence == "`print('a')` prints: a"
    raised = snippet_evidence("1/0", run_python("1/0", FAST))
    assert raised.evidence == "`1/0` raises ZeroDivisionError: division by zero."
    both = snippet_evidence("print('a')\n2", run_python("print('a')\n2", FAST))
    assert both.evidence == "```\nprint('a')\n2\n``` prints 'a' and evaluates to 2."

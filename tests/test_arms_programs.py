"""Word-problem programs (arms/programs.py): a model-written program is arithmetic, checked, never executed."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.arms import Query
from surprisegate.arms.programs import (
    PROGRAM_END,
    evaluate_program,
    is_word_problem,
    program_evidence,
    question_numbers,
)
from surprisegate.arms.toolkit import ToolRefused

PAIGE = (
    "Paige had 43 math problems and 12 science problems for homework. If she finished 44 of the problems at "
    "school, how many problems did she have to do for homework?"
)


def fenced(code: str) -> str:
    return code.strip("\n") + "\n" + PROGRAM_END + "\n"


@pytest.mark.parametrize(
    "code, value, expression, name",
    [
        ("total = 43 + 12\nfinished = 44\nanswer = total - finished", 11, "43 + 12 - 44", "answer"),
        ("math = 43\nscience = 12\nleft = math + science - 44\nprint(left)", 11, "43 + 12 - 44", "left"),
        ("a = 43\nb = 12\nc = a + b\nd = c - 44", 11, "43 + 12 - 44", "d"),  # the last assignment
        ("left = 43 + 12\nleft -= 44\nanswer = left", 11, "43 + 12 - 44", "answer"),
        ("answer = 0\nanswer = (43 + 12) - 44", 11, "43 + 12 - 44", "answer"),  # 0 may start a sum
    ],
)
def test_a_straight_line_program_gives_its_answer_as_one_expression(code, value, expression, name):
    answer = evaluate_program(fenced(code), PAIGE)
    assert (answer.value, answer.expression, answer.answer_name) == (value, expression, name)


def test_the_answer_variable_wins_over_what_is_printed():
    answer = evaluate_program(fenced("x = 43 + 12\nanswer = x - 44\nprint(x)"), PAIGE)
    assert answer.value == 11 and answer.answer_name == "answer"


def test_a_printed_name_wins_over_the_last_assignment():
    code = "left = 43 + 12 - 44\nprint(left)\nunused = 43 * 12"
    assert evaluate_program(fenced(code), PAIGE).value == 11


def test_division_is_exact_and_floor_division_whole():
    question = "Megan baked 68 cupcakes and ate 32. If she put 6 in each package, how many packages could she make?"
    assert evaluate_program(fenced("answer = (68 - 32) // 6"), question).value == 6
    assert evaluate_program(fenced("answer = (68 - 32) / 6"), question).value == 6


@pytest.mark.parametrize(
    "code, reason",
    [
        ("answer = 43 + 12 - 45", "invented_number"),  # 45 is not in the question
        ("answer = 43 + 1", "too_simple"),  # one of the question's numbers
        ("answer = 12 - 44", "not_a_count"),  # a negative count
        ("answer = 43 / 12", "not_a_count"),  # a fractional count
        ("def solve():\n    return 43 + 12 - 44\nanswer = solve()", "not_a_program"),
        ("for i in range(3):\n    x = 43\nanswer = 43 + 12", "not_a_program"),
        ("answer = missing + 12", "not_a_program"),  # a name never assigned
        ("answer = int(43 + 12)", "not_arithmetic"),  # calls are not arithmetic
        ("answer = __import__('os').system('touch /tmp/pwned')", "not_arithmetic"),
        ("import os\nanswer = 43 + 12", "not_a_program"),
        ("answer = '43' + '12'", "not_arithmetic"),
        ("answer = 43 +", "not_a_program"),
        ("", "not_a_program"),
        ("x = 43\nx.y = 12\nanswer = x", "not_a_program"),  # an attribute target
    ],
)
def test_programs_that_are_not_checked_arithmetic_are_refused(code, reason, tmp_path):
    with pytest.raises(ToolRefused) as refused:
        evaluate_program(fenced(code), PAIGE)
    assert refused.value.reason == reason, refused.value
    assert str(refused.value)  # the message says what was wrong


def test_a_program_without_its_closing_fence_is_unfinished():
    with pytest.raises(ToolRefused) as refused:
        evaluate_program("total = 43 + 12\nanswer = total - ", PAIGE)
    assert refused.value.reason == "unfinished" and "answer = total" in str(refused.value)


def test_nothing_in_a_program_is_executed(tmp_path):
    marker = tmp_path / "ran"
    code = f"answer = 43 + 12 - 44\nopen({str(marker)!r}, 'w').write('x')"
    with pytest.raises(ToolRefused):
        evaluate_program(fenced(code), PAIGE)
    assert not marker.exists()


def test_a_huge_power_is_refused_by_the_calculator():
    question = "A tower has 9 floors and each floor has 99 rooms. How many rooms are there?"
    with pytest.raises(ToolRefused) as refused:
        evaluate_program(fenced("answer = 99 ** 99 ** 9"), question)
    assert refused.value.reason == "not_arithmetic"


def test_a_question_that_is_not_a_count_may_have_a_fraction():
    question = "A rope of 7 meters is cut into 2 equal pieces. What is the length of each piece?"
    assert evaluate_program(fenced("answer = 7 / 2"), question).value == Fraction(7, 2)


@pytest.mark.parametrize(
    "question, numbers",
    [
        ("He had 1,200 coins and gave away 15.5 of them", {1200, Fraction(31, 2)}),
        ("five friends each ate twice as many as three others", {5, 2, 3}),
        ("a dozen eggs and half a loaf", {12, 2}),
        ("There are twenty-one students", {21}),
        ("No numbers here", set()),
    ],
)
def test_question_numbers_reads_digits_and_words(question, numbers):
    assert question_numbers(question) == frozenset(Fraction(n) for n in numbers)


def test_a_word_problem_is_computable_with_two_numbers():
    assert is_word_problem(Query("", PAIGE, "", span_class="computable"))
    assert not is_word_problem(Query("", PAIGE, "", span_class="entity"))
    assert not is_word_problem(Query("", "How many moons does Mars have?", "", span_class="computable"))


def test_program_evidence_is_a_verified_tool_result_with_the_program_in_its_detail():
    answer = evaluate_program(fenced("total = 43 + 12\nanswer = total - 44"), PAIGE)
    evidence = program_evidence(answer, scratch_tokens=21)
    assert evidence.claim == "43 + 12 - 44 = 11" and evidence.evidence == "The answer is 11."
    assert evidence.source == "tool:program" and evidence.observable == 1.0 and evidence.confidence < 1.0
    assert evidence.detail["input"].startswith("total = 43 + 12") and evidence.detail["scratch_tokens"] == 21


# --------------------------------------------------------------------------------------------------
# property: a straight-line program over the question's numbers evaluates as Python would

OPERATORS = ("+", "-", "*")


@st.composite
def straight_line_programs(draw):
    numbers = draw(st.lists(st.integers(2, 99), min_size=2, max_size=5, unique=True))
    lines, names = [], []
    for i, n in enumerate(numbers):
        lines.append(f"q{i} = {n}")
        names.append(f"q{i}")
    for j in range(draw(st.integers(1, 4))):
        left, right = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        lines.append(f"s{j} = {left} {draw(st.sampled_from(OPERATORS))} ({right})")
        names.append(f"s{j}")
    lines.append(f"answer = {names[-1]} + {names[0]} - {names[1]}")
    question = "Numbers: " + ", ".join(str(n) for n in numbers) + ". What is the result?"
    return "\n".join(lines), question


@settings(max_examples=150, deadline=None)
@given(straight_line_programs())
def test_evaluation_matches_python_on_straight_line_programs(case):
    code, question = case
    scope: dict = {}
    exec(code, {"__builtins__": {}}, scope)  # the test's own generated arithmetic, as the reference
    answer = evaluate_program(fenced(code), question)
    assert answer.value == scope["answer"]
    assert eval(answer.expression, {"__builtins__": {}}) == scope["answer"]  # one expression, same value

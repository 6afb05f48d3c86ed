"""The calculator: bounded evaluation, extraction from natural language, number formatting, the Arm."""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.arms import Arm, Evidence, Query
from surprisegate.arms.calculator import (
    CalculatorTool,
    calculate,
    extract_computation,
    format_number,
)
from surprisegate.errors import ArmError, InputError

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
FAR_DEADLINE = float("inf")


def _load_jsonl(name: str) -> list[dict]:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is absent (shared evaluation data)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# --------------------------------------------------------------------------------------------------
# calculate


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("37 * 48", 1776),
        ("80 + 29", 109),
        ("22 - 34", -12),
        ("984 / 24", 41),
        ("7 / 2", Fraction(7, 2)),
        ("10 / 4", Fraction(5, 2)),
        ("1 / 3", Fraction(1, 3)),
        ("17 // 5", 3),
        ("-17 // 5", -4),
        ("17 % 5", 2),
        ("2 ** 10", 1024),
        ("2 ** -3", Fraction(1, 8)),
        ("2 ** 3 ** 2", 512),  # right-associative, as in Python
        ("-2 ** 2", -4),
        ("(-2) ** 2", 4),
        ("12 * (3 + 4)", 84),
        ("+5", 5),
        ("--5", 5),
        ("0.1 + 0.2", Fraction(3, 10)),  # decimals are exact
        ("3.5 * 2", 7),
        ("0 ** 0", 1),
        ("(-1) ** 7", -1),
        ("10 ** 300", 10**300),
        ("  1 + 1  ", 2),
    ],
)
def test_calculate_exact(expression, expected):
    assert calculate(expression) == expected


def test_calculate_returns_int_for_integral_results():
    assert type(calculate("984 / 24")) is int
    assert type(calculate("3.5 * 2")) is int
    assert type(calculate("7 / 2")) is Fraction


def test_calculate_fractional_power_is_a_float():
    assert calculate("16 ** 0.5") == 4.0
    assert calculate("2 ** 0.5") == pytest.approx(2**0.5)


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("__import__('os').system('id')", "function call"),
        ("abs(3)", "function call"),
        ("x + 1", "the name 'x'"),
        ("(1).real", "attribute"),
        ("'a' * 3", "constant 'a'"),
        ("True + 1", "constant True"),
        ("1 if 1 else 2", "IfExp"),
        ("[1, 2]", "List"),
        ("1 < 2", "Compare"),
        ("1 << 5", "<<"),
        ("6 ^ 3", "use ** for powers"),
        ("~3", "~"),
        ("1j", "1j"),
        ("lambda: 1", "Lambda"),
        ("1 +", "not valid arithmetic"),
        ("", "empty"),
    ],
)
def test_calculate_refuses_non_arithmetic(expression, fragment):
    with pytest.raises(InputError) as caught:
        calculate(expression)
    message = str(caught.value)
    assert fragment in message
    assert repr(expression) in message  # names the input


def test_refusal_says_what_is_allowed():
    with pytest.raises(InputError, match=r"only numbers, \+ - \* / // % \*\* and parentheses are allowed"):
        calculate("print(1)")


@pytest.mark.parametrize("expression", ["1 / 0", "5 // 0", "5 % 0", "0 ** -1", "1 / (2 - 2)", "1 / 0.0"])
def test_division_by_zero_is_an_input_error(expression):
    with pytest.raises(InputError, match="zero"):
        calculate(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9",
        "10**10**10",
        "2**100000",
        "99999999999**99999999",
        "(10**200) * (10**200)",
        "10**301",
        "2 ** -2000",
        "9" * 400,
        "1" * 10_000,
        "(" * 300 + "1" + ")" * 300,
        "1e400",
        "(-8) ** 0.5",
        "(10**150) ** 2.5",
    ],
    ids=lambda expression: expression[:20],
)
def test_dangerous_expressions_are_refused_quickly(expression):
    started = time.perf_counter()
    with pytest.raises(InputError):
        calculate(expression)
    assert time.perf_counter() - started < 0.5


def test_deep_but_small_expressions_are_computed():
    assert calculate("-" * 450 + "7") == 7
    assert calculate("(" * 150 + "7" + ")" * 150) == 7


def test_error_message_truncates_long_expressions():
    with pytest.raises(InputError) as caught:
        calculate("9" * 400)
    assert len(str(caught.value)) < 250


def test_calculate_rejects_non_strings():
    with pytest.raises(InputError):
        calculate(42)  # type: ignore[arg-type]


# A strategy of (expression text, exact value) pairs, so no evaluator is needed to know the answer.
def _expressions():
    leaves = st.integers(-50, 50).map(lambda n: (f"({n})" if n < 0 else str(n), Fraction(n)))

    def combine(children):
        def build(left, op, right):
            text = f"({left[0]} {op} {right[0]})"
            if op == "+":
                return text, left[1] + right[1]
            if op == "-":
                return text, left[1] - right[1]
            if op == "*":
                return text, left[1] * right[1]
            return (text, left[1] / right[1]) if right[1] != 0 else (f"({left[0]} + {right[0]})", left[1])

        return st.builds(build, children, st.sampled_from("+-*/"), children)

    return st.recursive(leaves, combine, max_leaves=8)


@given(_expressions())
@settings(max_examples=200, deadline=None)
def test_calculate_matches_exact_arithmetic(pair):
    text, value = pair
    assert calculate(text) == value


# --------------------------------------------------------------------------------------------------
# extract_computation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is 37 times 48?", "37 * 48"),
        ("What is 80 plus 29?", "80 + 29"),
        ("What is 22 minus 34?", "22 - 34"),
        ("What is 984 divided by 24?", "984 / 24"),
        ("What is 12 multiplied by 4?", "12 * 4"),
        ("what is 6 x 7", "6 * 7"),
        ("37x48", "37 * 48"),
        ("6 × 7", "6 * 7"),
        ("12 ÷ 4", "12 / 4"),
        ("12 over 4", "12 / 4"),
        ("the sum of 3 and 4", "3 + 4"),
        ("What is the product of 6 and 7?", "6 * 7"),
        ("the difference between 10 and 3", "10 - 3"),
        ("the quotient of 10 and 4", "10 / 4"),
        ("What is 5 squared?", "5 ** 2"),
        ("3 cubed", "3 ** 3"),
        ("2 to the power of 10", "2 ** 10"),
        ("2 raised to the power of 8", "2 ** 8"),
        ("2^10", "2 ** 10"),
        ("What is 15% of 80?", "15 / 100 * 80"),
        ("15 percent of 80", "15 / 100 * 80"),
        ("1,234 plus 5,678", "1234 + 5678"),
        ("What is 1,234,567 minus 1?", "1234567 - 1"),
        ("-5 plus 3", "-5 + 3"),
        ("What is negative 5 times 3?", "-5 * 3"),
        ("What is -5 minus -3?", "-5 - -3"),
        ("3.5 times 2", "3.5 * 2"),
        ("What is 0.25 plus .5?", "0.25 + 0.5"),
        ("12 * (3 + 4)", "12 * (3 + 4)"),
        ("What is 12*(3+4)?", "12 * (3 + 4)"),
        ("Calculate 2 + 3 * 4.", "2 + 3 * 4"),
        ("What is five plus three?", "5 + 3"),
        ("twenty-one times two", "21 * 2"),
        ("the sum of 3 and the product of 4 and 5", "3 + 4 * 5"),
        ("the remainder when 17 is divided by 5", "17 % 5"),
        ("17 mod 5", "17 % 5"),
        ("add 3 and 4", "3 + 4"),
        ("subtract 3 from 10", "10 - 3"),
        ("multiply 6 by 7", "6 * 7"),
        ("divide 12 by 4", "12 / 4"),
        ("3 more than 5", "5 + 3"),
        ("3 less than 5", "5 - 3"),
        ("half of 80", "80 / 2"),
        ("twice 21", "2 * 21"),
        ("the square root of 16", "16 ** 0.5"),
        ("What is $5 plus $3?", "5 + 3"),
        ("What is 12-7?", "12 - 7"),
        ("12-7=", "12 - 7"),
        ("What is 5–3?", "5 - 3"),
        ("37 × 48 = 1,776", "37 * 48"),
        ("I have 3 apples. What is 3 + 4 * 2?", "3 + 4 * 2"),  # the run with the most operators wins
    ],
)
def test_extract_computation(text, expected):
    assert extract_computation(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "1776",
        "The answer is 1,776.",
        "-5",
        "What is the capital of France?",
        "Solve for x",
        "He made 37 dollars mowing lawns over the summer.",
        "He was born on 2024-01-05.",
        "The meeting is at 10:30.",
        "He lived 1844-1846.",  # a range, not a subtraction
        "He lived 1866 - 1929 in Paris.",
        "Nadal won 6-4, 6-1 in the final.",  # scores
        "the 1895/96 season",
        "11 December 1933 - 2 November 2013",
        "12-7",  # ambiguous on its own: could be a range
        "1/3",
        "3-digit numbers",
        "Python 3.11.7 was released",
        "A trivia team had 12 members total, but 4 didn't show up. If each scored 8 points, how many points?",
        "touch /tmp/surprisegate-attack-6x78nhyq",  # a folder name is not "-6 * 78" (a CI flake, once)
        "Is h2o-2x3b a model?",
        "touch /tmp/attack-12x34567",
        "Is gpt-4x7 out?",
    ],
)
def test_extract_computation_finds_nothing(text):
    assert extract_computation(text) is None


@given(st.from_regex(r"[a-z0-9_]{0,4}(?:[0-9]+x[0-9]+)?[a-z0-9_]{0,4}", fullmatch=True))
@settings(max_examples=500, deadline=None)
def test_a_random_file_name_holds_no_computation(suffix):
    # tempfile names (random letters and digits, sometimes "12x345") glued to a word are names, not sums
    assert extract_computation(f"What is __import__('os').system('touch /tmp/attack-{suffix}')?") is None


_WORD_OPERATORS = {
    "plus": lambda a, b: a + b,
    "minus": lambda a, b: a - b,
    "times": lambda a, b: a * b,
    "multiplied by": lambda a, b: a * b,
    "x": lambda a, b: a * b,
    "×": lambda a, b: a * b,
    "divided by": lambda a, b: Fraction(a, b),
    "÷": lambda a, b: Fraction(a, b),
    "over": lambda a, b: Fraction(a, b),
}
_DIVISION_WORDS = {"divided by", "÷", "over"}


@given(
    a=st.integers(-(10**6), 10**6),
    b=st.integers(-(10**6), 10**6),
    word=st.sampled_from(sorted(_WORD_OPERATORS)),
    with_commas=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_word_arithmetic_matches_python(a, b, word, with_commas):
    if word in _DIVISION_WORDS and b == 0:
        b = 7  # division by zero is tested on its own
    shown = (lambda n: f"{n:,}") if with_commas else str
    expression = extract_computation(f"What is {shown(a)} {word} {shown(b)}?")
    assert expression is not None
    assert calculate(expression) == _WORD_OPERATORS[word](a, b)


@given(
    a=st.integers(0, 10**4),
    b=st.integers(0, 10**4),
    template=st.sampled_from(["sum", "product", "difference"]),
)
@settings(max_examples=100, deadline=None)
def test_phrase_templates_match_python(a, b, template):
    text = {
        "sum": f"What is the sum of {a} and {b}?",
        "product": f"What is the product of {a} and {b}?",
        "difference": f"What is the difference between {a} and {b}?",
    }[template]
    expected = {"sum": a + b, "product": a * b, "difference": a - b}[template]
    assert calculate(extract_computation(text)) == expected


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_extract_computation_never_crashes_and_always_parses(text):
    expression = extract_computation(text)
    if expression is not None:
        try:
            calculate(expression)
        except InputError:
            pass  # e.g. division by zero: refused cleanly, never another exception


@pytest.mark.parametrize(
    "text",
    [
        "1 + " * 3000 + "1 word " * 3000,
        "1 plus 1 word " * 2000,
        ("( " * 40 + "w ") * 180,  # many runs that never parse: the parse budget stops the search
    ],
    ids=["long-run", "many-runs", "unparseable-runs"],
)
def test_extract_computation_is_fast_on_long_text(text):
    started = time.perf_counter()
    extract_computation(text)
    assert time.perf_counter() - started < 2.0


def test_the_ask_at_the_end_of_a_long_text_is_still_found():
    assert extract_computation(("( " * 40 + "w ") * 180 + "So what is 3 plus 4?") == "3 + 4"


# --------------------------------------------------------------------------------------------------
# format_number


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1776, "1776"),
        (-12, "-12"),
        (0, "0"),
        (10**30, "1" + "0" * 30),
        (Fraction(7, 2), "3.5"),
        (Fraction(10, 4), "2.5"),
        (Fraction(-7, 2), "-3.5"),
        (Fraction(1, 3), "0.333333"),
        (Fraction(2, 3), "0.666667"),
        (Fraction(-1, 3), "-0.333333"),
        (Fraction(100, 3), "33.3333"),
        (Fraction(1_000_000, 3), "333333.3"),  # keeps a decimal so it does not pass for an integer
        (Fraction(1, 8), "0.125"),
        (Fraction(84, 1), "84"),
        (4.0, "4"),
        (2.5, "2.5"),
        (0.1 + 0.2, "0.3"),
        (2**0.5, "1.41421"),
        (1e-7, "1e-7"),
        (Fraction(1, 3 * 10**9), "3.33333e-10"),
        (float("inf"), "inf"),
    ],
)
def test_format_number(value, expected):
    assert format_number(value) == expected


@given(st.integers(-(10**40), 10**40))
def test_format_number_prints_integers_in_full(n):
    assert format_number(n) == str(n)


@given(st.integers(-999_999, 999_999), st.integers(0, 8))
def test_format_number_is_exact_up_to_six_significant_digits(digits, places):
    value = Fraction(digits, 10**places)
    assert Fraction(format_number(value)) == value


@given(st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=10**4))
def test_format_number_is_within_rounding_of_the_value(value):
    shown = Fraction(format_number(value))
    assert abs(shown - value) <= max(abs(value), 1) * Fraction(1, 10**5)


def test_format_number_rejects_other_types():
    with pytest.raises(InputError):
        format_number("3")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        format_number(True)


# --------------------------------------------------------------------------------------------------
# CalculatorTool


def _query(span="", question="", sentence=""):
    return Query(span=span, question=question, sentence=sentence, span_class="computable")


def test_calculator_tool_is_an_arm():
    tool = CalculatorTool()
    assert isinstance(tool, Arm)
    assert tool.name == "tool"


def test_ground_uses_the_question_when_the_span_is_the_answer():
    [evidence] = CalculatorTool().ground(_query(span="1766", question="What is 37 times 48?"), FAR_DEADLINE)
    assert isinstance(evidence, Evidence)
    assert evidence.claim == "37 * 48 = 1776"
    assert evidence.evidence == "The answer is 1776."
    assert evidence.confidence == 1.0
    assert evidence.source == "tool:calculator"
    assert evidence.observable == 1.0
    assert evidence.detail["input"] == "37 * 48"
    assert evidence.detail["output"] == "1776"
    assert evidence.detail["field"] == "question"
    assert evidence.to_dict()["claim"] == "37 * 48 = 1776"


def test_ground_prefers_span_then_sentence():
    tool = CalculatorTool()
    [from_span] = tool.ground(_query(span="6 x 7", sentence="2 plus 2", question="1 plus 1"), FAR_DEADLINE)
    assert from_span.detail == {
        "tool": "calculator",
        "input": "6 * 7",
        "output": "42",
        "sandbox": "ast",
        "exact": True,
        "field": "span",
    }
    [from_sentence] = tool.ground(_query(span="4", sentence="2 plus 2 is 4", question="1 plus 1"), FAR_DEADLINE)
    assert from_sentence.detail["field"] == "sentence"


def test_ground_says_about_for_rounded_values():
    [evidence] = CalculatorTool().ground(_query(question="What is 1 divided by 3?"), FAR_DEADLINE)
    assert evidence.claim == "1 / 3 = 0.333333"
    assert evidence.evidence == "The answer is about 0.333333."
    assert evidence.detail["exact"] is False


def test_ground_exact_quotient():
    [evidence] = CalculatorTool().ground(_query(question="What is 7 divided by 2?"), FAR_DEADLINE)
    assert evidence.evidence == "The answer is 3.5."


def test_ground_returns_nothing_when_nothing_is_computed():
    tool = CalculatorTool()
    assert tool.ground(_query(span="Paris", question="What is the capital of France?"), FAR_DEADLINE) == []
    assert tool.ground(_query(), FAR_DEADLINE) == []


def test_ground_raises_arm_error_for_a_failed_computation():
    with pytest.raises(ArmError, match="divides by zero"):
        CalculatorTool().ground(_query(question="What is 5 divided by 0?"), FAR_DEADLINE)
    with pytest.raises(ArmError, match="digits"):
        CalculatorTool().ground(_query(question="What is 9 to the power of 999999?"), FAR_DEADLINE)


def test_ground_falls_back_when_an_earlier_field_fails():
    query = _query(span="5 / 0", question="What is 6 times 7?")
    [evidence] = CalculatorTool().ground(query, FAR_DEADLINE)
    assert evidence.claim == "6 * 7 = 42"


def test_ground_respects_a_passed_deadline():
    with pytest.raises(ArmError, match="deadline"):
        CalculatorTool().ground(_query(question="What is 6 times 7?"), time.monotonic() - 1)


# --------------------------------------------------------------------------------------------------
# the shared development data


def _is_right(expression: str | None, gold: str) -> bool:
    if expression is None:
        return False
    try:
        value = calculate(expression)
    except InputError:
        return False
    return Fraction(value) == Fraction(gold)


def test_every_bigbench_arithmetic_item_is_computed_right():
    rows = [row for row in _load_jsonl("arith_dev.jsonl") if row["source"].startswith("BIG-bench")]
    assert rows
    wrong = [row["question"] for row in rows if not _is_right(extract_computation(row["question"]), row["answers"][0])]
    assert wrong == []


def test_calculator_tool_grounds_bigbench_questions_despite_a_wrong_draft():
    rows = [row for row in _load_jsonl("arith_dev.jsonl") if row["source"].startswith("BIG-bench")]
    tool = CalculatorTool()
    for row in rows:
        draft = str(int(row["answers"][0]) + 10)  # the model's doubtful, wrong answer
        query = Query(span=draft, question=row["question"], sentence=f"The answer is {draft}")
        [evidence] = tool.ground(query, FAR_DEADLINE)
        assert evidence.detail["output"] == row["answers"][0], row["question"]


def test_word_problems_are_never_computed_wrong():
    # A wrong calculator result injected as evidence is worse than none, so extraction must abstain.
    rows = [row for row in _load_jsonl("arith_dev.jsonl") if not row["source"].startswith("BIG-bench")]
    extracted = [(row, extract_computation(row["question"])) for row in rows]
    wrong = [row["question"] for row, expr in extracted if expr is not None and not _is_right(expr, row["answers"][0])]
    assert wrong == []


def test_fact_questions_state_no_computation():
    questions = [row["question"] for row in _load_jsonl("factqa_dev.jsonl")]
    questions += [row["question"] for row in _load_jsonl("wikidata_cloze_dev.jsonl")]
    assert [q for q in questions if extract_computation(q) is not None] == []

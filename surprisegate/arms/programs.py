"""Word problems: the model writes the arithmetic, the calculator does it (PAL-style, never `exec`).

"Paige had 43 math problems and 12 science problems. If she finished 44 of them at school, how many did she
have to do at home?" states no computation the calculator can find. The tool arm then has the model write a
short straight-line program for it (`PROGRAM_INSTRUCTION`, through the loop's `Scribe`), and
`evaluate_program` runs that program here, not in Python: only assignments and `print` of arithmetic over
numbers and names already assigned, every operation done by the calculator's AST walker. The program is
checked before its answer is evidence: every number in it must stand in the question (a model that invents a
quantity is refused), the answer must use at least two of them, and a "how many" answer must be a whole
number that is not negative.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

from surprisegate.arms import Evidence, Query
from surprisegate.arms.calculator import Number, calculate, format_number, number_words_to_digits
from surprisegate.arms.toolkit import ToolRefused, tool_evidence
from surprisegate.errors import InputError

# What the model is asked, as a fresh user turn after its system prompt. The question goes in as plain text.
PROGRAM_INSTRUCTION = (
    "{question}\n\nWrite a short Python program that computes the answer step by step: one variable per "
    "quantity, numbers taken from the question, no comments, and the result stored in `answer`."
)
PROGRAM_SYSTEM = "You are a helpful assistant."
PROGRAM_LEAD = "```python\n"  # the assistant turn starts inside a code block, so what follows is code
PROGRAM_END = "```"
# The program ends at its closing fence; a line that starts anything but straight-line code ends it early
# (a function, a loop): evaluate_program would refuse it, so its tokens are not worth decoding.
PROGRAM_STOPS = (PROGRAM_END, "\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nfor ", "\nwhile ", "\nif ")
# Literals a program may use that need not stand in the question: starting values and unit steps.
FREE_CONSTANTS = frozenset({Fraction(0), Fraction(1)})
MAX_STATEMENTS = 24
MAX_FLAT_CHARS = 400  # the answer's expression with every name replaced; longer is not a short word problem

_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
# "how many" asks for a count: a negative or fractional count comes from a wrong program.
_COUNT_QUESTION = re.compile(r"\bhow\s+many\b", re.IGNORECASE)
_WORD_NUMBERS = {"twice": "2", "double": "2", "triple": "3", "half": "2", "dozen": "12", "dozens": "12"}


@dataclass(frozen=True)
class ProgramAnswer:
    value: Number
    expression: str  # the answer as one expression over the question's numbers: "43 + 12 - 44"
    program: str  # the program as the model wrote it (up to the closing fence)
    answer_name: str  # the variable read: "answer", the printed one, or the last assigned


def question_numbers(question: str) -> frozenset[Fraction]:
    """The numbers a question states, in digits or words ("five", "twice", "a dozen")."""
    text = number_words_to_digits(question.lower().replace(",", ""))
    for word, digits in _WORD_NUMBERS.items():
        text = re.sub(rf"\b{word}\b", f" {digits} ", text)
    return frozenset(Fraction(found) for found in _NUMBER.findall(text))


def program_text(written: str) -> str:
    """The code the model wrote, up to its closing fence; ToolRefused when it never closed the block (cut
    short by the token budget or the deadline, or turned into a function or a loop: PROGRAM_STOPS)."""
    if PROGRAM_END not in written:
        last = written.rstrip().rsplit("\n", 1)[-1]
        raise ToolRefused(
            "unfinished", f"the model's program did not end with its code block (last line {last[:60]!r})"
        )
    return written.split(PROGRAM_END)[0]


def evaluate_program(written: str, question: str) -> ProgramAnswer:
    """Run a model-written program as arithmetic and check it against the question; ToolRefused when it is
    not a straight-line arithmetic program, uses a number the question does not state, or answers badly."""
    code = program_text(written)
    try:
        statements = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ToolRefused("not_a_program", f"the model's program does not parse ({err}): {code[:80]!r}") from None
    if not statements:
        raise ToolRefused("not_a_program", "the model wrote no program")
    if len(statements) > MAX_STATEMENTS:
        raise ToolRefused(
            "not_a_program", f"the model's program has {len(statements)} statements; at most {MAX_STATEMENTS}"
        )
    allowed = question_numbers(question)
    names: dict[str, str] = {}  # variable -> its flat expression over the question's numbers
    printed: str | None = None
    last: str | None = None
    for statement in statements:
        target, value = _assignment(statement, names)
        if target is None:  # print(x)
            printed = value
            continue
        names[target], last = value, target
    chosen = "answer" if "answer" in names else printed or last
    if chosen is None:
        raise ToolRefused("no_answer", "the model's program assigns nothing")
    flat = names.get(chosen, chosen)
    return _checked_answer(ProgramAnswer(_value(flat), flat, code, chosen), allowed, question)


def _assignment(statement: ast.stmt, names: dict[str, str]) -> tuple[str | None, str]:
    """(target, flat expression) of `x = ...` / `x += ...`, or (None, the name) of `print(name)`."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id, _flat(statement.value, names)
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
        name = statement.target.id
        if name not in names:
            raise ToolRefused("not_a_program", f"the model's program updates {name!r} before assigning it")
        update = ast.BinOp(ast.Name(name), statement.op, statement.value)
        return name, _flat(update, names)
    if (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and isinstance(statement.value.func, ast.Name)
        and statement.value.func.id == "print"
        and len(statement.value.args) == 1
        and isinstance(statement.value.args[0], ast.Name)
        and statement.value.args[0].id in names
    ):
        return None, statement.value.args[0].id
    line = ast.unparse(statement)[:60]
    raise ToolRefused("not_a_program", f"the model's program has {line!r}: only `name = arithmetic` and print(name)")


_ARITHMETIC_NODES = (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.operator, ast.unaryop, ast.expr_context)


def _flat(node: ast.expr, names: dict[str, str]) -> str:
    """The expression with every name replaced by its own expression, parenthesised where it is compound."""
    foreign = next((n for n in ast.walk(node) if not isinstance(n, _ARITHMETIC_NODES)), None)
    if foreign is not None:
        shown = ast.unparse(foreign)[:60] if isinstance(foreign, ast.expr) else type(foreign).__name__
        raise ToolRefused(
            "not_arithmetic", f"the model's program computes {shown!r}: only numbers, names and + - * / // % **"
        )

    class Inline(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            if name.id not in names:
                raise ToolRefused("not_a_program", f"the model's program reads {name.id!r} before assigning it")
            return ast.parse(names[name.id], mode="eval").body

    flat = ast.unparse(Inline().visit(node))
    if len(flat) > MAX_FLAT_CHARS:
        raise ToolRefused("not_a_program", f"the model's program computes an expression of {len(flat)} characters")
    return flat


def _value(expression: str) -> Number:
    try:
        return calculate(expression)
    except InputError as err:  # a name-free expression the calculator refuses: a call, a string, 1/0
        raise ToolRefused("not_arithmetic", f"the model's program is not plain arithmetic: {err}") from None


def _checked_answer(answer: ProgramAnswer, allowed: frozenset[Fraction], question: str) -> ProgramAnswer:
    used = [Fraction(ast.unparse(n)) for n in ast.walk(ast.parse(answer.expression, mode="eval")) if _is_number(n)]
    invented = sorted({u for u in used if u not in allowed and u not in FREE_CONSTANTS})
    if invented:
        shown = ", ".join(format_number(n) for n in invented)
        raise ToolRefused("invented_number", f"the model's program uses {shown}, which the question does not state")
    if sum(u in allowed for u in used) < 2:
        raise ToolRefused(
            "too_simple", f"the model's answer {answer.expression!r} uses fewer than two of the question's numbers"
        )
    if _COUNT_QUESTION.search(question):
        value = Fraction(answer.value) if not isinstance(answer.value, float) else None
        if value is None or value < 0 or value.denominator != 1:
            shown = format_number(answer.value)
            raise ToolRefused("not_a_count", f"the question asks how many, and the model's program answers {shown}")
    return answer


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def program_evidence(answer: ProgramAnswer, scratch_tokens: int) -> Evidence:
    """Evidence worded as the calculator's ("The answer is V."): the arithmetic is verified, the setup is the
    model's, so its confidence stays below a computation the user stated."""
    value_text = format_number(answer.value)
    return tool_evidence(
        "program",
        claim=f"{answer.expression} = {value_text}",
        evidence=f"The answer is {value_text}.",
        tool_input=answer.program,
        output=value_text,
        sandbox="ast",
        confidence=0.8,
        expression=answer.expression,
        answer_name=answer.answer_name,
        scratch_tokens=scratch_tokens,
        field="program",
    )


def is_word_problem(query: Query) -> bool:
    """A question worth a program: it states at least two numbers and asks for a computed one."""
    return query.span_class == "computable" and len(question_numbers(query.question)) >= 2

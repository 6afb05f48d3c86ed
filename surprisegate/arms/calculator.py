"""The calculator (Act): bounded arithmetic, found in text and evaluated exactly.

`extract_computation` turns text such as "What is 37 times 48?" into "37 * 48"; `calculate` evaluates it
with an AST walker that only knows numbers and arithmetic operators, refusing anything whose result would
be huge before computing it; `CalculatorTool` wraps both as an `Arm` whose evidence is `observable: 1.0`.
`format_number` shows a result (the units tool uses it too). The router asks `extract_computation` whether a
span is computable; `ToolArm` (arms/tools.py) runs the calculator among the other tools.
"""

from __future__ import annotations

import ast
import math
import re
import time
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction
from typing import cast

from surprisegate.arms import Evidence, Query
from surprisegate.errors import ArmError, InputError

Number = int | Fraction | float

# Bounds that keep every evaluation fast: results beyond 10**300 are refused before they are computed.
MAX_EXPRESSION_CHARS = 500
MAX_RESULT_DIGITS = 300
MAX_RESULT = 10**MAX_RESULT_DIGITS
SIGNIFICANT_DIGITS = 6  # non-terminating quotients are shown rounded, e.g. 1/3 -> 0.333333

ALLOWED_SUMMARY = "only numbers, + - * / // % ** and parentheses are allowed"

_BINARY_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY_OPERATORS = (ast.UAdd, ast.USub)
# Refused operators, spelled as the user wrote them for the error message.
_REFUSED_OPERATOR_SYMBOLS = {
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitAnd: "&",
    ast.BitXor: "^ (bitwise xor; use ** for powers)",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


# --------------------------------------------------------------------------------------------------
# calculate


def calculate(expression: str) -> Number:
    """Evaluate an arithmetic expression exactly and return int, Fraction (exact quotient) or float.

    Integer and decimal arithmetic is exact (decimals are read as fractions, so 0.1 + 0.2 == 3/10); only a
    non-integer exponent (16 ** 0.5) yields a float. Raises `InputError` for anything that is not plain
    arithmetic, for division by zero and for results larger than 10**300.
    """
    if not isinstance(expression, str):
        raise InputError(f"expression {_shown(expression)}: must be a string; {ALLOWED_SUMMARY}")
    text = expression.strip()
    if not text:
        raise InputError(f"expression {_shown(expression)} is empty; give arithmetic such as '37 * 48'")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InputError(f"expression of {len(text)} characters is too long; keep it under {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise InputError(
            f"expression {_shown(expression)} is not valid arithmetic ({err}); {ALLOWED_SUMMARY}"
        ) from None
    try:
        value = _evaluate(tree.body, expression)
    except RecursionError:
        raise InputError(f"expression {_shown(expression)} is nested too deeply; simplify it") from None
    return _normalise(value)


def _shown(expression: object) -> str:
    """The expression quoted for an error message, cut short so a long input cannot flood the log."""
    text = repr(expression)
    return text if len(text) <= 80 else text[:76] + "...'"


def _evaluate(node: ast.AST, expression: str) -> Number:
    if isinstance(node, ast.Constant):
        return _constant(node.value, expression)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY_OPERATORS):
        operand = _evaluate(node.operand, expression)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINARY_OPERATORS):
        left = _evaluate(node.left, expression)
        right = _evaluate(node.right, expression)
        return _checked(_apply(type(node.op), left, right, expression), expression)
    raise InputError(f"expression {_shown(expression)} contains {_describe_node(node)}; {ALLOWED_SUMMARY}")


def _constant(value: object, expression: str) -> Number:
    # bool is an int subclass and `True` parses as a constant; neither is arithmetic input.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"expression {_shown(expression)} contains the constant {value!r}; {ALLOWED_SUMMARY}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"expression {_shown(expression)} contains a number too large to handle")
        return Fraction(repr(value))  # the literal as written: 0.1 stays exactly 1/10
    return _checked(value, expression)


def _apply(op: type, left: Number, right: Number, expression: str) -> Number:
    if op is ast.Pow:
        return _power(left, right, expression)
    if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise InputError(f"expression {_shown(expression)} divides by zero; change the divisor")
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    if op is ast.Div:
        if isinstance(left, float) or isinstance(right, float):
            return left / right
        return Fraction(left) / Fraction(right)
    if op is ast.FloorDiv:
        return left // right
    return left % right


def _power(base: Number, exponent: Number, expression: str) -> Number:
    exponent = _normalise(exponent)
    base = _normalise(base)
    if base == 0 and exponent < 0:
        raise InputError(f"expression {_shown(expression)} raises zero to a negative power (division by zero)")
    if exponent == 0:
        return 1
    if base in (0, 1):
        return base
    if base == -1 and isinstance(exponent, int):
        return 1 if exponent % 2 == 0 else -1
    # Estimate the size of the result from logarithms before computing it: 9**9**9 is refused here.
    magnitude = cast(Number, abs(base))  # typeshed's abs() of a union is `object`
    log10_result = abs(float(exponent)) * abs(_log10(magnitude))
    if log10_result > MAX_RESULT_DIGITS:
        raise InputError(
            f"expression {_shown(expression)} would produce a number with about {log10_result:.3g} digits; "
            f"results are limited to {MAX_RESULT_DIGITS} digits"
        )
    if isinstance(exponent, int):
        # Through Fraction so 2 ** -3 is exactly 1/8, not the float 0.125.
        return base**exponent if isinstance(base, float) else Fraction(base) ** exponent
    if base < 0:
        raise InputError(f"expression {_shown(expression)} takes a fractional power of a negative number")
    return float(base) ** float(exponent)


def _log10(value: Number) -> float:
    # math.log10 takes ints of any size; a Fraction is split because float() of it may overflow.
    if isinstance(value, Fraction):
        return math.log10(value.numerator) - math.log10(value.denominator)
    return math.log10(value)


def _checked(value: Number, expression: str) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(
            f"expression {_shown(expression)} overflows; results are limited to {MAX_RESULT_DIGITS} digits"
        )
    # Fractions with huge denominators are as costly as huge integers, so bound both parts.
    parts = (value.numerator, value.denominator) if isinstance(value, Fraction) else (value,)
    if any(abs(part) > MAX_RESULT for part in parts):
        raise InputError(
            f"expression {_shown(expression)} produces a number over {MAX_RESULT_DIGITS} digits; use smaller operands"
        )
    return value


def _normalise(value: Number) -> Number:
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    return value


def _describe_node(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return f"the attribute access '.{node.attr}'"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {_REFUSED_OPERATOR_SYMBOLS.get(type(node.op), type(node.op).__name__)}"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    return f"a Python {type(node).__name__} node"


# --------------------------------------------------------------------------------------------------
# format_number


def format_number(x: Number) -> str:
    """Render a number for people and for the model: 1776, 3.5, -0.25, 0.333333, 33.3333, 1.5e-9.

    Integers (and integral fractions or floats) print in full without ".0"; other values are rounded to 6
    significant digits (keeping at least one decimal: 1000000/3 -> 333333.3), below 1e-6 in e-notation.
    """
    if isinstance(x, bool):
        raise InputError(f"format_number got the boolean {x!r}; pass an int, Fraction or float")
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        x = Fraction(repr(x))  # the shortest repr, so 0.1 + 0.2 shows as 0.3 after rounding
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return str(x.numerator)
        return _format_fraction(x)
    if isinstance(x, int):
        return str(x)
    raise InputError(f"format_number got {x!r} of type {type(x).__name__}; pass an int, Fraction or float")


def _format_fraction(x: Fraction) -> str:
    integer_digits = len(str(abs(x.numerator) // x.denominator))
    with localcontext() as context:
        context.prec = integer_digits + 2 * SIGNIFICANT_DIGITS + 10
        context.rounding = ROUND_HALF_EVEN
        exact = Decimal(x.numerator) / Decimal(x.denominator)
        leading = exact.adjusted()  # position of the first significant digit: 0 for 3.5, -1 for 0.33
        if leading < -SIGNIFICANT_DIGITS:  # 1e-7 and smaller: scientific, or the digits drown in zeros
            mantissa, _, exponent = format(exact, f".{SIGNIFICANT_DIGITS - 1}e").partition("e")
            return f"{_strip_zeros(mantissa)}e{int(exponent)}"
        # Six significant digits, but at least one decimal so a rounded value never looks like an integer.
        last_place = min(leading - SIGNIFICANT_DIGITS + 1, -1)
        rounded = exact.quantize(Decimal(1).scaleb(last_place))
    text = _strip_zeros(format(rounded, "f"))
    return "0" if text == "-0" else text


def _strip_zeros(decimal_text: str) -> str:
    return decimal_text.rstrip("0").rstrip(".") if "." in decimal_text else decimal_text


def is_exactly_shown(x: Number) -> bool:
    """True when `format_number(x)` is the exact value (no rounding happened)."""
    if isinstance(x, float):
        x = Fraction(repr(x))
    if isinstance(x, int):
        return True
    return Fraction(format_number(x)) == x


# --------------------------------------------------------------------------------------------------
# extract_computation

_NUMBER = r"-?\d+(?:\.\d+)?"
# An operand in a phrase template: a number, or a group an earlier template already produced.
_OPERAND = rf"(?:{_NUMBER}|\([^()]*\))"

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split()
)
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER_WORDS = {word: value for value, word in enumerate(_UNITS)}
_NUMBER_WORDS.update({word: 20 + 10 * i for i, word in enumerate(_TENS)})

# Phrase templates, applied repeatedly (innermost first) until none match. Each becomes a parenthesised
# symbolic group so later templates and the tokenizer see plain arithmetic.
_TEMPLATES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"({_NUMBER})\s*(?:%|percent|per\s+cent)\s+of\s+({_OPERAND})"), r"(\1 / 100 * \2)"),
    (
        re.compile(rf"(?:the\s+)?remainder\s+(?:when|of)\s+({_OPERAND})\s+(?:is\s+)?divided\s+by\s+({_OPERAND})"),
        r"(\1 % \2)",
    ),
    (re.compile(rf"(?:the\s+)?sum\s+of\s+({_OPERAND})\s+and\s+({_OPERAND})"), r"(\1 + \2)"),
    (re.compile(rf"(?:the\s+)?product\s+of\s+({_OPERAND})\s+and\s+({_OPERAND})"), r"(\1 * \2)"),
    (re.compile(rf"(?:the\s+)?difference\s+(?:between|of)\s+({_OPERAND})\s+and\s+({_OPERAND})"), r"(\1 - \2)"),
    (re.compile(rf"(?:the\s+)?quotient\s+of\s+({_OPERAND})\s+and\s+({_OPERAND})"), r"(\1 / \2)"),
    (re.compile(rf"\badd\s+({_OPERAND})\s+(?:and|to)\s+({_OPERAND})"), r"(\1 + \2)"),
    (re.compile(rf"\bsubtract\s+({_OPERAND})\s+from\s+({_OPERAND})"), r"(\2 - \1)"),
    (re.compile(rf"\bmultiply\s+({_OPERAND})\s+(?:by|and|with)\s+({_OPERAND})"), r"(\1 * \2)"),
    (re.compile(rf"\bdivide\s+({_OPERAND})\s+by\s+({_OPERAND})"), r"(\1 / \2)"),
    (re.compile(rf"({_OPERAND})\s+more\s+than\s+({_OPERAND})"), r"(\2 + \1)"),
    (re.compile(rf"({_OPERAND})\s+less\s+than\s+({_OPERAND})"), r"(\2 - \1)"),
    (re.compile(rf"(?:the\s+)?square\s+root\s+of\s+({_OPERAND})"), r"(\1 ** 0.5)"),
    (re.compile(rf"(?:the\s+)?square\s+of\s+({_OPERAND})"), r"(\1 ** 2)"),
    (re.compile(rf"(?:the\s+)?cube\s+of\s+({_OPERAND})"), r"(\1 ** 3)"),
    (re.compile(rf"\bhalf\s+of\s+({_OPERAND})"), r"(\1 / 2)"),
    (re.compile(rf"\b(?:twice|double)\s+({_OPERAND})"), r"(2 * \1)"),
    (re.compile(rf"\btriple\s+({_OPERAND})"), r"(3 * \1)"),
]

# Operator words and the symbol each stands for; postfix words are handled separately below.
_OPERATOR_WORDS: list[tuple[str, str]] = [
    (r"multiplied\s+by", "*"),
    (r"divided\s+by", "/"),
    (r"(?:raised\s+)?to\s+the\s+power\s+of", "**"),
    (r"times", "*"),
    (r"plus", "+"),
    (r"minus", "-"),
    (r"over", "/"),
    (r"mod(?:ulo)?", "%"),
    (r"x", "*"),
]
_POSTFIX_EXPONENTS = {"squared": "2", "cubed": "3"}
_TOKEN = re.compile(
    "|".join(
        [r"(?P<num>\d+(?:\.\d+)?|\.\d+)"]
        + [rf"(?P<word_op{i}>\b{pattern}\b)" for i, (pattern, _) in enumerate(_OPERATOR_WORDS)]
        + [r"(?P<postfix>\b(?:squared|cubed)\b)"]
        + [r"(?P<sym>\*\*|//|[-+*/%()])", r"(?P<space>\s+)", r"(?P<other>[a-z_']+|.)"]
    )
)
# Operators that only count between two operands ("x" in "solve for x", "over" in "over the summer").
_INFIX_ONLY_WORDS = {"x", "over"}

# Dates, times and versions look like arithmetic ("2024-01-05", "1/2/2024", "11 December 1933 - 2 November
# 2013") but are not; they are replaced by "~", which is never an operator, so it breaks operator runs.
_MONTH = (
    r"(?:january|february|march|april|may|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?"
)
_ORDINAL = r"(?:st|nd|rd|th)?"
_NOT_ARITHMETIC = re.compile(
    r"\b\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}\b"  # 2024-01-05, 1/2/2024, 3.11.7
    r"|\b\d{1,2}:\d{2}\b"  # 10:30
    rf"|(?:\b\d{{1,4}}{_ORDINAL}\s+)?\b{_MONTH}(?=\s|,|$)"  # 11 December, 3rd May
    rf"(?:\s+\d{{1,4}}{_ORDINAL}\b)?(?:,?\s+\d{{4}}\b)?"  # December 11, 1933
)
# In prose a dash or slash glued between digits is a range, score or season ("1844-1846", "6-4", "1895/96");
# only a text that is nothing but a computation asked for ("What is 12-7?", "12-7=") reads it as arithmetic.
_GLUED_RANGE = re.compile(r"(?<=\d)[-/–—](?=\d)")
_YEAR_RANGE = re.compile(r"(?<![\d.])(1\d{3}|20\d{2})\s+[-–—]\s+(1\d{3}|20\d{2})(?![\d.])")  # "1866 - 1929"
_ASKED_COMPUTATION = re.compile(
    r"^\s*(?:what\s+is|what's|calculate|compute|evaluate|solve)\s*:?\s+[\d\s.,+\-–—*/×÷^%()x]+[?=.!]*\s*$"
    r"|^[\d\s.,+\-–—*/×÷^%()x]+(?:\?|=)\s*$"
)
# Names are never numbers: a word with a letter right before a digit ("h2o", "gpt4", "6x78nhyq"), or
# digits glued to a word by - _ / . ("gpt-4", a temp folder "attack-12x34567", once read as "-12 * 34567").
# "37x48" on its own stays a product.
_IDENTIFIER = re.compile(
    r"\b(?!\d+(?:x\d+)+\b)(?=[a-z0-9_]*[a-z_]\d)[a-z0-9_]+\b|(?<=[a-z_][-/._])(?=[a-z_]*\d)[a-z0-9_]+"
)
MAX_RUN_TOKENS_TO_TRIM = 40
MAX_RUN_TOKENS = 150
MAX_PARSES_PER_TEXT = 2000  # bounds extraction time on long adversarial text (about 50 ms)
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def extract_computation(text: str) -> str | None:
    """Turn arithmetic stated in text into a Python-style expression, or None when none is stated.

    "What is 37 times 48?" -> "37 * 48"; "the sum of 3 and 4" -> "3 + 4"; "15% of 80" -> "15 / 100 * 80";
    "What is 12 * (3 + 4)?" -> "12 * (3 + 4)". Word problems that leave the operations implicit give None.
    The result always parses; it may still be refused by `calculate` (division by zero, huge powers).
    """
    if not text or not text.strip():
        return None
    normalised = _normalise_text(text)
    tokens = _tokenize(normalised)
    best: tuple[int, str] | None = None  # (operator count, expression)
    parses_left = MAX_PARSES_PER_TEXT
    runs = _operator_runs(tokens)
    # Last run first: questions end with the ask, so that is where the parse budget is spent.
    for position in reversed(range(len(runs))):
        found, parses_used = _longest_expression(runs[position], parses_left)
        parses_left -= parses_used
        if found is not None:
            expression, operator_count = found
            # The run with the most operators wins; ties go to the later one.
            if best is None or operator_count > best[0]:
                best = (operator_count, expression)
        if parses_left <= 0:
            break
    return None if best is None else best[1]


def _normalise_text(text: str) -> str:
    text = text.lower()
    if not _ASKED_COMPUTATION.match(text):
        text = _GLUED_RANGE.sub(" ~ ", text)
        text = _YEAR_RANGE.sub(" ~ ", text)
    for fancy, plain in (("×", " * "), ("÷", " / "), ("−", "-"), ("–", "-"), ("^", " ** "), ("·", " * ")):
        text = text.replace(fancy, plain)
    text = _NOT_ARITHMETIC.sub(" ~ ", text)  # "~" is never an operator token, so it breaks runs
    text = _THOUSANDS_SEPARATOR.sub("", text)
    text = re.sub(r"\$(?=\d)", "", text)  # "$5 plus $3"
    text = number_words_to_digits(text)
    text = re.sub(r"\bnegative\s+(?=\d)", "-", text)
    text = _IDENTIFIER.sub(" ~ ", text)
    text = re.sub(r"(?<=\d)x(?=\d)", " * ", text)  # "37x48"; \b does not separate digits from letters
    for _ in range(10):  # templates nest at most a few levels in real questions
        changed = text
        for pattern, replacement in _TEMPLATES:
            changed = pattern.sub(replacement, changed)
        if changed == text:
            break
        text = changed
    return text


_NUMBER_WORD = re.compile(
    rf"\b(?:(?P<tens>{'|'.join(_TENS)})(?:[-\s](?P<ones>{'|'.join(_UNITS[1:10])}))?"  # twenty, twenty-one
    rf"|(?P<single>{'|'.join(_UNITS)}))\b"  # zero .. nineteen
)


def number_words_to_digits(text: str) -> str:
    """ "five" -> "5", "twenty-one" -> "21"; larger number words are left alone."""

    def to_digits(match: re.Match[str]) -> str:
        if match.group("single"):
            return str(_NUMBER_WORDS[match.group("single")])
        ones = match.group("ones")
        return str(_NUMBER_WORDS[match.group("tens")] + (_NUMBER_WORDS[ones] if ones else 0))

    return _NUMBER_WORD.sub(to_digits, text)


def _tokenize(text: str) -> list[tuple[str, str]]:
    """Split into ("num"|"op"|"paren"|"word", text) tokens; whitespace is dropped."""
    tokens: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        value = match.group()
        if kind == "space":
            continue
        if kind == "num":
            tokens.append(("num", _canonical_number(value)))
        elif kind.startswith("word_op"):
            symbol = _OPERATOR_WORDS[int(kind.removeprefix("word_op"))][1]
            tokens.append(("infix" if value in _INFIX_ONLY_WORDS else "op", symbol))
        elif kind == "postfix":  # "5 squared" -> 5 ** 2
            tokens.extend([("op", "**"), ("num", _POSTFIX_EXPONENTS[value])])
        elif kind == "sym":
            tokens.append(("paren" if value in "()" else "op", value))
        else:
            tokens.append(("word", value))
    # "x" and "over" are operators only between operands; elsewhere they are ordinary words.
    for i, (kind, value) in enumerate(tokens):
        if kind == "infix":
            before = tokens[i - 1] if i > 0 else ("word", "")
            after = tokens[i + 1] if i + 1 < len(tokens) else ("word", "")
            is_between = before[0] == "num" or before[1] == ")"
            is_between = is_between and (after[0] == "num" or after[1] in ("(", "-", "+"))
            tokens[i] = ("op", value) if is_between else ("word", value)
    return tokens


def _canonical_number(text: str) -> str:
    # "007" is a syntax error in Python and ".5" reads oddly in a receipt: write numbers plainly.
    if "." in text:
        whole, _, fraction = text.partition(".")
        return f"{int(whole or '0')}.{fraction}"
    return str(int(text))


def _operator_runs(tokens: list[tuple[str, str]]) -> list[list[str]]:
    """Maximal stretches of numbers, operators and parentheses, split at any ordinary word."""
    runs: list[list[str]] = []
    current: list[str] = []
    for kind, value in tokens:
        if kind == "word":
            if current:
                runs.append(current)
            current = []
        else:
            current.append(value)
    if current:
        runs.append(current)
    return runs


def _longest_expression(run: list[str], max_parses: int) -> tuple[tuple[str, int] | None, int]:
    """The longest slice of `run` that parses and holds a binary operator, with its operator count.

    Returns (found or None, parses used); gives up after `max_parses` attempts.
    """
    # A run longer than any expression `calculate` accepts is not a computation a person stated.
    if len(run) < 3 or len(run) > MAX_RUN_TOKENS:
        return None, 0
    # Trimming a long run costs quadratically many parses; real questions have short runs.
    shortest = 3 if len(run) <= MAX_RUN_TOKENS_TO_TRIM else len(run)
    parses = 0
    for length in range(len(run), shortest - 1, -1):
        for start in range(len(run) - length + 1):
            if parses >= max_parses:
                return None, parses
            parses += 1
            candidate = " ".join(run[start : start + length])
            try:
                tree = ast.parse(candidate, mode="eval")
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            operator_count = sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))
            if operator_count:
                return (ast.unparse(tree), operator_count), parses
    return None, parses


# --------------------------------------------------------------------------------------------------
# the arm


class CalculatorTool:
    """Arm that grounds arithmetic: finds the computation in the span, sentence or question and evaluates it."""

    name = "tool"

    def ground(self, query: Query, deadline: float) -> list[Evidence]:
        """Return one verified result, [] when nothing is computed, or raise ArmError when evaluation fails.

        The span (the model's doubtful answer) is tried first, then the sentence so far, then the question,
        which usually states the computation.
        """
        if time.monotonic() > deadline:
            raise ArmError("calculator: the round's deadline passed before it could run")
        failures: list[str] = []
        for field_name in ("span", "sentence", "question"):
            expression = extract_computation(getattr(query, field_name) or "")
            if expression is None:
                continue
            try:
                value = calculate(expression)
            except InputError as err:
                failures.append(f"{field_name}: {err}")
                continue  # a later field may still state a computation that works
            return [self._evidence(expression, value, field_name)]
        if failures:
            raise ArmError("calculator could not evaluate the computation it found: " + "; ".join(failures))
        return []

    @staticmethod
    def _evidence(expression: str, value: Number, field_name: str) -> Evidence:
        value_text = format_number(value)
        exact = is_exactly_shown(value)
        # Say "about" when the shown value is rounded, so the model is not fed a false equality. The injected
        # text is only "The answer is V.": small models copy it as their reply, which then ends with the
        # number. With the operands in it they write "V is the answer to A plus B" (30 BIG-bench items of
        # arith_dev: 1.00 correct vs 0.77; "A times B is V." alone: 0.60 on 20). The claim keeps the operands.
        verb = "is" if exact else "is about"
        return Evidence(
            claim=f"{expression} = {value_text}",
            evidence=f"The answer {verb} {value_text}.",
            confidence=1.0,
            source="tool:calculator",
            observable=1.0,
            # "ast": evaluated in-process by the AST walker above, which knows only numbers and operators.
            detail={
                "tool": "calculator",
                "input": expression,
                "output": value_text,
                "sandbox": "ast",
                "exact": exact,
                "field": field_name,
            },
        )

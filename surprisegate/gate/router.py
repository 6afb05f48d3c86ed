"""Router: classify a doubtful span (which arms ask, in what order, is the config's: grounding.arm_order).

Pure and deterministic: the same span and context always give the same `Route`, and `Route.rule` names
the rule that fired (with the field it fired on, e.g. "arithmetic@question") so a receipt can say why.

Classes (DESIGN.md §2b):
- computable: arithmetic, date math, unit conversion, code, file contents, live status; a tool can settle it.
- entity: named entities, numbers, dates; memory or the web can settle it.
- other: everything else.

Which tool, with what input, is the tool arm's own question (`arms.tools.extract_tool_calls`); the router
only asks the tools' own extractors whether a span is computable, so it imports them and never the arm.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from surprisegate.arms import files, status, units
from surprisegate.arms.calculator import extract_computation
from surprisegate.gate.signals import asks_yes_or_no
from surprisegate.text import NOT_NAMES

logger = logging.getLogger(__name__)

SPAN_CLASSES = ("computable", "entity", "other")


@dataclass(frozen=True)
class Route:
    span_class: str  # "computable" | "entity" | "other"
    rule: str  # the rule that fired and the field it fired on, e.g. "date_math@question"


# --------------------------------------------------------------------------------------------------
# computable rules: each takes one text (span, sentence or question) and says whether it matches.
# Repetitions are bounded ({0,4}) so that no pattern goes quadratic on a long reply.


def _followed_by(first: str, then: str) -> Callable[[str], bool]:
    """Match `first` and, somewhere after it, `then`: linear time, where a regex `first.*then` is quadratic."""
    first_pattern = re.compile(first, re.IGNORECASE)
    then_pattern = re.compile(then, re.IGNORECASE)

    def matches(text: str) -> bool:
        found = first_pattern.search(text)
        return bool(found and then_pattern.search(text, found.end()))

    return matches


def _searches(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern, re.IGNORECASE)
    return lambda text: compiled.search(text) is not None


def _any_of(*predicates: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda text: any(predicate(text) for predicate in predicates)


_TIME_UNIT = r"(?:days?|weeks?|months?|years?|hours?|minutes?)"
_is_date_math = _any_of(
    _searches(
        rf"\b{_TIME_UNIT}\s+(?:between|until|till|since|from\s+now|ago|before|after|left)\b"
        r"|\bday\s+of\s+the\s+week\b"
        r"|\bwhat\s+day\s+(?:is|was|will)\b"
        r"|\bhow\s+long\s+(?:ago|until|since|before|after)\b"
        rf"|\bwhat\s+(?:date|day)\s+(?:is|was|will\s+be)\s+\d+\s+{_TIME_UNIT}\b"
        rf"|\b\d+\s+{_TIME_UNIT}\s+(?:after|before|from)\b"
        r"|\btoday'?s\s+date\b|\bcurrent\s+date\b|\bwhat\s+(?:date|day)\s+is\s+it\b"
        r"|\bwhat(?:'s|\s+is)\s+the\s+date\s+(?:today|now)\b"
    ),
    _followed_by(
        rf"\bhow\s+(?:many|much)\s+(?:{_TIME_UNIT}|time)\b",
        r"\b(?:until|till|since|between|before|after|ago|left|from)\b",
    ),
    _followed_by(r"\bhow\s+old\s+(?:was|is|will|would)\b", r"\b(?:in|on|by)\s+\d{4}\b"),
)

_is_code = _any_of(
    _searches(
        r"`[^`]+`"  # inline code or a fenced block
        r"|^\s*>>>"  # an interpreter prompt
        # a call such as sorted([3, 1, 2]) or math.sqrt(2), but not the plural marker in "friend(s)"
        r"|\b(?:[a-z_][a-z0-9_]*\.){0,4}[a-z_][a-z0-9_]*\((?!e?s\))(?:[^()]|\([^()]{0,200}\)){0,200}\)"
        r"|\b(?:in|using)\s+(?:python|javascript|bash|sql)\b"
    ),
    # "what does x[0] return": the subject must look like code (brackets, dots, underscores, operators)
    _followed_by(
        r"\bwhat\s+(?:does|will|would)\s+\S*[][()._=+*/<>]", r"\b(?:return|print|output|evaluate\s+to|raise)\b"
    ),
)

_PATH = files.PATH_PATTERN  # /etc/hosts, ./data/notes.txt, config.toml: the file tool's own notion of a path
_is_file_contents = _any_of(
    _followed_by(
        r"\b(?:contents?\s+of|what(?:'s|\s+is)\s+in(?:side)?|inside|read|open|cat|show(?:\s+me)?|lines?\s+of)\b",
        rf"{_PATH}|\bfile\b",
    ),
    _searches(
        r"\bfile\s+contents?\b"
        rf"|\bwhat\s+does\s+(?:the\s+file\s+)?{_PATH}\s+(?:say|contain)\b"
        rf"|\b(?:contains?|in)\s+(?:the\s+file\s+)?{_PATH}"
    ),
)

_has_host = _searches(
    r"https?://\S+|\blocalhost\b|\b\d{1,3}(?:\.\d{1,3}){3}\b"
    r"|\b[a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63}){0,4}\.(?:com|org|net|io|dev|ai|edu|gov|co|uk|de|fr|app|info|me)\b"
    r"|\bports?\s+\d{1,5}\b"
)
_has_status_word = _searches(status.STATUS_WORDS)

_NUMBER_TOKEN = re.compile(
    r"\b\d+(?:[.,]\d+)*\b|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
    r"forty|fifty|hundred|dozen)\b",
    re.IGNORECASE,
)
# Word problems ask for a quantity built from several numbers without stating the operations.
_asks_for_a_quantity = _any_of(
    _searches(
        r"\bhow\s+(?:many|much)\b"
        r"|\bin\s+total\b|\btotal\b|\baltogether\b|\bin\s+all\b(?!\s+of)|\bleft\s+over\b|\bremain(?:ing|s)?\b"
        r"|\beach\b|\bper\b|\baverage\b|\bcombined\b"
    ),
    _followed_by(r"\bhow\s+long\s+(?:would|will|does|did|do|can)\b", r"\b(?:take|last)\b"),
)


def _is_arithmetic(text: str) -> bool:
    # The same extractor the calculator uses, so "computable" means the tool can actually compute it.
    return extract_computation(text) is not None


def _is_word_problem(text: str) -> bool:
    return _asks_for_a_quantity(text) and len(_NUMBER_TOKEN.findall(text)) >= 2


_COMPUTABLE_RULES: list[tuple[str, Callable[[str], bool]]] = [
    ("file_contents", _is_file_contents),
    ("live_status", lambda text: _has_host(text) and _has_status_word(text)),
    ("code", _is_code),
    ("date_math", _is_date_math),
    ("unit_conversion", units.looks_like_conversion),
    ("arithmetic", _is_arithmetic),
    ("word_problem", _is_word_problem),
]


# --------------------------------------------------------------------------------------------------
# entity rules

# Words that commonly open a request; a question's first capitalised word names something unless it is one.
_REQUEST_OPENERS = set(
    """tell give list explain describe define compare summarize summarise write name find show calculate compute
    evaluate solve translate suggest help consider imagine assume suppose given according after before during
    since because although while today yesterday tomorrow now one some many most all every each other another
    """.split()
)
_CAPITALISED_WORD = re.compile(r"\b[A-Z][\w'’.-]*")

_ENTITY_QUESTION = re.compile(
    r"\b(?:who|whom|whose|when|where|which)\b"
    r"|\bwhat\s+(?:year|date|day|month|century|country|city|state|language|currency|continent)\b"
    r"|\bcapital\s+of\b|\bpopulation\b|\bcalling\s+code\b|\batomic\s+number\b|\bsymbol\s+for\b"
    r"|\bhow\s+(?:many|much|old|tall|long|far|big|high|deep|large)\b"
    r"|\b(?:born|died|founded|invented|discovered|wrote|written|directed|located|named|called|headquarters)\b",
    re.IGNORECASE,
)
_NUMBER_SHAPED = re.compile(
    r"\d|\b(?:hundred|thousand|million|billion|trillion|dozen|twenty|thirty|forty|fifty|sixty|seventy|eighty|"
    r"ninety|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b",
    re.IGNORECASE,
)
_MONTHS = "january february march april may june july august september october november december".split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_DATE_SHAPED = re.compile(
    rf"\b(?:{'|'.join(_MONTHS)}|(?:{'|'.join(_WEEKDAYS)})s?)\b|\b(?:century|decade|bc|bce|ad|ce)\b"
    r"|\b\d{4}-\d{2}-\d{2}\b|(?<![\d.,+-])\b(?:1[0-9]|20)\d{2}s?\b(?![.,]\d)",  # ISO dates, years
    re.IGNORECASE,
)


def _starts_a_sentence(text: str, index: int) -> bool:
    """True when only quotes, brackets and spaces stand between `index` and a sentence end (or the start)."""
    index -= 1
    while index >= 0 and text[index] in " \t\"'(“‘":
        index -= 1
    return index < 0 or text[index] in ".!?:;\n"


def _has_name(text: str, *, is_span: bool) -> bool:
    """True when text holds a capitalised word that names something ("Paris", not "The").

    A span is cut from the middle of the reply, so its first word counts. In a sentence or question a
    capitalised word at a sentence start counts too ("Estonia shares a border with") unless it is a common
    opener of requests ("Tell me", "Explain").
    """
    for match in _CAPITALISED_WORD.finditer(text):
        word = match.group().rstrip(".'’")
        if len(word) < 2 or word.lower() in NOT_NAMES:
            continue
        if is_span or not _starts_a_sentence(text, match.start()) or word.lower() not in _REQUEST_OPENERS:
            return True
    return False


def _span_entity_rule(span: str) -> str | None:
    if _DATE_SHAPED.search(span):
        return "date"
    if _NUMBER_SHAPED.search(span):
        return "number"
    if _has_name(span, is_span=True):
        return "named_entity"
    return None


def _context_entity_rule(text: str) -> str | None:
    if _ENTITY_QUESTION.search(text):
        return "entity_question"
    if _has_name(text, is_span=False):
        return "named_entity"
    if _DATE_SHAPED.search(text):
        return "date"
    if _NUMBER_SHAPED.search(text):
        return "number"
    return None


# --------------------------------------------------------------------------------------------------
# public API


def classify_span(span: str, question: str = "", sentence: str = "") -> tuple[str, str]:
    """Return (span_class, rule): "computable", "entity" or "other", and "<rule>@<field>" that decided it.

    Computable rules look at the span, then the sentence so far, then the question, because the span is often
    just the doubtful answer ("1776") while the question states the computation ("What is 37 times 48?").
    Entity rules then look at the span's own shape, then at the sentence and question.
    """
    fields = (("span", span or ""), ("sentence", sentence or ""), ("question", question or ""))
    for field_name, text in fields:
        if not text.strip():
            continue
        for rule_name, matches in _COMPUTABLE_RULES:
            if matches(text):
                return "computable", f"{rule_name}@{field_name}"
    span_rule = _span_entity_rule(span or "")
    if span_rule:
        return "entity", f"{span_rule}@span"
    for field_name, text in fields[1:]:
        context_rule = _context_entity_rule(text)
        if context_rule:
            return "entity", f"{context_rule}@{field_name}"
    return "other", "no_rule_matched"


# Closed questions name their possible answers: "Were X and Y founded in the same state?" (yes or no),
# "Who is older, X or Y?" (one of the two), "Between X and Y, who is older?" (one of the two, without "or").
_WH_WORD = re.compile(r"\b(?:how|what|which|who|whom|whose|when|where|why)\b", re.IGNORECASE)
_WH_START = re.compile(r"^\s*(?:which|who|whose|whom|what|where|when)\b", re.IGNORECASE)
_CHOICE_TAIL = re.compile(r"\sor\s(?P<tail>[^?]{1,80})\?\s*$", re.IGNORECASE)
# "Kurt Cobain or Dave Grohl, who was born first?": the options come before the question word.
_CHOICE_HEAD = re.compile(r"^\s*[^,?]{1,80}\sor\s[^,?]{1,80},\s*(?:which|who|whom|whose)\b", re.IGNORECASE)
# "Which country, France or Spain, borders ...?": the options stand in apposition to the question word.
_CHOICE_APPOSITION = re.compile(r"^\s*(?:which|who|what)\b[^,?]{0,40},\s*[^,?]{1,60}\sor\s[^,?]{1,60},", re.IGNORECASE)
# Comparisons that join their two options with "and": a pair, a question word asking for one of them,
# and a word that compares. "What is the connection between X and Y?" has no comparing word: it stays open.
_PAIR_WITH_AND = re.compile(
    r"\bbetween\s+[^,?]{1,80}?\s+and\s"  # "Between X and Y, who is older?", "Which is older between X and Y?"
    r"|^\s*of\s+[^,?]{1,80}?\s+and\s+[^,?]{1,80},"  # "Of X and Y, which ...?"
    r"|^\s*[^,?]{1,80}?\s+and\s+[^,?]{1,80},\s*(?:which|who)\b"  # "X and Y, which one is older?"
    r"|\b(?:which|who)\b[^?]{0,60}:\s*[^,?]{1,80}?\s+and\s+[^,?]{1,80}\?\s*$",  # "Who is older: X and Y?"
    re.IGNORECASE,
)
_ASKS_FOR_ONE = re.compile(r"\b(?:which|who|whom|whose)\b", re.IGNORECASE)
_COMPARING_WORD = re.compile(
    r"\b(?:older|oldest|younger|youngest|elder|taller|tallest|shorter|shortest|longer|longest|larger|largest|"
    r"smaller|smallest|bigger|biggest|higher|highest|lower|lowest|earlier|earliest|later|latest|first|last|"
    r"second|more|most|less|least|fewer|fewest|greater|greatest|heavier|heaviest|lighter|faster|fastest|slower|"
    r"newer|newest|closer|closest|farther|further|deeper|deepest|wider|widest|richer|richest|better|best|worse|"
    r"worst|both|same|either)\b",
    re.IGNORECASE,
)


def closed_question(question: str) -> str | None:
    """ "yes_no", "choice" or "comparison" when the question itself names its possible answers, else None.

    Grounding such a question with one snippet rarely settles it (a snippet about one of the two things
    compared), while the model's pick among the named answers is often right: on halueval_qa_dev
    (100 seeded items, three configurations) grounding them fixed 0-1 of 15 and broke 2-9.
    """
    if asks_yes_or_no(question) and question.rstrip().endswith("?") and not _WH_WORD.search(question):
        return "yes_no"
    if "?" not in question:
        return None
    choice = _CHOICE_TAIL.search(question)
    if choice and _WH_START.match(question) and len(choice.group("tail").split()) <= 8:
        return "choice"
    if _CHOICE_HEAD.search(question) or _CHOICE_APPOSITION.search(question):
        return "choice"
    if _PAIR_WITH_AND.search(question) and _ASKS_FOR_ONE.search(question) and _COMPARING_WORD.search(question):
        return "comparison"
    return None


def route(span: str, question: str = "", sentence: str = "") -> Route:
    """Classify the span; the decision is logged at DEBUG level. The arms it is asked of, and in what order,
    are the config's (`arm_order_computable`, `arm_order_other`; grounding.arm_order)."""
    span_class, rule = classify_span(span, question, sentence)
    logger.debug("route span=%r class=%s rule=%s", span, span_class, rule)
    return Route(span_class=span_class, rule=rule)

"""The router: span classes from deterministic rules, and arm orders filtered to the available arms."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.gate.router import Route, classify_span, route

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

# (span, question, sentence so far, expected class)
LABELLED_SPANS = [
    ("1776", "What is 37 times 48?", "", "computable"),
    ("109", "What is 80 plus 29?", "", "computable"),
    ("", "What is 12 * (3 + 4)?", "", "computable"),
    ("37 × 48 = 1,776", "", "", "computable"),
    ("12", "What is 15% of 80?", "", "computable"),
    ("25", "What is 5 squared?", "", "computable"),
    ("7", "What is the sum of 3 and 4?", "", "computable"),
    ("3.5", "What is 7 divided by 2?", "", "computable"),
    (
        "64",
        "A team had 12 members but 4 didn't show up. If each scored 8 points, how many points in total?",
        "",
        "computable",
    ),
    (
        "36",
        "Adam bought 13 boxes and gave 7 away. If each box has 6 pieces, how many pieces did he keep?",
        "",
        "computable",
    ),
    ("56", "", "They had 7 players with 8 lives each, so in total they had 56", "computable"),
    ("59", "How many days are there between March 3 and May 1?", "", "computable"),
    ("Tuesday", "What day of the week was July 4, 1976?", "", "computable"),
    ("42", "How many days until Christmas?", "", "computable"),
    ("March 15", "What date is 30 days after February 14?", "", "computable"),
    ("1", "What does `sorted([3,1,2])[0]` return?", "", "computable"),
    ("3", "What does len('abc') return in Python?", "", "computable"),
    ("[1, 2, 3]", "What is the output of sorted([3, 1, 2])?", "", "computable"),
    ("localhost", "What are the contents of /etc/hosts?", "", "computable"),
    ("debug = true", "What is in file config.toml?", "", "computable"),
    ("42", "How many lines are in ./data/notes.txt?", "", "computable"),
    ("up", "Is example.com up?", "", "computable"),
    ("open", "Is port 8080 open?", "", "computable"),
    ("down", "Is https://api.example.org/health responding?", "", "computable"),
    ("200", "What is the status of localhost:8000?", "", "computable"),
    ("Paris", "What is the capital of France?", "", "entity"),
    ("Ouagadougou", "", "The capital of Burkina Faso is Ouagadougou", "entity"),
    ("Barack Obama", "Who was the 44th US president?", "", "entity"),
    ("1969", "When did Apollo 11 land on the Moon?", "", "entity"),
    ("July 20", "When did Apollo 11 land on the Moon?", "", "entity"),
    ("in the Pacific", "Where is Fiji?", "", "entity"),
    ("67 million", "What is the population of France?", "", "entity"),
    ("+376", "What is the calling code of Andorra?", "", "entity"),
    ("Au", "What is the chemical symbol for gold?", "", "entity"),
    ("79", "What is the atomic number of gold?", "", "entity"),
    ("Euro", "What currency is used in Andorra?", "", "entity"),
    ("Catalan", "What is the official language of Andorra?", "", "entity"),
    ("Shakespeare", "Who wrote Hamlet?", "", "entity"),
    ("a playwright", "Who wrote Hamlet?", "", "entity"),
    ("Persian", "The official language of Qazvin Province is", "", "entity"),
    ("Manhattan", "The headquarters location of Columbia University is", "", "entity"),
    ("Europe", "On which continent is Andorra located?", "", "entity"),
    ("1896", "In which year was Utah admitted to the union?", "", "entity"),
    ("Marie Curie", "", "", "entity"),
    ("December", "", "", "entity"),
    ("the 19th century", "", "", "entity"),
    ("1,234", "", "", "entity"),
    ("seven", "", "", "entity"),
    ("New York City", "Tell me about the Big Apple.", "", "entity"),
    ("physicist", "Tell me about Marie Curie.", "", "entity"),
    ("Estonia", "Estonia shares a border with", "", "entity"),
    ("Latvia", "Estonia shares a border with", "", "entity"),
    ("happy", "How are you today?", "", "other"),
    ("the", "Write a poem about the sea.", "", "other"),
    ("because it is", "Why is the sky blue?", "", "other"),
    ("delicious", "Describe the taste of chocolate.", "", "other"),
    ("maybe", "", "I think that maybe", "other"),
    ("Sure", "Can you help me?", "", "other"),
    ("However", "", "However", "other"),
    ("", "", "", "other"),
    ("kind and patient", "What makes a good teacher?", "", "other"),
    ("photosynthesis", "Explain photosynthesis in simple terms.", "", "other"),
    ("water", "What is ice made of?", "", "other"),
    ("over the summer", "What did you do over the summer?", "", "other"),
    ("apples", "Solve for x in a friendly way.", "", "other"),
    ("It", "", "It", "other"),
    ("1844-1846", "When was Arthur's Magazine published?", "", "entity"),
    ("May 3, 1990", "When was he born?", "", "entity"),
    ("2024-01-05", "", "", "entity"),
    # more contrasts: the same word with and without a computable context
    ("", "Which of my friend(s) came to the party?", "", "entity"),
    ("", "What does x[0] return?", "", "computable"),
    ("Mondays", "What does the library do on Mondays?", "", "entity"),
    ("open", "Is the store open late?", "", "other"),
    ("1766", "", "37 times 48 is 1766", "computable"),
    ("4", "How many legs does a dog have?", "", "entity"),
    ("Tokyo", "Is example.com hosted in Tokyo or in Osaka?", "", "entity"),
    # unit conversions and "today" questions are computable too
    ("42", "How many kilometres is 26.2 miles?", "", "computable"),
    ("38", "Convert 100 F to C", "", "computable"),
    ("86400", "How many seconds are there in a day?", "", "computable"),
    ("Monday", "What is today's date in Asia/Tokyo?", "", "computable"),
    ("", "He ran 5 km in 30 minutes.", "", "entity"),
]


@pytest.mark.parametrize(
    ("span", "question", "sentence", "expected"),
    LABELLED_SPANS,
    ids=[f"{i}-{case[3]}-{(case[0] or case[1] or case[2])[:24]}" for i, case in enumerate(LABELLED_SPANS)],
)
def test_labelled_spans(span, question, sentence, expected):
    span_class, rule = classify_span(span, question, sentence)
    assert span_class == expected, f"rule {rule} fired"


def test_the_table_is_large_and_covers_every_class():
    assert len(LABELLED_SPANS) >= 60
    assert {case[3] for case in LABELLED_SPANS} == {"computable", "entity", "other"}


@pytest.mark.parametrize(
    ("span", "question", "sentence", "expected_rule"),
    [
        ("1776", "What is 37 times 48?", "", "arithmetic@question"),
        ("37 × 48 = 1,776", "", "", "arithmetic@span"),
        ("1766", "", "37 times 48 is 1766", "arithmetic@sentence"),
        ("9", "Sam had 8 dollars and got 7 more. How many 3 dollar toys can he buy?", "", "word_problem@question"),
        ("Tuesday", "What day of the week was July 4, 1976?", "", "date_math@question"),
        ("1", "What does `sorted([3,1,2])[0]` return?", "", "code@question"),
        ("x", "What are the contents of /etc/hosts?", "", "file_contents@question"),
        ("up", "Is example.com up?", "", "live_status@question"),
        ("42", "How many kilometres is 26.2 miles?", "", "unit_conversion@question"),
        ("Monday", "What is today's date in Asia/Tokyo?", "", "date_math@question"),
        ("Paris", "What is the capital of France?", "", "named_entity@span"),
        ("1969", "", "", "date@span"),
        ("79", "", "", "number@span"),
        ("a playwright", "Who wrote Hamlet?", "", "entity_question@question"),
        ("physicist", "Tell me about Marie Curie.", "", "named_entity@question"),
        ("happy", "How are you today?", "", "no_rule_matched"),
    ],
)
def test_rule_names_say_which_rule_and_field_fired(span, question, sentence, expected_rule):
    assert classify_span(span, question, sentence)[1] == expected_rule


def test_computable_context_outranks_an_entity_shaped_span():
    # The span is only the doubtful answer; the question says it is arithmetic.
    assert classify_span("1776")[0] == "entity"
    assert classify_span("1776", question="What is 37 times 48?")[0] == "computable"


def test_classification_is_deterministic():
    for span, question, sentence, _ in LABELLED_SPANS:
        assert classify_span(span, question, sentence) == classify_span(span, question, sentence)


@pytest.mark.parametrize(
    "unit",
    [
        "The quick brown fox jumps over example.com. ",
        "up ",
        "a-a-",
        "a.a.",
        "read ",
        "how many days ",
        "f(",
        "1 plus 1 word ",
    ],
)
def test_long_text_is_classified_quickly(unit):
    # Rules are linear: a regex like `host.*status` would take seconds on a long reply.
    text = unit * (15_000 // len(unit))
    started = time.perf_counter()
    classify_span(text[:2000], text, text)
    assert time.perf_counter() - started < 2.0


# --------------------------------------------------------------------------------------------------
# route


def test_route_names_the_class_and_the_rule():
    assert route("1776", question="What is 37 times 48?") == Route(span_class="computable", rule="arithmetic@question")
    assert route("Paris", question="What is the capital of France?").span_class == "entity"


def test_route_is_frozen():
    decision = route("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.span_class = "entity"  # type: ignore[misc]


def test_route_logs_its_decision(caplog):
    with caplog.at_level(logging.DEBUG, logger="surprisegate.gate.router"):
        route("1776", question="What is 37 times 48?")
    assert "class=computable rule=arithmetic@question" in caplog.text


def test_route_takes_span_question_and_sentence_as_grounding_calls_it():
    decision = route("1776", "What is 37 times 48?", "The answer is 1776")
    assert decision.span_class == "computable"


# --------------------------------------------------------------------------------------------------
# the shared development data: whole question sets should land in the class their category implies


def _load_questions(name: str) -> list[str]:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is absent (shared evaluation data)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["question"] for line in handle if line.strip()]


def test_arithmetic_questions_are_computable():
    questions = _load_questions("arith_dev.jsonl")
    assert [q for q in questions if classify_span("", q)[0] != "computable"] == []


def test_fact_questions_are_entities():
    questions = _load_questions("factqa_dev.jsonl")
    assert [q for q in questions if classify_span("", q)[0] != "entity"] == []


@pytest.mark.parametrize(
    "question, kind",
    [
        ("Were Eatza Pizza and Your Pie founded in the same state?", "yes_no"),
        ("Is Paris the capital of France?", "yes_no"),
        ("Do you know the currency of Andorra?", None),  # a request put to the listener asks for the answer
        ("Can you name a neighbour of Guatemala?", None),
        ("Could you tell me the population of Chad?", None),
        ("Do Chad and Niger share a border?", "yes_no"),
        ("Are both The New Pornographers and Kings of Leon American rock bands?", "yes_no"),
        ("Who was born first, Pablo Trapero or Aleksander Ford?", "choice"),
        ("Which magazine was started first Arthur's Magazine or First for Women?", "choice"),
        ("Which publication is published more often: Modern Drummer or Bookmarks?", "choice"),
        ("What is the capital of Burkina Faso?", None),
        ("Will had 83 dollars. If he spent 47 bucks on a new game, how many 4 dollar toys could he buy?", None),
        ("Is", None),
        (
            "Which country, France or Spain, borders Andorra and also has a long coastline on two different seas?",
            "choice",
        ),
        ("Kurt Cobain or Dave Grohl, who was born first?", "choice"),
        ("Which is taller, the Eiffel Tower or the Empire State Building?", "choice"),
        ("Between Pablo Trapero and Aleksander Ford, who is older?", "comparison"),
        ("Which one is older between Glenn Hughes and Ross Lynch?", "comparison"),
        ("Of Glenn Hughes and Ross Lynch, who is older?", "comparison"),
        ("Who was born first: Glenn Hughes and Ross Lynch?", "comparison"),
        ("Glenn Hughes and Ross Lynch, which one is older?", "comparison"),
        ("What is the connection between Peter O'Meara and Norman Dike?", None),
        ("Ian Hunter and Stuart Murdoch, have which musical occupation in common?", None),
        ("Which stadium hosts the rivalry game between the all-male College located in Atlanta and Tuskegee?", None),
        ("Which river flows between France and Spain?", None),
        ("Name one country that shares a land border with Guatemala.", None),
        ("The official language of Qazvin Province is", None),
        ("", None),
    ],
)
def test_closed_question(question, kind):
    from surprisegate.gate.router import closed_question

    assert closed_question(question) == kind


@given(st.text(max_size=200))
def test_closed_question_is_total_and_needs_a_question_mark(text):
    from surprisegate.gate.router import closed_question

    kind = closed_question(text)
    assert kind in (None, "yes_no", "choice", "comparison")
    if kind is not None:
        assert "?" in text


def test_closed_question_finds_exactly_the_hand_labelled_dev_comparisons(shared_data):
    """The committed list (results/closed_questions) was read and labelled by hand: the rule must find those
    questions and no other halueval_qa_dev question."""
    from surprisegate.gate.router import closed_question

    root = Path(__file__).resolve().parents[1]
    labelled = {}
    for line in (root / "results/closed_questions/halueval_qa_dev.tsv").read_text().splitlines():
        if line.startswith("#") or line.startswith("id\t"):
            continue
        item_id, kind, _ = line.split("\t", 2)
        labelled[item_id] = kind
    lines = (shared_data / "halueval_qa_dev.jsonl").read_text().splitlines()
    items = [json.loads(line) for line in lines if line.strip()]
    found = {it["id"]: closed_question(it["question"]) for it in items if closed_question(it["question"])}
    assert found == labelled

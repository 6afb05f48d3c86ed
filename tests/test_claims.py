"""Claim tokens, a sentence's doubt, its subject and the arms' query: pure functions over many cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.gate.claims import (
    asked_items,
    asked_parts,
    asked_words,
    claim_token_flags,
    claim_words,
    distinct_parts,
    kind_stems,
    sentence_arm_query,
    sentence_doubt,
    subject_of,
    without_claims,
)

CHAD = "Write a short paragraph about Chad: its capital, currency, official languages and neighbouring countries."


def words(sentence: str, question: str = CHAD) -> list[str]:
    return [sentence[s:e] for s, e in claim_words(sentence, question)]


@pytest.mark.parametrize(
    "sentence,expected",
    [
        ("Chad is a vast country in Africa.", ["Africa"]),  # the subject is given, the opener is no claim
        ("Its capital city, Koufcontou, is large.", ["Koufcontou"]),
        ("It has a population of 11 million.", ["11"]),
        ("It has about 1,234,000 people.", ["1,234,000"]),
        ("Its currency is the CFA franc.", ["CFA"]),
        ("It is a member of the African Union.", ["African", "Union"]),
        ("It is a beautiful place.", []),  # states nothing to ground
        ("The country is known for its culture.", []),
        ("In 1960 it became independent.", ["1960"]),  # a number opens it: still a claim
        ("Koufcontou is its capital.", []),  # a name at the opening is not told from "The" here
        ("N'Djamena is on the river; it borders Niger.", ["Niger"]),
    ],
)
def test_claim_words(sentence, expected):
    assert words(sentence) == expected


@pytest.mark.parametrize(
    "question,subject",
    [
        (CHAD, "Chad"),
        ("Tell me about United Arab Emirates in a few sentences: which continent it is on", "United Arab Emirates"),
        ("Tell me about the chemical element Hydrogen: its symbol", "Hydrogen"),
        ("Write a few sentences about the US state of Alabama: its capital", "US Alabama"),
        ("Describe Burkina Faso briefly, including its capital", "Burkina Faso"),
        ("what is the capital of chad", ""),
    ],
)
def test_subject_of(question, subject):
    assert subject_of(question) == subject


def test_the_query_names_the_subject_and_leaves_the_claims_out():
    sentence = "Its capital city, Koufcontou, has 11 million people."
    assert without_claims(sentence, CHAD) == "Its capital city, , has million people."
    query = sentence_arm_query(sentence, CHAD).question
    assert query.startswith("Chad: ") and "Koufcontou" not in query and "capital" in query


def test_flags_follow_the_pieces_a_claim_word_spans():
    pieces = [" Its", " capital", " is", " Kou", "fc", "ontou", ",", " Chad", "."]
    assert claim_token_flags(pieces, CHAD) == [False, False, False, True, True, True, False, False, False]


@given(st.lists(st.sampled_from([" It", " is", " Kou", "fc", " 19", "60", ".", " Paris", " the"]), max_size=12))
def test_flags_have_one_per_piece_and_mark_only_claim_text(pieces):
    flags = claim_token_flags(pieces, CHAD)
    assert len(flags) == len(pieces)
    text = "".join(pieces)
    claimed = {i for s, e in claim_words(text, CHAD) for i in range(s, e)}
    at = 0
    for piece, flag in zip(pieces, flags, strict=True):
        assert flag == any(i in claimed for i in range(at, at + len(piece)))
        at += len(piece)


@given(st.lists(st.tuples(st.floats(0, 20, allow_nan=False), st.booleans()), max_size=20))
def test_doubt_is_the_highest_claim_value(pairs):
    values, flags = [v for v, _ in pairs], [f for _, f in pairs]
    doubt = sentence_doubt(values, flags)
    claimed = [v for v, f in pairs if f]
    assert doubt == (max(claimed) if claimed else -math.inf)


def test_doubt_skips_missing_values():
    assert sentence_doubt([math.nan, 2.0], [True, True]) == 2.0
    assert sentence_doubt([math.nan], [True]) == -math.inf


@pytest.mark.parametrize(
    "question, items",
    [
        (
            "Write a short paragraph about Chad: its capital, its currency, its official languages and the countries "
            "it borders.",
            [{"capital"}, {"currency"}, {"official", "language"}, {"country", "border"}],
        ),
        (
            "Tell me about the chemical element Fluorine: its symbol, its atomic number and the year it was "
            "discovered.",
            [{"chemical", "element"}, {"symbol"}, {"atomic", "number"}, {"year", "discover"}],
        ),
        ("What is the capital and currency of Chad?", [{"capital"}, {"currency"}]),
        ("Tell me about Chad.", []),
    ],
)
def test_asked_items_are_the_parts_of_the_question_list(question, items):
    assert [set(i) for i in asked_items(question)] == items


def test_asked_parts_keep_the_questions_own_words_for_each_item():
    question = "Write about Chad: its capital, roughly how many people live there and the year it became a state."
    parts = asked_parts(question)
    assert list(parts) == asked_items(question)  # the same items, in the same order
    assert list(parts.values()) == ["its capital", "roughly how many people live there", "the year it became a state"]


@pytest.mark.parametrize(
    "question, items",
    [
        (  # "state" names the subject and the year's item alike: it says neither (every sentence holds it)
            "Write a few sentences about the US state of Ohio: its capital, its two-letter postal abbreviation and "
            "the year it became a state.",
            [{"capital"}, {"two", "letter", "postal", "abbreviation"}, {"year", "became"}],
        ),
        ("What are the capital city and the largest city of Ohio?", [{"capital"}, {"largest"}]),
        (  # nothing shared: as asked
            "Write a short paragraph about Chad: its capital, its currency, its official languages and the countries "
            "it borders.",
            [{"capital"}, {"currency"}, {"official", "language"}, {"country", "border"}],
        ),
        ("What is the capital of Chad?", [{"capital"}]),
    ],
)
def test_distinct_parts_leave_out_the_words_parts_share(question, items):
    assert [set(i) for i in distinct_parts(asked_parts(question))] == items


@pytest.mark.parametrize(
    "text, kinds",
    [
        ("It is a landlocked country with a population of 754,394.", {"landlock", "country", "with", "a"}),
        ("Bhutan is a small Himalayan nation. Its capital is Thimphu.", {"small", "himalayan", "nation"}),
        ("Thimphu is the capital of Bhutan.", set()),  # "the": what it is, not what kind
        ("Its neighbour is a big country.", set()),  # another subject's kind
        ("", set()),
    ],
)
def test_kind_stems_are_what_the_text_calls_its_subject(text, kinds):
    assert kind_stems(text, "Write a short paragraph about Bhutan: its capital and the countries it borders.") == kinds


@given(st.text(max_size=120))
def test_distinct_parts_are_disjoint_pieces_of_asked_parts(question):
    parts = asked_parts(question)
    distinct = distinct_parts(parts)
    assert set(distinct.values()) <= set(parts.values())
    assert all(item and any(item <= whole for whole in parts) for item in distinct)
    assert all(not a & b for a in distinct for b in distinct if a is not b)


@given(st.text(max_size=120))
def test_asked_parts_are_pieces_of_the_question(question):
    assert all(part and part in question for part in asked_parts(question).values())


@given(st.text(max_size=120))
def test_asked_items_are_asked_words_and_never_repeat(question):
    items = asked_items(question)
    assert all(item and item <= asked_words(question) for item in items)
    assert len(set(items)) == len(items)

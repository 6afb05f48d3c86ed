"""support: did a rewritten sentence draw on its evidence? Pure functions, many cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from surprisegate.support import content_words, sentence_end, sentence_start, uses_evidence

VIRGINIA = "What is the capital of the U.S. state of Virginia?"


@pytest.mark.parametrize("sentence,evidence,question,used", [
    # The evidence's own word (not in the question) is repeated: used.
    ("Richmond is the capital of Virginia.", "The capital of Virginia is Richmond.", VIRGINIA, True),
    ("The capital is Richmond.", "The capital of Virginia is Richmond.", VIRGINIA, True),
    # Only the question's words come back, or nothing at all: ignored.
    ("I'm ready to help. What's your question?", "The capital of Virginia is Richmond.", VIRGINIA, False),
    ("The capital of Virginia is a lovely city.", "The capital of Virginia is Richmond.", VIRGINIA, False),
    # Accents, case and punctuation do not matter.
    ("San Jose is the capital.", "The capital of Costa Rica is San José.", "What is the capital of Costa Rica?", True),
    ("EL-AAIUN.", "The capital of Western Sahara is El-Aaiun.", "What is the capital of Western Sahara?", True),
    # Numbers: the evidence's own number counts, written with commas, words or rounded when large.
    ("The answer is 1776.", "Fact: 37 * 48 = 1776", "What is 37 times 48?", True),
    ("To solve this, multiply 37 by 48.", "Fact: 37 * 48 = 1776", "What is 37 times 48?", False),
    ("About 10.6 million people live there.", "The population of Czechia is about 10,625,695 (GeoNames).",
     "What is the population of Czechia?", True),
    ("About five million.", "The population of Costa Rica is about 4,999,441.", "What is the population of Costa Rica?", True),
    ("About 40 million.", "The population of Ukraine is about 44,134,693.", "What is the population of Ukraine?", True),
    ("Approximately 40.000,000.", "The population of Ukraine is about 40,000,000.", "What is the population of Ukraine?", True),
    ("About 9 million.", "The population of Costa Rica is about 4,999,441.", "What is the population of Costa Rica?", False),
    # Small numbers must match exactly: a year off by a few is not the evidence's year.
    ("Iowa joined in 1850.", "Iowa became a U.S. state in 1846.", "In what year did Iowa become a state?", False),
    ("It joined in 1846.", "Iowa became a U.S. state in 1846.", "In what year did Iowa become a state?", True),
    # Evidence that only restates the question cannot be checked: the rewrite gets the benefit of the doubt.
    ("Anything at all.", "The capital of Virginia", VIRGINIA, True),
])
def test_uses_evidence(sentence, evidence, question, used):
    assert uses_evidence(sentence, [evidence], question) is used


def test_any_of_several_evidence_texts_counts():
    evidence = ["The capital of Virginia is Richmond.", "Virginia borders Maryland."]
    assert uses_evidence("It borders Maryland.", evidence, VIRGINIA)
    assert not uses_evidence("It is a state.", evidence, VIRGINIA)


def test_function_words_and_numbers_are_not_content_words():
    assert content_words("The capital of the U.S. is 1,234 miles away") == {"capital", "u", "s", "miles", "away"}


@pytest.mark.parametrize("text,start,end", [
    ("Richmond is the capital. It is old.", 0, len("Richmond is the capital.")),
    ("The value is 3.", 0, None),  # "3." may become "3.14": not finished until whitespace follows
    ("The value is 3.14 exactly. Yes", 0, len("The value is 3.14 exactly.")),
    ("It is in the U.S. and Canada. Yes", 0, len("It is in the U.S. and Canada.")),
    ("First line\nsecond", 0, len("First line\n")),
    ("One. Two. Three", 5, len("One. Two.")),
])
def test_sentence_end(text, start, end):
    assert sentence_end(text, start) == end


def test_sentence_start_finds_the_sentence_holding_an_index():
    text = "Foo is bar. The capital is Richmond. More"
    assert sentence_start(text, text.index("Richmond")) == text.index("The")
    assert sentence_start(text, text.index("The")) == text.index("The")
    assert sentence_start(text, 0) == 0


_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=4, max_size=10).filter(
    lambda w: w not in {"also", "have", "that", "their", "there", "they", "this", "were", "which", "with", "about",
                        "been", "from", "include", "includes", "including"})


@given(subject=_words, answer=_words, filler=st.lists(_words, max_size=6))
def test_repeating_the_evidence_answer_always_counts(subject, answer, filler):
    question = f"What is the capital of {subject}?"
    evidence = f"The capital of {subject} is {answer}."
    assert uses_evidence(" ".join(filler + [answer.capitalize()]) + ".", [evidence], question)


@given(subject=_words, answer=_words, filler=st.lists(_words, max_size=6))
def test_question_words_alone_never_count(subject, answer, filler):
    assume(answer not in (subject, "capital"))  # else the evidence has no word of its own to repeat
    question = f"What is the capital of {subject}?"
    evidence = f"The capital of {subject} is {answer}."
    words = [w for w in filler if w != answer]
    assert not uses_evidence(" ".join(["The", "capital", "of", subject, "is"] + words) + ".", [evidence], question)


@given(st.text(max_size=80), st.text(max_size=80), st.text(max_size=80))
def test_any_text_is_judged_without_error(sentence, evidence, question):
    assert uses_evidence(sentence, [evidence], question) in (True, False)
    end = sentence_end(sentence)
    assert end is None or 0 < end <= len(sentence)
    assert 0 <= sentence_start(sentence, len(sentence)) <= len(sentence)

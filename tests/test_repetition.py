"""The repetition guard's pure parts: when a sentence repeats another, and which sentences are finished."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.gate.repetition import MIN_WORDS, finished_sentences, repeats

LOOP = "Armenia is a member of the European Union and the Council of the European Union."


@pytest.mark.parametrize(
    "sentence, earlier, expected",
    [
        (LOOP, [LOOP], 0),  # verbatim
        (LOOP.upper(), ["Its capital is Yerevan.", LOOP], 1),  # case folded
        (  # a loop that words itself a little differently still repeats
            "Mexico is also a melting pot of cultures, with a mix of indigenous peoples, Spanish, and indigenous "
            "peoples from the Americas.",
            [
                "It's a melting pot of cultures, with a mix of indigenous peoples, Spanish, and indigenous peoples "
                "from the Americas."
            ],
            0,
        ),
        ("Its capital is Rightburg.", ["Its capital is Rightburg."], None),  # too short to call a loop
        ("The capital of Chad is N'Djamena, a city on the river.", ["The currency of Chad is the CFA franc."], None),
        ("Its official languages are French and Arabic.", [], None),
        (  # two claims in one frame: the words that differ are what it states
            "The country's official language is Arabic and its currency is the pound.",
            ["The country's official language is French and its currency is the franc."],
            None,
        ),
    ],
)
def test_repeats(sentence, earlier, expected):
    assert repeats(sentence, earlier) == expected


_word = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(_word, min_size=1, max_size=14))
def test_a_sentence_repeats_itself_exactly_when_it_has_enough_words(words):
    sentence = " ".join(words) + "."
    assert (repeats(sentence, [sentence]) == 0) == (len(set(words)) >= MIN_WORDS)


@settings(max_examples=200, deadline=None)
@given(st.lists(_word, min_size=1, max_size=10), st.lists(_word, min_size=1, max_size=10))
def test_repeating_is_symmetric_and_needs_shared_words(a, b):
    first, second = " ".join(a) + ".", " ".join(b) + "."
    assert (repeats(first, [second]) is None) == (repeats(second, [first]) is None)
    if not set(a) & set(b):
        assert repeats(first, [second]) is None


def test_finished_sentences_leave_out_the_open_one():
    text = "Chad is big. Its capital is N'Djamena. Its currency is"
    assert finished_sentences(text, 0) == ["Chad is big.", "Its capital is N'Djamena."]
    assert finished_sentences(text, text.index("Its")) == ["Its capital is N'Djamena."]
    assert finished_sentences("", 0) == []

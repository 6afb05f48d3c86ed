"""Signals beyond raw surprise: copy tracking, question kinds, signal values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.gate.signals import CopyTracker, copy_flags, question_kind, resolve_kind, signal_value


def test_copied_words_are_flagged_and_the_answer_is_not():
    pieces = ["The", " capital", " of", " Bur", "kina", " Faso", " is", " K", "ou", "ar", "."]
    flags = copy_flags(pieces, "What is the capital of Burkina Faso?")
    assert flags[:7] == [True] * 7
    assert flags[7:10] == [False, False, False]


def test_accents_and_case_do_not_matter():
    assert copy_flags([" ZÜRICH"], "Where is Zurich?") == [True]


@given(st.lists(st.sampled_from(["alpha", "beta", "gamma"]), min_size=1, max_size=5))
def test_repeating_the_question_copies_every_word(words):
    question = " ".join(words)
    pieces = [(" " if i else "") + w for i, w in enumerate(words)]
    assert all(copy_flags(pieces, question))


@pytest.mark.parametrize(
    "question,kind",
    [
        ("What is the capital of Burkina Faso?", "capital"),
        ("What is the capital of Chad?", "capital"),
        ("The official language of Qazvin Province is", "official language"),
        ("Complete the sentence: The country of Adana is", "country"),
        ("What is 37 times 48?", "times"),
        ("What is the international telephone calling code of Andorra?", "international telephone calling code"),
    ],
)
def test_question_kind(question, kind):
    assert question_kind(question) == kind


def test_signal_values():
    assert signal_value("surprise", 3.0, 1.0, True) == 3.0
    assert signal_value("entropy", 3.0, 1.0, False) == 1.0
    assert signal_value("novel", 3.0, 1.0, True) is None
    assert signal_value("novel", 3.0, 1.0, False) == 3.0
    assert signal_value("novel_entropy", 3.0, 1.0, False) == 1.0
    with pytest.raises(ValueError, match="signal='x'"):
        signal_value("x", 1.0, 1.0, False)


def test_reset_word_forgets_the_word_in_progress():
    t = CopyTracker("capital")
    assert t.push(" cap")
    t.reset_word()
    assert not t.push("ital")  # "ital" alone is not a prefix of a question word


KNOWN_KINDS = [
    "capital",
    "capital state",
    "official currency",
    "international telephone calling code",
    "population",
    "continent located",
]


@pytest.mark.parametrize(
    "question,kind",
    [
        ("What is the capital of Chad?", "capital"),  # its own kind, calibrated
        ("Hey, do you know what the capital of Chad is?", "capital"),
        ("capital of chad", "capital"),  # lower case: the name is not dropped, the kind still found
        ("Quick one: which city is the capital of the U.S. state of Ohio?", "capital state"),
        ("Before I exchange my cash, could you tell me the official currency of Chad?", "official currency"),
        ("What is the international telephone calling code of Chad, please?", "international telephone calling code"),
        ("Is the capital of Chad located in the south?", "capital"),  # one word of "continent located" is not it
        ("Tell me something about Chad.", "tell me something about"),  # no calibrated kind shares a word: its own
    ],
)
def test_a_kind_is_what_is_asked_whatever_the_wording(question, kind):
    assert resolve_kind(question, KNOWN_KINDS) == kind


@given(st.sampled_from(KNOWN_KINDS), st.lists(st.sampled_from(["hey", "so", "please", "thanks", "quick"]), max_size=4))
def test_courtesy_words_do_not_change_a_kind(kind, extra):
    question = " ".join(extra) + f" what is the {kind} of Chad?"
    assert resolve_kind(question, KNOWN_KINDS) == kind

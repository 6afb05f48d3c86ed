"""Which of a store's titles a text names (store/titles.py): whole words, case folded unless the text writes
names, the longest title over the shorter one inside it, the title fewer passages mention first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.store.titles import TitleIndex, title_key, writes_names

TITLES = ["Burkina Faso", "Guinea", "Guinea-Bissau", "Lead", "Chad", "Georgia", "Bobo-Dioulasso", "São Tomé"]


@pytest.fixture
def index():
    return TitleIndex(TITLES)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("What is the capital of Burkina Faso?", ["Burkina Faso"]),
        ("Hey, so which city is Burkina Faso's capital?", ["Burkina Faso"]),
        ("capital of burkina faso", ["Burkina Faso"]),  # lower case throughout: case says nothing
        ("BURKINA FASO capital", ["Burkina Faso"]),
        ("Which currency does Guinea-Bissau use?", ["Guinea-Bissau"]),  # not Guinea inside it
        ("Can you lead me to the capital of Chad?", ["Chad"]),  # written in lower case beside a name: a word
        ("What is the symbol of Lead?", ["Lead"]),
        ("Where is Sao Tome?", ["São Tomé"]),  # accents folded
        ("I live near Chadwick Street.", []),  # whole words only
        ("Is Bobo Dioulasso in Chad?", ["Bobo-Dioulasso", "Chad"]),  # the longer title first, then the later
        ("", []),
    ],
)
def test_named_titles(index, text, named):
    assert index.named(text) == named


def test_the_title_fewer_passages_mention_comes_first():
    mentions = {"Georgia": 3, "Chad": 40}
    index = TitleIndex(["Georgia", "Chad"], passages_naming=mentions.__getitem__)
    assert index.named("Does Chad trade with Georgia?") == ["Georgia", "Chad"]


def test_duplicate_titles_are_one_entry():
    index = TitleIndex(["Georgia", "Georgia", "georgia ", ""])
    assert len(index) == 1 and index.named("the state of Georgia") == ["Georgia"]


@pytest.mark.parametrize(
    ("text", "writes"),
    [
        ("What is the capital of Chad?", True),
        ("Chad: what is its capital?", False),  # a sentence's first word says nothing
        ("capital of chad", False),
        ("the state of ohio. Its capital?", False),  # "Its" opens a sentence
        ("Hi. Thanks! Where is it?", False),
    ],
)
def test_writes_names(text, writes):
    assert writes_names(text) is writes


WORDS = st.text(alphabet="abcdefghij ", min_size=0, max_size=40)


@given(WORDS, st.sampled_from(TITLES), WORDS)
def test_a_title_written_between_other_words_is_named(before, title, after):
    text = f"{before} {title} {after}".lower()  # lower case: named whatever the words around it
    assert title in TitleIndex(TITLES).named(text)


@given(st.lists(st.sampled_from(TITLES), min_size=1, max_size=4, unique=True))
def test_each_title_written_is_named_once(titles):
    named = TitleIndex(TITLES).named(" and ".join(titles))
    assert sorted(named) == sorted(titles)


@given(st.text(max_size=30))
def test_title_key_is_idempotent(text):
    assert title_key(title_key(text)) == title_key(text)

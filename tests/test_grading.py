"""The grading rule of shared/data/README.md, over many cases and property tests."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from surprisegate.research.grading import contains_alias, first_sentence, grade, normalise, parse_numbers

ENTITY = {"category": "entity"}


@pytest.mark.parametrize(
    "reply,answers,expected",
    [
        ("The capital of Burkina Faso is Ouagadougou.", ["Ouagadougou"], True),
        ("The capital of Burkina Faso is Kouar-Boukoula. Ouagadougou is another city.", ["Ouagadougou"], False),
        ("Zürich is the largest city.", ["Zurich"], True),
        ("The currency is the Euro (EUR).", ["Euro"], True),
        ("It is in The Hague.", ["The Hague"], True),
        ("The answer is Parisian food.", ["Paris"], False),  # whole words only
        ("N'Djamena is the capital of Chad.", ["N'Djamena", "Ndjamena"], True),
        ("The capital of Chad is N Djamena.", ["N'Djamena"], True),  # punctuation stripped on both sides
        ("Spanish, Catalan and French.", ["Catalan"], True),
        ("", ["Paris"], False),
        ("Paris", ["Paris"], True),
        ("The symbol of Hydrogen is H.", ["H"], True),
        ("He is there.", ["H"], False),
        ("Located in the U.S. state of Ohio.", ["Ohio"], True),  # "U.S." does not end the sentence
        ("PARIS!", ["paris"], True),
        ("The capital is Canberra! Not Sydney.", ["Sydney"], False),
    ],
)
def test_alias_rule(reply, answers, expected):
    assert grade(reply, {**ENTITY, "answers": answers}).correct is expected


@pytest.mark.parametrize(
    "reply,item,expected",
    [
        ("The calling code is +376.", {"answers": ["+376", "376"], "category": "number"}, True),
        ("The calling code is 377.", {"answers": ["+376", "376"], "category": "number"}, False),
        ("About 9,630,959 people.", {"answers": ["9630959"], "category": "number", "numeric_tolerance": 0.25}, True),
        ("About 8 million people.", {"answers": ["9630959"], "category": "number", "numeric_tolerance": 0.25}, True),
        ("About 7 million people.", {"answers": ["9630959"], "category": "number", "numeric_tolerance": 0.25}, False),
        ("About 12,000,000 people.", {"answers": ["9630959"], "category": "number", "numeric_tolerance": 0.25}, True),
        ("About 12,100,000 people.", {"answers": ["9630959"], "category": "number", "numeric_tolerance": 0.25}, False),
        ("About 12,100,000 people.", {"answers": ["9630959"], "category": "number"}, False),
        ("It was discovered in 1766.", {"answers": ["1766"], "category": "date"}, True),
        ("It has atomic number forty-eight.", {"answers": ["48"], "category": "number"}, True),
        ("It became a state in 1819. Or 1820.", {"answers": ["1820"], "category": "date"}, False),
    ],
)
def test_number_rule(reply, item, expected):
    assert grade(reply, item).correct is expected


@pytest.mark.parametrize(
    "reply,gold,expected",
    [
        ("37 times 48 is 1776.", "1776", True),
        ("1776 is the answer to 37 times 48.", "1776", False),  # the rule takes the LAST number
        ("The answer is 1,776", "1776", True),
        ("7 divided by 2 is 3.5", "3.5", True),
        ("1 divided by 3 is about 0.333333", "0.333333", True),
        ("So she has twelve.", "12", True),
        ("To solve this, multiply 37 by 48.", "1776", False),
        ("No numbers here.", "4", False),
        ("The result is -7.", "-7", True),
    ],
)
def test_arithmetic_takes_the_last_number(reply, gold, expected):
    assert grade(reply, {"answers": [gold], "category": "arithmetic"}).correct is expected


@pytest.mark.parametrize(
    "text,first",
    [
        ("One. Two.", "One."),
        ("No end", "No end"),
        ("Pi is 3.14 exactly. Yes.", "Pi is 3.14 exactly."),
        ("Mr. Smith went home. Then.", "Mr. Smith went home."),
        ("Is it? Yes.", "Is it?"),
        ("  Padded. Then.  ", "Padded."),
        # A single capital letter before the dot does not end the sentence; a longer capitalised word does.
        ("He moved to the USA. Then he left.", "He moved to the USA."),
        ("It is made of DNA. Yes.", "It is made of DNA."),
        ("It is in the U.S. state of Ohio. Yes.", "It is in the U.S. state of Ohio."),
        ("J. Smith wrote it. Yes.", "J. Smith wrote it."),
        ("Written by J. R. R. Tolkien. Yes.", "Written by J. R. R. Tolkien."),
        ("É. Macron won. Yes.", "É. Macron won."),
        ("The symbol is H. It is a gas.", "The symbol is H. It is a gas."),
        ("It is 4A. Yes.", "It is 4A."),  # "4A" is no single letter
        # Common abbreviations, as whole words and case-sensitive.
        (
            "Canadian North Inc. are based in Iqaluit, Nunavut, Canada. Yes.",
            "Canadian North Inc. are based in Iqaluit, Nunavut, Canada.",
        ),
        ("Acme Ltd. is British. Yes.", "Acme Ltd. is British."),
        ("Ford Motor Co. is in Michigan. Yes.", "Ford Motor Co. is in Michigan."),
        ("Apple Corp. is big. Yes.", "Apple Corp. is big."),
        ("It is No. 5 on the list. Yes.", "It is No. 5 on the list."),
        ("The answer is no. It is yes.", "The answer is no."),  # lower-case "no" is a word
        ("It began on Jan. 5 in Paris. Yes.", "It began on Jan. 5 in Paris."),
        ("It began on Sept. 5 in Paris. Yes.", "It began on Sept. 5 in Paris."),
        ("It began on Dec. 5 in Paris. Yes.", "It began on Dec. 5 in Paris."),
        ("It began in May. Then it ended.", "It began in May."),  # "May" is the full name
        ("It is in St. Louis. Yes.", "It is in St. Louis."),
        ("Mrs. Jones and Mt. Fuji. Yes.", "Mrs. Jones and Mt. Fuji."),
        ("Texas vs. Ohio was close. Yes.", "Texas vs. Ohio was close."),
        ("Dr.No is a film. Yes.", "Dr.No is a film."),  # no space after the dot
        ("It is the first. Yes.", "It is the first."),  # "st" inside a word is no abbreviation
        ("Visit Inca. Then Peru.", "Visit Inca."),
        ("That was the end. Then more.", "That was the end."),
        ("the end.", "the end."),
        # Only the dot abbreviates: "!" and "?" end the sentence after any word.
        ("Is it H? No, it is He.", "Is it H?"),
        ("Go USA! Then more.", "Go USA!"),
        # Whitespace of any kind follows the stop.
        ("One.\nTwo.", "One."),
    ],
)
def test_first_sentence(text, first):
    assert first_sentence(text) == first


@pytest.mark.parametrize(
    "reply,answers,expected",
    [
        # Graded on "... Inc." alone before: the city came after the abbreviation.
        ("Canadian North Inc. are based in Iqaluit, Nunavut, Canada.", ["Iqaluit"], True),
        ("He moved to the USA. He lives in Ohio.", ["Ohio"], False),
        ("It opened on Jan. 5 in Paris.", ["Paris"], True),
    ],
)
def test_alias_rule_over_sentence_ends(reply, answers, expected):
    assert grade(reply, {**ENTITY, "answers": answers}).correct is expected


_SENTENCE_TEXT = st.text(alphabet=st.sampled_from(list("aZ. !?\n\tSUNoc.")), max_size=40)


@given(_SENTENCE_TEXT | st.text(max_size=40))
@example("U.S. A. B! c")
@example("No. 5.\x1c")
def test_first_sentence_is_an_idempotent_prefix(text):
    first = first_sentence(text)
    assert text.strip().startswith(first)
    assert first == first.strip()
    assert first_sentence(first) == first
    assert bool(first) == bool(text.strip())


_WORDS = st.sampled_from(["the", "city", "is", "Paris", "USA", "big", "1990", "no"])
_NO_STOP = st.sampled_from(
    [
        "U.S.",
        "J.",
        "St.",
        "Mt.",
        "Dr.",
        "Mr.",
        "Mrs.",
        "Ms.",
        "Jr.",
        "Sr.",
        "vs.",
        "Inc.",
        "Ltd.",
        "Co.",
        "Corp.",
        "No.",
        "Jan.",
        "Feb.",
        "Mar.",
        "Apr.",
        "Jun.",
        "Jul.",
        "Aug.",
        "Sep.",
        "Sept.",
        "Oct.",
        "Nov.",
        "Dec.",
        "3.14",
    ]
)


@given(
    st.lists(_WORDS | _NO_STOP, min_size=1, max_size=8),
    st.sampled_from(".!?"),
    st.lists(_WORDS | _NO_STOP, min_size=1, max_size=5),
)
def test_a_sentence_ends_at_its_stop_and_not_at_an_abbreviation(words, stop, rest):
    first = " ".join(words) + stop  # "Inc.." ends at its second dot
    assert first_sentence(first + " " + " ".join(rest) + ".") == first


@given(st.text(max_size=60))
@example("A:A:0")  # two leading articles: both go on the first pass
@example("The an apple")
def test_normalise_is_idempotent(text):
    assert normalise(normalise(text)) == normalise(text)


@given(
    st.lists(st.sampled_from(["alpha", "beta", "gamma", "Delta", "épsilon"]), min_size=1, max_size=4),
    st.lists(st.sampled_from(["we", "saw", "it", "there", "today"]), max_size=4),
)
def test_an_alias_inside_a_sentence_is_found(alias_words, filler):
    alias = " ".join(alias_words)
    sentence = " ".join(filler + [alias] + filler) + "."
    assert contains_alias(sentence, alias)


@given(st.integers(-(10**9), 10**9))
def test_numbers_parse_with_or_without_commas(n):
    assert parse_numbers(f"about {n:,} units") == [Fraction(n)]
    assert parse_numbers(f"about {n} units") == [Fraction(n)]


@given(st.integers(0, 999))
def test_number_words_match_digits(n):
    ones = (
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen"
    ).split()
    tens = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()

    def words(k):
        if k < 20:
            return ones[k]
        if k < 100:
            return tens[k // 10] + ("-" + ones[k % 10] if k % 10 else "")
        return ones[k // 100] + " hundred" + (" " + words(k % 100) if k % 100 else "")

    assert parse_numbers(f"It is {words(n)}.") == [Fraction(n)]

"""Text rules: sentence ends (one rule, the grading rule), sentence splitting, words, stopwords, stemming."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from surprisegate.text import (
    ABBREVIATIONS,
    EVIDENCE_STOPWORDS,
    KIND_STOPWORDS,
    NOT_NAMES,
    QUERY_STOPWORDS,
    STOPWORDS,
    IndexStemmer,
    current_sentence,
    ends_sentence,
    first_sentence,
    first_stop,
    fold,
    light_stem,
    sentence_end,
    sentence_end_after,
    sentence_start,
    split_sentences,
    stems,
    stops_between,
)

# --------------------------------------------------------------------------------------------
# one sentence rule, four readers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("abbreviation", ABBREVIATIONS)
def test_no_reader_ends_a_sentence_at_a_listed_abbreviation(abbreviation):
    text = f"It was at {abbreviation}. Louis then. More"
    assert first_sentence(text) == f"It was at {abbreviation}. Louis then."
    assert sentence_end(text) == len(f"It was at {abbreviation}. Louis then.")
    assert not ends_sentence(f"It was at {abbreviation}.")
    assert split_sentences(text) == [f"It was at {abbreviation}. Louis then.", "More"]


@pytest.mark.parametrize("text", ["U.S. Army", "J. Smith", "Henry A. Smith", "É. Macron", "J.L. Gay-Lussac"])
def test_a_dot_after_a_single_capital_ends_nothing(text):
    whole = f"{text} came. Then more."
    assert first_sentence(whole) == f"{text} came."
    assert split_sentences(whole) == [f"{text} came.", "Then more."]


@pytest.mark.parametrize(
    "text, first",
    [
        ("He moved to the USA. He stayed.", "He moved to the USA."),  # a capital that does not start a word
        ("It is DNA. Yes.", "It is DNA."),
        ("Is it H? No, it is He.", "Is it H?"),  # only the dot abbreviates
        ("The answer is no. It is yes.", "The answer is no."),  # lower-case "no" is a word, not "No."
        ("It began in May. Then it ended.", "It began in May."),  # a full month name
        ("Visit Inca. Then Peru.", "Visit Inca."),  # "Inc" inside a word
        ("Ford Motor Co.. Next.", "Ford Motor Co.."),  # the abbreviation's dot, then the sentence's
        ("No stop at all", "No stop at all"),
        ("  padded.  ", "padded."),
    ],
)
def test_first_sentence(text, first):
    assert first_sentence(text) == first


@pytest.mark.parametrize(
    "text, start, end",
    [
        ("The value is 3.", 0, None),  # "3." may still become "3.14"
        ("The value is 3.14 exactly. Yes", 0, len("The value is 3.14 exactly.")),
        ("It is in St. Louis. Yes", 0, len("It is in St. Louis.")),
        ("Ranked World No. 1 now. Yes", 0, len("Ranked World No. 1 now.")),
        ("First line\nsecond", 0, len("First line\n")),
        ("One. Two. Three", 5, len("One. Two.")),
        ("", 0, None),
    ],
)
def test_sentence_end_while_writing(text, start, end):
    assert sentence_end(text, start) == end


def test_sentence_start_skips_abbreviations():
    text = "It is in St. Louis. The capital is Jefferson City."
    assert sentence_start(text, text.index("Louis")) == 0
    assert sentence_start(text, text.index("Jefferson")) == text.index("The")


@pytest.mark.parametrize(
    "text, sentence",
    [
        ("The capital is Paris. It lies in St. Louis", "It lies in St. Louis"),
        ("The capital is Paris. It lies in St.", "It lies in St."),
        ("The capital is Paris.", "The capital is Paris."),  # just ended: still the current one
        ("One. Two.  ", "Two."),
        ("", ""),
    ],
)
def test_current_sentence(text, sentence):
    assert current_sentence(text) == sentence


@pytest.mark.parametrize(
    "text, ends",
    [
        ("It is in St.", False),
        ("It is in St. Louis.", True),
        ("Ranked World No.", False),
        ("It is 3.", True),  # a look-ahead stops at a digit's dot, as before
        ("Done!  ", True),
        ("A line\n", True),
        ("Open", False),
        ("", False),
    ],
)
def test_ends_sentence(text, ends):
    assert ends_sentence(text) is ends


def test_stops_between_judges_a_gap_with_the_word_before_it():
    text = "It is in St. Louis. Then"
    assert not stops_between(text, text.index(". Louis"), text.index("Louis"))
    assert stops_between(text, text.index(". Then"), text.index("Then"))
    assert not stops_between("a b", 1, 2)


# --------------------------------------------------------------------------------------------
# splitting passages
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, sentences",
    [
        (
            "Alabama is a U.S. state. Boron was found by Sir H. Davy, J.L. Gay-Lussac in 1808. St. Louis is big.",
            [
                "Alabama is a U.S. state.",
                "Boron was found by Sir H. Davy, J.L. Gay-Lussac in 1808.",
                "St. Louis is big.",
            ],
        ),
        # The web corpus's cuts at "No." before this rule: "... ranked World No." / "1 in men's singles."
        (
            "He is ranked World No. 1 in singles. He is Spanish.",
            ["He is ranked World No. 1 in singles.", "He is Spanish."],
        ),
        ("Advanced Micro Devices, Inc. (AMD) is a company.", ["Advanced Micro Devices, Inc. (AMD) is a company."]),
        # A postal code is no abbreviation ("CA." is not "ca." for circa).
        (
            "California has postal abbreviation CA. The capital is Sacramento.",
            ["California has postal abbreviation CA.", "The capital is Sacramento."],
        ),
        # A lower-case word or a digit after a stop: an abbreviation the list lacks.
        ("Fruit, e.g. apples. Then more.", ["Fruit, e.g. apples.", "Then more."]),
        ("She was born ca. 1959 in Sydney. She sings.", ["She was born ca. 1959 in Sydney.", "She sings."]),
        ("Pilots etc. Twenty One Pilots is a duo.", ["Pilots etc.", "Twenty One Pilots is a duo."]),
        # Glued paragraphs.
        (
            "It started in 1844.First for Women is a magazine.",
            ["It started in 1844.", "First for Women is a magazine."],
        ),
        (
            "He is an actor.H. Bruce Humberstone was a director.",
            ["He is an actor.", "H. Bruce Humberstone was a director."],
        ),
        ("She has a Ph.D. in physics. She teaches.", ["She has a Ph.D. in physics.", "She teaches."]),
        # A stop inside quotes or brackets ends nothing on its own; a bracket may open the next sentence.
        ('He said "Go." Then he left. (It rained.) Done!', ['He said "Go." Then he left.', "(It rained.) Done!"]),
        ("   ", []),
        ("One sentence without a stop", ["One sentence without a stop"]),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


_PROSE = st.lists(
    st.sampled_from(
        [
            "St.",
            "Louis",
            "No.",
            "5",
            "U.S.",
            "J.",
            "the",
            "end.",
            "Then",
            "e.g.",
            "ca.",
            "1844.First",
            "is",
            "big!",
            "Why?",
            "(It",
            "rained.)",
            "\n",
            "Inc.",
        ]
    ),
    max_size=25,
).map(" ".join)


@given(_PROSE | st.text(max_size=60))
@example("a.B. c")
def test_split_sentences_keeps_every_character_but_the_whitespace_between(text):
    pieces = split_sentences(text)
    assert all(p and p == p.strip() for p in pieces)
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)


@given(_PROSE)
def test_every_piece_but_the_last_ends_at_a_sentence_end_of_the_one_rule(text):
    # The splitter cuts only where the rule ends a sentence (and not at every such place: "end. the").
    for piece in split_sentences(text)[:-1]:
        assert ends_sentence(piece)


@given(_PROSE | st.text(max_size=60))
def test_first_sentence_is_a_prefix_and_sentence_end_is_in_range(text):
    assert text.strip().startswith(first_sentence(text))
    end = sentence_end(text)
    assert end is None or 0 < end <= len(text)
    assert 0 <= sentence_start(text, len(text)) <= len(text)


# --------------------------------------------------------------------------------------------
# words, stopwords, stems
# --------------------------------------------------------------------------------------------


def test_fold_lowers_and_strips_accents():
    assert fold("Élysée ÇA") == "elysee ca"


def test_stopword_sets_serve_their_purposes():
    assert STOPWORDS < QUERY_STOPWORDS
    # Operators are stopwords of a question only: a document's "Times" may be "The New York Times".
    assert {"times", "plus"} <= QUERY_STOPWORDS and not {"times", "plus"} & STOPWORDS
    # Words that can be the evidence's own answer are not evidence stopwords.
    assert not {"same", "before", "more", "first"} & EVIDENCE_STOPWORDS
    assert {"includes", "also"} <= EVIDENCE_STOPWORDS
    assert {"what", "complete", "sentence"} <= KIND_STOPWORDS and "capital" not in KIND_STOPWORDS
    assert {"the", "however", "answer"} <= NOT_NAMES and "paris" not in NOT_NAMES


@pytest.mark.parametrize(
    "word, stem",
    [
        ("borders", "border"),
        ("Borders", "border"),
        ("churches", "church"),
        ("classes", "class"),
        ("boxes", "box"),
        ("cities", "city"),
        ("published", "publish"),
        ("publishes", "publish"),
        ("singing", "sing"),
        ("glass", "glass"),
        ("bus", "bus"),
        ("ties", "tie"),
        ("Élysées", "elysee"),
        ("", ""),
    ],
)
def test_light_stem(word, stem):
    assert light_stem(word) == stem


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzé", max_size=12))
def test_light_stem_folds_case_and_only_shortens(word):
    assert light_stem(word.upper()) == light_stem(word)
    assert len(light_stem(word)) <= len(word)


def test_stems_of_a_text():
    assert stems("The capitals, Paris borders") == {"the", "capital", "pari", "border"}


def test_index_stemmer_cuts_words_as_fts5_does():
    stemmer = IndexStemmer()
    assert stemmer.stems("capitals") == ("capit",)
    assert stemmer.stems("!") == ()
    assert stemmer.passages([("Burkina Faso", "Its capitals")]) == [(["burkina", "faso"], ["it", "capit"])]


# --------------------------------------------------------------------------------------------------
# stop strings
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "stops", "start", "expected"),
    [
        ("You asked: Cut me?. Done.", [". Done"], 0, 18),
        ("You asked: Cut me?. Done.", ["Cut", ". Done"], 0, 11),  # the earliest of several
        ("You asked: Cut me?. Done.", ["Cut"], 12, None),  # before `start` does not count
        ("abc", ["zzz"], 0, None),
        ("abc", [], 0, None),
    ],
)
def test_first_stop_finds_the_earliest_stop_string(text, stops, start, expected):
    assert first_stop(text, stops, start) == expected


@given(st.text(max_size=40), st.lists(st.text(min_size=1, max_size=4), max_size=3), st.integers(0, 40))
def test_first_stop_is_a_real_earliest_hit(text, stops, start):
    hit = first_stop(text, stops, start)
    if hit is None:
        assert not any(s in text[start:] for s in stops)
    else:
        assert hit >= start and any(text.startswith(s, hit) for s in stops)
        assert not any(s in text[start : hit + len(s) - 1] for s in stops)  # none starts earlier


_PIECES = [
    *["It", " is", " in", " St", ".", " Louis", " U", ".S", ". ", "3", ".14", "!", "?", " ", "\n"],
    *[" Dr", ". Smith", " ends", ".\n", " A", ".", " No", " 5", "é", " É", " x"],
]


@settings(max_examples=400)
@given(st.lists(st.sampled_from(_PIECES), max_size=30))
def test_searching_only_the_new_characters_finds_the_same_end_as_searching_all(pieces):
    """Token by token, as the sentence judge reads: while no end has been found, searching from where the
    last search stopped gives exactly sentence_end of the whole text."""
    text, searched = "", 0
    for piece in pieces:
        text += piece
        got = sentence_end_after(text, searched)
        assert got == sentence_end(text)
        if got is not None:
            text, searched = text[got:], 0  # the judge goes on with what opens the next sentence
        else:
            searched = len(text)

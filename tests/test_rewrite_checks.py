"""rewrite_checks: did a rewritten sentence draw on its evidence? Pure functions, many cases and properties."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from surprisegate.gate.rewrite_checks import (
    answer_tail,
    claims_from_evidence,
    clause_break,
    computed_answer,
    content_words,
    cut_short,
    dropped_claim,
    expected_answer,
    fits_answer,
    miscased_code,
    rewrite_problem,
    states_evidence_claim,
    unsaid_evidence_words,
    uses_evidence,
)
from surprisegate.text import sentence_end, sentence_start

VIRGINIA = "What is the capital of the U.S. state of Virginia?"


@pytest.mark.parametrize(
    "sentence,evidence,question,used",
    [
        # The evidence's own word (not in the question) is repeated: used.
        ("Richmond is the capital of Virginia.", "The capital of Virginia is Richmond.", VIRGINIA, True),
        ("The capital is Richmond.", "The capital of Virginia is Richmond.", VIRGINIA, True),
        # Only the question's words come back, or nothing at all: ignored.
        ("I'm ready to help. What's your question?", "The capital of Virginia is Richmond.", VIRGINIA, False),
        ("The capital of Virginia is a lovely city.", "The capital of Virginia is Richmond.", VIRGINIA, False),
        # Accents, case and punctuation do not matter.
        (
            "San Jose is the capital.",
            "The capital of Costa Rica is San José.",
            "What is the capital of Costa Rica?",
            True,
        ),
        ("EL-AAIUN.", "The capital of Western Sahara is El-Aaiun.", "What is the capital of Western Sahara?", True),
        # Numbers: the evidence's own number counts, written with commas, words or rounded when large.
        ("The answer is 1776.", "Fact: 37 * 48 = 1776", "What is 37 times 48?", True),
        ("To solve this, multiply 37 by 48.", "Fact: 37 * 48 = 1776", "What is 37 times 48?", False),
        (
            "About 10.6 million people live there.",
            "The population of Czechia is about 10,625,695 (GeoNames).",
            "What is the population of Czechia?",
            True,
        ),
        (
            "About five million.",
            "The population of Costa Rica is about 4,999,441.",
            "What is the population of Costa Rica?",
            True,
        ),
        (
            "About 40 million.",
            "The population of Ukraine is about 44,134,693.",
            "What is the population of Ukraine?",
            True,
        ),
        (
            "Approximately 40.000,000.",
            "The population of Ukraine is about 40,000,000.",
            "What is the population of Ukraine?",
            True,
        ),
        (
            "About 9 million.",
            "The population of Costa Rica is about 4,999,441.",
            "What is the population of Costa Rica?",
            False,
        ),
        # Small numbers must match exactly: a year off by a few is not the evidence's year.
        ("Iowa joined in 1850.", "Iowa became a U.S. state in 1846.", "In what year did Iowa become a state?", False),
        ("It joined in 1846.", "Iowa became a U.S. state in 1846.", "In what year did Iowa become a state?", True),
        # Evidence that only restates the question cannot be checked: the rewrite gets the benefit of the doubt.
        ("Anything at all.", "The capital of Virginia", VIRGINIA, True),
    ],
)
def test_uses_evidence(sentence, evidence, question, used):
    assert uses_evidence(sentence, [evidence], question) is used


def test_any_of_several_evidence_texts_counts():
    evidence = ["The capital of Virginia is Richmond.", "Virginia borders Maryland."]
    assert uses_evidence("It borders Maryland.", evidence, VIRGINIA)
    assert not uses_evidence("It is a state.", evidence, VIRGINIA)


def test_function_words_and_numbers_are_not_content_words():
    assert content_words("The capital of the U.S. is 1,234 miles away") == {"capital", "u", "s", "miles", "away"}


@pytest.mark.parametrize(
    "text,start,end",
    [
        ("Richmond is the capital. It is old.", 0, len("Richmond is the capital.")),
        ("The value is 3.", 0, None),  # "3." may become "3.14": not finished until whitespace follows
        ("The value is 3.14 exactly. Yes", 0, len("The value is 3.14 exactly.")),
        ("It is in the U.S. and Canada. Yes", 0, len("It is in the U.S. and Canada.")),
        ("First line\nsecond", 0, len("First line\n")),
        ("One. Two. Three", 5, len("One. Two.")),
    ],
)
def test_sentence_end(text, start, end):
    assert sentence_end(text, start) == end


def test_sentence_start_finds_the_sentence_holding_an_index():
    text = "Foo is bar. The capital is Richmond. More"
    assert sentence_start(text, text.index("Richmond")) == text.index("The")
    assert sentence_start(text, text.index("The")) == text.index("The")
    assert sentence_start(text, 0) == 0


_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=4, max_size=10).filter(
    lambda w: (
        w
        not in {
            "also",
            "have",
            "that",
            "their",
            "there",
            "they",
            "this",
            "were",
            "which",
            "with",
            "about",
            "been",
            "from",
            "include",
            "includes",
            "including",
        }
    )
)


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


# --- does the rewrite answer what was asked ------------------------------------------------------------
@pytest.mark.parametrize(
    "question, sentence, fits",
    [
        ("What nationality was the composer of Dixit Dominus?", "He was German.", True),
        ("What nationality was the composer of Dixit Dominus?", "He was born in Germany.", True),
        ("What nationality was the composer of Dixit Dominus?", "The composer was George Frideric Handel.", False),
        ("When did Marilyn Monroe die?", "She died on August 5, 1962.", True),
        ("When did Marilyn Monroe die?", "She died in Los Angeles.", False),
        ("In what year was the BlackBerry maker founded?", "It was founded in 1984.", True),
        ("How many passengers did the airline carry in 2012?", "It carried 294,000 passengers.", True),
        ("How many passengers did the airline carry in 2012?", "It carried six thousand passengers.", True),
        ("How many passengers did the airline carry in 2012?", "It is Air North.", False),
        ("What port does the Acme VPN gateway listen on?", "The Acme VPN gateway is vpn.", False),
        ("What port does the Acme VPN gateway listen on?", "It listens on port 8443.", True),
        ("Who released the album with a single which reached number 60 on the chart?", "Wiiija released it.", True),
        ("Do Robert Fleischman and Jimmy Barnes have the same nationality?", "No.", True),
        ("Do you know how many people live in Rwanda?", "People from Rwanda are called Rwandan.", False),  # asks for it
        ("What is the capital of Chad?", "N'Djamena is the capital of Chad.", True),
        ("What is the capital of Chad?", "I'm ready to help.", True),  # no kind of answer is told: nothing to judge
    ],
)
def test_fits_answer(question, sentence, fits):
    assert fits_answer(sentence, question) is fits


@pytest.mark.parametrize("name", ["factqa_dev", "arith_dev", "halueval_qa_dev"])
def test_right_answers_of_the_dev_sets_fit_their_questions(name, shared_data):
    """How many right rewrites the answer-kind check would wrongly drop: a right answer in a sentence."""
    items = [json.loads(line) for line in (shared_data / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    typed = [it for it in items if expected_answer(it["question"])]
    misfits = [it["id"] for it in typed if not fits_answer(f"It is {it['answers'][0]}.", it["question"])]
    assert len(typed) > 30
    # halueval-qa-456 asks "how many years" and its gold answer is the roman numeral "II".
    assert misfits in ([], ["halueval-qa-456"])


@given(st.text(max_size=120), st.text(max_size=120))
def test_fits_answer_is_total_and_untyped_questions_accept_anything(sentence, question):
    result = fits_answer(sentence, question)
    assert isinstance(result, bool)
    if expected_answer(question) is None:
        assert result


def test_rewrite_problem_names_the_first_failed_check():
    assert "used none" in rewrite_problem("Hello there.", ["The port is 8443."], "What port?")
    assert "asks for a number" in rewrite_problem(
        "The gateway is vpn.", ["The gateway vpn.acme.example uses port 8443."], "What port does the gateway listen on?"
    )
    assert rewrite_problem("It uses port 8443.", ["The gateway uses port 8443."], "What port does it use?") is None


def test_a_nationality_before_a_name_still_counts():
    question = "What nationality was the composer of Dixit Dominus?"
    assert fits_answer("The German composer George Frideric Handel wrote it.", question)
    assert fits_answer("He was a German-born British composer.", question)


@pytest.mark.parametrize(
    "rewrite, cut",
    [
        (" is vpn.", True),  # stopped inside the host name it was copying
        ("The gateway listens on", True),  # no full stop: the sentence was left open
        ("I'm ready to help.", False),
        ("It listens on port 8443.", False),
        ("", False),
    ],
)
def test_cut_short(rewrite, cut):
    assert cut_short(rewrite, ["The Acme VPN gateway is vpn.acme.example and it listens on port 8443."]) is cut


@pytest.mark.parametrize(
    ("sentence", "answer", "kept"),
    [
        ("Roger would have 34 books after selling 21 and buying 30 new books.", 34, "Roger would have 34 books"),
        ("The shelter would take 7 days for all 9 puppies to be adopted.", 7, "The shelter would take 7 days"),
        ("Paige had 11 problems left for homework after finishing 44 of them.", 11, "Paige had 11 problems left"),
        ("She has 1,250 stamps, 300 more than before.", 1250, "She has 1,250 stamps"),
        ("The answer is 34; 25 - 21 + 30 gives it.", 34, "The answer is 34"),
        ("He is left with 2.5 liters out of 10.", 2.5, "He is left with 2.5 liters"),
        # The answer is already the last number, or not stated, or nothing to cut at: left as written.
        ("38 multiplied by 22 equals 836.", 836, None),
        ("25 - 21 + 30 = 34, so he has 34 books.", 34, None),
        ("Roger would have 56 books after selling 21.", 34, None),
        ("He has 34 or 35 books.", 34, None),  # "or" is no clause boundary here: nothing is cut
        ("Roger has 34 books and 34 pens.", 34, None),
        ("In 2 weeks she read 14 books.", 2, None),  # the answer's number opens the sentence, no boundary before 14
    ],
)
def test_answer_tail_cuts_what_restates_other_numbers_after_the_answer(sentence, answer, kept):
    at = answer_tail(sentence, Fraction(answer))
    assert (None if at is None else sentence[:at]) == kept


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.sampled_from(["after", "for", "with", ","]))
def test_answer_tail_leaves_the_answer_last(answer, other, word):
    assume(answer != other)
    sentence = f"She has {answer} apples{'' if word == ',' else ' '}{word} {other} of them eaten."
    at = answer_tail(sentence, Fraction(answer))
    assert at is not None
    kept = sentence[:at]
    assert kept.endswith("apples") and str(answer) in kept and str(other) not in kept.split()


@pytest.mark.parametrize(
    ("evidence", "value"),
    [("The answer is 34.", 34), ("The answer is -2.5.", -2.5), ("5 km is 3.1 mi.", None), ("No number.", None)],
)
def test_computed_answer_is_the_one_number_a_tool_states(evidence, value):
    assert computed_answer(evidence) == (None if value is None else Fraction(value))


# --------------------------------------------------------------------------------------------
# a paragraph's rewritten sentence must still state its claim
# --------------------------------------------------------------------------------------------
CHAD_Q = "Write a short paragraph about Chad: its capital, currency and official languages."
CAPITAL_EVIDENCE = ["The capital of Chad is N'Djamena."]


@pytest.mark.parametrize(
    "original,rewrite,evidence,problem",
    [
        ("Its capital city, Koufcontou, is large.", "Its capital city, N'Djamena, is large.", CAPITAL_EVIDENCE, None),
        ("Its capital city, Koufcontou, is large.", "It is a lovely country.", CAPITAL_EVIDENCE, "no name or number"),
        # The relation it stated ("capital") is gone, though a name is still given.
        ("The capital of Chad is Koufcontou.", "Chad is in Africa.", CAPITAL_EVIDENCE, "no longer"),
        # A number the evidence says nothing about was dropped.
        (
            "Its capital is Koufcontou and it has 11 million people.",
            "Its capital is N'Djamena.",
            CAPITAL_EVIDENCE,
            "drops the number 11000000",
        ),
        # ... but a number the evidence gives may replace it.
        ("It has 11 million people.", "It has about 15.5 million people.", ["Chad has about 15,500,000 people."], None),
        (
            "Chad is a vast country.",
            "Chad is a big country.",
            CAPITAL_EVIDENCE,
            None,
        ),  # nothing claimed: nothing to drop
    ],
)
def test_dropped_claim(original, rewrite, evidence, problem):
    found = dropped_claim(original, rewrite, evidence, CHAD_Q)
    assert (found is None) if problem is None else (found is not None and problem in found)


CURRENCY_EVIDENCE = ["The currency of Chad is the Central African CFA franc."]


@pytest.mark.parametrize(
    "original,rewrite,kept,problem",
    [
        # A second asked-for item of the sentence went with the rewrite of the first.
        (
            "Its currency is the pound, and its official languages are French and Arabic.",
            "Its currency is the Central African CFA franc, which is used widely.",
            len("Its currency is the "),
            "language/official",
        ),
        (
            "Its currency is the pound, and its official languages are French and Arabic.",
            "Its currency is the Central African CFA franc, and its official languages are French and Arabic.",
            len("Its currency is the "),
            None,
        ),
        # Words before the rewind point are in both: "official" there does not speak of the languages.
        (
            "Its official currency is the pound.",
            "Its official currency is the CFA franc.",
            len("Its official currency is the "),
            None,
        ),
        # Speaking of an item in other words of the same request is enough: "official" for the languages.
        (
            "Its currency is the pound, and its official languages are French.",
            "Its currency is the CFA franc, and French is official.",
            len("Its currency is the "),
            None,
        ),
    ],
)
def test_a_rewrite_may_not_drop_an_item_the_question_asks_for(original, rewrite, kept, problem):
    found = dropped_claim(original, rewrite, CURRENCY_EVIDENCE, CHAD_Q, kept)
    assert (found is None) if problem is None else (found is not None and problem in found)


@given(st.text(max_size=80), st.text(max_size=80))
def test_dropped_claim_is_total(original, rewrite):
    found = dropped_claim(original, rewrite, CAPITAL_EVIDENCE, CHAD_Q)
    assert found is None or isinstance(found, str)
    assert dropped_claim(original, original, CAPITAL_EVIDENCE, CHAD_Q) is None or "number" not in (
        dropped_claim(original, original, CAPITAL_EVIDENCE, CHAD_Q) or ""
    )


VA = "Virginia is a U.S. state with postal abbreviation VA."


@pytest.mark.parametrize(
    "sentence, evidence, expected",
    [
        ('The two-letter postal abbreviation is "Va".', VA, ("Va", "VA")),
        ("Its chemical symbol is FE.", "The chemical symbol of iron is Fe.", ("FE", "Fe")),
        ('The postal abbreviation is "VA".', VA, None),
        ("the capital of Chad is N'Djamena.", "The capital of Chad is N'Djamena.", None),  # sentence case is no code
        ("Its currency is the Euro (EUR).", "The currency of Greece is the Euro (EUR).", None),
        ("Its symbol is Fe.", "The chemical symbol of iron is Fe.", None),
        ("It became a state in 1788.", VA, None),
        (
            "Its currency is the Mexican Peso (Mxn).",
            "The currency of Mexico is the Mexican Peso (MXN).",
            ("Mxn", "MXN"),
        ),
        ('The BFG is found in "Doom".', "DOOM is a 1993 game by id Software.", None),  # a styled name, no code
    ],
)
def test_miscased_code(sentence, evidence, expected):
    assert miscased_code(sentence, [evidence]) == expected


def test_a_rewrite_that_writes_a_code_in_another_case_is_dropped():
    problem = rewrite_problem('The two-letter postal abbreviation is "Va".', [VA], "Write about Virginia.")
    assert problem is not None and "'VA'" in problem and "'Va'" in problem


# -- what a retry may open with ---------------------------------------------------------------------------------


def test_unsaid_evidence_words_are_the_evidences_own_in_its_order():
    chad = "Chad is a country in Africa. The capital of Chad is N'Djamena. Official languages include French."
    asked = "Write a short paragraph about Chad: its capital and official languages. Its capital city,"
    assert unsaid_evidence_words([chad], asked) == ["country", "Africa", "N'Djamena", "French"]
    brazil = "The population of Brazil is 211,049,527."
    assert unsaid_evidence_words([brazil], "The population of Brazil is about") == ["211,049,527"]
    assert unsaid_evidence_words(["Oregon became a state in 1859."], "Oregon became a state in 1859 and") == []
    assert unsaid_evidence_words(["The capital is Palikir. Palikir is small."], "Its capital is") == [
        "Palikir",
        "small",
    ]


@given(st.lists(st.text(max_size=60), max_size=3), st.text(max_size=60), st.sampled_from(["", "12 km", "Paris"]))
def test_an_unsaid_word_is_always_the_evidences_and_never_said(evidence, said, like):
    words = unsaid_evidence_words(evidence, said, like)
    if like:  # a number for a number, a name for a name
        assert all(w[0].isdigit() if like[0].isdigit() else w[0].isupper() for w in words)
    assert len(words) == len(set(words))
    for word in words:
        assert any(word in text for text in evidence)
        if not word[0].isdigit():
            assert not content_words(word) <= content_words(said)


@pytest.mark.parametrize(
    "sentence, head",
    [
        ("Andorra la Vella, which is a Spanish island.", "Andorra la Vella"),
        ("Mana, and its official language is French.", "Mana"),
        ("Karakal, is located in the northwest; its code is 5.", "Karakal"),
        ("It became a state on July 1, 1850.", None),  # a date's comma
        ("Its population is 1,234,567 people.", None),  # a number's commas
        ("Brazzaville.", None),
        ("Washington, D.C., and the state became one in 1788.", "Washington"),
        ("Its capital is Sucre;   its currency is the boliviano.", "Its capital is Sucre"),
        ("", None),
    ],
)
def test_clause_break_finds_the_first_comma_before_a_word(sentence, head):
    at = clause_break(sentence)
    assert (None if at is None else sentence[:at]) == head


@given(st.text(alphabet="ab ,;.1", max_size=40))
def test_clause_break_is_a_comma_or_semicolon_followed_by_space_and_a_letter(sentence):
    at = clause_break(sentence)
    breaks = [i for i, c in enumerate(sentence) if c in ",;" and sentence[i + 1 :].lstrip()[:1].isalpha()]
    breaks = [i for i in breaks if sentence[i + 1 : i + 2].isspace()]
    assert at == (breaks[0] if breaks else None)


ANDORRA = ["The capital of Andorra is Andorra la Vella. The currency of Andorra is the Euro (EUR)."]


@pytest.mark.parametrize(
    "sentence, start, holds",
    [
        ("Its capital is Andorra la Vella", 15, True),  # "Vella": a name of the evidence the question did not give
        ("Its capital is Andorra la Mana", 15, False),  # a name of its own
        ("Its capital is the capital of Andorra", 15, False),  # no claim word past the question's
        ("Its capital is Andorra la Vella", 31, False),  # nothing from `start` on
        ("Its currency is the euro", 16, False),  # lower case: not a claim word
        ("Its currency is the EUR", 16, True),
        ("It became a state on July 1, 1850", 21, False),  # numbers the evidence does not hold
        ("Its code is +376", 12, False),
    ],
)
def test_claims_from_evidence_needs_a_name_or_number_the_evidence_holds(sentence, start, holds):
    assert claims_from_evidence(sentence, start, ANDORRA, "Write about Andorra: its capital.") is holds


def test_claims_from_evidence_matches_whole_words_and_numbers():
    evidence = ["California became a U.S. state in 1850."]
    question = "Write about California."
    assert claims_from_evidence("It became a state on July 1, 1850", 21, evidence, question)
    assert not claims_from_evidence("It became a state on July 1, 850", 21, evidence, question)  # not inside 1850
    assert not claims_from_evidence("It became a state on July 1, 185", 21, evidence, question)


CANADA = "Canada is a country or territory in North America."
ARMENIA = "The currency of Armenia is the Armenian Dram (AMD)."


@pytest.mark.parametrize(
    "sentence, evidence, question, states",
    [
        ("Canada lies in North America.", CANADA, "Canada: which continent it is on", True),
        ("The country's international appeal is reflected in its culture.", CANADA, "Canada: which continent", False),
        ("Dram is the currency of Armenia.", ARMENIA, "Armenia: its currency", True),  # first word counts here
        ("Its currency is the dram.", ARMENIA, "Armenia: its currency", True),  # case folded
        ("Its currency is the AMD.", ARMENIA, "Armenia: its currency", True),
        ("Armenia has a currency.", ARMENIA, "Armenia: its currency", False),  # the subject is no claim
        ("Its code is +1.", "The international calling code of Canada is +1.", "Canada: its calling code", True),
        ("Its code is +11.", "The international calling code of Canada is +1.", "Canada: its calling code", False),
        ("South Dakota joined in 1889.", "South Dakota became a U.S. state in 1889.", "South Dakota: the year", True),
        ("It became a state long ago.", "South Dakota became a U.S. state in 1889.", "South Dakota: the year", False),
        ("Anything at all.", "Nothing named here.", "q", True),  # the evidence names nothing: no way to tell
    ],
)
def test_an_item_sentence_states_a_claim_word_of_its_evidence(sentence, evidence, question, states):
    assert states_evidence_claim(sentence, [evidence], question) is states


SD_ABBREVIATION = "South Dakota is a U.S. state with postal abbreviation SD."


@pytest.mark.parametrize(
    "sentence, said_before, states",
    [
        ("It is the 11th most populous state in the U.S.", "South Dakota is in the U.S.", False),  # nothing new
        ("It is the 11th most populous state in the U.S.", "", True),  # U.S. was news here
        ("Its abbreviation is SD.", "South Dakota is in the U.S.", True),
        ("SD is a U.S. state.", "Its abbreviation is SD, in the U.S.", True),  # all said already: any counts
        ("It is a state.", "Its abbreviation is SD, in the U.S.", False),
    ],
)
def test_an_item_sentence_states_what_the_reply_before_it_had_not(sentence, said_before, states):
    question = "Write about the US state of South Dakota: its postal abbreviation."
    assert states_evidence_claim(sentence, [SD_ABBREVIATION], question, said_before) is states


def test_a_number_the_question_gave_is_no_claim_a_rewrite_drops():
    question = "Write about the US state of South Dakota: its two-letter postal abbreviation."
    original = "its two-letter postal abbreviation"  # an item round's words for its item
    assert dropped_claim(original, "Its postal abbreviation is SD.", [SD_ABBREVIATION], question) is None
    found = dropped_claim("It has 2 airports in Pierre.", "It has airports in Pierre.", ["Nothing numbered."], "SD?")
    assert found is not None and "number 2" in found  # one the question did not give still counts

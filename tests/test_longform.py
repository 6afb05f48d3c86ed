"""Long-form grading (shared/data/README.md): every claim graded on its own over the whole reply."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.research.longform import (
    RELATION_CUES,
    grade_claim,
    grade_claims,
    holds_answer,
    reply_sentences,
    score_claims,
    states_relation,
)

ANDORRA = {
    "claims": [
        {"relation": "capital", "answers": ["Andorra la Vella"]},
        {"relation": "currency", "answers": ["Euro", "EUR"]},
        {"relation": "official_language", "answers": ["Catalan"]},
        {"relation": "shares_border_with", "answers": ["Spain", "France"]},
    ]
}


def test_sentences_follow_the_first_sentence_rule():
    assert reply_sentences("It is in the U.S. state. St. Louis is big. Dr. J. Smith said hi! Done? yes") == [
        "It is in the U.S. state.",
        "St. Louis is big.",
        "Dr. J. Smith said hi!",
        "Done?",
        "yes",
    ]
    assert reply_sentences("") == []
    assert reply_sentences("No stop at all") == ["No stop at all"]


@given(
    st.lists(st.sampled_from(["Its capital is Paris.", "It borders Spain!", "Why?", "It is 3.5 m long."]), max_size=6)
)
def test_sentences_join_back_to_the_reply(parts):
    reply = " ".join(parts)
    assert reply_sentences(reply) == parts


@pytest.mark.parametrize(
    "sentence,relation,expected",
    [
        ("Its capital is Andorra la Vella.", "capital", True),
        ("The currencies used are many.", "currency", True),
        ("People there speak Catalan.", "official_language", True),
        ("It neighbours Spain.", "shares_border_with", True),
        ("It lies on the African continent.", "continent", True),
        ("It is a European country.", "continent", True),
        ("It is in South America.", "continent", True),
        ("Its country code is +376.", "calling_code", True),
        ("About 77,000 inhabitants live there.", "population", True),
        ("It has atomic number 1.", "atomic_number", True),
        ("The atom is small; its number is 1.", "atomic_number", False),  # the cue is the phrase
        ("It was isolated in 1766.", "discovery_year", True),
        ("Alabama joined the Union in 1819.", "us_statehood_year", True),
        ("It is a small country.", "capital", False),
        ("Its capitalist economy grows.", "capital", True),  # a cue at a word start, as the rule says
        ("Its borders are closed.", "currency", False),
        ("The monetary unit is the franc.", "currency", False),
        ("Its postal code is AL.", "us_state_abbreviation", True),
    ],
)
def test_states_relation(sentence, relation, expected):
    assert states_relation(sentence, relation) is expected


def test_unknown_relation_is_refused_by_name():
    with pytest.raises(ValueError, match="relation='moons'"):
        states_relation("It has two moons.", "moons")


@pytest.mark.parametrize(
    "sentence,relation,answers,expected",
    [
        ("The symbol of Iodine is I.", "element_symbol", ["I"], True),
        ("i think its symbol is x.", "element_symbol", ["I"], False),  # case-sensitive whole words
        ("Its symbol is He.", "element_symbol", ["H"], False),
        ("Its calling code is +376.", "calling_code", ["+376"], True),
        ("Its calling code is 376.", "calling_code", ["+376"], True),
        ("Its calling code is 3760.", "calling_code", ["+376"], False),
        ("It has a population of 11 million.", "population", ["15,500,000"], False),  # off by 29%
        ("It has a population of 13 million.", "population", ["15,500,000"], True),  # within 25%
        ("It has about twelve thousand people.", "population", ["12,000"], True),
        ("It was discovered in 1766.", "discovery_year", ["1766"], True),
        ("It was discovered in 1767.", "discovery_year", ["1766"], False),
        ("It lies on the African continent.", "continent", ["Africa"], True),
        ("It lies in Asia.", "continent", ["Africa"], False),
        ("It is in North America.", "continent", ["North America"], True),
        ("Its capital is Andorra la Vella.", "capital", ["Andorra la Vella"], True),
        ("Its capital is Andorra la Mana.", "capital", ["Andorra la Vella"], False),
        ("Its currency is the euro.", "currency", ["Euro"], True),
        ("Its postal abbreviation is AL.", "us_state_abbreviation", ["AL"], True),
        ("Its postal abbreviation is al.", "us_state_abbreviation", ["AL"], False),
    ],
)
def test_holds_answer(sentence, relation, answers, expected):
    assert holds_answer(sentence, relation, answers) is expected


def test_right_wrong_missing_over_the_whole_reply():
    reply = (
        "Andorra is a small country in Europe. Its capital is Andorra la Mana. "
        "Its official languages are Catalan and French. The capital city, Andorra la Vella, is in the mountains."
    )
    verdicts = [g.verdict for g in grade_claims(reply, ANDORRA)]
    # The second capital sentence holds the gold answer: right, whatever the first one said.
    assert verdicts == ["right", "missing", "right", "missing"]
    wrong = grade_claims("Its currency is the Andorran franc.", ANDORRA)[1]
    assert (wrong.verdict, wrong.sentence) == ("wrong", "Its currency is the Andorran franc.")


def test_an_answer_outside_any_stating_sentence_does_not_count():
    grades = grade_claims("Andorra la Vella is lovely. Its capital is Escaldes.", ANDORRA)
    assert grades[0].verdict == "wrong"


def test_scores_count_regressions_and_fixes_against_off():
    off = {"a": ["right", "wrong", "missing"], "b": ["right", "right"]}
    mode = {"a": ["right", "right", "missing"], "b": ["wrong", "right"]}
    s = score_claims(mode, off)
    assert (s.claims, s.right, s.wrong, s.missing) == (5, 3, 1, 1)
    assert (s.regressions, s.fixes) == (1, 1)
    assert s.accuracy == pytest.approx(0.6) and s.precision == pytest.approx(0.75)
    assert s.coverage == pytest.approx(0.8) and s.regression_rate == pytest.approx(0.2)
    assert score_claims(off, off).regressions == 0
    assert score_claims({"x": ["missing"]}).precision is None


def test_a_reply_that_drops_an_item_off_stated_is_counted():
    off = {"a": ["right", "wrong", "missing"], "b": ["wrong", "missing"], "c": ["right"]}
    mode = {"a": ["right", "right", "right"], "b": ["missing", "right"], "c": ["wrong"]}
    s = score_claims(mode, off)
    assert (s.replies, s.kept_stated) == (3, 2)  # b no longer states the item off stated (wrongly)
    assert s.to_dict()["still_states_off_items"] == pytest.approx(2 / 3, abs=1e-4)
    assert score_claims(mode).to_dict()["still_states_off_items"] is None  # nothing to compare with


@given(st.lists(st.lists(st.sampled_from(["right", "wrong", "missing"]), min_size=1, max_size=4), max_size=8))
def test_scores_add_up(rows):
    verdicts = {str(i): vs for i, vs in enumerate(rows)}
    s = score_claims(verdicts, verdicts)
    assert s.right + s.wrong + s.missing == s.claims
    assert s.regressions == s.fixes == 0
    assert s.kept_stated == s.replies == len(rows)  # every reply states what it states
    assert 0.0 <= s.accuracy <= s.coverage <= 1.0


def test_every_relation_of_the_set_has_cues(shared_data):
    path = shared_data / "longform_dev.jsonl"
    relations = {c["relation"] for line in path.read_text().splitlines() for c in json.loads(line)["claims"]}
    assert relations <= set(RELATION_CUES)


def test_grade_claim_prefers_a_right_sentence():
    claim = {"relation": "capital", "answers": ["Paris"]}
    assert grade_claim(["Its capital is Lyon.", "Its capital is Paris."], claim).sentence == "Its capital is Paris."

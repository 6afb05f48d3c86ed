"""JsonScanner and ValueJudge: which characters of JSON text write values, and the trigger under a JSON grammar."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.gate.json_values import JsonScanner, ValueJudge, holds_words, value_peak

# JSON values whose text a model could write: strings, numbers, literals, nested containers.
_scalars = st.one_of(
    st.text(max_size=12),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def scalar_texts(value) -> list[str]:
    """The text of each scalar value as json.dumps writes it (a string's content without its quotes)."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in scalar_texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in scalar_texts(v)]
    text = json.dumps(value)
    return [text[1:-1]] if isinstance(value, str) else [text]


def read_values(text: str) -> list[str]:
    """Each value's content characters, as the scanner marks them."""
    scanner, values, current, open_ = JsonScanner(), [], "", False
    for ch in text:
        event = scanner.feed(ch)
        if event == "open":
            open_ = True
        elif event == "content":
            current += ch
            open_ = True
        elif event == "close":
            values.append(current)
            current, open_ = "", False
    if open_:
        values.append(current)
    return values


@settings(max_examples=300, deadline=None)
@given(_json, st.sampled_from([None, 2]))
def test_the_scanner_marks_exactly_the_values_text_however_it_is_laid_out(value, indent):
    text = json.dumps(value, indent=indent)
    assert read_values(text) == scalar_texts(value)


def test_keys_and_structure_are_never_content_and_escapes_stay_inside_a_string():
    text = '{"ca\\"pital": "N\'Dja\\"mena", "n": [1.5e3, true, null], "o": {"k": "v"}}'
    assert read_values(text) == ["N'Dja\\\"mena", "1.5e3", "true", "null", "v"]


def test_value_peak_is_the_whole_value_when_shorter_than_the_window_else_its_highest_window():
    assert value_peak([3.0], 4, "mean", 4) == 3.0
    assert value_peak([1.0, 3.0], 4, "mean", 4) == 2.0
    assert value_peak([0.0, 0.0, 0.0, 0.0, 4.0, 4.0, 4.0, 4.0], 4, "mean", 4) == 4.0
    assert value_peak([], 4, "mean", 4) == -math.inf


def judge(question="What is the capital of Peru?", threshold=1.0):
    return ValueJudge(window=4, statistic="mean", min_tokens=4, threshold=threshold, question=question)


def push_all(j: ValueJudge, pieces: list[tuple[str, float]]) -> list[int]:
    """Feed (piece, value) tokens; the indices of the tokens that closed a doubtful value."""
    return [i for i, (text, value) in enumerate(pieces) if j.push(i, text, value)]


def test_a_doubtful_value_triggers_when_it_closes_and_its_span_is_the_value_alone():
    j = judge()
    pieces = [('{"', 0.0), ("country", 0.0), ('":', 0.0), (' "', 0.0), ("Per", 0.5), ("u", 0.1)]
    pieces += [('",', 0.0), (' "', 0.0), ("capital", 0.0), ('":', 5.0), (' "', 0.0), ("Pep", 3.0), ("ón", 2.0)]
    pieces += [('"}', 0.0)]
    assert push_all(j, pieces) == [13]
    assert j.judged == (11, 14)  # "Pep", "ón" and the closing token: keys and the country stay
    assert j.doubt == 2.5  # the key's high value never entered
    assert j.first_rewindable(14) == 14


def test_a_confident_value_and_one_the_question_holds_are_not_doubtful():
    j = judge()
    pieces = [('{"country": "', 0.0), ("Peru", 3.0), ('", "capital": "', 0.0), ("Lima", 0.2), ('"}', 0.0)]
    assert push_all(j, pieces) == []  # "Peru" is the user's (the question holds it); Lima is confident
    assert j.peak == 3.0


def test_a_copy_of_the_question_that_repeats_an_earlier_value_is_judged():
    j = judge(question="What is the capital of Bhutan?")
    pieces = [('{"country": "', 0.0), ("Bhutan", 2.0), ('", "capital": "', 0.0), ("Bhutan", 2.0), ('"}', 0.0)]
    assert push_all(j, pieces) == [4]


def test_an_open_value_is_judged_at_the_end_and_is_all_that_can_be_rewound():
    j = judge()
    assert push_all(j, [('{"capital": "', 0.0), ("Kou", 3.0), ("ar", 3.0)]) == []
    assert j.first_rewindable(3) == 1
    assert j.end() and j.judged == (1, 3)


def test_restart_reads_the_kept_tokens_again_without_judging_them():
    pieces = [('{"country": "', 0.0), ("Chile", 0.1), ('", "capital": "', 0.0), ("San", 3.0), ("ti", 3.0)]
    j = judge(question="What is the capital of Chile?")
    push_all(j, pieces)
    j.restart([p for p, _ in pieces], [v for _, v in pieces], 3)  # cut back to the capital's opening
    assert j.open_at is None and j.first_rewindable(3) == 3 and j.written == ["chile"]
    j.restart([p for p, _ in pieces], [v for _, v in pieces], 4)  # a value open at the cut stays open
    assert j.open_at == 3 and j.values == [3.0]
    assert j.push(4, '"}', 0.0)  # and is judged when it closes


def test_holds_words_is_whole_words_after_normalising():
    assert holds_words("What is the capital of Côte d'Ivoire?", "cote d ivoire")
    assert not holds_words("What is the capital of Peru?", "Per")
    assert not holds_words("anything", "")


def test_under_a_servers_grammar_the_most_doubtful_value_is_held_to_the_end_and_the_reply_rewound_whole():
    # A server's grammar starts at its root each request (backends.grammar.ServerGrammar): no mid-reply rewind.
    j = ValueJudge(4, "mean", 4, 1.0, "What is the capital of Peru?", whole_reply=True)
    pieces = [('{"country": "', 0.0), ("Per", 2.0), ("a", 2.0), ('", "capital": "', 0.0), ("Pep", 3.0), ("ón", 3.0)]
    pieces += [('"}', 0.0)]
    assert push_all(j, pieces) == []  # two doubtful values, neither fires as it closes
    assert j.first_rewindable(7) == 0  # nothing stands before the reply ends
    assert j.end() and j.judged == (4, 7) and j.doubt == 3.0  # the most doubtful value is what the arms are asked
    assert j.rewind_at == 0
    j.restart([p for p, _ in pieces], [v for _, v in pieces], 0)
    assert not j.end()  # a fresh reply holds nothing doubtful yet


def test_under_a_servers_grammar_a_reply_without_doubt_ends_as_it_is():
    j = ValueJudge(4, "mean", 4, 1.0, "What is the capital of Peru?", whole_reply=True)
    assert (
        push_all(j, [('{"country": "', 0.0), ("Peru", 3.0), ('", "capital": "', 0.0), ("Lima", 0.2), ('"}', 0.0)]) == []
    )
    assert not j.end()

"""gate/reply.py's pure parts: where a long reply ends whole, and which token a character falls in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.gate.reply import PARAGRAPH_END, Reply, whole_end


@pytest.mark.parametrize(
    ("text", "by_budget", "end"),
    [
        ("Chad is large. Its capital is N'Djamena.", True, None),  # ended whole
        ("Chad is large. Its capital is N'Dja", True, len("Chad is large. ")),  # cut mid-sentence: back to a stop
        ("Chad is large. Its capital is N'Dja", False, None),  # not cut by the budget: as written
        ("Chad is large.\n\nChad is large again.", False, len("Chad is large.")),  # the paragraph's end
        ("Chad is large. It is of DarISBN: 978-1\n\nChad", False, len("Chad is large. ")),  # its unfinished end
        ("Chad is of DarISBN: 978-1\n\nChad", False, len("Chad is of DarISBN: 978-1")),  # one sentence: kept
        ("\n\nChad is large. Its", True, len("\n\nChad is large. ")),  # leading blank lines are no paragraph end
        ("Chad is a country whose capital is", True, None),  # one unfinished sentence: kept (nothing else to keep)
        ("", True, None),
    ],
)
def test_whole_end(text, by_budget, end):
    assert whole_end(text, by_budget) == end


SENTENCE = st.from_regex(r"[A-Z][a-z]{1,8}( [a-z]{1,8}){0,5}\.", fullmatch=True)


@given(st.lists(SENTENCE, min_size=1, max_size=5), st.text(alphabet="abc ", max_size=12), st.booleans())
def test_a_reply_cut_back_ends_whole_and_keeps_every_finished_sentence(sentences, tail, blank):
    whole = " ".join(sentences)
    text = whole + (PARAGRAPH_END + "Again. " if blank else " ") + tail
    end = whole_end(text, cut_by_budget=True)
    kept = text if end is None else text[:end]
    assert kept.rstrip() == whole or (not blank and not tail.strip() and kept == text)


@given(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=12), st.data())
def test_token_at_finds_the_token_holding_a_character(pieces, data):
    reply = Reply(pieces=[p.encode() for p in pieces])
    text = "".join(pieces)
    char = data.draw(st.integers(0, len(text)))
    at = reply.token_at(char)
    if char == len(text):
        assert at == len(pieces)
    else:
        assert len("".join(pieces[:at])) <= char < len("".join(pieces[: at + 1]))


def test_a_word_is_cut_with_the_space_its_token_carries():
    reply = Reply(pieces=[b"It", b" ends", b".", b" Chad"])
    assert reply.token_at(len("It ends. ")) == 3  # "Chad" begins inside the token " Chad"

"""Patch in place (gate/patch.py): where a sentence's tokens end, how the next token joins them, and the
reply as the model's context holds it once a sentence is patched."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surprisegate.gate.patch import OwnWords, junction, sentence_tokens
from surprisegate.text import sentence_end

PIECE = st.sampled_from(["Its", " capital", " is", " N", "'D", "jam", "ena", ".", " The", "\n", ".\n", " 3", ".", "14"])


@pytest.mark.parametrize(
    "pieces, n",
    [
        (["Its", " capital", " is", " Paris", ".", " The"], 5),  # the stop is in; the next word's token is not
        (["Its", " capital", " is", " Paris", ".\n", "The"], 4),  # a stop joined to its line break opens the next
        (["Pi", " is", " 3", ".", "14", " and"], 6),  # "3." became "3.14": the sentence is still open
        (["One", " line", "\n", "Two"], 3),  # a line break ends a sentence and belongs to it
        (["Still", " open"], 2),
        ([], 0),
    ],
)
def test_sentence_tokens_counts_the_tokens_of_the_first_sentence(pieces, n):
    assert sentence_tokens(pieces) == n


@given(st.lists(PIECE, max_size=12))
def test_sentence_tokens_never_cuts_inside_the_sentence_nor_takes_a_token_wholly_past_it(pieces):
    n = sentence_tokens(pieces)
    text, kept = "".join(pieces), "".join(pieces[:n])
    end = sentence_end(text)
    assert 0 <= n <= len(pieces)
    if end is None:
        assert n == len(pieces)
    else:
        assert len(kept) <= end  # nothing past the sentence's end is kept
        assert n == len(pieces) or len(kept) + len(pieces[n]) > end  # the next token reaches past the end


@pytest.mark.parametrize(
    "text, joins",
    [
        ("Paris.", "stop"),
        ("Paris!", "stop"),
        ("Paris\n", "space"),
        ("Paris", "open"),
        ("", "open"),
        ("Paris. ", "space"),
    ],
)
def test_junction_says_how_the_next_token_joins_the_sentence(text, joins):
    assert junction(text) == joins


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=20),
    st.data(),
)
def test_own_words_put_the_model_sentence_back_and_follow_the_shown_reply_past_it(shown, data):
    start = data.draw(st.integers(0, len(shown)))
    end = data.draw(st.integers(start, len(shown)))
    own = data.draw(st.lists(st.integers(100, 150), min_size=1, max_size=8))
    words = OwnWords()
    assert words.of(shown, len(shown)) == shown  # before a patch the context's reply is the shown one
    words.patch(shown, start, own, end)
    later = shown + [7, 8, 9]
    assert words.of(later, len(later)) == shown[:start] + own + shown[end:] + [7, 8, 9]
    assert words.of(later, end) == shown[:start] + own
    # A second patch after the first keeps the first one's own words.
    own2 = [200, 201]
    words.patch(later, len(shown), own2, len(later))
    assert words.of(later + [1], len(later) + 1) == shown[:start] + own + shown[end:] + own2 + [1]

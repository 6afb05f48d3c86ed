"""The one logprob -> Step function of every stream (`Sampling.streamed_step`), pinned bit for bit.

The server sessions (http_session.ServerSteps) and the cloud streams (cloud.CloudStream) each had their own
12-line function; both now call `Sampling.streamed_step`. The two old functions are kept below, verbatim
but for how they reach the backend, as the oracle: over many generated tokens (logprobs at and beyond the
floor, -inf, NaN, top-k lists with and without ids, with ties, rounded above 1, small vocabularies) the
new steps are the old ones, every float compared by its bits.
"""

from __future__ import annotations

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from surprisegate.backends import LOGPROB_FLOOR, Sampling, Step
from surprisegate.backends.cloud import Token
from surprisegate.backends.http_session import StreamedToken
from surprisegate.errors import InputError
from surprisegate.gate.surprise import surprise_bits, topk_entropy


# --------------------------------------------------------------------------------------------------
# the oracle: the two functions as they were
# --------------------------------------------------------------------------------------------------
def old_server_step(tok: StreamedToken, sampling: Sampling, n_vocab, token_bytes) -> Step:
    """http_session.ServerSteps._step before the shared helper (`backend.n_vocab`, `backend.token_bytes`)."""
    piece = tok.piece if tok.piece is not None else token_bytes(tok.token)
    if tok.logprob is None or not sampling.scored:
        return Step(tok.token, piece, math.nan, math.nan)
    tops = sorted(((t, max(lp, LOGPROB_FLOOR)) for t, lp in tok.top), key=lambda e: -e[1])
    logprob = max(tok.logprob, LOGPROB_FLOOR)
    try:
        entropy = topk_entropy([lp for _, lp in tops], vocab_size=n_vocab) if tops else math.nan
    except InputError:
        entropy = math.nan
    known = [(t, lp) for t, lp in tops if t is not None]
    top = tuple(known[: sampling.top_logprobs]) if sampling.top_logprobs else ()
    return Step(tok.token, piece, surprise_bits(logprob), entropy, top)


def old_step_of(tok: Token, sampling: Sampling) -> Step:
    """cloud.step_of before the shared helper."""
    if tok.logprob is None or not sampling.scored:
        return Step(tok.token, tok.piece, math.nan, math.nan)
    tops = sorted(((t, max(lp, LOGPROB_FLOOR)) for t, lp in tok.top), key=lambda e: -e[1])
    try:
        entropy = topk_entropy([lp for _, lp in tops], None) if tops else math.nan
    except InputError:  # a rounded top k that sums above 1: no estimate rather than a wrong one
        entropy = math.nan
    known = [(t, lp) for t, lp in tops if t is not None]
    top = tuple(known[: sampling.top_logprobs]) if sampling.top_logprobs > 0 else ()
    return Step(tok.token, tok.piece, surprise_bits(max(tok.logprob, LOGPROB_FLOOR)), entropy, top)


# --------------------------------------------------------------------------------------------------
# generated tokens
# --------------------------------------------------------------------------------------------------
def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same(a: Step, b: Step) -> bool:
    """Equal field for field, floats by their bits (nan included)."""
    return (
        a.token == b.token
        and a.piece == b.piece
        and bits(a.surprise) == bits(b.surprise)
        and bits(a.entropy) == bits(b.entropy)
        and len(a.top_logprobs) == len(b.top_logprobs)
        and all(i == j and bits(x) == bits(y) for (i, x), (j, y) in zip(a.top_logprobs, b.top_logprobs, strict=True))
        and a.hidden is None
        and b.hidden is None
    )


# Logprobs as streams send them: ordinary values, values near 0 and near the floor, the float32 lowest and
# vLLM's clamp (below the floor), -inf; NaN too (the parsers refuse it, the helper must still agree).
SPECIAL = [0.0, -0.0, -1e-12, -5e-324, LOGPROB_FLOOR, LOGPROB_FLOOR * (1 + 1e-16), -9999.0, -3.4028234663852886e38]
logprobs = st.one_of(
    st.floats(min_value=-30.0, max_value=0.0),
    st.floats(max_value=0.0, allow_infinity=True),
    st.sampled_from([*SPECIAL, -math.inf, math.nan]),
)
ids = st.one_of(st.none(), st.integers(0, 200_000))
tops = st.lists(st.tuples(ids, logprobs), max_size=24)
# A top k of a real distribution (sums to at most 1), with ties, as most streams send it.
tied = st.lists(st.sampled_from([-0.1, -1.0, -2.5, -2.5, -7.0, -20.0]), max_size=22).map(
    lambda lps: [(i, lp) for i, lp in enumerate(lps)]
)
samplings = st.builds(
    Sampling, temperature=st.sampled_from([0.0, 0.7]), scored=st.booleans(), top_logprobs=st.integers(0, 25)
)
vocabs = st.one_of(st.none(), st.integers(1, 64), st.integers(49_152, 200_000))
pieces = st.binary(max_size=8)


@settings(max_examples=3000, deadline=None)
@given(
    token=st.integers(0, 200_000),
    piece=st.one_of(st.none(), pieces),
    logprob=st.one_of(st.none(), logprobs),
    top=st.one_of(tops, tied),
    sampling=samplings,
    n_vocab=vocabs,
)
def test_a_server_step_is_the_old_one_bit_for_bit(token, piece, logprob, top, sampling, n_vocab):
    tok = StreamedToken(token, piece, logprob, tuple(top))

    def token_bytes(t: int) -> bytes:
        return f"<{t}>".encode()

    new_piece = tok.piece if tok.piece is not None else token_bytes(tok.token)
    new = sampling.streamed_step(tok.token, new_piece, tok.logprob, tok.top, n_vocab)
    assert same(new, old_server_step(tok, sampling, n_vocab, token_bytes))


@settings(max_examples=3000, deadline=None)
@given(
    token=st.one_of(st.none(), st.integers(0, 200_000)),
    piece=pieces,
    logprob=st.one_of(st.none(), logprobs),
    top=st.one_of(tops, tied),
    sampling=samplings,
)
def test_a_cloud_step_is_the_old_one_bit_for_bit(token, piece, logprob, top, sampling):
    tok = Token(piece, logprob, tuple(top), token)
    assert same(sampling.streamed_step(tok.token, tok.piece, tok.logprob, tok.top), old_step_of(tok, sampling))


def test_the_helper_on_known_values():
    sampling = Sampling(top_logprobs=2)
    step = sampling.streamed_step(7, b" Paris", -0.5, [(None, -1.5), (7, -0.5), (3, -2.0)], vocab_size=None)
    assert step.surprise == surprise_bits(-0.5) and step.top_logprobs == ((7, -0.5), (3, -2.0))  # ids only, sorted
    assert step.entropy == topk_entropy([-0.5, -1.5, -2.0])
    floored = sampling.streamed_step(1, b"x", -3.4e38, [(1, -math.inf)])
    assert floored.surprise == surprise_bits(LOGPROB_FLOOR) and floored.top_logprobs == ((1, LOGPROB_FLOOR),)
    unscored = Sampling(scored=False).streamed_step(1, b"x", -0.5, [(1, -0.5)])
    assert math.isnan(unscored.surprise) and math.isnan(unscored.entropy) and unscored.top_logprobs == ()
    no_logprob = sampling.streamed_step(None, b"x", None, [(1, -0.5)])
    assert no_logprob.token is None and math.isnan(no_logprob.surprise) and no_logprob.top_logprobs == ()
    over_one = sampling.streamed_step(1, b".", -0.2, [(1, -0.2), (2, -1.7)])  # a rounded top k above 1: no estimate
    assert math.isnan(over_one.entropy) and over_one.surprise == surprise_bits(-0.2)

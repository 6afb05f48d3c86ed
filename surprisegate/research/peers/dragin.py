"""DRAGIN (Su et al. 2024, arXiv 2403.10081): the RIND trigger and the QFS query, as their code computes them.

Pinned to oneal2000/DRAGIN `src/generate.py` at commit 4d71efcf6712bf82c4a5c7c81455af4efee20dcc (method
"dragin", query_formulation "real_words", attention solver "max", check_real_words on): `word_ranges` is
the token merge of `BasicGenerator.generate_attn`, `rind_signals` its attention and entropy per word,
`rind_check` `AttnWeightRAG.modifier`, `qfs_query` `AttnWeightRAG.keep_real_words`.
tests/test_peers.py holds each to the numbers their functions give on our model (scripts/peer_fixtures.py).

Two of their choices are kept although they look like accidents, because the numbers depend on them:
the attention is read from a second forward pass over the *generated tokens alone* (no prompt), and token
id 13 (Llama-2's newline) starts a word whatever the model. Their space marker is chosen by model type
("▁" for every model_type "llama", which SmolLM2 is although its tokenizer marks spaces with "Ġ"): we pass
the tokenizer's own marker, which is what their rule means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

LLAMA2_NEWLINE_ID = 13  # generate_attn and keep_real_words start a word at this id, whatever the model
LEADING_EOS_PIECE = "</s>"  # a leading "</s>" is left out of the attention's normalisation


@dataclass(frozen=True)
class RindSignals:
    """One generation as DRAGIN sees it: its words, the attention each receives, each word's mean entropy."""

    words: list[str]
    attention: list[float]
    entropy: list[float]


@dataclass(frozen=True)
class RindHit:
    """A sentence RIND flags: the sentences before it, its words, and which of them crossed the threshold."""

    before: str
    words: list[str]
    hit: list[int]
    values: list[float]


def word_ranges(pieces: Sequence[str], ids: Sequence[int], space_token: str) -> list[list[int]]:
    """Inclusive [first, last] token ranges of words: a word starts at a space marker, at id 13, or after "</s>"."""
    ranges: list[list[int]] = []
    for i, piece in enumerate(pieces):
        if (
            i == 0
            or piece.startswith(space_token)
            or ids[i] == LLAMA2_NEWLINE_ID
            or (i > 0 and pieces[i - 1] == LEADING_EOS_PIECE)
        ):
            ranges.append([i, i])
        else:
            ranges[-1][-1] += 1
    return ranges


def word_texts(pieces: Sequence[str], ranges: Sequence[Sequence[int]], space_token: str) -> list[str]:
    return ["".join(pieces[a : b + 1]).replace(space_token, "") for a, b in ranges]


def attention_received(attention: np.ndarray, pieces: Sequence[str], ranges: Sequence[Sequence[int]]) -> list[float]:
    """solver "max": the largest attention any later token pays a token (over queries), mean over heads,
    summed over the word's tokens. `attention` is the last layer's (heads, queries, keys)."""
    per_token = attention.max(axis=1).mean(axis=0)
    if per_token.shape[0] > 1 and pieces[0] == LEADING_EOS_PIECE:
        per_token = per_token / float(per_token[1:].sum())
    return [float(per_token[a : b + 1].sum()) for a, b in ranges]


def token_entropies(scores: np.ndarray) -> np.ndarray:
    """Entropy in nats of each step's softmax, as scipy.special.softmax then -sum p log(p + 1e-10) (float32)."""
    scores = np.asarray(scores, dtype=np.float32)
    shifted = scores - scores.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=-1, keepdims=True)
    return -np.sum(probs * np.log(probs + np.float32(1e-10)), axis=-1)


def word_means(values: Sequence[float], ranges: Sequence[Sequence[int]]) -> list[float]:
    return [float(sum(values[a : b + 1]) / (b - a + 1)) for a, b in ranges]


def rind_signals(
    pieces: Sequence[str], ids: Sequence[int], scores: np.ndarray, attention: np.ndarray, space_token: str
) -> RindSignals:
    """generate_attn's words, attention per word and mean entropy per word for one generation.

    `scores` are the generation's next-token scores (steps, vocab); `attention` the last layer's attention
    of a forward pass over `ids` alone (heads, len, len)."""
    ranges = word_ranges(pieces, ids, space_token)
    return RindSignals(
        words=word_texts(pieces, ranges, space_token),
        attention=attention_received(attention, pieces, ranges),
        entropy=word_means(list(token_entropies(scores)), ranges),
    )


def _contains_content_word(token: str, content_words: set[str]) -> bool:
    return any(word in token for word in content_words)


def rind_values(
    text: str, signals: RindSignals, sentences: Callable[[str], list[str]]
) -> Iterator[tuple[int, list[str], int, int, list[float]]]:
    """Each sentence's RIND values as modifier computes them: (sentence index, the sentences, first word, end
    word, values), values = attention normalised within the sentence x mean entropy x the sentence's length."""
    words, weight = signals.words, signals.entropy
    split = sentences(text)
    tid = 0
    for sid, sentence in enumerate(split):
        tl = tr = tid
        if sid == len(split) - 1:
            tl, tr = tid, len(words)
        else:
            for i in range(tid + 1, len(words)):
                if sentence in " ".join(words[tl:i]):
                    tr = i
                    break
            tid = tr
        attention = np.array(signals.attention[tl:tr])
        with np.errstate(invalid="ignore", divide="ignore"):
            attention = attention / sum(attention)
        yield sid, split, tl, tr, [float(attention[i - tl] * weight[i] * (tr - tl)) for i in range(tl, tr)]


def rind_check(
    text: str,
    signals: RindSignals,
    threshold: float,
    sentences: Callable[[str], list[str]],
    content_words: Callable[[str], set[str]] | None,
) -> RindHit | None:
    """AttnWeightRAG.modifier: the first sentence holding a word whose RIND value exceeds `threshold`; None when
    no word does.

    `sentences(text)` splits as spaCy does (stripped, non-empty); `content_words(sentence)` gives the words
    tagged NOUN, ADJ, VERB, PROPN or NUM (None: no real-words filter)."""
    words = signals.words
    for sid, split, tl, tr, values in rind_values(text, signals, sentences):
        hit = [1 if v > threshold else 0 for v in values]
        if 1 in hit:
            if content_words is not None:
                real = content_words(split[sid])
                hit = [h if _contains_content_word(words[tl + i], real) else 0 for i, h in enumerate(hit)]
            before = "" if sid == 0 else " ".join(split[:sid])
            return RindHit(before, list(words[tl:tr]), hit, values)
    return None


def qfs_attention(attention: np.ndarray, ranges: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """keep_real_words' attention of each word over the words before it: for each of its tokens, the
    previous token's attention (mean over heads) over the positions before the word, normalised, then
    averaged over the word's tokens and summed per word. `attention` is (heads, len, len)."""
    mean = attention.mean(axis=0)
    length = mean.shape[0]
    out = []
    for a, b in ranges:
        acc = np.zeros(length, dtype=np.float32)
        for i in range(a, b + 1):
            if i == 0:
                continue
            row = mean[i - 1][:a]
            with np.errstate(invalid="ignore", divide="ignore"):
                row = row / row.sum()
            padded = np.zeros(length, dtype=np.float32)
            padded[:a] = row
            acc += padded
        acc /= b - a + 1
        out.append(np.array([acc[c : d + 1].sum() for c, d in ranges], dtype=np.float32))
    return out


def qfs_select(
    words: Sequence[str],
    per_word_attention: Sequence[np.ndarray],
    current_words: int,
    hit: Sequence[int],
    content_words: set[str],
    keep_top_k: int,
) -> tuple[str, list[float]]:
    """The query: the `keep_top_k` content words that the flagged words attend to most, in text order.
    Returns (query, the flagged words' mean attention over all words)."""
    start = len(words) - current_words
    forward = np.zeros(len(words), dtype=np.float32)
    flagged = 0
    for i, h in enumerate(hit):
        if h == 1:
            forward += per_word_attention[start + i]
            flagged += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        forward = forward / np.float32(flagged)
    scores = forward.tolist()
    pairs = [
        (scores[i], word, i)
        for i, word in enumerate(words)
        if not (i >= start and hit[i - start]) and _contains_content_word(word, content_words)
    ]
    top_k = min(keep_top_k, len(pairs))
    pairs = sorted(pairs, key=lambda p: p[0], reverse=True)[:top_k]
    pairs = sorted(pairs, key=lambda p: p[2])
    return " ".join(p[1] for p in pairs), scores

"""ETC (Li et al. 2025, arXiv 2511.09980): the entropy trend trigger, as their code computes it.

Pinned to pkuserc/ETC `generate.py` at commit facd465538d91a3c9017f002fe235aefb96389b8: `etc_word_ranges` is
`Generator.merge_tokens`, `etc_signals` the signals of `Generator.generate` (attention to the new words, word
entropy as the max over its tokens, the first and second differences over content words and their dynamic
smoothing `mt_s2`), `etc_check` `ETC.hallucination_check`, `etc_query` `ETC.generate_retrieve_qry`.
tests/test_peers.py holds each to the numbers their functions give on our model (scripts/peer_fixtures.py).

The trigger multiplies the smoothed trend by the attention a word receives within its sentence (their
code); `attention=False` is the trend alone (their paper's formula). Kept from their code because the numbers
depend on it: the attention rows are the last len(new) rows of the whole sequence, which includes the end
token when the generation ended; normalising the attention to the new words writes into the matrix the
query later reads.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

ETC_THRESHOLD = 1.3  # their config.json (Llama-3-8B on IIRC)
PUNCTUATION_AND_SPACE = string.whitespace + string.punctuation


@dataclass(frozen=True)
class Block:
    """A piece of the prompt or of the generation, tokenized on its own; `ranges` are half-open words."""

    text: str
    tokens: list[str]
    ranges: list[list[int]]


@dataclass(frozen=True)
class EtcSignals:
    atten: np.ndarray  # (new words, all words), after the in-place normalisation of the new words' columns
    max_atten: np.ndarray  # (new words,) the most attention each new word pays a new word
    entropies: np.ndarray  # (new words,) max token entropy (nats) within the word
    s1: list[float]
    s2: list[float]
    mt_s2: list[float]
    content: list[int]  # 1 for a content word


@dataclass(frozen=True)
class EtcHit:
    start: int  # the first flagged word (index in the new block)
    end: int  # the end of its sentence
    thres: list[bool]  # flagged words from start to end


def etc_word_ranges(tokens: Sequence[str], space_token: str, cannot_merge: set) -> list[list[int]]:
    """Half-open word ranges: a word starts at a space marker, and punctuation, spaces, BOS and EOS stand alone."""
    ranges: list[list[int]] = []
    for i, token in enumerate(tokens):
        if i == 0 or token.startswith(space_token) or token in cannot_merge or tokens[i - 1] in cannot_merge:
            ranges.append([i, i + 1])
        else:
            ranges[-1][1] += 1
    return ranges


def merged_ranges(blocks: Sequence[Block]) -> list[list[int]]:
    """merge_blocks' word ranges over the concatenated blocks (a block without words shifts nothing)."""
    out: list[list[int]] = []
    start = 0
    for block in blocks:
        if block.ranges:
            for a, b in block.ranges:
                out.append([start + a, start + b])
            start = out[-1][1]
    return out


def _entropies(scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float32)
    shifted = scores - scores.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=-1, keepdims=True)
    return (-probs * np.log(probs + np.float32(1e-10))).sum(axis=-1)


def _differences(entropies: np.ndarray, function_words: set[int]) -> tuple[list[float], list[float]]:
    """First difference of each content word's entropy from the previous content word; second difference
    from the last earlier word with a non-zero first difference (0 where there is none)."""
    n = len(entropies)
    s1 = [0.0] * n
    s2 = [0.0] * n
    e = entropies.astype(np.float64)
    for i in range(n - 1):
        if i + 1 in function_words:
            continue
        j = i
        while j >= 0:
            if j not in function_words:
                s1[i + 1] = float(e[i + 1] - e[j])
                break
            if j == 0:
                break
            j -= 1
    for i in range(n - 2):
        if i + 2 in function_words:
            continue
        j = i + 1
        while j >= 1:
            if s1[j] != 0:
                s2[i + 2] = s1[i + 2] - s1[j]
                break
            if j == 1:
                break
            j -= 1
    return s1, s2


def _smoothed(s2: Sequence[float]) -> list[float]:
    """mt_s2: each non-zero second difference blended with the previous one, weight 0.9-1.0 by how far each
    lies from the running mean (their Mt; the previous value carried is the raw difference, as in their code)."""
    out = [0.0] * len(s2)
    count, total, previous = 0, 0.0, 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(2, len(s2)):
            if s2[i] != 0:
                count += 1
                total += s2[i]
                mean = total / count
                w = np.float64(abs(previous - mean)) / np.float64(abs(s2[i] - mean) + abs(previous - mean))
                alpha = 0.9 + 0.1 * w
                out[i] = float(alpha * s2[i] + (1 - alpha) * previous)
                previous = s2[i]
    return out


def etc_signals(
    attention: np.ndarray,
    blocks: Sequence[Block],
    scores: np.ndarray,
    content_words: set[str],
    tokens_to_string: Callable[[list[str]], str],
) -> EtcSignals:
    """Generator.generate's signals. `attention` is the last layer's (heads, len, len) over the whole sequence
    the model produced (prompt, new tokens and, when it ended, the end token); `blocks[-1]` the new block;
    `scores` the generation's next-token scores (steps, vocab); `content_words` those spaCy tags NOUN, ADJ,
    VERB, PROPN or NUM in the new text."""
    new = blocks[-1]
    all_ranges = merged_ranges(blocks)
    rows = attention[:, -len(new.tokens) :, :].mean(axis=0)
    per_word = np.stack([rows[:, a:b].sum(axis=-1) for a, b in all_ranges], axis=-1)
    atten = np.stack([per_word[a:b, :].mean(axis=-2) for a, b in new.ranges], axis=-2)
    n_new = len(new.ranges)
    totals = atten.sum(axis=-1, keepdims=True)
    atten[:, -n_new:] = atten[:, -n_new:] / (totals + np.float32(1e-10))
    max_atten = atten[:, -n_new:].max(axis=1)
    token_entropy = _entropies(scores)
    entropies = np.array([token_entropy[a:b].max() for a, b in new.ranges], dtype=np.float32)
    function_words = {
        i
        for i, (a, b) in enumerate(new.ranges)
        if not any(word in tokens_to_string(new.tokens[a:b]) for word in content_words)
    }
    s1, s2 = _differences(entropies, function_words)
    return EtcSignals(
        atten=atten,
        max_atten=max_atten,
        entropies=entropies,
        s1=s1,
        s2=s2,
        mt_s2=_smoothed(s2),
        content=[0 if i in function_words else 1 for i in range(n_new)],
    )


def etc_values(
    signals: EtcSignals,
    new: Block,
    sentences: list[str],
    tokens_to_string: Callable[[list[str]], str],
    use_attention: bool = True,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """Each sentence's values as hallucination_check computes them: (first word, end word, values), values =
    attention within the sentence (normalised to its length) x mt_s2, or mt_s2 alone."""
    n_words = len(new.ranges)
    wid = 0
    for sentence in sentences:
        wl = wr = wid
        if wid == n_words:
            break
        while wr < n_words and sentence not in tokens_to_string(new.tokens[new.ranges[wl][0] : new.ranges[wr][1]]):
            wr += 1
        if wr < n_words:
            wr += 1
        wid = wr
        if wl == wr:
            continue
        trend = np.array(signals.mt_s2[wl:wr], dtype=np.float64)
        if use_attention:
            weight = signals.max_atten[wl:wr]
            weight = weight * (wr - wl) / (weight.sum() + np.float32(1e-10))
            yield wl, wr, weight.astype(np.float64) * trend
        else:
            yield wl, wr, trend


def etc_check(
    signals: EtcSignals,
    new: Block,
    sentences: list[str],
    threshold: float,
    tokens_to_string: Callable[[list[str]], str],
    use_attention: bool = True,
    absolute: bool = False,
) -> EtcHit | None:
    """ETC.hallucination_check: the first word, sentence by sentence, whose value exceeds `threshold`."""
    for wl, wr, value in etc_values(signals, new, sentences, tokens_to_string, use_attention):
        thres = (np.abs(value) if absolute else value) > threshold
        for i in range(wl, wr):
            if thres[i - wl]:
                return EtcHit(start=i, end=wr, thres=[bool(t) for t in thres[i - wl : wr]])
    return None


def etc_query(
    signals: EtcSignals,
    blocks: Sequence[Block],
    hit: EtcHit,
    content_words: set[str],
    tokens_to_string: Callable[[list[str]], str],
    keep_top_k: int,
) -> str:
    """ETC.generate_retrieve_qry over blocks laid out as theirs: [instructions, lead, question, answer lead,
    text so far, new]. The flagged words' attention to the question's and earlier answer's words picks the
    `keep_top_k` content words (content: tagged so in the whole prompt), kept in text order."""
    all_ranges = merged_ranges(blocks)
    tokens = [t for b in blocks for t in b.tokens]
    n = [len(b.ranges) for b in blocks]
    ques_st = n[0] + n[1]
    ques_en = ques_st + n[2]
    text_st = ques_en + n[3]
    text_en = text_st + n[4] + hit.start
    rows = np.array(hit.thres)
    ques = signals.atten[hit.start : hit.end, ques_st:ques_en][rows, :].sum(axis=0)
    text = signals.atten[hit.start : hit.end, text_st:text_en][rows, :].sum(axis=0)
    pairs = []
    for span, scores, offset in ((range(ques_st, ques_en), ques, ques_st), (range(text_st, text_en), text, text_st)):
        for i in span:
            a, b = all_ranges[i]
            word = tokens_to_string(tokens[a:b])
            if any(w in word for w in content_words):
                pairs.append((float(scores[i - offset]), word, i))
    top_k = min(keep_top_k, len(pairs))
    pairs.sort(key=lambda p: -p[0])
    pairs = pairs[:top_k]
    pairs.sort(key=lambda p: p[2])
    return " ".join(p[1] for p in pairs)

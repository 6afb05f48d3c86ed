"""The peers' decoding loops (DRAGIN's AttnWeightRAG.inference, ETC.inference) over the gate's prompt and arms.

Their loops are kept: generate a stretch, check it, and on a hit keep the sentences before the flagged one,
retrieve with the peer's query, re-send the whole prompt with the passages and keep one new sentence.
What changes for a chat model (theirs prompt base models with few-shot cases): the prompt is the chat
template with the question, passages go in a system turn as the gate's evidence does, and a generation ends
at the model's end token, which is not part of the text (theirs decodes it into the text).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...config import Config
from . import dragin, etc, nlp, seakr
from .common import Costs, PeerModel, join_nonempty, prompt_ids, retrieve

DRAGIN_THRESHOLD = 1.0  # their configs use 0.6-1.5 per model and data set; tuned here on a dev half
QFS_KEEP_TOP_K = 35  # retrieve_keep_top_k of their HotpotQA configs (25-40 across configs)
# FL-RAG's stretch: their FL-RAG configs set no `fix_length` (the code reads one), so the length is ours.
FIX_LENGTH = 16


@dataclass
class PeerOutcome:
    reply: str
    costs: Costs
    triggered: bool


def _dragin_signals(model: PeerModel, gen, costs: Costs) -> dragin.RindSignals:
    """RIND's inputs for a generation without its end token (their base-model text has none to strip)."""
    n = gen.reply_len
    attention = model.last_layer_attention(gen.ids[:n], costs)
    return dragin.rind_signals(gen.pieces[:n], gen.ids[:n], gen.scores[:n], attention, model.space_token)


def qfs(model: PeerModel, before: str, hit: dragin.RindHit, keep_top_k: int, costs: Costs) -> str:
    """keep_real_words: re-read the text up to the flagged sentence, pick the words its flagged words attend to."""
    all_text = before + " " + " ".join(hit.words)
    ids = model.tokenizer.encode(all_text)
    pieces = model.tokenizer.convert_ids_to_tokens(ids)
    attention = model.last_layer_attention(ids, costs)
    ranges = dragin.word_ranges(pieces, ids, model.space_token)
    words = dragin.word_texts(pieces, ranges, model.space_token)
    per_word = dragin.qfs_attention(attention, ranges)
    query, _ = dragin.qfs_select(words, per_word, len(hit.words), hit.hit, nlp.content_words(all_text), keep_top_k)
    return query


def run_dragin(
    backend: Any,
    question: str,
    config: Config,
    arms: Mapping[str, Any],
    prefix: str = "",
    threshold: float = DRAGIN_THRESHOLD,
    keep_top_k: int = QFS_KEEP_TOP_K,
) -> PeerOutcome:
    model = PeerModel(backend)
    costs = Costs()
    text, triggered = prefix, False
    max_len = config.max_tokens
    while True:
        old_len = len(text)
        gen = model.generate(prompt_ids(model, question, config, [], text), max_len, costs)
        ids = gen.reply_ids
        if not ids:
            break
        new_text = model.decode(ids)
        signals = _dragin_signals(model, gen, costs)
        hit = dragin.rind_check(new_text, signals, threshold, nlp.sentences, nlp.content_words)
        if hit is None:
            text = join_nonempty(text, new_text)
            if gen.ended:
                break  # a chat model's reply is over at its end token
        else:
            triggered = True
            query = qfs(model, join_nonempty(question, text, hit.before), hit, keep_top_k, costs)
            docs = retrieve(arms, config, query, question, costs)
            kept = join_nonempty(text, hit.before)
            regen = model.generate(prompt_ids(model, question, config, docs, kept), max_len, costs)
            new_sentence = nlp.top_sentence(model.decode(regen.ids))
            text = join_nonempty(kept, new_sentence)
        if len(model.encode_plain(text)) > max_len or len(text) <= old_len or "the answer is" in text:
            break
    return PeerOutcome(text[len(prefix) :].strip() if prefix else text, costs, triggered)


def _etc_blocks(model: PeerModel, question: str, config: Config, text: str) -> list[etc.Block]:
    """The prompt laid out as ETC's five blocks: [template head, lead, question, answer lead, text so far]
    (their lead "\nQuestion:" is part of our template head, so the lead block is empty)."""
    from ...gate.prompting import PromptLayout, chat_messages

    layout = PromptLayout.from_template(model.backend.chat_prompt, chat_messages(question, config.system_prompt))
    pieces = list(layout.body_pieces)
    last_plain = max(i for i, (_, is_template) in enumerate(pieces) if not is_template)  # the user's question
    head = [_block(model, t, plain=not tpl) for t, tpl in pieces[:last_plain]]
    tail = "".join(t for t, _ in pieces[last_plain + 1 :]) + layout.open_assistant
    return [
        _concat(head),
        _block(model, "", plain=True),
        _block(model, pieces[last_plain][0], plain=True),
        _block(model, tail, plain=False),
        _block(model, text, plain=True),
    ]


def _concat(blocks: list[etc.Block]) -> etc.Block:
    tokens = [t for b in blocks for t in b.tokens]
    return etc.Block("".join(b.text for b in blocks), tokens, etc.merged_ranges(blocks))


def _block(model: PeerModel, text: str, plain: bool) -> etc.Block:
    ids = model.backend.tokenize(text, special=not plain) if text else []
    tokens = model.tokenizer.convert_ids_to_tokens(ids)
    return etc.Block(text, tokens, model.etc_word_ranges(tokens))


def run_etc(
    backend: Any,
    question: str,
    config: Config,
    arms: Mapping[str, Any],
    prefix: str = "",
    threshold: float = etc.ETC_THRESHOLD,
    use_attention: bool = True,
    keep_top_k: int = QFS_KEEP_TOP_K,
) -> PeerOutcome:
    model = PeerModel(backend)
    costs = Costs()
    text, triggered = prefix, False
    max_len = config.max_tokens
    while True:
        old_len = len(text)
        blocks = _etc_blocks(model, question, config, text)
        prompt = [i for b in blocks for i in model.tokenizer.convert_tokens_to_ids(b.tokens)]
        gen = model.generate(prompt, max_len, costs, stop_newline=True)
        tokens = gen.pieces[: gen.reply_len]
        if len(gen.pieces) <= 1:
            break  # their "empty" generation
        new = etc.Block(model.tokens_to_string(tokens), tokens, model.etc_word_ranges(tokens))
        all_blocks = [*blocks, new]
        attention = model.last_layer_attention(prompt + gen.ids, costs)
        new_text = model.decode(gen.ids[: len(tokens)])
        signals = etc.etc_signals(
            attention, all_blocks, gen.scores, nlp.content_words(new.text), model.tokens_to_string
        )
        hit = etc.etc_check(
            signals, new, nlp.sentences(new.text), threshold, model.tokens_to_string, use_attention=use_attention
        )
        if hit is None:
            text = join_nonempty(text, new_text)
            if gen.ended or len(prompt) + len(tokens) > max_len:
                break  # their check counts the whole prompt with the new tokens
        else:
            triggered = True
            merged_text = "".join(b.text for b in all_blocks)
            query = etc.etc_query(
                signals, all_blocks, hit, nlp.content_words(merged_text), model.tokens_to_string, keep_top_k
            )
            docs = retrieve(arms, config, query, question, costs)
            kept = join_nonempty(text, model.tokens_to_string(new.tokens[: new.ranges[hit.start][0]]))
            regen = model.generate(prompt_ids(model, question, config, docs, kept), max_len, costs, stop_newline=True)
            regen_ids = regen.reply_ids
            new_sentence = nlp.top_sentence(model.decode(regen_ids))
            text = join_nonempty(kept, new_sentence)
            if regen.ended and len(new_sentence) >= len(model.decode(regen_ids).strip()):
                break
        if len(model.encode_plain(text)) > max_len or len(text) <= old_len:
            break
    return PeerOutcome(text[len(prefix) :].strip() if prefix else text, costs, triggered)


def _sample_embeddings(model: PeerModel, prompt: list[int], samples: int, max_new: int, costs: Costs, seed: int):
    """k sampled continuations (their temperature, top-k, top-p) and the middle layer's hidden state at each
    one's last token: one batched generate, then one forward pass per sample to read the state (counted)."""
    torch = model._torch
    torch.manual_seed(seed)
    out = model.hf_generate(
        prompt,
        max_new,
        do_sample=True,
        temperature=seakr.TEMPERATURE,
        top_k=seakr.TOP_K,
        top_p=seakr.TOP_P,
        num_return_sequences=samples,
    )
    costs.prefilled += len(prompt)
    layer = model.model.config.num_hidden_layers // 2
    rows = []
    for seq in out[:, len(prompt) :].tolist():
        new = [t for t in seq if t not in model.eos_ids]
        costs.decoded += len(new) + 1
        if not model.decode(new).strip():
            continue  # their engine leaves empty samples out
        with torch.inference_mode():
            states = model.model(torch.tensor([prompt + new], dtype=torch.long), output_hidden_states=True)
        costs.prefilled += len(prompt) + len(new)
        rows.append(states.hidden_states[layer][0, -1].float().numpy())
    return np.stack(rows) if rows else np.zeros((0, 1), np.float32)


def seakr_uncertainty(
    model: PeerModel, prompt: list[int], samples: int, max_new: int, costs: Costs, seed: int
) -> float:
    z = _sample_embeddings(model, prompt, samples, max_new, costs, seed)
    return seakr.eigen_score(z) if len(z) > 1 else 0.0  # their engine scores 0 without two samples


def run_seakr(
    backend: Any,
    question: str,
    config: Config,
    arms: Mapping[str, Any],
    prefix: str = "",
    threshold: float = seakr.EIGEN_THRESHOLD,
    samples: int = 8,
    seed: int = 0,
) -> PeerOutcome:
    """SeaKR for one answer (their main_simpleqa.py and eval_singlehop.ipynb): a greedy reply and k samples;
    below the threshold the reply stands; otherwise retrieve, score k samples with each passage in the prompt,
    and answer with the passage whose samples agree most (the lowest EigenScore), as their selection does."""
    model = PeerModel(backend)
    costs = Costs()
    max_len = config.max_tokens
    prompt = prompt_ids(model, question, config, [], prefix)
    greedy = model.generate(prompt, max_len, costs)
    reply = model.decode(greedy.ids)
    if seakr_uncertainty(model, prompt, samples, max_len, costs, seed) < threshold:
        return PeerOutcome(reply, costs, False)
    docs = retrieve(arms, config, question, question, costs)
    if not docs:
        return PeerOutcome(reply, costs, True)
    scored = []
    for i, doc in enumerate(docs):
        with_doc = prompt_ids(model, question, config, [doc], prefix)
        scored.append((seakr_uncertainty(model, with_doc, samples, max_len, costs, seed + 1 + i), i, with_doc))
    _, _, best = min(scored, key=lambda s: (np.nan_to_num(s[0], nan=np.inf), s[1]))
    return PeerOutcome(model.decode(model.generate(best, max_len, costs).ids), costs, True)


def run_entropy_rule(
    backend: Any,
    question: str,
    config: Config,
    arms: Mapping[str, Any],
    prefix: str = "",
    threshold: float = 1.5,
) -> PeerOutcome:
    """The question-level rule Moskvoretskii et al. (2025) found as good as the complex pipelines: answer; if the
    answer's mean token entropy (nats) is at least the threshold, retrieve with the question and answer again
    with the passages."""
    model = PeerModel(backend)
    costs = Costs()
    prompt = prompt_ids(model, question, config, [], prefix)
    gen = model.generate(prompt, config.max_tokens, costs)
    n = gen.reply_len
    reply = model.decode(gen.ids[:n])
    if n == 0 or float(dragin.token_entropies(gen.scores[:n]).mean()) < threshold:
        return PeerOutcome(reply, costs, False)
    docs = retrieve(arms, config, question, question, costs)
    if not docs:
        return PeerOutcome(reply, costs, True)
    again = model.generate(prompt_ids(model, question, config, docs, prefix), config.max_tokens, costs)
    return PeerOutcome(model.decode(again.ids), costs, True)


def run_single_retrieval(
    backend: Any, question: str, config: Config, arms: Mapping[str, Any], prefix: str = "", threshold: float = 0.0
) -> PeerOutcome:
    """DRAGIN's SR-RAG baseline (SingleRAG.inference): retrieve with the question, answer once with the passages.
    `threshold` is unused (every question retrieves); it keeps the peers' one signature."""
    model = PeerModel(backend)
    costs = Costs()
    docs = retrieve(arms, config, question, question, costs)
    gen = model.generate(prompt_ids(model, question, config, docs, prefix), config.max_tokens, costs)
    return PeerOutcome(model.decode(gen.reply_ids), costs, True)


def run_fixed_retrieval(
    backend: Any,
    question: str,
    config: Config,
    arms: Mapping[str, Any],
    prefix: str = "",
    threshold: float = 0.0,
    fix_length: int | None = None,
) -> PeerOutcome:
    """DRAGIN's FL-RAG and FS-RAG baselines (FixLengthRAG.inference): before every stretch retrieve (with the
    question first, then with the last stretch), re-send the whole prompt with the passages and the text so far,
    and keep `fix_length` new tokens (FL-RAG) or the first new sentence (FS-RAG, fix_length None). Their stops:
    the text is over the length budget, stopped growing, or says "the answer is"; and, for a chat model, the
    generation ended at its end token with nothing of it left unkept."""
    model = PeerModel(backend)
    costs = Costs()
    text, query = prefix, question
    while True:
        old_len = len(text)
        docs = retrieve(arms, config, query, question, costs)
        gen = model.generate(prompt_ids(model, question, config, docs, text), fix_length or config.max_tokens, costs)
        new_text = model.decode(gen.reply_ids).strip()
        if fix_length is None:
            sentences = nlp.sentences(new_text)
            if not sentences:
                break
            new_text = sentences[0]
            whole = len(sentences) == 1
        else:
            whole = True
        text, query = join_nonempty(text, new_text), new_text
        if gen.ended and whole:
            break  # a chat model's reply is over at its end token
        if len(model.encode_plain(text)) > config.max_tokens or len(text) <= old_len or "the answer is" in text:
            break
    return PeerOutcome(text[len(prefix) :].strip() if prefix else text, costs, True)

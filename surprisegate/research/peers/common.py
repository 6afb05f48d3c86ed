"""What every peer needs from the model and the arms: greedy generation with its scores, the last layer's
attention, hidden states, and retrieval through the gate's own arms, with every token counted.

Peers re-send the whole prompt on each generation (their code keeps no cache between calls), so each call's
prompt counts as tokens prefilled, and so does each extra forward pass they make to read attention.
"""

from __future__ import annotations

import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from ...arms import Evidence, Query
from ...config import Config, evidence_text
from ...errors import InputError
from ...gate.grounding import arm_order
from ...gate.prompting import PromptLayout, chat_messages, encode
from ...gate.router import route
from . import etc

DOCS_PER_RETRIEVAL = 3  # DRAGIN's and ETC's retrieve_topk


@dataclass
class Generation:
    ids: list[int]
    pieces: list[str]  # the tokenizer's own token strings ("Ġthe")
    scores: np.ndarray  # (steps, vocab) float32: the scores each token was chosen from, end token included
    ended: bool  # stopped at an end token (not at the length limit)
    prompt_ids: list[int]

    @property
    def reply_len(self) -> int:
        """Tokens of the reply itself: the end token, where the generation stopped at one, is not text."""
        return len(self.ids) - 1 if self.ended else len(self.ids)

    @property
    def reply_ids(self) -> list[int]:
        return self.ids[: self.reply_len]


@dataclass
class Costs:
    decoded: int = 0
    prefilled: int = 0
    retrievals: int = 0
    queries: list[str] = field(default_factory=list)


class PeerModel:
    """The transformers backend's model, driven the way the peers' code drives it (HF generate, eager
    attention for `output_attentions`)."""

    def __init__(self, backend: Any) -> None:
        if not hasattr(backend, "hf_model"):
            raise InputError(
                f"the peers' modes read attention and hidden states, which backend {backend.name!r} does not "
                "give; run them with --backend transformers (the same GGUF, dequantised)"
            )
        self.backend = backend
        self.model = backend.hf_model
        self.tokenizer = backend.hf_tokenizer
        import torch

        self._torch = torch
        if getattr(self.model.config, "_attn_implementation", "eager") != "eager":
            self.model.set_attn_implementation("eager")  # sdpa returns no attention weights
        self.space_token = self.tokenizer.tokenize(" ")[0]
        self.eos_ids = sorted(backend.eos_token_ids)

    def generate(self, prompt_ids: Sequence[int], max_new: int, costs: Costs, stop_newline: bool = False) -> Generation:
        """Greedy, as their code calls HF generate; the scores come back with the ids."""
        options: dict[str, Any] = {"stop_strings": "\n", "tokenizer": self.tokenizer} if stop_newline else {}
        out = self.hf_generate(
            prompt_ids, max_new, do_sample=False, return_dict_in_generate=True, output_scores=True, **options
        )
        new = out.sequences[0, len(prompt_ids) :].tolist()
        scores = np.stack([s[0].float().numpy() for s in out.scores]) if out.scores else np.zeros((0, 1), np.float32)
        ended = bool(new) and new[-1] in self.eos_ids
        costs.prefilled += len(prompt_ids)
        costs.decoded += len(new)
        return Generation(new, self.tokenizer.convert_ids_to_tokens(new), scores, ended, list(prompt_ids))

    def hf_generate(self, prompt_ids: Sequence[int], max_new: int, **options: Any) -> Any:
        """transformers' generate on one prompt, stopping at the model's end tokens (counting is the caller's)."""
        torch = self._torch
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new,
                eos_token_id=self.eos_ids,
                pad_token_id=self.eos_ids[0],
                **options,
            )

    def last_layer_attention(self, ids: Sequence[int], costs: Costs) -> np.ndarray:
        """(heads, len, len) attention of the last layer over `ids` alone, one forward pass (counted)."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(torch.tensor([list(ids)], dtype=torch.long), output_attentions=True)
        costs.prefilled += len(ids)
        return out.attentions[-1][0].float().numpy()

    @cached_property
    def cannot_merge(self) -> set:
        """ETC's tokens_cannot_merged: the token of each space or punctuation character, the space marker, BOS
        and EOS."""
        tok = self.tokenizer
        marks = string.whitespace + string.punctuation
        single = {tok.convert_ids_to_tokens(tok.encode("0" + ch)[-1:])[0] for ch in marks}
        return single | {self.space_token, tok.bos_token, tok.eos_token}

    def etc_word_ranges(self, tokens: list[str]) -> list[list[int]]:
        return etc.etc_word_ranges(tokens, self.space_token, self.cannot_merge)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def tokens_to_string(self, tokens: list[str]) -> str:
        return self.tokenizer.convert_tokens_to_string(tokens)

    def encode_plain(self, text: str) -> list[int]:
        return self.backend.tokenize(text) if text else []


def prompt_ids(model: PeerModel, question: str, config: Config, docs: Sequence[Evidence], reply: str) -> list[int]:
    """The chat prompt (template pieces special, text plain), the retrieved passages in a system turn as
    the gate injects evidence, the assistant turn opened and the reply so far."""
    tokenize = model.backend.tokenize
    layout = PromptLayout.from_template(model.backend.chat_prompt, chat_messages(question, config.system_prompt))
    ids = layout.body_tokens(tokenize)
    if docs:
        ids += layout.segment_tokens(tokenize, context_text(config, docs), "system_turn")
    return ids + layout.open_tokens(tokenize) + model.encode_plain(reply)


def context_text(config: Config, docs: Sequence[Evidence]) -> str:
    """Several passages as one evidence segment: the gate's template once, the passages a line each. (Numbered
    "[1] ..." lines, DRAGIN's layout for base models, had SmolLM2 copy the numbering into its reply in 11 of
    69 grounded replies on factqa half B.)"""
    if len(docs) == 1:
        return evidence_text(config, docs[0])
    joined = replace(docs[0], evidence="\n".join(d.evidence for d in docs))
    return evidence_text(config, joined)


def retrieve(
    arms: Mapping[str, Any], config: Config, query: str, question: str, costs: Costs, deadline_s: float | None = None
) -> list[Evidence]:
    """The peer's query through the gate's arms, in the router's order for it: the first arm with evidence
    gives up to three passages. One retrieval counted whether or not anything is found."""
    costs.retrievals += 1
    costs.queries.append(query)
    r = route(query, question, "")
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else config.round_deadline_s)
    for name in arm_order(config, r.span_class, arms):
        try:
            found = arms[name].ground(
                Query(span=query, question=query, sentence=query, span_class=r.span_class), deadline
            )
        except Exception:  # noqa: BLE001 - an arm's failure is "nothing found" for the peer, as for the gate
            found = []
        if found:
            return list(found[:DOCS_PER_RETRIEVAL])
    return []


def join_nonempty(*parts: str) -> str:
    return " ".join(p for p in (s.strip() for s in parts) if p)


__all__ = ["Costs", "Generation", "PeerModel", "context_text", "encode", "join_nonempty", "prompt_ids", "retrieve"]

"""A scripted steerable backend with fixed logits, for the loop's tests (like simonw/llm's MockModel).

Vocabulary: the 256 bytes plus three specials. The "model" writes a target reply chosen from the
text of its context, one byte per token, giving each byte a scripted probability: so the test knows
the exact surprise of every token and where the window must cross the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from surprisegate.backends import LocalBackend

IM_START, IM_END, EOS = 256, 257, 258
SPECIALS = {"<|im_start|>": IM_START, "<|im_end|>": IM_END, "<eos>": EOS}
VOCAB = 259


def chatml(messages, add_generation_prompt=True):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ScriptedBackend(LocalBackend):
    """`script(context_text) -> list[(char, prob)]` gives the whole intended reply for a context.

    The intended next byte gets probability `prob`; the rest of the mass is spread evenly. An entry may
    carry a third element, `{char or "<eos>": prob}`, runners-up with their own probabilities.
    """

    name = "scripted"
    model_id = "scripted-test-model"
    eos_token_ids = frozenset({IM_END, EOS})

    def __init__(
        self, script: Callable[[str], list[tuple[str, float]]], trimmable: bool = True, turns_join: bool = False
    ):
        self.script = script
        self.trimmable = trimmable
        # The reply's position: its last assistant turn (False), or all assistant turns joined (a reply whose
        # turn was closed and reopened around evidence, injection = sentence_turn).
        self.turns_join = turns_join
        self.context: list[int] = []
        self.fed_tokens = 0  # every token ever evaluated: rewinds must not re-feed the prompt
        self.append_calls: list[int] = []  # sizes of each append
        self.trim_calls: list[int] = []

    @property
    def n_tokens(self) -> int:
        return len(self.context)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        if not special:  # text from outside: its "<|im_start|>" stays bytes
            return list(text.encode("utf-8"))
        out: list[int] = []
        i = 0
        while i < len(text):
            for name, tid in SPECIALS.items():
                if text.startswith(name, i):
                    out.append(tid)
                    i += len(name)
                    break
            else:
                out.extend(text[i].encode("utf-8"))
                i += 1
        return out

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def chat_prompt(self, messages, add_generation_prompt=True):
        return chatml(messages, add_generation_prompt)

    def detokenize(self, tokens: Sequence[int]) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        out, buf = [], bytearray()
        for t in tokens:
            if t < 256:
                buf.append(t)
            else:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(names[t])
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def reset(self) -> None:
        self.context = []

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        self.context.extend(int(t) for t in tokens)
        self.fed_tokens += len(tokens)
        self.append_calls.append(len(tokens))
        return self.logits()

    def logits(self) -> np.ndarray:
        text = self.detokenize(self.context)
        turns = [t.split("<|im_end|>", 1)[0] for t in text.split("<|im_start|>assistant\n")[1:]]
        turn = "".join(turns) if self.turns_join else text.rsplit("<|im_start|>assistant\n", 1)[-1]
        plan = self.script(text)
        pos = len(turn.encode("utf-8"))
        alternatives: dict = {}
        if pos < len(plan):
            char, prob, *more = plan[pos]
            target = ord(char)
            alternatives = more[0] if more else {}
        else:
            target, prob = IM_END, 0.99
        # Optional runners-up per position: {char or "<eos>": prob}, e.g. an end of turn that outranks the byte.
        others = {SPECIALS.get(c, IM_END) if len(c) > 1 else ord(c): p for c, p in alternatives.items()}
        rest = (1.0 - prob - sum(others.values())) / (VOCAB - 1 - len(others))
        logits = np.full(VOCAB, math.log(rest), dtype=np.float32)
        logits[target] = math.log(prob)
        for tid, p in others.items():
            logits[tid] = math.log(p)
        return logits

    def can_trim(self) -> bool:
        return self.trimmable

    def trim(self, n: int) -> int:
        k = min(n, len(self.context))
        if k:
            del self.context[-k:]
        self.trim_calls.append(k)
        return k


def plan(text: str, prob: float = 0.95, doubtful: str = "", doubtful_prob: float = 0.02) -> list[tuple[str, float]]:
    """A reply plan: every byte at `prob`, except the bytes of `doubtful` (first occurrence) at `doubtful_prob`."""
    out = [(c, prob) for c in text]
    if doubtful:
        start = text.index(doubtful)
        for i in range(start, start + len(doubtful)):
            out[i] = (text[i], doubtful_prob)
    return out


def bits(p: float) -> float:
    return -math.log2(p)


class ScriptedStream:
    """A ChatStream over scripted steps; raises `fault` after `fault_after` steps when given."""

    def __init__(self, steps, finish_reason="stop", no_logprobs=None, fault=None, fault_after=0):
        self._steps, self._fault, self._fault_after = list(steps), fault, fault_after
        self.finish_reason: str | None = None
        self._final_reason, self.no_logprobs = finish_reason, no_logprobs
        self.closed = False

    def __iter__(self):
        return self._run()

    def _run(self):
        for i, step in enumerate(self._steps):
            if self._fault is not None and i == self._fault_after:
                raise self._fault
            yield step
        if self._fault is not None:
            raise self._fault
        self.finish_reason = self._final_reason

    def close(self) -> None:
        self.closed = True


class ScriptedChat:
    """A black-box chat backend (BlackBoxBackend): `script(messages) -> list[(text, prob)]` gives each reply
    as pieces with the probability of each, streamed as unscored steps when `logprobs` is False. Every
    request (messages, sampling) is recorded; `faults` maps a request number (0-based) to (fault, after).
    `top_k`: a provider streaming that many logprobs, whose steps then carry an entropy estimate (the chosen
    token at p, the rest spread evenly over `top_k - 1` others); 0: no entropy (nan)."""

    name = "scripted-chat"
    model_id = "scripted-chat-model"

    def __init__(self, script, logprobs=True, faults=None, top_k=0):
        self.script, self.logprobs, self.faults = script, logprobs, dict(faults or {})
        self.requests: list[dict] = []
        self.top_k = top_k
        if top_k:
            self.SIGNAL_TOP_K = top_k  # which calibration applies (model_calibrations.backend_top_k)

    def _entropy(self, p: float) -> float:
        if not self.top_k:
            return math.nan
        rest = (1 - p) / (self.top_k - 1)
        return -(p * math.log2(p)) - (self.top_k - 1) * (rest * math.log2(rest) if rest > 0 else 0.0)

    def chat(self, messages, sampling, max_tokens):
        from surprisegate.backends import Step

        n = len(self.requests)
        self.requests.append({"messages": [dict(m) for m in messages], "scored": sampling.scored})
        scored = self.logprobs and sampling.scored
        steps = [
            Step(None, text.encode(), bits(p) if scored else math.nan, self._entropy(p) if scored else math.nan)
            for text, p in self.script(messages)[:max_tokens]
        ]
        fault, after = self.faults.get(n, (None, 0))
        if after is None:  # refused at request time (an HTTP error), as a real client raises it from chat()
            raise fault
        reason = None if self.logprobs else "scripted-chat offers no logprobs"
        return ScriptedStream(steps, no_logprobs=reason, fault=fault, fault_after=after)

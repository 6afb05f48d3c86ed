"""Patch in place (config.paragraph_goes_on = own_sentence): once a paragraph's rewritten sentence stands, the
reply shows the rewrite but goes on from the model's own sentence, so the rest of the paragraph is what the model
would have written without the round and only the doubtful claim changes. Rewriting the context instead sent
the paragraph elsewhere: of 21 right claims lost on longform_dev, 17 were later claims never written.

Pure helpers; the loop keeps the model's own words for the reply it shows (`OwnWords`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..text import sentence_end
from .reply import Reply
from .rewrite import Unchecked
from .trigger import tokens_before

STOPS = frozenset(".!?")


def sentence_tokens(pieces: list[str]) -> int:
    """How many leading `pieces` hold the sentence they begin: those wholly before its end (the token that
    showed the end may open the next sentence), or all of them while it is still open."""
    end = sentence_end("".join(pieces))
    return len(pieces) if end is None else tokens_before(pieces, end)  # the judge's own rule for its sentences


def junction(text: str) -> str:
    """How a sentence's tokens end, which decides how the next token joins it: "space" (a line break, the next
    token opens the line), "stop" (the next brings its own space) or "open" (the stop is still to come, in the
    next token with the whitespace after it)."""
    if not text:
        return "open"
    if text[-1].isspace():
        return "space"
    return "stop" if text[-1] in STOPS else "open"


@dataclass
class OwnWords:
    """The reply as the model's context holds it: the shown reply with every patched sentence put back as the
    model wrote it. `tokens` is the context's reply for the shown reply's first `upto` tokens; past them both
    are the same. (A round's evidence leaves the context once its rewrite stands: left in, it reads as an
    answered question and the model stopped after one sentence; only the reply is fed again.)"""

    enabled: bool = True  # config.paragraph_goes_on == "own_sentence"; off, nothing is patched
    tokens: list[int] = field(default_factory=list)
    upto: int = 0

    def of(self, shown: list[int], n: int) -> list[int]:
        """The context's reply for the shown reply's first `n` tokens (before a patch both are the shown one)."""
        if n < self.upto:  # never cut back into a patched sentence (rounds come after it): be the shown reply
            return list(shown[:n])
        return self.tokens + list(shown[self.upto : n])

    def patch(self, shown: list[int], start: int, own: list[int], end: int) -> None:
        """The shown reply's tokens [start, end) replace the model's own sentence tokens `own` from `start`."""
        self.tokens, self.upto = self.of(shown, start) + list(own), end

    def patch_in(self, reply: Reply, stood: Unchecked, end: int | None) -> bool:
        """Show the rewrite that `stood`, keep the model's own sentence it replaces in the context: True when
        patched (`end`: `patchable`'s, None when it cannot be)."""
        if not self.enabled or end is None:
            return False
        self.put_back(reply, stood.check_from, stood.own_sentence, end)
        return True

    def put_back(self, reply: Reply, start: int, own: list[int], end: int) -> None:
        """Patch the shown reply's [start, end) with the model's own tokens `own` and cut the reply at `end`."""
        self.patch(reply.tokens, start, own, end)
        reply.cut(end)


def patchable(reply: Reply, stood: Unchecked, token_bytes: Callable[[int], bytes], shown: int) -> int | None:
    """Where the sentence holding the rewrite that `stood` ends (reply index), when it can be patched in place:
    the shown reply then ends with the rewrite's sentence (the token that showed its end is decoded again,
    after the model's own). None when the two end differently (a stop against a line break), or when more than
    the sentence was already `shown` (emit streaming)."""
    start, own = stood.check_from, stood.own_sentence
    end = start + sentence_tokens([p.decode("utf-8", "replace") for p in reply.pieces[start:]])
    own_text = b"".join(token_bytes(t) for t in own).decode("utf-8", "replace")
    if not own or junction(own_text) != junction(reply.between(start, end)) or shown > end:
        return None
    return end

"""The reply's model lent to an arm for a scratch text (`Scribe`, arms/__init__.py).

The scratch text is decoded greedily on the reply's own session, so no second KV cache is needed: the
session keeps the prefix the two prompts share, and the reply's context goes back in before its next step
(`Decoding.lend`). Nothing of the scratch text reaches the reply; its tokens count as decoded.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..backends import Sampling, SteerableBackend
from .prompting import ReplyPrompt
from .reply import Decoding

# Stop this long before the deadline: the arm still has to check the text and return.
DEADLINE_MARGIN_S = 0.05


class SessionScribe:
    """A `Scribe` over the reply's session."""

    def __init__(self, backend: SteerableBackend, decoding: Decoding) -> None:
        self.backend, self.decoding = backend, decoding
        self._written = 0

    @property
    def tokens_written(self) -> int:
        return self._written

    def write(
        self, messages: list[dict[str, str]], lead: str, *, max_tokens: int, stops: Sequence[str], deadline: float
    ) -> str:
        prompt = ReplyPrompt.build(self.backend, messages, lead)
        seen_from = lead.rfind("\n")  # a stop may begin at the lead's last line break ("\ndef")
        tail = lead[seen_from:] if seen_from >= 0 else ""
        pieces: list[bytes] = []
        with self.decoding.lend() as session:
            steps = session.steps(prompt.tokens, Sampling(temperature=0.0, scored=False))
            try:
                for step in steps:
                    if step.token in self.backend.eos_token_ids:
                        break
                    self._written += 1
                    pieces.append(step.piece)
                    text = tail + b"".join(pieces).decode("utf-8", "replace")
                    end = _stop_end(text, stops)
                    if end is not None:
                        return text[len(tail) : end]
                    if len(pieces) >= max_tokens or time.monotonic() >= deadline - DEADLINE_MARGIN_S:
                        break
            finally:
                steps.close()
        return b"".join(pieces).decode("utf-8", "replace")


def _stop_end(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in `text` ends (the stop is kept: the caller sees how the text ended)."""
    found = [(i, i + len(s)) for s, i in ((s, text.find(s)) for s in stops if s) if i >= 0]
    return min(found)[1] if found else None

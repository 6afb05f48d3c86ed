"""The terminal view of a reply: streams its tokens and shows each intervention (what was dropped, which
arm grounded it, with what). An event renderer for `ask` and `demo`; `write` is where text goes."""

from __future__ import annotations

from collections.abc import Callable

import click

from .gate.events import UNSAID_ITEM, Done, Event, Grounding, Rewind, Token, Trigger


def _echo(text: str, nl: bool = True) -> None:
    click.echo(text, nl=nl)


class TerminalView:
    """Streams a reply and shows each intervention: what was dropped, which arm grounded it, with what."""

    def __init__(self, color: bool, write: Callable[..., None] = _echo) -> None:
        self.color = color
        self.write = write  # write(text, nl=True)
        self.pieces: list[str] = []  # text of each visible token, so emit-mode rewinds can retract them

    @property
    def shown(self) -> str:
        return "".join(self.pieces)

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def __call__(self, event: Event) -> None:
        if isinstance(event, Token):
            self.pieces.append(event.text)
            self.write(event.text, nl=False)
        elif isinstance(event, Trigger):
            self.write(self.paint(f"\n  ⚠ round {event.round}: {_crossed(event)}", "33"))
        elif isinstance(event, Grounding):
            self._grounding(event)
        elif isinstance(event, Rewind):
            self._rewind(event)
        elif isinstance(event, Done):
            self.write("")

    def _grounding(self, event: Grounding) -> None:
        arms = " → ".join(event.arm_order)
        if event.found:
            found = f"  ↳ {event.span_class} span, arms {arms}: grounded by {event.source}: {event.evidence!r}"
            self.write(self.paint(found, "36"))
            return
        resumed = f"  ↳ {event.span_class} span, arms {arms or '(none)'}: {event.reason}; resuming unmodified"
        self.write(self.paint(resumed, "2"))
        self.write(self.shown, nl=False)

    def _rewind(self, event: Rewind) -> None:
        if event.n_tokens:  # emit streaming: those tokens were shown; retract them
            del self.pieces[len(self.pieces) - event.n_tokens :]
        dropped = event.dropped_text.strip()
        if event.reverted:
            line = f"  ⟲ the rewrite {dropped!r} used none of the evidence; keeping the reply written without it"
        elif not dropped:  # a round for an unsaid asked item: nothing is rewound
            line = f"  ⟲ injected {event.injected_tokens} tokens of evidence after the reply; writing on"
        else:
            line = f"  ⟲ dropped {dropped!r}, injected {event.injected_tokens} tokens of evidence; rewriting"
        self.write(self.paint(line, "35"))
        self.write(self.shown, nl=False)


def _crossed(event: Trigger) -> str:
    span = event.span_text.strip()
    if event.statistic == UNSAID_ITEM:  # no doubtful words: the question's words for an item the reply left unsaid
        return f"asked item unsaid: {span!r}, asked of the arms"
    if event.statistic == "probe":  # a logistic score, not bits
        return f"probe score {event.value:.2f} > cut {event.threshold:.2f} on the first sentence {span!r}"
    return f"{event.statistic} {event.value:.2f} > {event.threshold:.2f} bits on {span!r}"

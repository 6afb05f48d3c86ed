"""terminal: the event renderer of `ask` and `demo`, fed events directly and read back as text."""

from __future__ import annotations

from surprisegate.gate.events import Done, Grounding, Rewind, Token, Trigger
from surprisegate.gate.result import ReplyResult
from surprisegate.terminal import TerminalView


class Screen:
    """Collects what the view writes, as click.echo would print it."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, text: str, nl: bool = True) -> None:
        self.text += text + ("\n" if nl else "")


def view_and_screen(color: bool = False) -> tuple[TerminalView, Screen]:
    screen = Screen()
    return TerminalView(color=color, write=screen), screen


def tokens(view: TerminalView, *texts: str) -> None:
    for i, text in enumerate(texts):
        view(Token(i, i, text, 1.0, 1.0))


def test_a_window_shows_in_bits_and_a_probe_as_a_score():
    view, screen = view_and_screen()
    view(Trigger(3, "entropy:mean", 1.661, 1.03, 0, "The capital of Burk", 1))
    view(Trigger(9, "probe", 1.834, 0.77, 0, "The capital is Kouar-Boukoula.", 2))
    assert [line for line in screen.text.splitlines() if line] == [
        "  ⚠ round 1: entropy:mean 1.66 > 1.03 bits on 'The capital of Burk'",
        "  ⚠ round 2: probe score 1.83 > cut 0.77 on the first sentence 'The capital is Kouar-Boukoula.'",
    ]


def test_a_round_for_an_unsaid_item_names_the_item_and_rewinds_nothing():
    view, screen = view_and_screen()
    view(Trigger(40, "asked item unsaid", 0.0, 0.0, 41, "its currency", 3))
    view(Rewind(3, 0, "", 52))
    assert [line for line in screen.text.splitlines() if line] == [
        "  ⚠ round 3: asked item unsaid: 'its currency', asked of the arms",
        "  ⟲ injected 52 tokens of evidence after the reply; writing on",
    ]


def test_tokens_stream_and_done_ends_the_line():
    view, screen = view_and_screen()
    tokens(view, "The", " capital", ".")
    result = ReplyResult("The capital.", "stop", [], "Q?", None, 1.0, n_tokens=3, tokens_decoded=3, latency_ms=1.0)
    view(Done(result))
    assert screen.text == "The capital.\n" and view.shown == "The capital."


def test_grounding_found_names_the_arm_and_the_evidence():
    view, screen = view_and_screen()
    view(Grounding(1, "entity", ("memory", "web"), True, "memory:bf", "Burkina Faso: capital Ouagadougou.", "ok"))
    assert screen.text == (
        "  ↳ entity span, arms memory → web: grounded by memory:bf: 'Burkina Faso: capital Ouagadougou.'\n"
    )


def test_grounding_not_found_says_why_and_reprints_what_was_shown():
    view, screen = view_and_screen()
    tokens(view, "The", " capital")
    view(Grounding(1, "other", (), False, None, None, "closed question (yes_no)"))
    assert screen.text.endswith(
        "  ↳ other span, arms (none): closed question (yes_no); resuming unmodified\nThe capital"
    )


def test_an_emit_rewind_retracts_the_shown_tokens_and_reprints_the_rest():
    view, screen = view_and_screen()
    tokens(view, "The", " capital", " is", " Bobo")
    view(Rewind(1, 2, " is Bobo", 23))
    assert view.shown == "The capital"
    assert screen.text.endswith("  ⟲ dropped 'is Bobo', injected 23 tokens of evidence; rewriting\nThe capital")


def test_a_reverted_rewrite_says_the_reply_without_it_is_kept():
    view, screen = view_and_screen()
    tokens(view, "Paris")
    view(Rewind(1, 0, " I'm ready to help.", 0, reverted=True))
    assert view.shown == "Paris"
    assert 'the rewrite "I\'m ready to help." used none of the evidence; keeping the reply written without it' in (
        screen.text
    )


def test_color_paints_the_interventions_only_when_asked():
    plain, plain_screen = view_and_screen(color=False)
    colored, colored_screen = view_and_screen(color=True)
    for view in (plain, colored):
        view(Trigger(3, "entropy:mean", 2.0, 1.0, 0, "Burk", 1))
    assert "\x1b[" not in plain_screen.text and "\x1b[33m" in colored_screen.text

"""`surprisegate receipts view`: a receipt as one self-contained HTML page, to see what the gate did.

Per reply: the reply's tokens coloured by their surprise (hover: surprise, entropy and the window statistic),
where each rewrite starts, every round (what it doubted, struck through, the evidence and its source, and
what came of it), and a plot of surprise over the reply with the window statistic and its threshold. Plain
HTML and inline SVG: no script, no request to any host, so the page opens from a file or an e-mail.

Every text in it comes from outside (the prompt, the reply, evidence from memory and the web) and is
escaped: a reply that writes "<script>" shows those characters.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from .gate.events import UNSAID_ITEM

# Surprise (bits) at which a token's colour is at its deepest; below 1 bit a token is left uncoloured.
DEEPEST_BITS = 8.0
PLOT_WIDTH, PLOT_HEIGHT = 720, 140

_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 860px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.meta { color: #666; font-size: 0.85em; }
.reply { white-space: pre-wrap; border: 1px solid #ddd; border-radius: 6px; padding: 0.8em; }
.tok { border-radius: 2px; }
.rewrite { color: #0a6; font-weight: bold; }
.round { border-left: 4px solid #c33; padding: 0.3em 0.8em; margin: 0.8em 0; background: #fafafa; }
.round.rewound { border-color: #0a6; } .round.reverted { border-color: #d90; }
del { color: #b22; } .evidence { background: #eefbe9; padding: 0.2em 0.4em; border-radius: 3px; }
.source { color: #555; font-family: monospace; font-size: 0.9em; }
svg { border: 1px solid #ddd; border-radius: 6px; }
"""


def render_page(receipts: Sequence[dict[str, Any]]) -> str:
    """One HTML page showing each receipt in turn."""
    title = "surprisegate receipt" + ("s" if len(receipts) != 1 else "")
    body = "\n".join(render_reply(r) for r in receipts) or "<p>No receipts.</p>"
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_STYLE}</style></head>\n<body>\n<h1>{title}</h1>\n{body}\n</body></html>\n"
    )


def render_reply(receipt: dict[str, Any]) -> str:
    """One reply's section: what was asked, the coloured reply, its rounds and its plot."""
    extra = receipt.get("extra") or {}
    rounds = receipt.get("rounds") or []
    reply_id = str(receipt.get("reply_id", ""))
    meta = " · ".join(
        _esc(str(receipt.get(key)))
        for key in ("mode", "backend", "created", "finish_reason")
        if receipt.get(key) is not None
    )
    return "\n".join(
        [
            f"<section class='receipt' id='reply-{_esc(reply_id)}' data-reply-id='{_esc(reply_id)}'>",
            f"<h2>{_esc(str(receipt.get('prompt') or '(prompt not stored)'))}</h2>",
            f"<p class='meta'>{meta} · reply {_esc(reply_id[:12])}</p>",
            f"<div class='reply'>{coloured_reply(receipt.get('reply', ''), extra, rewrite_starts(rounds))}</div>",
            _plot(extra),
            f"<h3>Rounds ({len(rounds)})</h3>" if rounds else "<p class='meta'>No round: nothing was doubted.</p>",
            *(_round(r) for r in rounds),
            "</section>",
        ]
    )


def rewrite_starts(rounds: Iterable[dict[str, Any]]) -> set[int]:
    """Reply token indices where a rewound round's rewrite begins (the reply was cut there and written again)."""
    return {int(r["trigger"]["span_start"]) for r in rounds if r.get("action") == "rewound" and r.get("trigger")}


def coloured_reply(reply: str, extra: dict[str, Any], rewrites: set[int]) -> str:
    """The reply as spans, one per token, coloured by surprise; plain escaped text when the receipt holds no
    token texts that make up the reply (an older receipt, or one cut to fit)."""
    pieces = extra.get("token_pieces") or []
    surprises = extra.get("token_surprises") or []
    if not pieces or "".join(pieces) != reply or len(surprises) != len(pieces):
        return _esc(reply)
    entropies = _padded(extra.get("token_entropies"), len(pieces))
    windows = _padded(extra.get("token_windows"), len(pieces))
    out = []
    for i, piece in enumerate(pieces):
        if i in rewrites:
            out.append("<span class='rewrite' title='rewritten from here'>⟲</span>")
        hover = f"surprise {_bits(surprises[i])} · entropy {_bits(entropies[i])} · window {_bits(windows[i])}"
        out.append(
            f"<span class='tok' data-surprise='{_num(surprises[i])}' style='background:{surprise_colour(surprises[i])}'"
            f" title='{hover}'>{_esc(piece)}</span>"
        )
    return "".join(out)


def surprise_colour(bits: float | None) -> str:
    """Transparent under 1 bit, then ever deeper red up to DEEPEST_BITS."""
    if bits is None or not math.isfinite(bits) or bits < 1.0:
        return "transparent"
    alpha = min(1.0, bits / DEEPEST_BITS) * 0.75
    return f"rgba(220,40,40,{alpha:.2f})"


def _round(rnd: dict[str, Any]) -> str:
    trigger = rnd.get("trigger") or {}
    chosen = rnd.get("chosen") or {}
    action = str(rnd.get("action", ""))
    if trigger.get("statistic") == UNSAID_ITEM:  # nothing was doubted: an asked item the paragraph left unsaid
        crossed = UNSAID_ITEM
        words = f"<div>asked for: <span class='asked'>{_esc(str(trigger.get('span_text', '')))}</span></div>"
    else:
        statistic = _esc(str(trigger.get("statistic", "")))
        crossed = f"{statistic} {_num(trigger.get('value'))} &gt; {_num(trigger.get('threshold'))}"
        doubted = rnd.get("dropped_text") or trigger.get("span_text", "")
        words = f"<div>doubted: <del class='doubted'>{_esc(str(doubted))}</del></div>"
    lines = [
        f"<div class='round {_esc(action)}' data-round='{_esc(str(rnd.get('round')))}' data-action='{_esc(action)}'>",
        f"<b>Round {_esc(str(rnd.get('round')))}</b>: {crossed}",
        words,
    ]
    if chosen:
        lines.append(
            f"<div>evidence: <span class='evidence'>{_esc(str(chosen.get('evidence', '')))}</span> "
            f"<span class='source'>{_esc(str(chosen.get('source', '')))}</span></div>"
        )
    if rnd.get("rewritten_text"):
        lines.append(f"<div>rewrite dropped: <del>{_esc(str(rnd['rewritten_text']))}</del></div>")
    lines.append(f"<div class='meta'>{_esc(action)}: {_esc(str(rnd.get('reason', '')))}</div></div>")
    return "\n".join(lines)


def _plot(extra: dict[str, Any]) -> str:
    """Surprise per token (bars), the window statistic (line) and the threshold it is held to (dashed)."""
    surprises = [s if isinstance(s, (int, float)) else 0.0 for s in extra.get("token_surprises") or []]
    if not surprises:
        return "<p class='meta'>No per-token surprise in this receipt (not scored).</p>"
    windows = _padded(extra.get("token_windows"), len(surprises))
    threshold = extra.get("threshold")
    finite = [w for w in windows if w is not None and math.isfinite(w)]
    top = max([*surprises, *finite, threshold if isinstance(threshold, (int, float)) else 0.0, 1.0])
    low = min([0.0, *finite])
    step = PLOT_WIDTH / len(surprises)

    def y(value: float) -> float:
        return PLOT_HEIGHT - 4 - (value - low) / (top - low) * (PLOT_HEIGHT - 8)

    bars = "".join(
        f"<rect x='{i * step:.1f}' y='{y(max(s, 0.0)):.1f}' width='{max(step - 1, 1):.1f}' "
        f"height='{max(y(0.0) - y(max(s, 0.0)), 0):.1f}' fill='#e88'/>"
        for i, s in enumerate(surprises)
    )
    points = " ".join(f"{(i + 0.5) * step:.1f},{y(w):.1f}" for i, w in enumerate(windows) if w is not None)
    line = ""
    if points:
        line = f"<polyline class='window' points='{points}' fill='none' stroke='#36c' stroke-width='1.5'/>"
    bar_line = ""
    if isinstance(threshold, (int, float)) and math.isfinite(threshold):
        bar_line = (
            f"<line class='threshold' x1='0' x2='{PLOT_WIDTH}' y1='{y(threshold):.1f}' y2='{y(threshold):.1f}' "
            f"stroke='#333' stroke-dasharray='4 3'/>"
        )
    caption = (
        f"<p class='meta'>surprise per token (bars, bits), the window statistic (blue) and its threshold "
        f"{_num(threshold)} (dashed)</p>"
    )
    return (
        f"<svg class='plot' width='{PLOT_WIDTH}' height='{PLOT_HEIGHT}' viewBox='0 0 {PLOT_WIDTH} {PLOT_HEIGHT}' "
        f"role='img' aria-label='surprise over the reply'>{bars}{line}{bar_line}</svg>{caption}"
    )


def _padded(values: Any, n: int) -> list[float | None]:
    values = list(values or [])
    return [v if isinstance(v, (int, float)) else None for v in values[:n]] + [None] * max(0, n - len(values))


def _bits(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} bits"


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and math.isfinite(value) else "–"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)

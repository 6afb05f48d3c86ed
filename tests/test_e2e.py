"""End to end on the real embedded model, through the real CLI in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def sg(*args, home, timeout=300, env_extra=None):
    env = os.environ | {"SURPRISEGATE_HOME": str(home)} | (env_extra or {})
    env.pop("SURPRISE_CANARY", None)
    env.pop("SURPRISE_INTERVENE", None)
    return subprocess.run(
        [sys.executable, "-m", "surprisegate", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def factkb_memory(tmp_path_factory, shared_data):
    pytest.importorskip("llama_cpp")
    home = tmp_path_factory.mktemp("home")
    store = home / "factkb.sqlite"
    out = sg("memory", "add", "--memory", str(store), str(shared_data / "factkb_passages.jsonl"), home=home)
    assert out.returncode == 0, out.stderr
    return home, store


# The evidence templates before issue 22 (results/evidence_template_before_issue22.toml).
EARLIER_TEMPLATES = {
    "SURPRISEGATE_EVIDENCE_TEMPLATE": (
        "{evidence}\nAnswer the user's question in one short sentence, using the text above."
    ),
    "SURPRISEGATE_TOOL_EVIDENCE_TEMPLATE": "Fact: {evidence}",
}


def ask_json(home, *args, env_extra=None):
    out = sg("ask", "--json", *args, home=home, env_extra=env_extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_burkina_faso_capital_via_memory(factkb_memory):
    home, store = factkb_memory
    question = "What is the capital of Burkina Faso?"
    off = ask_json(home, "--mode", "off", "--memory", str(store), question)
    assert "ouagadougou" not in off["reply"].lower()
    assert off["rounds"] == []
    on = ask_json(home, "--mode", "intervene", "--memory", str(store), question)
    assert "Ouagadougou" in on["reply"].split(".")[0]
    rewound = [r for r in on["rounds"] if r["action"] == "rewound"]
    assert rewound and rewound[0]["chosen"]["source"] == "memory:country:BF"
    assert "Ouagadougou" in rewound[0]["chosen"]["evidence"]
    # The receipt was written and says the same.
    lines = [json.loads(line) for line in open(on["receipt"], encoding="utf-8")]
    receipt = next(r for r in lines if r["reply_id"] == on["receipt_id"])
    assert receipt["rounds"][0]["action"] == "rewound" and receipt["config"]["mode"] == "intervene"


def test_multiplication_via_the_calculator(factkb_memory):
    home, store = factkb_memory
    question = "What is 37 times 48?"
    off = ask_json(home, "--mode", "off", "--memory", str(store), question)
    assert "1776" not in off["reply"].replace(",", "")
    on = ask_json(home, "--mode", "intervene", "--memory", str(store), question)
    assert "1776" in on["reply"].replace(",", "")
    chosen = [r["chosen"] for r in on["rounds"] if r["action"] == "rewound"]
    assert chosen and chosen[0]["source"] == "tool:calculator" and chosen[0]["observable"] == 1.0


def test_a_rewrite_that_ignores_the_evidence_gets_one_more_try_then_gives_back_the_plain_reply(factkb_memory):
    # Shown the (right) evidence, the model answers "I'm ready to help. What's your question?": the
    # rewrite repeats nothing of the evidence. One more try with that first token banned answers from the
    # evidence; without the retry, the reply written without evidence comes back, as `off` wrote it.
    # The trigger probe (the default) finds that sentence sound and leaves it alone; the window rule fires
    # on it, which is the path tested here.
    home, store = factkb_memory
    question = "What is the capital of the U.S. state of Virginia?"
    off = ask_json(home, "--mode", "off", question)
    assert "Richmond" in off["reply"]
    probed = ask_json(home, "--mode", "intervene", "--memory", str(store), question)
    assert probed["rounds"] == [] and probed["reply"] == off["reply"]
    # With the data-marked evidence template (issue 22) the first rewrite already answers from the evidence;
    # the template before it gives the rewrite that ignores the evidence, which is the path tested here.
    window_rule = {"SURPRISEGATE_PROBE": "off"}
    marked = ask_json(home, "--mode", "intervene", "--memory", str(store), question, env_extra=window_rule)
    assert "Richmond" in marked["reply"] and not marked["rounds"][0].get("retries")
    window_rule |= EARLIER_TEMPLATES
    on = ask_json(home, "--mode", "intervene", "--memory", str(store), question, env_extra=window_rule)
    from surprisegate.research.grading import first_sentence

    assert "Richmond" in first_sentence(on["reply"])
    first = on["rounds"][0]
    assert first["action"] == "rewound" and first["chosen"]["source"] == "memory:us_state:VA"
    assert first["retries"][0]["rewrite"].strip().startswith("I'm ready to help.")
    assert "used none of the evidence" in first["retries"][0]["problem"]

    no_retry = window_rule | {"SURPRISEGATE_RETRY_FAILED_REWRITE": "0"}
    reverted_run = ask_json(home, "--mode", "intervene", "--memory", str(store), question, env_extra=no_retry)
    assert reverted_run["reply"] == off["reply"]
    (reverted,) = [r for r in reverted_run["rounds"] if r["action"] == "reverted"]
    assert reverted["rewritten_text"].strip() == "I'm ready to help."
    assert "used none of the evidence" in reverted["reason"]
    assert reverted_run["canary"]["anchoring"] == 0  # the reply is not anchored in evidence it did not use
    plain = ask_json(
        home,
        "--mode",
        "intervene",
        "--memory",
        str(store),
        question,
        env_extra=no_retry | {"SURPRISEGATE_REVERT_UNUSED_EVIDENCE": "0"},
    )
    assert "Richmond" not in plain["reply"]  # without the check, the intervention broke a right answer


def test_demo_command_wrong_then_right(tmp_path):
    pytest.importorskip("llama_cpp")
    out = sg("demo", home=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    question, paragraph = out.stdout.split("── summary ──")[1:]
    for summary, right in ((question, "Ouagadougou"), (paragraph, "N'Djamena")):
        off_line = next(line for line in summary.splitlines() if line.startswith("off:"))
        on_line = next(line for line in summary.splitlines() if line.startswith("intervene:"))
        assert right not in off_line and right in on_line
    receipts = [json.loads(line) for line in open(tmp_path / "demo-receipts.jsonl", encoding="utf-8")]
    assert [r["mode"] for r in receipts] == ["off", "intervene", "off", "intervene"]
    round1 = receipts[1]["rounds"][0]
    assert round1["action"] == "rewound" and round1["chosen"]["source"].startswith("memory:")
    assert "Ouagadougou" in round1["chosen"]["evidence"]
    # The paragraph: its wrong capital, mid-paragraph, grounded from the name on; the opening left alone.
    capital = receipts[3]["rounds"][0]
    assert capital["action"] == "rewound" and "N'Djamena" in capital["chosen"]["evidence"]
    assert capital["trigger"]["span_text"].strip().startswith("Koufcontou")
    assert receipts[3]["reply"].startswith("Chad is a vast and diverse nation")
    # Both paragraphs read as replies: one paragraph, ended by a sentence stop, no junk, no second start.
    for receipt in receipts[2:]:
        reply = receipt["reply"].strip()
        opening = reply.split(". ")[0]
        assert "\n\n" not in reply and reply.endswith(".") and reply.count(opening) == 1, reply


def test_ask_streams_and_shows_the_intervention(factkb_memory):
    home, store = factkb_memory
    out = sg("ask", "--mode", "intervene", "--memory", str(store), "What is the capital of Burkina Faso?", home=home)
    assert out.returncode == 0, out.stderr
    assert "⟲ dropped" in out.stdout and "grounded by memory:country:BF" in out.stdout
    last_line = out.stdout.strip().splitlines()[-1]
    assert "Ouagadougou" in last_line
    assert "receipt →" in out.stderr


def test_detect_mode_never_changes_the_reply(factkb_memory):
    home, store = factkb_memory
    question = "What is the capital of Chad?"
    off = ask_json(home, "--mode", "off", question)
    detect = ask_json(home, "--mode", "detect", question)
    assert detect["reply"] == off["reply"] and detect["rounds"] == []
    assert detect["surprise"]["n"] == detect["n_tokens"] and off["surprise"] is None


@pytest.fixture(scope="module")
def web_server(shared_data):
    from surprisegate.local.search_server import serve

    with serve(str(shared_data / "web_corpus.jsonl"), port=0) as server:
        yield server


def test_multi_hop_question_via_the_local_web_server(factkb_memory, web_server):
    home, _ = factkb_memory
    question = "Who directed a 2016 musical filmed in Howth?"  # the musical, then its director
    off = ask_json(home, "--mode", "off", "--memory", "none", question)
    assert "john carney" not in off["reply"].split(".")[0].lower()
    # With the data-marked template the web evidence is used but the rewrite names the musical, not its
    # director (README Results); the template before it answers the second hop.
    marked = ask_json(home, "--mode", "intervene", "--memory", "none", "--web", web_server.url, question)
    assert "Sing Street" in marked["reply"]
    assert any(r["action"] == "rewound" and r["chosen"]["source"].startswith("web:") for r in marked["rounds"])
    on = ask_json(
        home, "--mode", "intervene", "--memory", "none", "--web", web_server.url, question, env_extra=EARLIER_TEMPLATES
    )
    assert "John Carney" in on["reply"].split(".")[0]
    rewound = [r for r in on["rounds"] if r["action"] == "rewound"]
    assert rewound and rewound[0]["chosen"]["source"].startswith("web:searxng:")
    receipt = next(json.loads(line) for line in open(on["receipt"], encoding="utf-8") if on["receipt_id"] in line)
    web_report = next(a for a in receipt["rounds"][0]["arms"] if a["arm"] == "web")
    assert web_report["status"] == "ok" and web_report["latency_ms"] >= 0


def test_a_closed_question_is_left_as_answered_unless_asked(factkb_memory, web_server):
    home, _ = factkb_memory
    question = (
        "Which private research university is located in Chestnut Hill, Massachusetts Boston College or Stanford "
        "University?"
    )
    detect = ask_json(home, "--mode", "detect", "--memory", "none", question)
    kept = ask_json(home, "--mode", "intervene", "--memory", "none", "--web", web_server.url, question)
    assert kept["reply"] == detect["reply"] and "boston college" not in kept["reply"].split(".")[0].lower()
    assert kept["rounds"] and all(r["action"] == "resumed_unmodified" for r in kept["rounds"])
    assert "closed question (choice)" in kept["rounds"][0]["reason"]
    grounded = ask_json(
        home,
        "--mode",
        "intervene",
        "--memory",
        "none",
        "--web",
        web_server.url,
        question,
        env_extra={"SURPRISEGATE_GROUND_CLOSED_QUESTIONS": "1"},
    )
    # with the flag it is grounded like any other question (whether that helps is what the rule is about)
    rewound = [r for r in grounded["rounds"] if r["action"] == "rewound"]
    assert (
        rewound and rewound[0]["chosen"]["source"].startswith("web:searxng:") and rewound[0]["closed_question"] is None
    )

"""End to end as a new user: Markdown and text notes with host names, URLs, decimals and version numbers,
ingested with `surprisegate memory add`, then asked about on the real embedded model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from surprisegate.arms.memory import MemoryArm
from surprisegate.config import load_config
from surprisegate.gate.loop import generate
from surprisegate.research.grading import contains_alias, grade
from surprisegate.store.sqlite import SQLiteMemory

pytestmark = pytest.mark.slow

NOTES = {
    "vpn.md": "# Acme VPN\n\nThe Acme VPN gateway is vpn.acme.example and it listens on port 8443.\n"
    "The VPN client we support is WireGuard version 1.0.20210914.\n",
    "services.md": "# Internal services\n\nThe Acme wiki lives at https://wiki.acme.example/start and is backed up "
    "every night at 02:30.\nThe build server ci.acme.example runs Jenkins 2.426.1.\n"
    "The staging database host is db-staging.acme.example on port 5433.\n",
    "finance.txt": "Travel policy of Acme.\nThe mileage allowance is 0.67 dollars per mile.\n"
    "The daily meal allowance abroad is 45.50 euros.\nThe office coffee machine is a Jura E8 bought in 2019.\n",
    "release.md": "# Release notes\n\nThe latest release of the Acme mobile app is version 4.12.3, shipped on "
    "14 March 2026.\nThe Acme API rate limit is 1200 requests per minute.\n",
}
QUESTIONS = [
    ("What port does the Acme VPN gateway listen on?", "8443"),
    ("What is the host name of the Acme VPN gateway?", "vpn.acme.example"),
    ("Which version of WireGuard does Acme support?", "1.0.20210914"),
    ("What is the address of the Acme wiki?", "https://wiki.acme.example/start"),
    ("What version of Jenkins does the Acme build server run?", "2.426.1"),
    ("What port does the Acme staging database use?", "5433"),
    ("What is the Acme mileage allowance per mile?", "0.67"),
    ("What is the daily meal allowance abroad at Acme?", "45.50"),
    ("What is the latest version of the Acme mobile app?", "4.12.3"),
    ("What is the Acme API rate limit?", "1200"),
]


@pytest.fixture(scope="module")
def notes_memory(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notes")
    for name, text in NOTES.items():
        (folder / name).write_text(text, encoding="utf-8")
    store = folder / "notes.sqlite"
    env = os.environ | {"SURPRISEGATE_HOME": str(folder)}
    out = subprocess.run(
        [sys.executable, "-m", "surprisegate", "memory", "add", "--memory", str(store), str(folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "added 4" in out.stderr + out.stdout
    return {"memory": MemoryArm(SQLiteMemory(str(store)))}


def ask(backend, arms, question: str, **overrides):
    return generate(backend, question, load_config(overrides={"mode": "intervene"} | overrides), arms)


def test_notes_answer_most_questions_and_every_lost_evidence_is_explained(llama_backend, notes_memory):
    right = 0
    for question, gold in QUESTIONS:
        result = ask(llama_backend, notes_memory, question)
        correct = grade(result.text, {"answers": [gold]}).correct
        right += correct
        evidence_held_it = any(
            contains_alias((r.get("chosen") or {}).get("evidence") or "", gold) for r in result.rounds
        )
        if evidence_held_it and not correct:
            # Right evidence, wrong reply: the receipt must say why (a dropped rewrite and its reason).
            explained = [
                r
                for r in result.receipt["rounds"]
                if r["action"] in ("reverted", "resumed_unmodified") and r.get("reason")
            ]
            assert explained, (question, result.text, result.rounds)
    assert right >= 8, f"{right} of {len(QUESTIONS)} right"


def test_a_rewrite_cut_inside_a_host_name_gets_one_more_try(llama_backend, notes_memory):
    question = "What port does the Acme VPN gateway listen on?"
    off = generate(llama_backend, question, load_config(overrides={"mode": "off"}), {})
    assert "8443" not in off.text
    result = ask(llama_backend, notes_memory, question)
    assert "8443" in result.text
    first = result.rounds[0]
    assert first["action"] == "rewound" and first["retries"][0]["how"] == "continued past the end of turn"
    # Without the retry the cut rewrite is dropped, the plain reply comes back, and the receipt says why.
    plain = ask(llama_backend, notes_memory, question, retry_failed_rewrite=False)
    assert plain.text == off.text
    assert plain.rounds[0]["action"] == "reverted" and "vpn" in plain.rounds[0]["reason"]

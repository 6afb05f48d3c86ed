"""The A/B harness on a scripted backend: every mode runs, metrics add up, results resume."""

from __future__ import annotations

import json

import pytest

from surprisegate.arms import Evidence
from surprisegate.config import Config
from surprisegate.errors import InputError
from surprisegate.research.evaluate import evaluate, summarise

from scripted import ScriptedBackend, plan

WRONG, RIGHT = "The capital is Wrongville.", "The capital is Rightburg."


def script(context):
    return plan(RIGHT) if "Rightburg" in context else plan(WRONG, doubtful="Wrongville")


class Memory:
    name = "memory"

    def ground(self, query, deadline):
        return [Evidence("c", "The capital of Testland is Rightburg.", 0.9, "memory:x")]


def config():
    return Config(
        signal="surprise",
        statistic="max",
        window=4,
        threshold=3.0,
        min_tokens=1,
        kind_thresholds={},
        system_prompt="",
        max_tokens=40,
    )


def test_every_mode_runs_and_the_summary_adds_up(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"i{i}",
                    "question": "What is the capital of Testland?",
                    "answers": ["Rightburg"],
                    "category": "entity",
                }
            )
            for i in range(3)
        )
        + "\n"
    )
    modes = ["off", "detect", "intervene", "always", "flare"]
    summary = evaluate(data, modes, ScriptedBackend(script), config(), {"memory": Memory()}, tmp_path / "out")
    m = summary["modes"]
    assert m["off"]["accuracy"] == 0.0 and m["detect"]["accuracy"] == 0.0
    assert m["intervene"]["accuracy"] == 1.0 and m["intervene"]["fixes"] == 3 and m["intervene"]["regressions"] == 0
    assert m["always"]["accuracy"] == 1.0 and m["always"]["grounding_calls"] == 3
    assert m["flare"]["accuracy"] == 1.0 and m["flare"]["tokens_prefilled"] > m["intervene"]["tokens_prefilled"]
    assert m["detect"]["trigger_rate"] == 1.0 and m["off"]["grounding_calls"] == 0
    assert (tmp_path / "out" / "report.md").read_text().count("|") > 20
    # Rerun: nothing left to do, same summary.
    again = evaluate(data, modes, ScriptedBackend(script), config(), {"memory": Memory()}, tmp_path / "out")
    assert again == summary


def test_summarise_counts_regressions_and_intervention_precision():
    rows = [
        {
            "id": "a",
            "mode": "off",
            "correct": True,
            "triggered": False,
            "grounding_calls": 0,
            "tokens_decoded": 5,
            "seconds": 1,
        },
        {
            "id": "b",
            "mode": "off",
            "correct": False,
            "triggered": False,
            "grounding_calls": 0,
            "tokens_decoded": 5,
            "seconds": 1,
        },
        {
            "id": "a",
            "mode": "intervene",
            "correct": False,
            "triggered": True,
            "grounding_calls": 1,
            "tokens_decoded": 5,
            "seconds": 1,
        },
        {
            "id": "b",
            "mode": "intervene",
            "correct": True,
            "triggered": True,
            "grounding_calls": 1,
            "tokens_decoded": 5,
            "seconds": 1,
        },
    ]
    s = summarise(rows, ["off", "intervene"])["modes"]["intervene"]
    assert s["regressions"] == 1 and s["fixes"] == 1 and s["accuracy"] == 0.5
    assert s["intervention_precision"] == 0.5 and s["intervention_recall"] == 1.0


def test_unknown_mode_is_a_clear_error(tmp_path):
    from surprisegate.errors import InputError

    data = tmp_path / "i.jsonl"
    data.write_text(json.dumps({"question": "q", "answers": ["a"]}) + "\n")
    with pytest.raises(InputError, match="'loud'"):
        evaluate(data, ["loud"], ScriptedBackend(script), config(), {}, tmp_path / "o")


def test_resuming_with_other_settings_is_refused_and_keeps_the_results(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text(
        json.dumps(
            {"id": "i0", "question": "What is the capital of Testland?", "answers": ["Rightburg"], "category": "entity"}
        )
        + "\n"
    )
    out = tmp_path / "out"
    evaluate(data, ["off", "intervene"], ScriptedBackend(script), config(), {"memory": Memory()}, out)
    before = (out / "results.jsonl").read_text()
    with pytest.raises(InputError, match=r"threshold: 3.0 -> 9.0.*pass a new --out"):
        evaluate(
            data,
            ["off", "intervene"],
            ScriptedBackend(script),
            config().replace(threshold=9.0),
            {"memory": Memory()},
            out,
        )
    with pytest.raises(InputError, match=r"arms: \['memory'\] -> \[\]"):
        evaluate(data, ["off", "intervene"], ScriptedBackend(script), config(), {}, out)
    assert (out / "results.jsonl").read_text() == before
    # threads change speed, not replies: a resume with other threads is fine
    evaluate(
        data, ["off", "intervene"], ScriptedBackend(script), config().replace(threads=1), {"memory": Memory()}, out
    )


# ------------------------------------------------------------------------------------------------
# oracle: the gate's path forced to ground on exactly the items `off` got wrong, at the gate's budget
# ------------------------------------------------------------------------------------------------
from surprisegate.research.evaluate import choose_oracle_items, trigger_efficiency  # noqa: E402


def mixed_script(context):
    """Easy: right, calm. Edgy: right, but the gate fires. Hard: wrong, the gate fires. Shy: wrong and calm."""
    if "Rightburg" in context or "Easy" in context:
        return plan(RIGHT)
    if "Edgy" in context:
        return plan(RIGHT, doubtful="Rightburg")
    if "Shy" in context:
        return plan(WRONG)  # confidently wrong: only a forced trigger grounds it
    return plan(WRONG, doubtful="Wrongville")


KINDS = {"Easy": 2, "Edgy": 1, "Hard": 2, "Shy": 2}  # off right: Easy, Edgy; off wrong: Hard, Shy
WRONG_IDS = {"Hard0", "Hard1", "Shy0", "Shy1"}


def mixed_items(tmp_path):
    data = tmp_path / "mixed.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"{kind}{i}",
                    "question": f"What is the capital of {kind}land{i}?",
                    "answers": ["Rightburg"],
                    "category": "entity",
                }
            )
            + "\n"
            for kind, n in KINDS.items()
            for i in range(n)
        )
    )
    return data


def rows_of(out, mode):
    rows = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["mode"] == mode:
            rows[r["id"]] = r  # the last row of an id is the one that counts
    return rows


def grounded(out):
    return {i for i, r in rows_of(out, "oracle").items() if r["grounding_calls"] > 0}


def run_mixed(tmp_path, name, modes=("off", "intervene", "oracle"), **kwargs):
    out = tmp_path / name
    summary = evaluate(
        mixed_items(tmp_path), list(modes), ScriptedBackend(mixed_script), config(), {"memory": Memory()}, out, **kwargs
    )
    return summary, out


def test_oracle_grounds_only_off_wrong_items_at_the_gates_budget(tmp_path):
    summary, out = run_mixed(tmp_path, "out")
    m = summary["modes"]
    gate = rows_of(out, "intervene")
    assert {i for i, r in gate.items() if r["grounding_calls"] > 0} == {"Edgy0", "Hard0", "Hard1"}
    assert summary["oracle"]["budget"] == 3 and summary["oracle"]["calls_source"] == "intervene"
    assert summary["oracle"]["chosen"] == 3 and summary["oracle"]["off_wrong"] == 4
    picked = grounded(out)
    assert len(picked) == 3 and picked <= WRONG_IDS
    assert picked == choose_oracle_items(rows_of(out, "off"), 3, 0)
    off, oracle = rows_of(out, "off"), rows_of(out, "oracle")
    for i, r in oracle.items():
        if i not in picked:  # untouched: the off reply, no trigger, no call
            assert (r["reply"], r["correct"], r["triggered"], r["grounding_calls"]) == (
                off[i]["reply"],
                off[i]["correct"],
                False,
                0,
            )
        else:
            assert r["correct"] and r["triggered"] and r["rounds"][0]["action"] == "rewound"
    # off 3/7, intervene 5/7 (Hard fixed), oracle 6/7 (3 of the 4 wrong fixed): efficiency 2/3
    assert (m["off"]["accuracy"], m["intervene"]["accuracy"], m["oracle"]["accuracy"]) == (0.4286, 0.7143, 0.8571)
    assert summary["oracle"]["efficiency"] == 0.6667
    assert m["oracle"]["regressions"] == 0 and m["oracle"]["intervention_precision"] == 1.0
    assert "trigger efficiency (intervene − off) ÷ (oracle − off) accuracy = 0.67" in (out / "report.md").read_text()
    assert json.loads((out / "summary.json").read_text())["oracle"] == summary["oracle"]
    # Resume: nothing is decoded again, same summary.
    before = (out / "results.jsonl").read_text()
    assert run_mixed(tmp_path, "out")[0] == summary
    assert (out / "results.jsonl").read_text() == before


def test_oracle_budget_from_oracle_calls_is_a_seeded_choice_among_the_wrong_items(tmp_path):
    first, out_a = run_mixed(tmp_path, "a", modes=("off", "oracle"), oracle_calls=2, seed=0)
    _, out_b = run_mixed(tmp_path, "b", modes=("off", "oracle"), oracle_calls=2, seed=0)
    assert first["oracle"]["calls_source"] == "--oracle-calls" and first["oracle"]["budget"] == 2
    assert first["oracle"]["efficiency"] is None  # no intervene run to compare
    assert grounded(out_a) == grounded(out_b) == choose_oracle_items(rows_of(out_a, "off"), 2, 0)
    assert len(grounded(out_a)) == 2 and grounded(out_a) <= WRONG_IDS
    off = rows_of(out_a, "off")
    choices = {frozenset(choose_oracle_items(off, 2, seed)) for seed in range(10)}
    assert len(choices) > 1 and all(c <= WRONG_IDS and len(c) == 2 for c in choices)
    # A budget above the wrong count grounds every wrong item and nothing else.
    assert choose_oracle_items(off, 10, 0) == WRONG_IDS


def test_oracle_rows_are_redone_when_the_budget_changes_and_added_to_older_folders(tmp_path):
    out = tmp_path / "old"
    data = mixed_items(tmp_path)
    evaluate(data, ["off", "intervene"], ScriptedBackend(mixed_script), config(), {"memory": Memory()}, out)
    kept = rows_of(out, "intervene")
    # A folder made before the oracle existed resumes with it: only oracle rows are added.
    summary = evaluate(
        data, ["off", "intervene", "oracle"], ScriptedBackend(mixed_script), config(), {"memory": Memory()}, out
    )
    assert rows_of(out, "intervene") == kept and len(grounded(out)) == 3
    smaller = evaluate(
        data,
        ["off", "intervene", "oracle"],
        ScriptedBackend(mixed_script),
        config(),
        {"memory": Memory()},
        out,
        oracle_calls=1,
    )
    assert len(grounded(out)) == 1 and grounded(out) <= WRONG_IDS
    assert smaller["modes"]["oracle"]["grounding_calls"] == 1 < summary["modes"]["oracle"]["grounding_calls"]
    # A larger budget decodes the newly chosen items instead of keeping their copied `off` rows.
    larger = evaluate(
        data,
        ["off", "intervene", "oracle"],
        ScriptedBackend(mixed_script),
        config(),
        {"memory": Memory()},
        out,
        oracle_calls=4,
    )
    assert grounded(out) == WRONG_IDS and larger["modes"]["oracle"]["accuracy"] == 1.0


def test_trigger_efficiency_arithmetic():
    assert trigger_efficiency(0.3, 0.7, 0.9) == 0.6667
    assert trigger_efficiency(0.3, 0.3, 0.8) == 0.0
    assert trigger_efficiency(0.4, 0.2, 0.8) == -0.5  # the gate broke more than it fixed
    assert trigger_efficiency(0.5, 0.6, 0.5) is None  # the oracle gained nothing: no share to give


@pytest.mark.parametrize(
    "modes, calls, needle",
    [
        (["off", "oracle"], None, "add intervene to --modes .* or pass --oracle-calls N"),
        (["intervene", "oracle"], None, r"--modes='intervene,oracle' .* add off, e.g. --modes off,intervene,oracle"),
        (["off", "oracle"], -1, r"--oracle-calls=-1 is negative"),
    ],
)
def test_oracle_without_off_or_budget_is_refused_before_decoding(tmp_path, modes, calls, needle):
    with pytest.raises(InputError, match=needle):
        evaluate(
            mixed_items(tmp_path),
            modes,
            ScriptedBackend(mixed_script),
            config(),
            {"memory": Memory()},
            tmp_path / "o",
            oracle_calls=calls,
        )
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_a_chat_api_runs_only_the_modes_it_can(tmp_path):
    from surprisegate.research.evaluate import check_backend_modes

    from scripted import ScriptedChat

    chat = ScriptedChat(lambda messages: [("Paris.", 0.9)])
    check_backend_modes(["off", "detect", "intervene"], chat)  # the revise pass is its intervene
    with pytest.raises(InputError, match="flare,oracle need a steerable backend"):
        check_backend_modes(["off", "flare", "oracle"], chat)


def test_a_paragraph_set_is_graded_claim_by_claim(tmp_path):
    data = tmp_path / "long.jsonl"
    item = {
        "question": "Write a short paragraph about Testland: its capital and its currency.",
        "claims": [
            {"relation": "capital", "answers": ["Rightburg"]},
            {"relation": "currency", "answers": ["Testmark"]},
        ],
    }
    data.write_text("\n".join(json.dumps({"id": f"p{i}", **item}) for i in range(2)) + "\n")
    opening = "Testland is a small and quiet country."

    def paragraph(context):
        reply = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        capital = "Rightburg" if "Rightburg" in reply or "Rightburg." in context else "Wrongville"
        text = f"{opening} Its capital is {capital}. Its currency is the Testmark."
        return plan(text, doubtful="Wrongville" if capital == "Wrongville" else "")

    cfg = config().replace(max_tokens=160, sentence_threshold=3.0)
    summary = evaluate(
        data, ["off", "intervene", "always"], ScriptedBackend(paragraph), cfg, {"memory": Memory()}, tmp_path / "o"
    )
    off, gated, always = (summary["modes"][m]["claims"] for m in ("off", "intervene", "always"))
    assert (off["right"], off["wrong"], off["claim_accuracy"], off["coverage"]) == (2, 2, 0.5, 1.0)
    assert gated["claim_accuracy"] == 1.0 and gated["claim_fixes"] == 2 and gated["claim_regressions"] == 0
    # always grounds the currency sentence too (a claim, however sure): more calls for the same claims.
    assert always["claim_accuracy"] == 1.0
    assert summary["modes"]["always"]["grounding_calls"] > summary["modes"]["intervene"]["grounding_calls"] == 2
    report = (tmp_path / "o" / "report.md").read_text()
    assert "Claim by claim" in report and "| intervene | 2 | 4 | 1.000 |" in report


def test_always_grounds_every_claim_sentence_with_no_probe_to_judge_them():
    from surprisegate.research.evaluate import always_config

    always = always_config(Config(max_tokens=160, probe="auto"))
    assert always.mode == "intervene" and always.probe == "off" and always.sentence_scope
    assert always.sentence_threshold < 0 and not always.sentence_asked_only


def test_flare_as_their_configs_run_it_goes_on_past_a_cut_without_a_stop_of_ours():
    """Their Punkt cuts "Iowa became a U.S." before " state"; their loop decodes on from there to the end of turn,
    so the reply is the whole sentence, in two look-aheads (the earlier loop stopped at the cut)."""
    pytest.importorskip("nltk")
    from surprisegate.research.evaluate import CountingArm, FlareSettings, run_flare

    reply = "Iowa became a U.S. state in 1846."

    arms = {"memory": CountingArm(Memory())}
    backend = ScriptedBackend(lambda context: plan(reply, 0.99))
    out = run_flare(backend, "When did Iowa become a state?", config(), arms, "", FlareSettings(0.5, 0.4))
    assert out.reply == reply
    assert out.grounding_calls == 0 and not out.triggered
    assert out.tokens_prefilled > 2 * len("When did Iowa become a state?")  # the prompt sent twice: two look-aheads


def test_a_results_row_keeps_what_a_round_went_on_for_and_a_dropped_rewrites_grade():
    from surprisegate.research.evaluate import _round_summary

    item = {"id": "q", "question": "What is the capital of Testland?", "answers": ["Rightburg"]}
    stood = {"action": "rewound", "reason": "grounded", "went_on_for": ["currency"], "chosen": {"source": "memory:x"}}
    dropped = {"action": "reverted", "rewritten_text": "It is Rightburg.", "retries": []}
    assert _round_summary(stood, item)["went_on_for"] == ["currency"] and "rewritten_text" not in _round_summary(
        stood, item
    )
    row = _round_summary(dropped, item)
    assert "went_on_for" not in row and row["rewritten_text"] == "It is Rightburg." and row["rewrite_correct"]

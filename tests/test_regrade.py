"""scripts/regrade.py: saved replies graded again with the current rule; --write rewrites `correct`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "regrade.py"
spec = importlib.util.spec_from_file_location("regrade", SCRIPT)
regrade = importlib.util.module_from_spec(spec)
spec.loader.exec_module(regrade)

ITEMS = [
    {"id": "q1", "question": "Where is Canadian North based?", "answers": ["Iqaluit"], "category": "entity"},
    {"id": "q2", "question": "Where does he live?", "answers": ["Ohio"], "category": "entity"},
    {"id": "q3", "question": "What is the capital of France?", "answers": ["Paris"], "category": "entity"},
    {"id": "q4", "question": "Population?", "answers": ["1000"], "category": "number", "numeric_tolerance": 0.25},
]
ROWS = [
    # Graded before on "Canadian North Inc." alone: wrong -> right now.
    {
        "id": "q1",
        "mode": "off",
        "question": ITEMS[0]["question"],
        "correct": False,
        "reply": "Canadian North Inc. are based in Iqaluit, Nunavut, Canada.",
    },
    # "USA." did not end the sentence before: right -> wrong now.
    {
        "id": "q2",
        "mode": "always",
        "question": ITEMS[1]["question"],
        "correct": True,
        "reply": "He moved to the USA. He lives in Ohio.",
    },
    {"id": "q3", "mode": "off", "question": ITEMS[2]["question"], "correct": True, "reply": "Paris."},
    {"id": "q4", "mode": "off", "question": ITEMS[3]["question"], "correct": True, "reply": "About 1,100 people."},
]


def _write(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in ITEMS))
    results = tmp_path / "results.jsonl"
    # A torn last line (a crash mid-append) and a row of an unknown item stay as they are.
    results.write_text(
        "".join(json.dumps(r) + "\n" for r in ROWS)
        + json.dumps({"id": "zz", "mode": "off", "reply": "x", "correct": True})
        + "\n"
        + '{"id": "q3", "mo\n'
    )
    return data, results


def test_regrade_reports_the_rows_that_moved_without_writing(tmp_path, capsys):
    data, results = _write(tmp_path)
    before = results.read_bytes()
    assert regrade.main(["--data", str(data), str(results)]) == 0
    out = capsys.readouterr().out
    assert "off: 1 changed (right->wrong 0, wrong->right 1)" in out
    assert "always: 1 changed (right->wrong 1, wrong->right 0)" in out
    assert "before: 'Canadian North Inc.'" in out
    assert "after:  'Canadian North Inc. are based in Iqaluit, Nunavut, Canada.'" in out
    assert "before: 'He moved to the USA. He lives in Ohio.'" in out
    assert "after:  'He moved to the USA.'" in out
    assert "2 grade(s) changed" in out
    assert results.read_bytes() == before


def test_regrade_write_rewrites_correct_only(tmp_path, capsys):
    data, results = _write(tmp_path)
    lines = results.read_text().split("\n")
    assert regrade.main(["--data", str(data), "--write", str(results)]) == 0
    new_lines = results.read_text().split("\n")
    assert len(new_lines) == len(lines)
    assert new_lines[2:] == lines[2:]  # unchanged rows, the unknown id and the torn line: byte for byte
    rows = [json.loads(line) for line in new_lines[:2]]
    assert [r["correct"] for r in rows] == [True, False]
    assert [{k: v for k, v in r.items() if k != "correct"} for r in rows] == [
        {k: v for k, v in r.items() if k != "correct"} for r in ROWS[:2]
    ]
    assert list(tmp_path.glob("*.tmp")) == []
    # Graded again: nothing moves any more.
    assert regrade.main(["--data", str(data), str(results)]) == 0
    assert "0 grade(s) changed" in capsys.readouterr().out

"""Progress on stderr through tqdm: a resumed job's rate and ETA count only the work it does now; where
stderr is not a terminal, plain lines at a steady interval and one at the end; stdout stays clean."""

from __future__ import annotations

import io
import json
import re

import pytest
import tqdm.std

from surprisegate.config import Config
from surprisegate.progress import LOG_INTERVAL_S, progress_bar, progress_callback

from scripted import ScriptedBackend, plan


class Clock:
    """A fake clock for tqdm (which reads `tqdm.std.time`): moves only when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(tqdm.std, "time", c)
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    return c


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines_of(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text, "a log got a carriage-return redraw"
    assert text.endswith("\n") and "\n\n" not in text
    return text.splitlines()


def elapsed_s(line: str) -> int:
    m = re.search(r"\[(\d+):(\d\d)<", line)
    assert m, line
    return int(m[1]) * 60 + int(m[2])


def test_a_resumed_bars_rate_and_eta_leave_out_the_items_already_done(clock):
    out = io.StringIO()
    bar = progress_bar("label", total=53, initial=12, stream=out)
    for _ in range(3):
        clock.t += 10.0
        bar.update(1, note="acc 0.67")
    d = bar.bar.format_dict
    assert (d["n"], d["initial"], d["total"], d["elapsed"]) == (15, 12, 53, 30.0)
    # 3 items in 30 s: 10 s an item, 38 left: 380 s. Counting the 12 on disk would say 2 s an item, 76 s left.
    line = bar.bar.format_meter(**d)
    assert "15/53" in line and "10.00s/item" in line and "<06:20" in line, line
    bar.close()
    first, *_, last = lines_of(out)
    assert first.startswith("label: 12/53") and "?item/s" in first  # the resumed count, no rate yet
    assert last.startswith("label: 15/53") and "10.00s/item" in last and "<06:20" in last


def test_the_callback_opens_the_bar_at_the_first_calls_count(clock):
    out = io.StringIO()
    with progress_callback("label", stream=out) as progress:
        progress(12, 53, "")  # the start: 12 on disk
        for done in range(13, 17):
            clock.t += 4.0
            progress(done, 53, f"acc {done}")
    lines = lines_of(out)
    assert lines[0].startswith("label: 12/53")
    assert lines[-1].startswith("label: 16/53") and "4.00s/item" in lines[-1] and lines[-1].endswith("acc 16")
    assert len(lines) == 2  # the start, then 16/53 after 16 s (>= 15 s): already the last, so close adds none


def test_a_log_gets_plain_lines_at_the_interval_and_a_final_count(clock):
    out = io.StringIO()
    with progress_callback("eval", stream=out) as progress:
        progress(0, 41, "")
        for done in range(1, 42):
            clock.t += 4.0
            progress(done, 41, f"off i{done}")
    lines = lines_of(out)
    assert lines[0].startswith("eval: 0/41") and lines[-1].startswith("eval: 41/41 (100%)")
    assert lines[-1].endswith("off i41")
    stamps = [elapsed_s(line) for line in lines]
    gaps = [b - a for a, b in zip(stamps[:-2], stamps[1:-1], strict=True)]
    # 4 s an item, 15 s interval: a line every 4th item (16 s), never sooner, never a minute of silence
    assert gaps and all(LOG_INTERVAL_S <= g < LOG_INTERVAL_S + 4 for g in gaps), gaps
    assert len(lines) == 2 + 41 // 4  # the start, 10 lines at the interval, the last count
    assert all(re.match(r"eval: \d+/41 \( *\d+%\) \[", line) for line in lines)


def test_the_interval_follows_tqdm_mininterval(clock, monkeypatch):
    monkeypatch.setenv("TQDM_MININTERVAL", "30")
    out = io.StringIO()
    with progress_bar("label", total=20, stream=out) as bar:
        for _ in range(20):
            clock.t += 5.0
            bar.update()
    stamps = [elapsed_s(line) for line in lines_of(out)]
    assert stamps == [0, 30, 60, 90, 100]  # every 6th item, and the end


def test_the_last_line_is_not_written_twice(clock):
    out = io.StringIO()
    with progress_callback("label", stream=out) as progress:
        progress(0, 2, "")
        clock.t += 20.0
        progress(1, 2, "")
        clock.t += 20.0
        progress(2, 2, "")  # printed by the update (past the interval): close adds nothing
    assert [line.split(" [")[0] for line in lines_of(out)] == [
        "label: 0/2 (  0%)",
        "label: 1/2 ( 50%)",
        "label: 2/2 (100%)",
    ]


def test_a_job_that_stops_early_still_logs_where_it_got_to(clock):
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress_callback("label", stream=out) as progress:
        progress(5, 53, "")
        for done in range(6, 9):
            clock.t += 1.0
            progress(done, 53, "")
        raise KeyboardInterrupt
    assert lines_of(out)[-1].startswith("label: 8/53")


def test_a_growing_total_and_a_finished_job(clock):
    out = io.StringIO()
    with progress_callback("eval", stream=out) as progress:
        progress(10, 10, "")  # everything on disk already: one line, closed
        assert len(lines_of(out)) == 1 and lines_of(out)[0].startswith("eval: 10/10 (100%)")
    out = io.StringIO()
    with progress_callback("eval", stream=out) as progress:
        progress(0, 2, "")
        progress(1, 2, "")
        progress(2, 3, "")  # an oracle pass redoing a row grows the total
        clock.t += 1.0
        progress(3, 3, "")
    assert lines_of(out)[-1].startswith("eval: 3/3 (100%)")


def test_progress_goes_to_stderr_and_stdout_stays_clean(clock, capsys):
    with progress_callback("label") as progress:
        progress(2, 4, "")
        for done in (3, 4):
            clock.t += 20.0
            progress(done, 4, "acc 1.00")
    with progress_bar("eval", total=3) as bar:
        bar.update(3)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "label: 4/4 (100%)" in captured.err and "eval: 3/3 (100%)" in captured.err
    assert "\r" not in captured.err  # pytest's stderr is not a terminal


def test_a_terminal_gets_tqdms_bar_redrawn_in_place(clock):
    out = Terminal()
    with progress_bar("label", total=4, initial=1, stream=out) as bar:
        for _ in range(3):
            clock.t += 1.0
            bar.update()
    assert "\r" in out.getvalue() and "4/4" in out.getvalue()


# ------------------------------------------------------------------------------------------------
# the callers report the whole job, starting from what is on disk
# ------------------------------------------------------------------------------------------------
def items(path, n):
    path.write_text(
        "".join(
            json.dumps({"id": f"i{i}", "question": "What is the capital of Testland?", "answers": ["Rightburg"]}) + "\n"
            for i in range(n)
        )
    )
    return path


def script(context):
    return plan("The capital is Rightburg.") if "Testland" in context else plan("Paris is nice.")


def test_a_resumed_label_run_starts_its_progress_at_the_labels_on_disk(tmp_path):
    from surprisegate.research.labeling import label

    data, out, config = items(tmp_path / "items.jsonl", 5), tmp_path / "out", Config(system_prompt="", max_tokens=40)
    label(data, out, ScriptedBackend(script), config, limit=2)
    calls: list[tuple[int, int, str]] = []
    summary = label(data, out, ScriptedBackend(script), config, progress=lambda *a: calls.append(a))
    assert summary["already_done"] == 2 and summary["labelled_now"] == 3
    assert [(d, t) for d, t, _ in calls] == [(2, 5), (3, 5), (4, 5), (5, 5)]
    assert calls[0][2] == "" and calls[-1][2].startswith("acc ")


def test_a_resumed_eval_starts_its_progress_at_the_rows_on_disk(tmp_path):
    from surprisegate.research.evaluate import evaluate
    from test_evaluate import Memory
    from test_evaluate import config as eval_config
    from test_evaluate import script as eval_script

    data, out = items(tmp_path / "items.jsonl", 3), tmp_path / "out"
    evaluate(data, ["off"], ScriptedBackend(eval_script), eval_config(), {"memory": Memory()}, out)
    calls: list[tuple[int, int, str]] = []
    evaluate(
        data,
        ["off", "intervene"],
        ScriptedBackend(eval_script),
        eval_config(),
        {"memory": Memory()},
        out,
        progress=lambda *a: calls.append(a),
    )
    assert [(d, t) for d, t, _ in calls] == [(3, 6), (4, 6), (5, 6), (6, 6)]
    assert [n for _, _, n in calls[1:]] == ["intervene i0", "intervene i1", "intervene i2"]


def test_the_cli_label_prints_json_on_stdout_and_progress_on_stderr(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from surprisegate import cli, runtime

    monkeypatch.setattr(runtime, "load_backend", lambda config: ScriptedBackend(script))
    data, out = items(tmp_path / "items.jsonl", 3), tmp_path / "out"
    result = CliRunner().invoke(cli.main, ["label", "--data", str(data), "--out", str(out), "--max-tokens", "40"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["labelled_now"] == 3  # stdout is the JSON alone
    assert "label: 0/3" in result.stderr and "label: 3/3 (100%)" in result.stderr and "\r" not in result.stderr


def test_scripts_use_the_public_helper():
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    assert not [p.name for p in scripts.glob("*.py") if "_progress_bar" in p.read_text()]

"""The configuration reference is made from the Config itself: every key once, its default as TOML would write it."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields

from surprisegate.config import Config, flag_fields
from surprisegate.config_reference import default_text, field_groups, reference_markdown

ROW = re.compile(r"^\| `(\w+)` \| `(.*)` \| `(SURPRISEGATE_\w+)` \| (`[^`]*`)? \| (.*) \|$")


def rows() -> dict[str, tuple[str, ...]]:
    out = {}
    for line in reference_markdown().splitlines():
        if m := ROW.match(line):
            assert m.group(1) not in out, f"{m.group(1)} appears twice"
            out[m.group(1)] = m.groups()[1:]
    return out


def test_every_key_appears_once_with_its_variable_and_flag():
    table = rows()
    assert list(table) == [f.name for f in fields(Config)]
    flags = {name: flag for name, flag, _, _ in flag_fields()}
    for name, (_, env, flag, _) in table.items():
        assert env == f"SURPRISEGATE_{name.upper()}"
        assert (flag or "") == (f"`{flags[name]}`" if name in flags else "")


def test_every_default_reads_back_as_the_default():
    defaults = Config().to_dict()
    for name, (default, *_rest) in rows().items():
        text = default.replace("\\|", "|")
        if isinstance(defaults[name], dict):
            assert tomllib.loads(f"x = {text}")["x"] == {k: float(v) for k, v in defaults[name].items()}
        else:
            assert tomllib.loads(f"x = {text}")["x"] == defaults[name], name


def test_defaults_are_written_as_toml():
    assert default_text(True) == "true" and default_text(0.5) == "0.5" and default_text(["a", "b"]) == '["a", "b"]'
    assert default_text('say "x"\n') == '"say \\"x\\"\\n"'
    assert default_text({"b": 1, "a": 2.5}) == '{"a" = 2.5, "b" = 1.0}'


def test_groups_follow_the_config_source_in_order():
    groups = field_groups()
    assert groups["mode"] == "detection" and groups["idle_timeout"].startswith("inference servers")
    headings = [line[3:] for line in reference_markdown().splitlines() if line.startswith("## ")]
    assert headings[0] == "Detection" and len(headings) == len(set(headings)) >= 5

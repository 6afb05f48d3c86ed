"""The configuration reference, made from the one Config: every key, its default, its environment variable, its
flag and its help, grouped as config.py groups them. The docs site builds its page from this, so nothing about a
key is written twice (scripts/docs_hooks.py)."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import MISSING, fields
from typing import Any

from .config import Config, flag_fields

# config.py marks its groups with "# --- name ---" lines among the fields.
_GROUP = re.compile(r"^\s*# --- (.+?) ---\s*$")
_FIELD = re.compile(r"^\s{4}(\w+): ")


def field_groups() -> dict[str, str]:
    """Each field's group, read from the "# --- group ---" lines of the Config class body."""
    group, groups = "general", {}
    for line in inspect.getsource(Config).splitlines():
        if m := _GROUP.match(line):
            group = m.group(1)
        elif (m := _FIELD.match(line)) and m.group(1) not in groups:
            groups[m.group(1)] = group
    return groups


def default_text(value: Any) -> str:
    """A default as it would be written in a TOML config file."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {float(v)!r}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """The reference page: one table per group, in config.py's order."""
    defaults = Config().to_dict()
    flags = {name: flag for name, flag, _, _ in flag_fields()}
    groups = field_groups()
    out = [
        "# Configuration reference",
        "",
        "Generated from `surprisegate.config.Config` when the site is built. Precedence: a CLI flag or keyword",
        "argument > a TOML file (`--config FILE`: keys at top level or under `[surprisegate]`) > the environment",
        '(`SURPRISEGATE_<KEY>`; `SURPRISE_CANARY=1` is `mode = "detect"`, `SURPRISE_INTERVENE=1` is',
        '`mode = "intervene"`) > the loaded model\'s calibration > these defaults. `surprisegate config` prints the',
        "effective values; every receipt keeps them.",
    ]
    current = None
    for f in fields(Config):
        if f.default is MISSING and f.default_factory is MISSING:  # pragma: no cover - every key has a default
            continue
        group = groups.get(f.name, "general")
        if group != current:
            current = group
            out += ["", f"## {group[:1].upper() + group[1:]}", "", "| key | default | environment | flag | what |"]
            out += ["|---|---|---|---|---|"]
        flag = f"`{flags[f.name]}`" if f.name in flags else ""
        out.append(
            f"| `{f.name}` | `{_cell(default_text(defaults[f.name]))}` | `SURPRISEGATE_{f.name.upper()}` | {flag} | "
            f"{_cell(f.metadata.get('help', ''))} |"
        )
    return "\n".join(out) + "\n"

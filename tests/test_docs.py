"""The README and the docs site: short README, a site that builds with --strict, and commands that run.

Every `surprisegate ...` command in a shell block of the README or a docs page must parse against today's CLI
(a renamed flag or a removed command fails here, without running anything). Blocks marked `<!-- runnable -->`
(or `<!-- runnable: slow -->`, which need the model) on the line before their fence are run: shell blocks with
bash -euo pipefail, Python blocks with the project's interpreter, from the repository root with a private
SURPRISEGATE_HOME, and they must leave the checkout as they found it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from surprisegate.cli import main as cli_main
from surprisegate.errors import SurpriseGateError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- runnable(?::\s*(\w+))? -->\s*$")
ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(\S.*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    runnable: str | None  # None, "fast" or "slow"

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the runnable mark on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        mark = MARK.match(lines[i - 1]) if i else None
        runnable = (mark.group(1) or "fast") if mark else None
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1 : end]), runnable))
        i = end + 1
    return out


def _words(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote spans lines (a JSON body): not a command line of ours
        return None


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at |, &&, ;, &,
    and the block's own variables (NAME=value lines) expanded where they are used."""
    joined = re.sub(r"\\\n\s*", " ", script)
    commands, variables = [], {}
    for line in joined.splitlines():
        m = ASSIGNMENT.match(line)
        value = _words(m.group(2)) if m else None
        if m and value is not None and len(value) == 1:  # NAME=word alone; NAME=1 cmd ... is a command
            variables[m.group(1)] = value[0]
            continue
        for name, value in variables.items():
            line = re.sub(rf"\$(?:{name}\b|\{{{name}\}})", value, line)
        words = _words(line)
        if words is None:
            continue
        current: list[str] = []
        target_next = False  # the word after a bare redirection is its file
        for word in [*words, ";"]:
            if word in ("|", "||", "&&", ";", "&"):
                if current:
                    commands.append(current)
                current = []
            elif target_next:
                target_next = False
            elif re.match(r"^\d?>>?", word):
                target_next = re.fullmatch(r"\d?>>?", word) is not None
            else:
                current.append(word)
    return commands


def surprisegate_args(command: list[str]) -> list[str] | None:
    """The arguments after `surprisegate` (past any VAR=value assignments), or None for another program."""
    words = [w for w in command if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)] if command else []
    if words and Path(words[0]).name == "surprisegate" and words[1:2] != ["…"]:  # "surprisegate …": any command
        return words[1:]
    return None


def parse_cli(args: list[str]) -> None:
    """Parse a command line against the CLI as it is, down to the subcommand, without running it."""
    ctx = cli_main.make_context("surprisegate", list(args), resilient_parsing=False)
    command: click.Command = cli_main
    rest = ctx._protected_args + ctx.args
    while isinstance(command, click.Group) and rest:
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None, f"no command {name!r}"
        ctx = sub.make_context(name, list(rest), parent=ctx, resilient_parsing=False)
        command = sub
        rest = ctx._protected_args + ctx.args if isinstance(sub, click.Group) else []


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]
SHELL = [b for b in ALL_BLOCKS if b.language in ("bash", "sh", "shell", "console")]
CLI_LINES = [(b, args) for b in SHELL for c in shell_commands(b.text) if (args := surprisegate_args(c)) is not None]


# -- the README ---------------------------------------------------------------------------------------------------


def test_the_readme_is_read_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into docs/"
    text = "\n".join(lines)
    assert "make demo" in text and "make test" in text and "make docs" in text


def test_the_readme_links_only_to_files_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not in the checkout"


# -- the extraction itself ----------------------------------------------------------------------------------------


def test_blocks_and_marks_are_read_as_written(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "intro\n<!-- runnable -->\n```bash\necho a\n```\n\n<!-- runnable: slow -->\n```python\nx = 1\n```\n"
        "```\nplain\n```\n"
    )
    blocks = blocks_of(page)
    assert [(b.line, b.language, b.text, b.runnable) for b in blocks] == [
        (3, "bash", "echo a", "fast"),
        (8, "python", "x = 1", "slow"),
        (11, "", "plain", None),
    ]


def test_shell_commands_are_split_as_a_shell_splits_them():
    script = 'M=--memory\nA=1 surprisegate ask $M kb --mode intervene \\\n    "q?" > out.json  # a comment\n'
    script += "foo | bar && baz &\n"
    assert shell_commands(script) == [
        ["A=1", "surprisegate", "ask", "--memory", "kb", "--mode", "intervene", "q?"],
        ["foo"],
        ["bar"],
        ["baz"],
    ]
    assert surprisegate_args(["A=1", ".venv/bin/surprisegate", "eval"]) == ["eval"]
    assert surprisegate_args(["python", "x.py"]) is None


def test_a_bad_command_line_fails_to_parse():
    parse_cli(["ask", "--mode", "intervene", "What?"])
    with pytest.raises(click.UsageError):
        parse_cli(["ask", "--no-such-flag", "x"])
    with pytest.raises((click.UsageError, AssertionError)):
        parse_cli(["no-such-command"])
    with pytest.raises((click.BadParameter, SurpriseGateError)):
        parse_cli(["ask", "--max-tokens", "many", "x"])


# -- every page ----------------------------------------------------------------------------------------------------


def test_the_pages_hold_commands_to_check():
    assert len(CLI_LINES) > 50 and any(b.runnable for b in ALL_BLOCKS)


@pytest.mark.parametrize(("block", "args"), CLI_LINES, ids=[f"{b.name}:{a[0] if a else ''}" for b, a in CLI_LINES])
def test_every_command_on_every_page_parses(block, args):
    try:
        parse_cli(args)
    except click.exceptions.Exit:  # --help / --version
        pass
    except (click.UsageError, AssertionError, SurpriseGateError) as err:
        pytest.fail(f"{block.name}: `surprisegate {shlex.join(args)}` does not parse: {err}")


@functools.cache
def _makefile_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([\w-]+):", text, re.M))


def program_problem(command: list[str]) -> str | None:
    """Why another program's command on a page would not run here: a script, module or make target that is
    not in the checkout (None: it names one that is, or a program this check does not know)."""
    words = [w for w in command if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
    if not words:
        return None
    program, args = Path(words[0]).name, words[1:]
    if program.startswith("python") and args[:1] == ["-m"] and len(args) > 1:
        module = args[1]  # ours must exist; another project's (sglang) is that project's to document
        return module if module.split(".")[0] == "surprisegate" and not _module_exists(module) else None
    if program.startswith("python") or program == "bash":
        script = next((a for a in args if not a.startswith("-")), None)
        if script and script.endswith((".py", ".sh")) and not (ROOT / script).exists():
            return script
    if program == "make":
        missing = [a for a in args if not a.startswith("-") and "=" not in a and a not in _makefile_targets()]
        return f"make {missing[0]}" if missing else None
    return None


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


OTHER_LINES = [(b, c) for b in SHELL for c in shell_commands(b.text) if surprisegate_args(c) is None]


def test_every_script_module_and_make_target_on_every_page_exists():
    problems = [f"{b.name}: {shlex.join(c)} ({p})" for b, c in OTHER_LINES if (p := program_problem(c))]
    assert not problems, "\n".join(problems)
    assert program_problem(["python", "scripts/no_such_script.py"]) == "scripts/no_such_script.py"
    assert program_problem(["make", "no-such-target"]) == "make no-such-target"
    assert program_problem(["python", "-m", "surprisegate.no_such_module"]) == "surprisegate.no_such_module"
    assert program_problem([".venv/bin/python", "scripts/results_md.py", "results"]) is None


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    site = tmp_path / "site"
    assert "Configuration reference" in (site / "reference" / "configuration" / "index.html").read_text()
    assert "surprisegate.gate.loop.generate" in (site / "api" / "index.html").read_text()
    assert (site / "images" / "receipt-question.png").stat().st_size > 10_000


RUNNABLE = [b for b in ALL_BLOCKS if b.runnable]


def _checkout_state() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=[pytest.mark.slow] if b.runnable == "slow" else []) for b in RUNNABLE],
    ids=[b.name for b in RUNNABLE],
)
def test_runnable_blocks_run(block, tmp_path):
    before = _checkout_state()
    env = os.environ | {
        "SURPRISEGATE_HOME": str(tmp_path / "home"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if block.language == "python":
        argv = [sys.executable, "-c", block.text]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, f"{block.name} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    assert _checkout_state() == before, f"{block.name} left files in the checkout"

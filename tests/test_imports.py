"""The package's import graph has no cycle.

Every module of `surprisegate` is parsed with `ast`; every import in it counts, at module level or inside a
function (a deferred import only hides a cycle until the function runs), relative or absolute. A cycle
means two modules each need the other: the shared piece belongs in a lower module both can import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "surprisegate"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory `root`."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement asks for (a `from X import y` asks for X and maybe X.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        # Relative: level 1 is the module's own package (a package's __init__ is its own package).
        package = module.split(".") if is_package else module.split(".")[:-1]
        base_parts = package[: len(package) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. `import a.b.c` runs a, a.b and a.b.c: all three count."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # walk: imports inside functions and classes too
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, name, path.name == "__init__.py"):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in modules and prefix != name:
                        graph[name].add(prefix)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Depth-first search; the stack holds the path being walked."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path = [start]
        pending = [iter(sorted(graph[start]))]
        colour[start] = GREY
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                pending.pop()
            elif colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt) :] + [nxt]
            elif colour.get(nxt) == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                pending.append(iter(sorted(graph[nxt])))
    return None


# ------------------------------------------------------------------------------------------------
# the checker itself, on graphs whose answer is known


def test_find_cycle_finds_a_two_module_cycle():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_find_cycle_finds_a_long_cycle_behind_a_tail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"b"}, "e": set()}
    assert find_cycle(graph) == ["b", "c", "d", "b"]


def test_find_cycle_accepts_a_diamond():
    # Two paths to one module are not a cycle.
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def test_find_cycle_ignores_modules_outside_the_graph():
    assert find_cycle({"a": {"os"}}) is None


def test_import_graph_reads_relative_absolute_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("import os\n")
    (pkg / "top.py").write_text("from .sub import leaf\n")
    (pkg / "sub" / "__init__.py").write_text("from . import helper\n")
    (pkg / "sub" / "helper.py").write_text("from ..low import thing\n")
    # A deferred import still closes the cycle top -> sub.leaf -> top.
    (pkg / "sub" / "leaf.py").write_text("def f():\n    import pkg.top\n")
    graph = import_graph(pkg)
    # Importing a submodule runs its packages' __init__ first: they count as imports too.
    assert graph["pkg.top"] == {"pkg", "pkg.sub", "pkg.sub.leaf"}
    assert graph["pkg.sub"] == {"pkg", "pkg.sub.helper"}
    assert graph["pkg.sub.helper"] == {"pkg", "pkg.low"}
    assert graph["pkg.sub.leaf"] == {"pkg", "pkg.top"}
    assert find_cycle(graph) == ["pkg.sub.leaf", "pkg.top", "pkg.sub.leaf"]


# ------------------------------------------------------------------------------------------------
# the package


def test_every_package_module_is_in_the_graph():
    graph = import_graph()
    assert {"surprisegate.gate.loop", "surprisegate.arms.web", "surprisegate.store.sqlite"} <= graph.keys()
    assert "surprisegate.text" in graph["surprisegate.gate.rewrite_checks"]


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    if cycle:
        pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_runtime_never_imports_the_research_tooling():
    # Evaluation and benchmarks live in surprisegate.research; only the CLI commands that run them reach in.
    graph = import_graph()
    leaks = {
        module: sorted(t for t in targets if t.startswith("surprisegate.research"))
        for module, targets in graph.items()
        if not module.startswith("surprisegate.research") and module != "surprisegate.cli"
    }
    assert {m: t for m, t in leaks.items() if t} == {}

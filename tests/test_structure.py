"""The house stays as it was laid out: no module imports itself back through others (type-only and
function-local imports count: they are circles waiting for a refactor), files stay readable in one sitting,
and the garbage collector is tuned only by the command-line entry point, where the process is one command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("calc", "ui", "measure")
SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")) + sorted((ROOT / "pages").glob("*.py"))
MAX_LINES = 700


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST) -> set[str]:
    """Every project module a file names in an import, `from a.b import c` counting a.b and a.b.c."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in PACKAGES:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
    return names


def import_graph() -> dict[str, set[str]]:
    trees = {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in SOURCES if p.parent.name != "pages"}
    return {m: {d for d in imported_modules(t) if d in trees and d != m} for m, t in trees.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Modules that reach each other: for each module, those it reaches that reach it back."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    found: list[set[str]] = []
    for m in graph:
        group = {m} | {o for o in reach[m] if m in reach[o]}
        if len(group) > 1 and group not in found:
            found.append(group)
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_stay_short(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_only_the_command_line_tunes_the_garbage_collector():
    tuned = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "gc"
                    and node.func.attr in ("freeze", "disable")):
                tuned.append(rel)
    assert all(r == "calc/__main__.py" or r.startswith("calc/cli/") for r in tuned), tuned

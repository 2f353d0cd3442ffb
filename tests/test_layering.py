"""Imports run down the floors (issue 8, STYLE.md): calc/ imports neither measure/ nor ui/, and no two
measure/ modules import each other (measure.sharded builds on measure.runner, not the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_calc_never_imports_measure_or_the_app():
    for path in (ROOT / "calc").rglob("*.py"):
        bad = {m for m in imports(path) if m.split(".")[0] in ("measure", "ui", "streamlit", "torch")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_two_measure_modules_import_each_other():
    mods = {f"measure.{p.stem}": imports(p) for p in (ROOT / "measure").glob("*.py")}
    for a, deps in mods.items():
        for b in deps & set(mods):
            assert a not in mods[b], f"{a} and {b} import each other"

"""Imports run down the floors (STYLE.md): each wing of calc/ imports only the wings below it, as its package
docstring says; calc/ imports neither measure/ nor the app; no private name crosses a module boundary; and no two
measure/ modules import each other (measure.sharded builds on measure.runner, not the other way round)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# wing -> the wings it may import (besides itself). calc.memo is everyone's floor.
MAY_IMPORT = {
    "memo": set(),
    "contract": {"memo"},
    "sim": {"memo", "contract"},
    "memory": {"memo", "contract", "sim"},
    "speed": {"memo", "contract", "sim", "memory"},
    "recommend": {"memo", "contract", "sim", "memory", "speed"},
    "evidence": {"memo", "contract", "sim", "memory", "speed", "recommend"},
    "export": {"memo", "contract", "sim", "memory", "speed"},
    "serve": {"memo", "contract", "sim", "memory"},
    "cli": {"memo", "contract", "sim", "memory", "speed", "recommend", "evidence", "export", "serve"},
}
# The package root and the old import paths (kept for scripts and notebooks) re-export; nothing inside calc/ uses them.
OLD_PATHS = {"calc.engine", "calc.scenario", "calc.presets"}


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if node.module == "calc")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def wing_of(path: Path) -> str | None:
    """The wing a file of calc/ belongs to; None for the package root and the old paths."""
    parts = path.relative_to(ROOT / "calc").parts
    return parts[0].removesuffix(".py") if len(parts) > 1 or parts[0] in ("memo.py", "speed.py") else None


def calc_files() -> list[Path]:
    return sorted((ROOT / "calc").rglob("*.py"))


def test_every_file_of_calc_is_in_a_wing():
    loose = [p.name for p in calc_files() if wing_of(p) is None]
    assert sorted(loose) == ["__init__.py", "__main__.py", "engine.py", "presets.py", "scenario.py"]
    assert {wing_of(p) for p in calc_files()} - {None} == set(MAY_IMPORT)


@pytest.mark.parametrize("path", [p for p in calc_files() if wing_of(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_each_wing_imports_only_the_floors_below(path):
    me = wing_of(path)
    for module in imports(path):
        parts = module.split(".")
        if parts[0] != "calc":
            continue
        assert module not in OLD_PATHS, f"{path.relative_to(ROOT)} imports {module}, an old path: import the wing"
        if len(parts) > 1 and parts[1] != me:
            assert parts[1] in MAY_IMPORT[me], f"{path.relative_to(ROOT)} ({me}) imports {module}"


@pytest.mark.parametrize("wing", [w for w in MAY_IMPORT if w not in ("memo", "speed")])
def test_each_wing_says_what_it_owns_and_may_import(wing):
    doc = importlib.import_module(f"calc.{wing}").__doc__ or ""
    assert len(doc) > 200 and "May import" in doc, f"calc/{wing}/__init__.py: say what it owns and may import"


def test_no_private_name_crosses_a_module_boundary():
    """A leading underscore is private to its module: tests and other modules use public names."""
    for path in [*calc_files(), *(ROOT / "ui").rglob("*.py"), *(ROOT / "pages").glob("*.py"),
                 *(ROOT / "measure").glob("*.py"), *(ROOT / "tests").rglob("*.py"), ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("calc", "ui", "measure"):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "_"]  # "_": gettext
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {node.module}"


def test_calc_never_imports_measure_or_the_app():
    for path in calc_files():
        bad = {m for m in imports(path) if m.split(".")[0] in ("measure", "ui", "streamlit", "torch")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_two_measure_modules_import_each_other():
    mods = {f"measure.{p.stem}": imports(p) for p in (ROOT / "measure").glob("*.py")}
    for a, deps in mods.items():
        for b in deps & set(mods):
            assert a not in mods[b], f"{a} and {b} import each other"


def test_old_import_paths_still_work():
    """Scripts and notebooks written against the old layout keep working."""
    from calc import Estimate, Scenario, estimate, reference_estimate
    from calc.engine import estimate as old_estimate
    from calc.engine import reference_estimate as old_reference
    from calc.presets import gpu_presets, model_presets
    from calc.scenario import Scenario as OldScenario

    assert (old_estimate, old_reference, OldScenario) == (estimate, reference_estimate, Scenario)
    sc = OldScenario.model_validate({"model": "gpt2", "hardware": {"gpu": "a100-80gb"}})
    assert isinstance(old_estimate(sc), Estimate) and "gpt2" in model_presets() and "a100-80gb" in gpu_presets()

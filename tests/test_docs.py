"""The README and docs/ as a user reads them: the generated tables up to date (scripts/docs.py --check), the
README short, every `python -m calc ...` command it shows accepted by the CLI's parser, every path and link
it names present in the repository, and its example scenario the committed, valid docs/scenario.json."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from calc.cli.main import build_parser
from calc.contract.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 360

# Files that the README's commands write, not files of the repository.
WRITTEN_BY_COMMANDS = {".venv/bin/activate", "run/", "data/measured_cuda.jsonl"}


@functools.cache
def _docs_script():
    """scripts/docs.py as a module (scripts/ is no package); registered first, as its dataclass needs."""
    name = "vramcalc_docs_script"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)


def _prose(text: str) -> str:
    return re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)


def _inline_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose(text))


def _shell_lines(text: str) -> list[str]:
    return [line for lang, body in _fenced(text) if lang in ("bash", "sh") for line in body.splitlines()]


def _calc_argvs(text: str) -> list[tuple[str, list[str]]]:
    """Every `python -m calc ...` command of the README: (where it is, its arguments after `python -m calc`)."""
    found = []
    for source, lines in (("code block", _shell_lines(text)), ("inline", _inline_spans(text))):
        for line in lines:
            for match in re.finditer(r"python -m calc(?=\s|$)(.*)", line):
                found.append((source, shlex.split(match.group(1), comments=True)))
    return found


def test_generated_docs_are_up_to_date():
    docs = _docs_script()
    files = docs.rendered()
    assert set(files) == {docs.README, docs.ACCURACY}
    stale = docs.outdated(files)
    assert not stale, f"out of date: {[str(p.relative_to(ROOT)) for p in stale]}; run: python scripts/docs.py"


def test_accuracy_table_counts_every_committed_record():
    docs = _docs_script()
    runs = docs.runs()
    table = docs.readme_accuracy(runs)
    assert f"| every committed run | {len(runs)} |" in table
    assert "GiB = 2^30 bytes" in (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")


def test_fill_replaces_only_between_markers():
    docs = _docs_script()
    text = "before\n<!-- t:start -->\nold\n<!-- t:end -->\nafter\n"
    assert docs.fill(text, "t", "new") == "before\n<!-- t:start -->\nnew\n<!-- t:end -->\nafter\n"
    with pytest.raises(SystemExit):
        docs.fill("no markers", "t", "new")


def test_readme_is_short():
    lines = _text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"


def test_every_calc_command_in_the_readme_parses():
    commands = _calc_argvs(_text())
    subcommands = {argv[0] for _, argv in commands if argv}
    assert {"estimate", "presets", "fit", "recommend", "table", "export", "export-deepspeed", "validate",
            "calibrate"} <= subcommands
    choices = build_parser()._subparsers._group_actions[0].choices
    for source, argv in commands:
        assert argv, f"a bare `python -m calc` ({source})"
        if source == "inline" and len(argv) == 1:  # a command named in prose: it exists
            assert argv[0] in choices, argv
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"python -m calc {' '.join(argv)} ({source}) does not parse: exit {exc.code}")


def _named_paths(text: str) -> set[str]:
    """Relative paths the README names: its Markdown links, path-like words in inline code and in its shell
    commands (comments left out)."""
    paths = {link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", link)}
    words = [w for span in _inline_spans(text) for w in span.split()]
    for line in _shell_lines(text):
        words += shlex.split(line, comments=True)
    path_like = re.compile(r"^\.?[\w\-]+/([\w.\-*]+/?)*$")
    paths |= {w for w in words if path_like.match(w)}
    return paths - WRITTEN_BY_COMMANDS


def test_every_path_the_readme_names_exists():
    paths = _named_paths(_text())
    assert {"docs/accuracy.md", "docs/performance.md", "scripts/test.sh", "docs/scenario.json"} <= paths
    missing = [p for p in sorted(paths) if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_readme_example_scenario_is_docs_scenario_json():
    blocks = [json.loads(body) for lang, body in _fenced(_text()) if lang == "json" and body.lstrip().startswith("{")]
    example = json.loads((ROOT / "docs" / "scenario.json").read_text(encoding="utf-8"))
    assert example in blocks
    Scenario.model_validate(example)


def test_quick_start_is_two_commands():
    text = _text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line for lang, body in _fenced(quick) for line in body.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && "
                        "python -m ui.serve", "bash scripts/test.sh"]

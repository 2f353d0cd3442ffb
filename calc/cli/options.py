"""Option types and options that several commands share (calc.cli.main builds the parser from them)."""

from __future__ import annotations

import argparse
import math

from calc.contract.i18n import DEFAULT_LANG, LANGS


def count(text: str) -> int:
    """argparse type: an integer from 1 to 1000 (`--top 0` is a mistake, not "the default")."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 1000, got {n}")
    return n


def percent(text: str) -> float:
    """argparse type: a finite percentage >= 0 (`nan` would disable the check it sets)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text[:40]!r}")
    return x


def finite_positive(text: str) -> float:
    """argparse type: a finite number > 0 (`inf` would be written into a config as Infinity, which is not JSON)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text[:40]!r}")
    return x


def force_option(p: argparse.ArgumentParser) -> None:
    """--force of a command that writes files (calc.contract.files: nothing is replaced without it)."""
    p.add_argument("--force", action="store_true", help="replace files the output already holds")


def lang_option(p: argparse.ArgumentParser) -> None:
    """--lang of a command with a table format (JSON is always English)."""
    p.add_argument("--lang", choices=LANGS, default=DEFAULT_LANG,
                   help="language of the table format (default en; JSON is always English)")

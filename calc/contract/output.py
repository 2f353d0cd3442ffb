"""What leaves the calculator as text for a machine or a terminal, made safe for its reader in one place each.

- `strict_json`: every JSON file we write (ds_config.json, `export-deepspeed`, `estimate --format json`) is strict
  JSON: NaN and Infinity, which Python's json writes by default and no other JSON reader accepts, raise instead.
  The inputs refuse them first (calc.contract.boundary, the CLI's option types); this is the guarantee.
- `for_terminal`: text a user handed us (a file name, a key of their JSON, a record's device name, a preset id)
  can carry bytes a terminal obeys: ESC starts an escape sequence (colours, cursor moves, a changed window title),
  BEL rings, CR overwrites the line, the bidirectional overrides (U+202E, ...) print text in another order than it
  is stored. Each such character is shown as its escape (`\\u001b`, `\\u202e`: the same in Python and JSON), so
  what the terminal shows is what the input holds. Every line the CLI prints goes through it (calc.cli.main).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["for_terminal", "strict_json"]


def strict_json(value: Any, indent: int | None = 2) -> str:
    """json.dumps with allow_nan=False (ValueError on NaN or an infinity), ending with a newline when indented."""
    return json.dumps(value, indent=indent, allow_nan=False) + ("\n" if indent is not None else "")


# C0 controls (tab and line feed handled apart), DEL, C1 controls, the bidirectional marks, embeddings, overrides
# and isolates, the Unicode line and paragraph separators, and lone surrogates (undecodable bytes of a file name
# arrive as U+DC80..U+DCFF, and a strict stdout cannot encode them).
_CONTROL = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_LINES = re.compile(f"[{_CONTROL}]")
_UNSAFE_LINE = re.compile(f"[{_CONTROL}\\t\\n]")


def _visible(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group(0)):04x}"  # the same escape in JSON text, so a JSON document stays valid


def for_terminal(text: object, lines: bool = False, limit: int | None = None) -> str:
    """`text` with every character a terminal would obey rather than show made visible (`\\u001b`); tabs and line
    breaks kept when `lines` (a table), else shown too (one line). Cut to `limit` characters, saying how long it
    was, so a megabyte of input never becomes a megabyte of output."""
    text = str(text)
    cut = ""
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], f"... ({len(text):,} characters)"
    return (_UNSAFE_LINES if lines else _UNSAFE_LINE).sub(_visible, text) + cut

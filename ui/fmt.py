"""Formatting at the edge: bytes in, labelled strings out. 1 GiB = 2**30 bytes (calc.contract.units)."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence

from calc.contract.output import for_terminal
from calc.contract.units import GB, GiB, MiB, to_gib
from ui.language import _

__all__ = ["GB", "GiB", "MiB", "bytes_exact", "gb", "gib", "gib_signed", "literal", "percent", "plain", "plot_text",
           "table"]


def gib(n_bytes: int | float | None, digits: int = 2) -> str:
    """'12.34 GiB'; an em dash for None."""
    if n_bytes is None:
        return "—"
    return f"{to_gib(n_bytes):,.{digits}f} GiB"


def gib_signed(n_bytes: int | float, digits: int = 2) -> str:
    """'+1.23 GiB' / '-4.56 GiB' for differences."""
    return f"{to_gib(n_bytes):+,.{digits}f} GiB"


def gb(n_bytes: int | float, digits: int = 1) -> str:
    """Decimal gigabytes (10**9), only where a claim being checked is stated in GB."""
    return f"{n_bytes / GB:,.{digits}f} GB"


def bytes_exact(n_bytes: int | None) -> str:
    """'12,345,678,901 bytes' for hover text and tables."""
    return "—" if n_bytes is None else _("{n} bytes", n=f"{int(n_bytes):,}")


def percent(x: float, digits: int = 1) -> str:
    return f"{x:+.{digits}f} %"


_MD_BLOCK_START = re.compile(r"^(\s*)([+\-*>#]|\d+\.)(\s)")


def plain(text: str) -> str:
    """Text for a cell that Streamlit renders as Markdown (st.table): a leading '+', '-', '1.' or '#'
    would start a list or heading, so it is escaped."""
    def esc(m: re.Match[str]) -> str:
        mark = m.group(2)
        mark = mark[:-1] + "\\." if mark.endswith(".") else "\\" + mark
        return m.group(1) + mark + m.group(3)

    return _MD_BLOCK_START.sub(esc, text)


# What could make a user's text into Markdown or HTML in Streamlit (links, images, HTML tags, emphasis,
# code, math, strikethrough, :color[] / :emoji: directives, autolinks, e-mail links). Intraword "_"
# ("offload_optimizer") and ": " cannot, so messages keep reading naturally.
_MD_ACTIVE = re.compile(r"[\\`*\[\]<>$~@#]|(?<!\w)_|_(?!\w)|:(?=[A-Za-z/])|(?<=www)\.", re.IGNORECASE)


# GFM turns bare "https://x", "www.x" and "a@b.c" into links after escapes are resolved, so a
# backslash does not stop it: an invisible word joiner (U+2060) after the scheme / "www" / before "@" does.
_AUTOLINK = re.compile(r"\b(?:https?|ftp|mailto|www)(?=\\?[:.])|\w(?=\\?@)", re.IGNORECASE)


def literal(text: object) -> str:
    """Text that Streamlit's Markdown (st.error, st.markdown, ...) shows as written: the marks that
    would start a link, an image, HTML, emphasis, code, math or a directive are backslash-escaped
    (CommonMark), so a `[link](url)` or `![image](url)` in a model_type, a file name or an error
    message stays plain text. Control characters are shown as escapes first (calc.contract.output.for_terminal,
    line breaks kept): a right-to-left override reorders the text after it in a browser as on a terminal."""
    text = _MD_ACTIVE.sub(lambda m: "\\" + m.group(0), for_terminal(text, lines=True))
    return plain(_AUTOLINK.sub("\\g<0>\u2060", text))


def plot_text(text: object) -> str:
    """Text for a Plotly label or hover (customdata in a hovertemplate), shown as written: Plotly draws its own
    small HTML (`<b>`, `<br>`, `<a href>`) but not Markdown, and reads entities, so `&`, `<` and `>` become
    `&amp;`, `&lt;` and `&gt;` (a backslash, literal's escape, would be drawn)."""
    return html.escape(str(text), quote=False)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Mapping[str, object]]) -> str:
    """Rows (dicts with the same keys, in column order) as one GitHub Markdown table for st.markdown.
    st.table renders every cell as its own Markdown document (a parser and a styled component per cell:
    most of the browser's work on a page of tables); one document per table reads the same (cells are
    Markdown in both) at a fraction of that. A '|' in a cell is escaped; a line break becomes a space."""
    if not rows:
        return ""
    cols = list(rows[0])
    lines = ["| " + " | ".join(_cell(c) for c in cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)

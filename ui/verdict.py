"""Draw calc's verdict (calc.verdict): one coloured box, one sentence. Pages never decide "fits"."""

from __future__ import annotations

from typing import Any

from calc.verdict import Verdict, headline

ICONS = {True: ":material/check_circle:", False: ":material/cancel:", None: ":material/help:"}


def box(container: Any, v: Verdict, subject: str, detail: str = "") -> None:
    """'subject: **fits with 6.9 GiB headroom per GPU** (detail).' in green, red, or amber when a
    limit is unknown (the sentence then asks for the missing figure)."""
    draw = container.success if v.fits else container.error if v.fits is False else container.warning
    text = f"{subject}: **{headline(v)}**" + (f" ({detail})" if detail else "") + "."
    draw(text, icon=ICONS[v.fits])

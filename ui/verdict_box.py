"""Draw calc's verdict (calc.memory.verdict): one coloured box, one sentence. Pages never decide "fits"."""

from __future__ import annotations

from typing import Any

from calc.memory.verdict import Verdict, headline
from ui.language import _, current

ICONS = {True: ":material/check_circle:", False: ":material/cancel:", None: ":material/help:"}


def box(container: Any, v: Verdict, subject: str, detail: str = "") -> None:
    """'subject: **fits with 6.9 GiB headroom per GPU** (detail).' in green, red, or amber when a
    limit is unknown (the sentence then asks for the missing figure). `subject` and `detail` come in
    the session's language."""
    draw = container.success if v.fits else container.error if v.fits is False else container.warning
    verdict = headline(v, current())
    text = (_("{subject}: **{verdict}** ({detail}).", subject=subject, verdict=verdict, detail=detail) if detail
            else _("{subject}: **{verdict}**.", subject=subject, verdict=verdict))
    draw(text, icon=ICONS[v.fits])

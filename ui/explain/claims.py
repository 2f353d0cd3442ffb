"""The articles' claims (calc.claims over data/claims.yaml) as table rows for the page."""

from __future__ import annotations

from collections import Counter
from typing import Any

import streamlit as st

from calc.claims import ARTICLES, check_all
from ui import fmt


@st.cache_data(max_entries=2, show_spinner=False)
def claim_rows() -> list[dict[str, Any]]:
    """One row per claim: where it comes from, what it says, the engine's figure and the verdict."""
    rows = []
    for r in check_all():
        c = r.claim
        rows.append({"id": c.id, "article": c.article, "section": fmt.plain(c.section), "original": fmt.plain(c.quote),
                     "claim": fmt.plain(c.gist), "claimed": fmt.plain(c.claimed.text),
                     "engine": fmt.plain(r.engine_text + (f" — {r.setup}" if r.setup else "")),
                     "verdict": r.verdict, "why": fmt.plain(c.reason)})
    return rows


def verdict_counts(rows: list[dict[str, Any]]) -> Counter:
    return Counter(r["verdict"] for r in rows)


def article_names() -> dict[str, str]:
    return dict(ARTICLES)

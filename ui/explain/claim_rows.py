"""The articles' claims (calc.evidence.claims over data/claims.yaml) as table rows for the page."""

from __future__ import annotations

from collections import Counter
from typing import Any

import streamlit as st

from calc.contract.i18n import Lang, translate
from calc.evidence.claims import ARTICLES, check_all
from ui import fmt


@st.cache_data(max_entries=4, show_spinner=False)
def claim_rows(lang: Lang = "en") -> list[dict[str, Any]]:
    """One row per claim: where it comes from, what it says, the engine's figure and the verdict, in
    `lang` (the quote and its section stay the article's own words). `verdict` is the English key;
    `verdict_text` the word shown."""
    rows = []
    for r in check_all():
        c = r.claim
        setup = r.setup_in(lang)
        rows.append({"id": c.id, "article": c.article, "section": fmt.plain(c.section), "original": fmt.plain(c.quote),
                     "claim": fmt.plain(translate(c.gist, lang)), "claimed": fmt.plain(c.claimed.render(lang)),
                     "engine": fmt.plain(r.engine_in(lang) + (f" — {setup}" if setup else "")),
                     "verdict": r.verdict, "verdict_text": r.verdict_in(lang), "why": fmt.plain(translate(c.reason, lang))})
    return rows


def verdict_counts(rows: list[dict[str, Any]]) -> Counter:
    """How many claims have each verdict, counted by the word shown."""
    return Counter(r["verdict_text"] for r in rows)


def article_names(lang: Lang = "en") -> dict[str, str]:
    return {k: translate(v, lang) for k, v in ARTICLES.items()}

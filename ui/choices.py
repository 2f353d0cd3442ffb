"""Choice widgets over the label mappings of ui.labels: option values, worded in the session's language."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from ui.language import tr


def labelled_options(mapping: dict[Any, str]) -> tuple[list[str], Callable[[Any], str]]:
    """Option values and a format_func that words them in this run's language (bound now: a format_func
    may be called outside the run, where there is no session to ask)."""
    keys = [k.value if hasattr(k, "value") else k for k in mapping]
    names = {k: tr(label) for k, label in zip(keys, mapping.values(), strict=True)}
    return keys, lambda k: names.get(k, str(k))


def select(label: str, mapping: dict[Any, str], key: str, **kw: Any) -> Any:
    """A select box over a label mapping (enum or value -> English label), worded in this run's language."""
    opts, fmt = labelled_options(mapping)
    return st.selectbox(label, opts, format_func=fmt, key=key, **kw)


def radio(label: str, mapping: dict[Any, str], key: str, **kw: Any) -> Any:
    """A horizontal radio over a label mapping, worded in this run's language."""
    opts, fmt = labelled_options(mapping)
    return st.radio(label, opts, format_func=fmt, key=key, horizontal=True, **kw)

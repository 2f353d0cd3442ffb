"""The app's language: `_()` for every user-facing string, the sidebar switch, `?lang=` in links.

The language of a session is, in order: the one chosen in the sidebar; `?lang=zh|en` in the link it
was opened with; the browser's language where Streamlit exposes it (`st.context.locale`); English.
Catalogues and the lookup are calc.contract.i18n's (one source for the app, the CLI and the exports).
"""

from __future__ import annotations

import threading

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from calc.contract.i18n import DEFAULT_LANG, LANG_NAMES, LANGS, Lang, Text, parse_lang, render, translate

LANG = "vc_lang"  # session state: the session's language
LANG_PARAM = "lang"  # URL query parameter
SWITCH = "ui_lang"  # the sidebar switch's widget key (not a scenario widget: survives page switches)


def _from_browser() -> Lang | None:
    try:
        return parse_lang(st.context.locale)
    except Exception:  # noqa: BLE001 - no browser context (AppTest, bare mode): no preference
        return None


def _resolve() -> Lang:
    asked = st.query_params.get(LANG_PARAM)
    return parse_lang(asked) or _from_browser() or DEFAULT_LANG


# The language of the last script run in this thread, with its session's id: set by begin_run() at the top
# of every page run. `_()` asks for it hundreds of times a run (about 1,500 on Explain), and a session-state
# lookup goes through Streamlit's session proxy and its lock each time (14 % of Explain's script time).
# A thread serves one session's runs; the id check keeps any other caller on the session state.
_run = threading.local()


def _session_lang() -> Lang:
    ss = st.session_state
    if LANG not in ss:
        ss[LANG] = _resolve()
    return ss[LANG]


def _session_id() -> str | None:
    ctx = get_script_run_ctx(suppress_warning=True)
    return ctx.session_id if ctx is not None else None


def begin_run() -> Lang:
    """Resolve the session's language once for this script run (after the language switch's callback)."""
    lang = _session_lang()
    _run.lang = (_session_id(), lang)
    return lang


def current() -> Lang:
    """The session's language (resolved once, on the session's first run)."""
    cached = getattr(_run, "lang", None)
    if cached is not None and cached[0] is not None and cached[0] == _session_id():
        return cached[1]
    return _session_lang()


def _(msgid: str, **fields: object) -> str:
    """`msgid` (an English string literal, `{named}` fields for numbers) in the session's language."""
    return translate(msgid, current(), **fields)


def tr(msgid: str, **fields: object) -> str:
    """Like `_`, for an id held in a variable: it must have been marked where it was written
    (`N_("Compare")` in a table of labels, say), or the catalogues will not have it."""
    return translate(msgid, current(), **fields)


def say(text: Text | str) -> str:
    """An engine sentence in the session's language (calc.contract.i18n.render: a Text, a Phrase, a plain string)."""
    return render(text, current())


def _switched() -> None:
    chosen = st.session_state[SWITCH]
    if chosen in LANGS:  # clicking the selected option deselects it: keep the language then
        st.session_state[LANG] = chosen
        _run.lang = (_session_id(), chosen)


def language_switch() -> None:
    """The sidebar's language control; the choice travels in the URL (ui.state.page_params)."""
    ss = st.session_state
    ss[SWITCH] = current()
    st.sidebar.segmented_control("Language / 语言", LANGS, key=SWITCH, format_func=LANG_NAMES.__getitem__,
                                 on_change=_switched, label_visibility="collapsed")

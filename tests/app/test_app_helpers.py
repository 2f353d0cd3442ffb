"""Shared helpers for the AppTest page tests (imported by the test_app_*.py modules; no tests here).

Every page is opened the way a user opens it: through the entrypoint app.py, then switch_page, so the
multipage setup (pages/ auto-discovery, session state, query parameters) is the real one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
from streamlit.testing.v1 import AppTest

from calc.contract.scenario import Scenario
from ui import state
from ui.plots import figure_from_json

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
PAGES = {
    "calculator": None,
    "compare": "pages/2_Compare.py",
    "recommend": "pages/3_Recommend.py",
    "explain": "pages/4_Explain.py",
    "export": "pages/5_Export.py",
    "validation": "pages/6_Validation.py",
    "serve": "pages/7_Serve.py",
}
TIMEOUT = 180  # the Recommend page's first model x hardware table takes seconds on a slow CPU
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|File \".*\", line \d+")


def open_app(page: str = "calculator", params: dict[str, str] | None = None) -> AppTest:
    """A fresh session on `page`, optionally from a link's query parameters."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if params:
        at.query_params.update(params)
    if PAGES[page] is not None:  # a deep link straight to the page
        at.switch_page(PAGES[page])
    at.run()
    return rest_of_page(at)


def go(at: AppTest, page: str) -> AppTest:
    at.switch_page(PAGES[page] or "app.py")
    at.run()
    return rest_of_page(at)


def rest_of_page(at: AppTest) -> AppTest:
    """What the browser does when a page stopped after its first screen (ui.first_screen): once the first
    chart is drawn, rerun the page, which then draws all of it."""
    assert_clean(at)
    if at.session_state[state.FIRST_SCREEN]:
        at.run()
        assert_clean(at)
        assert not at.session_state[state.FIRST_SCREEN]
    return at


PROSE = ("title", "header", "subheader", "markdown", "caption", "text", "error", "warning", "info", "success",
         "exception")


def texts(at: AppTest, kinds: tuple[str, ...] = PROSE + ("code",)) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        for el in getattr(at, kind):
            out.append(str(el.value))
    return out


WIDGETS = ("button", "checkbox", "toggle", "radio", "selectbox", "multiselect", "select_slider", "slider",
           "number_input", "text_input", "text_area", "date_input", "time_input", "color_picker", "tabs",
           "expander", "metric", "button_group", "status")


def _figure_text(fig: dict[str, Any]) -> list[str]:
    """Titles, axis titles, legend names, hover templates and annotations of a Plotly figure."""
    layout = fig.get("layout", {})
    out = [t.get("text", "") if isinstance(t, dict) else str(t)
           for key, value in layout.items() if key == "title" or key.startswith(("xaxis", "yaxis", "legend"))
           for t in ([value.get("title")] if isinstance(value, dict) and key != "title" else [value])
           if t]
    out += [a.get("text", "") for a in layout.get("annotations", [])]
    for trace in fig.get("data", []):
        out += [str(trace.get(k, "")) for k in ("name", "hovertemplate", "legendgrouptitle")]
    return [t for t in out if t]


def visible_text(at: Any) -> list[str]:
    """Everything a user reads on the page (`at`: the AppTest, or `at.main` / `at.sidebar` alone):
    texts, widget labels, help and options, metrics, tabs, expanders, tables' headers and cells, the words
    of the Plotly charts (not code blocks: exported files and commands are code in every language)."""
    out = texts(at, PROSE)
    for kind in WIDGETS:
        for el in at.get(kind):
            for attr in ("label", "help", "placeholder", "value", "options"):
                v = getattr(el, attr, None) if attr != "value" or kind in ("metric", "button") else None
                if isinstance(v, str):
                    out.append(v)
                elif isinstance(v, (list, tuple)):
                    out += [str(o) for o in v]
    for kind in ("table", "dataframe"):
        for el in at.get(kind):
            df = el.value
            out += [str(c) for c in df.columns]
            out += [v for col in df.columns for v in df[col].tolist() if isinstance(v, str)]
    for el in at.get("plotly_chart"):
        out += _figure_text(figure_from_json(el.proto.spec))
    return out


_MD_SEP = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def _md_cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def markdown_tables(text: str) -> list[pd.DataFrame]:
    """The GitHub Markdown tables in `text` (ui.fmt.table's) parsed back: a header line, a --- line, the rows."""
    lines, out = text.splitlines(), []
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and _MD_SEP.match(lines[i + 1].strip()):
            rows = []
            for line in lines[i + 2:]:
                if not line.startswith("|"):
                    break
                rows.append(_md_cells(line))
            out.append(pd.DataFrame(rows, columns=_md_cells(lines[i])))
    return out


def tables(at: AppTest) -> list[pd.DataFrame]:
    """Every static table on the page: st.table's, and the Markdown tables of its st.markdown elements
    (cells as strings)."""
    return [t.value for t in at.table] + [df for md in at.markdown for df in markdown_tables(str(md.value))]


def open_folded(at: AppTest) -> AppTest:
    """Open every expander that is filled only when opened (st.expander(key=..., on_change="rerun")), as a
    reader clicking each, and rerun, so that its text is on the page too."""
    keys = [e.key for e in at.expander if e.key]
    if keys:
        for key in keys:
            at.session_state[key] = True
        at.run()
        assert_clean(at)
    return at


def assert_clean(at: AppTest) -> None:
    """No exception element and no traceback text anywhere on the page."""
    assert not at.exception, [e.value for e in at.exception]
    for t in texts(at):
        assert not TRACEBACK.search(t), t


def scenario(at: AppTest) -> Scenario:
    return at.session_state[state.SCENARIO]


def chart(at: AppTest, key: str) -> dict[str, Any]:
    """The Plotly figure drawn with st.plotly_chart(key=key), bdata arrays decoded."""
    for el in at.get("plotly_chart"):
        if key in el.proto.id:
            return figure_from_json(el.proto.spec)
    raise KeyError(f"no plotly chart with key {key!r}")


def traces(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t.get("name"): t for t in fig["data"]}


def metric(at: AppTest, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise KeyError(label)


def all_text(at: AppTest) -> str:
    return "\n".join(texts(at))

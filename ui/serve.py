"""Start the app with its first visit's work done before the first visitor: `python -m ui.serve [streamlit
options]` is `streamlit run app.py [options]` after a warm-up.

A plain `streamlit run` imports the pages' modules (Streamlit's elements, plotly, pandas, the engine, the
presets, the message catalogues), makes the searches the pages cache (the Calculator's fits, Recommend's
ranked configurations, Compare's default columns, the Validation report) and searches the Recommend page's
model x hardware table (36 `recommend` searches) only once a visitor is waiting for them. Here the server's
process does that first, for the default scenario: it imports what the pages import, draws the default
scenario's figures, fills the pages' caches, searches the default table into the cells that every visitor
shares (ui.compute.table_cells) and moves what it made out of the cyclic collector's reach. Start-up takes a
few seconds longer; the first visit takes what a later one takes.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app.py"


def warm_up() -> dict[str, float]:
    """Do the first visit's work in this process; returns the seconds each part took (printed at start-up)."""
    with _bare_mode_quiet():
        took = _warm_up()
    return took


@contextmanager
def _bare_mode_quiet() -> Iterator[None]:
    """Streamlit warns on every cached call and session-state read made outside a script run ("No runtime
    found", "missing ScriptRunContext"); the warm-up makes them on purpose, before the server starts. Each of
    Streamlit's loggers has its own level, hence the process-wide switch."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _warm_up() -> dict[str, float]:
    took: dict[str, float] = {}
    for part, work in (("imports", _import_pages_modules), ("default scenario", _draw_default_figures),
                       ("pages' searches", _search_for_the_default_pages),
                       ("model x hardware table", _search_default_table)):
        start = time.perf_counter()
        work()
        took[part] = time.perf_counter() - start
    return took


def _import_pages_modules() -> None:
    """What app.py and pages/ import, what Streamlit imports when a page first draws a chart or table, and the
    message catalogues."""
    import pandas  # noqa: F401  (st.dataframe, st.data_editor)
    import plotly.graph_objects  # noqa: F401
    import plotly.io  # noqa: F401
    import streamlit.elements.plotly_chart  # noqa: F401

    import ui.calibration  # noqa: F401
    import ui.compute  # noqa: F401
    import ui.explain.claim_rows  # noqa: F401
    import ui.explain.figures  # noqa: F401
    import ui.explain.lesson_plots  # noqa: F401
    import ui.explain.recipes  # noqa: F401
    import ui.explain.serving_lesson  # noqa: F401
    import ui.first_screen  # noqa: F401
    import ui.plots  # noqa: F401
    import ui.serving_table  # noqa: F401
    import ui.verdict_box  # noqa: F401
    import ui.widgets  # noqa: F401
    from calc.contract.i18n import LANGS, catalogue
    from calc.recommend import optimization_waterfall  # noqa: F401  (loads the recommender's modules)

    for lang in LANGS:  # the message catalogues (babel reads the .po files), for a first visitor in Chinese
        catalogue(lang)


def _draw_default_figures() -> None:
    """The default scenario's charts as the Calculator and Recommend pages draw them, turned into JSON as
    st.plotly_chart does: plotly builds each trace type's validators on first use, and the engine records
    the default shape's block profiles."""
    from calc.memory.engine import estimate
    from calc.recommend import usable_bytes
    from ui import compute
    from ui import plots as charts
    from ui.state import DEFAULT_SCENARIO

    est = estimate(DEFAULT_SCENARIO)
    steps = compute.waterfall(DEFAULT_SCENARIO.model_dump_json())
    usable = None if est.gpu_memory_bytes is None else usable_bytes(est.gpu_memory_bytes)
    for fig in (charts.breakdown_bar(est), charts.timeline_area(est),
                charts.waterfall_chart(steps, est.gpu_memory_bytes, usable)):
        fig.to_json()


def _search_for_the_default_pages() -> None:
    """What each page asks ui.compute's caches (st.cache_data) for on a first visit with the default scenario:
    the Calculator's two fit searches, Recommend's ranked configurations (both settings of its toggle),
    Compare's default columns (the fastest configuration on each machine), Export's and the Validation page's
    report over the committed data set. Called before the server starts, Streamlit keeps these in an
    in-memory cache that its runtime then uses (a different storage would only mean a recomputation)."""
    from ui import compute
    from ui.state import DEFAULT_COMPARE, DEFAULT_SCENARIO

    key = DEFAULT_SCENARIO.model_dump_json()
    for field in ("micro_batch_size", "seq_len"):
        compute.largest_fitting(key, field)
    for allow in (False, True):
        compute.recommendations(key, allow, None)
    compute.fastest_fitting(key)
    for col in DEFAULT_COMPARE:
        compute.column_scenario(DEFAULT_SCENARIO, col)
    compute.validation_report()


def _search_default_table() -> None:
    from calc.recommend import TABLE_GLOBAL_BATCH_TOKENS, TABLE_SEQ_LEN
    from ui.compute import table_cells

    table_cells(TABLE_SEQ_LEN, TABLE_GLOBAL_BATCH_TOKENS, budget_s=float("inf"))


def main(argv: list[str]) -> int:
    if not {"-h", "--help"} & set(argv):  # asking for Streamlit's options is not starting a server
        _announce_warm_up()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP), *argv]
    return cli.main(prog_name="streamlit")


def _announce_warm_up() -> None:
    """Warm up and say how long it took. A failure is reported in one line and the app starts anyway: every
    page reports its own errors, and a warm-up is not worth an app that does not start."""
    try:
        took = warm_up()
    except Exception as exc:  # noqa: BLE001 - any failure: the server starts without the warm-up
        first_line = (str(exc).splitlines() or [""])[0][:200]
        print(f"vramcalc warm-up skipped ({type(exc).__name__}: {first_line}); the first visitor waits for that "
              "work instead", file=sys.stderr, flush=True)
        return
    print("vramcalc warm-up: " + ", ".join(f"{part} {s:.2f} s" for part, s in took.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

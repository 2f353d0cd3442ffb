"""`python -m ui.serve`: the README's way to start the app does the first visit's work before the server
listens (the browser end to end runs against it: tests/e2e/test_e2e_browser.py)."""

from __future__ import annotations

import logging
import sys

from calc.recommend import TABLE_GLOBAL_BATCH_TOKENS, TABLE_HARDWARE, TABLE_MODELS, TABLE_SEQ_LEN, table_cell
from ui import compute, serve
from ui.state import DEFAULT_SCENARIO


def test_warm_up_searches_the_default_table(monkeypatch):
    monkeypatch.setattr(compute, "_TABLE_CELLS", {})
    for cached in (compute.waterfall, compute.recommendations, compute._report, compute.largest_fitting,
                   compute.fastest_fitting):
        cached.clear()  # what earlier tests put there
    took = serve.warm_up()
    assert set(took) == {"imports", "default scenario", "pages' searches", "model x hardware table"}
    assert all(s >= 0 for s in took.values())
    assert compute.table_complete(TABLE_SEQ_LEN, TABLE_GLOBAL_BATCH_TOKENS)
    cells = compute.table_cells(TABLE_SEQ_LEN, TABLE_GLOBAL_BATCH_TOKENS, budget_s=0.0)
    assert len(cells) == len(TABLE_MODELS) and all(len(row) == len(TABLE_HARDWARE) for row in cells)
    # the cells are the engine's own answers, not a copy of something else
    assert cells[0][0] == table_cell(TABLE_MODELS[0], TABLE_HARDWARE[0])
    assert logging.root.manager.disable == logging.NOTSET  # Streamlit's warnings are back on after it
    # the pages' own cached calls for the default scenario come from Streamlit's cache: what they call is not run
    import calc.evidence.validate
    import calc.memory.fit
    import calc.recommend

    fits = {field: calc.memory.fit.largest_fitting(DEFAULT_SCENARIO, field) for field in ("micro_batch_size", "seq_len")}

    def not_again(*args, **kwargs):
        raise AssertionError("searched again: the warm-up's cache was not used")

    for module, name in ((calc.recommend, "optimization_waterfall"), (calc.recommend, "recommend"),
                         (calc.recommend, "fastest_fitting"), (calc.memory.fit, "largest_fitting"), (calc.evidence.validate, "report")):
        monkeypatch.setattr(module, name, not_again)
    key = DEFAULT_SCENARIO.model_dump_json()
    assert compute.waterfall(key)
    assert all(compute.recommendations(key, allow, None).groups for allow in (False, True))
    assert {field: compute.largest_fitting(key, field) for field in fits} == fits
    compute.fastest_fitting(key)
    assert compute.validation_report() is not None


def test_main_starts_streamlit_on_the_app_with_the_options_given(monkeypatch):
    from streamlit.web import cli

    seen = {}
    monkeypatch.setattr(serve, "warm_up", lambda: {"imports": 0.0})
    monkeypatch.setattr(cli, "main", lambda prog_name: seen.update(argv=list(sys.argv), prog=prog_name) or 0)
    monkeypatch.setattr(sys, "argv", ["ui/serve.py"])
    assert serve.main(["--server.port", "8599"]) == 0
    assert seen == {"argv": ["streamlit", "run", str(serve.APP), "--server.port", "8599"], "prog": "streamlit"}
    assert serve.APP.name == "app.py" and serve.APP.is_file()


def test_help_skips_the_warm_up_and_a_failed_warm_up_still_starts_the_app(monkeypatch, capsys):
    from streamlit.web import cli

    started = []
    monkeypatch.setattr(cli, "main", lambda prog_name: started.append(list(sys.argv)) or 0)

    def must_not_run():
        raise AssertionError("warmed up for --help")

    monkeypatch.setattr(serve, "warm_up", must_not_run)
    assert serve.main(["--help"]) == 0

    def broken():
        raise ValueError("presets/models/x.yaml: bad\nsecond line")

    monkeypatch.setattr(serve, "warm_up", broken)
    assert serve.main([]) == 0
    err = capsys.readouterr().err
    assert "warm-up skipped (ValueError: presets/models/x.yaml: bad)" in err and "second line" not in err
    assert len(started) == 2

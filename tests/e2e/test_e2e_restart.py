"""A redeploy under open pages: the server restarts (what a host does on every deploy), the pages reconnect on
their own, and the first change the user makes afterwards is kept, in the widget and in the URL.

A reconnected page is a new session: its first run comes with the widget values the browser holds (the
user's change among them) and the URL it shows. The session's scenario must follow the widgets then, not
the URL the page was opened with."""

from __future__ import annotations

import time

import pytest

from tests.e2e.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    SERVE,
    VIEW_H,
    VIEW_W,
    WAIT_MS,
    expect,
    free_port,
    settle,
    started_server,
    sync_playwright,
    until,
    url_params,
)

pytestmark = pytest.mark.slow

MICRO_BATCH = "Micro-batch size (sequences per GPU)"


def _micro_batch(pg):
    return pg.locator("[data-testid='stSidebar']").get_by_label(MICRO_BATCH, exact=True)


def _set_micro_batch(pg, value: int) -> None:
    box = _micro_batch(pg)
    box.fill(str(value))
    box.press("Enter")


def test_a_restart_keeps_the_first_change_after_reconnecting():
    port = free_port()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": VIEW_W, "height": VIEW_H})
        pages = [ctx.new_page() for _ in range(2)]
        with started_server(SERVE, "streamlit_restart_1.log", port=port) as (url, _proc, _s):
            for pg, path in zip(pages, ("/", "/Compare"), strict=True):
                pg.set_default_timeout(WAIT_MS)
                pg.goto(f"{url}{path}?model=llama-2-7b&mbs=3")
                until(lambda t, pg=pg: expect(_micro_batch(pg)).to_have_value("3", timeout=t))
                settle(pg)
        # the server is gone; the same port answers again a moment later, as after a deploy
        with started_server(SERVE, "streamlit_restart_2.log", port=port):
            for pg in pages:
                until(lambda t, pg=pg: expect(pg.locator("[data-testid='stConnectionStatus']")).to_have_count(
                    0, timeout=t))
                settle(pg)
                _set_micro_batch(pg, 4)
                settle(pg)
                time.sleep(1)  # a second run that re-seeds the widgets would come now
                settle(pg)
                assert _micro_batch(pg).input_value() == "4", pg.url
                assert url_params(pg).get("mbs") == "4", pg.url
        ctx.close()
        browser.close()

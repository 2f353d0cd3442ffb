"""The browser tests' fixtures: one server and one page per test module."""

from __future__ import annotations

import pytest

from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, SERVE, VIEW_H, VIEW_W, WAIT_MS, started_server, sync_playwright


@pytest.fixture(scope="module")
def server():
    with started_server(SERVE, "streamlit_e2e.log") as (url, _proc, _start_s):
        yield url


@pytest.fixture(scope="module")
def page(server):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": VIEW_W, "height": VIEW_H}, accept_downloads=True)
        pg = ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        yield pg
        ctx.close()
        browser.close()

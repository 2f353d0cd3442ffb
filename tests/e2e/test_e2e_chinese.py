"""Issue 13 in a real browser: every page in Chinese, as a Chinese-speaking engineer opens the app.

The browser's language is zh-CN and the link has no `lang`: the app follows the browser. Every page is
reached through the Chinese navigation links; on each, the URL keeps `lang=zh`, the main column has no
English prose, and the Plotly charts' titles, axes and legends are Chinese. Screenshots of every page go
to artifacts/zh_page_*.png: look at them (a missing CJK font shows as boxes; scripts/test.sh installs
Debian's fonts-noto-cjk). Then the sidebar switch turns the page back into English.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from calc.contract.i18n import translate
from calc.contract.scenario import Scenario
from tests.calc.contract.test_i18n import KEEP, english_runs
from tests.e2e.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PAGES,
    VIEW_H,
    VIEW_W,
    WAIT_MS,
    expect,
    no_traceback,
    settle,
    shot,
    sync_playwright,
    until,
    url_params,
)
from ui import state

pytestmark = pytest.mark.slow

CJK = re.compile(r"[\u3400-\u9fff]")
CHART_WORDS = ".js-plotly-plot .gtitle, .js-plotly-plot .xtitle, .js-plotly-plot .ytitle, .js-plotly-plot .legendtext"
# The main column's prose: code blocks (exported files, commands) are code in every language.
MAIN_PROSE = """() => {
  const main = document.querySelector('[data-testid="stMain"]').cloneNode(true);
  main.querySelectorAll('[data-testid="stCode"], pre, code').forEach(e => e.remove());
  return main.innerText;
}"""


def _has_cjk_font() -> bool:
    try:
        out = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(out.strip())


@pytest.fixture(scope="module")
def zh_page(server):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": VIEW_W, "height": VIEW_H}, locale="zh-CN")
        pg = ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        yield pg
        ctx.close()
        browser.close()


def test_every_page_in_chinese(zh_page, server):  # noqa: F811
    if not _has_cjk_font():
        pytest.skip("no CJK font (fc-list :lang=zh is empty): apt-get install fonts-noto-cjk (scripts/test.sh does)")
    pg = zh_page
    sc = Scenario(model="qwen2.5-7b", hardware={"cluster": "8x-a100-80gb"},
                  training={"precision": "bf16-mixed", "zero_stage": 3, "activation_checkpointing": "full",
                            "micro_batch_size": 2})
    pg.goto(f"{server}/?" + "&".join(f"{k}={v}" for k, v in state.scenario_to_params(sc).items()))
    sidebar = pg.locator("[data-testid='stSidebar']")
    for label, title in PAGES:
        zh_label, zh_title = translate(label, "zh"), translate(title, "zh")
        assert CJK.search(zh_label) and CJK.search(zh_title), (label, title)
        until(lambda t, name=zh_label: expect(sidebar.get_by_role("link", name=name)).to_be_visible(timeout=t))
        sidebar.get_by_role("link", name=zh_label).click()
        until(lambda t, name=zh_title: expect(pg.get_by_role("heading", name=name)).to_be_visible(timeout=t))
        settle(pg)
        no_traceback(pg)
        assert url_params(pg).get("lang") == "zh", url_params(pg)
        prose = pg.evaluate(MAIN_PROSE)
        assert english_runs(prose, 4, KEEP) == [], (label, english_runs(prose, 4, KEEP)[:10])
        chart_words = [t for t in pg.evaluate(f"() => Array.from(document.querySelectorAll({CHART_WORDS!r}))"
                                              ".map(e => e.textContent)") if t and t.strip()]
        assert all(CJK.search(t) or not english_runs(t, 2, KEEP) for t in chart_words), (label, chart_words)
        shot(pg, f"zh_page_{label.lower()}")


def test_the_switch_goes_back_to_english(zh_page, server):  # noqa: F811
    pg = zh_page
    pg.goto(f"{server}/?lang=zh")
    until(lambda t: expect(pg.get_by_role("heading", name=translate("GPU memory calculator", "zh")))
          .to_be_visible(timeout=t))
    pg.locator("[data-testid='stSidebar']").get_by_text("English", exact=True).click()
    until(lambda t: expect(pg.get_by_role("heading", name="GPU memory calculator")).to_be_visible(timeout=t))
    settle(pg)
    assert "lang" not in url_params(pg)

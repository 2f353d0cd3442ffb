"""Every page as a newcomer opens it, on a desktop (1280 px) and a phone (390 px), in English and in Chinese:
a screenshot of each (artifacts/layout_<page>_<lang>_<width>.png: look at them), and two checks that fail
the test:

- nothing is wider than the window unless it scrolls inside its own box (a table that scrolls sideways is
  fine; a table, a chart or a line of text running off the screen is not), and on a desktop no select box
  in the sidebar cuts its choice off;
- no text of the other language: a Chinese page has no run of four or more English words outside code and
  the terms kept in English (model names, units, library names: the glossary's keep_english), and an English
  page has no Chinese outside quotation marks (the source articles' titles are quoted) and outside the
  language switch.

One server and one browser for the module; a context per language and width (about 25 page loads).
"""

from __future__ import annotations

import re
import time

import pytest

from tests.calc.contract.test_i18n import KEEP, english_runs
from tests.e2e.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, WAIT_MS, no_traceback, settle, sync_playwright

pytestmark = pytest.mark.slow

PAGES = ["", "Compare", "Recommend", "Explain", "Export", "Validation", "Serve"]
WIDTHS = {"desktop": 1280, "phone": 390}
SHOT_MAX_PX = 12_000  # a screenshot as tall as the page, up to this

# Elements wider than the window whose overflow shows: no ancestor between them and the main column or the
# sidebar clips or scrolls them sideways. Plotly's own hidden measuring elements are not drawn.
OVERFLOW = """() => {
  const W = document.documentElement.clientWidth, out = [];
  const roots = document.querySelectorAll('[data-testid="stMain"], [data-testid="stSidebar"][aria-expanded="true"]');
  const boxed = (e, root) => {
    for (let a = e.parentElement; a && a !== root; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden' || o === 'clip') return a.getBoundingClientRect().right <= W + 1;
    }
    return false;
  };
  roots.forEach(root => root.querySelectorAll('*').forEach(e => {
    const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    if (r.width === 0 || r.height === 0 || s.visibility === 'hidden' || r.right <= W + 1) return;
    if (!boxed(e, root)) out.push((e.getAttribute('data-testid') || e.tagName) + ' ' + Math.round(r.left) + '-'
                                  + Math.round(r.right) + ': ' + (e.innerText || '').slice(0, 60));
  }));
  if (document.documentElement.scrollWidth > W + 1) out.push('the page scrolls sideways: ' + document.documentElement.scrollWidth);
  return out.slice(0, 10);
}"""
CUT_SELECTS = """() => Array.from(document.querySelectorAll('[data-testid="stSidebar"] input[role="combobox"]'))
  .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.value)"""
# The page's prose: code blocks and inline code are code in every language.
PROSE = """() => {
  const parts = [];
  document.querySelectorAll('[data-testid="stMain"], [data-testid="stSidebar"]').forEach(root => {
    const copy = root.cloneNode(true);
    copy.querySelectorAll('[data-testid="stCode"], pre, code').forEach(e => e.remove());
    parts.push(copy.innerText);
  });
  return parts.join('\\n');
}"""
CJK = re.compile(r"[\u3400-\u9fff\u3000-\u303f\uff00-\uffef]")
QUOTED = re.compile(r"“[^”]*”|「[^」]*」|《[^》]*》")
LANGUAGE_SWITCH = ("Language / 语言", "中文")


def chinese_in_english(prose: str) -> list[str]:
    """Lines of an English page with Chinese in them, quotations and the language switch aside."""
    for kept in LANGUAGE_SWITCH:
        prose = prose.replace(kept, " ")
    return [line for line in QUOTED.sub(" ", prose).splitlines() if CJK.search(line)]


def test_chinese_in_english_skips_quotes_and_the_switch():
    assert chinese_in_english("Language / 语言\nEnglish 中文\n“为什么GPU显存” (“Why”), a post") == []
    assert chinese_in_english("Peak 峰值 here") == ["Peak 峰值 here"]


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _drawn(pg) -> None:
    """The page's first run has drawn (its title is there, no placeholder left), then the rest of it has."""
    pg.wait_for_function("() => document.querySelector('[data-testid=\"stMain\"] h1')"
                         " && !document.querySelector('[data-testid*=\"Skeleton\"]')", timeout=WAIT_MS)
    settle(pg)
    time.sleep(1)
    settle(pg)


def _full_height_shot(pg, width: int, name: str) -> None:
    """The main column scrolls inside the window: make the window as tall as the column, then shoot it."""
    height = pg.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": min(height + 50, SHOT_MAX_PX)})
    time.sleep(0.5)
    pg.screenshot(path=ARTIFACTS / f"{name}.png")
    pg.set_viewport_size({"width": width, "height": 900})


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("device", sorted(WIDTHS))
def test_every_page_fits_the_window_and_speaks_one_language(server, browser, lang, device):
    width = WIDTHS[device]
    ctx = browser.new_context(viewport={"width": width, "height": 900},
                              locale="zh-CN" if lang == "zh" else "en-US")
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    problems = []
    try:
        for path in PAGES:
            page = path or "Calculator"
            pg.goto(f"{server}/{path}?lang={lang}")
            _drawn(pg)
            no_traceback(pg)
            _full_height_shot(pg, width, f"layout_{page.lower()}_{lang}_{width}")
            problems += [f"{page}: wider than the window: {o}" for o in pg.evaluate(OVERFLOW)]
            if device == "desktop":
                problems += [f"{page}: sidebar select cut off: {v}" for v in pg.evaluate(CUT_SELECTS)]
            prose = pg.evaluate(PROSE)
            other = english_runs(prose, 4, KEEP) if lang == "zh" else chinese_in_english(prose)
            problems += [f"{page}: text of the other language: {t[:80]!r}" for t in other[:5]]
    finally:
        ctx.close()
    assert problems == []

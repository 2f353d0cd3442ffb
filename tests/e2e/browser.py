"""The browser tests' helpers: the app's server started as the README says (`python -m ui.serve`), Debian's
chromium through Playwright (never `playwright install`), and the steps a test takes on a page. The fixtures
that use them are in conftest.py."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from calc.contract.scenario import Scenario
from calc.memory.engine import estimate
from calc.memory.verdict import headline

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEW_W, VIEW_H = 1500, 1300
WAIT_MS = 90_000

try:
    from playwright.sync_api import expect, sync_playwright  # noqa: F401 - the tests import expect from here
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if sync_playwright is None:
    pytest.skip("the playwright package is not installed (pip install playwright==1.65.2; uses /usr/bin/chromium, "
                "never `playwright install`)", allow_module_level=True)
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)",
                allow_module_level=True)


SERVERS: dict[str, subprocess.Popen] = {}


def server_alive() -> None:
    """Fail with the reason when the app's process has gone (not a browser timeout 90 s later)."""
    proc = SERVERS.get("proc")
    if proc is not None and proc.poll() is not None:
        raise AssertionError(f"the streamlit server exited with code {proc.returncode} during the test "
                             f"(a signal from outside the test is negative); see {ARTIFACTS / 'streamlit_e2e.log'}")


def until(check, timeout_s: float = WAIT_MS / 1000) -> None:
    """Retry a Playwright `expect(...)` check in short slices, checking that the server still runs."""
    deadline = time.time() + timeout_s
    while True:
        try:
            check(3_000)
            return
        except AssertionError:
            server_alive()
            if time.time() > deadline:
                raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How the app is started: the README's quick start (the first visit's work done before the server listens)
# and Streamlit's own command (what a host that runs `streamlit run` does).
SERVE = ["-m", "ui.serve"]
STREAMLIT_RUN = ["-m", "streamlit", "run", "app.py"]


@contextmanager
def started_server(command: list[str], log_name: str, proc_slot: str = "proc", port: int | None = None):
    """The app started with `python <command>` on `port` (default: a free one); yields (url, process, seconds
    until it answered its health check), and stops it after. `proc_slot` names it in SERVERS, for
    server_alive()."""
    port = port or free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(ARTIFACTS.mkdir(exist_ok=True) or ARTIFACTS / log_name, "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, *command, "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    SERVERS[proc_slot] = proc
    started = time.perf_counter()
    try:
        deadline = time.time() + 120  # ui.serve searches the default table before it listens (3 s idle)
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the app did not start; see {ARTIFACTS / log_name}")
            time.sleep(0.1)
        yield url, proc, time.perf_counter() - started
    finally:
        SERVERS.pop(proc_slot, None)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# ---- helpers ---------------------------------------------------------------------------------

# ui.first_screen's trigger (the app's only components-v2 element): on the page while the rest of it is awaited
FIRST_SCREEN_TRIGGER = "[data-testid^='stBidiComponent']"


def settle(pg) -> None:
    """Wait until the script run is over, the page has asked for the rest of itself (ui.first_screen) and it
    stops growing."""
    last = -1
    for _ in range(240):
        server_alive()
        pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
                             f" && !document.querySelector(\"{FIRST_SCREEN_TRIGGER}\")", timeout=WAIT_MS)
        time.sleep(0.4)
        h = pg.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        if h == last and not pg.locator("[data-testid='stSpinner']").count():
            return
        last = h


def no_traceback(pg) -> None:
    server_alive()
    body = pg.locator("body").inner_text()
    assert "Traceback" not in body and "StreamlitAPIException" not in body, body[:2000]


def shot(pg, name: str) -> Path:
    """The whole main column, scrolled and stitched (the sidebar from the first frame)."""
    from PIL import Image

    settle(pg)
    main = "document.querySelector('[data-testid=\"stMain\"]')"
    height = pg.evaluate(f"() => {main}.scrollHeight")
    sidebar = int(pg.evaluate("() => { const s = document.querySelector('[data-testid=\"stSidebar\"]');"
                              " return s ? s.getBoundingClientRect().right : 0 }"))
    frames, y = [], 0
    while True:
        pg.evaluate(f"() => {main}.scrollTo(0, {y})")
        time.sleep(0.5)
        top = pg.evaluate(f"() => {main}.scrollTop")
        frames.append((top, Image.open(io.BytesIO(pg.screenshot()))))
        if y + VIEW_H >= height:
            break
        y += VIEW_H - 100
    img = Image.new("RGB", (VIEW_W, max(t for t, _ in frames) + VIEW_H), "white")
    for i, (top, frame) in enumerate(frames):
        img.paste(frame if i == 0 else frame.crop((sidebar, 0, VIEW_W, VIEW_H)), (0 if i == 0 else sidebar, top))
    pg.evaluate(f"() => {main}.scrollTo(0, 0)")
    path = ARTIFACTS / f"{name}.png"
    img.save(path)
    return path


def choose(pg, scope, label: str, option: str, type_text: str | None = None) -> None:
    """Pick `option` in the selectbox labelled `label` inside `scope` (typing into it when asked, as a
    user searches the model list)."""
    settle(pg)
    box = scope.locator("[data-testid='stSelectbox']").filter(has=pg.get_by_text(label, exact=True)).first
    box.scroll_into_view_if_needed()
    for _ in range(3):  # a rerun can replace the widget between the click and the list opening
        if type_text:
            field = box.get_by_role("combobox")
            field.click()
            field.fill(type_text)
        else:
            box.get_by_role("button", name="Open").click()
        try:
            pg.get_by_role("option", name=option, exact=True).click(timeout=5_000)
            break
        except Exception:  # noqa: BLE001 - retried, then the last attempt raises
            pg.keyboard.press("Escape")
            settle(pg)
    else:
        raise AssertionError(f"could not choose {option!r} in {label!r}")
    settle(pg)


def url_params(pg) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlparse

    return dict(parse_qsl(urlparse(pg.evaluate("() => window.location.href")).query))


def calc_verdict(sc: Scenario) -> str:
    """The engine's one verdict as the page renders it (calc.memory.verdict.headline, bold removed)."""
    return headline(estimate(sc).verdict)


def compare_verdict(name: str, sc: Scenario) -> str:
    """A Compare column's headline: its name, the method it trains (calc.recommend.describe) and the verdict."""
    from calc.recommend.describe import method_words

    return f"{name}, {method_words(sc)}: {headline(estimate(sc).verdict)}"


def alerts(pg):
    return pg.locator("[data-testid='stMain'] [data-testid='stAlert']")


# ---- the journey -------------------------------------------------------------------------------


PAGES = [("Calculator", "GPU memory calculator"), ("Compare", "Compare scenarios"),
         ("Recommend", "What fits, and what to turn on next"),
         ("Explain", "Where GPU memory goes, and what to do about it"), ("Export", "Export the configuration"),
         ("Validation", "Predicted vs measured")]

"""Draw a page's first screen before the rest of it.

A browser renders everything a script run has sent before it paints the page's first chart: the script
sends the whole page within about 0.1 s, and plotly.js (a lazily loaded 4.7 MB chunk) is parsed, and every
chart drawn, only after the Markdown, tables and code blocks that arrived with it are laid out. On Explain
that was 0.9 s of Markdown and a syntax highlighter before five charts drawn in one task.

So, on the first run after arriving at a page (a new session, a link, the navigation), a page draws its
first screen, up to and including its first chart, and stops there (`stop_after_first_screen`). A small
component (Streamlit's components v2: inline JavaScript in the page, no iframe) waits in the browser until
that chart is on screen, lets the browser paint it and go idle, and asks for a rerun; every later run of the page draws
all of it. The reader sees the same page, its top sooner; what is below the first screen arrives a few
tenths of a second later.
"""

from __future__ import annotations

import streamlit as st

from ui import state

# Waits for the page's first plotly chart to be drawn (its .main-svg exists), lets the browser paint a frame
# (requestAnimationFrame runs before the paint, the timeout after it) and finish what it still has to do for
# the first screen (an idle callback, at most IDLE_MS later), then triggers the rerun. A page whose first
# screen has no chart, or whose chart fails, is rerun after FALLBACK_MS.
_JS = """
export default function({ setTriggerValue }) {
  const FALLBACK_MS = 3000, IDLE_MS = 300;
  let done = false, observer = null;
  const fire = () => {
    if (done) return;
    done = true;
    if (observer) observer.disconnect();
    clearTimeout(timer);
    setTriggerValue("drawn", true);
  };
  const whenIdle = () => window.requestIdleCallback ? requestIdleCallback(fire, { timeout: IDLE_MS }) : fire();
  const afterPaint = () => requestAnimationFrame(() => setTimeout(whenIdle, 0));
  const drawn = () => document.querySelector("[data-testid='stPlotlyChart'] .main-svg");
  const timer = setTimeout(fire, FALLBACK_MS);
  if (drawn()) {
    afterPaint();
  } else {
    observer = new MutationObserver(() => {
      if (drawn()) { observer.disconnect(); observer = null; afterPaint(); }
    });
    observer.observe(document.body, { childList: true, subtree: true });
  }
  return () => { done = true; if (observer) observer.disconnect(); clearTimeout(timer); };
}
"""

_trigger = st.components.v2.component("vramcalc.first_chart_drawn", js=_JS)


def stop_after_first_screen() -> None:
    """Call right after a page's first chart. On the first run after arriving at the page, mount the
    trigger and stop the script (the rest follows in the rerun the browser asks for once the chart is
    drawn); on every other run, return and let the page continue."""
    if not state.arrived():
        return
    ss = st.session_state
    ss[state.FIRST_SCREEN] = True
    if ss.get(state.URL_ERROR_SHOWN):  # a link's problem, shown once: again above the whole page
        ss[state.URL_ERROR] = ss[state.URL_ERROR_SHOWN]
    _trigger(key="vc_first_chart_drawn", on_drawn_change=lambda: None)
    st.stop()

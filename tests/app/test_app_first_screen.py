"""ui.first_screen: on arrival a page draws its first screen, up to its first chart, and the browser's trigger
asks for the rest; every other run draws the whole page. And the page frame's other start-up work: the
first page run of a process moves what it imported out of the cyclic collector's reach, once."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.test_app_helpers import APP, PAGES, TIMEOUT, assert_clean, go, open_app
from ui import state

# page -> (the first chart's key, how many charts the whole page draws for the default scenario)
FIRST_CHART = {"calculator": ("calc_breakdown", 2), "compare": ("cmp_chart", 1), "recommend": ("rec_waterfall", 1),
               "explain": ("explain_timeline", 7), "validation": ("val_scatter", 2)}


def _kinds(at: AppTest) -> list[str]:
    return [getattr(e, "type", type(e).__name__) for e in at.main.children.values()]


@pytest.mark.parametrize("page", sorted(FIRST_CHART))
def test_arrival_draws_the_first_screen_then_the_rerun_draws_the_rest(page):
    first, total = FIRST_CHART[page]
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if PAGES[page]:
        at.switch_page(PAGES[page])
    at.run()
    assert_clean(at)
    kinds = _kinds(at)
    # the first chart (on Validation inside the plot's container), then the trigger, and nothing after it
    assert kinds[-1] == "bidi_component" and kinds.count("bidi_component") == 1, kinds
    assert [first in c.proto.id for c in at.get("plotly_chart")] == [True] and at.session_state[state.FIRST_SCREEN]
    head = len(kinds) - 1

    at.run()  # what the browser's trigger asks for once the chart is drawn
    assert_clean(at)
    kinds = _kinds(at)
    assert "bidi_component" not in kinds and len(kinds) > head
    assert len(at.get("plotly_chart")) == total and not at.session_state[state.FIRST_SCREEN]

    at.run()  # any later run on the same page (a widget changed) draws it all at once
    assert len(at.get("plotly_chart")) == total and not at.session_state[state.FIRST_SCREEN]


def test_coming_back_to_a_page_is_an_arrival_again():
    at = open_app("explain")
    go(at, "calculator")
    assert not at.session_state[state.FIRST_SCREEN]
    at.switch_page(PAGES["explain"])
    at.run()
    assert at.session_state[state.FIRST_SCREEN] and len(at.get("plotly_chart")) == 1


def test_a_links_problem_is_shown_on_the_first_screen_and_with_the_rest_then_dropped():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"model": "llama-2-7b", "zero": "9"})
    at.run()
    assert at.session_state[state.FIRST_SCREEN] and any("not valid" in w.value for w in at.warning)
    at.run()  # the rest of the page
    assert not at.session_state[state.FIRST_SCREEN] and any("not valid" in w.value for w in at.warning)
    at.run()  # shown once: a later run does not repeat it
    assert not any("not valid" in w.value for w in at.warning)

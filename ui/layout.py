"""The few layout rules Streamlit's defaults get wrong for this app's content, as one style sheet sent with
every page (ui.widgets.page_setup):

- Markdown tables (ui.fmt.table) scroll sideways inside the column instead of running off a phone's screen.
- The sidebar is wide enough on a desktop for its longest choices ("NVIDIA GeForce RTX 4090 (23.99 GiB)", "AMP
  bf16 (fp32 weights, bf16 autocast)"): a select box is a text field, which cannot wrap, so it would cut them off.

tests/e2e/test_e2e_layout.py checks every page at desktop and phone widths for anything wider than the window.
"""

from __future__ import annotations

import streamlit as st

STYLE = """<style>
[data-testid="stMarkdownContainer"] table { display: block; max-width: 100%; overflow-x: auto; }
@media (min-width: 1000px) {
  section[data-testid="stSidebar"] { width: 22rem !important; min-width: 22rem !important; }
}
[data-testid="stSidebar"] input[role="combobox"] {
  font-size: 0.875rem !important; padding-left: 6px !important; padding-right: 2px !important;
}
[data-testid="stSidebar"] [data-testid="stExpanderDetails"] {
  padding-left: 0.6rem !important; padding-right: 0.6rem !important;
}
[data-testid="stSidebarContent"] { padding-left: 0.9rem !important; padding-right: 0.9rem !important; }
</style>"""


def apply() -> None:
    """Send the style sheet (an element of its own that takes no space on the page)."""
    st.html(STYLE)

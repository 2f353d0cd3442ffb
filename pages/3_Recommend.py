"""Placeholder while calc.recommend / calc.export are written."""

from __future__ import annotations

import streamlit as st

from ui.widgets import page_setup, scenario_or_stop

page_setup("Soon")
scenario_or_stop()
st.info("This page needs a calc/ module that is not in the repository yet.")

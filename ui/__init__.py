"""Streamlit UI helpers: URL/session state, widgets that return validated Scenarios, Plotly
chart builders and formatting. No formula lives here: every number comes from calc/."""

# pandas whole, before any chart: plotly's validators import it lazily, and when two script runs of a
# fresh server reach that lazy import at the same moment, one can get the partially initialised
# module ("partially initialized module 'pandas' has no attribute 'Series'", seen once in the
# browser test). Importing it here, under this package's import lock, finishes it first.
import pandas  # noqa: F401

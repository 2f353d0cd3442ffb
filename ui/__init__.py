"""Streamlit UI helpers: URL/session state, widgets that return validated Scenarios, Plotly
chart builders and formatting. No formula lives here: every number comes from calc/."""

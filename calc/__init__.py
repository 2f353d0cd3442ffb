"""vramcalc's calculation core: pure Python, pydantic models in and out, no torch, no Streamlit."""

from calc.engine import estimate
from calc.result import Estimate
from calc.scenario import Scenario

__all__ = ["Scenario", "Estimate", "estimate"]

"""vramcalc's calculation core: pure Python, pydantic models in and out, no torch, no Streamlit."""

import gc

# Importing the engine builds pydantic's validators and the model tables: thousands of objects that live as
# long as the process, none of them garbage. The cyclic collector would scan them over and over while they
# are made (about a tenth of a `python -m calc` command), so it waits until the import is done.
_collecting = gc.isenabled()
gc.disable()
try:
    from calc.engine import estimate
    from calc.result import Estimate
    from calc.scenario import Scenario
finally:
    if _collecting:
        gc.enable()

__all__ = ["Scenario", "Estimate", "estimate"]

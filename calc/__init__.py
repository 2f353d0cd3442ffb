"""vramcalc's calculation core: pure Python, pydantic models in and out, no torch, no Streamlit."""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (as it was, after). Importing the engine builds pydantic's
    validators and the model tables: thousands of objects that live as long as the process, none of them
    garbage, which the collector would scan over and over while they are made (about a tenth of a
    `python -m calc` command)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


with collector_paused():
    from calc.engine import estimate
    from calc.result import Estimate
    from calc.scenario import Scenario

__all__ = ["Scenario", "Estimate", "estimate"]

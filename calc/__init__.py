"""vramcalc's calculation core: pure Python, pydantic models in and out, no torch, no Streamlit."""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (as it was, after). Importing the engine builds pydantic's
    validators and the model tables: thousands of objects that live as long as the process, few of them
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

    # What the import made (pydantic's validators, the model tables, the presets) lives as long as the process. Moved
    # out of the collector's reach before it runs again, it is never walked: the first collection after the import
    # walked all of it, 10-12 ms (`import calc.recommend.search` 184 -> 165 ms of CPU, best of 8; `python -m calc`
    # imports the package before its __main__ can freeze anything). The price: the few hundred objects the import
    # left in reference cycles (about 550) are never freed.
    gc.freeze()

__all__ = ["Scenario", "Estimate", "estimate"]

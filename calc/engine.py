"""The engine's old import path, kept for scripts and notebooks: the memory model lives in calc.memory."""

from calc.memory.engine import clear_memo, estimate, reference_estimate

__all__ = ["clear_memo", "estimate", "reference_estimate"]

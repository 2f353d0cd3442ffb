"""The engine's old import path, kept for scripts and notebooks: the memory model lives in calc.memory
(calc.memory.estimate: estimate, reference_estimate, clear_memo)."""

from calc.memory.estimate import clear_memo, estimate, reference_estimate

__all__ = ["clear_memo", "estimate", "reference_estimate"]

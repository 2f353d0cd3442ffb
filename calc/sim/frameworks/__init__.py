"""Other frameworks' model code for the autograd simulator, chosen by Ctx.framework (transformers' is calc.sim.blocks)."""

"""Other frameworks' model code for the autograd simulator, one module each (litgpt.py, torchtune.py), chosen by
Ctx.framework (transformers' is calc.sim.blocks)."""

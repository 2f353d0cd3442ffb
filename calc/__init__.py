"""vramcalc's calculation core: pure Python, pydantic models in and out, no torch, no Streamlit.

The public API, for scripts and notebooks: `Scenario` (the JSON contract), `estimate` (the peak memory of one
training or inference step, where every byte goes, and whether it fits) and `Estimate` (what it returns);
`reference_estimate` lists every moment of the step instead of asking only where the peak can be.

The wings, each a package whose docstring says what it owns and what it may import, from the floor up:

- `calc.contract`: the scenario and everything a user can say (architectures, presets, precision, parallel
  layouts, limits, the input boundary, errors, units, the two languages, the measurement record).
- `calc.sim`: the op-level simulator: what each layer's autograd graph keeps alive, recorded once per shape.
- `calc.memory`: the memory model: model states, activations, the step's timeline, its peak, the breakdown,
  the device total and the verdict.
- `calc.speed`: the step-time model.
- `calc.recommend`: the search for configurations that fit, ranked by speed; the model x hardware table; the
  "what to turn on next" waterfall.
- `calc.evidence`: how far the estimates are to be trusted: validation against measured runs, calibration by a
  user's own run, the published claims checked.
- `calc.export`: the files that run a configuration (DeepSpeed config, Trainer script, launch lines).
- `calc.cli`: `python -m calc`: the parser, one module per command; the only place for process-wide settings.
"""

from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate, reference_estimate
from calc.memory.result import Estimate

__all__ = ["Estimate", "Scenario", "estimate", "reference_estimate"]

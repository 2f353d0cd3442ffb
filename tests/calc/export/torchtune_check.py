"""python -m tests.calc.export.torchtune_check CONFIG.yaml: what torchtune's recipe does with the exported config
before its first step, with torchtune's own code: `tune validate` (torchtune.config.validate: every component
importable and its keys bound to its signature), the checkpointer block instantiated and loading the Hugging Face
checkpoint the config names (FullModelHFCheckpointer.load_checkpoint: model_type's weight conversion), the model
block instantiated and the converted weights loaded into it. Prints one JSON line: the keys the load left missing.

Run in its own process, as the recipe would be.
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    from omegaconf import OmegaConf
    from torchtune import config

    cfg = OmegaConf.load(path)
    config.validate(cfg)
    state = config.instantiate(cfg.checkpointer).load_checkpoint()
    model = config.instantiate(cfg.model)
    result = model.load_state_dict(state["model"], strict=False)
    print(json.dumps({"missing": list(result.missing_keys), "unexpected": list(result.unexpected_keys)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

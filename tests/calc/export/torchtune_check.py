"""python -m tests.calc.export.torchtune_check CONFIG.yaml: what torchtune's recipe does with the exported config
before its first step, with torchtune's own code: `tune validate` (torchtune.config.validate: every component
importable and its keys bound to its signature), the checkpointer block instantiated and loading the Hugging Face
checkpoint the config names (FullModelHFCheckpointer.load_checkpoint: model_type's weight conversion), the model
block instantiated and the converted weights loaded into it. Prints one JSON line: the keys the load left missing.

Run in its own process: torchtune.training's __init__ imports torchtune.training.quantization, which asks
torchao for names torchao 0.17 no longer has, so the package is stood in for by a bare one holding the
submodules the config names (checkpointing, lr_schedulers, metric_logging, the profiler), each imported whole.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types


def _bare_training_package() -> None:
    spec = importlib.util.find_spec("torchtune")
    assert spec is not None and spec.submodule_search_locations
    pkg = types.ModuleType("torchtune.training")
    pkg.__path__ = [f"{next(iter(spec.submodule_search_locations))}/training"]
    sys.modules["torchtune.training"] = pkg
    import torchtune.training.checkpointing as checkpointing
    from torchtune.training import lr_schedulers, metric_logging  # noqa: F401  (the config's components)
    from torchtune.training._profiler import setup_torch_profiler

    for name in dir(checkpointing):  # FullModelHFCheckpointer and the MODEL_KEY constants it reads
        if not name.startswith("__"):
            setattr(pkg, name, getattr(checkpointing, name))
    pkg.setup_torch_profiler = setup_torch_profiler


def main(path: str) -> int:
    _bare_training_package()
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

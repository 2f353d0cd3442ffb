"""Runs an exported train.py for one step with pre-forward hooks on every decoder layer's attention projection
(q_proj) and MLP (down_proj), and prints one line: COUNTS [[q_proj calls, down_proj calls], ...].
Used by tests/calc/export/test_export_checkpointing.py, one process per case:

    python tests/calc/export/count_layer_calls.py TRAIN_PY OUTPUT_DIR

A process of its own, since the Trainer's CPU state starts a one-rank process group and leaves the rendezvous
variables (RANK, LOCAL_RANK, WORLD_SIZE) in the environment: inside the test process they reached later tests.
"""

from __future__ import annotations

import importlib.util
import json
import sys


def main(train_py: str, output_dir: str) -> None:
    spec = importlib.util.spec_from_file_location("exported_train", train_py)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    counts: list[list[int]] = []

    def counter(i: int, part: int):
        def hook(*_):
            counts[i][part] += 1
        return hook

    class CountingTrainer(train.Trainer):  # hooks on the model the script hands the Trainer
        def __init__(self, model, **kw):
            for i, layer in enumerate(model.model.layers):
                counts.append([0, 0])
                layer.self_attn.q_proj.register_forward_pre_hook(counter(i, 0))
                layer.mlp.down_proj.register_forward_pre_hook(counter(i, 1))
            super().__init__(model=model, **kw)

    train.Trainer = CountingTrainer
    sys.argv = ["train.py", "--max_steps", "1", "--use_cpu", "true", "--output_dir", output_dir]
    train.main()
    print("COUNTS " + json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The exported train.py checkpoints exactly the layers and parts the estimate assumed: the Trainer runs one step of
a 4-layer tiny Llama, and hooks count how often each layer's attention projection (q_proj) and MLP (down_proj) run
(tests/calc/export/count_layer_calls.py, a process per case). A checkpointed part runs twice (its forward, then its
recompute in the backward pass), the rest once. Pre-forward hooks count the calls: PyTorch's non-reentrant
checkpoint stops its recompute as soon as the last saved tensor is back (set_checkpoint_early_stop), inside the
layer's last matmul, before a forward hook would run. About 40 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.scenario import Scenario
from calc.export import export_bundle
from measure.deepspeed_run import free_port

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]
COUNTER = Path(__file__).with_name("count_layer_calls.py")
LAYERS = 4
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64}


def run_env() -> dict[str, str]:
    """No launcher's variables: train.py sets its one-rank defaults itself, on a port no other job holds."""
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
             TOKENIZERS_PARALLELISM="false")
    return e


def calls_per_layer(tmp_path: Path, **training) -> list[tuple[int, int]]:
    """[(q_proj calls, down_proj calls)] per decoder layer over one training step of the exported train.py."""
    sc = Scenario(model=TINY, hardware={"gpu": "a100-80gb", "num_gpus": 1},
                  training={"micro_batch_size": 1, "seq_len": 16, "precision": "fp32", **training})
    files, _ = export_bundle(sc)
    (tmp_path / "train.py").write_text(files["train.py"])
    cmd = [sys.executable, str(COUNTER), str(tmp_path / "train.py"), str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=run_env(), cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    line = next((x for x in r.stdout.splitlines() if x.startswith("COUNTS ")), None)
    assert line is not None, out[-4000:]
    return [tuple(c) for c in json.loads(line.removeprefix("COUNTS "))]


@pytest.mark.slow
@pytest.mark.parametrize(("training", "expected"), [
    pytest.param({}, [(1, 1)] * LAYERS, id="none"),
    pytest.param({"activation_checkpointing": "full"}, [(2, 2)] * LAYERS, id="full"),
    pytest.param({"activation_checkpointing": "full", "checkpoint_every": 2}, [(2, 2), (1, 1), (2, 2), (1, 1)],
                 id="full-1-in-2"),
    pytest.param({"activation_checkpointing": "full", "checkpoint_every": 3}, [(2, 2), (1, 1), (1, 1), (2, 2)],
                 id="full-1-in-3"),
    pytest.param({"activation_checkpointing": "selective"}, [(2, 1)] * LAYERS, id="selective"),
])
def test_train_script_checkpoints_what_the_estimate_assumed(tmp_path, training, expected):
    assert calls_per_layer(tmp_path, **training) == expected

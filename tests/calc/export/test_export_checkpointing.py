"""The exported train.py checkpoints exactly the layers and parts the estimate assumed: the Trainer runs one step of
a 4-layer tiny Llama in this process, and hooks count how often each layer's attention projection (q_proj) and MLP
(down_proj) run. A checkpointed part runs twice (its forward, then its recompute in the backward pass), the rest
once. Pre-forward hooks count the calls: PyTorch's non-reentrant checkpoint stops its recompute as soon as the last
saved tensor is back (set_checkpoint_early_stop), inside the layer's last matmul, before a forward hook would run.
About 15 s."""

from __future__ import annotations

import importlib.util
import socket
import sys

import pytest

from calc.contract.scenario import Scenario
from calc.export import export_bundle

pytest.importorskip("transformers")

LAYERS = 4
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def calls_per_layer(tmp_path, monkeypatch, **training) -> list[tuple[int, int]]:
    """[(q_proj calls, down_proj calls)] per decoder layer over one training step of the exported train.py."""
    sc = Scenario(model=TINY, hardware={"gpu": "a100-80gb", "num_gpus": 1},
                  training={"micro_batch_size": 1, "seq_len": 16, "precision": "fp32", **training})
    files, _ = export_bundle(sc)
    (tmp_path / "train.py").write_text(files["train.py"])
    spec = importlib.util.spec_from_file_location("exported_ckpt_train", tmp_path / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    counts: list[list[int]] = []

    class CountingTrainer(train.Trainer):  # hooks on the model the script hands the Trainer
        def __init__(self, model, **kw):
            for i, layer in enumerate(model.model.layers):
                counts.append([0, 0])
                layer.self_attn.q_proj.register_forward_pre_hook(lambda *_, i=i: counts[i].__setitem__(0, counts[i][0] + 1))
                layer.mlp.down_proj.register_forward_pre_hook(lambda *_, i=i: counts[i].__setitem__(1, counts[i][1] + 1))
            super().__init__(model=model, **kw)

    monkeypatch.setattr(train, "Trainer", CountingTrainer)
    # the Trainer's CPU state starts a one-rank process group in this process: on a port of its own, not 29500,
    # where an earlier test's store may still listen (a rendezvous there waits for ranks that never come)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setattr(sys, "argv", ["train.py", "--max_steps", "1", "--use_cpu", "true", "--output_dir",
                                      str(tmp_path / "out")])
    train.main()
    return [tuple(c) for c in counts]


@pytest.mark.parametrize(("training", "expected"), [
    pytest.param({}, [(1, 1)] * LAYERS, id="none"),
    pytest.param({"activation_checkpointing": "full"}, [(2, 2)] * LAYERS, id="full"),
    pytest.param({"activation_checkpointing": "full", "checkpoint_every": 2}, [(2, 2), (1, 1), (2, 2), (1, 1)],
                 id="full-1-in-2"),
    pytest.param({"activation_checkpointing": "full", "checkpoint_every": 3}, [(2, 2), (1, 1), (1, 1), (2, 2)],
                 id="full-1-in-3"),
    pytest.param({"activation_checkpointing": "selective"}, [(2, 1)] * LAYERS, id="selective"),
])
def test_train_script_checkpoints_what_the_estimate_assumed(tmp_path, monkeypatch, training, expected):
    assert calls_per_layer(tmp_path, monkeypatch, **training) == expected

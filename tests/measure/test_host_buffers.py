"""calc.memory.host's offload parts against the buffers DeepSpeed 0.19 itself makes (measure.host_buffers: the
exported ds_config, DeepSpeed's CPU accelerator, two ranks over gloo): each part's bytes per rank, and the
export asking to pin them (the path that rounds them up to powers of two on CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.scenario import Scenario
from calc.memory.engine import estimate
from measure.deepspeed_run import free_port, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _buffers(scenarios: list[Scenario], tmp: Path) -> list[dict]:
    sc_path, out = tmp / "scenarios.json", tmp / "out.json"
    sc_path.write_text(json.dumps([sc.model_dump(mode="json") for sc in scenarios]))
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(scenarios[0].resolved_hardware().num_gpus),
           "--master_port", str(free_port()), "-m", "measure.host_buffers", str(sc_path), str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_offload_parts_are_deepspeeds_buffers(tmp_path):
    """ZeRO-3 and ZeRO-2 with CPU optimizer offload, bf16-mixed, 2 ranks (one launch, ~45 s)."""
    scenarios = [Scenario.model_validate({
        "model": tiny_model("llama"), "hardware": {"gpu": "a100-80gb", "num_gpus": 2},
        "training": {"zero_stage": stage, "precision": "bf16-mixed", "offload_optimizer": "cpu",
                     "micro_batch_size": 1, "seq_len": 32}}) for stage in (3, 2)]
    for sc, real in zip(scenarios, _buffers(scenarios, tmp_path), strict=True):
        stage = sc.training.zero_stage
        assert real.pop("pin_memory") is True  # the export pins: on CUDA these are the rounded allocations
        parts = {p.key: p for p in estimate(sc).host_memory.parts}
        assert set(parts) == set(real), stage
        for key, tensors in real.items():
            assert parts[key].requested_bytes == sum(tensors), (stage, key)
            if parts[key].pinned_tensors:  # one pinned tensor each (ZeRO-3's fp32 gradients: one per sub-group)
                assert parts[key].pinned_tensors == len(tensors), (stage, key)
            # pinned on CUDA exactly where DeepSpeed pins (stage3.py keeps the fp32 master pageable; Adam's
            # states are pageable at every stage)
            assert (parts[key].pinned_tensors > 0) == (key != "optimizer_states" and
                                                       not (stage == 3 and key == "master")), (stage, key)

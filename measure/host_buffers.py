"""The host buffers DeepSpeed's optimizer offload really makes, listed from the running optimizer, to check
calc.memory.host's parts (what each is, how large, whether it is pinned) against DeepSpeed itself.

    torchrun --nproc_per_node N -m measure.host_buffers SCENARIOS.json OUT.json

SCENARIOS.json is a list of scenarios of the same world size (one launch runs them one after another). Every rank
builds the model and runs deepspeed.initialize with the exported ds_config (DeepSpeed's CPU
accelerator, DS_ACCELERATOR=cpu, gloo), then one optimizer step so that CPU Adam creates its states; rank 0 writes
the bytes of each buffer (its optimizer's own attributes: stage3.py / stage_1_and_2.py) and whether the config
asked to pin them. On the CPU accelerator pin_memory is a no-op, so the sizes are the requested ones; the
rounding of pinned buffers on CUDA is PyTorch's (calc.memory.host's docstring).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from calc.contract.scenario import Scenario


def _nbytes(tensors: Any) -> list[int]:
    return [t.numel() * t.element_size() for t in tensors]


def _states_bytes(optimizer: Any) -> int:
    """CPU Adam's exp_avg and exp_avg_sq, over every parameter it steps."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for k, v in state.items()
               if k in ("exp_avg", "exp_avg_sq"))


def inventory(engine: Any, stage: int) -> dict[str, Any]:
    """Each offload buffer of the engine's ZeRO optimizer, in bytes per tensor."""
    opt = engine.optimizer
    if stage == 3:
        masters = opt.fp32_partitioned_groups_flat
        return {"optimizer_states": [_states_bytes(opt.optimizer)], "master": _nbytes(masters),
                "fp32_grads": _nbytes(m.grad for m in masters),
                "grad_partitions": _nbytes([opt.grad_partitions_flat_buffer]),
                "pin_memory": bool(opt.offload_optimizer_pin_memory)}
    masters = opt.single_partition_of_fp32_groups
    return {"optimizer_states": [_states_bytes(opt.optimizer)], "master": _nbytes(masters),
            "fp32_grads": _nbytes(m.grad for m in masters),
            "bit16_weights": _nbytes(opt.param_buffer_of_bit16_for_cpu_offload_groups),
            "grad_staging": _nbytes([opt.temp_grad_buffer_for_cpu_offload]),
            "pin_memory": bool(opt.cpu_offload_pin_memory)}


def run_rank(scenario: Scenario) -> dict[str, Any] | None:
    from types import SimpleNamespace

    import deepspeed
    import torch
    from transformers.integrations import HfDeepSpeedConfig

    from measure.deepspeed_run import exported_run

    deepspeed.init_distributed(dist_backend="gloo")  # once per process; again for the next scenario is a no-op
    cfg, script, _ = exported_run(scenario)
    torch.manual_seed(0)
    hf = HfDeepSpeedConfig(cfg)  # noqa: F841 - transformers reads it while from_config runs (zero.Init)
    model = script.build_model(SimpleNamespace(model_config=None))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                            if p.requires_grad], config=cfg)
    t = scenario.training
    ids = torch.randint(0, model.config.vocab_size, (t.micro_batch_size, t.seq_len),
                        generator=torch.Generator().manual_seed(1))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    out = inventory(engine, t.zero_stage) if torch.distributed.get_rank() == 0 else None
    engine.destroy()
    return out


def main() -> int:
    scenarios = [Scenario.model_validate(s) for s in json.loads(Path(sys.argv[1]).read_text())]
    out = [run_rank(sc) for sc in scenarios]
    if out[0] is not None:
        Path(sys.argv[2]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

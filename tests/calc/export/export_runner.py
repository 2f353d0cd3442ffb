"""Runs exported bundles for real, on DeepSpeed's CPU accelerator (gloo): used by tests/calc/export/test_export_run.py.

    torchrun --nproc_per_node N tests/calc/export/export_runner.py CASES.json OUT_DIR

CASES.json is a list of {"name": ..., "scenario": {...}, "steps": k}. For each case every rank writes the
bundle (calc.export.export_bundle), imports the generated train.py, builds the model with its own
build_model (under transformers' zero.Init at ZeRO-3, as after TrainingArguments), passes the exported ds_config
as written to deepspeed.initialize and trains k optimizer steps on the script's RandomTokens. One JSON
line per case goes to OUT_DIR/rank{R}.jsonl: losses, learning rates, the optimizer and scheduler
classes DeepSpeed built, and how the parameters were partitioned. Several cases share one process,
since starting Python + DeepSpeed costs far more than a tiny model's steps.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig  # noqa: E402

from calc.contract.scenario import Scenario  # noqa: E402
from calc.export import export_bundle  # noqa: E402


def load_script(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"train_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def partition(module: torch.nn.Module, threshold: int) -> dict[str, Any]:
    """How ZeRO-3 holds the parameters: DeepSpeed parameters (ds_status), elements in all (ds_numel) and
    on this rank (ds_tensor), and the tensors at or above the persistence threshold that are partitioned
    (NOT_AVAILABLE outside forward/backward, this rank holding ceil(numel / world) elements)."""
    params = list(module.parameters())
    zero3 = [p for p in params if hasattr(p, "ds_status")]
    world = torch.distributed.get_world_size()
    large = [p for p in zero3 if p.ds_numel >= threshold]
    return {"tensors": len(params), "zero3_tensors": len(zero3),
            "total": sum(getattr(p, "ds_numel", p.numel()) for p in params),
            "held": sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params),
            "status": sorted({p.ds_status.name for p in zero3}),
            "not_available": sum(p.ds_status.name == "NOT_AVAILABLE" for p in zero3),
            "large": len(large),
            "large_partitioned": sum(p.ds_status.name == "NOT_AVAILABLE" and p.ds_tensor.numel() == -(-p.ds_numel // world)
                                     for p in large)}


def run_case(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    sc = Scenario.model_validate(case["scenario"])
    files, _ = export_bundle(sc)
    for name, text in files.items():
        (workdir / name).write_text(text)
    script = load_script(workdir / "train.py")
    cfg = json.loads((workdir / "ds_config.json").read_text())
    # what TrainingArguments does: at ZeRO-3, transformers then builds the model under zero.Init
    # (and initialises the weights gathered), so every rank only ever holds its partition
    hf_ds_config = HfDeepSpeedConfig(cfg)
    model = script.build_model(SimpleNamespace(model_config=None))
    threshold = cfg["zero_optimization"].get("stage3_param_persistence_threshold", 0)
    before = partition(model, threshold)
    engine, _, _, scheduler = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg)
    t = sc.training
    data = script.RandomTokens(64, t.seq_len, model.config.vocab_size)
    losses, lrs = [], []
    for i in range(case["steps"] * t.gradient_accumulation_steps):
        ids = torch.stack([data[i * t.micro_batch_size + j]["input_ids"] for j in range(t.micro_batch_size)])
        ids = ids.to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr()[0])
    out = {"name": case["name"], "losses": losses, "lrs": lrs, "finite": all(math.isfinite(x) for x in losses),
           "optimizer": type(engine.basic_optimizer).__name__,
           "foreach": getattr(engine.basic_optimizer, "defaults", {}).get("foreach"),
           "scheduler": type(scheduler).__name__ if scheduler is not None else None,
           "partition_at_init": before, "partition": partition(engine.module, threshold),
           "world": engine.world_size}
    engine.destroy()
    del engine, model, scheduler, hf_ds_config
    gc.collect()
    return out


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ.get("RANK", "0"))
    with open(out_dir / f"rank{rank}.jsonl", "w") as fh, tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            workdir = Path(tmp) / case["name"]
            workdir.mkdir()
            started = time.perf_counter()
            try:
                result = run_case(case, workdir)
            except Exception as exc:  # reported per case, so one failure does not hide the others
                result = {"name": case["name"], "error": f"{type(exc).__name__}: {exc}",
                          "traceback": traceback.format_exc()[-3000:]}
            result["seconds"] = round(time.perf_counter() - started, 2)
            fh.write(json.dumps(result) + "\n")
            fh.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

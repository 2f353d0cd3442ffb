"""DeepSpeed measured with DeepSpeed itself: the exported ds_config (calc.export), real DeepSpeed on its
CPU accelerator (DS_ACCELERATOR=cpu), world size 1-4 over gloo, rank 0 recorded.

    python -m measure SCENARIO.json --device cpu --engine deepspeed [-o FILE]

starts `torchrun --nproc_per_node hardware.num_gpus -m measure.deepspeed_run SCENARIO.json RAW.json`.
Every rank builds the model as the exported train.py does (its build_model, after transformers'
HfDeepSpeedConfig, so ZeRO-3 builds under zero.Init), passes the exported ds_config as written to
deepspeed.initialize and trains `steps` optimizer steps on the same token batch. Rank 0 runs it all
inside torch's MemTracker (live tensor bytes, as the cpu engine), so DeepSpeed's own buffers (flat
16-bit groups, fp32 partitions, reduce buckets, CPU-offload staging) are counted as they are created;
its phases are forward (engine(...)), backward (engine.backward, plus engine.step() on the micro-steps
that only accumulate) and optimizer (engine.step() at the accumulation boundary). Initialisation is not
a phase: the peak is that of the training steps, as for the other engines.

On the CPU accelerator pin_memory is a no-op (nothing page-locked, no power-of-two rounding) and the
"device" is the host, so offloaded buffers are counted in the same total; calc's estimate for a cpu
DeepSpeed record adds them back (see calc.evidence.validate).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from calc.contract.files import append_line
from calc.contract.record import MeasurementRecord, Sharding
from calc.contract.scenario import Mode, Scenario
from measure.runner import measurement_record
from measure.shm_buffers import remove_segments
from measure.workload import UnsupportedError

MAX_WORLD = 4


def check_deepspeed(scenario: Scenario) -> int:
    """The world size, or UnsupportedError saying what DeepSpeed on the CPU cannot run."""
    t = scenario.training
    world = scenario.resolved_hardware().num_gpus
    if scenario.mode != Mode.train:
        raise UnsupportedError("--engine deepspeed measures training (mode=train)")
    if not 1 <= world <= MAX_WORLD:
        raise UnsupportedError(f"--engine deepspeed runs 1 to {MAX_WORLD} ranks on this machine, not {world}")
    if t.precision.uses_fp16:
        raise UnsupportedError("fp16 is not measured: DeepSpeed's CPU accelerator has no fp16 on this CPU")
    if "nvme" in (t.offload_optimizer.value, t.offload_params.value):
        raise UnsupportedError("NVMe offload is not measured (DeepSpeed's async_io op needs libaio)")
    if t.tensor_parallel != 1 or t.pipeline_parallel != 1 or t.lora is not None:
        raise UnsupportedError("--engine deepspeed measures data parallelism without LoRA")
    if t.optimizer.value == "adamw-8bit":
        raise UnsupportedError("adamw-8bit (bitsandbytes) needs CUDA")
    return world


def measure_deepspeed(scenario: Scenario, steps: int) -> dict[str, Any]:
    """Launch the ranks and return rank 0's raw fields (as measure.runner._measure_once)."""
    world = check_deepspeed(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        sc_path, out_path = Path(tmp) / "scenario.json", Path(tmp) / "raw.json"
        sc_path.write_text(scenario.model_dump_json())
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
        port = free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port",
               str(port), "-m", "measure.deepspeed_run", str(sc_path), str(out_path), str(steps)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        finally:
            remove_segments(port)  # DeepSpeed's CPU all-reduce segments outlive the ranks (measure/shm_buffers.py)
        if r.returncode != 0 or not out_path.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UnsupportedError(f"the DeepSpeed run failed: {tail[0]}")
        return json.loads(out_path.read_text())


def measure_deepspeed_record(scenario: Scenario, steps: int = 3, name: str | None = None) -> MeasurementRecord:
    """A MeasurementRecord (engine deepspeed, device cpu) of rank 0 of the exported DeepSpeed run."""
    started = time.perf_counter()
    raw = measure_deepspeed(scenario, steps)
    sharding = Sharding(world_size=check_deepspeed(scenario), zero_stage=scenario.training.zero_stage,
                        process_group="gloo", rank=0)
    return measurement_record(scenario, "cpu", steps, raw, started, name, None, engine="deepspeed", sharding=sharding)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exported_run(scenario: Scenario) -> tuple[dict[str, Any], Any, list]:
    """The scenario's export as a run uses it: the ds_config (a dict), the generated train.py loaded as a module
    (its model builder and dataset are what the measurement trains) and the export's notes."""
    import importlib.util

    from calc.export import export_bundle

    files, notes = export_bundle(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "train.py").write_text(files["train.py"])
        spec = importlib.util.spec_from_file_location("vramcalc_train", Path(tmp) / "train.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    return json.loads(files["ds_config.json"]), script, notes


def _run_rank(scenario: Scenario, steps: int) -> dict[str, Any] | None:
    """One rank's run; rank 0 returns the record fields, the others None."""
    import gc
    from types import SimpleNamespace

    import deepspeed
    import torch
    from transformers.integrations import HfDeepSpeedConfig

    from measure.runner import memtracker_fields
    from measure.trackers import PhaseMemTracker
    from measure.workload import NullTracker

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    cfg, script, notes = exported_run(scenario)
    t = scenario.training
    torch.manual_seed(0)
    mt = PhaseMemTracker() if rank == 0 else NullTracker()
    out: dict[str, Any] = {}
    with mt if rank == 0 else contextlib.nullcontext():
        hf = HfDeepSpeedConfig(cfg)  # noqa: F841 - transformers reads it while from_config runs (zero.Init)
        model = script.build_model(SimpleNamespace(model_config=None))
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                                if p.requires_grad], config=cfg)
        vocab = model.config.get_text_config().vocab_size
        input_ids = torch.randint(0, vocab, (t.micro_batch_size, t.seq_len), generator=torch.Generator().manual_seed(1))
        if t.activation_checkpointing.value != "none":
            engine.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if rank == 0:
            out["initial_allocated_bytes"] = mt.current_total()
        for _ in range(steps):
            for micro in range(t.gradient_accumulation_steps):
                with mt.phase("forward"):
                    loss = engine(input_ids=input_ids, labels=input_ids).loss
                last = micro == t.gradient_accumulation_steps - 1
                with mt.phase("backward"):
                    engine.backward(loss)
                    del loss
                    if not last:
                        engine.step()
                if last:
                    with mt.phase("optimizer"):
                        engine.step()
            mt.step_done()
        if rank == 0:
            out.update(memtracker_fields(mt))
            out["peak_allocated_bytes"] = max(out["phase"].values())
            params = list(engine.module.parameters())
            out["weights_bytes"] = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() if hasattr(p, "ds_tensor")
                                       else p.numel() * p.element_size() for p in params)
            out["num_params"] = sum(getattr(p, "ds_numel", p.numel()) for p in params)
            out["trainable_params"] = sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)
            out["optimizer_state_bytes"] = None
            out["categories"] = None
            out["notes"] = [
                "peak = MemTracker's live tensor bytes on rank 0, DeepSpeed's buffers included (CPU accelerator: "
                "pin_memory is a no-op, offloaded and device buffers share the host)",
                f"DeepSpeed {deepspeed.__version__}, exported ds_config as written; optimizer "
                f"{type(engine.basic_optimizer).__name__} in {type(engine.optimizer).__name__}",
                *notes[:2]]
        engine.destroy()
        del engine, model
    gc.collect()
    return out if rank == 0 else None


# ---- the committed data set (data/measured_deepspeed.jsonl) ---------------------------------------

def tiny_model(kind: str, width: int = 256, layers: int = 4) -> dict[str, Any]:
    """Small models of three families (5 M parameters or so: DeepSpeed's 500 M-element buckets dominate
    every peak at this size, so the non-bucket terms are also reported by calc.evidence.validate per record)."""
    if kind == "gpt2":
        return {"model_type": "gpt2", "n_embd": width, "n_head": 4, "n_layer": layers, "n_positions": 256,
                "n_inner": 4 * width, "vocab_size": 4096}
    cfg = {"model_type": kind, "hidden_size": width, "intermediate_size": width * 11 // 4, "num_hidden_layers": layers,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 512,
           "tie_word_embeddings": kind == "qwen2"}
    return cfg


# (name, model, world, zero stage, precision, offload optimizer, offload params, extra training fields)
SUITE: list[tuple[str, str, int, int, str, str, str, dict[str, Any]]] = [
    ("ds-z0-fp32-w1-llama", "llama", 1, 0, "fp32", "none", "none", {}),
    ("ds-z0-fp32-w2-gpt2", "gpt2", 2, 0, "fp32", "none", "none", {}),
    ("ds-z1-fp32-w2-llama", "llama", 2, 1, "fp32", "none", "none", {}),
    ("ds-z1-bf16-mixed-w1-qwen2", "qwen2", 1, 1, "bf16-mixed", "none", "none", {}),
    ("ds-z1-bf16-mixed-w4-llama", "llama", 4, 1, "bf16-mixed", "none", "none", {}),
    ("ds-z2-bf16-mixed-w2-llama", "llama", 2, 2, "bf16-mixed", "none", "none", {}),
    ("ds-z2-fp32-w2-qwen2", "qwen2", 2, 2, "fp32", "none", "none", {}),
    ("ds-z2-bf16-mixed-offload-w2-gpt2", "gpt2", 2, 2, "bf16-mixed", "cpu", "none", {}),
    ("ds-z2-fp32-offload-w1-llama", "llama", 1, 2, "fp32", "cpu", "none", {}),
    ("ds-z2-bf16-mixed-accum2-w2-qwen2", "qwen2", 2, 2, "bf16-mixed", "none", "none",
     {"gradient_accumulation_steps": 2}),
    ("ds-z3-bf16-mixed-w2-llama", "llama", 2, 3, "bf16-mixed", "none", "none", {}),
    ("ds-z3-bf16-mixed-w1-gpt2", "gpt2", 1, 3, "bf16-mixed", "none", "none", {}),
    ("ds-z3-fp32-w4-qwen2", "qwen2", 4, 3, "fp32", "none", "none", {}),
    ("ds-z3-bf16-mixed-offload-w2-qwen2", "qwen2", 2, 3, "bf16-mixed", "cpu", "none", {}),
    ("ds-z3-bf16-mixed-offload-both-w2-llama", "llama", 2, 3, "bf16-mixed", "cpu", "cpu", {}),
    ("ds-z3-fp32-offload-both-w2-gpt2", "gpt2", 2, 3, "fp32", "cpu", "cpu", {}),
    ("ds-z3-bf16-mixed-ckpt-w2-llama", "llama", 2, 3, "bf16-mixed", "none", "none",
     {"activation_checkpointing": "full"}),
    # fp32 ZeRO-1/2 at world size 1 and 2 (added with the tracker's meta-tensor fix)
    ("ds-z1-fp32-w1-qwen2", "qwen2", 1, 1, "fp32", "none", "none", {}),
    ("ds-z2-fp32-w1-gpt2", "gpt2", 1, 2, "fp32", "none", "none", {}),
    ("ds-z2-fp32-w2-llama", "llama", 2, 2, "fp32", "none", "none", {}),
    ("ds-z1-fp32-w2-gpt2", "gpt2", 2, 1, "fp32", "none", "none", {}),
]

# ZeRO-0 bf16-mixed: DeepSpeed wraps torch's AdamW in FP16_UnfusedOptimizer (measured -8.3 % as probes before
# calc.memory.engine modelled it from fp16/unfused_optimizer.py; now in the data set)
SUITE += [
    ("ds-z0-bf16-mixed-w1-llama", "llama", 1, 0, "bf16-mixed", "none", "none", {}),
    ("ds-z0-bf16-mixed-w2-qwen2", "qwen2", 2, 0, "bf16-mixed", "none", "none", {}),
]
# reduce_bucket_size below the model's size (tied embeddings: measured as held-out checks, then they showed that
# a tied lm_head's gradient reaches the bucket with the embedding's, so they moved here)
SUITE += [
    ("ds-z2-fp32-w1-gpt2-bucket2m", "gpt2", 1, 2, "fp32", "none", "none", {"reduce_bucket_size": 2_000_000}),
    ("ds-z1-fp32-w2-qwen2-bucket3m", "qwen2", 2, 1, "fp32", "none", "none", {"reduce_bucket_size": 3_000_000}),
    ("ds-z1-fp32-w1-qwen2-s16-bucket1m", "qwen2", 1, 1, "fp32", "none", "none",
     {"reduce_bucket_size": 1_000_000, "seq_len": 16, "micro_batch_size": 1}),
]


# Several ranks and a bucket below the model's size: rank 0's gradient partition holds every parameter tensor
# that starts in its range whole and appears at the first reduction holding one of them (stage_1_and_2.py
# copy_grads_in_partition's total_size). Measured as probes while the engine took parameters / N at the first
# reduction (+4.2 % and +11 % in backward, -4.1 % and -7 % at the step); re-measured once that was modelled
# (calc.contract.parallel.zero12_rank0_partition) and moved here.
SUITE += [
    ("ds-z2-fp32-w4-llama-6l-bucket1500k", "llama", 4, 2, "fp32", "none", "none",
     {"layers": 6, "reduce_bucket_size": 1_500_000}),
    ("ds-z2-fp32-w3-gpt2-s16-bucket700k", "gpt2", 3, 2, "fp32", "none", "none",
     {"reduce_bucket_size": 700_000, "seq_len": 16, "micro_batch_size": 1}),
]


# Held out: measured after the engine's DeepSpeed terms were settled on SUITE, and not used to change
# them (other widths and depths, world size 3, Mistral, pure bf16, amp-bf16 via torch_autocast).
HELDOUT: list[tuple[str, str, int, int, str, str, str, dict[str, Any]]] = [
    ("ds-heldout-z3-bf16-mixed-w3-mistral-384", "mistral", 3, 3, "bf16-mixed", "none", "none", {"width": 384}),
    ("ds-heldout-z2-bf16-mixed-w4-gpt2-6l", "gpt2", 4, 2, "bf16-mixed", "none", "none", {"layers": 6}),
    ("ds-heldout-z1-bf16-mixed-offload-w2-mistral", "mistral", 2, 1, "bf16-mixed", "cpu", "none", {}),
    ("ds-heldout-z3-fp32-offload-w3-llama-320", "llama", 3, 3, "fp32", "cpu", "none", {"width": 320}),
    ("ds-heldout-z2-bf16-mixed-ckpt-w2-qwen2", "qwen2", 2, 2, "bf16-mixed", "none", "none",
     {"activation_checkpointing": "full"}),
    ("ds-heldout-z2-bf16-w2-llama", "llama", 2, 2, "bf16", "none", "none", {}),
    ("ds-heldout-z3-amp-bf16-w2-llama", "llama", 2, 3, "amp-bf16", "none", "none", {}),
    ("ds-heldout-z0-fp32-w3-mistral", "mistral", 3, 0, "fp32", "none", "none", {"micro_batch_size": 4}),
    # after the meta-tensor fix: fp32 ZeRO-1/2 on other families, shapes and world sizes
    ("ds-heldout-z2-fp32-w3-mistral-320", "mistral", 3, 2, "fp32", "none", "none", {"width": 320}),
    ("ds-heldout-z1-fp32-w4-gpt2-6l", "gpt2", 4, 1, "fp32", "none", "none", {"layers": 6}),
    # after ZeRO-1/2's gradient timing was modelled: reduce_bucket_size below the model's size, so the first
    # bucket reduction (and the partition) comes in the middle of backward and the buckets no longer dominate
    ("ds-heldout-z2-bf16-mixed-w2-llama-bucket1m", "llama", 2, 2, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 1_000_000}),
    ("ds-heldout-z1-bf16-mixed-w4-llama-bucket500k", "llama", 4, 1, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 500_000}),
    ("ds-heldout-z2-bf16-mixed-offload-w2-mistral-bucket1m", "mistral", 2, 2, "bf16-mixed", "cpu", "none",
     {"reduce_bucket_size": 1_000_000}),
    ("ds-heldout-z2-bf16-mixed-w3-qwen2-320-bucket4m", "qwen2", 3, 2, "bf16-mixed", "none", "none",
     {"width": 320, "reduce_bucket_size": 4_000_000}),
    ("ds-heldout-z1-bf16-mixed-offload-w1-gpt2-bucket2m", "gpt2", 1, 1, "bf16-mixed", "cpu", "none",
     {"reduce_bucket_size": 2_000_000}),
    ("ds-heldout-z3-bf16-mixed-w2-llama-bucket1m", "llama", 2, 3, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 1_000_000}),
    # 16-token batches: the activations are small, so the backward peak is where the partition and buckets are
    ("ds-heldout-z2-bf16-mixed-w2-llama-s16-bucket2m", "llama", 2, 2, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 2_000_000, "seq_len": 16, "micro_batch_size": 1}),
    # after rank 0's whole-tensor partition was modelled (calc.contract.parallel.zero12_rank0_partition): buckets below
    # the model's size at 2-4 ranks, other families, widths and depths, tied and untied embeddings (some larger
    # than the bucket), 16-token batches, accumulation, checkpointing, and offload (which keeps no partition)
    ("ds-heldout-z2-bf16-mixed-w3-llama-s16-bucket800k", "llama", 3, 2, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 800_000, "seq_len": 16, "micro_batch_size": 1}),
    ("ds-heldout-z1-fp32-w4-qwen2-6l-bucket1m", "qwen2", 4, 1, "fp32", "none", "none",
     {"layers": 6, "reduce_bucket_size": 1_000_000}),
    ("ds-heldout-z2-fp32-w2-mistral-320-s16-bucket600k", "mistral", 2, 2, "fp32", "none", "none",
     {"width": 320, "reduce_bucket_size": 600_000, "seq_len": 16, "micro_batch_size": 1}),
    ("ds-heldout-z2-bf16-mixed-w4-gpt2-s16-bucket1500k", "gpt2", 4, 2, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 1_500_000, "seq_len": 16, "micro_batch_size": 1}),
    ("ds-heldout-z1-bf16-mixed-w3-mistral-s16-bucket2m", "mistral", 3, 1, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 2_000_000, "seq_len": 16, "micro_batch_size": 1}),
    ("ds-heldout-z2-fp32-w2-llama-accum2-s16-bucket1m", "llama", 2, 2, "fp32", "none", "none",
     {"reduce_bucket_size": 1_000_000, "gradient_accumulation_steps": 2, "seq_len": 16, "micro_batch_size": 1}),
    ("ds-heldout-z2-bf16-mixed-ckpt-w4-llama-bucket1m", "llama", 4, 2, "bf16-mixed", "none", "none",
     {"reduce_bucket_size": 1_000_000, "activation_checkpointing": "full"}),
    ("ds-heldout-z1-fp32-w3-gpt2-6l-bucket3m", "gpt2", 3, 1, "fp32", "none", "none",
     {"layers": 6, "reduce_bucket_size": 3_000_000}),
    ("ds-heldout-z2-bf16-mixed-offload-w3-qwen2-bucket1m", "qwen2", 3, 2, "bf16-mixed", "cpu", "none",
     {"reduce_bucket_size": 1_000_000}),
]


def suite_scenarios(entries: list | None = None) -> list[tuple[str, Scenario]]:
    out = []
    for name, kind, world, stage, prec, oo, op, extra in SUITE if entries is None else entries:
        extra = dict(extra)
        shape = {k: extra.pop(k) for k in ("width", "layers") if k in extra}
        training = {"zero_stage": stage, "precision": prec, "offload_optimizer": oo, "offload_params": op,
                    "micro_batch_size": 2, "seq_len": 128, **extra}
        out.append((name, Scenario.model_validate({"model": tiny_model(kind, **shape),
                                                   "hardware": {"gpu": "a100-80gb", "num_gpus": world},
                                                   "training": training})))
    return out


def run_suite(output: str, only: list[str] | None = None, heldout: bool = False) -> int:
    """python -m measure.deepspeed_run --suite data/measured_deepspeed.jsonl [NAME ...]
    (--heldout-suite data/measured_deepspeed_heldout.jsonl for the held-out entries)"""
    for name, sc in suite_scenarios(HELDOUT if heldout else None):
        if only and name not in only:
            continue
        rec = measure_deepspeed_record(sc, 3, name)
        append_line(output, rec.to_json_line())
        print(f"{name}: {rec.peak_allocated_bytes:,} B ({rec.wall_seconds:.0f} s)", flush=True)
    return 0


def main() -> int:
    if sys.argv[1] in ("--suite", "--heldout-suite"):
        return run_suite(sys.argv[2], sys.argv[3:], heldout=sys.argv[1] == "--heldout-suite")
    scenario = Scenario.model_validate_json(Path(sys.argv[1]).read_text())
    steps = int(sys.argv[3])
    started = time.perf_counter()
    raw = _run_rank(scenario, steps)
    if raw is not None:
        raw["wall_seconds"] = round(time.perf_counter() - started, 3)
        Path(sys.argv[2]).write_text(json.dumps(raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

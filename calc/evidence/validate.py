"""Predicted vs measured: the accuracy report behind `python -m calc validate` and the app's
Validation page. Records are calc.contract.record.MeasurementRecord (JSON lines under data/).

Each record is predicted with the kernels it ran on: cuda records against the CUDA model,
cpu and fake (FakeTensorMode on the CPU) records against the CPU kernels' variant of the same
model (calc.memory.engine.estimate target="cpu": dropout noise tensors, CPU SDPA layouts, no cuBLAS
workspace inside the peak).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.i18n import N_
from calc.contract.record import MeasurementRecord, load_records
from calc.contract.scenario import Mode
from calc.memory.engine import estimate

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


class Case(BaseModel):
    """One record compared with its prediction."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device: str
    engine: str
    framework: str  # scenario.training.framework: whose model code and loop the run used
    family: str
    precision: str
    checkpointing: str
    attention: str
    optimizer: str
    mode: str
    sharding: str
    measured_bytes: int
    predicted_bytes: int
    error_pct: float
    measured_phase: str
    predicted_phase: str
    component_errors_pct: dict[str, float]
    workload: list[str] = []  # the regimes this run exercises (see workload_tags)


class GroupStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str
    value: str
    count: int
    median_abs_error_pct: float
    worst_abs_error_pct: float


class WorkspaceCheck(BaseModel):
    """The cuBLAS workspaces the engine adds on a GPU, against the GPU records' baselines (the warm-up runs GEMMs on
    the main thread and in backward, so two workspaces exist before every record's model is built)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_name: str
    records: int
    modelled_bytes: int  # two handles of the GPU's architecture
    min_baseline_bytes: int
    max_baseline_bytes: int


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cases: list[Case]
    median_abs_error_pct: float
    worst_abs_error_pct: float
    groups: list[GroupStats]
    workspaces: list[WorkspaceCheck] = []  # GPU records only


# Behaviour the engine models from a library's source, with no committed measurement behind it yet
# (the README's accuracy section and the Validation page list these).
MODELLED_FROM_SOURCE: tuple[tuple[str, str], ...] = (
    (N_("Liger fused linear cross-entropy (training.cross_entropy = liger-fused)"),
     N_("linkedin/Liger-Kernel ops/fused_linear_cross_entropy.py: chunked logits, gradients in forward; needs "
     "Triton on a GPU, so no CPU or fake run exists")),
    (N_("CUDA-only terms beyond the cuBLAS workspaces: flash-attention workspaces, 1-byte dropout masks"),
     N_("PyTorch's kernels' source; the GPU runs (one H200) bear out the cuBLAS workspaces (two of 32 MiB) and the "
        "512-byte block rounding; what they show beyond the estimate is listed with the GPU runs' gaps")),
    (N_("DeepSpeed: pinned host buffers on CUDA, host RAM to load the model, fp16, NVMe offload"),
     N_("DeepSpeed's source; ZeRO 0-3 and CPU offload are measured with DeepSpeed itself on its CPU accelerator "
     "(data/measured_deepspeed*.jsonl; DEEPSPEED_BEHAVIOURS below)")),
    (N_("bitsandbytes paged optimizers on CUDA (paged-adamw, paged-adamw-8bit)"),
     N_("bitsandbytes optim/optimizer.py get_state_buffer: the states of tensors of 100,000 elements or more in CUDA "
     "managed memory, outside peak allocated and inside the device total; their bytes are measured on CPU, where "
     "bitsandbytes keeps them in ordinary tensors")),
    (N_("bitsandbytes quantized bases on CUDA"),
     N_("the storage, the dequantized weights and int8's saved inputs are measured with bitsandbytes on CPU; its CUDA "
     "kernels' own workspaces are not")),
    (N_("Quantized inference weights (inference.weights int8 / nf4 / fp4 / gptq-int4 / gptq-int8 / awq-int4 / "
        "fp8 / mxfp4)"),
     N_("bitsandbytes' stored bytes are checked against models bitsandbytes quantized on the CPU; its matmuls' "
        "transients (the 4-bit weight dequantized before a matmul, int8's quantized input and int32 product), "
        "GPTQ's and AWQ's packed tensors, FineGrainedFP8's weight and block scales and MXFP4's experts are "
        "modelled from the libraries' source: their kernels need CUDA")),
    (N_("Gemma 2 generation"),
     N_("its KV cache is counted at full length on every layer, an upper bound: transformers keeps only the "
        "window on its sliding layers")),
)

# Per model family: what the committed records measure (CPU: small configs, real tensors; fake: full-size
# presets under FakeTensorMode, the deep ones extrapolated from 3-5 layers) and what rests on source alone.
# Shown by the Validation page and the README's accuracy section.
FAMILY_EVIDENCE: tuple[tuple[str, str, str], ...] = (
    ("llama, mistral, qwen2, qwen3, phi3, gpt2, gpt_neox",
     N_("CPU (every precision, eager / SDPA, checkpointing, keep_outputs, LoRA, inference) and fake 0.5B-405B presets"),
     N_("CUDA-only terms (below)")),
    ("gemma2, gemma3_text",
     N_("CPU and fake (Gemma 2 2B-27B eager; Gemma 3 1B-27B local / global layers, LoRA)"), N_("CUDA-only terms")),
    ("mixtral, qwen3_moe",
     N_("CPU (grouped_mm experts; FSDP2 with and without expert parallelism, full checkpointing) and fake "
     "(Mixtral 8x7B, Qwen3 30B-A3B / 235B-A22B, LoRA on attention)"),
     N_("LoRA all-linear is refused: peft 0.21 puts adapters on the routed experts' 3-D weights and the router")),
    ("glm4_moe",
     N_("CPU (dense + MoE layers, shared expert, LoRA on attention; FSDP2 with and without expert parallelism, "
     "full checkpointing) and fake (GLM-4.5 92 layers, GLM-4.5-Air)"),
     N_("LoRA all-linear refused (as for mixtral)")),
    ("deepseek_v3, deepseek_v2",
     N_("CPU (MLA with and without the q bottleneck, LoRA on q_a / q_b / kv_a / kv_b / o; DeepSeek-V3 under FSDP2 "
     "with and without expert parallelism, full checkpointing) and fake (671B, V2-Lite)"),
     N_("LoRA all-linear refused (as for mixtral)")),
    ("gpt_oss", N_("CPU and fake (20B, 120B; eager attention with sinks)"), N_("CUDA-only terms")),
    ("llama4_text",
     N_("CPU (chunked attention past the chunk, NoPE layers, amp, eager, checkpointing, LoRA on attention, "
     "inference) and fake (Llama 4 Scout, 8k tokens, LoRA on attention)"),
     N_("LoRA all-linear refused: peft wraps the router (an nn.Linear returning a tuple) and the forward fails")),
    (N_("every family above"),
     N_("GPU: one H200, the small configs of every family and 0.5B-8B presets (Llama, Qwen2, Mistral, Gemma 2, "
        "Phi-3, GPT-NeoX, GPT-2)"),
     N_("what the GPU runs show beyond the estimate is listed with the GPU runs' gaps")),
)

# What the GPU records (data/measured_cuda.jsonl, one H200) show that the engine does not model yet: each gap
# with the records it is seen in and what is known of its cause. The Validation page and docs/accuracy.md list them.
GPU_GAPS: tuple[tuple[str, str], ...] = (
    (N_("Generation with a static KV cache on a GPU: 60-120 MiB above the estimate on small models"),
     N_("transformers' generate compiles the decoding forward when the cache is static and the device is CUDA "
        "(generation/utils.py _valid_auto_compile_criteria; CompileConfig mode reduce-overhead), so CUDA graphs and "
        "their memory pool join the step; the estimate does not model torch.compile yet")),
    (N_("fp32 eager attention, and fp32 SDPA under activation checkpointing, on a GPU: one more fp32 batch x heads "
        "x seq x seq tensor at the backward peak (8-16 MiB on the small models measured, 4-15 %)"),
     N_("not seen on the CPU, where the same runs are exact; cause not established (a CUDA kernel's output or "
        "the autograd engine's gradient buffers in the softmax backward)")),
    (N_("GPT-2 and GPT-NeoX with dropout or LoRA at 16 bits, and small models' generation, on a GPU: 1-3 MiB above "
        "the estimate (2-27 % of models of a few MiB)"),
     N_("CUDA kernels' own allocations that only tiny models make visible; not seen at full size")),
    (N_("amp-fp16 at full size (Pythia 1.4B, 8 x 2048): 2.8 % above the estimate in forward"),
     N_("cause not established; amp-bf16 presets of the same size are within 1 %")),
)


# A GPU case of at least this many measured bytes (above its baseline) is a full-size preset, the scale users run:
# the Validation page, docs/accuracy.md and the accuracy tests quote those apart from the few-MiB small models.
FULL_SIZE_BYTES = 2**30


def is_full_size_gpu(case: Case) -> bool:
    return case.device == "cuda" and case.measured_bytes >= FULL_SIZE_BYTES


def gpu_summary(cases: list[Case]) -> tuple[int, float, float, float] | None:
    """(records, median |error| %, worst |error| %, worst |error| % of the full-size presets) of the GPU cases;
    None without any."""
    errs = [abs(c.error_pct) for c in cases if c.device == "cuda"]
    if not errs:
        return None
    presets = [abs(c.error_pct) for c in cases if is_full_size_gpu(c)]
    return len(errs), statistics.median(errs), max(errs), max(presets, default=0.0)


# What of DeepSpeed's memory is checked against DeepSpeed itself (data/measured_deepspeed.jsonl, engine
# "deepspeed": real DeepSpeed 0.19 on its CPU accelerator, 1-4 ranks over gloo, rank 0 under MemTracker;
# tests/calc/export/test_export_run.py) and what rests on its source alone. Shown by the Validation page and README.
DEEPSPEED_BEHAVIOURS: tuple[tuple[str, str], ...] = (
    (N_("ZeRO 0-3 partitioning of weights, gradients, fp32 master weights and Adam states; the master clone "
     "ZeRO 1-3 keep even for fp32 models; ZeRO-3's flat gradient-partition buffer"), N_("measured (CPU)")),
    (N_("ZeRO-1/2 gradients in backward: each copied into the reduce bucket as it is produced "
     "(contiguous_gradients), the rank's partition (grads_in_partition, in the gradients' dtype: the export "
     "leaves grad_accum_dtype unset) allocated whole at the first bucket reduction; ZeRO-1 with overlap_comm "
     "keeps only the partition too; before the step the partition is flattened and cast to fp32 "
     "(stage_1_and_2.py copy_grads_in_partition, step)"), N_("measured (CPU)")),
    (N_("reduce buckets: two of reduce_bucket_size at ZeRO-1/2 (overlap_comm), allocated at the first gradient "
     "hook and freed at the end of backward; one at ZeRO-3 (contiguous_gradients) from initialisation on; per "
     "communication dtype (amp-*: fp32 and the autocast dtype)"), N_("measured (CPU)")),
    (N_("ZeRO-1/2 with reduce_bucket_size below the model's size: the partition appears mid-backward (tied "
     "embeddings: the lm_head's gradient joins the bucket with the embedding's)"), N_("measured (CPU: 5 runs, 16 held out)")),
    (N_("ZeRO-1/2 on several ranks: rank 0's grads_in_partition holds every parameter that starts in its range "
     "whole, in the model's parameter order (the export leaves round_robin_gradients off), from the first "
     "reduction holding one of them; before the step each of its gradients is copied to fp64 for the gradient "
     "norm (stage_1_and_2.py get_partition_info, copy_grads_in_partition, get_grad_norm_direct)"),
     N_("measured (CPU: 2 runs, 8 held out)")),
    (N_("ZeRO-3 gathered parameters and prefetch (capped by the model size)"), N_("measured (CPU, small models)")),
    (N_("CPU optimizer / parameter offload: DeepSpeedCPUAdam states, fp32 master and gradient partitions, "
     "16-bit staging copies"), N_("measured (CPU accelerator: the host is the device)")),
    (N_("which optimizer runs (FusedAdam / torch AdamW via torch_adam / DeepSpeedCPUAdam) and ZeRO-3's "
     "zero.Init partitioning"), N_("measured (tests/calc/export/test_export_run.py)")),
    (N_("CPU accelerator vs CUDA: the CPU is a synchronized device (resolves_data_dependency), so overlap_comm's "
     "reduction stream and the stream waits do nothing there; on CUDA the reduction overlaps backward on a side "
     "stream, allocating the same buffers"), N_("buffers measured on the CPU; CUDA's stream timing not modelled")),
    (N_("pinned host buffers rounded up to a power of two by PyTorch's CUDA host allocator"),
     N_("modelled from source (CUDA only; the CPU accelerator pins nothing)")),
    (N_("host RAM to load the model (whole model per process below ZeRO-3, one tensor under zero.Init)"),
     N_("modelled from source")),
    (N_("ZeRO-0 with a 16-bit model (sharding deepspeed): torch's AdamW is wrapped in FP16_UnfusedOptimizer, which "
     "casts each 16-bit grad to an fp32 .grad and frees neither before the step (2 B/param more than plain "
     "PyTorch, sharding torch; fp16/unfused_optimizer.py step)"), N_("measured (CPU, bf16-mixed)")),
    (N_("ZeRO-0 with FusedAdam: FP16_Optimizer casts the 16-bit grads to fp32 copies and flattens them before the "
     "step, then frees the 16-bit ones (fp16/fused_optimizer.py step)"), N_("modelled from source (CUDA only)")),
    (N_("fp16 loss scaling, NVMe offload (ZeRO-Infinity)"), N_("modelled from source; not runnable on this CPU")),
)

GROUP_KEYS = ("framework", "family", "precision", "checkpointing", "attention", "mode", "sharding", "device",
              "workload", "engine")


def workload_tags(sc, engine: str = "") -> list[str]:
    """Regimes a record exercises, each reported as its own group: attention masks kept by
    checkpointing, sliding windows at or past the window, expert parallelism, a MoE model sharded by FSDP2
    without it, how the loop holds the outputs, the optimizer stepped in the gradient hooks."""
    t = sc.training
    tags = []
    if t.attention.value == "eager" and t.activation_checkpointing.value != "none":
        tags.append("eager+checkpointing")
    window = sc.spec.sliding_window
    if window is not None and t.seq_len >= window:
        tags.append(f"window reached ({t.attention.value})")
    if t.expert_parallel > 1:
        tags.append("expert parallel")
    elif engine == "fsdp2" and sc.spec.moe:
        tags.append("MoE under FSDP2, no expert parallel")
    if t.lora is not None and t.lora.quantized:
        tags.append(f"bitsandbytes {t.lora.base_weights} base")
    if sc.mode == Mode.train:
        tags.append(f"keep_outputs {str(getattr(t, 'keep_outputs', False)).lower()}")
        if t.optimizer_in_backward:
            tags.append("optimizer in backward")
    return tags


def default_data_files() -> list[Path]:
    return sorted(DATA_DIR.glob("*.jsonl"))


def load_all(paths: Iterable[str | Path] | None = None) -> list[MeasurementRecord]:
    records: list[MeasurementRecord] = []
    for p in (paths or default_data_files()):
        records.extend(load_records(p))
    return records


def compare(rec: MeasurementRecord, index: int = 0) -> Case:
    """Predict one record's scenario and compare peak and, where measured, the model states."""
    sc = rec.scenario
    target = "cuda" if rec.device == "cuda" else "cpu"
    est = estimate(rec.run_scenario(), target=target, sharding="fsdp2" if rec.engine == "fsdp2" else None)
    meas, pred = _compared_peaks(rec, est)
    comp: dict[str, float] = {}
    cats = rec.categories_at_peak_bytes
    if cats is not None and sc.mode == Mode.train and est.peak_phase == "optimizer" == rec.peak_phase:
        pairs = [("parameters", cats.parameters, est.breakdown.parameters),
                 ("gradients", cats.gradients, est.breakdown.gradients)]
        if not sc.training.precision.is_mixed:  # MemTracker's OPT = states + what step() allocates
            opt = sum(c.bytes for c in est.components
                      if c.category == "optimizer_states" or c.key == "optimizer_temporaries")
            pairs.append(("optimizer", cats.optimizer_states, opt))
        for key, m, p in pairs:
            if m:
                comp[key] = round(100.0 * (p - m) / m, 3)
    t = sc.training
    sharding = "none" if rec.sharding is None else f"zero{rec.sharding.zero_stage}x{rec.sharding.world_size}"
    return Case(
        name=rec.name or f"record {index}", device=rec.device, engine=rec.engine, framework=t.framework,
        family=sc.spec.family,
        precision=t.precision.value, checkpointing=_ckpt_label(t), attention=t.attention.value,
        optimizer=t.optimizer.value, mode=sc.mode.value, sharding=sharding,
        measured_bytes=meas, predicted_bytes=pred, error_pct=round(100.0 * (pred - meas) / meas, 4),
        measured_phase=rec.peak_phase, predicted_phase="forward" if est.peak_phase in ("loss", "inference")
        else est.peak_phase, component_errors_pct=comp, workload=workload_tags(sc, rec.engine),
    )


def _compared_peaks(rec: MeasurementRecord, est) -> tuple[int, int]:
    """The measured and predicted peaks compared. A GPU record's figures include what its warm-up allocated before
    the model (both autograd threads' cuBLAS workspaces, and whatever earlier runs of the same process left), so
    there the step above that baseline is compared with the estimate less its cuBLAS workspaces; the workspaces
    themselves are checked against the baselines by `workspace_check`."""
    if rec.device != "cuda" or rec.baseline_allocated_bytes is None:
        return rec.peak_allocated_bytes, est.peak_allocated_bytes
    return rec.peak_allocated_bytes - rec.baseline_allocated_bytes, est.peak_allocated_bytes - _workspace_bytes(est)


def _workspace_bytes(est) -> int:
    return sum(c.bytes for c in est.components if c.key == "cublas_workspace")


def workspace_check(records: list[MeasurementRecord]) -> list[WorkspaceCheck]:
    """One row per GPU the records ran on: the modelled workspaces (two handles, for the architecture of the GPU
    preset named like the device) beside the smallest and largest measured baseline."""
    from calc.contract.presets import gpu_presets
    from calc.memory.overhead import cublas_workspace_bytes

    rows = []
    by_device: dict[str, list[int]] = {}
    for r in records:
        if r.device == "cuda" and r.baseline_allocated_bytes is not None and r.env.device_name:
            by_device.setdefault(r.env.device_name, []).append(r.baseline_allocated_bytes)
    for name, baselines in sorted(by_device.items()):
        archs = {g.architecture for g in gpu_presets().values() if g.name.startswith(name)}
        arch = archs.pop() if len(archs) == 1 else None
        rows.append(WorkspaceCheck(device_name=name, records=len(baselines),
                                   modelled_bytes=cublas_workspace_bytes(arch, training=True),
                                   min_baseline_bytes=min(baselines), max_baseline_bytes=max(baselines)))
    return rows


def _ckpt_label(t) -> str:
    c = t.activation_checkpointing.value
    return f"full/{t.checkpoint_every}" if c == "full" and t.checkpoint_every > 1 else c


def report(records: list[MeasurementRecord]) -> Report:
    cases = [compare(r, i) for i, r in enumerate(records)]
    errs = [abs(c.error_pct) for c in cases]
    groups = []
    for key in GROUP_KEYS:
        values: dict[str, list[float]] = {}
        for c in cases:
            for v in (c.workload if key == "workload" else [str(getattr(c, key))]):
                values.setdefault(v, []).append(abs(c.error_pct))
        for v, e in sorted(values.items()):
            groups.append(GroupStats(group=key, value=v, count=len(e), median_abs_error_pct=statistics.median(e),
                                     worst_abs_error_pct=max(e)))
    return Report(cases=cases, median_abs_error_pct=statistics.median(errs) if errs else 0.0,
                  worst_abs_error_pct=max(errs, default=0.0), groups=groups, workspaces=workspace_check(records))


class RunCounts(BaseModel):
    """Where the committed runs were measured: the Validation page's headline says it before any error figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    torch_cpu: int = Field(description="PyTorch on the CPU, real tensors (MemTracker's live-tensor peak)")
    deepspeed_cpu: int = Field(description="DeepSpeed ZeRO on its CPU accelerator, several processes")
    fake: int = Field(description="full-size presets under FakeTensorMode: shapes and bytes, no real memory")
    gpu: int = Field(description="a GPU (torch.cuda.max_memory_allocated)")

    @property
    def total(self) -> int:
        return self.torch_cpu + self.deepspeed_cpu + self.fake + self.gpu


def run_counts(cases: list[Case]) -> RunCounts:
    """How many of `cases` ran on the CPU with PyTorch, with DeepSpeed on the CPU, with fake tensors, on a GPU."""
    gpu = sum(c.device not in ("cpu", "fake") for c in cases)
    fake = sum(c.device == "fake" for c in cases)
    deepspeed = sum(c.device == "cpu" and c.sharding != "none" for c in cases)
    return RunCounts(torch_cpu=len(cases) - gpu - fake - deepspeed, deepspeed_cpu=deepspeed, fake=fake, gpu=gpu)

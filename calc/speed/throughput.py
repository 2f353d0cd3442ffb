"""What the speed model answers: `SpeedEstimate` (the step time, tokens/s, MFU and every term, as shown), made by
`estimate_speed`; and the upper bounds of tokens/s the recommender ranks by before it evaluates a split."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.scenario import Scenario
from calc.speed.assumptions import SpeedAssumptions
from calc.speed.hardware import SpeedHardware, hardware_of
from calc.speed.step import StepTime, step_time


class SpeedTerm(BaseModel):
    """One term of the step time, with its formula (this scenario's numbers) and source."""

    model_config = ConfigDict(extra="forbid")

    key: str
    group: Literal["compute", "communication", "offload"]
    label: str
    seconds: float = Field(description="time this term adds to the step (exposed part only)")
    total_seconds: float = Field(description="time of the work before any overlap")
    formula: str
    source: str


class SpeedEstimate(BaseModel):
    """Estimated time of one optimizer step (all micro-batches) and the resulting throughput."""

    model_config = ConfigDict(extra="forbid")

    compute_s: float = Field(description="matmul compute incl. recomputation, pipeline bubble, eager/dequant traffic")
    communication_s: float = Field(description="exposed communication, after overlap with compute")
    communication_total_s: float = Field(description="all communication before overlap")
    offload_s: float = Field(description="PCIe transfers, CPU Adam and NVMe traffic of ZeRO-Offload/Infinity")
    step_s: float
    tokens_per_step: int = Field(description="global batch: micro x accumulation x data parallel x seq_len")
    tokens_per_s: float = Field(description="whole job")
    tokens_per_s_per_gpu: float
    model_flops_per_token: float = Field(description="6N + 12 L S d_attn (training) or 2N + 4 L S d_attn")
    executed_flops_per_token: float = Field(description="model FLOPs + recomputation")
    peak_tflops: float = Field(description="dense peak of the GPU for the compute dtype")
    mfu_assumed: float
    mfu_model: float = Field(description="model FLOPs utilisation implied by step_s (PaLM's definition)")
    bottleneck: Literal["compute", "communication", "offload"]
    interconnect: str = Field(description="link that carries the data-parallel collectives")
    terms: list[SpeedTerm]
    notes: list[str] = Field(default_factory=list)


def estimate_speed(sc: Scenario, assumptions: SpeedAssumptions | None = None) -> SpeedEstimate:
    """Step time and tokens/s per GPU for `sc`, with every term shown."""
    a = assumptions or SpeedAssumptions()
    hw = hardware_of(sc)
    raw = step_time(sc.spec, sc.training, hw, sc.mode, a)
    return to_estimate(raw, hw, a)


def to_estimate(raw: StepTime, hw: SpeedHardware, a: SpeedAssumptions) -> SpeedEstimate:
    """A step time as shown: per GPU, with its bottleneck and what dominates it said in notes."""
    groups = {"compute": raw.compute_s, "communication": raw.communication_s, "offload": raw.offload_s}
    bottleneck = max(groups, key=groups.__getitem__)
    notes = list(raw.notes)
    if raw.offload_s > 0.5 * raw.step_s:
        notes.append(f"offload dominates the step: {raw.offload_s / raw.step_s:.0%} of {raw.step_s:.3g} s")
    if raw.communication_s > 0.5 * raw.step_s:
        notes.append(f"exposed communication dominates the step: {raw.communication_s / raw.step_s:.0%}")
    per_gpu = raw.tokens_per_s / hw.num_gpus
    return SpeedEstimate(
        compute_s=raw.compute_s, communication_s=raw.communication_s,
        communication_total_s=raw.communication_total_s, offload_s=raw.offload_s, step_s=raw.step_s,
        tokens_per_step=raw.tokens_per_step, tokens_per_s=raw.tokens_per_s, tokens_per_s_per_gpu=per_gpu,
        model_flops_per_token=raw.model_flops_per_token, executed_flops_per_token=raw.executed_flops_per_token,
        peak_tflops=raw.peak_flops_per_s / 1e12, mfu_assumed=a.mfu,
        mfu_model=raw.model_flops_per_token * per_gpu / raw.peak_flops_per_s if raw.peak_flops_per_s else 0.0,
        bottleneck=bottleneck, interconnect=raw.interconnect,
        terms=[SpeedTerm(key=x.key, group=x.group, label=x.label, seconds=x.seconds, total_seconds=x.total_seconds,
                         formula=x.formula, source=x.source) for x in raw.terms],
        notes=notes,
    )


def compute_rate_bound(raw: StepTime, gpus: int, a: SpeedAssumptions) -> float:
    """Tokens/s that `gpus` GPUs (dp x tp x pp) reach on the executed FLOPs alone: step_time's compute term
    (executed FLOPs per token x tokens / (tp x pp) / (peak x MFU)) inverted. Every other term (pipeline bubble,
    eager attention, dequantisation, exposed communication, offload) only adds time, and the FLOPs per token
    do not depend on the micro-batch split, so this bounds `raw`'s tokens_per_s at every split of the same
    tokens per replica from above (with a relative 1e-9 for rounding)."""
    return gpus * raw.peak_flops_per_s * a.mfu / raw.executed_flops_per_token * (1 + 1e-9)


# Terms whose seconds are the same at every micro-batch split of the same sequences per replica in training: what
# is proportional to micro-batch x accumulation steps (the compute, eager attention's S x S traffic, the tensor-
# parallel all-reduces and the pipeline's sends, each B x S x H per micro-batch) and what happens once per optimizer
# step (the CPU Adam step and the optimizer states' NVMe traffic). The other terms depend on the split; all are >= 0.
SPLIT_FREE_TERMS = frozenset({"compute", "eager_attention", "tp_comm", "pp_comm", "cpu_adam", "nvme_optimizer"})


def split_rate_bound(raw: StepTime, gpus: int, a: SpeedAssumptions, training: bool) -> float:
    """An upper bound of the tokens/s of every micro-batch split of `raw`'s sequences per replica, at least as
    tight as compute_rate_bound: in training, the tokens per step over the seconds of the terms that do not depend
    on the split (with a relative 1e-9 for rounding); in inference (one micro-batch of varying size) the
    compute-bound rate."""
    rate = compute_rate_bound(raw, gpus, a)
    if not training:
        return rate
    fixed = sum(x.seconds for x in raw.terms if x.key in SPLIT_FREE_TERMS)
    return min(rate, raw.tokens_per_step / fixed * (1 + 1e-9)) if fixed > 0 else rate


"""The "what to turn on next" waterfall: optimizations turned on one at a time, cheapest first, each
with its memory (and why, when a step needs more), its verdict and its speed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from calc.contract.i18n import N_
from calc.contract.presets import gpu_presets
from calc.contract.scenario import Attention, Checkpointing, Offload, Optimizer, OptimizerImpl, Precision, Scenario
from calc.memory.engine import estimate
from calc.memory.result import CATEGORIES, Estimate
from calc.memory.verdict import Verdict, gib_short
from calc.memory.why import MIXED_ABOVE_AMP
from calc.recommend.models import DEFAULT_SAFETY_MARGIN, default_lora, usable_bytes
from calc.recommend.phrase import T_, Phrase, joined
from calc.speed import SpeedAssumptions, hardware_of, step_time, to_estimate

CATEGORY_SHORT = {"parameters": N_("weights"), "gradients": N_("gradients"), "optimizer_states": N_("optimizer states"),
                  "activations": N_("activations"), "other": N_("transients")}

class WaterfallStep(BaseModel):
    """The scenario after turning on one more optimization, cumulatively."""

    model_config = ConfigDict(extra="forbid")

    step: int
    name: Phrase
    change: Phrase = Field(description="what this step turns on")
    scenario: Scenario
    method_change: bool
    peak_allocated_bytes: int
    device_total_expected_bytes: int
    device_total_high_bytes: int
    cpu_ram_bytes: int = Field(description="host RAM per node the offload needs")
    verdict: Verdict = Field(description="the engine's verdict (GPU memory, host RAM, NVMe)")
    tight: bool = Field(False, description="fits, but the expected device total is above (1 - margin) x GPU memory")
    tokens_per_s_per_gpu: float | None
    step_s: float | None
    why_more: Phrase | None = Field(None, description="when this step needs more GPU memory than the one before: why")
    why_same: Phrase | None = Field(None, description="when this step leaves the GPU memory as it was: why")

    @computed_field(description="verdict.fits, derived so the two cannot disagree")
    @property
    def fits(self) -> bool | None:
        return self.verdict.fits


def optimization_waterfall(sc: Scenario, safety_margin: float = DEFAULT_SAFETY_MARGIN,
                           assumptions: SpeedAssumptions | None = None) -> list[WaterfallStep]:
    """Turn optimizations on one at a time, cheapest first, each on top of the previous ones:

    0 baseline: fp32, eager attention, no checkpointing, no ZeRO, the user's optimizer (AdamW for 8-bit);
    1 mixed precision (bf16-mixed, or fp16-mixed on GPUs without bf16); 2 SDPA/FlashAttention;
    3 full activation checkpointing; 4-6 ZeRO-1, -2, -3 (only with more than one data-parallel rank;
    pipeline parallelism stops at ZeRO-1); 7 optimizer offload to CPU (ZeRO-Offload; on one rank with
    ZeRO-2); 8 parameter offload to CPU (ZeRO-3); then the method changes, each replacing offload with
    the best non-offload ZeRO stage (DeepSpeed's CPU Adam replaces bitsandbytes, LoRA's states are tiny):
    9 8-bit AdamW; 10 LoRA r16 on all linear layers (bf16 base); 11 QLoRA (NF4 base, ZeRO <= 2).
    Micro-batch, sequence length and TP/PP stay as in `sc`; the accumulation reaches its global batch
    (Scenario.accumulation_to_global_batch). Under FSDP2 the ZeRO-1 and
    offload steps are left out (FSDP2 shards gradients with the weights, and its offload is not modelled). The loop
    steps after backward (optimizer_in_backward off): master weights, ZeRO and offload need every gradient there."""
    a = assumptions or SpeedAssumptions()
    t = sc.training
    if t.framework != "transformers":  # its steps (eager, *-mixed, ZeRO, offload, peft LoRA) are HF / DeepSpeed's
        return []
    hwc = sc.resolved_hardware()
    gpu = gpu_presets().get(hwc.gpu) if hwc.gpu else None
    mem = hwc.memory_bytes or (gpu.memory_bytes if gpu else None)
    fsdp = t.sharding == "fsdp2"
    dp, pp1 = sc.data_parallel, t.pipeline_parallel == 1
    bf16 = gpu is None or (gpu.bf16 and gpu.bf16_tflops > 0)
    mixed = Precision.bf16_mixed if bf16 else Precision.fp16_mixed
    amp = Precision.amp_bf16 if bf16 else Precision.amp_fp16
    opt = Optimizer.adamw if t.optimizer == Optimizer.adamw_8bit else t.optimizer
    cur: dict[str, Any] = {}
    cur.update(precision=Precision.fp32, attention=Attention.eager, activation_checkpointing=Checkpointing.none,
               checkpoint_every=1, zero_stage=0, offload_optimizer=Offload.none, offload_params=Offload.none,
               optimizer=opt, lora=None, optimizer_in_backward=False)
    no_offload_zero = (3 if pp1 else 1) if dp > 1 else 0
    plan: list[tuple[Phrase, Phrase, dict[str, Any], bool]] = [
        (T_("baseline"), T_("fp32 weights, eager attention, no checkpointing, plain data parallel"), {}, False),
        (T_("mixed precision"), T_("{precision}: 16-bit weights, grads and activations; fp32 master + states",
                                   precision=mixed.value), {"precision": mixed}, False),
        (T_("FlashAttention / SDPA"), T_("the B x heads x S x S scores are never stored"),
         {"attention": Attention.sdpa if sc.spec.sdpa_supported else Attention.eager}, False),
        (T_("activation checkpointing"), T_("full: keep each layer's input, recompute its forward in backward"),
         {"activation_checkpointing": Checkpointing.full}, False),
    ]
    if dp > 1 and not fsdp:
        plan.append((T_("ZeRO-1"), T_("optimizer states + master weights sharded over {dp} ranks", dp=dp),
                     {"zero_stage": 1}, False))
    if dp > 1 and pp1:
        plan.append((T_("ZeRO-2"), T_("+ gradients sharded"), {"zero_stage": 2}, False))
        plan.append((T_("ZeRO-3"), T_("+ 16-bit weights sharded"), {"zero_stage": 3}, False))
    if not fsdp:
        plan += _offload_steps(no_offload_zero, pp1)
    plan += _method_steps(no_offload_zero, opt, amp, mixed, t.optimizer_impl, sc.spec.family, t.sharding == "fsdp2")
    out: list[WaterfallStep] = []
    prev: Estimate | None = None
    ga = sc.accumulation_to_global_batch
    for name, change, upd, method in plan:
        trial = {**cur, **upd}
        # the scenario's expert parallelism where FSDP2 shards (ZeRO 2/3), 1 before that
        ep = t.expert_parallel if fsdp and trial["zero_stage"] in (2, 3) else 1
        # each step at the scenario's global batch (its micro-batch, the accumulation that reaches it), as the
        # recommender's candidates are: the speeds on the page are at one batch
        try:
            s2 = sc.with_training(**trial, expert_parallel=ep, gradient_accumulation_steps=ga)
        except ValueError:  # a step this scenario cannot take (quantized inference weights under ZeRO-3): left out,
            continue  # and the later steps go on without it
        cur = trial
        est = estimate(s2)
        need = est.device_total_bytes.expected
        sp = None
        if gpu is not None:
            hw = hardware_of(s2)
            sp = to_estimate(step_time(s2.spec, s2.training, hw, s2.mode, a), hw, a)
        out.append(WaterfallStep(
            step=len(out), name=name, change=change, scenario=s2, method_change=method,
            peak_allocated_bytes=est.peak_allocated_bytes, device_total_expected_bytes=need,
            device_total_high_bytes=est.device_total_bytes.high, cpu_ram_bytes=est.cpu_ram_bytes,
            verdict=est.verdict,
            tight=bool(est.verdict.fits) and mem is not None and need > usable_bytes(mem, safety_margin),
            tokens_per_s_per_gpu=sp.tokens_per_s_per_gpu if sp else None, step_s=sp.step_s if sp else None,
            why_more=None if prev is None else why_more(name, prev, est),
            why_same=None if prev is None else why_same(prev, est)))
        prev = est
    return out


def _offload_steps(no_offload_zero: int, pp1: bool) -> list[tuple[Phrase, Phrase, dict[str, Any], bool]]:
    steps = []
    steps.append((T_("optimizer offload"),
                  T_("optimizer states + fp32 master weights in CPU RAM, CPU Adam (ZeRO-Offload)"),
                  {"zero_stage": max(no_offload_zero, 2 if pp1 else 1), "offload_optimizer": Offload.cpu}, False))
    if pp1:
        steps.append((T_("parameter offload"), T_("16-bit weights in CPU RAM (ZeRO-3 offload_param)"),
                      {"zero_stage": 3, "offload_params": Offload.cpu}, False))
    return steps


def _method_steps(no_offload_zero: int, opt: Optimizer, amp: Precision, mixed: Precision, impl: OptimizerImpl,
                  family: str, fsdp2: bool) -> list[tuple[Phrase, Phrase, dict[str, Any], bool]]:
    back = {"offload_optimizer": Offload.none, "offload_params": Offload.none, "zero_stage": no_offload_zero}
    bnb_impl = OptimizerImpl.foreach if impl == OptimizerImpl.for_loop else impl  # bitsandbytes has no for-loop
    lora, qlora = default_lora(family), default_lora(family, "nf4")
    adapters = T_("frozen bf16 base weights, rank-16 adapters on all linear layers") \
        if lora.targets == "all-linear" else T_("frozen bf16 base weights, rank-16 adapters on the attention projections")
    return [
        (T_("8-bit optimizer"), T_("bitsandbytes AdamW8bit: 2 x 1-byte states on the GPU instead of offload"),
         {**back, "optimizer": Optimizer.adamw_8bit, "optimizer_impl": bnb_impl}, True),
        (T_("LoRA"), adapters,
         {**back, "optimizer": opt, "optimizer_impl": impl, "lora": lora, "precision": amp if no_offload_zero == 0 else mixed}, True),
        (T_("QLoRA"), T_("frozen base weights in 4-bit NF4 (not partitioned by ZeRO-3)"),
         # FSDP2 would shard the packed 4-bit storage, which is not modelled: its QLoRA step replicates the model
         {**back, "optimizer": opt, "lora": qlora, "precision": amp,
          "zero_stage": 0 if fsdp2 else min(no_offload_zero, 2)},
         True),
    ]


# Why a step can need more GPU memory than the one before it (modelled mechanisms, not measured).
_MORE_BECAUSE = {
    "mixed precision": MIXED_ABOVE_AMP,
    "activation checkpointing": N_("recomputing a layer in backward re-creates its activations at the backward "
                                   "peak"),
    "ZeRO-1": N_("ZeRO adds communication buckets"),
    "ZeRO-2": N_("ZeRO-2 adds gradient reduce buckets"),
    "ZeRO-3": N_("ZeRO-3 gathers each layer's full weights (and prefetches the next) while it runs"),
    "optimizer offload": N_("the offloaded step needs a stage that shards less than the one before"),
    "parameter offload": N_("ZeRO-3 offload gathers each layer's weights from host RAM into GPU buffers"),
    "8-bit optimizer": N_("the method steps turn offload off again: the 8-bit states live on the GPU"),
    "LoRA": N_("offload is off again: the frozen base weights live on the GPU"),
    "QLoRA": N_("NF4 base weights are not sharded by ZeRO-3, so each GPU holds a whole 4-bit copy"),
}


# a change this small reads as "0.00 GiB" on every page (gib_short rounds to 0.01 GiB)
SAME_BYTES = 2**30 // 200


def why_same(before: Estimate, after: Estimate) -> Phrase | None:
    """None unless the step leaves the expected device total as it was; then why: what it saves is not alive
    at the peak (at the optimizer step, backward has already freed the activations)."""
    if abs(after.device_total_bytes.expected - before.device_total_bytes.expected) >= SAME_BYTES:
        return None
    if after.peak_phase == "optimizer":
        return T_("saves nothing here: the peak falls at the optimizer step, when backward has already freed the "
                  "activations")
    return T_("saves nothing at the peak for this batch")


def why_more(name: str, before: Estimate, after: Estimate) -> Phrase | None:
    """None when the step does not raise the expected device total; otherwise the categories that grew
    and the mechanism behind them."""
    rise = after.device_total_bytes.expected - before.device_total_bytes.expected
    if rise <= 0:
        return None
    grew = [(CATEGORY_SHORT[c], getattr(after.breakdown, c) - getattr(before.breakdown, c)) for c in CATEGORIES]
    parts = joined(", ", [T_("{category} +{size}", category=Phrase(label), size=gib_short(d))
                          for label, d in grew if d > 0])
    because = _MORE_BECAUSE.get(name)
    if because:
        return T_("needs {rise} more per GPU than the step before ({parts}): {because}.", rise=gib_short(rise),
                  parts=parts, because=Phrase(because))
    return T_("needs {rise} more per GPU than the step before ({parts}).", rise=gib_short(rise), parts=parts)

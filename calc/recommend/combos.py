"""What the recommender varies: a combination of precision, checkpointing, attention, ZeRO stage,
offload, TP/PP and training method (everything but the micro-batch split), enumerated per group."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from calc.contract.architectures import ModelSpec
from calc.contract.i18n import Text
from calc.contract.presets import gpu_presets
from calc.contract.scenario import (
    Attention,
    Checkpointing,
    LoraConfig,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Scenario,
    TrainingConfig,
)
from calc.contract.stacks import fsdp2_setting_problem, method_of, stack_problem, trainer_uses_deepspeed
from calc.memo import memoized
from calc.recommend.models import (
    CHECKPOINTING,
    OFFLOADS_STAGE3,
    OFFLOADS_STAGE12,
    Group,
    default_lora,
)


@dataclass(frozen=True)
class Combo:
    """Everything the search varies except the micro-batch split."""

    precision: Precision
    ckpt: Checkpointing
    every: int
    attention: Attention
    zero: int
    off_opt: Offload
    off_par: Offload
    tp: int
    pp: int
    optimizer: Optimizer
    lora_key: tuple | None = None
    lora: LoraConfig | None = field(default=None, compare=False, hash=False)
    # data-parallel ranks (GPUs / (TP x PP)), for the words only: no ZeRO on one rank is not DDP
    dp: int = field(default=1, compare=False, hash=False)

    def states_key(self) -> tuple:
        """What decides the model states (calc.memory.states.model_states: weights, gradients, optimizer states,
        their sharding and offload) within one search: not the micro-batch split, checkpointing or attention."""
        return self.precision, self.zero, self.off_opt, self.off_par, self.tp, self.pp, self.optimizer, self.lora_key

    def with_(self, **kw: Any) -> Combo:
        d = {**self.__dict__, **kw}  # the fields (a frozen dataclass without __slots__ keeps them there)
        if "lora" in kw:
            d["lora_key"] = _lora_key(kw["lora"])
        return Combo(**d)


@dataclass
class LightConfig:
    """A stand-in for TrainingConfig with the attributes calc.speed.step_time reads (calc.speed.StepConfig): no
    validation, thousands per search."""

    precision: Precision
    activation_checkpointing: Checkpointing
    checkpoint_every: int
    attention: Attention
    zero_stage: int
    offload_optimizer: Offload
    offload_params: Offload
    tensor_parallel: int
    pipeline_parallel: int
    optimizer: Optimizer
    lora: LoraConfig | None
    micro_batch_size: int
    gradient_accumulation_steps: int
    seq_len: int
    framework: str = "transformers"


def _lora_key(lora: LoraConfig | None) -> tuple | None:
    return None if lora is None else (lora.rank, lora.alpha, lora.targets, lora.base_weights)


def light_config(c: Combo, mb: int, ga: int, seq: int, framework: str = "transformers") -> LightConfig:
    """c at this micro-batch, accumulation and sequence length, under `framework`, for calc.speed.step_time."""
    return LightConfig(c.precision, c.ckpt, c.every, c.attention, c.zero, c.off_opt, c.off_par, c.tp, c.pp, c.optimizer,
                       c.lora, mb, ga, seq, framework)


def combo_of(t: TrainingConfig, dp: int = 1) -> Combo:
    return Combo(t.precision, t.activation_checkpointing, t.checkpoint_every, t.attention, t.zero_stage,
                 t.offload_optimizer, t.offload_params, t.tensor_parallel, t.pipeline_parallel, t.optimizer,
                 _lora_key(t.lora), t.lora, dp)


def is_method_change(c: Combo, base: TrainingConfig) -> bool:
    return (c.optimizer != base.optimizer or c.lora_key != _lora_key(base.lora)
            or (c.precision == Precision.bf16 and base.precision != Precision.bf16))


def scenario_for(base: Scenario, c: Combo, mb: int, ga: int) -> Scenario:
    """A validated Scenario: the base's model, hardware, mode and sequence length with `c` applied."""
    t = base.training
    impl = t.optimizer_impl
    if c.optimizer.bitsandbytes and impl == OptimizerImpl.for_loop:
        impl = OptimizerImpl.foreach
    return base.with_training(
        micro_batch_size=mb, gradient_accumulation_steps=ga, precision=c.precision, optimizer=c.optimizer,
        optimizer_impl=impl, activation_checkpointing=c.ckpt, checkpoint_every=c.every if c.ckpt == Checkpointing.full
        else 1, attention=c.attention, zero_stage=c.zero, offload_optimizer=c.off_opt, offload_params=c.off_par,
        tensor_parallel=c.tp, pipeline_parallel=c.pp, sequence_parallel=t.sequence_parallel and c.tp > 1, lora=c.lora,
        expert_parallel=t.expert_parallel if c.zero in (2, 3) else 1)  # the user's EP, where FSDP2 shards


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@memoized("divisors up to a limit", 256)
def small_divisors(n: int, limit: int) -> tuple[int, ...]:
    """The divisors of n up to `limit`, in O(limit): n (sequences per data-parallel rank) reaches 2^48
    (65,536 micro-batches x 65,536 accumulation steps x 65,536 GPUs), where O(sqrt n) takes seconds."""
    return tuple(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _attention_kernels(spec: ModelSpec) -> tuple[Attention, ...]:
    """SDPA first where the model has it (gpt-oss runs eager only)."""
    return (Attention.sdpa, Attention.eager) if spec.sdpa_supported else (Attention.eager,)


def _precisions(gpu_bf16: bool, user: Precision) -> tuple[list[Precision], list[Precision]]:
    """(same-method precisions, method-change precisions). AMP only with ZeRO 0 (HF Trainer / DDP);
    the *-mixed variants are DeepSpeed's; pure bf16 keeps bf16 optimizer states, a numerics change."""
    if gpu_bf16:
        same = [Precision.amp_bf16, Precision.bf16_mixed]
        change = [Precision.bf16]
    else:
        same = [Precision.amp_fp16, Precision.fp16_mixed]
        change = []
    if user not in same:
        same.append(user)
        if user in change:
            change.remove(user)
    return same, change


Method = tuple[list[Precision], Optimizer, LoraConfig | None]


def methods_for(sc: Scenario, group: Group, widen: bool) -> list[Method]:
    """(precisions, optimizer, LoRA) tried in `group`. widen=False: the user's own method in the full
    group, LoRA and QLoRA (or the user's LoRA) in the adapters group. widen=True (nothing fit and the
    request allows it): 8-bit AdamW and pure bf16 states for full fine-tuning, QLoRA for a bf16 LoRA."""
    t = sc.training
    hw = sc.resolved_hardware()
    gpu = gpu_presets()[hw.gpu]
    bf16_ok = gpu.bf16 and gpu.bf16_tflops > 0
    same_p, change_p = _precisions(bf16_ok, t.precision)
    amp = [p for p in same_p if p.is_amp] + [p for p in change_p if p == Precision.bf16]
    if t.framework != "transformers":  # its recipes' dtypes: the scenario's, or bf16 throughout (LitGPT's bf16-true)
        same_p = amp = [t.precision] + ([Precision.bf16] if bf16_ok and t.precision != Precision.bf16 else [])
        change_p = []
    full_opt = Optimizer.adamw if t.optimizer == Optimizer.adamw_8bit else t.optimizer
    if sc.mode == Mode.inference:
        return [] if widen else [([t.precision], t.optimizer, t.lora)]
    if group == "full":
        if t.lora is not None:
            return []
        if not widen:
            return [(same_p, t.optimizer, None)]
        out: list[Method] = []
        if t.optimizer in (Optimizer.adam, Optimizer.adamw):
            out.append((same_p, Optimizer.adamw_8bit, None))
        if change_p:
            out.append((change_p, t.optimizer, None))
        return out
    if t.lora is not None:
        if not widen:
            return [(same_p, t.optimizer, t.lora)]
        if t.lora.quantized:
            return []
        return [(amp, t.optimizer, t.lora.model_copy(update={"base_weights": "nf4"}))]
    if widen:
        return []
    family = sc.spec.family
    return [(same_p, full_opt, default_lora(family)), (amp, full_opt, default_lora(family, "nf4"))]


def groups_for(sc: Scenario) -> list[Group]:
    """The groups to search: inference has one (the model as it is); a LoRA scenario pins adapters;
    otherwise both, since every model here trains both ways."""
    if sc.mode == Mode.inference:
        return ["adapters" if sc.training.lora is not None else "full"]
    return ["adapters"] if sc.training.lora is not None else ["full", "adapters"]


def enumerate_combos(sc: Scenario, methods: list[Method]) -> list[Combo]:
    """All valid combinations of `methods` for `sc`'s model, hardware and sharding implementation."""
    spec, t = sc.spec, sc.training
    hw = sc.resolved_hardware()
    n = hw.num_gpus
    fsdp = t.sharding == "fsdp2"
    # torchtune's and LitGPT's own recipes: one device in plain PyTorch, in the scenario's precision (their dtype)
    native = t.framework != "transformers"
    tps = [d for d in _divisors(hw.gpus_in_node()) if spec.num_heads % d == 0 and spec.num_kv_heads % d == 0]
    if fsdp or native:
        tps = [1]  # FSDP2 is modelled for data parallelism only
    out: list[Combo] = []
    for precisions, opt, lora in methods:
        quant = lora is not None and lora.quantized
        for tp in tps:
            for pp in ([1] if fsdp or native else _divisors(n // tp)):
                if pp > spec.num_layers:
                    continue
                dp = n // (tp * pp)
                for p in precisions:
                    if quant and p.is_mixed:
                        continue
                    stages = [0] if p.is_amp or native else ([0, 2, 3] if fsdp else [0, 1, 2, 3])
                    if sc.mode == Mode.inference:
                        stages = [0]
                    for z in stages:
                        if pp > 1 and z > 1:
                            continue  # DeepSpeed's pipeline engine supports ZeRO-1 at most
                        if quant and z == 3:
                            continue  # quantized base weights are not partitioned by ZeRO-3
                        if p == Precision.bf16 and z == 0 and sc.mode == Mode.train and not native:
                            continue  # DeepSpeed keeps bf16 optimizer states only with ZeRO 1-3
                        offs = [(Offload.none, Offload.none)] if z == 0 or fsdp else (
                            OFFLOADS_STAGE3 if z == 3 else OFFLOADS_STAGE12)
                        for oo, op in offs:
                            if oo != Offload.none and (opt.bitsandbytes or lora is not None):
                                continue  # DeepSpeed's CPU Adam replaces bnb; LoRA states are tiny
                            if dp == 1 and z > 0 and oo == Offload.none and op == Offload.none \
                                    and not (p == Precision.bf16 and z == 1):
                                continue  # nothing to shard on one rank
                            ckpts = CHECKPOINTING if sc.mode == Mode.train else ((Checkpointing.none, 1),)
                            for ck, every in ckpts:
                                for att in _attention_kernels(spec):
                                    out.append(Combo(p, ck, every, att, z, oo, op, tp, pp, opt, _lora_key(lora),
                                                     lora, dp))
    return [c for c in out if combo_launch_problem(sc, c) is None]


def combo_launch_problem(sc: Scenario, c: Combo) -> Text | None:
    """Why the exported files could not start `c` for `sc`'s model (calc.contract.stacks, the same answer the
    exporter refuses with), or None."""
    t = sc.training
    if sc.mode != Mode.train or t.framework != "transformers":
        return None
    if t.sharding == "fsdp2" and c.zero in (2, 3):  # the exported FSDP2 loop (calc.export.fsdp2)
        return fsdp2_setting_problem(c.precision, c.ckpt, c.optimizer, t.expert_parallel, t.cross_entropy,
                                     c.off_opt != Offload.none or c.off_par != Offload.none)
    return stack_problem(sc.spec.family, sc.spec.moe, c.zero, c.tp, c.pp, method_of(c.lora),
                         c.off_par != Offload.none, trainer_uses_deepspeed(c.zero, c.precision))


def complexity(c: Combo) -> tuple[int, bool, bool]:
    """Tie-break among equally fast configurations: the simpler setup first."""
    return (c.zero + 2 * (c.off_opt != Offload.none) + 2 * (c.off_par != Offload.none)
            + (c.tp > 1) + (c.pp > 1), c.ckpt != Checkpointing.none, c.precision.is_mixed)


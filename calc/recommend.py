"""Which configurations fit, ranked by estimated tokens/s; a model x hardware table built by the same
search; and the "what to turn on next" waterfall.

The search enumerates precision, checkpointing granularity, attention kernel, ZeRO stage, offload
targets, tensor/pipeline sizes and the micro-batch / gradient-accumulation split of a requested global
batch (plus 8-bit AdamW, LoRA and QLoRA when the request allows changing the training method), keeps
what fits on the GPU with a safety margin, and ranks by the speed model (calc.speed).

It stays fast by never estimating what cannot win (branch and bound):
1. Speed needs no memory estimate (~15 us), so every combination gets an upper bound first: its best
   tokens/s over all micro-batch sizes. Combinations are visited best bound first, and the search stops
   once `max_candidates` fitting results are at least as fast as the next bound.
2. Memory is monotone in the micro-batch, so the largest micro-batch that fits is found by bisection
   over the divisors of the per-replica batch (log2 of their count estimates, not all of them).
3. Dominated combinations are skipped without an estimate: eager attention (more memory and slower than
   SDPA/FlashAttention in every case), NVMe offload where CPU offload fits (same GPU memory, slower),
   ZeRO stages on one data-parallel rank without offload (nothing to shard), and whole groups whose most
   frugal member (full checkpointing, everything offloaded, micro-batch 1) does not fit.
4. Every memory estimate is cached by its exact configuration.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from calc.engine import estimate
from calc.presets import cluster_presets, gpu_presets
from calc.result import Estimate
from calc.scenario import (
    Attention,
    Checkpointing,
    HardwareConfig,
    LoraConfig,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Scenario,
    TrainingConfig,
)
from calc.speed import SpeedAssumptions, SpeedEstimate, _Hw, _Raw, hardware_of, step_time, to_estimate
from calc.units import GiB, fmt_gib

DEFAULT_SAFETY_MARGIN = 0.10  # keep 10% of the GPU free (the "10% safety margin" of the source articles)
MAX_MICRO_BATCH = 1024
CHECKPOINTING: tuple[tuple[Checkpointing, int], ...] = (
    (Checkpointing.none, 1), (Checkpointing.selective, 1), (Checkpointing.full, 4), (Checkpointing.full, 2),
    (Checkpointing.full, 1),
)
# (offload_optimizer, offload_params) pairs tried per ZeRO stage; parameters are offloaded only together
# with (or beyond) the optimizer states, which free 12 of the 16 bytes per parameter first.
# NVMe optimizer offload is ZeRO-3 only: DeepSpeed 0.19's ZeRO-1/2 optimizer treats any offload device as
# CPU ("ZeRO-1 and NVMe offload use the same CPU gradient path", runtime/zero/stage_1_and_2.py).
OFFLOADS_STAGE12 = ((Offload.none, Offload.none), (Offload.cpu, Offload.none))
OFFLOADS_STAGE3 = OFFLOADS_STAGE12 + ((Offload.nvme, Offload.none), (Offload.cpu, Offload.cpu),
                                      (Offload.nvme, Offload.cpu), (Offload.cpu, Offload.nvme),
                                      (Offload.nvme, Offload.nvme))
DEFAULT_LORA = LoraConfig(rank=16, alpha=32, targets="all-linear", base_weights="bf16")
DEFAULT_QLORA = LoraConfig(rank=16, alpha=32, targets="all-linear", base_weights="nf4")

# The table's default workload: 2,048-token sequences and a ~1M-token global batch (512 sequences),
# the order of magnitude of published fine-tuning and pre-training batches (Llama 2 used 4M tokens).
TABLE_SEQ_LEN = 2048
TABLE_GLOBAL_BATCH_TOKENS = 2**20
TABLE_MODELS = ("llama-3.2-1b", "llama-3.1-8b", "llama-2-13b", "qwen2.5-32b", "llama-3.1-70b", "llama-3.1-405b")
TABLE_HARDWARE = ("1x-rtx-4090", "1x-a100-80gb", "8x-a100-80gb", "8x-h100-sxm", "64x-a100-80gb", "64x-h100-sxm")


# ---- request and results ------------------------------------------------------------------------

class RecommendRequest(BaseModel):
    """What to search for: a scenario (model, hardware, sequence length, the user's method) and a
    target global batch."""

    model_config = ConfigDict(extra="forbid")

    scenario: Scenario
    # Bounds (calc.limits' spirit): the largest published steps hold ~63M tokens (DeepSeek-V3, 15,360 x 4K);
    # 2^40 tokens and 2^32 sequences are 10,000x that.
    global_batch_tokens: int | None = Field(None, ge=1, le=2**40, description="tokens per optimizer step (all GPUs)")
    global_batch_size: int | None = Field(None, ge=1, le=2**32, description="sequences per optimizer step (all GPUs)")
    allow_method_change: bool = Field(
        False, description="may propose 8-bit AdamW, pure bf16 states, LoRA or QLoRA (only when the user's own "
                           "method fits in no configuration)")
    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=0, lt=1,
                                 description="fraction of GPU memory kept free: fits when expected device total "
                                             "<= (1 - margin) x GPU memory")
    max_candidates: int = Field(10, ge=1, le=1000)
    assumptions: SpeedAssumptions = Field(default_factory=SpeedAssumptions)

    @model_validator(mode="after")
    def _one_batch(self) -> RecommendRequest:
        if self.global_batch_tokens is not None and self.global_batch_size is not None:
            raise ValueError("give global_batch_tokens or global_batch_size, not both")
        return self


class Candidate(BaseModel):
    """One configuration that fits, with its memory and speed."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    label: str = Field(description="e.g. 'bf16-mixed, ZeRO-2, full checkpointing, micro-batch 4 x 8 accumulation'")
    scenario: Scenario
    method_change: bool = Field(description="uses 8-bit AdamW, pure bf16 states, LoRA or QLoRA instead of the "
                                            "requested method")
    global_batch_tokens: int
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    step_s: float
    peak_allocated_bytes: int
    device_total_expected_bytes: int
    device_total_high_bytes: int
    usable_bytes: int = Field(description="GPU memory x (1 - safety margin)")
    cpu_ram_bytes: int = Field(description="host RAM per node needed by offload")
    speed: SpeedEstimate


class SearchStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    combinations: int = Field(description="configurations enumerated (before micro-batch sizes)")
    pruned_dominated: int
    pruned_infeasible_group: int = Field(description="skipped: the group's most frugal member does not fit")
    pruned_bound: int = Field(description="never estimated: speed bound below the last kept candidate")
    memory_estimates: int = Field(description="calls to calc.engine.estimate")
    speed_evaluations: int
    elapsed_s: float


class Recommendation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidates: list[Candidate]
    explanation: str = Field(description="one sentence on why the winner wins")
    gpu_memory_bytes: int
    usable_bytes: int
    target_global_batch_sequences: int
    method_change: bool = Field(description="the candidates change the training method (nothing else fit)")
    stats: SearchStats
    notes: list[str] = Field(default_factory=list)


# ---- combinations -------------------------------------------------------------------------------

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

    def with_(self, **kw: Any) -> Combo:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(kw)
        if "lora" in kw:
            d["lora_key"] = _lora_key(kw["lora"])
        return Combo(**d)


@dataclass
class _Light:
    """Duck-typed TrainingConfig for calc.speed.step_time (no validation: thousands per search)."""

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


def _lora_key(lora: LoraConfig | None) -> tuple | None:
    return None if lora is None else (lora.rank, lora.alpha, lora.targets, lora.base_weights)


def _light(c: Combo, mb: int, ga: int, seq: int) -> _Light:
    return _Light(c.precision, c.ckpt, c.every, c.attention, c.zero, c.off_opt, c.off_par, c.tp, c.pp, c.optimizer,
                  c.lora, mb, ga, seq)


def combo_of(t: TrainingConfig) -> Combo:
    return Combo(t.precision, t.activation_checkpointing, t.checkpoint_every, t.attention, t.zero_stage,
                 t.offload_optimizer, t.offload_params, t.tensor_parallel, t.pipeline_parallel, t.optimizer,
                 _lora_key(t.lora), t.lora)


def is_method_change(c: Combo, base: TrainingConfig) -> bool:
    return (c.optimizer != base.optimizer or c.lora_key != _lora_key(base.lora)
            or (c.precision == Precision.bf16 and base.precision != Precision.bf16))


def scenario_for(base: Scenario, c: Combo, mb: int, ga: int) -> Scenario:
    """A validated Scenario: the base's model, hardware, mode and sequence length with `c` applied."""
    t = base.training
    impl = t.optimizer_impl
    if c.optimizer == Optimizer.adamw_8bit and impl == OptimizerImpl.for_loop:
        impl = OptimizerImpl.foreach
    return base.with_training(
        micro_batch_size=mb, gradient_accumulation_steps=ga, precision=c.precision, optimizer=c.optimizer,
        optimizer_impl=impl, activation_checkpointing=c.ckpt, checkpoint_every=c.every if c.ckpt == Checkpointing.full
        else 1, attention=c.attention, zero_stage=c.zero, offload_optimizer=c.off_opt, offload_params=c.off_par,
        tensor_parallel=c.tp, pipeline_parallel=c.pp, sequence_parallel=t.sequence_parallel and c.tp > 1, lora=c.lora)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@lru_cache(maxsize=256)
def _small_divisors(n: int, limit: int) -> tuple[int, ...]:
    """The divisors of n up to `limit`, in O(limit): n (sequences per data-parallel rank) reaches 2^48
    (65,536 micro-batches x 65,536 accumulation steps x 65,536 GPUs), where O(sqrt n) takes seconds."""
    return tuple(d for d in range(1, min(n, limit) + 1) if n % d == 0)


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


def enumerate_combos(sc: Scenario, method_change: bool) -> list[Combo]:
    """All valid combinations for `sc`'s model and hardware: the user's method (method_change=False) or
    the method changes (8-bit AdamW, pure bf16, LoRA, QLoRA)."""
    spec, t = sc.spec, sc.training
    hw = sc.resolved_hardware()
    gpu = gpu_presets()[hw.gpu]
    n = hw.num_gpus
    per_node = hw.gpus_in_node()
    same_p, change_p = _precisions(gpu.bf16 and gpu.bf16_tflops > 0, t.precision)
    methods: list[tuple[list[Precision], Optimizer, LoraConfig | None]] = []
    if not method_change:
        methods.append((same_p, t.optimizer, t.lora))
    else:
        if t.lora is None and t.optimizer in (Optimizer.adam, Optimizer.adamw):
            methods.append((same_p, Optimizer.adamw_8bit, None))
        if change_p and t.lora is None:
            methods.append((change_p, t.optimizer, None))
        amp = [p for p in same_p if p.is_amp] + [p for p in change_p if p == Precision.bf16]
        if t.lora is None:
            methods.append((same_p, Optimizer.adamw if t.optimizer == Optimizer.adamw_8bit else t.optimizer,
                            DEFAULT_LORA))
        if t.lora is None or t.lora.base_weights == "bf16":
            q = (t.lora or DEFAULT_LORA).model_copy(update={"base_weights": "nf4"})
            methods.append((amp, Optimizer.adamw if t.optimizer == Optimizer.adamw_8bit else t.optimizer, q))
    if sc.mode == Mode.inference:
        methods = [([t.precision], t.optimizer, t.lora)] if not method_change else []
    tps = [d for d in _divisors(per_node) if spec.num_heads % d == 0 and spec.num_kv_heads % d == 0]
    out: list[Combo] = []
    for precisions, opt, lora in methods:
        quant = lora is not None and lora.base_weights != "bf16"
        for tp in tps:
            for pp in _divisors(n // tp):
                if pp > spec.num_layers:
                    continue
                dp = n // (tp * pp)
                for p in precisions:
                    if quant and p.is_mixed:
                        continue
                    stages = [0] if p.is_amp else [0, 1, 2, 3]
                    if sc.mode == Mode.inference:
                        stages = [0]
                    for z in stages:
                        if pp > 1 and z > 1:
                            continue  # DeepSpeed's pipeline engine supports ZeRO-1 at most
                        if quant and z == 3:
                            continue  # quantized base weights are not partitioned by ZeRO-3
                        if p == Precision.bf16 and z == 0 and sc.mode == Mode.train:
                            continue  # DeepSpeed keeps bf16 optimizer states only with ZeRO 1-3
                        offs = [(Offload.none, Offload.none)] if z == 0 else (OFFLOADS_STAGE3 if z == 3
                                                                              else OFFLOADS_STAGE12)
                        for oo, op in offs:
                            if oo != Offload.none and (opt == Optimizer.adamw_8bit or lora is not None):
                                continue  # DeepSpeed's CPU Adam replaces bnb; LoRA states are tiny
                            if dp == 1 and z > 0 and oo == Offload.none and op == Offload.none \
                                    and not (p == Precision.bf16 and z == 1):
                                continue  # nothing to shard on one rank
                            ckpts = CHECKPOINTING if sc.mode == Mode.train else ((Checkpointing.none, 1),)
                            for ck, every in ckpts:
                                for att in _attention_kernels(spec):
                                    out.append(Combo(p, ck, every, att, z, oo, op, tp, pp, opt, _lora_key(lora),
                                                     lora))
    return out


def _attention_kernels(spec) -> tuple[Attention, ...]:
    """SDPA first where the model has it (gpt-oss runs eager only)."""
    return (Attention.sdpa, Attention.eager) if spec.sdpa_supported else (Attention.eager,)


def _complexity(c: Combo) -> tuple:
    """Tie-break among equally fast configurations: the simpler setup first."""
    return (c.zero + 2 * (c.off_opt != Offload.none) + 2 * (c.off_par != Offload.none)
            + (c.tp > 1) + (c.pp > 1), c.ckpt != Checkpointing.none, c.precision.is_mixed)


# ---- the search ---------------------------------------------------------------------------------

@dataclass
class _Fit:
    est: Estimate | None
    ok: bool
    reason: str = ""


@dataclass
class _Found:
    combo: Combo
    mb: int
    ga: int
    raw: _Raw
    fit: _Fit


@dataclass
class _Search:
    base: Scenario
    hw: _Hw
    assumptions: SpeedAssumptions
    usable: int
    gpu_memory: int
    cpu_ram: int | None
    nvme: int | None
    target_seqs: int
    stats: dict[str, int] = field(default_factory=lambda: dict(
        combinations=0, pruned_dominated=0, pruned_infeasible_group=0, pruned_bound=0, memory_estimates=0,
        speed_evaluations=0))
    cache: dict[tuple[Combo, int, int], _Fit] = field(default_factory=dict)
    infeasible: list[tuple[float, Combo, _Fit]] = field(default_factory=list)
    frugal_failures: list[tuple[Combo, _Fit]] = field(default_factory=list)
    tried_method_change: bool = False

    def split(self, c: Combo) -> tuple[int, list[int]]:
        dp = self.hw.num_gpus // (c.tp * c.pp)
        if self.base.mode == Mode.inference:
            per = max(self.target_seqs, 1)
            return per, [m for m in (1 << i for i in range(11)) if m <= per] or [1]
        per = max(1, round(self.target_seqs / dp))
        return per, list(_small_divisors(per, MAX_MICRO_BATCH))

    def speed(self, c: Combo, mb: int, per: int) -> _Raw:
        self.stats["speed_evaluations"] += 1
        ga = per // mb if self.base.mode == Mode.train else 1
        return step_time(self.base.spec, _light(c, mb, ga, self.base.training.seq_len), self.hw, self.base.mode,
                         self.assumptions)

    def fit(self, c: Combo, mb: int, ga: int) -> _Fit:
        key = (c, mb, ga)
        if key in self.cache:
            return self.cache[key]
        try:
            sc = scenario_for(self.base, c, mb, ga)
        except (ValidationError, ValueError) as exc:
            f = _Fit(None, False, f"invalid: {exc}")
            self.cache[key] = f
            return f
        self.stats["memory_estimates"] += 1
        est = estimate(sc)
        need = est.device_total_bytes.expected
        if need > self.usable:
            f = _Fit(est, False, f"needs {fmt_gib(need)} (usable {fmt_gib(self.usable)})")
        elif self.cpu_ram is not None and est.cpu_ram_bytes > self.cpu_ram:
            f = _Fit(est, False, f"offload needs {fmt_gib(est.cpu_ram_bytes)} host RAM per node "
                                 f"(has {fmt_gib(self.cpu_ram)})")
        elif self.nvme is not None and est.nvme_bytes > self.nvme:
            f = _Fit(est, False, f"offload needs {fmt_gib(est.nvme_bytes)} of NVMe per node "
                                 f"(has {fmt_gib(self.nvme)})")
        else:
            f = _Fit(est, True)
        self.cache[key] = f
        return f


def _frugal(c: Combo, sdpa: bool = True) -> Combo:
    """The member of c's group (same precision, stage, TP/PP, method) that needs the least GPU memory."""
    oo = Offload.cpu if c.zero >= 1 and c.optimizer != Optimizer.adamw_8bit and c.lora is None else c.off_opt
    op = Offload.cpu if c.zero == 3 else c.off_par
    if c.off_opt == Offload.nvme:
        oo = Offload.nvme
    if c.off_par == Offload.nvme:
        op = Offload.nvme
    return c.with_(ckpt=Checkpointing.full, every=1, attention=Attention.sdpa if sdpa else Attention.eager,
                   off_opt=oo, off_par=op)


def _run(s: _Search, combos: list[Combo], k: int) -> list[_Found]:
    entries = []
    for c in combos:
        s.stats["combinations"] += 1
        if c.attention == Attention.eager and s.base.spec.sdpa_supported:
            s.stats["pruned_dominated"] += 1  # SDPA: same FLOPs, no S x S tensors in HBM
            continue
        per, mbs = s.split(c)
        raws = {mb: s.speed(c, mb, per) for mb in mbs}
        ub = max(r.tokens_per_s for r in raws.values())
        entries.append((ub, c, per, mbs, raws))
    entries.sort(key=lambda e: (-e[0], _complexity(e[1])))
    found: list[_Found] = []
    group_ok: dict[Combo, bool] = {}
    ram_only: set[Combo] = set()
    for i, (ub, c, per, mbs, raws) in enumerate(entries):
        if len(found) >= k and ub <= found[k - 1].raw.tokens_per_s:
            s.stats["pruned_bound"] += len(entries) - i
            break
        ga0 = per // mbs[0] if s.base.mode == Mode.train else 1
        if c.off_opt == Offload.nvme or c.off_par == Offload.nvme:
            cpu_twin = c.with_(off_opt=Offload.cpu if c.off_opt != Offload.none else Offload.none,
                               off_par=Offload.cpu if c.off_par != Offload.none else Offload.none)
            twin = s.cache.get((cpu_twin, mbs[0], ga0))
            if twin is not None and cpu_twin not in ram_only:
                s.stats["pruned_dominated"] += 1  # same GPU memory as the CPU twin, slower: only for lack of RAM
                continue
        fr = _frugal(c, s.base.spec.sdpa_supported)
        if fr not in group_ok:
            f_fr = s.fit(fr, mbs[0], ga0)
            group_ok[fr] = f_fr.ok or f_fr.reason.startswith("offload")
            if not group_ok[fr]:
                s.frugal_failures.append((fr, f_fr))
        if not group_ok[fr]:
            s.stats["pruned_infeasible_group"] += 1
            continue
        f0 = s.fit(c, mbs[0], ga0)
        if not f0.ok:
            if f0.reason.startswith("offload"):
                ram_only.add(c)
            s.infeasible.append((ub, c, f0))
            continue
        lo, hi = 0, len(mbs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            ga = per // mbs[mid] if s.base.mode == Mode.train else 1
            if s.fit(c, mbs[mid], ga).ok:
                lo = mid
            else:
                hi = mid - 1
        best = max(mbs[: lo + 1], key=lambda m: (raws[m].tokens_per_s, m))
        ga = per // best if s.base.mode == Mode.train else 1
        f = s.fit(c, best, ga)
        if not f.ok:  # memory not monotone here (e.g. accumulation on/off): fall back to the largest that fit
            best = mbs[lo]
            ga = per // best if s.base.mode == Mode.train else 1
            f = s.fit(c, best, ga)
        found.append(_Found(c, best, ga, raws[best], f))
        found.sort(key=lambda x: (-x.raw.tokens_per_s, _complexity(x.combo)))
        del found[max(k, 1) * 4:]  # keep a few spares for the explanation
    return found


def _target_sequences(req: RecommendRequest) -> int:
    t = req.scenario.training
    if req.global_batch_size is not None:
        return req.global_batch_size
    if req.global_batch_tokens is not None:
        return max(1, round(req.global_batch_tokens / t.seq_len))
    if req.scenario.mode == Mode.inference:
        return t.micro_batch_size
    return t.micro_batch_size * t.gradient_accumulation_steps * req.scenario.data_parallel


def _setup(req: RecommendRequest) -> _Search:
    sc = req.scenario
    hw = hardware_of(sc)
    rhw = sc.resolved_hardware()
    mem = rhw.memory_bytes or hw.gpu.memory_bytes
    usable = int(mem * (1 - req.safety_margin))
    return _Search(sc, hw, req.assumptions, usable, mem, rhw.cpu_ram_bytes, rhw.nvme_bytes, _target_sequences(req))


def recommend(req: RecommendRequest | Scenario, **kw: Any) -> Recommendation:
    """Ranked configurations that fit (see the module docstring for the search)."""
    if isinstance(req, Scenario):
        req = RecommendRequest(scenario=req, **kw)
    t0 = time.perf_counter()
    s = _setup(req)
    k = req.max_candidates
    found = _run(s, enumerate_combos(req.scenario, False), k)
    method_change = False
    notes: list[str] = []
    if not found and req.allow_method_change:
        notes.append("the requested training method fits in no configuration; showing method changes")
        s.tried_method_change = True
        found = _run(s, enumerate_combos(req.scenario, True), k)
        method_change = bool(found)
    elif not found:
        notes.append("nothing fits; set allow_method_change to consider 8-bit AdamW, LoRA or QLoRA")
    cands = [_candidate(i + 1, f, s, req) for i, f in enumerate(found[:k])]
    explanation = _explain(s, found, req) if found else _explain_none(s)
    stats = SearchStats(**s.stats, elapsed_s=time.perf_counter() - t0)
    return Recommendation(candidates=cands, explanation=explanation, gpu_memory_bytes=s.gpu_memory,
                          usable_bytes=s.usable, target_global_batch_sequences=s.target_seqs,
                          method_change=method_change, stats=stats, notes=notes)


def _candidate(rank: int, f: _Found, s: _Search, req: RecommendRequest) -> Candidate:
    sc = scenario_for(s.base, f.combo, f.mb, f.ga)
    est = f.fit.est
    assert est is not None
    sp = to_estimate(f.raw, s.hw, s.assumptions)
    return Candidate(
        rank=rank, label=label(f.combo, f.mb, f.ga, s.base.mode), scenario=sc,
        method_change=is_method_change(f.combo, s.base.training), global_batch_tokens=sp.tokens_per_step,
        tokens_per_s_per_gpu=sp.tokens_per_s_per_gpu, tokens_per_s=sp.tokens_per_s, step_s=sp.step_s,
        peak_allocated_bytes=est.peak_allocated_bytes, device_total_expected_bytes=est.device_total_bytes.expected,
        device_total_high_bytes=est.device_total_bytes.high, usable_bytes=s.usable, cpu_ram_bytes=est.cpu_ram_bytes,
        speed=sp)


# ---- words --------------------------------------------------------------------------------------

def _ckpt_words(c: Combo) -> str:
    if c.ckpt == Checkpointing.none:
        return "no checkpointing"
    if c.ckpt == Checkpointing.selective:
        return "selective checkpointing"
    return "full checkpointing" + (f" (1 in {c.every} layers)" if c.every > 1 else "")


def _off_words(c: Combo) -> str:
    parts = []
    if c.off_opt != Offload.none:
        parts.append(f"optimizer offload to {c.off_opt.value.upper() if c.off_opt == Offload.cpu else 'NVMe'}")
    if c.off_par != Offload.none:
        parts.append(f"parameter offload to {c.off_par.value.upper() if c.off_par == Offload.cpu else 'NVMe'}")
    return " + ".join(parts)


def _method_words(c: Combo) -> str:
    if c.lora is not None:
        return ("QLoRA" if c.lora.base_weights == "nf4" else "LoRA" if c.lora.base_weights == "bf16"
                else "int8 LoRA") + f" r{c.lora.rank}"
    if c.optimizer == Optimizer.adamw_8bit:
        return "8-bit AdamW"
    return ""


def short_label(c: Combo) -> str:
    """'ZeRO-2 + full checkpointing' style name of a combination."""
    parts = [f"ZeRO-{c.zero}" if c.zero else "no ZeRO (DDP)", _ckpt_words(c)]
    if c.off_opt != Offload.none or c.off_par != Offload.none:
        parts.append(_off_words(c))
    if c.tp > 1 or c.pp > 1:
        parts.append(f"TP {c.tp} x PP {c.pp}")
    m = _method_words(c)
    if m:
        parts.insert(0, m)
    return " + ".join(parts)


def label(c: Combo, mb: int, ga: int, mode: Mode = Mode.train) -> str:
    att = "" if c.attention == Attention.sdpa else ", eager attention"
    batch = f"micro-batch {mb} x {ga} accumulation" if mode == Mode.train else f"batch {mb}"
    return f"{c.precision.value}, {short_label(c)}{att}, {batch}"


def _diff(a: Combo, b: Combo) -> str:
    """How b differs from a, in words ('ZeRO-3', 'without checkpointing', ...)."""
    out = []
    if a.zero != b.zero:
        out.append(f"ZeRO-{b.zero}" if b.zero else "without ZeRO")
    if (a.ckpt, a.every) != (b.ckpt, b.every):
        out.append("without checkpointing" if b.ckpt == Checkpointing.none else _ckpt_words(b))
    if (a.off_opt, a.off_par) != (b.off_opt, b.off_par):
        out.append("with " + _off_words(b) if _off_words(b) else "without offload")
    if (a.tp, a.pp) != (b.tp, b.pp):
        out.append(f"TP {b.tp} x PP {b.pp}")
    if a.precision != b.precision:
        out.append(b.precision.value)
    if (a.optimizer, a.lora_key) != (b.optimizer, b.lora_key):
        out.append(_method_words(b) or "full fine-tuning")
    return " + ".join(out) or "the same"


def _why_slower(w: _Raw, o: _Raw, interconnect: str) -> str:
    d_comp, d_comm, d_off = o.compute_s - w.compute_s, o.comm_s - w.comm_s, o.offload_s - w.offload_s
    biggest = max((d_comp, "compute"), (d_comm, "comm"), (d_off, "offload"))[1]
    if biggest == "comm":
        return f"more exposed communication over {interconnect}"
    if biggest == "offload":
        return "offload traffic and CPU Adam"
    return "recomputation" if o.exec_fpt > w.exec_fpt else "pipeline bubbles and smaller micro-batches"


def _explain(s: _Search, found: list[_Found], req: RecommendRequest) -> str:
    w = found[0]
    tps = w.raw.tokens_per_s / s.hw.num_gpus
    need = w.fit.est.device_total_bytes.expected if w.fit.est else 0
    head = (f"{short_label(w.combo)}: the fastest configuration that fits ({tps:,.0f} tokens/s per GPU, "
            f"{fmt_gib(need)} of {fmt_gib(s.usable)} usable)")
    clauses = []
    faster = [(ub, c, f) for ub, c, f in s.infeasible if ub > w.raw.tokens_per_s and f.est is not None]
    if faster:
        def closeness(e):
            return (_ndiff(w.combo, e[1]), -e[0])
        ub, c, f = min(faster, key=closeness)
        need_txt = (f"{fmt_gib(f.est.cpu_ram_bytes)} of host RAM per node" if f.reason.startswith("offload")
                    else f"{fmt_gib(f.est.device_total_bytes.expected)} per GPU")
        clauses.append(f"{_diff(w.combo, c)} would be {_pct(ub / w.raw.tokens_per_s - 1)} faster but needs "
                       f"{need_txt} (usable {fmt_gib(s.usable if not f.reason.startswith('offload') else s.cpu_ram or 0)})")
    alt = _slower_alternative(s, w)
    if alt is not None:
        o, oraw = alt
        slower = 1 - oraw.tokens_per_s / w.raw.tokens_per_s
        if slower < 0.001:
            clauses.append(f"{_diff(w.combo, o)} would fit too and is as fast; the simpler setup is listed first")
        else:
            link = oraw.interconnect if oraw.interconnect != "none" else "the links"
            clauses.append(f"{_diff(w.combo, o)} would fit too but is {_pct(slower)} slower "
                           f"({_why_slower(w.raw, oraw, link)})")
    return head + ("; " + "; ".join(clauses) if clauses else "") + "."


def _pct(x: float) -> str:
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def _ndiff(a: Combo, b: Combo) -> int:
    return sum(getattr(a, k) != getattr(b, k) for k in ("precision", "ckpt", "every", "zero", "off_opt", "off_par",
                                                        "tp", "pp", "optimizer", "lora_key"))


def _slower_alternative(s: _Search, w: _Found) -> tuple[Combo, _Raw] | None:
    """The fastest other ZeRO stage (same everything else, same micro-batch) that fits."""
    best = None
    per = w.mb * w.ga if s.base.mode == Mode.train else w.mb
    for z in (0, 1, 2, 3):
        if z == w.combo.zero or (w.combo.pp > 1 and z > 1) or (w.combo.precision.is_amp and z > 0):
            continue
        oo = w.combo.off_opt if z >= 1 else Offload.none
        op = w.combo.off_par if z == 3 else Offload.none
        c = w.combo.with_(zero=z, off_opt=oo, off_par=op)
        if s.hw.num_gpus // (c.tp * c.pp) == 1 and z > 0 and oo == Offload.none and op == Offload.none:
            continue
        f = s.fit(c, w.mb, w.ga)
        if not f.ok:
            continue
        raw = s.speed(c, w.mb, per)
        if raw.tokens_per_s <= w.raw.tokens_per_s and (best is None or raw.tokens_per_s > best[1].tokens_per_s):
            best = (c, raw)
    return best


def _explain_none(s: _Search) -> str:
    tried = [(c, f) for _, c, f in s.infeasible] + s.frugal_failures
    tried = [(c, f) for c, f in tried if f.est is not None]
    also = " (8-bit AdamW, LoRA and QLoRA included)" if s.tried_method_change else ""
    if not tried:
        return f"nothing fits{also}: no valid configuration for this model and hardware."
    c, f = min(tried, key=lambda e: f_need(e[1]))
    return f"nothing fits{also}: the smallest configuration tried ({short_label(c)}, micro-batch 1) {f.reason}."


def f_need(f: _Fit) -> int:
    return f.est.device_total_bytes.expected if f.est is not None else 1 << 62


# ---- the model x hardware table -----------------------------------------------------------------

class TableCell(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    hardware: str
    status: Literal["fits", "method-change", "nothing-fits"]
    label: str = Field(description="the fastest configuration, or why nothing fits")
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s: float | None = None
    device_total_expected_bytes: int | None = None
    usable_bytes: int
    scenario: Scenario | None = None
    note: str = ""


class Table(BaseModel):
    """Rows = models, columns = hardware; every cell comes from `recommend`, none is typed in."""

    model_config = ConfigDict(extra="forbid")

    models: list[str]
    hardware: list[str]
    cells: list[list[TableCell]]
    assumptions: str

    def to_markdown(self) -> str:
        head = "| model | " + " | ".join(self.hardware) + " |"
        sep = "|---" * (len(self.hardware) + 1) + "|"
        rows = []
        for m, row in zip(self.models, self.cells, strict=True):
            cells = []
            for c in row:
                if c.status == "nothing-fits":
                    cells.append(f"does not fit ({c.note})" if c.note else "does not fit")
                else:
                    cells.append(f"{c.label}; {c.tokens_per_s_per_gpu:,.0f} tok/s/GPU"
                                 + (" (method change)" if c.status == "method-change" else ""))
            rows.append(f"| {m} | " + " | ".join(cells) + " |")
        return "\n".join([head, sep, *rows, "", self.assumptions])


def _hardware_config(hw_id: str) -> HardwareConfig:
    if hw_id in cluster_presets():
        return HardwareConfig(cluster=hw_id)
    if hw_id in gpu_presets():
        return HardwareConfig(gpu=hw_id)
    raise ValueError(f"unknown hardware {hw_id!r}: give a cluster preset (e.g. 8x-a100-80gb) or a GPU preset")


def recommendation_table(models: list[str] | tuple[str, ...] = TABLE_MODELS,
                         hardware: list[str] | tuple[str, ...] = TABLE_HARDWARE, *,
                         seq_len: int = TABLE_SEQ_LEN, global_batch_tokens: int = TABLE_GLOBAL_BATCH_TOKENS,
                         safety_margin: float = DEFAULT_SAFETY_MARGIN) -> Table:
    """Fastest full fine-tuning configuration (AdamW) per model x hardware; where none fits, whether LoRA
    or QLoRA would (and how fast)."""
    cells: list[list[TableCell]] = []
    for m in models:
        row = []
        for h in hardware:
            sc = Scenario(model=m, hardware=_hardware_config(h), training=TrainingConfig(seq_len=seq_len))
            req = RecommendRequest(scenario=sc, global_batch_tokens=global_batch_tokens, safety_margin=safety_margin,
                                   max_candidates=1, allow_method_change=True)
            rec = recommend(req)
            if rec.candidates and not rec.method_change:
                c = rec.candidates[0]
                row.append(TableCell(model=m, hardware=h, status="fits", label=_cell_label(c), usable_bytes=rec.usable_bytes,
                                     tokens_per_s_per_gpu=c.tokens_per_s_per_gpu, tokens_per_s=c.tokens_per_s,
                                     device_total_expected_bytes=c.device_total_expected_bytes, scenario=c.scenario))
            elif rec.candidates:
                c = rec.candidates[0]
                row.append(TableCell(model=m, hardware=h, status="method-change", label=_cell_label(c),
                                     usable_bytes=rec.usable_bytes, tokens_per_s_per_gpu=c.tokens_per_s_per_gpu,
                                     tokens_per_s=c.tokens_per_s, device_total_expected_bytes=c.device_total_expected_bytes,
                                     scenario=c.scenario, note="full fine-tuning does not fit"))
            else:
                row.append(TableCell(model=m, hardware=h, status="nothing-fits", label=rec.explanation,
                                     usable_bytes=rec.usable_bytes, note="not even QLoRA"))
        cells.append(row)
    text = (f"Each cell: the fastest configuration found by calc.recommend for full fine-tuning with AdamW, "
            f"{seq_len}-token sequences and a {global_batch_tokens:,}-token global batch, fitting in "
            f"(1 - {safety_margin:g}) x GPU memory; where none fits, LoRA/QLoRA/8-bit AdamW are tried. "
            "Speeds come from calc.speed (MFU 0.40 assumed).")
    return Table(models=list(models), hardware=list(hardware), cells=cells, assumptions=text)


def _cell_label(c: Candidate) -> str:
    t = c.scenario.training
    return f"{short_label(combo_of(t))}, {t.precision.value}, mb {t.micro_batch_size} x {t.gradient_accumulation_steps}"


# ---- the waterfall ------------------------------------------------------------------------------

class WaterfallStep(BaseModel):
    """The scenario after turning on one more optimization, cumulatively."""

    model_config = ConfigDict(extra="forbid")

    step: int
    name: str
    change: str = Field(description="what this step turns on")
    scenario: Scenario
    method_change: bool
    peak_allocated_bytes: int
    device_total_expected_bytes: int
    device_total_high_bytes: int
    cpu_ram_bytes: int = Field(description="host RAM per node the offload needs")
    fits: bool | None = Field(description="expected device total <= (1 - margin) x GPU memory and offload within "
                                          "the node's host RAM (None: no GPU memory known)")
    tokens_per_s_per_gpu: float | None
    step_s: float | None


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
    Micro-batch, accumulation, sequence length and TP/PP stay as in `sc`."""
    a = assumptions or SpeedAssumptions()
    t = sc.training
    hwc = sc.resolved_hardware()
    gpu = gpu_presets().get(hwc.gpu) if hwc.gpu else None
    mem = hwc.memory_bytes or (gpu.memory_bytes if gpu else None)
    ram = hwc.cpu_ram_bytes
    dp, pp1 = sc.data_parallel, t.pipeline_parallel == 1
    bf16 = gpu is None or (gpu.bf16 and gpu.bf16_tflops > 0)
    mixed = Precision.bf16_mixed if bf16 else Precision.fp16_mixed
    amp = Precision.amp_bf16 if bf16 else Precision.amp_fp16
    opt = Optimizer.adamw if t.optimizer == Optimizer.adamw_8bit else t.optimizer
    cur: dict[str, Any] = t.model_dump()
    cur.update(precision=Precision.fp32, attention=Attention.eager, activation_checkpointing=Checkpointing.none,
               checkpoint_every=1, zero_stage=0, offload_optimizer=Offload.none, offload_params=Offload.none,
               optimizer=opt, lora=None)
    no_offload_zero = (3 if pp1 else 1) if dp > 1 else 0
    plan: list[tuple[str, str, dict[str, Any], bool]] = [
        ("baseline", "fp32 weights, eager attention, no checkpointing, plain data parallel", {}, False),
        ("mixed precision", f"{mixed.value}: 16-bit weights, grads and activations; fp32 master + states",
         {"precision": mixed}, False),
        ("FlashAttention / SDPA", "the B x heads x S x S scores are never stored",
         {"attention": Attention.sdpa if sc.spec.sdpa_supported else Attention.eager}, False),
        ("activation checkpointing", "full: keep each layer's input, recompute its forward in backward",
         {"activation_checkpointing": Checkpointing.full}, False),
    ]
    if dp > 1:
        plan.append(("ZeRO-1", f"optimizer states + master weights sharded over {dp} ranks", {"zero_stage": 1}, False))
        if pp1:
            plan.append(("ZeRO-2", "+ gradients sharded", {"zero_stage": 2}, False))
            plan.append(("ZeRO-3", "+ 16-bit weights sharded", {"zero_stage": 3}, False))
    plan.append(("optimizer offload", "optimizer states + fp32 master weights in CPU RAM, CPU Adam (ZeRO-Offload)",
                 {"zero_stage": max(no_offload_zero, 2 if pp1 else 1), "offload_optimizer": Offload.cpu}, False))
    if pp1:
        plan.append(("parameter offload", "16-bit weights in CPU RAM (ZeRO-3 offload_param)",
                     {"zero_stage": 3, "offload_params": Offload.cpu}, False))
    back = {"offload_optimizer": Offload.none, "offload_params": Offload.none, "zero_stage": no_offload_zero}
    plan += [
        ("8-bit optimizer", "bitsandbytes AdamW8bit: 2 x 1-byte states on the GPU instead of offload",
         {**back, "optimizer": Optimizer.adamw_8bit}, True),
        ("LoRA", "frozen bf16 base weights, rank-16 adapters on all linear layers",
         {**back, "optimizer": opt, "lora": DEFAULT_LORA, "precision": amp if no_offload_zero == 0 else mixed}, True),
        ("QLoRA", "frozen base weights in 4-bit NF4 (not partitioned by ZeRO-3)",
         {**back, "optimizer": opt, "lora": DEFAULT_QLORA, "precision": amp, "zero_stage": min(no_offload_zero, 2)},
         True),
    ]
    out: list[WaterfallStep] = []
    for i, (name, change, upd, method) in enumerate(plan):
        cur.update(upd)
        s2 = Scenario(model=sc.model, hardware=sc.hardware, mode=sc.mode, training=TrainingConfig(**cur))
        est = estimate(s2)
        need = est.device_total_bytes.expected
        sp = None
        if gpu is not None:
            hw = hardware_of(s2)
            sp = to_estimate(step_time(s2.spec, s2.training, hw, s2.mode, a), hw, a)
        out.append(WaterfallStep(
            step=i, name=name, change=change, scenario=s2, method_change=method,
            peak_allocated_bytes=est.peak_allocated_bytes, device_total_expected_bytes=need,
            device_total_high_bytes=est.device_total_bytes.high, cpu_ram_bytes=est.cpu_ram_bytes,
            fits=None if mem is None else (need <= mem * (1 - safety_margin)
                                           and (ram is None or est.cpu_ram_bytes <= ram)
                                           and (hwc.nvme_bytes is None or est.nvme_bytes <= hwc.nvme_bytes)),
            tokens_per_s_per_gpu=sp.tokens_per_s_per_gpu if sp else None, step_s=sp.step_s if sp else None))
    return out


# ---- CLI ----------------------------------------------------------------------------------------

def load_request(path: str, top: int | None = None) -> RecommendRequest:
    """A scenario file, or a RecommendRequest file (a JSON object with a "scenario" key)."""
    from calc.__main__ import load_scenario, read_json
    from calc.boundary import validate

    data = read_json(path)
    if isinstance(data, dict) and "scenario" in data:
        if top is not None:
            data = {**data, "max_candidates": top}
        return validate(RecommendRequest, data, "stdin" if path == "-" else path)
    sc = load_scenario(path, data)
    return RecommendRequest(scenario=sc, max_candidates=top or 10)


def format_recommendation(rec: Recommendation) -> str:
    lines = []
    hdr = f"{'#':>2}  {'tok/s/GPU':>10}  {'step s':>8}  {'device total':>13}  configuration"
    lines.append(hdr)
    for c in rec.candidates:
        lines.append(f"{c.rank:>2}  {c.tokens_per_s_per_gpu:>10,.0f}  {c.step_s:>8.3g}  "
                     f"{c.device_total_expected_bytes / GiB:>9.2f} GiB  {c.label}"
                     + ("  [method change]" if c.method_change else ""))
    if not rec.candidates:
        lines.append("    (nothing fits)")
    lines.append("")
    lines.append(rec.explanation)
    for n in rec.notes:
        lines.append(f"note: {n}")
    st = rec.stats
    lines.append(f"(usable {fmt_gib(rec.usable_bytes)} of {fmt_gib(rec.gpu_memory_bytes)} per GPU; "
                 f"global batch {rec.target_global_batch_sequences} sequences; searched {st.combinations} "
                 f"combinations with {st.memory_estimates} memory estimates in {st.elapsed_s:.2f} s; "
                 "1 GiB = 2^30 bytes)")
    return "\n".join(lines)


def cli_main(args: Any) -> int:
    """python -m calc recommend FILE [--top N] [--format table|json]. Errors leave as ValueError: under
    `python -m calc` the running module is __main__, so calc.__main__.UserError raised here would be a
    different class from the one main() catches; main() maps ValueError to one line and exit code 2."""
    from calc.errors import UserError

    try:
        req = load_request(args.scenario, getattr(args, "top", None))
        rec = recommend(req)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    if getattr(args, "format", "table") == "json":
        print(rec.model_dump_json(indent=2))
    else:
        print(format_recommendation(rec))
    return 0

"""The Explain page's numbers: the current scenario and its what-ifs run through calc/ (engine,
per_param, speed, claims), returned as plain dicts (and Estimates) so they cache cheaply. Every
what-if goes through `what_if` (calc.contract.variant), so the whole page has one way to make a variant."""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from calc.contract import parallel
from calc.contract.i18n import T_, Text
from calc.contract.presets import gpu_presets
from calc.contract.scenario import (
    Attention,
    Checkpointing,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Scenario,
)
from calc.contract.units import GiB
from calc.contract.variant import variant
from calc.memory.engine import autocast_weight_copies_bytes, estimate
from calc.memory.per_param import bytes_per_param
from calc.memory.result import CATEGORIES, Estimate
from calc.memory.verdict import Verdict
from calc.speed import estimate_speed, hardware_of

ZERO_SWEEP_GPUS = (1, 2, 4, 8, 16, 32, 64)
SEQ_SWEEP = (512, 1024, 2048, 4096, 8192, 16384, 32768)
NO_OFFLOAD = {"offload_optimizer": Offload.none, "offload_params": Offload.none}


def what_if(sc: Scenario | None, *, hardware: dict[str, Any] | None = None, mode: str | None = None,
            **training: Any) -> Scenario | None:
    """The one way this page makes a variant of the scenario (None when it is not valid)."""
    return None if sc is None else variant(sc, hardware=hardware, mode=mode, **training)


def hardware_label(sc: Scenario) -> Text:
    """'8 x NVIDIA A100 80GB', translatable (the page renders it with ui.language.say)."""
    hw = sc.resolved_hardware()
    if hw.gpu:
        return T_("{n} x {gpu}", n=hw.num_gpus, gpu=gpu_presets()[hw.gpu].name)
    if hw.memory_bytes:
        return T_("{n} x custom {gib} GiB GPU", n=hw.num_gpus, gib=f"{hw.memory_bytes / GiB:,.2f}")
    return T_("no GPU")


def table_verdict(est: Estimate) -> Verdict | None:
    """The one verdict for a table cell (the page words it with calc.memory.verdict.short in its language); None
    without a GPU size."""
    return None if est.gpu_memory_bytes is None else est.verdict


def summary(sc: Scenario, est: Estimate) -> dict[str, Any]:
    b = est.breakdown
    return {
        "peak": est.peak_allocated_bytes, "device": est.device_total_bytes.expected,
        "device_low": est.device_total_bytes.low, "device_high": est.device_total_bytes.high,
        "fits": est.verdict.fits, "verdict": table_verdict(est), "headroom": est.headroom_bytes,
        "gpu": est.gpu_memory_bytes, "event": est.peak_event, "phase": est.peak_phase, "cpu_ram": est.cpu_ram_bytes,
        "nvme": est.nvme_bytes, "trainable": est.model.trainable_params, **{c: getattr(b, c) for c in CATEGORIES},
        **{f"max_{c}": max(getattr(est.timeline, c)) for c in CATEGORIES},
    }


def run(sc: Scenario | None) -> dict[str, Any] | None:
    if sc is None:
        return None
    try:
        return summary(sc, estimate(sc))
    except ValueError:
        return None


def speed(sc: Scenario | None) -> dict[str, Any] | None:
    if sc is None or not sc.resolved_hardware().gpu:
        return None
    try:
        s = estimate_speed(sc)
    except ValueError:
        return None
    terms = {t.key: t.total_seconds for t in s.terms}
    return {"step_s": s.step_s, "tokens_per_s_per_gpu": s.tokens_per_s_per_gpu, "offload_s": s.offload_s,
            "model_fpt": s.model_flops_per_token, "exec_fpt": s.executed_flops_per_token,
            "dp_comm_s": terms.get("dp_comm"), "interconnect": s.interconnect}


def per_param(sc: Scenario | None) -> dict[str, Any] | None:
    return None if sc is None else bytes_per_param(sc).model_dump()


def multi_gpu_hardware(sc: Scenario, n: int) -> tuple[dict[str, Any], bool]:
    """Hardware with n GPUs of the scenario's kind (A100 80GB when it names none), and whether that
    differs from the scenario's own hardware (the page says so)."""
    hw = sc.resolved_hardware()
    if hw.num_gpus == n:
        return sc.hardware.model_dump(mode="json", exclude_none=True), False
    if hw.gpu:
        return {"gpu": hw.gpu, "num_gpus": n, **({"cpu_ram_bytes": hw.cpu_ram_bytes} if hw.cpu_ram_bytes else {})}, True
    if hw.memory_bytes:
        return {"memory_bytes": hw.memory_bytes, "num_gpus": n}, True
    return {"gpu": "a100-80gb", "num_gpus": n}, True


def _train(sc: Scenario) -> dict[str, Any]:
    return {"mode": Mode.train.value} if sc.mode != Mode.train else {}


# ---- sections ------------------------------------------------------------------------------

BPP_ZERO_GPUS = 8  # the bytes-per-parameter table's data-parallel size when a ZeRO stage is chosen


def bytes_per_param_rows(sc: Scenario, zero_stage: int = 0) -> list[dict[str, Any]]:
    """Full fine-tuning of this model by precision x optimizer x implementation: on one GPU without
    ZeRO, or sharded by `zero_stage` over BPP_ZERO_GPUS data-parallel GPUs."""
    one = dict(zero_stage=zero_stage, tensor_parallel=1, pipeline_parallel=1, lora=None, sharding="deepspeed",
               **NO_OFFLOAD)
    if zero_stage:
        sc = what_if(sc, hardware=multi_gpu_hardware(sc, BPP_ZERO_GPUS)[0]) or sc
    combos = [(Precision.fp32, Optimizer.adamw, OptimizerImpl.foreach),
              (Precision.fp32, Optimizer.adamw, OptimizerImpl.fused),
              (Precision.amp_bf16, Optimizer.adamw, OptimizerImpl.foreach),
              (Precision.bf16_mixed, Optimizer.adamw, OptimizerImpl.foreach),
              (Precision.bf16_mixed, Optimizer.adamw, OptimizerImpl.fused),
              (Precision.bf16_mixed, Optimizer.adamw_8bit, OptimizerImpl.foreach),
              (Precision.bf16, Optimizer.adamw, OptimizerImpl.foreach),
              (Precision.bf16, Optimizer.adamw, OptimizerImpl.fused),
              (Precision.bf16, Optimizer.adamw_8bit, OptimizerImpl.foreach)]
    rows = []
    for p, opt, impl in combos:
        b = per_param(what_if(sc, mode=Mode.train.value, precision=p, optimizer=opt, optimizer_impl=impl, **one))
        if b is not None:
            rows.append(b)
    return rows


def optimizer_rows(sc: Scenario) -> list[dict[str, Any]]:
    rows = []
    for opt in Optimizer:
        impls = [OptimizerImpl.foreach, OptimizerImpl.fused] if opt in (Optimizer.adamw, Optimizer.adam) \
            else [OptimizerImpl.foreach]
        for impl in impls:
            v_sc = what_if(sc, optimizer=opt, optimizer_impl=impl, lora=None, **_train(sc))
            b, v = per_param(v_sc), run(v_sc)
            if b is None:
                continue
            rows.append({"optimizer": opt.value, "impl": impl.value, "states_per_param": b["optimizer_states"],
                         "states": round(b["optimizer_states"] * b["params"]),
                         "scratch": round(b["optimizer_temporaries"] * b["params"]), "run": v})
    return rows


def precision_rows(sc: Scenario) -> list[dict[str, Any]]:
    rows = []
    for p in Precision:
        v_sc = what_if(sc, precision=p, lora=None, **_train(sc))
        b, v = per_param(v_sc), run(v_sc)
        if v_sc is None or v is None:
            continue
        rows.append({"precision": p.value, "per_param": b, "run": v,
                     "autocast_copies": autocast_weight_copies_bytes(v_sc)})
    return rows


def checkpointing_rows(sc: Scenario) -> tuple[list[dict[str, Any]], int]:
    k_sqrt = max(2, round(math.sqrt(sc.spec.num_layers)))
    plans = [(T_("none"), {"activation_checkpointing": Checkpointing.none}),
             (T_("every layer"), {"activation_checkpointing": Checkpointing.full, "checkpoint_every": 1}),
             (T_("every 2nd layer"), {"activation_checkpointing": Checkpointing.full, "checkpoint_every": 2}),
             (T_("every {k}th layer", k=k_sqrt),
              {"activation_checkpointing": Checkpointing.full, "checkpoint_every": k_sqrt}),
             (T_("selective (attention core)"), {"activation_checkpointing": Checkpointing.selective})]
    rows = []
    for label, kw in plans:
        v_sc = what_if(sc, **kw, **_train(sc))
        v, s = run(v_sc), speed(v_sc)
        if v is None:
            continue
        rows.append({"label": label, "run": v, "speed": s,
                     "recompute": None if not s or not s["model_fpt"] else s["exec_fpt"] / s["model_fpt"] - 1})
    return rows, k_sqrt


def attention_rows(sc: Scenario) -> list[dict[str, Any]]:
    seqs = sorted({*SEQ_SWEEP, sc.training.seq_len})
    rows = []
    for seq in seqs:
        row: dict[str, Any] = {"seq": seq, "current": seq == sc.training.seq_len}
        for kind in (Attention.eager, Attention.sdpa):
            row[kind.value] = run(what_if(sc, attention=kind, seq_len=seq))
        if row["eager"] and row["sdpa"]:
            rows.append(row)
    return rows


def zero_figures(sc: Scenario) -> dict[str, Any]:
    """ZeRO 0-3 on the scenario's hardware (8 of its GPU when it has one), and the sweep over N."""
    n = sc.data_parallel * sc.training.tensor_parallel * sc.training.pipeline_parallel
    hw, switched = (sc.hardware.model_dump(mode="json", exclude_none=True), False) if sc.data_parallel > 1 \
        else multi_gpu_hardware(sc, 8)
    zsc = what_if(sc, hardware=hw, **NO_OFFLOAD, **_train(sc))
    rows = []
    for stage in range(4):
        v_sc = what_if(zsc, zero_stage=stage)
        b, v, s = per_param(v_sc), run(v_sc), speed(v_sc)
        rows.append({"stage": stage, "per_param": b, "run": v, "comm_s": s["dp_comm_s"] if s else None,
                     "interconnect": s["interconnect"] if s else None})
    sweep: dict[int, list[tuple[int, int | None]]] = {}
    for stage in range(4):
        pts = []
        for gpus in ZERO_SWEEP_GPUS:
            h, _ = multi_gpu_hardware(sc, gpus)
            v = run(what_if(zsc, hardware=h, zero_stage=stage, tensor_parallel=1, pipeline_parallel=1))
            pts.append((gpus, v["device"] if v else None))
        sweep[stage] = pts
    return {"label": hardware_label(zsc) if zsc else None, "switched": switched, "own_gpus": n,
            "dp": zsc.data_parallel if zsc else None, "rows": rows, "sweep": sweep,
            "gpu_bytes": rows[0]["run"]["gpu"] if rows[0]["run"] else None,
            "bucket": parallel.REDUCE_BUCKET_ELEMENTS, "prefetch": parallel.STAGE3_PREFETCH_ELEMENTS,
            "max_live": parallel.STAGE3_MAX_LIVE_PARAMETERS, "persistence": parallel.STAGE3_PARAM_PERSISTENCE_THRESHOLD}


def offload_rows(sc: Scenario) -> list[dict[str, Any]]:
    z_opt = max(sc.training.zero_stage, 1)
    plans = [(T_("no offload"), dict(NO_OFFLOAD)),
             (T_("optimizer -> CPU (ZeRO-{stage})", stage=z_opt),
              {"zero_stage": z_opt, "offload_optimizer": Offload.cpu, "offload_params": Offload.none}),
             (T_("optimizer + parameters -> CPU (ZeRO-3)"), {"zero_stage": 3, "offload_optimizer": Offload.cpu,
                                                              "offload_params": Offload.cpu}),
             (T_("optimizer + parameters -> NVMe (ZeRO-3)"), {"zero_stage": 3, "offload_optimizer": Offload.nvme,
                                                               "offload_params": Offload.nvme})]
    rows = []
    for label, kw in plans:
        v_sc = what_if(sc, **kw, **_train(sc))
        v = run(v_sc)
        if v is not None:
            rows.append({"label": label, "run": v, "speed": speed(v_sc)})
    return rows


def parallel_rows(sc: Scenario) -> list[dict[str, Any]]:
    spec = sc.spec
    plans = [(T_("tensor parallel {degree}", degree=d), d, {"tensor_parallel": d})
             for d in (1, 2, 4, 8) if spec.num_heads % d == 0]
    plans += [(T_("tensor parallel 8 + sequence parallel"), 8, {"tensor_parallel": 8, "sequence_parallel": True})
              if spec.num_heads % 8 == 0 else None]
    plans += [(T_("pipeline parallel {degree}", degree=d), d, {"pipeline_parallel": d})
              for d in (2, 4) if spec.num_layers >= d]
    rows = []
    for plan in filter(None, plans):
        label, deg, kw = plan
        hw, _ = multi_gpu_hardware(sc, deg)
        v_sc = what_if(sc, hardware=hw, zero_stage=0, tensor_parallel=kw.get("tensor_parallel", 1),
                       pipeline_parallel=kw.get("pipeline_parallel", 1),
                       sequence_parallel=kw.get("sequence_parallel", False), **NO_OFFLOAD, **_train(sc))
        v = run(v_sc)
        if v is not None:
            rows.append({"label": label, "hardware": hardware_label(v_sc), "run": v})
    return rows


EXPERT_PARALLEL_GPUS = 8  # the expert-parallel table's GPU count (one node)


def expert_parallel_rows(sc: Scenario) -> list[dict[str, Any]]:
    """A MoE model on one node of 8 GPUs under FSDP2 ZeRO-3, its experts split over 1, 2, 4 and 8 of them."""
    spec = sc.spec
    if spec.num_experts == 1:
        return []
    hw, _ = multi_gpu_hardware(sc, EXPERT_PARALLEL_GPUS)
    rows = []
    for ep in (d for d in (1, 2, 4, 8) if spec.num_experts % d == 0):
        v_sc = what_if(sc, hardware=hw, zero_stage=3, sharding="fsdp2", expert_parallel=ep, tensor_parallel=1,
                       pipeline_parallel=1, sequence_parallel=False, **NO_OFFLOAD, **_train(sc))
        v = run(v_sc)
        if v is not None:
            rows.append({"ep": ep, "hardware": hardware_label(v_sc), "run": v})
    return rows


def lora_rows(sc: Scenario) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    t = sc.training
    full_p = Precision.amp_bf16 if t.precision.is_mixed else t.precision
    lora = []
    for label, lo in ((T_("full fine-tune"), None), (T_("LoRA r=16, bf16 base"), {"rank": 16, "base_weights": "bf16"}),
                      (T_("LoRA r=16, int8 base"), {"rank": 16, "base_weights": "int8"}),
                      (T_("QLoRA r=16, nf4 base"), {"rank": 16, "base_weights": "nf4"})):
        kw: dict[str, Any] = {"lora": lo}
        if lo and lo["base_weights"] != "bf16":
            kw.update(precision=full_p, zero_stage=min(t.zero_stage, 2), offload_params=Offload.none)
        v = run(what_if(sc, **kw, **_train(sc)))
        if v is not None:
            lora.append({"label": label, "run": v})
    inf = []
    for label, lo in ((T_("bf16 weights"), None), (T_("int8 weights"), {"base_weights": "int8"}),
                      (T_("nf4 4-bit weights"), {"base_weights": "nf4"})):
        v = run(what_if(sc, mode=Mode.inference.value, lora=lo, zero_stage=0, precision=Precision.bf16, **NO_OFFLOAD))
        if v is not None:
            inf.append({"label": label, "run": v})
    return lora, inf


@st.cache_data(max_entries=64, show_spinner=False)
def bytes_per_param_table(scenario_json: str, zero_stage: int) -> list[dict[str, Any]]:
    return bytes_per_param_rows(Scenario.model_validate_json(scenario_json), zero_stage)


@st.cache_data(max_entries=32, show_spinner=False)
def figures(scenario_json: str) -> dict[str, Any]:
    """Everything the lessons quote for one scenario (cached: a few hundred engine runs)."""
    sc = Scenario.model_validate_json(scenario_json)
    spec = sc.spec
    hw = sc.resolved_hardware()
    gpu = gpu_presets().get(hw.gpu) if hw.gpu else None
    est = estimate(sc)
    dt = est.device_total_bytes
    out: dict[str, Any] = {
        "params": spec.total_params(), "layers": spec.num_layers, "name": spec.name or spec.family,
        "hardware": hardware_label(sc), "gpu_bf16": gpu.bf16 if gpu else None, "host_ram": hw.cpu_ram_bytes,
        "mode": sc.mode.value, "active_params": spec.active_params(), "experts": spec.num_experts,
        "heads": spec.num_heads, "estimate": est, "base": summary(sc, est),
        "overhead": {"context": dt.cuda_context_bytes, "nccl": dt.workspace_bytes, "reserve_low": dt.reserve_low_bytes,
                     "reserve": dt.reserve_expected_bytes, "reserve_high": dt.reserve_high_bytes},
        "pcie": {"gen": gpu.pcie_gen, "bytes_per_s": gpu.pcie_bandwidth_bytes_per_s} if gpu else None,
    }
    out["category_max_sum"] = sum(out["base"][f"max_{c}"] for c in CATEGORIES)
    out["bytes_per_param"] = bytes_per_param_rows(sc)  # one GPU, no ZeRO: what the other lessons quote
    out["optimizers"] = optimizer_rows(sc)
    out["precisions"] = precision_rows(sc)
    out["checkpointing"], out["k_sqrt"] = checkpointing_rows(sc)
    out["attention"] = attention_rows(sc)
    out["zero"] = zero_figures(sc)
    out["offload"] = offload_rows(sc)
    try:
        out["nvme_bytes_per_s"] = hardware_of(sc).nvme_bytes_per_s if gpu else None
    except ValueError:
        out["nvme_bytes_per_s"] = None
    out["parallel"] = parallel_rows(sc)
    out["expert_parallel"] = expert_parallel_rows(sc)
    out["lora"], out["inference"] = lora_rows(sc)
    return out

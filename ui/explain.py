"""The Explain page's numbers: the current scenario and its variants run through calc/ (engine,
precision, parallel, speed), returned as plain dicts so they cache cheaply. Nothing is computed
here beyond picking variants and reading results; the page only formats them."""

from __future__ import annotations

import math
from typing import Any

import streamlit as st
from pydantic import ValidationError

from calc import parallel, precision
from calc.engine import estimate
from calc.presets import gpu_presets
from calc.result import CATEGORIES, Estimate
from calc.scenario import Attention, Checkpointing, Mode, Offload, Optimizer, OptimizerImpl, Precision, Scenario
from calc.speed import estimate_speed, hardware_of


def variant(sc: Scenario, *, hardware: dict[str, Any] | None = None, mode: str | None = None,
            **training: Any) -> Scenario | None:
    """`sc` with some fields replaced; None when that combination is not valid."""
    data = sc.model_dump(mode="json")
    if hardware is not None:
        data["hardware"] = hardware
    if mode is not None:
        data["mode"] = mode
    for k, v in training.items():
        data["training"][k] = v.value if hasattr(v, "value") else v
    try:
        return Scenario.model_validate(data)
    except (ValidationError, ValueError):
        return None


def summary(est: Estimate) -> dict[str, Any]:
    b = est.breakdown
    return {
        "peak": est.peak_allocated_bytes, "device": est.device_total_bytes.expected,
        "device_low": est.device_total_bytes.low, "device_high": est.device_total_bytes.high,
        "fits": est.fits, "headroom": est.headroom_bytes, "gpu": est.gpu_memory_bytes,
        "event": est.peak_event, "phase": est.peak_phase, "cpu_ram": est.cpu_ram_bytes, "nvme": est.nvme_bytes,
        "trainable": est.model.trainable_params, **{c: getattr(b, c) for c in CATEGORIES},
        "max_activations": max(est.timeline.activations),
    }


def run(sc: Scenario | None) -> dict[str, Any] | None:
    if sc is None:
        return None
    try:
        return summary(estimate(sc))
    except ValueError:
        return None


def speed(sc: Scenario | None) -> dict[str, Any] | None:
    if sc is None:
        return None
    try:
        s = estimate_speed(sc)
    except ValueError:
        return None
    terms = {t.key: t.total_seconds for t in s.terms}
    return {"step_s": s.step_s, "tokens_per_s_per_gpu": s.tokens_per_s_per_gpu, "comm_total_s": s.communication_total_s,
            "offload_s": s.offload_s, "model_fpt": s.model_flops_per_token, "exec_fpt": s.executed_flops_per_token,
            "dp_comm_s": terms.get("dp_comm"), "interconnect": s.interconnect, "compute_s": s.compute_s}


def _multi_gpu_hardware(sc: Scenario, n: int) -> dict[str, Any]:
    """The scenario's own hardware when it has >= n GPUs, else n of its GPU (A100 80GB if none)."""
    hw = sc.resolved_hardware()
    if hw.num_gpus >= n:
        return sc.hardware.model_dump(mode="json", exclude_none=True)
    if hw.gpu:
        return {"gpu": hw.gpu, "num_gpus": n}
    return {"memory_bytes": hw.memory_bytes, "num_gpus": n} if hw.memory_bytes else {"gpu": "a100-80gb", "num_gpus": n}


@st.cache_data(max_entries=64, show_spinner=False)
def figures(scenario_json: str) -> dict[str, Any]:
    sc = Scenario.model_validate_json(scenario_json)
    spec, t = sc.spec, sc.training
    hw = sc.resolved_hardware()
    gpu = gpu_presets().get(hw.gpu) if hw.gpu else None
    train = {"mode": Mode.train.value} if sc.mode != Mode.train else {}
    out: dict[str, Any] = {"params": spec.total_params(), "layers": spec.num_layers, "name": spec.name or spec.family,
                           "family": spec.family, "gpu_name": gpu.name if gpu else None,
                           "gpu_bf16": gpu.bf16 if gpu else None, "num_gpus": hw.num_gpus,
                           "host_ram": hw.cpu_ram_bytes, "mode": sc.mode.value,
                           "active_params": spec.active_params(), "experts": spec.num_experts,
                           "heads": spec.num_heads, "hidden": spec.hidden_size,
                           "max_positions": spec.max_position_embeddings}
    est = estimate(sc)
    base = summary(est)
    out["base"] = base
    dt = est.device_total_bytes
    out["overhead"] = {"context": dt.cuda_context_bytes, "nccl": dt.workspace_bytes,
                       "reserve_low": dt.reserve_low_bytes, "reserve": dt.reserve_expected_bytes,
                       "reserve_high": dt.reserve_high_bytes}
    tl = est.timeline
    out["category_max"] = {c: max(getattr(tl, c)) for c in CATEGORIES}
    out["category_max_sum"] = sum(out["category_max"].values())

    # optimizers: persistent state for full training of this model, and the engine's peak
    shapes = spec.param_shapes()
    p = t.precision
    opt_rows = []
    for opt in Optimizer:
        impl = OptimizerImpl.foreach if opt == Optimizer.adamw_8bit and t.optimizer_impl == OptimizerImpl.for_loop \
            else t.optimizer_impl
        states = precision.optimizer_state_bytes(opt, p, shapes)
        v = run(variant(sc, optimizer=opt, optimizer_impl=impl, lora=None, **train))
        opt_rows.append({"optimizer": opt.value, "states": states, "per_param": states / spec.total_params(),
                         "peak": v["peak"] if v else None, "fits": v["fits"] if v else None})
    out["optimizers"] = opt_rows

    # precisions: bytes per parameter (Adam/AdamW) and the engine's answer for this scenario
    prec_rows = []
    for q in Precision:
        w, g = precision.weight_bytes_per_param(q), precision.grad_bytes_per_param(q)
        m = precision.master_bytes_per_param(q)
        s = precision.optimizer_state_bytes(Optimizer.adamw, q, [((1,), 1)])
        v = run(variant(sc, precision=q, **train))
        prec_rows.append({"precision": q.value, "weights": w, "grads": g, "master": m, "states": s,
                          "total": w + g + m + s, "activation_dtype": precision.activation_bytes(q),
                          "peak": v["peak"] if v else None, "activations": v["max_activations"] if v else None,
                          "fits": v["fits"] if v else None})
    out["precisions"] = prec_rows

    # activation checkpointing
    k_sqrt = max(1, round(math.sqrt(spec.num_layers)))
    ck = []
    for label, kw in (("none", {"activation_checkpointing": Checkpointing.none}),
                      ("every layer", {"activation_checkpointing": Checkpointing.full, "checkpoint_every": 1}),
                      (f"1 of every {k_sqrt} layers (about sqrt(L))",
                       {"activation_checkpointing": Checkpointing.full, "checkpoint_every": k_sqrt}),
                      ("selective (attention only)", {"activation_checkpointing": Checkpointing.selective})):
        v_sc = variant(sc, **kw, **train)
        v, s = run(v_sc), speed(v_sc)
        ck.append({"label": label, **(v or {}), "exec_fpt": s["exec_fpt"] if s else None,
                   "model_fpt": s["model_fpt"] if s else None, "step_s": s["step_s"] if s else None})
    out["checkpointing"] = ck
    out["k_sqrt"] = k_sqrt

    # ZeRO: the paper's model-state formula and the engine, over N data-parallel GPUs
    zero_hw = _multi_gpu_hardware(sc, 8) if sc.data_parallel == 1 else sc.hardware.model_dump(mode="json",
                                                                                               exclude_none=True)
    zsc = variant(sc, hardware=zero_hw, **train)
    dp = zsc.data_parallel if zsc else 8
    k_bytes = precision.master_bytes_per_param(p) + precision.optimizer_state_bytes(t.optimizer, p, [((1,), 1)])
    zrows = []
    for stage in range(4):
        v_sc = variant(zsc, zero_stage=stage, offload_optimizer=Offload.none, offload_params=Offload.none) \
            if zsc else None
        v, s = run(v_sc), speed(v_sc)
        zrows.append({"stage": stage, "model_states": parallel.zero_model_state_bytes(
            spec.total_params(), stage, dp, k_bytes=k_bytes, weight_bytes=precision.weight_bytes_per_param(p),
            grad_bytes=precision.grad_bytes_per_param(p)),
            "peak": v["peak"] if v else None, "fits": v["fits"] if v else None,
            "comm_s": s["dp_comm_s"] if s else None, "interconnect": s["interconnect"] if s else None})
    out["zero"] = {"dp": dp, "k_bytes": k_bytes, "rows": zrows,
                   "hardware": zsc.resolved_hardware().num_gpus if zsc else None,
                   "bucket": parallel.REDUCE_BUCKET_ELEMENTS, "prefetch": parallel.STAGE3_PREFETCH_ELEMENTS,
                   "max_live": parallel.STAGE3_MAX_LIVE_PARAMETERS,
                   "persistence": parallel.STAGE3_PARAM_PERSISTENCE_THRESHOLD,
                   "weight_bytes": precision.weight_bytes_per_param(p),
                   "grad_bytes": precision.grad_bytes_per_param(p)}

    # offload
    z_opt = max(t.zero_stage, 1)
    off = []
    for label, kw in (("no offload", {}),
                      ("optimizer -> CPU", {"zero_stage": z_opt, "offload_optimizer": Offload.cpu}),
                      ("optimizer -> NVMe (ZeRO-3)", {"zero_stage": 3, "offload_optimizer": Offload.nvme}),
                      ("optimizer + parameters -> CPU", {"zero_stage": 3, "offload_optimizer": Offload.cpu,
                                                          "offload_params": Offload.cpu})):
        if not kw:
            kw = {"offload_optimizer": Offload.none, "offload_params": Offload.none}
        v_sc = variant(sc, **kw, **train)
        v, s = run(v_sc), speed(v_sc)
        off.append({"label": label, **(v or {}), "step_s": s["step_s"] if s else None,
                    "offload_s": s["offload_s"] if s else None})
    out["offload"] = off
    out["pcie"] = {"gen": gpu.pcie_gen, "bytes_per_s": gpu.pcie_bandwidth_bytes_per_s} if gpu else None
    try:
        out["nvme_bytes_per_s"] = hardware_of(sc).nvme_bytes_per_s
    except ValueError:
        out["nvme_bytes_per_s"] = None

    # attention
    att = []
    for seq in sorted({t.seq_len, min(4 * t.seq_len, 4_194_304), min(16 * t.seq_len, 4_194_304)}):
        row = {"seq": seq}
        for kind in Attention:
            v = run(variant(sc, attention=kind, seq_len=seq))
            row[kind.value] = v["peak"] if v else None
            row[f"{kind.value}_fits"] = v["fits"] if v else None
        att.append(row)
    out["attention"] = att

    # parallelism
    par = []
    for label, deg, kw in [(f"tensor parallel {d}", d, {"tensor_parallel": d}) for d in (1, 2, 4, 8)
                           if spec.num_heads % d == 0] + \
                          [(f"tensor parallel {d} + sequence parallel", d,
                            {"tensor_parallel": d, "sequence_parallel": True}) for d in (8,)
                           if spec.num_heads % d == 0] + \
                          [(f"pipeline parallel {d}", d, {"pipeline_parallel": d}) for d in (2, 4)
                           if spec.num_layers >= d]:
        v_sc = variant(sc, hardware=_multi_gpu_hardware(sc, deg), zero_stage=0, offload_optimizer=Offload.none,
                       offload_params=Offload.none, tensor_parallel=kw.get("tensor_parallel", 1),
                       pipeline_parallel=kw.get("pipeline_parallel", 1),
                       sequence_parallel=kw.get("sequence_parallel", False))
        v = run(v_sc)
        par.append({"label": label, "gpus": v_sc.resolved_hardware().num_gpus if v_sc else None, **(v or {})})
    out["parallel"] = par

    # LoRA / QLoRA and quantized inference
    full_p = Precision.amp_bf16 if p.is_mixed else p
    lora = []
    for label, lo in (("full fine-tune", None), ("LoRA r=16, bf16 base", {"rank": 16, "base_weights": "bf16"}),
                      ("LoRA r=16, int8 base", {"rank": 16, "base_weights": "int8"}),
                      ("QLoRA r=16, nf4 base", {"rank": 16, "base_weights": "nf4"})):
        kw = {"lora": lo}
        if lo and lo["base_weights"] != "bf16":
            kw.update(precision=full_p, zero_stage=min(t.zero_stage, 2), offload_params=Offload.none)
        v = run(variant(sc, **kw, **train))
        lora.append({"label": label, **(v or {})})
    out["lora"] = lora
    inf = []
    for label, lo in (("bf16 weights", None), ("int8 weights", {"base_weights": "int8"}),
                      ("nf4 4-bit weights", {"base_weights": "nf4"})):
        v = run(variant(sc, mode=Mode.inference.value, lora=lo, zero_stage=0, offload_optimizer=Offload.none,
                        offload_params=Offload.none, precision=Precision.bf16))
        inf.append({"label": label, **(v or {})})
    out["inference"] = inf
    return out


# ---- common claims, checked -----------------------------------------------------------------

def _est(**kw: Any) -> dict[str, Any]:
    return summary(estimate(Scenario(**kw)))


@st.cache_data(max_entries=2, show_spinner=False)
def claims() -> list[dict[str, Any]]:
    """Popular rules of thumb (../shared/seeds/README.md) next to calc/'s answer. Each item:
    claim, claimed (text), engine (text built from bytes below), verdict, and the raw numbers."""
    out: list[dict[str, Any]] = []
    n7, n70 = 7_000_000_000, 70_000_000_000
    zs = [parallel.zero_model_state_bytes(n7, s, 8) for s in range(4)]
    out.append({"claim": "ZeRO on 8 GPUs, 7B model, mixed-precision Adam: 80 / 20 / 10 / 2 GB per GPU for "
                         "stages 0 / 1 / 2 / 3",
                "claimed_gb": [80, 20, 10, 2], "engine_bytes": zs, "kind": "zero7b",
                "note": "Model states alone (ZeRO paper, K = 12); activations come on top. The 4x / 8x / Nx "
                        "savings only hold as N grows."})
    s70 = parallel.zero_model_state_bytes(n70, 0, 1)
    out.append({"claim": "A 70B model's mixed-precision Adam model states take 700 GB", "claimed_gb": [700],
                "engine_bytes": [s70], "kind": "bytes",
                "note": "2 (bf16 weights) + 2 (grads) + 4 (fp32 master) + 8 (Adam m, v) bytes per parameter."})
    per = {}
    for q in (Precision.fp32, Precision.bf16_mixed, Precision.bf16):
        per[q.value] = (precision.weight_bytes_per_param(q) + precision.grad_bytes_per_param(q)
                        + precision.master_bytes_per_param(q)
                        + precision.optimizer_state_bytes(Optimizer.adamw, q, [((1,), 1)]))
    out.append({"claim": "Mixed precision halves the memory of weights, gradients and optimizer states",
                "per_param": per, "kind": "per_param",
                "note": "The fp32 master copy keeps model states at the fp32 figure; the saving is in "
                        "activations. Only pure bf16 (bf16 AdamW states) cuts model states."})
    sc7 = dict(model="llama-2-7b", hardware={"gpu": "a100-80gb"},
               training={"precision": "bf16-mixed", "attention": "sdpa", "activation_checkpointing": "full"})
    out.append({"claim": "A 1B-7B model fine-tunes fully on one 80 GB GPU with mixed precision, "
                         "FlashAttention and checkpointing", "kind": "fit", **_est(**sc7),
                "setup": "Llama-2-7B, 1 x A100 80GB, bf16 mixed + AdamW, SDPA, full checkpointing, 1 x 2048 tokens"})
    sc4090 = dict(model="llama-2-7b", hardware={"gpu": "rtx-4090"},
                  training={"precision": "bf16", "attention": "sdpa", "activation_checkpointing": "full",
                            "seq_len": 512, "optimizer_impl": "fused"})
    out.append({"claim": "A 7B full-parameter fine-tune with AdamW runs on one RTX 4090 at 22.4 of 24 GB",
                "kind": "fit", **_est(**sc4090),
                "setup": "Llama-2-7B, 1 x RTX 4090, pure bf16 (the leanest) + fused AdamW, full checkpointing, "
                         "1 x 512 tokens"})
    q70 = dict(model="llama-2-70b", mode="inference", hardware={"gpu": "rtx-4090"},
               training={"lora": {"base_weights": "nf4"}, "seq_len": 512, "precision": "bf16"})
    out.append({"claim": "A 70B model runs 4-bit inference on one RTX 4090", "kind": "fit", **_est(**q70),
                "setup": "Llama-2-70B, nf4 weights, inference, 1 x 512 tokens, 1 x RTX 4090"})
    ql = dict(model="llama-2-7b", hardware={"gpu": "rtx-4090"},
              training={"lora": {"base_weights": "nf4", "rank": 16}, "activation_checkpointing": "full"})
    e = _est(**ql)
    out.append({"claim": "QLoRA quantizes the optimizer states to 4 bits", "kind": "qlora", **e,
                "state_bytes_per_trainable": e["optimizer_states"] / e["trainable"] if e["trainable"] else None,
                "setup": "Llama-2-7B QLoRA r=16 on all linear layers, AdamW"})
    base = dict(model="llama-2-7b", hardware={"gpu": "a100-80gb"}, training={"seq_len": 2048})
    none = _est(**base)
    full = _est(model="llama-2-7b", hardware={"gpu": "a100-80gb"},
                training={"seq_len": 2048, "activation_checkpointing": "full"})
    out.append({"claim": "Activations = seq x batch x hidden x layers x 2 bytes", "kind": "activations",
                "claimed_bytes": 2048 * 1 * 4096 * 32 * 2, "none": none["max_activations"],
                "full": full["max_activations"],
                "setup": "Llama-2-7B, AMP bf16, 1 x 2048 tokens: activations saved for backward at their largest"})
    out.append({"claim": "Pure-bf16 AdamW keeps fp32 optimizer states (8 bytes per parameter)", "kind": "bf16states",
                "per_param": precision.optimizer_state_bytes(Optimizer.adamw, Precision.bf16, [((1,), 1)]),
                "note": "torch.optim creates exp_avg / exp_avg_sq with zeros_like(param): bf16 params get bf16 states."})
    e70 = _est(model="llama-2-70b", hardware={"cluster": "8x-a100-80gb"},
               training={"precision": "bf16-mixed", "zero_stage": 3, "activation_checkpointing": "full"})
    out.append({"claim": "Llama-70B on 8 x A100-80G: parameters 35 GB, gradients 105 GB, optimizer 35 GB, "
                         "activations 25 GB per GPU", "kind": "breakdown", "claimed_gb": [35, 105, 35, 25], **e70,
                "setup": "Llama-2-70B, 8 x A100 80GB, bf16 mixed + AdamW, ZeRO-3, full checkpointing"})
    # communication: ZeRO-1/2 = plain data parallel, ZeRO-3 = 1.5x (calc.speed's collective volumes)
    comm = []
    for s in range(4):
        sp = estimate_speed(Scenario(model="llama-2-7b", hardware={"cluster": "8x-a100-80gb"},
                                     training={"precision": "bf16-mixed", "zero_stage": s}))
        comm.append(next(t.total_seconds for t in sp.terms if t.key == "dp_comm"))
    out.append({"claim": "ZeRO stages 1 and 2 add communication over plain data parallel", "kind": "comm",
                "comm_s": comm, "setup": "Llama-2-7B, 8 x A100 80GB (NVLink), bf16 mixed, one step, no accumulation"})
    return out

"""Explain: where GPU memory goes and what each technique does to it, with every number computed
live by calc/ for the scenario in the sidebar (ui.explain runs the variants)."""

from __future__ import annotations

import streamlit as st

from calc.result import CATEGORY_LABELS
from ui import explain, fmt
from ui.widgets import page_setup, scenario_or_stop

page_setup("Explain", ":material/menu_book:")
st.title("Where GPU memory goes, and what to do about it")

sc = scenario_or_stop()
if sc is None:
    st.stop()
try:
    f = explain.figures(sc.model_dump_json())
    claims = explain.claims()
except ValueError as exc:
    st.error(f"The engine cannot estimate this scenario: {exc}", icon=":material/error:")
    st.stop()

g = fmt.gib
b = f["base"]
n = f["params"]
hw_name = f"{f['num_gpus']} x {f['gpu_name']}" if f["gpu_name"] else f"{f['num_gpus']} custom GPU(s)"
st.caption(f"Every figure below is computed now by the engine for **{f['name']}** ({n:,} parameters, "
           f"{f['layers']} layers) on **{hw_name}**, and for variants of it. Change the scenario in the sidebar "
           "and the text follows. Sizes in GiB (2^30 bytes) unless a claim is quoted in GB (10^9 bytes).")

TOPICS = ["Where memory goes", "Optimizer states", "Mixed precision", "Activation checkpointing", "ZeRO",
          "Offload", "FlashAttention", "Parallelism", "Quantization and LoRA / QLoRA", "Monitoring",
          "Troubleshooting", "Common claims, checked"]
st.markdown(" · ".join(f"[{t}](#{t.lower().replace(' ', '-').replace('/', '').replace(',', '')})" for t in TOPICS))


def gv(x) -> str:
    return "—" if x is None else g(x)


def num(x, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def verdict(fits, headroom) -> str:
    return "—" if fits is None else ("fits" if fits else f"short by {g(-headroom)}")


# ---- 1 ---------------------------------------------------------------------------------------
st.header("Where memory goes", anchor="where-memory-goes")
st.markdown(f"""
Four consumers share the GPU during training, plus transients and the runtime around them. For this
scenario the peak ({g(b['peak'])} allocated) falls at **{b['event']}** ({b['phase']}), where the GPU holds:

| consumer | at the peak | largest during the step |
|---|---:|---:|
""" + "\n".join(f"| {CATEGORY_LABELS[c]} | {g(b[c])} | {g(f['category_max'][c])} |"
                for c in ("parameters", "gradients", "optimizer_states", "activations", "other")) + f"""

Outside PyTorch's allocator, nvidia-smi also counts the CUDA context ({g(f['overhead']['context'])} expected),
NCCL buffers ({g(f['overhead']['nccl'])}) and the caching allocator's reserve ({g(f['overhead']['reserve_low'])}
to {g(f['overhead']['reserve_high'])}, expected {g(f['overhead']['reserve'])}): a device total of
{g(b['device_low'])} to {g(b['device_high'])}, expected {g(b['device'])}.

The consumers are **not** all alive at once. Adding each one's own maximum gives
{g(f['category_max_sum'])}, {g(f['category_max_sum'] - b['peak'])} more than the real peak: activations are
freed during backward while gradients appear, and optimizer states are created lazily in the first step.
The peak is a moment on the timeline (see the Calculator's timeline chart), not a sum.
""")

# ---- 2 ---------------------------------------------------------------------------------------
st.header("Optimizer states", anchor="optimizer-states")
rows = [{"optimizer": r["optimizer"], "state (full model)": g(r["states"]), "bytes / param": num(r["per_param"]),
         "peak (this scenario)": gv(r["peak"]),
         "verdict": "—" if r["fits"] is None else ("fits" if r["fits"] else "does not fit")} for r in f["optimizers"]]
st.markdown(f"Persistent optimizer state for all {n:,} parameters of {f['name']} in this scenario's precision "
            "(Adafactor keeps factored row/column statistics; AdamW 8-bit keeps uint8 states plus a float "
            "scale per 256-element block, bitsandbytes), and the peak the engine predicts with each optimizer:")
st.table(rows, hide_index=True)

# ---- 3 ---------------------------------------------------------------------------------------
st.header("Mixed precision", anchor="mixed-precision")
pr = {r["precision"]: r for r in f["precisions"]}
st.markdown(f"""
**FP16 vs BF16.** Both are 16-bit. FP16 has more mantissa bits but a narrow exponent range, so small
gradients underflow and large activations overflow: training needs **loss scaling** (PyTorch's
`GradScaler`, DeepSpeed's dynamic `loss_scale`), which multiplies the loss before backward and skips steps
whose gradients overflow. BF16 keeps fp32's exponent range and needs no scaling, but only Ampere (A100,
RTX 30xx) and newer GPUs compute it natively;
{"this GPU does" if f["gpu_bf16"] else "this GPU does not" if f["gpu_bf16"] is not None else "a custom GPU may or may not"}.

**Why master weights keep model states at {pr['bf16-mixed']['total']} bytes per parameter.** With AdamW, bytes
per parameter by precision (calc.precision):
""")
st.table([{"precision": r["precision"], "weights": r["weights"], "grads": r["grads"], "fp32 master": r["master"],
           "Adam m + v": r["states"], "model states / param": r["total"],
           "activation dtype bytes": r["activation_dtype"], "activations (this scenario)": gv(r["activations"]),
           "peak": gv(r["peak"]), "verdict": "—" if r["fits"] is None else ("fits" if r["fits"] else "does not fit")}
          for r in f["precisions"]], hide_index=True)
st.markdown(f"""
DeepSpeed-style mixed precision keeps 16-bit weights and gradients ({pr['bf16-mixed']['weights']} +
{pr['bf16-mixed']['grads']} bytes) **plus** an fp32 master copy ({pr['bf16-mixed']['master']}) and fp32 Adam
moments ({pr['bf16-mixed']['states']}): {pr['bf16-mixed']['total']} bytes, the same as plain fp32
({pr['fp32']['total']}). PyTorch AMP keeps fp32 weights and gradients ({pr['amp-bf16']['total']} bytes) and
casts to 16 bits on the fly. What 16-bit compute changes is the **activations**: saved for backward in this
scenario, {gv(pr['fp32']['activations'])} in fp32, {gv(pr['amp-bf16']['activations'])} under AMP bf16 (autocast
keeps the residual stream in fp32 and caches 16-bit copies of the weights) and
{gv(pr['bf16-mixed']['activations'])} with bf16 weights (bf16 mixed). Only pure bf16, whose AdamW states are
bf16 too, cuts model states ({pr['bf16']['total']} bytes).
""")

# ---- 4 ---------------------------------------------------------------------------------------
st.header("Activation checkpointing", anchor="activation-checkpointing")
ck = f["checkpointing"]
st.markdown(f"""
Backward needs what each layer saved in forward. Checkpointing keeps only each checkpointed layer's input
and recomputes the rest during backward: memory for activations drops from O(L) layers' worth to one
layer's worth plus the L inputs, and with checkpoints every sqrt(L) layers (Chen et al. 2016) to
O(sqrt(L)). Here L = {f['layers']}, so sqrt(L) is about {f['k_sqrt']}. The cost is an extra forward of the
checkpointed layers; selective checkpointing (Korthikanti et al. 2022) recomputes only the attention core,
whose saved tensors grow with sequence length, for a small fraction of that compute.
""")
st.table([{"checkpointing": r["label"], "activations (largest)": gv(r.get("max_activations")),
           "peak": gv(r.get("peak")),
           "executed / model FLOPs": "—" if not r.get("exec_fpt") else num(r["exec_fpt"] / r["model_fpt"], 3),
           "step (calc.speed)": "—" if r.get("step_s") is None else f"{r['step_s']:.3f} s",
           "verdict": verdict(r.get("fits"), r.get("headroom"))} for r in ck], hide_index=True)
st.markdown("""
Caveats. Recomputation must reproduce the forward exactly: `torch.utils.checkpoint` saves and restores
the RNG state (`preserve_rng_state=True`) so dropout masks match, which costs a little time. Layers with
side effects in forward, such as BatchNorm's running statistics, are updated twice unless excluded.
Use `use_reentrant=False` (the non-reentrant implementation) in current PyTorch.
""")

# ---- 5 ---------------------------------------------------------------------------------------
st.header("ZeRO", anchor="zero")
z = f["zero"]
zr = z["rows"]
st.markdown(f"""
ZeRO (Rajbhandari et al. 2020) removes the copies plain data parallelism keeps on every GPU. Stage 1 shards
the optimizer states (and fp32 master weights) over the N data-parallel GPUs, stage 2 also the gradients,
stage 3 also the weights. The paper's model-state formula for this model and precision
({z['weight_bytes']} + {z['grad_bytes']} + K = {z['k_bytes']} bytes per parameter) with N = {z['dp']}:
""")
st.table([{"stage": r["stage"], "model states per GPU (paper)": g(r["model_states"]), "engine peak": gv(r["peak"]),
           "verdict": "—" if r["fits"] is None else ("fits" if r["fits"] else "does not fit"),
           "DP communication per step": "—" if r["comm_s"] is None else f"{r['comm_s']:.3f} s"} for r in zr],
         hide_index=True)
if zr[0]["comm_s"] and zr[3]["comm_s"]:
    st.markdown(f"""
**Communication.** Plain data parallel all-reduces the gradients each step. Stages 1 and 2 replace it with a
reduce-scatter of gradients and an all-gather of updated weights: the same volume
({zr[1]['comm_s']:.3f} s and {zr[2]['comm_s']:.3f} s against {zr[0]['comm_s']:.3f} s over {zr[0]['interconnect']}
here). Stage 3 gathers the weights in forward and again in backward:
{zr[3]['comm_s'] / zr[0]['comm_s']:.2f} x the data-parallel volume ({zr[3]['comm_s']:.3f} s).""")
st.markdown(f"""
DeepSpeed settings that matter (the Export page writes them): `overlap_comm` (hide reductions behind
backward), `contiguous_gradients` (one flat buffer, less fragmentation), `reduce_bucket_size`
({z['bucket']:,} elements by default: a bucket of that size lives on the GPU under stage 2),
`stage3_prefetch_bucket_size` ({z['prefetch']:,}), `stage3_max_live_parameters` ({z['max_live']:,}) and
`stage3_param_persistence_threshold` ({z['persistence']:,}: smaller tensors stay unsharded).
""")

# ---- 6 ---------------------------------------------------------------------------------------
st.header("Offload", anchor="offload")
off = f["offload"]
pcie = f["pcie"]
st.markdown(f"""
ZeRO-Offload moves the optimizer states (and the update itself, on the CPU with DeepSpeed's CPUAdam) to
host memory; ZeRO-Infinity can put them, or the weights (stage 3), on NVMe. Every step then moves
gradients down and weights up over PCIe
{f"(gen {pcie['gen']}: {pcie['bytes_per_s'] / 1e9:.0f} GB/s per direction for this GPU)" if pcie else ""};
NVMe is slower still{f" ({f['nvme_bytes_per_s'] / 1e9:.1f} GB/s per node assumed for this hardware)" if f["nvme_bytes_per_s"] else ""},
so ZeRO-Infinity keeps the step waiting on the drive unless the batch is large.
Host buffers must be **pinned** (page-locked) to reach that bandwidth, and pinned memory cannot be swapped:
the host needs RAM for all of it.
""")
st.table([{"setup": r["label"], "GPU peak": gv(r.get("peak")), "CPU RAM per node": gv(r.get("cpu_ram")),
           "NVMe per node": gv(r.get("nvme")),
           "step (calc.speed)": "—" if r.get("step_s") is None else f"{r['step_s']:.3f} s",
           "of which offload": "—" if r.get("offload_s") is None else f"{r['offload_s']:.3f} s",
           "slowdown": "—" if not (r.get("step_s") and off[0].get("step_s")) else f"{r['step_s'] / off[0]['step_s']:.2f} x",
           "verdict": verdict(r.get("fits"), r.get("headroom"))} for r in off], hide_index=True)
if f["host_ram"]:
    st.markdown(f"This hardware has {g(f['host_ram'])} of host RAM per node.")

# ---- 7 ---------------------------------------------------------------------------------------
st.header("FlashAttention", anchor="flashattention")
st.markdown(f"""
Eager attention materialises the scores and the softmax probabilities, each batch x heads x S x S
({f['heads']} heads here), and keeps them for backward. FlashAttention (Dao et al. 2022) and PyTorch's
SDPA kernels compute attention in tiles and keep only the output and the log-sum-exp: the S x S term
disappears, and memory grows linearly with sequence length. Peak allocated for this scenario:
""")
st.table([{"sequence length": f"{r['seq']:,}", "eager": gv(r["eager"]),
           "eager verdict": "—" if r["eager_fits"] is None else ("fits" if r["eager_fits"] else "does not fit"),
           "SDPA / Flash": gv(r["sdpa"]),
           "SDPA verdict": "—" if r["sdpa_fits"] is None else ("fits" if r["sdpa_fits"] else "does not fit")}
          for r in f["attention"]], hide_index=True)
st.markdown("Other kernels with the same idea: fused AdamW (no foreach temporaries, see Optimizer "
            "implementation), 8-bit optimizers, fused cross-entropy.")

# ---- 8 ---------------------------------------------------------------------------------------
st.header("Parallelism", anchor="parallelism")
st.markdown("""
**Data parallel** replicates the model and splits the batch (memory relief only with ZeRO, above).
**Tensor parallel** (Megatron-LM) splits each layer's matrices across GPUs: weights, gradients, optimizer
states and most activations divide by the degree; it all-reduces activations twice per layer each way, so
it stays inside an NVLink node. **Sequence parallel** splits the LayerNorm and dropout activations that
tensor parallel leaves replicated. **Pipeline parallel** places consecutive layers on different GPUs; the
first stage holds activations of up to `pp` micro-batches in flight (1F1B). Per GPU, for this model (ZeRO
off, same micro-batch):
""")
st.table([{"layout": r["label"], "GPUs": r.get("gpus"), "peak": gv(r.get("peak")), "weights": gv(r.get("parameters")),
           "activations (largest)": gv(r.get("max_activations")),
           "verdict": verdict(r.get("fits"), r.get("headroom"))} for r in f["parallel"]], hide_index=True)
if f["experts"] > 1:
    st.markdown(f"**Expert parallel.** {f['name']} has {f['experts']} experts per layer: {n:,} parameters in "
                f"total, {f['active_params']:,} active per token. Expert parallelism places different experts on "
                "different GPUs; the engine does not model it yet, so its figures keep all experts on each GPU.")
else:
    st.markdown("**Expert parallel** places the experts of mixture-of-experts models (e.g. Mixtral) on different "
                "GPUs; this model is dense. The engine does not model expert parallelism yet.")

# ---- 9 ---------------------------------------------------------------------------------------
st.header("Quantization and LoRA / QLoRA", anchor="quantization-and-lora--qlora")
st.markdown("""
LoRA freezes the base model and trains small low-rank adapters: gradients and optimizer states exist only
for the adapters. QLoRA (Dettmers et al. 2023) also stores the frozen base weights in 4-bit NF4 and
dequantizes them to bf16 layer by layer for each matmul. It does **not** quantize the optimizer states:
the adapters' AdamW states stay fp32. Training this model:
""")
st.table([{"setup": r["label"], "trainable params": "—" if r.get("trainable") is None else f"{r['trainable']:,}",
           "weights": gv(r.get("parameters")), "grads": gv(r.get("gradients")),
           "optimizer states": gv(r.get("optimizer_states")), "peak": gv(r.get("peak")),
           "verdict": verdict(r.get("fits"), r.get("headroom"))} for r in f["lora"]], hide_index=True)
st.markdown("Inference with quantized weights (GPTQ / AWQ / bitsandbytes store weights the same way):")
st.table([{"weights": r["label"], "weights size": gv(r.get("parameters")), "peak": gv(r.get("peak")),
           "verdict": verdict(r.get("fits"), r.get("headroom"))} for r in f["inference"]], hide_index=True)

# ---- 10 --------------------------------------------------------------------------------------
st.header("Monitoring", anchor="monitoring")
st.markdown(f"""
The engine predicts `torch.cuda.max_memory_allocated()` ({g(b['peak'])} here). nvidia-smi shows more: the
CUDA context and the allocator's reserved-but-free blocks (expected device total {g(b['device'])}).
""")
st.code("""import torch
torch.cuda.reset_peak_memory_stats()
# ... one training step ...
print(torch.cuda.max_memory_allocated() / 2**30, "GiB allocated at the peak")
print(torch.cuda.max_memory_reserved() / 2**30, "GiB reserved by the caching allocator")
print(torch.cuda.memory_summary())               # per-pool table, retries, fragmentation

# where every byte came from: record, then open the pickle at https://pytorch.org/memory_viz
torch.cuda.memory._record_memory_history(max_entries=100_000)
# ... a few steps ...
torch.cuda.memory._dump_snapshot("snapshot.pickle")""", language="python")

# ---- 11 --------------------------------------------------------------------------------------
st.header("Troubleshooting", anchor="troubleshooting")
st.markdown(f"""
- **OOM although nvidia-smi shows free memory.** The caching allocator holds blocks that are free but too
  fragmented for the next request; `memory_summary()` shows a large gap between reserved and allocated and
  `num_alloc_retries` > 0. Here the engine expects {g(f['overhead']['reserve_low'])} to
  {g(f['overhead']['reserve_high'])} of reserve. Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
  (segments grow instead of new ones being carved), keep tensor shapes constant (pad to fixed lengths), and
  call `torch.cuda.empty_cache()` only between phases.
- **FP16 loss becomes NaN / inf.** Overflow in fp16 activations or gradients: use bf16 if the GPU supports
  it, else dynamic loss scaling (`GradScaler`, DeepSpeed `"fp16": {{"loss_scale": 0}}`) and check that
  softmax and losses run in fp32.
- **ZeRO-3 is slow.** Every layer's weights are gathered twice per step (see ZeRO above); raise
  `stage3_prefetch_bucket_size`, keep small tensors persistent, keep the job inside NVLink nodes, or use
  stage 2 when the model states fit.
- **The host runs out of RAM under offload.** Offloaded states live in pinned host memory for every GPU of the
  node: {("this scenario needs " + g(b['cpu_ram']) + " per node") if b['cpu_ram'] else "turn offload on in the sidebar to see how much this scenario needs"}.
  Use NVMe offload, fewer GPUs per node, or ZeRO stage 3 across more nodes.
- **Checkpointed training is unstable or non-deterministic.** Keep `preserve_rng_state=True` and avoid
  side effects in checkpointed forward code.
""")

# ---- 12 --------------------------------------------------------------------------------------
st.header("Common claims, checked", anchor="common-claims-checked")
st.markdown("Rules of thumb that circulate in blog posts, next to the engine's answer. Claims quoted in GB are "
            "compared in GB (10^9 bytes), with GiB alongside.")
rows = []
for c in claims:
    kind = c["kind"]
    if kind == "zero7b":
        claimed = " / ".join(f"{x} GB" for x in c["claimed_gb"])
        engine = " / ".join(fmt.gb(x, 2) for x in c["engine_bytes"]) + \
            " (" + " / ".join(g(x) for x in c["engine_bytes"]) + ")"
        ok = all(abs(x * fmt.GB - y) <= 0.1 * y for x, y in zip(c["claimed_gb"], c["engine_bytes"], strict=True))
    elif kind == "bytes":
        claimed = f"{c['claimed_gb'][0]} GB"
        engine = f"{fmt.gb(c['engine_bytes'][0], 0)} ({g(c['engine_bytes'][0])})"
        ok = abs(c["claimed_gb"][0] * fmt.GB - c["engine_bytes"][0]) <= 0.1 * c["engine_bytes"][0]
    elif kind == "per_param":
        pp_ = c["per_param"]
        claimed = "half of fp32's bytes per parameter"
        engine = (f"fp32 Adam {pp_['fp32']} B/param, bf16 mixed {pp_['bf16-mixed']} B/param, "
                  f"pure bf16 {pp_['bf16']} B/param")
        ok = pp_["bf16-mixed"] * 2 <= pp_["fp32"]
    elif kind == "fit":
        claimed = "fits"
        engine = (f"{c['setup']}: device total {g(c['device'])} expected vs {g(c['gpu'])} per GPU, "
                  f"{verdict(c['fits'], c['headroom'])} (weights {g(c['parameters'])}"
                  + (f", optimizer states {g(c['optimizer_states'])})" if c["optimizer_states"] else ")"))
        ok = bool(c["fits"])
    elif kind == "breakdown":
        claimed = " / ".join(f"{x} GB" for x in c["claimed_gb"])
        got = [c["parameters"], c["gradients"], c["optimizer_states"], c["max_activations"]]
        engine = (f"{c['setup']}: weights / gradients / optimizer states / activations = "
                  + " / ".join(fmt.gb(x) for x in got) + f" per GPU at the peak; device total {g(c['device'])}, "
                  f"{verdict(c['fits'], c['headroom'])}")
        ok = all(abs(x * fmt.GB - y) <= 0.1 * max(y, 1) for x, y in zip(c["claimed_gb"], got, strict=True))
    elif kind == "qlora":
        claimed = "optimizer states in 4 bits"
        engine = (f"{c['setup']}: {c['trainable']:,} trainable params, optimizer states "
                  f"{g(c['optimizer_states'])} = {c['state_bytes_per_trainable']:.1f} bytes per trainable "
                  f"parameter (fp32 m and v); the frozen base weights take {g(c['parameters'])} in nf4")
        ok = (c["state_bytes_per_trainable"] or 0) < 1
    elif kind == "activations":
        claimed = g(c["claimed_bytes"])
        engine = (f"{c['setup']}: {g(c['none'])} without checkpointing, {g(c['full'])} with full checkpointing "
                  "(the formula counts only the stored layer inputs)")
        ok = abs(c["none"] - c["claimed_bytes"]) < 0.1 * c["none"]
    elif kind == "bf16states":
        claimed = "8 bytes per parameter"
        engine = f"{c['per_param']} bytes per parameter (bf16 exp_avg + exp_avg_sq)"
        ok = c["per_param"] == 8
    elif kind == "comm":
        cs = c["comm_s"]
        claimed = "more than plain data parallel"
        engine = (f"{c['setup']}: " + ", ".join(f"stage {i} {s:.3f} s" for i, s in enumerate(cs)) +
                  f" of collectives per step; stage 3 = {cs[3] / cs[0]:.2f} x stage 0")
        ok = cs[1] > cs[0] * 1.01 or cs[2] > cs[0] * 1.01
    else:
        continue
    rows.append({"claim": c["claim"], "claimed": claimed, "engine's answer": engine,
                 "verdict": "holds" if ok else "does not hold", "note": c.get("note", "")})
st.table(rows, hide_index=True)

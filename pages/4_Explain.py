"""Explain: where GPU memory goes and what each technique does to it, with every number computed
live by calc/ for the scenario in the sidebar (ui.explain.figures runs the what-ifs), the lessons'
plots (ui.explain.lesson_plots), the serving lesson (ui.explain.serving_lesson), worked recipes and
the source articles' claims checked against the engine."""

from __future__ import annotations

import streamlit as st

from calc.contract.i18n import N_
from calc.evidence.claims import article_batch_formula
from calc.memory.result import CATEGORY_LABELS
from calc.memory.verdict import Verdict, short
from calc.recommend import per_step_words
from ui import compute, fmt, state
from ui import plots as charts
from ui.explain import lesson_plots as xcharts
from ui.explain.claim_rows import article_names, claim_rows, verdict_counts
from ui.explain.figures import BPP_ZERO_GPUS, bytes_per_param_table, figures
from ui.explain.recipes import recipe_rows
from ui.explain.serving_lesson import draw as draw_serving_lesson
from ui.first_screen import stop_after_first_screen
from ui.language import _, current, say, tr
from ui.widgets import page_setup, scenario_or_stop

page_setup("Explain", ":material/menu_book:")
st.title(_("Where GPU memory goes, and what to do about it"))

sc = scenario_or_stop()
if sc is None:
    st.stop()
key = sc.model_dump_json()
try:
    f = figures(key)
except ValueError as exc:
    st.error(_("The engine cannot estimate this scenario: {error}", error=fmt.literal(state.error_text(exc))),
             icon=":material/error:")
    st.stop()

g = fmt.gib
b = f["base"]
n = f["params"]
st.caption(_("Every figure below is computed now by the engine for **{name}** ({params} parameters, {layers} layers) "
             "on **{hardware}**, and for what-ifs of it. Change the scenario in the sidebar and the text follows. "
             "Sizes in GiB (2^30 bytes) unless a claim is quoted in GB (10^9 bytes).",
             name=f["name"], params=f"{n:,}", layers=f["layers"], hardware=say(f["hardware"])))

TOPICS = [(N_("Where memory goes"), "where-memory-goes"), (N_("Bytes per parameter"), "bytes-per-parameter"),
          (N_("Optimizer states"), "optimizer-states"), (N_("Mixed precision"), "mixed-precision"),
          (N_("Activation checkpointing"), "activation-checkpointing"), ("FlashAttention", "flashattention"),
          ("ZeRO", "zero"), (N_("Offload"), "offload"), (N_("Parallelism"), "parallelism"),
          (N_("Quantization and LoRA / QLoRA"), "quantization-lora-qlora"),
          (N_("What to try, in order"), "what-to-try"), (N_("Worked recipes"), "worked-recipes"),
          (N_("Model size x hardware"), "model-size-x-hardware"), (N_("The largest micro-batch"), "largest-micro-batch"),
          (N_("Monitoring"), "monitoring"), (N_("Troubleshooting"), "troubleshooting"),
          (N_("Serving: the KV cache"), "serving-kv-cache"), (N_("Common claims, checked"), "common-claims-checked")]
st.markdown(" · ".join(f"[{tr(t)}](#{a})" for t, a in TOPICS))


def gv(x) -> str:
    return "—" if x is None else g(x)


def bpp(x) -> str:
    return "—" if x is None else f"{x:,.2f}"


def secs(x) -> str:
    return "—" if x is None else f"{x:,.3f} s"


def peak_at(v) -> str:
    return "—" if not v else charts.peak_place(v["event"], v["phase"])


def verdict(v) -> str:
    """A table cell's verdict (calc.memory.verdict.short in the session's language); '—' without a GPU size."""
    return "—" if not isinstance(v, Verdict) else short(v, current())


# Every topic after the first is folded under its heading: the page reads as a list of topics (a phone would
# otherwise scroll through some 28,000 px), each opened where the reader wants it. The headings stay outside,
# so that the links to them (#zero, ...) still land. The claims' section has folded tables of its own, and
# Streamlit does not nest expanders: it stays open.
FOLDED = range(1, len(TOPICS) - 1)
_section: list = []  # the folded body being drawn (entered by header(), left by the next header())


def header(i: int) -> None:
    if _section:
        _section.pop().__exit__(None, None, None)
    title, anchor = TOPICS[i]
    st.header(tr(title), anchor=anchor)
    if i in FOLDED:
        body = st.expander(_("Read the section"), key=f"explain_section_{anchor}")
        body.__enter__()
        _section.append(body)


# ---- where memory goes ---------------------------------------------------------------------
header(0)
CONSUMERS = ("parameters", "gradients", "optimizer_states", "activations", "other")
st.markdown("\n" + _("Four consumers share the GPU during training, plus transients and the runtime around them. For this "
                     "scenario the peak ({peak} allocated) falls at **{event}** ({phase}), where the GPU holds:",
                     peak=g(b["peak"]), event=charts.event_name(b["event"]), phase=tr(b["phase"]))
            + "\n\n| " + _("consumer") + " | " + _("at the peak") + " | " + _("largest during the step") + " |\n|---|---:|---:|\n"
            + "\n".join(f"| {tr(CATEGORY_LABELS[c])} | {g(b[c])} | {g(b['max_' + c])} |" for c in CONSUMERS) + "\n\n"
            + _("Outside PyTorch's allocator, nvidia-smi also counts the CUDA context ({context} expected), NCCL buffers "
                "({nccl}) and the caching allocator's reserve ({reserve_low} to {reserve_high}, expected {reserve}): a "
                "device total of {device_low} to {device_high}, expected {device}.",
                context=g(f["overhead"]["context"]), nccl=g(f["overhead"]["nccl"]),
                reserve_low=g(f["overhead"]["reserve_low"]), reserve_high=g(f["overhead"]["reserve_high"]),
                reserve=g(f["overhead"]["reserve"]), device_low=g(b["device_low"]), device_high=g(b["device_high"]),
                device=g(b["device"])) + "\n\n"
            + _("The consumers are **not** all alive at once. Adding each one's own maximum gives {sum}, {more} more than "
                "the real peak: activations are freed during backward while gradients appear, and optimizer states are "
                "created lazily in the first step. The timeline of one step shows it; the black line is the peak:",
                sum=g(f["category_max_sum"]), more=g(f["category_max_sum"] - b["peak"])))
st.plotly_chart(charts.timeline_area(f["estimate"]), key="explain_timeline")
stop_after_first_screen()  # on arrival the rest of the page follows once the browser has drawn this chart
st.markdown(_("The terms alive at the peak, as the Calculator lists them (they sum to the peak allocated):"))
st.markdown(fmt.table([{_("term"): fmt.plain(c.label_in(current())), _("at the peak"): g(c.bytes),
           _("formula"): fmt.plain(c.formula_in(current()))}
          for c in f["estimate"].components if c.bytes]))
grad_comp = next((c for c in f["estimate"].components if c.key == "gradients"), None)
if grad_comp is not None and grad_comp.label != "Parameter gradients (.grad)":
    st.caption(_("Gradients at the peak are the **{label}**: see [Bytes per parameter](#bytes-per-parameter) for why.",
                 label=grad_comp.label_in(current())))

# ---- bytes per parameter -------------------------------------------------------------------
header(1)
stage = st.segmented_control(_("ZeRO stage"), options=[0, 1, 2, 3], default=0, key="explain_bpp_zero",
                             format_func=lambda z: _("no ZeRO (one GPU)") if z == 0
                             else _("ZeRO-{stage} on {gpus} GPUs", stage=z, gpus=BPP_ZERO_GPUS))
stage = stage or 0
rows = f["bytes_per_param"] if stage == 0 else bytes_per_param_table(key, stage)
where_bpp = _("on one GPU without ZeRO") if stage == 0 else \
    _("per GPU under ZeRO-{stage} over {gpus} data-parallel GPUs", stage=stage, gpus=BPP_ZERO_GPUS)
st.markdown("\n" + _("Model states are counted per parameter. One table, computed by the engine (`calc.memory.per_param`, the "
                     "same code that builds the Calculator's breakdown) for full fine-tuning of {name} {where}, by "
                     "precision x optimizer x ZeRO stage (the control above). **Held** is what the ZeRO paper calls "
                     "model states (weights + gradients + fp32 master weights + optimizer states); **at the optimizer "
                     "step** is what is alive inside `optimizer.step()`: the gradients as the step sees them and the "
                     "step's scratch memory (foreach AdamW's `sqrt(v)` list, as large as the states' dtype x all "
                     "parameters; the fused kernel needs none).", name=f["name"], where=where_bpp) + "\n")
st.markdown(fmt.table([{_("precision · optimizer (impl)"): xcharts.row_label(r), _("weights"): bpp(r["weights"]),
           _("gradients (.grad)"): bpp(r["gradients"]), _("fp32 master weights"): bpp(r["master_weights"]),
           _("optimizer states"): bpp(r["optimizer_states"]), _("held (model states)"): bpp(r["held"]),
           _("gradients at the step"): bpp(r["step_gradients"]), _("step scratch"): bpp(r["optimizer_temporaries"]),
           _("at the optimizer step"): bpp(r["at_step"])} for r in rows]))
st.plotly_chart(xcharts.bytes_per_param_bars(rows, where_bpp), key="explain_bpp")
one_gpu = f["bytes_per_param"]
mixed = next((r for r in one_gpu if r["precision"] == "bf16-mixed" and r["optimizer"] == "adamw"), None)
lean = min(one_gpu, key=lambda r: r["held"]) if one_gpu else None
if mixed and lean:
    st.markdown("\n" + _("**Why bf16-mixed gradients are {grads} B and then {step_grads} B per parameter.** {why}. So, on "
                         "one GPU without ZeRO, bf16-mixed AdamW holds {held} B/param, the same as fp32, and {at_step} "
                         "B/param during a foreach step: above fp32's, because the 16-bit weights are kept beside the "
                         "fp32 master copy. The leanest there is **{lean}** at {lean_held} B/param: pure bf16 halves "
                         "the Adam states, and 8-bit AdamW shrinks them to about 2 B.",
                         grads=bpp(mixed["gradients"]), step_grads=bpp(mixed["step_gradients"]),
                         why=tr(mixed["step_gradients_why"]), held=bpp(mixed["held"]), at_step=bpp(mixed["at_step"]),
                         lean=xcharts.row_label(lean), lean_held=bpp(lean["held"])) + "\n")

# ---- optimizer states ----------------------------------------------------------------------
header(2)
st.markdown(_("Optimizer states for all {params} parameters of {name} in this scenario's precision (Adafactor keeps "
              "factored row/column statistics and no first moment; AdamW 8-bit keeps uint8 states plus an fp32 scale "
              "per 256-element block, bitsandbytes). **Optimizer states** here are the states alone; the fp32 master "
              "weights of mixed precision are counted separately (Bytes per parameter, above). The step scratch is "
              "foreach's temporary list; fused AdamW has none:", params=f"{n:,}", name=f["name"]))
st.markdown(fmt.table([{_("optimizer"): r["optimizer"], _("implementation"): r["impl"],
           _("states / param"): bpp(r["states_per_param"]), _("optimizer states"): g(r["states"]),
           _("step scratch"): g(r["scratch"]), _("peak"): gv(r["run"] and r["run"]["peak"]),
           _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"] and r["run"]["verdict"])}
          for r in f["optimizers"]]))

# ---- mixed precision -----------------------------------------------------------------------
header(3)
pr = {r["precision"]: r for r in f["precisions"]}
bf16_ok = (_("this GPU does") if f["gpu_bf16"] else _("this GPU does not") if f["gpu_bf16"] is not None
           else _("a custom GPU may or may not"))
st.markdown("\n" + _("**FP16 vs BF16.** Both are 16-bit. FP16 has more mantissa bits but a narrow exponent range (largest "
                     "value 65,504), so small gradients underflow and large activations overflow: training needs **loss "
                     "scaling** (PyTorch's `GradScaler`, DeepSpeed's dynamic `loss_scale`), which multiplies the loss "
                     "before backward and skips steps whose gradients overflow. BF16 keeps fp32's exponent range and "
                     "needs no scaling, but only Ampere (A100, RTX 30xx) and newer GPUs compute it natively; {bf16_ok}.",
                     bf16_ok=bf16_ok) + "\n\n"
            + _("**What each precision keeps.** Bytes per parameter from the table above, and this scenario's "
                "activations and peak:") + "\n")
st.markdown(fmt.table([{_("precision"): r["precision"], _("held / param"): bpp(r["per_param"]["held"]),
           _("at the step / param"): bpp(r["per_param"]["at_step"]),
           _("activations (largest)"): g(r["run"]["max_activations"]),
           _("of which autocast 16-bit weight copies"): g(r["autocast_copies"]) if r["autocast_copies"] else "—",
           _("peak"): g(r["run"]["peak"]), _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"]["verdict"])}
          for r in f["precisions"]]))
if "amp-bf16" in pr and "bf16-mixed" in pr and "fp32" in pr:
    amp, mx, f32 = pr["amp-bf16"], pr["bf16-mixed"], pr["fp32"]
    st.markdown("\n" + _("DeepSpeed-style mixed precision (bf16-mixed) keeps 16-bit weights and gradients **plus** fp32 "
                         "master weights and fp32 Adam moments: {mixed_held} B/param, no less than fp32's {fp32_held}. "
                         "PyTorch AMP (autocast) keeps everything in fp32 and casts to 16 bits on the fly. What 16-bit "
                         "compute changes is the **activations**: {fp32_act} in fp32, {mixed_act} with bf16 weights, "
                         "{amp_act} under AMP bf16. AMP's figure includes **{copies} of 16-bit weight copies**: autocast "
                         "casts each fp32 weight to bf16 for its matmul and autograd saves that copy for backward, so a "
                         "whole 16-bit copy of the decoder's weights sits among the activations until backward frees it.",
                         mixed_held=bpp(mx["per_param"]["held"]), fp32_held=bpp(f32["per_param"]["held"]),
                         fp32_act=g(f32["run"]["max_activations"]), mixed_act=g(mx["run"]["max_activations"]),
                         amp_act=g(amp["run"]["max_activations"]), copies=g(amp["autocast_copies"])) + "\n")

# ---- activation checkpointing --------------------------------------------------------------
header(4)
ck, k_sqrt = f["checkpointing"], f["k_sqrt"]
st.markdown("\n" + _("Backward needs what each layer saved in forward. Checkpointing a layer keeps only its input and "
                     "recomputes the rest during backward. Checkpointing **every layer** (Hugging Face's "
                     "`gradient_checkpointing_enable()`, what the engine models) keeps L = {layers} layer inputs plus "
                     "one layer's tensors while it is recomputed: still O(L), but with a tiny constant (one hidden "
                     "vector per token per layer). Chen et al. (2016) reach O(sqrt L) by checkpointing *segments* of "
                     "about sqrt(L) = {k} layers (`checkpoint_sequential`): sqrt(L) segment inputs plus one segment's "
                     "tensors during its recompute; the engine does not model segments. Checkpointing only **every k-th "
                     "layer** (the rows below) is the opposite trade: the other layers keep everything, so memory falls "
                     "between \"none\" and \"every layer\". **Selective** checkpointing (Korthikanti et al. 2022) "
                     "recomputes only the attention core, whose saved tensors grow with sequence length, for a small "
                     "fraction of the compute.", layers=f["layers"], k=k_sqrt) + "\n\n"
            + _("The lesson is in the **activations** column; the peak moves only when activations are what sets it:")
            + "\n")
st.markdown(fmt.table([{_("checkpointing"): say(r["label"]), _("activations (largest)"): g(r["run"]["max_activations"]),
           _("extra FLOPs (recompute)"): "—" if r["recompute"] is None else f"{100 * r['recompute']:.0f} %",
           _("step (calc.speed)"): secs(r["speed"] and r["speed"]["step_s"]), _("peak"): g(r["run"]["peak"]),
           _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"]["verdict"])} for r in ck]))
if ck and ck[0]["run"]["phase"] == "optimizer":
    st.info(_("Here the peak falls at the **optimizer step** ({peak}), where no activations are alive, so checkpointing "
              "cannot lower it: it frees activations that were never the limit. Reduce the model states first (ZeRO, "
              "8-bit AdamW, fused AdamW, LoRA).", peak=g(ck[0]["run"]["peak"])), icon=":material/info:")
if any(r["recompute"] is not None for r in ck):
    st.plotly_chart(xcharts.checkpointing_tradeoff(ck), key="explain_ckpt")
st.markdown("\n" + _("Caveats. Recomputation must reproduce the forward exactly: `torch.utils.checkpoint` saves and "
                     "restores the RNG state (`preserve_rng_state=True`) so dropout masks match, which costs a little "
                     "time. Layers with side effects in forward, such as BatchNorm's running statistics, are updated "
                     "twice unless excluded. Use `use_reentrant=False` (the non-reentrant implementation) in current "
                     "PyTorch.") + "\n")

# ---- FlashAttention ------------------------------------------------------------------------
header(5)
att = f["attention"]
st.markdown("\n" + _("Eager attention materialises the scores and the softmax probabilities, each batch x heads x S x S "
                     "({heads} heads here), and keeps them for backward. FlashAttention (Dao et al. 2022) and PyTorch's "
                     "SDPA kernels compute attention in tiles and keep only the output and the log-sum-exp: the S x S "
                     "terms disappear and **activations** grow linearly with the sequence. The saving is in the "
                     "activations; the peak follows only where activations set it:", heads=f["heads"]) + "\n")
st.plotly_chart(xcharts.attention_sweep(att, b["gpu"]), key="explain_attention")
st.markdown(fmt.table([{_("sequence length"): f"{r['seq']:,}" + (_(" (this scenario)") if r["current"] else ""),
           _("activations, eager"): g(r["eager"]["max_activations"]),
           _("activations, SDPA"): g(r["sdpa"]["max_activations"]),
           _("saved"): f"{100 * (1 - r['sdpa']['max_activations'] / r['eager']['max_activations']):.0f} %",
           _("peak eager (falls at)"): f"{g(r['eager']['peak'])} ({tr(r['eager']['phase'])})",
           _("peak SDPA (falls at)"): f"{g(r['sdpa']['peak'])} ({tr(r['sdpa']['phase'])})",
           _("SDPA verdict"): verdict(r["sdpa"]["verdict"])} for r in att]))
st.markdown(_("Other kernels with the same idea: **fused AdamW** (one kernel, no step scratch: compare the foreach and "
              "fused rows under [Optimizer states](#optimizer-states)), 8-bit optimizers, fused cross-entropy (no fp32 "
              "logits copy)."))

# ---- ZeRO -----------------------------------------------------------------------------------
header(6)
z = f["zero"]
zr = z["rows"]
z_label = say(z["label"]) if z["label"] else ""
z_gpu = z_label.split(" x ", 1)[-1] if z_label else ""
where = (_("**{hardware}** (the sidebar's GPU, {dp} of them: this scenario has {own}, and ZeRO needs several "
           "data-parallel GPUs)", hardware=z_label, dp=z["dp"], own=z["own_gpus"]) if z["switched"]
         else _("**{hardware}** (this scenario's hardware)", hardware=z_label))
st.markdown("\n" + _("ZeRO (Rajbhandari et al. 2020) removes the copies plain data parallelism keeps on every GPU. Stage "
                     "1 shards the optimizer states and fp32 master weights over the N data-parallel GPUs, stage 2 also "
                     "the gradients, stage 3 also the weights. The lesson is the **model states per GPU**, from the "
                     "bytes-per-parameter table x {params} parameters; the engine's peak adds activations, gathered "
                     "layers (stage 3) and reduce buckets (stage 2). On {where}:", params=f"{n:,}", where=where) + "\n")
st.markdown(fmt.table([{_("stage"): r["stage"], _("model states / param"): bpp(r["per_param"] and r["per_param"]["held"]),
           _("model states per GPU"): gv(r["per_param"] and r["per_param"]["held"] * r["per_param"]["params"]),
           _("at the optimizer step per GPU"): gv(r["per_param"] and r["per_param"]["at_step"] * r["per_param"]["params"]),
           _("engine peak"): gv(r["run"] and r["run"]["peak"]), _("peak falls at"): peak_at(r["run"]),
           _("verdict"): verdict(r["run"] and r["run"]["verdict"]),
           _("DP communication per step"): secs(r["comm_s"])} for r in zr]))
st.markdown(_("Per-GPU device total as the data-parallel group grows ({gpu} GPUs, same micro-batch per GPU, no tensor or "
              "pipeline parallelism): only stage 3 keeps falling, because the 16-bit weights are the last replicated "
              "state. On one GPU nothing is sharded, and stages 1 and 2 only add DeepSpeed's reduce buckets.",
              gpu=z_gpu))
st.plotly_chart(xcharts.zero_sweep(z["sweep"], z["gpu_bytes"], z_gpu or "GPU"), key="explain_zero")
if zr[0]["comm_s"] and zr[3]["comm_s"]:
    st.markdown("\n" + _("**Communication.** Plain data parallelism all-reduces the gradients each step. Stages 1 and 2 "
                         "replace it with a reduce-scatter of gradients and an all-gather of updated weights: the same "
                         "volume ({stage1} and {stage2} against {plain} over {interconnect} here). Stage 3 gathers the "
                         "weights in forward and again in backward: {ratio} x the data-parallel volume ({stage3}).",
                         stage1=secs(zr[1]["comm_s"]), stage2=secs(zr[2]["comm_s"]), plain=secs(zr[0]["comm_s"]),
                         interconnect=zr[0]["interconnect"], ratio=f"{zr[3]['comm_s'] / zr[0]['comm_s']:.2f}",
                         stage3=secs(zr[3]["comm_s"])))
st.markdown("\n" + _("DeepSpeed settings that matter (the Export page writes them): `overlap_comm` (hide reductions "
                     "behind backward), `contiguous_gradients` (one flat buffer, less fragmentation), "
                     "`reduce_bucket_size` ({bucket} elements by default: a bucket of that size lives on the GPU under "
                     "stage 2), `stage3_prefetch_bucket_size` ({prefetch}), `stage3_max_live_parameters` ({max_live}) "
                     "and `stage3_param_persistence_threshold` ({persistence}: smaller tensors stay unsharded).",
                     bucket=f"{z['bucket']:,}", prefetch=f"{z['prefetch']:,}", max_live=f"{z['max_live']:,}",
                     persistence=f"{z['persistence']:,}") + "\n")
st.page_link("pages/5_Export.py", label=_("Export: the ds_config.json for this scenario"), icon=":material/download:",
             query_params=state.page_params())

# ---- offload --------------------------------------------------------------------------------
header(7)
off = f["offload"]
pcie = f["pcie"]
base_step = off[0]["speed"]["step_s"] if off and off[0]["speed"] else None
pcie_text = _(" (gen {gen}: {gbps} GB/s per direction for this GPU)", gen=pcie["gen"],
              gbps=f"{pcie['bytes_per_s'] / 1e9:.0f}") if pcie else ""
nvme_text = _(" ({gbps} GB/s per node assumed)", gbps=f"{f['nvme_bytes_per_s'] / 1e9:.1f}") \
    if f["nvme_bytes_per_s"] else ""
st.markdown("\n" + _("ZeRO-Offload moves the optimizer states, fp32 master weights and gradients to host memory and runs "
                     "the update on the CPU (DeepSpeed's CPUAdam); ZeRO-Infinity can put them, or the weights (stage 3), "
                     "on NVMe. The GPU's memory falls; what rises is **host RAM** and **step time**: every step moves "
                     "gradients down and weights up over PCIe{pcie}, and NVMe is slower still{nvme}. Host buffers are "
                     "**pinned** (page-locked) to reach that bandwidth and cannot be swapped: the host needs RAM for "
                     "all of it.", pcie=pcie_text, nvme=nvme_text) + "\n")
st.markdown(fmt.table([{_("setup"): say(r["label"]), _("GPU peak"): g(r["run"]["peak"]), _("peak falls at"): peak_at(r["run"]),
           _("host RAM per node"): g(r["run"]["cpu_ram"]) + (_(" of {total}", total=g(f["host_ram"])) if f["host_ram"]
                                                            else ""),
           _("NVMe per node"): g(r["run"]["nvme"]), _("step (calc.speed)"): secs(r["speed"] and r["speed"]["step_s"]),
           _("of which offload"): secs(r["speed"] and r["speed"]["offload_s"]),
           _("slowdown"): "—" if not (r["speed"] and base_step) else f"{r['speed']['step_s'] / base_step:.1f} x",
           _("verdict"): verdict(r["run"]["verdict"])} for r in off]))
if not f["host_ram"]:
    st.caption(_("This hardware does not say how much host RAM it has: pick a cluster preset (or set it) to check the "
                 "offload against it."))

# ---- parallelism ----------------------------------------------------------------------------
header(8)
st.markdown("\n" + _("**Data parallel** replicates the model and splits the batch (memory relief only with ZeRO, above). "
                     "**Tensor parallel** (Megatron-LM) splits each layer's matrices across GPUs: weights, gradients, "
                     "optimizer states and most activations divide by the degree; it all-reduces activations twice per "
                     "layer each way, so it stays inside an NVLink node. **Pipeline parallel** places consecutive layers "
                     "on different GPUs; the first stage holds activations of up to `pp` micro-batches in flight (1F1B). "
                     "Per GPU, for this model (ZeRO off, same micro-batch), on the hardware each row names:") + "\n")
st.markdown(fmt.table([{_("layout"): say(r["label"]), _("hardware"): say(r["hardware"]), _("peak"): g(r["run"]["peak"]),
           _("weights"): g(r["run"]["parameters"]), _("activations (largest)"): g(r["run"]["max_activations"]),
           _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"]["verdict"])} for r in f["parallel"]]))
st.markdown("\n" + _("**Sequence parallelism, two different things.** Megatron's *sequence parallelism* (Korthikanti et "
                     "al. 2022) works only together with tensor parallelism: it splits along the sequence the LayerNorm "
                     "and dropout activations that tensor parallelism leaves replicated (the row above with \"+ sequence "
                     "parallel\"). **Context parallelism** (ring attention; Megatron-Core `context_parallel_size`, "
                     "DeepSpeed Ulysses, PyTorch's `context_parallel`) splits the *whole* sequence across GPUs, attention "
                     "included, exchanging keys and values: this is what the articles' \"sequence parallel for 32k "
                     "context\" means, since it is what divides a 32k-token sequence's activations by the degree. The "
                     "engine does not model context parallelism yet.") + "\n\n"
            + _("**Choosing FSDP, DeepSpeed or Megatron.** *PyTorch FSDP2* (`fully_shard`) is ZeRO-3 (or ZeRO-2 with "
                "`reshard_after_forward=False`) inside PyTorch: no extra dependency, composes with `torch.compile` and "
                "tensor parallel (DTensor); no built-in NVMe offload. *DeepSpeed ZeRO* offers every stage, CPU and NVMe "
                "offload (ZeRO-Offload / Infinity) and works through the Hugging Face Trainer / accelerate with a JSON "
                "config (the Export page writes it): the choice when the model must spill out of GPU memory. "
                "*Megatron-LM / Megatron-Core* gives tensor, pipeline, sequence, context and expert parallelism with "
                "fused kernels: the choice for pre-training at hundreds of GPUs, at the cost of its own model code. For "
                "fine-tuning up to ~70B on one or a few nodes, FSDP2 or DeepSpeed ZeRO-3 is usually enough.") + "\n")
st.page_link("pages/5_Export.py", label=_("Export: the ds_config.json for this scenario"), icon=":material/download:",
             query_params=state.page_params())
if f["experts"] > 1:
    st.markdown(_("**Expert parallel.** {name} has {experts} experts per layer: {params} parameters in total, {active} "
                  "active per token. Expert parallelism (transformers' `ep_size`) gives each GPU only its share of every "
                  "layer's experts and sends each token to its experts' GPUs with an all-to-all. Under FSDP2 the stored "
                  "shards stay the same; what shrinks is each layer's gathered experts, while every MoE layer adds the "
                  "dispatch and combine buffers (tokens x top_k x hidden). Per GPU, FSDP2 ZeRO-3, balanced routing:",
                  name=f["name"], experts=f["experts"], params=f"{n:,}", active=f"{f['active_params']:,}"))
    st.markdown(fmt.table([{_("experts split over"): r["ep"], _("hardware"): say(r["hardware"]), _("peak"): g(r["run"]["peak"]),
               _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"]["verdict"])}
              for r in f["expert_parallel"]]))
else:
    st.markdown(_("**Expert parallel** places the experts of mixture-of-experts models (e.g. Mixtral) on different GPUs; "
                  "this model is dense."))

# ---- quantization and LoRA ------------------------------------------------------------------
header(9)
st.markdown("\n" + _("LoRA freezes the base model and trains small low-rank adapters: gradients and optimizer states exist "
                     "only for the adapters. QLoRA (Dettmers et al. 2023) also stores the frozen base weights in 4-bit "
                     "NF4 and dequantizes them to bf16 layer by layer for each matmul. It does **not** quantize the "
                     "optimizer states: the adapters' AdamW states stay fp32. Training this model:") + "\n")
lora, inf = f["lora"], f["inference"]
st.markdown(fmt.table([{_("setup"): say(r["label"]), _("trainable params"): f"{r['run']['trainable']:,}",
           _("weights"): g(r["run"]["max_parameters"]), _("gradients (largest)"): g(r["run"]["max_gradients"]),
           _("optimizer states + master (largest)"): g(r["run"]["max_optimizer_states"]),
           _("peak"): g(r["run"]["peak"]), _("peak falls at"): peak_at(r["run"]), _("verdict"): verdict(r["run"]["verdict"])}
          for r in lora]))
st.markdown(_("Inference with quantized weights (GPTQ / AWQ / bitsandbytes store weights the same way):"))
st.markdown(fmt.table([{_("weights"): say(r["label"]), _("weights size"): g(r["run"]["max_parameters"]), _("peak"): g(r["run"]["peak"]),
           _("verdict"): verdict(r["run"]["verdict"])} for r in inf]))

# ---- what to try, in order ------------------------------------------------------------------
header(10)
st.markdown("\n" + _("The articles' advice: cheapest first. Mixed precision, then FlashAttention, then checkpointing, then "
                     "ZeRO stages, then offload; change the method (8-bit optimizer, LoRA, QLoRA) when nothing else "
                     "fits. The recommender's waterfall does exactly that for **this** scenario, each step on top of the "
                     "previous ones:") + "\n")
try:
    steps = compute.waterfall(key) if sc.mode.value == "train" else []
except ValueError as exc:
    st.warning(_("calc.recommend cannot build the waterfall for this scenario: {error}",
                 error=fmt.literal(state.error_text(exc))))
    steps = []
if steps:
    st.markdown(fmt.table([{_("step"): fmt.plain(f"{s.step}. {say(s.name)}"), _("turns on"): fmt.plain(say(s.change)),
               _("device total"): g(s.device_total_expected_bytes), _("host RAM per node"): g(s.cpu_ram_bytes),
               _("verdict"): verdict(s.verdict),
               _("tokens/s per GPU"): "—" if s.tokens_per_s_per_gpu is None else f"{s.tokens_per_s_per_gpu:,.0f}"}
              for s in steps]))
    first = next((s for s in steps if s.fits), None)
    st.markdown(_("The first step that fits: **{step}. {name}**.", step=first.step, name=say(first.name)) if first else
                _("No step fits this hardware: more GPUs, a shorter sequence or a smaller model."))
else:
    st.markdown(_("Switch the sidebar to training to see the waterfall."))
st.page_link("pages/3_Recommend.py", label=_("Recommend: the waterfall as a chart, and the fastest configurations that fit"),
             icon=":material/recommend:", query_params=state.page_params())

# ---- worked recipes -------------------------------------------------------------------------
header(11)
st.markdown(_("Questions readers of the articles ask, answered by the engine (memory per GPU, host RAM, NVMe) and the "
              "speed model. The sidebar's scenario does not change these."))
for rec in recipe_rows():
    st.subheader(tr(rec["title"]))
    st.caption(tr(rec["setting"]))
    st.markdown(fmt.table([{_("recipe"): tr(r["label"]), _("device total per GPU"): g(r["run"]["device"]),
               _("host RAM per node"): g(r["run"]["cpu_ram"]), _("verdict"): verdict(r["run"]["verdict"]),
               _("tokens/s per GPU"): "—" if not r["speed"] else
               f"{r['speed']['tokens_per_s_per_gpu']:,.0f} ({say(per_step_words(r['tokens_per_step']))})",
               _("why"): fmt.plain(tr(r["note"]) + (" " + say(r["host_words"]) if r["host_words"] else ""))}
              for r in rec["rows"]]))

# ---- model size x hardware ------------------------------------------------------------------
header(12)
claims = claim_rows(current())
table_rows = [c for c in claims if c["id"].startswith("a0-table-")]
st.markdown(_("Article 000's recommendation table, row by row, checked for the largest model of each row (2,048 tokens, "
              "AdamW, foreach):"))
# the row quoted in the article's words (in quotation marks), then what it says in the reader's language
st.markdown(fmt.table([{_("article's row"): _("“{quote}”: {gist}", quote=c["original"], gist=c["claim"]),
                        _("engine's setting and answer"): c["engine"],
           _("verdict"): c["verdict_text"], _("why"): c["why"]} for c in table_rows]))
st.page_link("pages/3_Recommend.py", label=_("Recommend: the model-size x hardware table, every cell searched"),
             icon=":material/table:", query_params=state.page_params())

# ---- largest micro-batch --------------------------------------------------------------------
header(13)
bf = article_batch_formula(sc)
if bf is None:
    st.markdown(_("Choose a GPU in the sidebar to compare the formula with the engine's search."))
else:
    found = compute.largest_fitting(key, "micro_batch_size")
    st.markdown("\n" + _("Article 001's formula: **max_batch_size = (total memory - static overhead) / (per-sample "
                         "memory x parallel degree)**, keeping a 10 % safety margin. Fed with the engine's own terms for "
                         "this scenario, per GPU (parallel degree 1):") + "\n\n"
                + "- " + _("usable memory: {gpu} - 10 % = {usable}", gpu=g(bf.gpu_bytes), usable=g(bf.usable_bytes)) + "\n"
                + "- " + _("static: model states, each at its largest, + CUDA context + NCCL buffers = {static}",
                           static=g(bf.static_bytes)) + "\n"
                + "- " + _("per sample: activations of one sequence at their largest = {per_sample}",
                           per_sample=g(bf.per_sample_bytes)) + "\n"
                + "- " + _("formula: ({usable} - {static}) / {per_sample} = **{batch}**", usable=g(bf.usable_bytes),
                           static=g(bf.static_bytes), per_sample=g(bf.per_sample_bytes), batch=bf.formula_batch)
                + "\n\n"
                + _("The engine's search (`calc.memory.fit`, which runs the whole step at each batch size): **{found}**. The "
                    "formula assumes memory grows in two separate blocks; in a real step the activations peak in "
                    "backward while gradients are being created, transients (logits, attention workspaces) grow with the "
                    "batch too, and the optimizer step's scratch does not; so it can be off in either direction. Search, "
                    "or run a few steps and read `max_memory_allocated()`.", found=found) + "\n")

# ---- monitoring -----------------------------------------------------------------------------
header(14)
st.markdown("\n" + _("The engine predicts `torch.cuda.max_memory_allocated()` ({peak} here). nvidia-smi shows more: the "
                     "CUDA context and the allocator's reserved-but-free blocks (expected device total {device}).",
                     peak=g(b["peak"]), device=g(b["device"])) + "\n")
st.code(_("""import torch
torch.cuda.reset_peak_memory_stats()
# ... one training step ...
print(torch.cuda.max_memory_allocated() / 2**30, "GiB allocated at the peak")
print(torch.cuda.max_memory_reserved() / 2**30, "GiB reserved by the caching allocator")
print(torch.cuda.memory_summary())               # per-pool table, retries, fragmentation

# where every byte came from: record, then open the pickle at https://pytorch.org/memory_viz
torch.cuda.memory._record_memory_history(max_entries=100_000)
# ... a few steps ...
torch.cuda.memory._dump_snapshot("snapshot.pickle")"""), language="python")

# ---- troubleshooting ------------------------------------------------------------------------
header(15)
need_ram = _("this scenario needs {ram} per node", ram=g(b["cpu_ram"])) if b["cpu_ram"] else \
    _("turn offload on in the sidebar to see how much this scenario needs")
st.markdown("\n" + "\n".join("- " + item for item in (
    _("**OOM although nvidia-smi shows free memory.** The caching allocator holds blocks that are free but too "
      "fragmented for the next request; `memory_summary()` shows a large gap between reserved and allocated and "
      "`num_alloc_retries` > 0. Here the engine expects {reserve_low} to {reserve_high} of reserve. Set "
      "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (segments grow instead of new ones being carved), keep tensor "
      "shapes constant (pad to fixed lengths), and call `torch.cuda.empty_cache()` only between phases.",
      reserve_low=g(f["overhead"]["reserve_low"]), reserve_high=g(f["overhead"]["reserve_high"])),
    _("**FP16 loss becomes NaN / inf.** Overflow in fp16 activations or gradients: use bf16 if the GPU supports it, else "
      "dynamic loss scaling (`GradScaler`, DeepSpeed `{config}`) and check that softmax and losses run in fp32.",
      config='"fp16": {"loss_scale": 0}'),
    _("**ZeRO-3 is slow.** Every layer's weights are gathered twice per step (the [ZeRO](#zero) section's communication "
      "figures); raise `stage3_prefetch_bucket_size`, keep small tensors persistent, keep the job inside NVLink nodes, or "
      "use stage 2 when the model states fit."),
    _("**The host runs out of RAM under offload.** Offloaded states live in pinned host memory for every GPU of the "
      "node: {need_ram}. Use NVMe offload, fewer GPUs per node, or ZeRO stage 3 across more nodes.", need_ram=need_ram),
    _("**Checkpointed training is unstable or non-deterministic.** Keep `preserve_rng_state=True` and avoid side effects "
      "in checkpointed forward code."),
)) + "\n")

# ---- serving: the KV cache ------------------------------------------------------------------
header(16)
draw_serving_lesson(sc)

# ---- common claims, checked -----------------------------------------------------------------
header(17)
counts = verdict_counts(claims)
names = article_names(current())
st.markdown("\n" + _("Every quantitative claim of the two source articles ({articles}), quoted in the original with its "
                     "English gist and section, next to the engine's figure for the same setting. {count} claims: "
                     "{counts}. A claim quoted in GB is compared in GB (10^9 bytes), with GiB alongside; a figure within "
                     "10 % of the claim (or of a stated range or bound) holds. The claims and their settings live in "
                     "`data/claims.yaml`; a test recomputes every verdict.",
                     articles=_("; ").join(f"**{k}**: {v}" for k, v in names.items()), count=len(claims),
                     counts=_(", ").join(_("{count} {verdict}", count=v, verdict=k)
                                         for k, v in counts.most_common())) + "\n")
# Each article's table (a row per claim, in the original words) is filled only when opened: the two are most of
# the page's text, and the browser would lay them out before drawing the page's first chart.
for art in ("000", "001"):
    article = st.expander(_("Article {number}: {name}", number=art, name=names[art]), key=f"explain_claims_{art}",
                          on_change="rerun")
    if not article.open:
        continue
    article.markdown(fmt.table([{_("section"): c["section"], _("original"): c["original"], _("claim"): c["claim"],
               _("claimed"): c["claimed"], _("engine (setting)"): c["engine"], _("verdict"): c["verdict_text"],
               _("why"): c["why"]} for c in claims if c["article"] == art]))

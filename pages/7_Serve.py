"""Serve: a model on a GPU with vLLM or SGLang: how many requests of which context fit, where the memory goes,
and the command that starts it (calc.serve)."""

from __future__ import annotations

import streamlit as st
from pydantic import ValidationError

from calc.contract.presets import resolve_model
from calc.contract.scenario import InferenceWeights, Scenario
from calc.serve.budget import checkpoint_weights
from calc.serve.plan import concurrency_curve, launch_command, plan, utilization_for
from ui import compute, fmt, state
from ui import serving_charts as charts
from ui.language import _
from ui.widgets import page_setup

page_setup("Serve", ":material/dns:")
st.title(_("Serve a model"))
st.caption(_("What a serving engine does with each GPU, read from vLLM 0.13's source: the budget is "
             "gpu_memory_utilization x the GPU's total memory, minus the weights, the profile run's activation "
             "peak and non-torch memory; the rest becomes KV cache blocks. Sizes in GiB (2^30 bytes)."))

# "" = as the model's hub checkpoint stores them (gpt-oss: MXFP4 experts), what `vllm serve <model>` loads
WEIGHTS: tuple[str, ...] = ("", *InferenceWeights.__args__)  # type: ignore[attr-defined]
model_names, gpu_names = compute.model_options(), compute.gpu_options()
models, gpus = list(model_names), list(gpu_names)
# the first visit starts from the scenario the other pages share: its model (a preset) and its GPU
current = state.get_scenario()
start_model = current.model if isinstance(current.model, str) and current.model in model_names else "llama-3.1-8b"
start_gpu = current.resolved_hardware().gpu if current.resolved_hardware().gpu in gpu_names else "h100-sxm"
c1, c2, c3 = st.columns(3)
model = c1.selectbox(_("Model"), models, index=models.index(start_model), key="srv_model",
                     format_func=model_names.__getitem__)
gpu = c2.selectbox(_("GPU"), gpus, index=gpus.index(start_gpu), key="srv_gpu", format_func=gpu_names.__getitem__)
tp = c3.number_input(_("GPUs per replica (tensor parallel)"), 1, 64, 1, key="srv_tp")
c4, c5, c6 = st.columns(3)
engine = c4.radio(_("Engine"), ["vllm", "sglang"], horizontal=True, key="srv_engine")
weights = c5.selectbox(_("Weights"), WEIGHTS, key="srv_weights",
                       format_func=lambda w: w or _("as the checkpoint stores them ({weights})",
                                                    weights=checkpoint_weights(model)))
kv_dtype = c6.radio(_("KV cache dtype"), ["auto", "fp8"], horizontal=True, key="srv_kv")
c7, c8, c9 = st.columns(3)
util = c7.slider(_("gpu_memory_utilization (SGLang: mem_fraction_static)"), 0.10, 0.99, 0.90, 0.01, key="srv_util")
length = c8.number_input(_("max_model_len (0 = the model's context)"), 0, 10_485_760,
                         min(8192, resolve_model(start_model).max_position_embeddings), 1024, key="srv_len")
graphs = c9.checkbox(_("CUDA graphs"), True, key="srv_graphs")

try:
    sc = Scenario.model_validate({
        "model": model, "mode": "serve", "hardware": {"gpu": gpu, "num_gpus": int(tp)},
        "inference": {"weights": weights} if weights else {},
        "serving": {"engine": engine, "gpu_memory_utilization": util, "max_model_len": int(length) or None,
                    "kv_cache_dtype": kv_dtype, "tensor_parallel": int(tp), "cuda_graphs": graphs}})
    result = plan(sc)
except (ValueError, ValidationError) as exc:
    st.error(_("This setup cannot be planned: {problem}", problem=fmt.literal(state.error_text(exc))),
             icon=":material/error:")
    st.stop()

if result.starts:
    st.success(_("About **{n}** requests of {length} tokens at once; {tokens} tokens of KV cache.",
                 n=f"{result.max_concurrency:,.2f}", length=f"{result.max_model_len:,}",
                 tokens=f"{result.kv_cache_tokens:,}"),
               icon=":material/check_circle:")
elif result.reason == "max_model_len":
    st.error(_("Does not start: one request of {length} tokens needs {short} more KV cache than the budget "
               "leaves; the longest that starts is {longest} tokens.", length=f"{result.max_model_len:,}",
               short=fmt.gib(result.shortfall_bytes), longest=f"{result.largest_max_model_len:,}"),
             icon=":material/error:")
else:
    st.error(_("Does not start: the memory needed before the KV cache exceeds what is available by {short}.",
               short=fmt.gib(result.shortfall_bytes)), icon=":material/error:")

m1, m2, m3, m4 = st.columns(4)
m1.metric(_("Weights (GiB)"), fmt.gib(result.weights_bytes), help=fmt.bytes_exact(result.weights_bytes))
m2.metric(_("KV cache (GiB)"), fmt.gib(result.kv_cache_bytes), help=fmt.bytes_exact(result.kv_cache_bytes))
m3.metric(_("KV cache per token (bytes)"), f"{result.kv_bytes_per_token:,}")
m4.metric(_("Longest context that starts (tokens)"), f"{result.largest_max_model_len:,}")

st.subheader(_("Where each GPU's memory goes"))
st.plotly_chart(charts.budget_bar(result), key="srv_budget")

st.subheader(_("Requests at once against context length"))
top = sc.spec.max_position_embeddings
lengths = sorted({min(2**k, top) for k in range(10, 25)})
st.plotly_chart(charts.concurrency_chart(concurrency_curve(sc, lengths)), key="srv_curve")

st.subheader(_("Launch it"))
st.code(launch_command(sc), language="bash")
target = st.number_input(_("Requests of max_model_len you need at once"), 1, 100_000, 8, key="srv_target")
needed = utilization_for(sc, float(target))
if needed is None:
    st.warning(_("{n} requests of {length} tokens do not fit on this GPU at any memory share.", n=int(target),
                 length=f"{result.max_model_len:,}"), icon=":material/warning:")
else:
    st.markdown(_("{n} requests of {length} tokens need a memory share of at least **{util}**.",
                  n=int(target), length=f"{result.max_model_len:,}", util=f"{needed:.3f}"))

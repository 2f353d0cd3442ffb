"""The Recommend page's model x hardware table, serving view: what vLLM gives per model preset x hardware
(calc.serve.table.serving_cell, cached by ui.compute.serving_cells), worded in the session's language."""

from __future__ import annotations

import streamlit as st

from calc.contract.presets import cluster_presets, gpu_presets, model_presets
from calc.recommend import TABLE_HARDWARE, TABLE_MODELS
from calc.serve.table import ServingCell
from ui import compute, fmt
from ui.compare_columns import cluster_short_name
from ui.language import _


def hardware_label(h: str) -> str:
    return cluster_short_name(h) if h in cluster_presets() else gpu_presets()[h].name


def serving_cell_text(c: ServingCell, context: int) -> str:
    """One cell: requests at once over all replicas, or why the server does not start."""
    limit = _(" (at {context} tokens, the model's limit)", context=f"{c.context:,}") if c.context < context else ""
    if c.starts:
        fields = dict(total=f"{c.total_concurrency:,.1f}", tp=c.tensor_parallel, replicas=c.replicas,
                      per=f"{c.max_concurrency:,.1f}")
        text = _("{total} requests (TP {tp})", **fields) if c.replicas == 1 else \
            _("{total} requests ({replicas} replicas of TP {tp}, {per} each)", **fields)
        return text + limit
    fields = dict(weights=fmt.gib(c.weights_bytes), budget=fmt.gib(c.budget_bytes), tp=c.tensor_parallel)
    if c.reason == "no_kv_memory" and c.weights_exceed_budget:
        return _("does not start (weights {weights} > budget {budget} per GPU at TP {tp})", **fields)
    if c.reason == "no_kv_memory":
        return _("does not start (weights {weights} and the profile run leave no KV cache in the {budget} budget "
                 "per GPU at TP {tp})", **fields)
    if c.reason == "max_model_len":
        return _("does not start (one request of {context} tokens needs more KV cache than is left at TP {tp})",
                 context=f"{c.context:,}", tp=c.tensor_parallel) + limit
    return _("does not start (less free memory than the budget {budget})", **fields)


def draw_serving_table(context: int) -> None:
    """The sentence that states the view's assumptions, then the table."""
    cells = compute.serving_cells(context)
    util = cells[0][0].gpu_memory_utilization
    st.markdown(_("Each cell: **vLLM 0.13** with its defaults (gpu_memory_utilization {util}, KV cache in the "
                  "model's 16-bit dtype (`--kv-cache-dtype auto`), block size 16, CUDA graphs), serving requests of "
                  "**{context} tokens** (the model's own limit when shorter). A replica spans the fewest GPUs of one "
                  "node (tensor parallelism TP 1, 2, 4 or 8) at which the server starts; replicas fill the other "
                  "GPUs. The figure is how many requests of that length fit in the KV cache at once, over all "
                  "replicas (the scheduler also caps each replica's batch at max_num_seqs: 256, or 1,024 on "
                  "H100-class GPUs). Weights and budget per GPU, in GiB (2^30 bytes).", util=f"{util:g}",
                  context=f"{context:,}"))
    models = model_presets()
    grid = [{_("model"): f"{models[m].name} ({models[m].spec.total_params() / 1e9:,.1f} B)",
             **{hardware_label(h): serving_cell_text(c, context) for h, c in zip(TABLE_HARDWARE, row, strict=True)}}
            for m, row in zip(TABLE_MODELS, cells, strict=True)]
    st.markdown(fmt.table(grid))
    st.page_link("pages/7_Serve.py", label=_("Serve: plan one of these servers in detail"), icon=":material/dns:")

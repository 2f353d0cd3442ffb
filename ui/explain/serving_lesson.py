"""The Explain page's serving lesson: why the KV cache dominates serving memory, what GQA, MLA, sliding windows and
an fp8 KV cache do to it, and what gpu_memory_utilization is a share of. Every figure is calc.serve.lesson's for
the sidebar's model served with vLLM's defaults on its GPU; this module words and draws them."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from calc.contract.scenario import Scenario
from calc.contract.units import KiB
from calc.serve.lesson import LONG_CONTEXT, FeatureRow, PairOutcome, ServeLesson, serving_lesson
from calc.serve.plan import ServePlan
from ui import fmt, state
from ui import serving_charts as serve_charts
from ui.language import _

g = fmt.gib


@st.cache_data(max_entries=32, show_spinner=False)
def lesson_for(scenario_json: str) -> ServeLesson:
    """calc.serve.lesson.serving_lesson for one scenario (cached: a dozen plans)."""
    return serving_lesson(Scenario.model_validate_json(scenario_json))


def kib(n_bytes: int) -> str:
    return f"{n_bytes / KiB:,.0f} KiB" if n_bytes % KiB == 0 else f"{n_bytes / KiB:,.2f} KiB"


def times(a: int, b: int) -> str:
    return f"{a / b:,.1f}" if a >= b else f"{a / b:,.2f}"


def why_kv_dominates(x: ServeLesson) -> None:
    p = x.plan
    if x.mla:
        formula = _("{layers} layers x ({rank} kv_lora_rank + {rope} qk_rope_head_dim) x {dtype} bytes = "
                    "**{bytes} bytes** ({kib}) per token", layers=x.layers, rank=x.latent_dims[0],
                    rope=x.latent_dims[1], dtype=x.dtype_bytes,
                    bytes=f"{x.formula_bytes_per_token:,}", kib=kib(x.formula_bytes_per_token))
    else:
        formula = _("2 (K and V) x {layers} layers x {kv_heads} KV heads x {head_dim} (head_dim) x {dtype} bytes = "
                    "**{bytes} bytes** ({kib}) per token", layers=x.layers, kv_heads=x.kv_heads, head_dim=x.head_dim,
                    dtype=x.dtype_bytes, bytes=f"{x.formula_bytes_per_token:,}", kib=kib(x.formula_bytes_per_token))
    st.markdown("\n" + _("Training memory is model states and activations; serving memory is the **weights once, then "
                         "the KV cache**: every request keeps the keys and values of every token it has seen, in every "
                         "layer, for as long as it runs. The figures below serve **{name}** with vLLM's defaults on "
                         "one {gpu} GPU ({total} in total). One token of KV cache costs {formula}; the engine's spec "
                         "classes (`calc.serve.kv_cache`) give {engine} bytes.", name=x.name,
                         gpu=x.gpu_name, total=g(x.gpu_memory_bytes), formula=formula,
                         engine=f"{p.kv_bytes_per_token:,}") + "\n\n"
                + _("A typical load of {requests} requests of {context} tokens holds {requests} x {context} x "
                    "{kib} = **{kv}** of KV cache, {ratio} x the {weights} of weights.", requests=x.requests,
                    context=f"{x.context:,}", kib=kib(p.kv_bytes_per_token), kv=g(x.typical_kv_bytes),
                    ratio=times(x.typical_kv_bytes, p.weights_bytes), weights=g(p.weights_bytes)) + " "
                + on_this_gpu(p) + "\n")
    st.plotly_chart(serve_charts.budget_bar(p), key="explain_serve_budget")


def on_this_gpu(p: ServePlan) -> str:
    """What vLLM does with the rest of its budget on this GPU, or why it does not start."""
    if p.reason == "no_kv_memory":
        return _("On this GPU vLLM does not start: the weights ({weights}), the profile run's activation peak "
                 "({activations}) and non-torch memory exceed its budget of {budget}, and no KV cache is left. "
                 "Tensor parallelism over more GPUs, or quantized weights, make room.", weights=g(p.weights_bytes),
                 activations=g(p.activation_peak_bytes), budget=g(p.requested_bytes))
    text = _("On this GPU vLLM loads the weights, profiles the activation peak ({activations}) and gives the rest of "
             "its budget to the KV cache: **{cache}**, {tokens} tokens, about {concurrency} requests of its "
             "{length}-token context at once.", activations=g(p.activation_peak_bytes), cache=g(p.kv_cache_bytes),
             tokens=f"{p.kv_cache_tokens:,}", concurrency=f"{p.max_concurrency:,.2f}", length=f"{p.max_model_len:,}")
    if p.reason == "max_model_len":
        text += " " + _("That is less than one: vLLM refuses to start at this context; the longest max_model_len "
                        "that starts is {longest} tokens.", longest=f"{p.largest_max_model_len:,}")
    return text


def whose(row: FeatureRow) -> str:
    return _("this model ({name})", name=row.name) if row.preset is None else \
        _("the {name} preset (this model lacks it)", name=row.name)


def what_shrinks_it(x: ServeLesson) -> None:
    f = x.features
    gqa, mla, sw, fp8 = f["gqa"], f["mla"], f["sliding"], f["fp8"]
    items = (
        _("**GQA** (grouped-query attention: fewer KV heads than attention heads) shares each K/V head among several "
          "query heads. For {who}: {with_kv} per token, against {without} if every attention head kept its own K and "
          "V ({ratio} x less).", who=whose(gqa), with_kv=kib(gqa.with_bytes), without=kib(gqa.without_bytes),
          ratio=times(gqa.without_bytes, gqa.with_bytes)),
        _("**MLA** (multi-head latent attention, DeepSeek-V2/V3) caches one compressed latent of kv_lora_rank + "
          "rope dimensions per token and layer instead of K and V per head. For {who}: {with_kv} per token, against "
          "{without} for the same heads in multi-head form ({ratio} x less).", who=whose(mla),
          with_kv=kib(mla.with_bytes), without=kib(mla.without_bytes), ratio=times(mla.without_bytes, mla.with_bytes)),
        _("**Sliding windows** (Gemma's local layers, Mistral 7B v0.1) keep only the last window of tokens in the "
          "layers that slide (plus one scheduled chunk, in whole blocks); the other layers keep everything. For "
          "{who}, one request of {context} tokens holds {with_kv}, against {without} if every layer kept every "
          "token ({ratio} x less).", who=whose(sw), context=f"{LONG_CONTEXT:,}", with_kv=g(sw.with_bytes),
          without=g(sw.without_bytes), ratio=times(sw.without_bytes, sw.with_bytes)),
        _("**fp8 KV cache** (`--kv-cache-dtype fp8`) stores one byte per value instead of the model's two: for "
          "{who}, {with_kv} per token instead of {without}, so the same budget holds twice the tokens (at some cost "
          "in accuracy).", who=whose(fp8), with_kv=kib(fp8.with_bytes), without=kib(fp8.without_bytes)),
    )
    st.markdown("\n" + _("What each technique does to the bytes per token (the engine's figures):") + "\n\n"
                + "\n".join("- " + item for item in items) + "\n")
    st.plotly_chart(kv_per_token_chart(x), key="explain_serve_kv")


def kv_per_token_chart(x: ServeLesson) -> go.Figure:
    """KV cache per token (KiB): each technique's model with it and without it."""
    f = x.features
    rows = [(f"fp8: {f['fp8'].name}", f["fp8"].without_bytes, f["fp8"].with_bytes),
            (f"GQA: {f['gqa'].name}", f["gqa"].without_bytes, f["gqa"].with_bytes),
            (f"MLA: {f['mla'].name}", f["mla"].without_bytes, f["mla"].with_bytes)]
    fig = go.Figure()
    for name, i, colour in ((_("without it"), 1, "#bab0ac"), (_("with it"), 2, "#54a24b")):
        fig.add_bar(y=[fmt.plot_text(r[0]) for r in rows], x=[r[i] / KiB for r in rows], orientation="h", name=name,
                    marker_color=colour, hovertemplate="%{x:,.1f} KiB<extra>%{fullData.name}</extra>")
    fig.update_layout(height=260, barmode="group", margin=dict(l=10, r=10, t=30, b=10), xaxis_type="log", xaxis_dtick=1,
                      xaxis_title=_("KV cache per token (KiB, log scale)"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig


REASONS = {
    "starts": lambda o: _("it starts"),
    "free_memory": lambda o: _("it refuses to start: the free memory ({free}) is below the requested {requested}",
                               free=g(o.free_bytes), requested=g(o.requested_bytes)),
    "no_kv_memory": lambda o: _("it passes the free-memory check ({free} free), but its budget of {requested} "
                                "cannot hold the weights and the profile run: no KV cache is left",
                                free=g(o.free_bytes), requested=g(o.requested_bytes)),
    "max_model_len": lambda o: _("it passes the free-memory check ({free} free), but the KV cache left is too small "
                                 "for one request of the full context", free=g(o.free_bytes)),
}


def pair_line(o: PairOutcome) -> str:
    return _("both at {util}: the second asks for {util} x total = {requested} and sees {free} free; {outcome}.",
             util=f"{o.utilization:g}", requested=g(o.requested_bytes), free=g(max(o.free_bytes, 0)),
             outcome=REASONS[o.reason](o))


def utilization_share(x: ServeLesson) -> None:
    p = x.plan
    half = x.pairs[-1]
    st.markdown("\n" + _("**gpu_memory_utilization is a share of the GPU's total memory, not of what is free.** vLLM "
                         "reads the total from `torch.cuda.mem_get_info` and asks for {util} x {total} = **{requested}**"
                         " as its budget; at start it checks that at least that much is free, and refuses with "
                         "`Free memory on device ... is less than desired GPU memory utilization` otherwise. Alone "
                         "on this GPU, {free} is free after its own CUDA context, so it starts; the {headroom} left "
                         "outside the budget holds its CUDA graphs and the context.", util=f"{p.gpu_memory_utilization:g}",
                         total=g(p.gpu_memory_bytes), requested=g(p.requested_bytes), free=g(x.free_at_start_bytes),
                         headroom=g(p.gpu_memory_bytes - p.requested_bytes)) + "\n\n"
                + _("So two servers on one GPU need fractions that add up to at most 1, and a little less: the first "
                    "one holds its whole budget (its KV cache fills it) plus its CUDA graphs and context, and the "
                    "second's own context comes out of what is left.") + "\n")
    if not p.starts:
        return
    st.markdown(_("Two copies of this server:") + "\n\n" + "\n".join("- " + pair_line(o) for o in x.pairs) + "\n\n"
                + _("With the first at {util}, the second may ask for at most **{largest}**.",
                    util=f"{half.utilization:g}", largest=f"{half.largest_second:g}") + "\n")


def draw(sc: Scenario) -> ServeLesson | None:
    """The lesson for the sidebar's scenario; says why when it cannot be served (no GPU, a layout vLLM refuses)."""
    try:
        x = lesson_for(sc.model_dump_json())
    except ValueError as exc:
        st.info(_("The serving lesson needs a scenario vLLM can serve on a known GPU: {error}",
                  error=fmt.literal(state.error_text(exc))), icon=":material/info:")
        return None
    why_kv_dominates(x)
    what_shrinks_it(x)
    utilization_share(x)
    st.page_link("pages/7_Serve.py", label=_("Serve: plan a server for any model and GPU"), icon=":material/dns:")
    return x

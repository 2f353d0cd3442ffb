"""The Serve page's charts: the budget of one GPU as a stacked bar, and concurrency against context length.
They draw a calc.serve.plan.ServePlan; nothing is decided here."""

from __future__ import annotations

import plotly.graph_objects as go

from calc.contract.i18n import N_
from calc.contract.units import GiB
from calc.serve.plan import ServePlan
from ui.language import _, tr

SEGMENTS = (  # (ServePlan field, label, colour)
    ("weights_bytes", N_("Weights"), "#4c78a8"),
    ("activation_peak_bytes", N_("Activation peak (profile run)"), "#f58518"),
    ("non_torch_bytes", N_("Non-torch (NCCL, cuBLAS)"), "#b279a2"),
    ("kv_cache_bytes", N_("KV cache"), "#54a24b"),
    ("cuda_graph_bytes", N_("CUDA graphs (outside the budget)"), "#e45756"),
    ("headroom_bytes", N_("Left outside gpu_memory_utilization"), "#bab0ac"),
)


def budget_bar(plan: ServePlan) -> go.Figure:
    """One GPU's memory from left to right: what the engine's budget holds, then what lies outside it."""
    fig = go.Figure()
    for field, label, colour in SEGMENTS:
        n = max(getattr(plan, field), 0)
        fig.add_bar(x=[n / GiB], y=[_("per GPU")], orientation="h", name=tr(label), marker_color=colour,
                    customdata=[f"{n:,}"], hovertemplate="%{fullData.name}: %{x:,.2f} GiB (%{customdata} B)"
                    "<extra></extra>")
    x = plan.gpu_memory_bytes / GiB
    fig.add_shape(type="line", xref="x", yref="y domain", x0=x, x1=x, y0=0, y1=1,
                  line=dict(color="black", dash="dash", width=2))
    fig.update_layout(height=240, barmode="stack", margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                      xaxis_title=_("GiB per GPU (2^30 bytes)"), yaxis=dict(showticklabels=False))
    return fig


def concurrency_chart(points: list[tuple[int, float]]) -> go.Figure:
    """Requests of each context length that fit at once."""
    fig = go.Figure()
    fig.add_scatter(x=[n for n, _c in points], y=[c for _n, c in points], mode="lines+markers",
                    name=_("requests at once"),
                    hovertemplate=_("{tokens} tokens: {requests} requests", tokens="%{x:,}", requests="%{y:,.2f}")
                    + "<extra></extra>")
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=20, b=10), xaxis_type="log",
                      xaxis_title=_("max_model_len (tokens per request)"), yaxis_title=_("requests at once"))
    return fig

"""Plotly figures for the Explain page's lessons, in ui.plots' style: GiB (2^30 bytes) on the axes,
exact bytes on hover. They draw what ui.explain.figures returned and compute nothing but units."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from calc.contract.i18n import N_
from calc.contract.units import GiB
from ui.language import _, say, tr
from ui.plots import COLORS

STAGE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756")
STAGE_DASHES = ("solid", "dot", "dash", "solid")  # stages 1 and 2 often coincide: both stay visible
PER_PARAM_PARTS = (("weights", N_("Weights"), COLORS["parameters"]),
                   ("gradients", N_("Gradients (.grad)"), COLORS["gradients"]),
                   ("master_weights", N_("fp32 master weights"), "#88C17F"),
                   ("optimizer_states", N_("Optimizer states"), COLORS["optimizer_states"]))


def _layout(fig: go.Figure, height: int, **kw: Any) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=40, b=10), hoverlabel=dict(align="left"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), **kw)
    return fig


def row_label(b: dict[str, Any]) -> str:
    return f"{b['precision']} · {b['optimizer']} ({b['optimizer_impl']})"


def bytes_per_param_bars(rows: list[dict[str, Any]], where: str | None = None) -> go.Figure:
    """Stacked bytes per parameter held through the step, one bar per precision x optimizer, with a
    marker where the optimizer step's total falls. `where`: the setting, already in the page's language."""
    where = _("on one GPU without ZeRO") if where is None else where
    labels = [row_label(b) for b in rows]
    fig = go.Figure()
    for key, msgid, color in PER_PARAM_PARTS:
        name = tr(msgid)
        fig.add_bar(y=labels, x=[b[key] for b in rows], orientation="h", name=name, marker_color=color,
                    hovertemplate=f"<b>{name}</b><br>%{{y}}<br>%{{x:.2f}} B/param<extra></extra>")
    fig.add_scatter(y=labels, x=[b["at_step"] for b in rows], mode="markers", name=_("total at the optimizer step"),
                    marker=dict(symbol="diamond", size=11, color="black"),
                    hovertemplate="<b>" + _("at the optimizer step") + "</b><br>%{y}<br>%{x:.2f} B/param<extra></extra>")
    _layout(fig, 80 + 34 * len(rows), barmode="stack", xaxis_title=_("bytes per parameter, {where}", where=where),
            yaxis=dict(autorange="reversed"))
    fig.update_layout(legend_traceorder="normal")  # stacked horizontal bars list their legend reversed otherwise
    return fig


def zero_sweep(sweep: dict[int, list[tuple[int, int | None]]], gpu_bytes: int | None, gpu_label: str) -> go.Figure:
    """Device total per GPU vs the number of data-parallel GPUs, one line per ZeRO stage."""
    fig = go.Figure()
    for stage, pts in sweep.items():
        xs = [n for n, v in pts if v is not None]
        ys = [v for _, v in pts if v is not None]
        fig.add_scatter(x=xs, y=[v / GiB for v in ys], mode="lines+markers", name=f"ZeRO-{stage}",
                        line=dict(color=STAGE_COLORS[stage], width=3 if stage == 1 else 2, dash=STAGE_DASHES[stage]),
                        marker=dict(size=9 if stage == 1 else 7), customdata=[f"{v:,}" for v in ys],
                        hovertemplate=f"<b>ZeRO-{stage}</b><br>"
                                      + _("{gpus} GPUs<br>{gib} GiB per GPU<br>{bytes} bytes", gpus="%{x}", gib="%{y:,.2f}",
                                          bytes="%{customdata}")
                                      + "<extra></extra>")
    if gpu_bytes:
        fig.add_hline(y=gpu_bytes / GiB, line=dict(color="black", dash="dash", width=1.5),
                      annotation_text=_("{gpu} memory {gib} GiB", gpu=gpu_label, gib=f"{gpu_bytes / GiB:,.2f}"),
                      annotation_position="top left")
    _layout(fig, 380, xaxis=dict(title=_("data-parallel GPUs"), type="log", dtick=0.30103, tickformat="d"),
            yaxis=dict(title=_("device total per GPU, GiB (2^30 bytes)"), rangemode="tozero"))
    return fig


def attention_sweep(rows: list[dict[str, Any]], gpu_bytes: int | None) -> go.Figure:
    """Activations saved for backward (at their largest) vs sequence length, eager vs SDPA."""
    fig = go.Figure()
    seqs = [r["seq"] for r in rows]
    for kind, name, color in (("eager", _("eager attention (S x S scores kept)"), COLORS["activations"]),
                              ("sdpa", "SDPA / FlashAttention", COLORS["parameters"])):
        ys = [r[kind]["max_activations"] for r in rows]
        fig.add_scatter(x=seqs, y=[v / GiB for v in ys], mode="lines+markers", name=name, line=dict(color=color),
                        customdata=[f"{v:,}" for v in ys],
                        hovertemplate=f"<b>{name}</b><br>" + _("{tokens} tokens<br>{gib} GiB<br>{bytes} bytes", tokens="%{x:,}",
                                                                            gib="%{y:,.2f}", bytes="%{customdata}")
                                      + "<extra></extra>")
    if gpu_bytes:  # a trace, not add_hline: annotations on a log axis take log10 coordinates
        fig.add_scatter(x=[seqs[0], seqs[-1]], y=[gpu_bytes / GiB] * 2, mode="lines", name=_("GPU memory"),
                        line=dict(color="black", dash="dash", width=1), hoverinfo="skip")
    _layout(fig, 380, xaxis=dict(title=_("sequence length (tokens)"), type="log", dtick=0.30103, tickformat=",d"),
            yaxis=dict(title=_("activations at their largest, GiB (log scale)"), type="log"))
    return fig


def checkpointing_tradeoff(rows: list[dict[str, Any]]) -> go.Figure:
    """Activations kept vs extra compute, one point per checkpointing plan."""
    pts = [r for r in rows if r["recompute"] is not None]
    fig = go.Figure()
    fig.add_scatter(x=[100 * r["recompute"] for r in pts], y=[r["run"]["max_activations"] / GiB for r in pts],
                    mode="markers+text", text=[say(r["label"]) for r in pts],
                    textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(pts))],
                    marker=dict(size=12, color=COLORS["activations"]), name=_("checkpointing plan"),
                    customdata=[f"{r['run']['max_activations']:,}" for r in pts],
                    hovertemplate="<b>%{text}</b><br>"
                                  + _("{pct} % more FLOPs per step<br>activations {gib} GiB<br>{bytes} bytes", pct="%{x:.0f}",
                                      gib="%{y:,.2f}", bytes="%{customdata}")
                                  + "<extra></extra>")
    top = max((100 * r["recompute"] for r in pts), default=0)
    _layout(fig, 360, showlegend=False,
            xaxis=dict(title=_("recompute: extra FLOPs per step, % of the model's"), range=[-2, top * 1.25 + 5]),
            yaxis=dict(title=_("activations at their largest, GiB (2^30 bytes)"), rangemode="tozero"))
    return fig

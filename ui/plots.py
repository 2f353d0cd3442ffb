"""Plotly figure builders. Axes are in GiB (2**30 bytes), labelled; hovering shows exact bytes.
They draw what calc/ returned and compute nothing but unit conversion."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from calc.contract.i18n import N_
from calc.contract.units import GiB
from calc.memory.result import CATEGORIES, Estimate, event_text, phase_name
from calc.memory.verdict import headline, short
from ui.fmt import plot_text
from ui.language import _, current, say, tr

COLORS: dict[str, str] = {
    "parameters": "#4C78A8",
    "gradients": "#F58518",
    "optimizer_states": "#54A24B",
    "activations": "#E45756",
    "other": "#B279A2",
    "cuda_context": "#8C8C8C",
    "workspaces": "#B0B0B0",
    "reserve": "#D4D4D4",
    "paged_optimizer": "#9ECF95",
}
SHORT_LABELS: dict[str, str] = {  # English; in the session's language through short_label
    "parameters": N_("Parameters"),
    "gradients": N_("Gradients"),
    "optimizer_states": N_("Optimizer states"),
    "activations": N_("Activations"),
    "other": N_("Transients"),
    "cuda_context": N_("CUDA context"),
    "workspaces": N_("NCCL buffers"),
    "reserve": N_("Allocator reserve"),
    "paged_optimizer": N_("Paged optimizer states"),
}
PHASE_COLORS = {"forward": "rgba(76,120,168,0.06)", "loss": "rgba(228,87,86,0.08)",
                "backward": "rgba(245,133,24,0.06)", "optimizer": "rgba(84,162,75,0.08)",
                "inference": "rgba(76,120,168,0.04)"}
# Plotly's hover placeholders, filled into the translated templates' {named} fields (a message id
# carries no %{...} of its own, so that the translator sees plain fields)
NAME, X_GIB, Y_GIB = "%{fullData.name}", "%{x:,.2f}", "%{y:,.2f}"


def _cd(i: int | None = None, fmt: str = "") -> str:
    return "%{customdata" + ("" if i is None else f"[{i}]") + fmt + "}"


def _hover(gib: str) -> str:
    return _("<b>{name}</b><br>{gib} GiB<br>{bytes} bytes", name=NAME, gib=gib, bytes=_cd()) + "<extra></extra>"


def short_label(key: str) -> str:
    """A breakdown segment's short name ('Optimizer states') in the session's language."""
    return tr(SHORT_LABELS[key])


def event_name(event: str) -> str:
    """A timeline event ('backward layer 3') in the session's language."""
    lang = current()
    return event if lang == "en" else event_text(event).render(lang)


def peak_place(event: str, phase: str) -> str:
    """Where a peak falls, in the session's language: 'backward layer 3', with its phase in brackets only when
    the event's name does not already say it ('optimizer step', never 'optimizer step (optimizer)')."""
    name, phase_words = event_name(event), phase_name(phase, current())
    if phase_words.lower() in name.lower():
        return name
    return _("{event} ({phase})", event=name, phase=phase_words)


def _gib(n: int | float) -> float:
    return n / GiB


def segments(est: Estimate) -> list[tuple[str, int]]:
    """(key, bytes) of the device total (expected): the five categories at the peak, then the
    CUDA context, NCCL buffers, caching-allocator reserve and a paged optimizer's states in CUDA managed memory.
    They sum to device_total.expected."""
    b, dt = est.breakdown, est.device_total_bytes
    out = [(c, getattr(b, c)) for c in CATEGORIES]
    out += [("cuda_context", dt.cuda_context_bytes), ("workspaces", dt.workspace_bytes),
            ("reserve", dt.reserve_expected_bytes)]
    return out + [("paged_optimizer", dt.managed_bytes)]


def _layout(fig: go.Figure, height: int, **kw: Any) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=40, b=10), barmode="stack",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, traceorder="normal"),
                      hoverlabel=dict(align="left"), **kw)
    return fig


def breakdown_bar(est: Estimate, label: str | None = None) -> go.Figure:
    """One horizontal stacked bar of the device total with the GPU's capacity line and the
    low-high range of the device total."""
    label = _("per GPU") if label is None else label
    fig = go.Figure()
    for key, n in segments(est):
        fig.add_bar(x=[_gib(n)], y=[label], orientation="h", name=short_label(key), marker_color=COLORS[key],
                    customdata=[f"{n:,}"], hovertemplate=_hover(X_GIB))
    dt = est.device_total_bytes
    fig.add_scatter(x=[_gib(dt.expected)], y=[label], mode="markers", name=_("Device total (low-high)"),
                    marker=dict(color="black", symbol="line-ns-open", size=18),
                    error_x=dict(type="data", symmetric=False, array=[_gib(dt.high - dt.expected)],
                                 arrayminus=[_gib(dt.expected - dt.low)], color="black", thickness=1.5),
                    customdata=[[f"{dt.low:,}", f"{dt.expected:,}", f"{dt.high:,}"]],
                    hovertemplate=_("<b>Device total</b> (what nvidia-smi would show)<br>low {low} bytes<br>"
                                    "expected {expected} bytes<br>high {high} bytes", low=_cd(0), expected=_cd(1),
                                    high=_cd(2)) + "<extra></extra>")
    if est.gpu_memory_bytes:
        x = _gib(est.gpu_memory_bytes)
        fig.add_shape(_vspan(x, x, "line"), line=dict(color="black", dash="dash", width=2))
        fig.add_annotation(text=_("GPU memory {gib} GiB", gib=f"{x:,.2f}"), showarrow=False, xref="x",
                           yref="y domain", x=x, y=0, xanchor="left", yanchor="bottom",
                           bgcolor="rgba(255,255,255,0.8)")
    _layout(fig, 260, xaxis_title=_("GiB per GPU (2^30 bytes)"), yaxis=dict(showticklabels=False))
    return fig


def _vspan(x0: float, x1: float, kind: str = "rect") -> dict[str, Any]:
    """A shape spanning the plot's height, what fig.add_vrect / add_vline make (spelled out: they search the
    subplot grid on every call, half of the timeline chart's build time)."""
    return dict(type=kind, xref="x", yref="y domain", x0=x0, x1=x1, y0=0, y1=1)


def timeline_area(est: Estimate) -> go.Figure:
    """Live bytes per category across the step (stacked areas), the peak marked, phases shaded."""
    tl = est.timeline
    x = list(range(len(tl.events)))
    events = [event_name(e) for e in tl.events]
    hover = _("<b>{name}</b> at {event}<br>{gib} GiB<br>{bytes} bytes", name=NAME, event=_cd(0), gib=Y_GIB,
              bytes=_cd(1)) + "<extra></extra>"
    fig = go.Figure()
    for c in CATEGORIES:
        ys = getattr(tl, c)
        fig.add_scatter(x=x, y=[_gib(v) for v in ys], mode="lines", stackgroup="mem", name=short_label(c),
                        line=dict(width=0.5, color=COLORS[c]), fillcolor=COLORS[c],
                        customdata=[[e, f"{v:,}"] for e, v in zip(events, ys, strict=True)], hovertemplate=hover)
    start = 0
    for i in range(1, len(x) + 1):
        if i == len(x) or tl.phases[i] != tl.phases[start]:
            fig.add_shape(_vspan(start - 0.5, i - 0.5), fillcolor=PHASE_COLORS.get(tl.phases[start], "rgba(0,0,0,0)"),
                          line_width=0, layer="below")
            start = i
    p = tl.peak_index
    peak = tl.total(p)
    fig.add_shape(_vspan(p, p, "line"), line=dict(color="black", width=1.5))
    fig.add_scatter(x=[p], y=[_gib(peak)], mode="markers", name=_("Peak"), marker=dict(color="black", size=9),
                    customdata=[[events[p], f"{peak:,}"]], hovertemplate=hover.replace(NAME, _("Peak")))
    fig.add_annotation(x=p, y=_gib(peak), text=_("<b>peak {gib} GiB</b><br>{event}", gib=f"{_gib(peak):,.2f}",
                                                 event=events[p]),
                       showarrow=True, arrowhead=0, ax=-70 if p > len(x) / 2 else 70, ay=-10,
                       xanchor="right" if p > len(x) / 2 else "left", bgcolor="rgba(255,255,255,0.85)")
    if est.gpu_memory_bytes:
        y = _gib(est.gpu_memory_bytes)
        fig.add_shape(type="line", xref="x domain", yref="y", x0=0, x1=1, y0=y, y1=y,
                      line=dict(color="black", dash="dash", width=1))
        fig.add_annotation(text=_("GPU memory"), showarrow=False, xref="x domain", yref="y", x=0, y=y,
                           xanchor="left", yanchor="top")
    _layout(fig, 400, yaxis_title=_("allocated GiB (2^30 bytes)"), xaxis_title=_("events of the step (shaded by phase)"),
            hovermode="closest")
    starts = [i for i in x if i == 0 or tl.phases[i] != tl.phases[i - 1]]
    ends = starts[1:] + [len(x)]
    # one tick where each phase starts; phases too short to label (loss, optimizer) keep only the shading
    ticks = [a for a, b in zip(starts, ends, strict=True) if b - a >= max(2, len(x) // 12) or len(starts) == 1]
    fig.update_xaxes(tickvals=ticks, ticktext=[phase_name(tl.phases[i], current()) for i in ticks], tickangle=0,
                     ticklabelposition="outside right")
    return fig


def compare_bars(items: Sequence[tuple[str, Estimate]]) -> go.Figure:
    """One stacked bar per scenario on one GiB scale, with each GPU's capacity as a marker."""
    names = [n for n, _ in items]
    fig = go.Figure()
    keys = [k for k, _ in segments(items[0][1])]
    for k in keys:
        vals = [dict(segments(e))[k] for _, e in items]
        fig.add_bar(x=names, y=[_gib(v) for v in vals], name=short_label(k), marker_color=COLORS[k],
                    customdata=[f"{v:,}" for v in vals], hovertemplate=_hover(Y_GIB))
    caps = [(n, e.gpu_memory_bytes) for n, e in items if e.gpu_memory_bytes]
    if caps:
        fig.add_scatter(x=[n for n, _c in caps], y=[_gib(c) for _n, c in caps], mode="markers", name=_("GPU memory"),
                        marker=dict(symbol="line-ew-open", size=24, color="black", line=dict(width=3)),
                        customdata=[f"{c:,}" for _n, c in caps], hovertemplate=_hover(Y_GIB))
        for i, (_n, e) in enumerate(items):  # the capacity line across the whole bar
            if e.gpu_memory_bytes:
                fig.add_shape(type="line", xref="x", yref="y", x0=i - 0.42, x1=i + 0.42,
                              y0=_gib(e.gpu_memory_bytes), y1=_gib(e.gpu_memory_bytes),
                              line=dict(color="black", width=3, dash="dash"))
    for n, e in items:
        if e.gpu_memory_bytes is None:
            continue
        text = short(e.verdict, current())
        top = max(e.device_total_bytes.expected, e.gpu_memory_bytes or 0)
        fig.add_annotation(x=n, y=_gib(top), text=f"<b>{text}</b>", showarrow=False, yshift=14,
                           font=dict(color="#2E7D32" if e.fits else "#C62828" if e.fits is False else "#B26A00"))
    _layout(fig, 460, yaxis_title=_("GiB per GPU (2^30 bytes)"))
    return fig


# ---- reading figures back (tests, benchmarks) ----------------------------------------------

def _decode(v: Any) -> Any:
    if isinstance(v, dict) and "bdata" in v and "dtype" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if "shape" in v:
            shape = [int(s) for s in str(v["shape"]).split(",")]
            arr = arr.reshape(shape)
        return arr.tolist()
    if isinstance(v, dict):
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def figure_from_json(spec: str | dict[str, Any]) -> dict[str, Any]:
    """A Plotly figure's JSON with Plotly 7's base64 `bdata` arrays decoded into lists."""
    data = json.loads(spec) if isinstance(spec, str) else spec
    return _decode(data)


# ---- Validation ------------------------------------------------------------------------------

def validation_scatter(cases: Sequence[Any], highlight: Sequence[Any] = (), log: bool = False) -> go.Figure:
    """Predicted vs measured peak (GiB) per case, coloured by model family, with y = x.
    `cases` are calc.evidence.validate.Case; `highlight` are drawn as large stars (a user's upload)."""
    fig = go.Figure()
    errors = _("measured {measured} bytes<br>predicted {predicted} bytes<br>error {error} %", measured=_cd(1),
               predicted=_cd(2), error=_cd(3, ":+.2f")) + "<extra></extra>"
    families = sorted({c.family for c in cases})
    for fam in families:
        sel = [c for c in cases if c.family == fam]
        fig.add_scatter(
            x=[_gib(c.measured_bytes) for c in sel], y=[_gib(c.predicted_bytes) for c in sel], mode="markers",
            name=fam, marker=dict(size=9, opacity=0.8),
            customdata=[[plot_text(c.name), f"{c.measured_bytes:,}", f"{c.predicted_bytes:,}", c.error_pct, c.device]
                        for c in sel],
            hovertemplate=f"<b>{_cd(0)}</b> ({_cd(4)})<br>{errors}")
    for c in highlight:
        fig.add_scatter(x=[_gib(c.measured_bytes)], y=[_gib(c.predicted_bytes)], mode="markers", name=_("your record"),
                        marker=dict(size=18, symbol="star", color="#E45756", line=dict(color="black", width=1)),
                        customdata=[[plot_text(c.name), f"{c.measured_bytes:,}", f"{c.predicted_bytes:,}",
                                     c.error_pct]],
                        hovertemplate=f"<b>{_cd(0)}</b><br>{errors}")
    allc = list(cases) + list(highlight)
    if allc:
        vals = [_gib(v) for c in allc for v in (c.measured_bytes, c.predicted_bytes) if v > 0]
        lo, hi = (min(vals) / 1.2, max(vals) * 1.2) if log else (0.0, max(vals) * 1.05)
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name=_("y = x (perfect)"),
                        line=dict(color="black", dash="dash", width=1), hoverinfo="skip")
    axis = dict(type="log") if log else {}
    fig.update_layout(height=480, margin=dict(l=10, r=10, t=30, b=10),
                      xaxis=dict(title=_("measured peak allocated, GiB (2^30 bytes)"), **axis),
                      yaxis=dict(title=_("predicted peak allocated, GiB (2^30 bytes)"), **axis),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig


def error_histogram(cases: Sequence[Any]) -> go.Figure:
    """Distribution of (predicted - measured) / measured in percent."""
    fig = go.Figure(go.Histogram(x=[c.error_pct for c in cases], nbinsx=30, marker_color=COLORS["parameters"],
                                 hovertemplate=_("error {error} %<br>{cases} cases", error="%{x}", cases="%{y}")
                                 + "<extra></extra>", name=_("cases")))
    fig.add_vline(x=0, line=dict(color="black", dash="dash", width=1))
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=30, b=10), showlegend=False,
                      xaxis_title=_("error of the prediction, % of measured"), yaxis_title=_("cases"))
    return fig


# ---- Recommend -------------------------------------------------------------------------------

def waterfall_chart(steps: Sequence[Any], gpu_memory_bytes: int | None, usable_bytes: int | None) -> go.Figure:
    """Device total (expected, GiB per GPU) as each optimization is turned on, as a waterfall, and tokens/s per
    GPU as bars in a second panel below it (its own axis, not a second scale on the same plot). The steps that
    change the training method sit behind a dotted line that says so. `steps` are calc.recommend.WaterfallStep.
    The x labels stand upright, so that they stay readable on a phone."""
    from plotly.subplots import make_subplots

    names = [f"{s.step}. {say(s.name)}" for s in steps]
    vals = [s.device_total_expected_bytes for s in steps]
    deltas = [vals[0]] + [b - a for a, b in zip(vals, vals[1:], strict=False)]
    speeds = [s.tokens_per_s_per_gpu for s in steps]
    has_speed = any(v is not None for v in speeds)
    fig = make_subplots(rows=2 if has_speed else 1, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.72, 0.28] if has_speed else [1.0])
    fig.add_trace(go.Waterfall(
        x=names, y=[_gib(d) for d in deltas], measure=["absolute"] + ["relative"] * (len(vals) - 1),
        name=_("device total per GPU"), connector=dict(line=dict(color="#999", width=1)),
        increasing=dict(marker=dict(color=COLORS["activations"])),
        decreasing=dict(marker=dict(color=COLORS["optimizer_states"])),
        totals=dict(marker=dict(color=COLORS["parameters"])),
        customdata=[[f"{v:,}", _gib(v), s.change, headline(s.verdict, current())]
                    for v, s in zip(vals, steps, strict=True)],
        hovertemplate=f"<b>%{{x}}</b><br>{_cd(2)}<br>"
                      + _("device total {gib} GiB ({bytes} bytes)<br>change {change} GiB", gib=_cd(1, ":,.2f"),
                          bytes=_cd(0), change="%{y:+,.2f}") + f"<br>{_cd(3)}<extra></extra>"), row=1, col=1)
    if has_speed:
        fig.add_bar(x=names, y=speeds, name=_("tokens/s per GPU"), marker_color="#555", row=2, col=1,
                    hovertemplate="<b>%{x}</b><br>" + _("{speed} tokens/s per GPU", speed="%{y:,.0f}")
                    + "<extra></extra>")
        fig.update_yaxes(title_text=_("tokens/s"), rangemode="tozero", nticks=4, row=2, col=1)
    if gpu_memory_bytes:
        limit = _("GPU memory {gib} GiB", gib=f"{_gib(gpu_memory_bytes):,.2f}")
        if usable_bytes:
            fig.add_hline(y=_gib(usable_bytes), line=dict(color="black", dash="dash", width=1.2), row=1, col=1)
            limit = _("GPU memory {gib} GiB (dashed: 10 % kept free)", gib=f"{_gib(gpu_memory_bytes):,.2f}")
        fig.add_hline(y=_gib(gpu_memory_bytes), line=dict(color="black", width=2), row=1, col=1,
                      annotation_text=limit, annotation_position="top left", annotation_font_size=11,
                      annotation_bgcolor="rgba(255,255,255,0.85)")
    first_method = next((i for i, s in enumerate(steps) if s.method_change), None)
    if first_method:
        fig.add_vline(x=first_method - 0.5, line=dict(color="#666", dash="dot", width=1.5))
        fig.add_annotation(x=first_method - 0.5, y=1.0, yref="y domain", xanchor="left", yanchor="bottom",
                           text=_("other methods,<br>offload off again →"), showarrow=False, font=dict(size=10, color="#444"),
                           align="left")
    # an explicit range: the tallest bar and the GPU line stay inside the plot with room for their labels
    top = max(vals + [gpu_memory_bytes or 0])
    fig.update_yaxes(title_text=_("GiB per GPU"), range=[0, _gib(top) * 1.15], row=1, col=1)
    # upright labels: one line per step, readable at any width (a phone's 390 px leaves ~30 px per step)
    fig.update_xaxes(tickangle=-90, tickfont=dict(size=10), range=[-0.5, len(steps) - 0.5])
    fig.update_layout(height=520, margin=dict(l=10, r=10, t=40, b=10), showlegend=False)
    return fig

"""The Compare page's columns: each takes the sidebar's scenario and sets its own hardware, ZeRO stage and
offload (or asks the recommender for its fastest configuration), and their names as the page shows them."""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from calc.contract.scenario import Offload
from ui import compute, state
from ui.choices import radio, select
from ui.labels import COMPARE_KIND_LABELS, OFFLOAD_LABELS, ZERO_LABELS
from ui.language import _, current, tr

EXTRA_COMPARE = (state.CompareColumn(cluster="1x-h100-sxm"), state.CompareColumn(cluster="8x-h100-sxm"),
                 state.CompareColumn(cluster="64x-a100-80gb"))


def _compare_values(i: int, col: state.CompareColumn) -> dict[str, Any]:
    return {
        f"cmp_{i}_kind": "cluster" if col.cluster else "gpu",
        f"cmp_{i}_cluster": col.cluster or "8x-a100-80gb",
        f"cmp_{i}_gpu": col.gpu or "a100-80gb",
        f"cmp_{i}_n": col.num_gpus,
        f"cmp_{i}_zero": col.zero_stage,
        f"cmp_{i}_off_opt": col.offload_optimizer.value,
        f"cmp_{i}_off_par": col.offload_params.value,
        f"cmp_{i}_fastest": col.fastest,
    }


def compare_columns_editor() -> list[state.CompareColumn]:
    """How many scenarios and, per column, hardware + ZeRO + offload. Returns the columns (also
    stored in the session); every column value is a validated CompareColumn."""
    cols = state.get_compare()
    state.seed_widget("cmp_count", len(cols))
    n = int(st.radio(_("Scenarios"), [2, 3, 4], key="cmp_count", horizontal=True,
                     help=_("Each column takes the sidebar's scenario and sets its own hardware, ZeRO stage and "
                            "offload.")))
    while len(cols) < n:
        cols.append(EXTRA_COMPARE[(len(cols) - 2) % len(EXTRA_COMPARE)])
    cols = cols[:n]
    out: list[state.CompareColumn] = []
    for i, (box, col) in enumerate(zip(st.columns(n, border=True), cols, strict=True)):
        for k, v in _compare_values(i, col).items():
            state.seed_widget(k, v)
        with box:
            st.markdown(f"**{chr(65 + i)}**")
            kind = radio(_("Hardware"), COMPARE_KIND_LABELS, f"cmp_{i}_kind",
                          label_visibility="collapsed")
            if kind == "cluster":
                opts = compute.cluster_options(current())
                data: dict[str, Any] = {"cluster": st.selectbox(_("Cluster"), list(opts), format_func=opts.__getitem__,
                                                                key=f"cmp_{i}_cluster")}
            else:
                g = compute.gpu_options()
                data = {"gpu": st.selectbox("GPU", list(g), format_func=g.__getitem__, key=f"cmp_{i}_gpu"),
                        "num_gpus": int(st.number_input(_("GPUs"), 1, 65536, step=1, key=f"cmp_{i}_n"))}
            data["fastest"] = st.toggle(
                _("Fastest configuration that fits"), key=f"cmp_{i}_fastest",
                help=_("The recommender's fastest configuration for this hardware (precision, checkpointing, ZeRO, "
                       "offload, parallelism, micro-batch): full fine-tuning when it fits, else LoRA / QLoRA. "
                       "Turn off to set ZeRO and offload by hand."))
            if data["fastest"]:  # the search chooses; hand settings are kept for when the toggle goes off
                st.caption(_("Precision, checkpointing, ZeRO, offload, parallelism and batch split: chosen by the "
                             "recommender (below)."))
                data.update(zero_stage=col.zero_stage, offload_optimizer=col.offload_optimizer,
                            offload_params=col.offload_params)
            else:
                data["zero_stage"] = select(_("ZeRO stage"), ZERO_LABELS, f"cmp_{i}_zero")
                data["offload_optimizer"] = select(_("Offload optimizer"), OFFLOAD_LABELS, f"cmp_{i}_off_opt")
                data["offload_params"] = select(_("Offload parameters"), OFFLOAD_LABELS, f"cmp_{i}_off_par")
            out.append(state.CompareColumn.model_validate(data))
    state.set_compare(out)
    return out


def cluster_short_name(cluster_id: str) -> str:
    """'8x A100 80GB', '1x RTX 4090 工作站': a cluster preset's name in the session's language, without its
    description in brackets (ASCII or full-width)."""
    from calc.contract.presets import cluster_presets

    return re.split(r" \(|（", tr(cluster_presets()[cluster_id].name))[0]


def column_name(i: int, col: state.CompareColumn) -> str:
    """'A: 8x A100 80GB (one DGX/HGX A100 node), ZeRO-3, optimizer -> CPU'."""
    from calc.contract.presets import gpu_presets

    if col.cluster:
        hw = cluster_short_name(col.cluster)
    else:
        hw = f"{col.num_gpus}x {gpu_presets()[col.gpu].name.removeprefix('NVIDIA ')}" if col.gpu else _("custom")
    if col.fastest:
        return _("{column}: {hardware} (fastest setup)", column=chr(65 + i), hardware=hw)
    bits = [f"{chr(65 + i)}: {hw}", f"ZeRO-{col.zero_stage}"]
    if col.offload_optimizer != Offload.none:
        bits.append(_("opt→{target}", target=col.offload_optimizer.value))
    if col.offload_params != Offload.none:
        bits.append(_("params→{target}", target=col.offload_params.value))
    return ", ".join(bits)

"""Validation: the engine's predictions against measured runs (data/*.jsonl via calc.validate), and a
check of a user's own measurement record."""

from __future__ import annotations

import streamlit as st

from calc.validate import DEEPSPEED_BEHAVIOURS
from ui import charts, compute, fmt, state
from ui.widgets import page_setup, scenario_or_stop

page_setup("Validation", ":material/fact_check:")
st.title("Predicted vs measured")
st.caption("Peak allocated memory (torch.cuda.max_memory_allocated, or MemTracker's live-tensor peak on CPU and "
           "FakeTensor runs) measured by `python -m measure`, against calc/'s prediction for the same scenario. "
           "GiB = 2^30 bytes; hover a point for exact bytes.")
scenario_or_stop()  # the sidebar keeps the shared scenario (and the URL) across pages

try:
    rep = compute.validation_report()
except ValueError as exc:  # a malformed committed file: RecordError names the line and field
    st.error(f"The committed data set could not be read: {fmt.literal(exc)}", icon=":material/error:")
    rep = None
else:
    if rep is None or not rep.cases:
        st.info("No measured runs are committed yet (data/*.jsonl). Upload your own record below.",
                icon=":material/info:")

if rep is None or not rep.cases:
    cases = []
else:
    cases = rep.cases
    m1, m2, m3 = st.columns(3)
    m1.metric("Measured runs", f"{len(cases):,}")
    m2.metric("Median |error| (%)", f"{rep.median_abs_error_pct:.2f} %")
    m3.metric("Worst |error| (%)", f"{rep.worst_abs_error_pct:.2f} %")
with st.expander("DeepSpeed: what is measured with DeepSpeed itself, what is modelled from its source"):
    st.table({"behaviour": [b for b, _ in DEEPSPEED_BEHAVIOURS], "status": [s for _, s in DEEPSPEED_BEHAVIOURS]})
st.session_state.setdefault("val_log", True)
log_axes = st.toggle("Logarithmic axes (runs span from MiB to TiB)", key="val_log")
plots = st.container()  # drawn after the uploader below, so that a user's record joins the plot

st.subheader("Check your own measurement")
st.markdown("Run `python -m measure` (see measure/) on your machine and upload the JSON record it prints "
            "(one record, or JSON lines). The record is validated field by field, then predicted.")
up = st.file_uploader("Measurement record (.json / .jsonl)", type=["json", "jsonl"], key="val_upload",
                      max_upload_size=2)
pasted = st.text_area("…or paste the record", key="val_paste", height=120,
                      placeholder='{"schema_version": 1, "scenario": {...}, "device": "cuda", ...}')
mine = []
text, where = None, None
if up is not None:
    if up.size > compute.MAX_RECORD_BYTES:
        st.error(f"{fmt.literal(up.name)} is {up.size / fmt.MiB:,.1f} MiB; the limit is {compute.MAX_RECORD_BYTES / fmt.MiB:.0f} MiB "
                 "(a record is a few KiB).", icon=":material/error:")
    else:
        text, where = up.getvalue(), up.name
elif pasted.strip():
    text, where = pasted, "pasted record"
if text is not None:
    try:
        mine = compute.check_records(text, where)
    except ValueError as exc:
        st.error(fmt.literal(state.error_text(exc)), icon=":material/error:")
    for c in mine:
        st.success(f"**{fmt.literal(c.name)}**: measured {fmt.gib(c.measured_bytes)}, predicted {fmt.gib(c.predicted_bytes)} "
                   f"({c.error_pct:+.2f} %; peak measured in {c.measured_phase}, predicted in {c.predicted_phase}).",
                   icon=":material/check_circle:")

with plots:
    if cases or mine:
        st.plotly_chart(charts.validation_scatter(cases, mine, log=log_axes), key="val_scatter")
    if cases:
        st.plotly_chart(charts.error_histogram(cases), key="val_hist")
with st.expander("Modelled from source, not measured yet"):
    st.markdown("\n".join(f"- **{what}**: {where}" for what, where in compute.modelled_from_source()))

if cases:
    st.subheader("Runs")
    f1, f2, f3 = st.columns(3)
    fams = f1.multiselect("Family", sorted({c.family for c in cases}), key="val_family")
    precs = f2.multiselect("Precision", sorted({c.precision for c in cases}), key="val_precision")
    devs = f3.multiselect("Device", sorted({c.device for c in cases}), key="val_device")
    shown = [c for c in cases if (not fams or c.family in fams) and (not precs or c.precision in precs)
             and (not devs or c.device in devs)]
    st.dataframe([{"run": c.name, "device": c.device, "family": c.family, "precision": c.precision,
                   "checkpointing": c.checkpointing, "attention": c.attention, "optimizer": c.optimizer,
                   "mode": c.mode, "sharding": c.sharding, "measured GiB": c.measured_bytes / fmt.GiB,
                   "predicted GiB": c.predicted_bytes / fmt.GiB, "error %": c.error_pct,
                   "measured bytes": f"{c.measured_bytes:,}", "predicted bytes": f"{c.predicted_bytes:,}"}
                  for c in shown], hide_index=True, key="val_table",
                 column_config={"measured GiB": st.column_config.NumberColumn(format="%.3f"),
                                "predicted GiB": st.column_config.NumberColumn(format="%.3f"),
                                "error %": st.column_config.NumberColumn(format="%+.2f")})
    st.caption(f"{len(shown)} of {len(cases)} runs shown.")
    st.subheader("Error by group")
    st.dataframe([g.model_dump() for g in rep.groups], hide_index=True, key="val_groups",
                 column_config={"median_abs_error_pct": st.column_config.NumberColumn("median |error| %", format="%.2f"),
                                "worst_abs_error_pct": st.column_config.NumberColumn("worst |error| %", format="%.2f")})

"""Compare: two to four scenarios side by side on one GiB scale, a difference table, which fits."""

from __future__ import annotations

import streamlit as st

from ui import charts, compute, fmt, state
from ui.widgets import column_name, compare_columns_editor, page_setup, scenario_or_stop

page_setup("Compare", ":material/compare_arrows:")
st.title("Compare scenarios")
st.caption("The sidebar's model and training setup on different hardware, ZeRO stages and offload. "
           "Per-GPU memory in GiB (2^30 bytes); hover for exact bytes.")

base = scenario_or_stop(include_compare=True)
if base is None:
    st.stop()
cols = compare_columns_editor()
state.sync_url(include_compare=True)

items = []
for i, col in enumerate(cols):
    name = column_name(i, col)
    try:
        est = compute.run(col.apply(base))
    except ValueError as exc:
        st.error(f"{name}: {fmt.literal(state.error_text(exc))}", icon=":material/error:")
        continue
    items.append((name, est))

if not items:
    st.stop()

verdicts = st.columns(len(items))
for box, (name, est) in zip(verdicts, items, strict=True):
    if est.fits is None:
        box.info(f"**{name}**: no GPU memory size")
    elif est.fits:
        box.success(f"**{name}**: fits, {fmt.gib(est.headroom_bytes)} headroom per GPU", icon=":material/check_circle:")
    else:
        box.error(f"**{name}**: does not fit, short by {fmt.gib(-est.headroom_bytes)} per GPU", icon=":material/cancel:")

st.plotly_chart(charts.compare_bars(items), key="cmp_chart")

st.subheader("Differences (GiB per GPU)")
first = items[0][1]
labels = [(k, charts.SHORT_LABELS[k]) for k, _ in charts.segments(first)]


def _rows(est):
    seg = dict(charts.segments(est))
    out = {label: seg[k] for k, label in labels}
    out.update({
        "Peak allocated": est.peak_allocated_bytes,
        "Device total (expected)": est.device_total_bytes.expected,
        "GPU memory": est.gpu_memory_bytes,
        "Headroom": est.headroom_bytes,
        "CPU RAM for offload (per node)": est.cpu_ram_bytes,
        "NVMe for offload (per node)": est.nvme_bytes,
    })
    return out


table = {name: _rows(est) for name, est in items}
names = list(table)
rows = []
for metric in table[names[0]]:
    row = {"GiB per GPU": metric}
    for j, name in enumerate(names):
        v = table[name][metric]
        row[chr(65 + j)] = None if v is None else v / fmt.GiB
        if j:
            ref = table[names[0]][metric]
            row[f"{chr(65 + j)} − A"] = None if v is None or ref is None else (v - ref) / fmt.GiB
    rows.append(row)
st.dataframe(rows, hide_index=True, key="cmp_table", height=35 * (len(rows) + 1) + 3,
             column_config={c: st.column_config.NumberColumn(c, format="%.2f") for c in rows[0] if c != "GiB per GPU"})
st.caption("Columns: " + "; ".join(names) + ". Peak at: " +
           "; ".join(f"{chr(65 + j)} {est.peak_event} ({est.peak_phase})" for j, (_, est) in enumerate(items)) + ".")

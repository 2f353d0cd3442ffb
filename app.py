"""vramcalc: the Calculator page (home). Run with `streamlit run app.py`.

Pages are thin: the sidebar returns a validated Scenario (ui.widgets), calc/ does the work,
ui.charts draws it. Other pages live in pages/ (Streamlit's auto-discovery).
"""

from __future__ import annotations

import streamlit as st

from ui import calibration, charts, compute, fmt, state
from ui import verdict as verdict_ui
from ui.widgets import hardware_name, page_setup, scenario_or_stop

page_setup("Calculator", ":material/calculate:")
st.title("GPU memory calculator")
st.caption("How much GPU memory one training step (or an inference forward) takes per GPU, where every "
           "byte goes, and what fits. All sizes in GiB (1 GiB = 2^30 bytes); hover a bar for exact bytes.")

sc = scenario_or_stop()
if sc is None:
    st.stop()
try:
    est = compute.run(sc)
except ValueError as exc:
    st.error(f"The engine cannot estimate this scenario: {fmt.literal(state.error_text(exc))}", icon=":material/error:")
    st.stop()

dt = est.device_total_bytes
what = f"**{est.model.name}**, {sc.mode.value} on **{hardware_name(sc)}**"
if est.gpu_memory_bytes is None:
    st.info(f"{what}: no GPU memory size chosen; showing the per-GPU need.", icon=":material/info:")
else:
    verdict_ui.box(st, est.verdict, what,
                   f"device total {fmt.gib(dt.expected)} expected per GPU of {fmt.gib(est.gpu_memory_bytes)}")

c1, c2, c3, c4 = st.columns(4)
c1.metric("Peak allocated (GiB)", fmt.gib(est.peak_allocated_bytes),
          help=f"torch.cuda.max_memory_allocated() over the first steps: {fmt.bytes_exact(est.peak_allocated_bytes)}")
c2.metric("Device total, expected (GiB)", fmt.gib(dt.expected),
          help=f"What nvidia-smi would show: peak + CUDA context + NCCL buffers + allocator reserve. "
               f"Range {fmt.gib(dt.low)} to {fmt.gib(dt.high)}; expected {fmt.bytes_exact(dt.expected)}.")
c3.metric("GPU memory (GiB)", fmt.gib(est.gpu_memory_bytes), help=fmt.bytes_exact(est.gpu_memory_bytes))
c4.metric("Headroom (GiB)", fmt.gib(est.headroom_bytes),
          help="GPU memory minus the expected device total; negative means it does not fit.")
st.markdown(f"The peak falls at **{est.peak_event}** ({est.peak_phase}, step {est.peak_step}). "
            f"Device total range: {fmt.gib(dt.low)} (low) to {fmt.gib(dt.high)} (high).")

calibration.section(sc, est)  # the user's own run: calibrated beside uncalibrated (ui/calibration.py)

st.subheader("Where the memory goes (per GPU, at the peak)")
st.plotly_chart(charts.breakdown_bar(est), key="calc_breakdown")

st.subheader("Memory across one training step" if sc.mode.value == "train" else
             "Memory across one forward pass (inference, KV cache on)")
st.plotly_chart(charts.timeline_area(est), key="calc_timeline")

fit_col, off_col, model_col = st.columns(3)
with fit_col:
    st.subheader("What fits")
    key = sc.model_dump_json()
    mbs = compute.largest_fitting(key, "micro_batch_size")
    seq = compute.largest_fitting(key, "seq_len")
    if mbs is None:
        st.info("Choose a GPU to see the largest micro-batch and sequence that fit.")
    else:
        st.metric("Largest micro-batch that fits", f"{mbs:,}" if mbs else "none",
                  help=f"At sequence length {sc.training.seq_len:,}, everything else unchanged (engine, bisection).")
        st.metric("Longest sequence that fits (tokens)", f"{seq:,}" if seq else "none",
                  help=f"At micro-batch {sc.training.micro_batch_size:,}. "
                       f"The model was trained with up to {sc.spec.max_position_embeddings:,} positions.")
        if not mbs or not seq:
            st.caption("Even 1 does not fit with everything else unchanged: the Recommend page shows what to "
                       "turn on next.")
with off_col:
    st.subheader("Offload")
    if est.cpu_ram_bytes or est.nvme_bytes:
        st.metric("CPU RAM needed per node (GiB)", fmt.gib(est.cpu_ram_bytes), help=fmt.bytes_exact(est.cpu_ram_bytes))
        st.metric("NVMe space needed per node (GiB)", fmt.gib(est.nvme_bytes), help=fmt.bytes_exact(est.nvme_bytes))
        for lim in est.verdict.limits:
            if lim.resource == "gpu":
                continue
            what = "Host RAM" if lim.resource == "host_ram" else "NVMe"
            if lim.fits is None:
                st.warning(f"{what} per node unknown: offload needs {fmt.gib(lim.needed_bytes)}; set the node's "
                           f"{what} under Hardware to check.", icon=":material/help:")
            else:
                (st.success if lim.fits else st.error)(
                    f"{what} per node: {fmt.gib(lim.available_bytes)}; offload needs {fmt.gib(lim.needed_bytes)} "
                    f"({'fits' if lim.fits else 'does not fit'}).")
    else:
        st.caption("Nothing is offloaded. With ZeRO 1-3, optimizer states can move to CPU RAM or NVMe; with "
                   "ZeRO-3 the weights too (sidebar, Memory savers).")
with model_col:
    st.subheader("Model")
    m = est.model
    st.markdown(f"- {m.total_params:,} parameters, {m.trainable_params:,} trainable\n"
                f"- {m.params_on_this_gpu:,} parameters on this GPU (before ZeRO sharding)\n"
                f"- {m.layers_on_this_gpu} of {m.num_layers} layers on this GPU")

st.subheader("Components")
st.caption("What is alive at the peak, term by term (they sum to the peak allocated), then what nvidia-smi "
           "adds on top. The sources are listed below the table.")
rows = [{"Component": c.label, "Category": charts.SHORT_LABELS.get(c.category, c.category), "GiB": c.bytes / fmt.GiB,
         "bytes": f"{c.bytes:,}", "Formula": c.formula} for c in est.components]
rows += [
    {"Component": "Peak allocated", "Category": "total", "GiB": est.peak_allocated_bytes / fmt.GiB,
     "bytes": f"{est.peak_allocated_bytes:,}", "Formula": "sum of the rows above"},
    {"Component": "CUDA context", "Category": "outside the allocator", "GiB": dt.cuda_context_bytes / fmt.GiB,
     "bytes": f"{dt.cuda_context_bytes:,}", "Formula": "driver context + loaded kernels (expected)"},
    {"Component": "NCCL communicator buffers", "Category": "outside the allocator",
     "GiB": dt.workspace_bytes / fmt.GiB, "bytes": f"{dt.workspace_bytes:,}",
     "Formula": "multi-GPU jobs only (expected)"},
    {"Component": "Caching-allocator reserve", "Category": "reserved, not allocated",
     "GiB": dt.reserve_expected_bytes / fmt.GiB, "bytes": f"{dt.reserve_expected_bytes:,}",
     "Formula": f"expected; range {fmt.gib(dt.reserve_low_bytes)} to {fmt.gib(dt.reserve_high_bytes)}"},
    {"Component": "Device total (expected)", "Category": "total", "GiB": dt.expected / fmt.GiB,
     "bytes": f"{dt.expected:,}", "Formula": f"range {fmt.gib(dt.low)} to {fmt.gib(dt.high)}"},
]
st.dataframe(rows, hide_index=True, key="calc_components", height=35 * (len(rows) + 1) + 3,
             column_config={"GiB": st.column_config.NumberColumn("GiB", format="%.2f", width="small"),
                            "bytes": st.column_config.TextColumn("bytes", width="medium"),
                            "Formula": st.column_config.TextColumn("Formula", width="large")})
with st.expander("Sources of each term"):
    st.markdown("\n".join(f"- **{c.label}** ({fmt.gib(c.bytes)}): `{c.formula}`. Source: {c.source}"
                            for c in est.components))

for note in est.notes:
    st.caption(note)
with st.expander("Scenario JSON (for `python -m calc estimate`)"):
    st.code(sc.model_dump_json(indent=2, exclude_defaults=True), language="json")
    st.caption("The page URL holds this scenario too: copy it to share.")

"""vramcalc: the Calculator page (home). Run with `python -m ui.serve` (or `streamlit run app.py`: see ui/serve.py).

Pages are thin: the sidebar returns a validated Scenario (ui.widgets), calc/ does the work,
ui.plots draws it. Other pages live in pages/ (Streamlit's auto-discovery).
"""

from __future__ import annotations

import streamlit as st

from calc.contract.multimodal import model_note
from calc.memory import why
from calc.memory.host import host_ram_words
from calc.memory.verdict import RESOURCE_NAMES
from ui import calibration, compute, fmt, state
from ui import plots as charts
from ui import verdict_box as verdict_ui
from ui.first_screen import stop_after_first_screen
from ui.language import _, current, say, tr
from ui.widgets import MODE_LABELS, hardware_name, page_setup, scenario_or_stop

page_setup("Calculator", ":material/calculate:")
lang = current()
st.title(_("GPU memory calculator"))
st.caption(_("How much GPU memory one training step (or an inference forward) takes per GPU, where every "
             "byte goes, and what fits. All sizes in GiB (1 GiB = 2^30 bytes); hover a bar for exact bytes."))

sc = scenario_or_stop()
if sc is None:
    st.stop()
try:
    est = compute.run(sc)
except ValueError as exc:
    st.error(_("The engine cannot estimate this scenario: {problem}", problem=fmt.literal(state.error_text(exc))),
             icon=":material/error:")
    st.stop()

dt = est.device_total_bytes
what = _("**{model}**, {mode} on **{hardware}**", model=est.model.name, mode=tr(MODE_LABELS[sc.mode]),
         hardware=hardware_name(sc))
if est.gpu_memory_bytes is None:
    st.info(_("{what}: no GPU memory size chosen; showing the per-GPU need.", what=what), icon=":material/info:")
elif est.verdict.fits:  # "fits with X headroom": say what it needs of what the GPU has
    verdict_ui.box(st, est.verdict, what, _("{total} expected of {memory}", total=fmt.gib(dt.expected),
                                            memory=fmt.gib(est.gpu_memory_bytes)))
else:  # the verdict's sentence already names the need and the GPU's memory
    verdict_ui.box(st, est.verdict, what)
surprise = why.mixed_above_amp(sc, est)
if surprise is not None:
    st.caption(say(surprise))

st.subheader(_("Where the memory goes (per GPU, at the peak)"))
st.plotly_chart(charts.breakdown_bar(est), key="calc_breakdown")
stop_after_first_screen()  # on arrival the rest of the page follows once the browser has drawn this chart

c1, c2, c3, c4 = st.columns(4)
c1.metric(_("Peak allocated (GiB)"), fmt.gib(est.peak_allocated_bytes),
          help=_("torch.cuda.max_memory_allocated() over the first steps: {bytes}",
                 bytes=fmt.bytes_exact(est.peak_allocated_bytes)))
c2.metric(_("Device total (GiB)"), fmt.gib(dt.expected),
          help=_("What nvidia-smi would show: peak + CUDA context + NCCL buffers + allocator reserve. "
                 "Range {low} to {high}; expected {bytes}.", low=fmt.gib(dt.low), high=fmt.gib(dt.high),
                 bytes=fmt.bytes_exact(dt.expected)))
c3.metric(_("GPU memory (GiB)"), fmt.gib(est.gpu_memory_bytes), help=fmt.bytes_exact(est.gpu_memory_bytes))
c4.metric(_("Headroom (GiB)"), fmt.gib(est.headroom_bytes),
          help=_("GPU memory minus the expected device total; negative means it does not fit."))
st.markdown(_("The peak falls at **{place}**, in step {step}. Device total range: {low} (low) to {high} (high).",
              place=charts.peak_place(est.peak_event, est.peak_phase), step=est.peak_step, low=fmt.gib(dt.low),
              high=fmt.gib(dt.high)))

st.subheader(_("Memory across one training step") if sc.mode.value == "train" else
             _("Memory across one forward pass (inference, KV cache on)"))
st.plotly_chart(charts.timeline_area(est), key="calc_timeline")


fit_col, off_col, model_col = st.columns(3)
with fit_col:
    st.subheader(_("What fits"))
    key = sc.model_dump_json()
    mbs = compute.largest_fitting(key, "micro_batch_size")
    seq = compute.largest_fitting(key, "seq_len")
    if mbs is None:
        st.info(_("Choose a GPU to see the largest micro-batch and sequence that fit."))
    else:
        if mbs:
            st.metric(_("Largest micro-batch that fits"), f"{mbs:,}",
                      help=_("At sequence length {seq_len}, everything else unchanged (engine, bisection).",
                             seq_len=f"{sc.training.seq_len:,}"))
        else:
            st.markdown(_("No micro-batch fits at sequence length {seq_len}, not even 1, with everything else "
                          "unchanged.", seq_len=f"{sc.training.seq_len:,}"))
        if seq:
            st.metric(_("Longest sequence that fits (tokens)"), f"{seq:,}",
                      help=_("At micro-batch {micro_batch}. The model was trained with up to {positions} positions.",
                             micro_batch=f"{sc.training.micro_batch_size:,}",
                             positions=f"{sc.spec.max_position_embeddings:,}"))
        else:
            st.markdown(_("No sequence length fits at micro-batch {micro_batch}, not even 1 token.",
                          micro_batch=f"{sc.training.micro_batch_size:,}"))
        if not mbs or not seq:
            st.page_link("pages/3_Recommend.py", label=_("Recommend: what to turn on next"),
                         icon=":material/recommend:", query_params=state.page_params())
with off_col:
    st.subheader(_("Offload"))
    if est.cpu_ram_bytes or est.nvme_bytes:
        st.metric(_("CPU RAM needed per node (GiB)"), fmt.gib(est.cpu_ram_bytes),
                  help=fmt.bytes_exact(est.cpu_ram_bytes))
        host_surprise = why.offload_above_16_bytes(sc, est)
        if host_surprise is not None:
            st.caption(say(host_surprise))
        st.metric(_("NVMe space needed per node (GiB)"), fmt.gib(est.nvme_bytes), help=fmt.bytes_exact(est.nvme_bytes))
        host_mem = est.host_memory
        st.markdown(fmt.table([{_("part (per rank)"): fmt.plain(tr(p.label)), _("where"): tr(RESOURCE_NAMES[p.where]),
                                _("needed"): fmt.gib(p.allocated_bytes), _("asked"): fmt.gib(p.requested_bytes),
                                _("source"): fmt.plain(p.source)} for p in host_mem.parts]))
        if (node_words := host_ram_words(host_mem)) is not None:
            st.caption(say(node_words))
        for lim in est.verdict.limits:
            if lim.resource == "gpu":
                continue
            host = lim.resource == "host_ram"
            if lim.fits is None:
                st.warning(_("Host RAM per node unknown: offload needs {need}; set the node's Host RAM under "
                             "Hardware to check.", need=fmt.gib(lim.needed_bytes)) if host else
                           _("NVMe per node unknown: offload needs {need}; set the node's NVMe under Hardware "
                             "to check.", need=fmt.gib(lim.needed_bytes)), icon=":material/help:")
            else:
                have, need = fmt.gib(lim.available_bytes), fmt.gib(lim.needed_bytes)
                if host:
                    text = (_("Host RAM per node: {have}; offload needs {need} (fits).", have=have, need=need)
                            if lim.fits else
                            _("Host RAM per node: {have}; offload needs {need} (does not fit).", have=have, need=need))
                else:
                    text = (_("NVMe per node: {have}; offload needs {need} (fits).", have=have, need=need)
                            if lim.fits else
                            _("NVMe per node: {have}; offload needs {need} (does not fit).", have=have, need=need))
                (st.success if lim.fits else st.error)(text)
    else:
        st.caption(_("Nothing is offloaded. With ZeRO 1-3, optimizer states can move to CPU RAM or NVMe; with "
                     "ZeRO-3 the weights too (sidebar, Memory savers)."))
with model_col:
    st.subheader(_("Model"))
    m = est.model
    st.markdown(_("- {total} parameters, {trainable} trainable\n"
                  "- {on_gpu} parameters on this GPU (before ZeRO sharding)\n"
                  "- {layers_here} of {layers} layers on this GPU", total=f"{m.total_params:,}",
                  trainable=f"{m.trainable_params:,}", on_gpu=f"{m.params_on_this_gpu:,}",
                  layers_here=m.layers_on_this_gpu, layers=m.num_layers))

st.subheader(_("Components"))
st.caption(_("What is alive at the peak, term by term (they sum to the peak allocated), then what nvidia-smi "
             "adds on top. The sources are listed below the table."))
COMPONENT, CATEGORY, FORMULA, BYTES = _("Component"), _("Category"), _("Formula"), _("bytes")
TOTAL, OUTSIDE = _("total"), _("outside the allocator")


def row(component: str, category: str, n_bytes: int, formula: str) -> dict[str, object]:
    return {COMPONENT: fmt.plain(component), CATEGORY: category, "GiB": f"{n_bytes / fmt.GiB:,.2f}",
            BYTES: f"{n_bytes:,}", FORMULA: fmt.plain(formula)}


rows = [row(c.label_in(lang), tr(charts.SHORT_LABELS.get(c.category, c.category)), c.bytes, c.formula_in(lang))
        for c in est.components]
rows += [
    row(_("Peak allocated"), TOTAL, est.peak_allocated_bytes, _("sum of the rows above")),
    row(_("CUDA context"), OUTSIDE, dt.cuda_context_bytes, _("driver context + loaded kernels (expected)")),
    row(_("NCCL communicator buffers"), OUTSIDE, dt.workspace_bytes, _("multi-GPU jobs only (expected)")),
    row(_("Caching-allocator reserve"), _("reserved, not allocated"), dt.reserve_expected_bytes,
        _("expected; range {low} to {high}", low=fmt.gib(dt.reserve_low_bytes), high=fmt.gib(dt.reserve_high_bytes))),
    row(_("Device total (expected)"), TOTAL, dt.expected,
        _("range {low} to {high}", low=fmt.gib(dt.low), high=fmt.gib(dt.high))),
]
# A Markdown table: a long formula wraps in its cell, and on a phone the table scrolls sideways (ui.layout)
st.markdown(fmt.table(rows))
calibration.section(sc, est)  # the user's own run: calibrated beside uncalibrated (ui/calibration.py)

# The two folded sections are filled only when opened (a rerun): the browser renders nothing a reader has not
# asked for, and the JSON's code block would load Streamlit's 1.5 MB syntax highlighter with the page.
sources = st.expander(_("Sources of each term"), key="calc_sources", on_change="rerun")
if sources.open:
    sources.markdown("\n".join(_("- **{label}** ({size}): `{formula}`. Source: {source}", label=c.label_in(lang),
                                   size=fmt.gib(c.bytes), formula=c.formula_in(lang), source=c.source_in(lang))
                                 for c in est.components))

# the estimate's notes hold them in English; say them in the reader's language
for note in (sc.quantization_note(), model_note(sc.spec)):
    if note is not None:
        st.caption(fmt.literal(say(note)))
scenario_json = st.expander(_("Scenario JSON (for `python -m calc estimate`)"), key="calc_json", on_change="rerun")
if scenario_json.open:
    scenario_json.code(sc.model_dump_json(indent=2, exclude_defaults=True), language="json")
    scenario_json.caption(_("The page URL holds this scenario too: copy it to share."))

"""Validation: the engine's predictions against measured runs (data/*.jsonl via calc.evidence.validate), and a
check of a user's own measurement record."""

from __future__ import annotations

import streamlit as st

from calc.contract.i18n import N_
from calc.evidence.validate import DEEPSPEED_BEHAVIOURS, FAMILY_EVIDENCE, GPU_GAPS, gpu_summary, run_counts
from calc.serve.published import compare, published_logs
from ui import compute, fmt, state
from ui import plots as charts
from ui.first_screen import stop_after_first_screen
from ui.language import _, tr
from ui.widgets import page_setup, scenario_or_stop

# The tables' columns: key -> (header, number format or None). Keys stay English (the data's names).
RUN_COLUMNS: dict[str, tuple[str, str | None]] = {
    "run": (N_("run"), None), "device": (N_("device"), None), "family": (N_("family"), None),
    "precision": (N_("precision"), None), "checkpointing": (N_("checkpointing"), None),
    "attention": (N_("attention"), None), "optimizer": (N_("optimizer"), None), "mode": (N_("mode"), None),
    "sharding": (N_("sharding"), None), "measured GiB": (N_("measured GiB"), "%.3f"),
    "predicted GiB": (N_("predicted GiB"), "%.3f"), "error %": (N_("error %"), "%+.2f"),
    "measured bytes": (N_("measured bytes"), None), "predicted bytes": (N_("predicted bytes"), None),
}
GROUP_COLUMNS: dict[str, tuple[str, str | None]] = {
    "group": (N_("group"), None), "value": (N_("value"), None), "count": (N_("runs"), None),
    "median_abs_error_pct": (N_("median |error| %"), "%.2f"), "worst_abs_error_pct": (N_("worst |error| %"), "%.2f"),
}


def _column(key: str) -> object:
    label, number_format = {**RUN_COLUMNS, **GROUP_COLUMNS}[key]
    if number_format:
        return st.column_config.NumberColumn(tr(label), format=number_format)
    return st.column_config.Column(tr(label))


page_setup("Validation", ":material/fact_check:")
st.title(_("Predicted vs measured"))
st.caption(_("Each run's peak allocated memory, measured by `python -m measure` (MemTracker's live-tensor peak on "
             "the CPU and under fake tensors; torch.cuda.max_memory_allocated on a GPU), against calc/'s prediction "
             "for the same scenario. GiB = 2^30 bytes; hover a point for exact bytes."))
scenario_or_stop()  # the sidebar keeps the shared scenario (and the URL) across pages

try:
    rep = compute.validation_report()
except ValueError as exc:  # a malformed committed file: RecordError names the line and field
    st.error(_("The committed data set could not be read: {error}", error=fmt.literal(exc)), icon=":material/error:")
    rep = None
else:
    if rep is None or not rep.cases:
        st.info(_("No measured runs are committed yet (data/*.jsonl). Upload your own record below."),
                icon=":material/info:")

if rep is None or not rep.cases:
    cases = []
else:
    cases = rep.cases
    n = run_counts(cases)
    where = _("{cpu} with PyTorch on the CPU, {deepspeed} with DeepSpeed on its CPU accelerator, {fake} with fake "
              "tensors (full-size shapes, no real memory)", cpu=f"{n.torch_cpu:,}", deepspeed=f"{n.deepspeed_cpu:,}",
              fake=f"{n.fake:,}")
    evidence = (_("**{total} measured runs, {gpu} of them on a GPU**: {where}.", total=f"{n.total:,}",
                  gpu=f"{n.gpu:,}", where=where) if n.gpu else
                _("**{total} measured runs, none on a GPU**: {where}.", total=f"{n.total:,}", where=where))
    checked = _("They check the **peak allocated** memory (the tensors alive at the peak): median error {median} %, "
                "worst {worst} %. They do not check the **device total** that every fits / does not fit verdict "
                "uses (CUDA context, NCCL buffers, the allocator's reserve), which is modelled from PyTorch's "
                "documented behaviour.", median=f"{rep.median_abs_error_pct:.2f}",
                worst=f"{rep.worst_abs_error_pct:.2f}")
    on_gpu = gpu_summary(cases)
    if on_gpu is not None:
        checked += " " + _("On a GPU ({runs} runs on {gpus}): median {median} %, worst {worst} %; the full-size "
                           "presets (1 GiB and more) within {presets} %. The gaps are listed below.",
                           runs=f"{on_gpu[0]:,}", gpus=", ".join(w.device_name for w in rep.workspaces),
                           median=f"{on_gpu[1]:.2f}", worst=f"{on_gpu[2]:.2f}",
                           presets=f"{on_gpu[3]:.2f}")
    add = _("Own a GPU? `bash measure/run_gpu.sh` measures the suite on it and appends the records to "
            "`data/measured_cuda.jsonl`; upload one record below to compare it here.")
    (st.info if n.gpu else st.warning)(f"{evidence} {checked}\n\n{add}", icon=":material/science:")
    m1, m2, m3 = st.columns(3)
    m1.metric(_("Measured runs"), f"{len(cases):,}")
    m2.metric(_("Median |error| of peak allocated (%)"), f"{rep.median_abs_error_pct:.2f} %")
    m3.metric(_("Worst |error| of peak allocated (%)"), f"{rep.worst_abs_error_pct:.2f} %")
# The folded sections are filled only when opened (a rerun): the browser renders nothing a reader has not asked for.
deepspeed = st.expander(_("DeepSpeed: what is measured with DeepSpeed itself, what is modelled from its source"),
                        key="val_deepspeed", on_change="rerun")
if deepspeed.open:
    deepspeed.markdown(fmt.table([{_("behaviour"): tr(b), _("status"): tr(s)} for b, s in DEEPSPEED_BEHAVIOURS]))
gaps = st.expander(_("What the GPU runs show that the estimate does not model yet"), key="val_gpu_gaps",
                   on_change="rerun")
if gaps.open:
    gaps.markdown(fmt.table([{_("seen on the GPU"): tr(g), _("what is known"): tr(w)} for g, w in GPU_GAPS]))
families = st.expander(_("Model families: what is measured, what is modelled from source"), key="val_families",
                       on_change="rerun")
if families.open:
    families.markdown(fmt.table([{_("family"): tr(f), _("measured"): tr(m), _("modelled from source or refused"): tr(s)}
                                 for f, m, s in FAMILY_EVIDENCE]))
st.session_state.setdefault("val_log", True)
log_axes = st.toggle(_("Logarithmic axes (runs span from MiB to TiB)"), key="val_log")
plots = st.container()  # drawn after the uploader below, so that a user's record joins the plot


def draw_scatter(records: list) -> None:
    if cases or records:
        plots.plotly_chart(charts.validation_scatter(cases, records, log=log_axes), key="val_scatter")


if state.arrived() and cases:  # nothing is uploaded yet: the plot is the first screen, the rest follows once drawn
    draw_scatter([])
    stop_after_first_screen()

st.subheader(_("Check your own measurement"))
st.markdown(_("Run `python -m measure` (see measure/) on your machine and upload the JSON record it prints "
              "(one record, or JSON lines). The record is validated field by field, then predicted."))
up = st.file_uploader(_("Measurement record (.json / .jsonl)"), type=["json", "jsonl"], key="val_upload",
                      max_upload_size=compute.UPLOAD_LIMIT_MIB)
pasted = st.text_area(_("…or paste the record"), key="val_paste", height=120,
                      placeholder='{"schema_version": 1, "scenario": {...}, "device": "cuda", ...}')
mine = []
text, where = None, None
if up is not None:
    if up.size > compute.MAX_RECORD_BYTES:
        st.error(_("{name} is {size} MiB; the limit is {limit} MiB (a record is a few KiB).", name=fmt.literal(up.name),
                   size=f"{up.size / fmt.MiB:,.1f}", limit=f"{compute.MAX_RECORD_BYTES / fmt.MiB:.0f}"),
                 icon=":material/error:")
    else:
        text, where = up.getvalue(), up.name
elif pasted.strip():
    text, where = pasted, _("pasted record")
if text is not None:
    try:
        mine = compute.check_records(text, where)
    except ValueError as exc:
        st.error(fmt.literal(state.error_text(exc)), icon=":material/error:")
    for c in mine:
        st.success(_("**{name}**: measured {measured}, predicted {predicted} ({error} %; peak measured in {phase}, "
                     "predicted in {predicted_phase}).", name=fmt.literal(c.name), measured=fmt.gib(c.measured_bytes),
                     predicted=fmt.gib(c.predicted_bytes), error=f"{c.error_pct:+.2f}", phase=c.measured_phase,
                     predicted_phase=c.predicted_phase), icon=":material/check_circle:")

draw_scatter(mine)
if cases:
    plots.plotly_chart(charts.error_histogram(cases), key="val_hist")
modelled = st.expander(_("Modelled from source, not measured yet"), key="val_modelled", on_change="rerun")
if modelled.open:
    modelled.markdown("\n".join(f"- **{tr(what)}**: {tr(where)}" for what, where in compute.modelled_from_source()))

if cases:
    st.subheader(_("Runs"))
    f1, f2, f3 = st.columns(3)
    fams = f1.multiselect(_("Family"), sorted({c.family for c in cases}), key="val_family")
    precs = f2.multiselect(_("Precision"), sorted({c.precision for c in cases}), key="val_precision")
    devs = f3.multiselect(_("Device"), sorted({c.device for c in cases}), key="val_device")
    shown = [c for c in cases if (not fams or c.family in fams) and (not precs or c.precision in precs)
             and (not devs or c.device in devs)]
    st.dataframe([{"run": c.name, "device": c.device, "family": c.family, "precision": c.precision,
                   "checkpointing": c.checkpointing, "attention": c.attention, "optimizer": c.optimizer,
                   "mode": c.mode, "sharding": c.sharding, "measured GiB": c.measured_bytes / fmt.GiB,
                   "predicted GiB": c.predicted_bytes / fmt.GiB, "error %": c.error_pct,
                   "measured bytes": f"{c.measured_bytes:,}", "predicted bytes": f"{c.predicted_bytes:,}"}
                  for c in shown], hide_index=True, key="val_table",
                 column_config={key: _column(key) for key in RUN_COLUMNS})
    st.caption(_("{shown} of {total} runs shown.", shown=len(shown), total=len(cases)))
    st.subheader(_("Error by group"))
    st.dataframe([g.model_dump() for g in rep.groups], hide_index=True, key="val_groups",
                 column_config={key: _column(key) for key in GROUP_COLUMNS})

st.subheader(_("Serving engines: published vLLM start-up logs"))
st.caption(_("Start-up logs published in vLLM's issue threads, with the model, GPU, version and flags they state: "
             "each figure the log printed beside the serving planner's prediction for the same settings (the KV "
             "cache tokens from the KV cache memory the log reports)."))
FIGURES = {"weights_gib": N_("weights (GiB)"), "kv_tokens": N_("KV cache tokens"),
           "concurrency": N_("maximum concurrency"), "needed_gib": N_("KV cache one request needs (GiB)"),
           "starts": N_("starts (1 = yes)")}
serve_rows = [{_("log"): f"[{log.id}]({log.source})", _("vLLM"): log.vllm_version, _("GPU"): fmt.literal(log.gpu),
               _("figure"): tr(FIGURES[c.figure]), _("logged"): f"{c.logged:,.4g}", _("predicted"): f"{c.predicted:,.4g}",
               _("error %"): f"{c.error * 100:+.2f}"}
              for log in published_logs() for c in compare(log)]
st.markdown(fmt.table(serve_rows))

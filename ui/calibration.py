"""The Calculator page's calibration section: take the user's own run (three numbers for the current
scenario, or records from `python -m measure --device cuda`), fit calc.evidence.calibrate's corrections, and
draw the calibrated prediction beside the uncalibrated one. The calibration lives in the session
(ui.state.CALIBRATION) and in the URL (`cal=`), so it applies to every scenario the user tries next.
"""

from __future__ import annotations

import streamlit as st

from calc.contract.boundary import decode
from calc.contract.errors import UserError
from calc.contract.i18n import N_, T_
from calc.contract.scenario import Scenario
from calc.evidence.calibrate import (
    MAX_DEVICE_BYTES,
    MAX_RECORD_FILE_BYTES,
    CalibratedEstimate,
    Calibration,
    CalibrationError,
    Observation,
    apply,
    fit,
    observations_from_text,
)
from calc.memory.result import Estimate
from ui import compute, fmt, state
from ui import verdict_box as verdict_ui
from ui.language import _, say, tr

VALIDATION_PAGE = "pages/6_Validation.py"
# the comparison table's columns
TERM, UNCALIBRATED, CALIBRATED, DIFFERENCE = N_("Term"), N_("Uncalibrated (GiB)"), N_("Calibrated (GiB)"), N_("difference")


def section(sc: Scenario, est: Estimate) -> None:
    """Results first (when a calibration is set), then the inputs that make one."""
    st.subheader(_("Calibrate with your own run"))
    results = st.container()
    with st.expander(_("Enter a measurement from this machine")):
        _inputs(sc)
    cal = state.get_calibration()
    with results:
        if cal is None:
            st.caption(_("Ran one configuration on your GPU already? Its peak memory numbers replace the calculator's "
                         "assumed overheads (CUDA context, the allocator's reserve, what else uses the GPU) with what "
                         "your machine really does, for every other setting on the same GPU."))
        else:
            _results(cal, sc, est)
    state.sync_url()


# ---- inputs ---------------------------------------------------------------------------------

def _inputs(sc: Scenario) -> None:
    numbers, records = st.tabs([_("Three numbers from a run of this scenario"), _("Records from python -m measure")])
    with numbers:
        _numbers_form(sc)
    with records:
        _records_form()


def _numbers_form(sc: Scenario) -> None:
    st.markdown(_("Run the scenario in the sidebar for a few steps on your GPU, then read, in the same job:"))
    c1, c2, c3 = st.columns(3)
    alloc = c1.number_input(_("torch.cuda.max_memory_allocated() (bytes)"), 0, MAX_DEVICE_BYTES, 0, step=1,
                            key="cal_alloc", help=_("Peak bytes handed to tensors: what the calculator predicts."))
    reserved = c2.number_input(_("torch.cuda.max_memory_reserved() (bytes)"), 0, MAX_DEVICE_BYTES, 0, step=1,
                               key="cal_reserved", help=_("Peak bytes the caching allocator held from the driver."))
    used_mib = c3.number_input(_("nvidia-smi memory used (MiB)"), 0, MAX_DEVICE_BYTES // fmt.MiB, 0, step=1,
                               key="cal_used_mib",
                               help=_("The 'Memory-Usage' column while the job runs (MiB = 2^20 B)."))
    if st.button(_("Calibrate from these numbers"), key="cal_fit_numbers", icon=":material/tune:"):
        try:
            obs = Observation(name=_("your run"), scenario=sc, peak_allocated_bytes=int(alloc),
                              peak_reserved_bytes=int(reserved), device_used_bytes=int(used_mib) * fmt.MiB)
            state.set_calibration(fit([obs]))
        except (CalibrationError, ValueError) as exc:
            st.error(_("Cannot calibrate from these numbers: {error}", error=fmt.literal(state.error_text(exc))),
                     icon=":material/error:")


def _records_form() -> None:
    st.markdown(_("`python -m measure SCENARIO.json --device cuda -o run.json` writes a record of one run "
                  "(any scenario on this GPU). Several records let the fit tell a residual per token from one per "
                  "parameter."))
    nonce = st.session_state.get(state.CALIBRATION_NONCE, 0)
    files = st.file_uploader(_("Records (.json / .jsonl)"), type=["json", "jsonl"], accept_multiple_files=True,
                             key=f"cal_upload_{nonce}", max_upload_size=compute.UPLOAD_LIMIT_MIB)
    pasted = st.text_area(_("…or paste records (one per line)"), key=f"cal_paste_{nonce}", height=100,
                          placeholder='{"schema_version": 1, "scenario": {...}, "device": "cuda", ...}')
    texts = [(f.name, f.getvalue(), f.file_id) for f in files or []]
    if pasted.strip():
        texts.append((_("pasted record"), pasted.encode("utf-8", errors="replace"), f"paste:{hash(pasted)}"))
    ids = tuple(i for _name, _raw, i in texts)
    if not texts or st.session_state.get(state.CALIBRATION_UPLOAD) == ids:
        return  # nothing new: do not refit on every rerun
    try:
        obs = []
        for name, raw, _id in texts:
            if len(raw) > MAX_RECORD_FILE_BYTES:
                raise CalibrationError(T_("{where}: larger than {n} MiB (a record is a few KiB)", where=name,
                                          n=MAX_RECORD_FILE_BYTES // fmt.MiB))
            obs += observations_from_text(_text(raw, name), name)
        state.set_calibration(fit(obs))
        st.session_state[state.CALIBRATION_UPLOAD] = ids
    except CalibrationError as exc:
        st.error(fmt.literal(state.error_text(exc)), icon=":material/error:")


def _text(raw: bytes, name: str) -> str:
    """UTF-8 text of an upload, or CalibrationError naming the file (calc.contract.boundary.decode)."""
    try:
        return decode(raw, name)
    except UserError as exc:
        raise CalibrationError(str(exc)) from None


# ---- results --------------------------------------------------------------------------------

def _results(cal: Calibration, sc: Scenario, est: Estimate) -> None:
    try:
        ce = apply(cal, est, sc)
    except CalibrationError as exc:
        reason = state.error_text(exc)
        st.warning(_("Not applied: {reason}. Choose that GPU in the sidebar, or clear the calibration.",
                     reason=fmt.literal(reason[:1].upper() + reason[1:])), icon=":material/block:")
        _clear_button()
        return
    _verdict(ce)
    st.caption(_("Applied: {corrections}.", corrections=_("; ").join(fmt.literal(say(t)) for t in ce.applied_texts))
               + "".join(_(" Not applied: {what}.", what=fmt.literal(say(n))) for n in ce.not_applied_texts))
    _metrics(ce)
    st.dataframe(comparison_rows(est, ce), hide_index=True, key="cal_table",
                 column_config={tr(UNCALIBRATED): st.column_config.NumberColumn(format="%.2f"),
                                tr(CALIBRATED): st.column_config.NumberColumn(format="%.2f")})
    for w in ce.warning_texts:
        st.warning(fmt.literal(say(w)), icon=":material/report:")
    if ce.warnings:
        st.page_link(VALIDATION_PAGE, label=_("Open the Validation page"), icon=":material/fact_check:",
                     query_params=state.page_params())
    with st.expander(_("What the records determined, and how sure it is")):
        st.markdown("\n".join(f"- {fmt.literal(say(f))}" for f in cal.finding_texts()))
        st.caption(_("The calibrated range is the expected total ± 2 standard deviations of the fitted corrections; "
                     "the uncalibrated range spans the calculator's assumptions for any machine."))
    _clear_button()


def _verdict(ce: CalibratedEstimate) -> None:
    dt = ce.device_total_bytes
    verdict_ui.box(st, ce.verdict, _("Calibrated on **{machine}**", machine=fmt.literal(ce.machine)),
                   _("device total {expected} expected, {low} to {high}", expected=fmt.gib(dt.expected),
                     low=fmt.gib(dt.low), high=fmt.gib(dt.high)))


def _metrics(ce: CalibratedEstimate) -> None:
    dt, udt = ce.device_total_bytes, ce.uncalibrated_device_total_bytes
    m1, m2, m3 = st.columns(3)
    m1.metric(_("Device total, calibrated (GiB)"), fmt.gib(dt.expected),
              delta=_("{change} vs uncalibrated", change=fmt.gib_signed(dt.expected - udt.expected)), delta_color="off",
              help=_("Expected {expected}; uncalibrated {uncalibrated}.", expected=fmt.bytes_exact(dt.expected),
                     uncalibrated=fmt.bytes_exact(udt.expected)))
    m2.metric(_("Calibrated range (GiB)"), range_text(dt.low, dt.high),
              delta=_("{width} wide, uncalibrated {uncalibrated}", width=fmt.gib(dt.high - dt.low),
                      uncalibrated=fmt.gib(udt.high - udt.low)), delta_color="off")
    m3.metric(_("Headroom, calibrated (GiB)"), fmt.gib(ce.headroom_bytes),
              help=_("GPU memory minus the calibrated expected device total."))


def comparison_rows(est: Estimate, ce: CalibratedEstimate) -> list[dict[str, object]]:
    """Uncalibrated beside calibrated, term by term (GiB), as the table on the page shows them."""
    dt, cdt, udt = est.device_total_bytes, ce.device_total_bytes, ce.uncalibrated_device_total_bytes
    rows = [
        (N_("Peak allocated (tensors)"), est.peak_allocated_bytes, ce.peak_allocated_bytes),
        (N_("Allocator reserve (reserved - allocated)"), dt.reserve_expected_bytes,
         ce.reserved_bytes - ce.peak_allocated_bytes),
        (N_("Outside the allocator (CUDA context, NCCL, other processes)"), dt.cuda_context_bytes + dt.workspace_bytes,
         ce.outside_allocator_bytes),
        (N_("Device total, low"), udt.low, cdt.low),
        (N_("Device total, expected"), udt.expected, cdt.expected),
        (N_("Device total, high"), udt.high, cdt.high),
    ]
    return [{tr(TERM): tr(name), tr(UNCALIBRATED): u / fmt.GiB, tr(CALIBRATED): c / fmt.GiB,
             tr(DIFFERENCE): fmt.gib_signed(c - u)} for name, u, c in rows]


def range_text(low: int, high: int) -> str:
    """'43.39 – 46.73' (the label says GiB; a metric has no room for the unit twice)."""
    return f"{low / fmt.GiB:,.2f} – {high / fmt.GiB:,.2f}"


def _clear_button() -> None:
    st.button(_("Clear the calibration"), key="cal_clear", icon=":material/close:",
              on_click=state.set_calibration, args=(None,))

"""Compare: two to four scenarios side by side on one GiB scale, a difference table, which fits."""

from __future__ import annotations

import streamlit as st

from calc.contract.i18n import N_
from calc.recommend import describe, per_step_words
from ui import compute, fmt, state
from ui import plots as charts
from ui import verdict_box as verdict_ui
from ui.compare_columns import column_name, compare_columns_editor
from ui.first_screen import stop_after_first_screen
from ui.language import _, say, tr
from ui.widgets import page_setup, scenario_or_stop

page_setup("Compare", ":material/compare_arrows:")
st.title(_("Compare scenarios"))
st.caption(_("The sidebar's model on different hardware: each column either takes the fastest configuration that "
             "fits its hardware (the recommender's), or the sidebar's training setup with its own ZeRO stage and "
             "offload. Per-GPU memory in GiB (2^30 bytes); hover for exact bytes."))
MODES = {"train": N_("train"), "inference": N_("inference")}

base = scenario_or_stop(include_compare=True)
if base is None:
    st.stop()
st.markdown(_("**{model}**, {mode}: what each machine can do with it.", model=base.spec.name or base.spec.family,
               mode=tr(MODES.get(base.mode.value, base.mode.value))))
cols = compare_columns_editor()
state.sync_url(include_compare=True)

items = []  # (name, estimate) of the valid columns
letters = []  # each valid column's own letter: the table's headers stay with their columns
chosen = []  # (column, the recommender's candidate or None)
scenarios = []  # (the column's scenario, its estimate)
for i, col in enumerate(cols):
    name = column_name(i, col)
    try:
        sc, cand = compute.column_scenario(base, col)
        est = compute.run(sc)
    except ValueError as exc:
        st.error(_("{column}: {error}", column=name, error=fmt.literal(state.error_text(exc))), icon=":material/error:")
        continue
    items.append((name, est))
    scenarios.append((sc, est))
    letters.append(chr(65 + i))
    chosen.append((col, cand))

if not items:
    st.stop()

methods = [describe.method_words(sc) for sc, _est in scenarios]
mixed = len({str(m) for m in methods}) > 1
for box, (name, est), (sc, _est), method, (col, cand) in zip(st.columns(len(items)), items, scenarios, methods, chosen,
                                                             strict=True):
    # the headline names the method: "fits" is about this column's setup, which may not be the sidebar's
    verdict_ui.box(box, est.verdict, _("**{column}**, {method}", column=name, method=say(method)),
                   _("device total {size} per GPU", size=fmt.gib(est.device_total_bytes.expected)))
    stack = say(describe.stack_words(sc))
    if col.fastest and cand is not None:
        tps, batch = f"{cand.tokens_per_s_per_gpu:,.0f}", say(per_step_words(cand.global_batch_tokens))
        box.caption(_("{stack}; {tps} tokens/s per GPU {batch}. Full fine-tuning does not fit this hardware at a "
                      "practical speed.", stack=stack, tps=tps, batch=batch) if cand.method_change else
                    _("{stack}; {tps} tokens/s per GPU {batch}.", stack=stack, tps=tps, batch=batch))
    else:
        box.caption(_("Nothing fits this hardware, not even QLoRA; showing the sidebar's training setup on it: "
                      "{stack}.", stack=stack) if col.fastest else stack)
if mixed:
    st.info(_("The columns train different methods ({methods}): their memory and speed compare setups, not the same "
              "training job.", methods=tr("; ").join(f"{letters[j]} {say(m)}" for j, m in enumerate(methods))),
            icon=":material/info:")

st.plotly_chart(charts.compare_bars(items), key="cmp_chart")
stop_after_first_screen()  # on arrival the rest of the page follows once the browser has drawn this chart

st.subheader(_("Differences (GiB per GPU)"))
if mixed:
    st.caption(_("Not like for like: the columns train different methods (above), so a row compares what each method "
                 "keeps, not the same tensors."))
first = items[0][1]
labels = [(k, charts.short_label(k)) for k, _ in charts.segments(first)]


def _rows(est):
    seg = dict(charts.segments(est))
    out = {label: seg[k] for k, label in labels}
    out.update({
        _("Peak allocated"): est.peak_allocated_bytes,
        _("Device total (expected)"): est.device_total_bytes.expected,
        _("GPU memory"): est.gpu_memory_bytes,
        _("Headroom"): est.headroom_bytes,
        _("CPU RAM for offload (per node)"): est.cpu_ram_bytes,
        _("NVMe for offload (per node)"): est.nvme_bytes,
    })
    return out


table = {name: _rows(est) for name, est in items}
names = list(table)
rows = []
ref_letter = letters[0]
METRIC = _("GiB per GPU")
for metric in table[names[0]]:
    row = {METRIC: metric}
    for j, name in enumerate(names):
        v = table[name][metric]
        row[letters[j]] = None if v is None else v / fmt.GiB
        if j:
            ref = table[names[0]][metric]
            row[f"{letters[j]} − {ref_letter}"] = None if v is None or ref is None else (v - ref) / fmt.GiB
    rows.append(row)
st.dataframe(rows, hide_index=True, key="cmp_table", height=35 * (len(rows) + 1) + 3,
             column_config={c: st.column_config.NumberColumn(c, format="%.2f") for c in rows[0] if c != METRIC})


def _peak_at(est) -> str:
    """'backward layer 3 (backward)' in the session's language (calc.memory.result's words where it has them)."""
    return charts.peak_place(est.peak_event, est.peak_phase)


sep = tr("; ")
st.caption(_("Columns: {columns}. Peak at: {peaks}.", columns=sep.join(names),
             peaks=sep.join(f"{letters[j]} {_peak_at(est)}" for j, (_n, est) in enumerate(items))))

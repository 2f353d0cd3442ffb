"""Recommend: what to turn on next for the current scenario (a memory waterfall with the speed cost
of each step), the fastest configurations that fit, and the model-size x hardware table. All from
calc.recommend (which uses calc.memory.engine for memory and calc.speed for speed)."""

from __future__ import annotations

import streamlit as st

from calc.contract.presets import cluster_presets, gpu_presets, model_presets
from calc.memory.verdict import headline as verdict_headline
from calc.memory.verdict import short as verdict_short
from calc.recommend import (
    TABLE_HARDWARE,
    TABLE_MODELS,
    TABLE_SEQ_LEN,
    TABLE_SEQ_LENS,
    per_step_words,
    speed_ratio_words,
    table_assumptions,
    usable_bytes,
)
from calc.recommend.phrase import Phrase
from calc.serve.table import SERVING_CONTEXT, SERVING_CONTEXTS
from ui import compute, fmt, state
from ui import plots as charts
from ui.compare_columns import cluster_short_name
from ui.first_screen import stop_after_first_screen
from ui.language import _, current, say
from ui.serving_table import draw_serving_table
from ui.widgets import hardware_name, page_setup, scenario_or_stop

page_setup("Recommend", ":material/recommend:")
st.title(_("What fits, and what to turn on next"))
st.caption(_("Memory is the engine's expected device total per GPU (GiB = 2^30 bytes); speed is calc.speed's "
             "estimate in tokens/s per GPU. The verdict is the engine's, as on every page: GPU memory per GPU, and "
             "host RAM / NVMe per node when something is offloaded."))

sc = scenario_or_stop()
if sc is None:
    st.stop()
key = sc.model_dump_json()


def _use(scenario) -> None:
    state.set_scenario(scenario)


def _named(steps: list) -> list:
    """The steps with their names already in the session's language, for ui.plots (which writes s.name
    as text); English needs nothing."""
    if current() == "en":
        return steps
    return [s.model_copy(update={"name": Phrase(say(s.name))}) for s in steps]


def short(v) -> str:
    """calc.memory.verdict.short in the session's language (a table cell)."""
    return verdict_short(v, current())


def headline(v) -> str:
    """calc.memory.verdict.headline in the session's language."""
    return verdict_headline(v, current())


# ---- what to turn on next ----------------------------------------------------------------
st.header(_("What to turn on next"))
st.markdown(_("For **{model}** on **{hardware}**, starting from an fp32 baseline, each step turns one more "
              "optimization on top of the previous ones, cheapest first. The last steps change the training method "
              "(8-bit optimizer, LoRA, QLoRA).", model=sc.spec.name or sc.spec.family, hardware=hardware_name(sc)))
try:
    steps = compute.waterfall(key)
except ValueError as exc:
    st.error(_("calc.recommend cannot build the waterfall for this scenario: {error}",
               error=fmt.literal(state.error_text(exc))), icon=":material/error:")
    steps = []
if steps:
    est = compute.run(sc)
    usable = None if est.gpu_memory_bytes is None else usable_bytes(est.gpu_memory_bytes)
    st.plotly_chart(charts.waterfall_chart(_named(steps), est.gpu_memory_bytes, usable), key="rec_waterfall")
    stop_after_first_screen()  # on arrival the rest of the page follows once the browser has drawn this chart
    rows = []
    for i, s in enumerate(steps):
        prev = steps[i - 1].tokens_per_s_per_gpu if i else None
        cost = None if prev in (None, 0) or s.tokens_per_s_per_gpu is None else \
            speed_ratio_words(s.tokens_per_s_per_gpu / prev)
        verdict = short(s.verdict)
        rows.append({_("step"): fmt.plain(f"{s.step}. {say(s.name)}"), _("turns on"): fmt.plain(say(s.change)),
                     _("device total"): fmt.gib(s.device_total_expected_bytes),
                     _("verdict"): _("{verdict} (under 10 % free)", verdict=verdict) if s.tight else verdict,
                     _("tokens/s per GPU"): "—" if s.tokens_per_s_per_gpu is None else f"{s.tokens_per_s_per_gpu:,.0f}",
                     _("speed vs previous step"): say(cost) if cost else "—",
                     _("method change"): _("yes") if s.method_change else ""})
    st.markdown(fmt.table(rows))
    # why a step needs more memory, or saves none although it costs time: said under the table, step by step
    st.markdown("\n".join(_("- **{step}. {name}** {why}", step=s.step, name=say(s.name), why=say(s.why_more or s.why_same))
                          for s in steps if s.why_more or s.why_same))
    first = next((s for s in steps if s.fits), None)
    if first is None:
        last = steps[-1]
        st.warning(_("Even the last step does not fit this hardware: {verdict}. Try more GPUs, a shorter sequence or "
                     "a smaller micro-batch.", verdict=headline(last.verdict)), icon=":material/warning:")
    else:
        fields = dict(step=first.step, name=say(first.name), size=fmt.gib(first.device_total_expected_bytes))
        st.success(_("The first step that fits is **{step}. {name}** ({size} per GPU, {tps} tokens/s per GPU).",
                     tps=f"{first.tokens_per_s_per_gpu:,.0f}", **fields) if first.tokens_per_s_per_gpu else
                   _("The first step that fits is **{step}. {name}** ({size} per GPU).", **fields),
                   icon=":material/check_circle:")
        st.button(_("Use step {step} ({name}) as the scenario", step=first.step, name=say(first.name)),
                  key="rec_apply_waterfall", on_click=_use, args=(first.scenario,))

# ---- ranked configurations ---------------------------------------------------------------
st.header(_("Fastest configurations"))
st.caption(_("Ranked by tokens/s among configurations that fit every known limit: GPU memory with 10 % kept free, "
             "and the node's host RAM and NVMe for offload; where the node's figure is not given, the row says what "
             "it needs. Full fine-tuning and adapters (LoRA / QLoRA) are searched "
             "separately, so both questions get an answer: can I train every weight, and what trains fast?"))
allow = st.toggle(_("Allow 8-bit AdamW or pure bf16 states (or QLoRA for a LoRA scenario) when nothing else fits"),
                  key="rec_allow")
try:
    rec = compute.recommendations(key, allow, None)
except ValueError as exc:
    st.info(_("The ranked search needs a GPU preset: {error}", error=fmt.literal(state.error_text(exc))),
            icon=":material/info:")
    rec = None
if rec is not None:
    if len(rec.groups) > 1:
        st.markdown(say(rec.explanation))
    for note in rec.notes:
        st.caption(say(note))
    for g in rec.groups:
        st.subheader(say(g.label))
        cands = [c for c in rec.candidates if c.group == g.group]
        st.markdown(say(g.explanation))
        for line in g.advice:
            st.warning(say(line), icon=":material/speed:")
        if not cands:
            continue
        st.markdown(fmt.table([{"#": c.rank, _("configuration"): fmt.plain(say(c.label)),
                               _("tokens/s per GPU"): f"{c.tokens_per_s_per_gpu:,.0f}",
                               _("tokens per step"): f"{c.global_batch_tokens:,}", _("step"): f"{c.step_s:,.3g} s",
                               _("device total"): fmt.gib(c.device_total_expected_bytes),
                               _("CPU RAM per node"): fmt.gib(c.cpu_ram_bytes), _("verdict"): short(c.verdict),
                               _("method change"): _("yes") if c.method_change else ""} for c in cands]))
        unknown = [c for c in cands if c.verdict.fits is None]
        if unknown:
            st.info(f"#{unknown[0].rank}: {headline(unknown[0].verdict)}.", icon=":material/help:")
        pick = st.selectbox(_("Configuration"), [c.rank for c in cands], key=f"rec_pick_{g.group}",
                            format_func=lambda r, cs=cands: f"#{r}: {say(cs[r - 1].label)}")
        st.button(_("Use configuration #{rank} as the scenario", rank=pick), key=f"rec_apply_{g.group}", on_click=_use,
                  args=(cands[pick - 1].scenario,))
    st.caption(_("Usable {usable} of {memory} per GPU; global batch {sequences} sequences; {combinations} "
                 "combinations, {estimates} memory estimates in {seconds} s.", usable=fmt.gib(rec.usable_bytes),
                 memory=fmt.gib(rec.gpu_memory_bytes), sequences=f"{rec.target_global_batch_sequences:,}",
                 combinations=f"{rec.stats.combinations:,}", estimates=f"{rec.stats.memory_estimates:,}",
                 seconds=f"{rec.stats.elapsed_s:.2f}"))

# ---- model x hardware --------------------------------------------------------------------
st.header(_("Model size x hardware"))
view = st.radio(_("Table"), ["training", "serving"], horizontal=True, key="rec_table_view",
                format_func=lambda v: _("training") if v == "training" else _("serving (vLLM)"))
if view == "serving":
    context = st.selectbox(_("Tokens per request (prompt + answer)"), SERVING_CONTEXTS,
                           index=SERVING_CONTEXTS.index(SERVING_CONTEXT), key="rec_srv_ctx",
                           format_func=lambda n: f"{n:,}")
    draw_serving_table(int(context))
    st.stop()
st.session_state.setdefault("rec_seq", TABLE_SEQ_LEN)
seq = st.selectbox(_("Sequence length (tokens)"), TABLE_SEQ_LENS, key="rec_seq")
seq_len, batch_tokens = int(seq or TABLE_SEQ_LEN), sc.training.global_batch_tokens  # the sidebar's global batch
st.markdown(_("Every cell's speed is {batch}, the global batch set in the sidebar.",
              batch=say(per_step_words(batch_tokens))))
models, gpus, clusters = model_presets(), gpu_presets(), cluster_presets()


def _hw_label(h: str) -> str:
    return cluster_short_name(h) if h in clusters else gpus[h].name


def _cell(c) -> str:
    if c is None:
        return _("searching…")
    if c.status == "nothing-fits":
        return _("does not fit ({note})", note=say(c.note)) if c.note else _("does not fit")
    fields = dict(config=say(c.label), tps=f"{c.tokens_per_s_per_gpu:,.0f}", size=fmt.gib(c.device_total_expected_bytes))
    if c.status == "method-change":
        return _("method change: {config} — {tps} tok/s/GPU, {size}", **fields)
    return _("{config} — {tps} tok/s/GPU, {size}", **fields)


def _draw_table(budget_s: float) -> int:
    """The table as far as it is found (each cell is a search of its own; this run adds cells for at most
    budget_s); returns the cells still missing."""
    cells = compute.table_cells(seq_len, batch_tokens, budget_s)
    grid = [{_("model"): f"{models[m].name} ({models[m].spec.total_params() / 1e9:,.1f} B)",
             **{_hw_label(h): _cell(c) for h, c in zip(TABLE_HARDWARE, row, strict=True)}}
            for m, row in zip(TABLE_MODELS, cells, strict=True)]
    st.markdown(fmt.table(grid))
    missing = sum(c is None for row in cells for c in row)
    if missing:
        st.caption(_("{missing} of {cells} cells are still being searched; they appear here as they are found.",
                     missing=missing, cells=len(TABLE_MODELS) * len(TABLE_HARDWARE)))
    st.caption(_("{assumptions} Device totals are per GPU.", assumptions=say(table_assumptions(seq_len, batch_tokens))))
    return missing


# While cells are missing the table section reruns on its own every half second (a fragment: the rest of
# the page stays as it is) and each of those runs searches new cells; a full page run only draws what is
# known, so a first visit or a widget change never waits for the table. When the last cell is found, one
# full run drops the timer.
_was_missing = not compute.table_complete(seq_len, batch_tokens)
st.session_state["rec_table_page_run"] = True


@st.fragment(run_every=0.5 if _was_missing else None)
def _table_section() -> None:
    page_run = st.session_state.pop("rec_table_page_run", False)
    if not _draw_table(0.0 if page_run else compute.TABLE_BUDGET_S) and _was_missing and not page_run:
        st.rerun()


_table_section()

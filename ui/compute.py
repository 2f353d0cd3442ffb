"""Cached calls into calc/: preset option lists and the fit searches (each a few dozen engine
runs). The engine itself takes milliseconds, so single estimates are not cached (STYLE.md)."""

from __future__ import annotations

import time
from typing import Any, Literal

import streamlit as st

from calc.contract.boundary import decode
from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, translate
from calc.contract.presets import cluster_presets, gpu_presets, model_presets
from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.memory.engine import estimate
from calc.memory.result import Estimate
from ui import language


def model_options() -> dict[str, str]:
    """Preset id -> 'Name (6.74 B params)', smallest model first, in the session's language."""
    return _model_options(language.current())


@st.cache_data(max_entries=4, show_spinner=False)
def _model_options(lang: Lang) -> dict[str, str]:
    items = sorted(model_presets().values(), key=lambda p: (p.spec.total_params(), p.id))
    return {p.id: translate(N_("{name} ({size} B params)"), lang, name=p.name,
                            size=f"{p.spec.total_params() / 1e9:,.2f}") for p in items}


@st.cache_data(max_entries=4, show_spinner=False)
def gpu_options() -> dict[str, str]:
    """GPU id -> 'NVIDIA A100 SXM4 80GB (80.00 GiB)', smallest memory first."""
    items = sorted(gpu_presets().values(), key=lambda g: (g.memory_bytes, g.id))
    return {g.id: f"{g.name} ({g.memory_bytes / GiB:,.2f} GiB)" for g in items}


@st.cache_data(max_entries=4, show_spinner=False)
def cluster_options(lang: Lang = DEFAULT_LANG) -> dict[str, str]:
    """Cluster id -> its name in `lang` (the preset's name is a message id), fewest GPUs first."""
    items = sorted(cluster_presets().values(), key=lambda c: (c.num_gpus, gpu_presets()[c.gpu].memory_bytes, c.id))
    return {c.id: translate(c.name, lang) for c in items}


def run(sc: Scenario) -> Estimate:
    """The engine's estimate (ValueError for combinations the engine rejects)."""
    return estimate(sc)


@st.cache_data(max_entries=512, show_spinner=False)
def largest_fitting(scenario_json: str, field: Literal["micro_batch_size", "seq_len"]) -> int | None:
    """Cached calc.memory.fit.largest_fitting (0 when even 1 does not fit; None without a GPU size)."""
    from calc.memory.fit import largest_fitting as search

    return search(Scenario.model_validate_json(scenario_json), field)


# ---- Validation ------------------------------------------------------------------------------

MAX_RECORD_BYTES = 1 * 2**20  # a measurement record is a few KiB
# what every uploader tells the user ("Limit 1MB per file": Streamlit's MB is 2**20 bytes) and .streamlit/config.toml's
# server.maxUploadSize: the limit that the app checks (calc.contract.limits.MAX_JSON_BYTES, MAX_RECORD_BYTES)
UPLOAD_LIMIT_MIB = MAX_RECORD_BYTES // 2**20


def _data_key() -> tuple[tuple[str, int, int], ...]:
    from calc.evidence.validate import default_data_files

    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in default_data_files())


@st.cache_data(max_entries=4, show_spinner=False)
def _report(key: tuple[tuple[str, int, int], ...]):
    from calc.evidence.validate import load_all, report

    records = load_all([p for p, _, _ in key])
    return report(records)


def validation_report():
    """calc.evidence.validate's report over the committed data/*.jsonl (cached until a file changes);
    None when no file is committed. RecordError (a ValueError) names a bad line and field."""
    key = _data_key()
    return _report(key) if key else None


def modelled_from_source() -> tuple[tuple[str, str], ...]:
    """(what, which source) for each behaviour the engine models without a committed measurement."""
    from calc.evidence.validate import MODELLED_FROM_SOURCE

    return MODELLED_FROM_SOURCE


def check_records(text: str | bytes, where: str) -> list:
    """Parse one JSON record, a JSON list of records or JSON lines with calc.contract.record (through
    calc.contract.boundary: bounded, strict) and compare each with its prediction. ValueError names the line
    and the field."""
    from calc.contract.record import parse_records
    from calc.evidence.validate import compare

    if len(text) > MAX_RECORD_BYTES or len(text if isinstance(text, bytes) else
                                          text.encode("utf-8", "surrogatepass")) > MAX_RECORD_BYTES:
        raise UserError(T_("{where} is over {limit} MiB; a record is a few KiB", where=where,
                           limit=MAX_RECORD_BYTES // 2**20))
    if isinstance(text, bytes):
        text = decode(text, where)  # names the file when it is not UTF-8
    out = []
    for i, rec in enumerate(parse_records(text, where)):
        try:
            out.append(compare(rec, i))
        except (ValueError, ArithmeticError) as exc:
            raise UserError(T_("{where}: the engine cannot predict this scenario: {problem}", where=where,
                               problem=exc)) from None
    return out


# ---- Recommend -------------------------------------------------------------------------------

# How long the Recommend page's table section may spend on new cells per run of its own (a timed rerun
# of the section alone, which holds up nothing else); full page runs add none, so a first visit or a
# widget change never waits for a search of the table.
TABLE_BUDGET_S = 0.4


# Process-wide: the table cells found so far, per (model, hardware, seq_len, global batch tokens); the same
# for every visitor, and filled before the first one by `python -m ui.serve`. A plain dict rather than a
# Streamlit cache, so that the warm-up can fill it before the server (and its caches) start. Bounded by the
# widgets: 5 sequence lengths x 6 batches x 36 cells.
_TABLE_CELLS: dict[tuple[str, str, int, int], Any] = {}


def table_cells(seq_len: int, global_batch_tokens: int, budget_s: float = TABLE_BUDGET_S) -> list[list[Any]]:
    """calc.recommend's model x hardware table as far as it is known: the cells found before, plus new ones
    (each one `recommend` search, calc.recommend.table_cell) while `budget_s` lasts; None for the rest. A
    positive budget adds at least one cell, so repeated calls finish the table; 0 adds none."""
    from calc.recommend import TABLE_HARDWARE, TABLE_MODELS, table_cell

    known = _TABLE_CELLS
    start = time.perf_counter()
    rows = []
    for m in TABLE_MODELS:
        row = []
        for h in TABLE_HARDWARE:
            key = (m, h, seq_len, global_batch_tokens)
            if key not in known and time.perf_counter() - start < budget_s:
                known[key] = table_cell(m, h, seq_len=seq_len, global_batch_tokens=global_batch_tokens)
            row.append(known.get(key))
        rows.append(row)
    return rows


def table_complete(seq_len: int, global_batch_tokens: int) -> bool:
    from calc.recommend import TABLE_HARDWARE, TABLE_MODELS

    known = _TABLE_CELLS
    return all((m, h, seq_len, global_batch_tokens) in known for m in TABLE_MODELS for h in TABLE_HARDWARE)


@st.cache_data(max_entries=4, show_spinner=False)
def serving_cells(context: int) -> list[list[Any]]:
    """The serving view of the model x hardware table: calc.serve.table.serving_cell for every cell of the
    training table's models and hardware (arithmetic, some 80 plans: no search)."""
    from calc.recommend import TABLE_HARDWARE, TABLE_MODELS
    from calc.serve.table import serving_table

    return serving_table(TABLE_MODELS, TABLE_HARDWARE, context)


@st.cache_data(max_entries=256, show_spinner=False)
def waterfall(scenario_json: str):
    """calc.recommend.optimization_waterfall for the scenario."""
    from calc.recommend import optimization_waterfall

    return optimization_waterfall(Scenario.model_validate_json(scenario_json))


@st.cache_data(max_entries=256, show_spinner=False)
def recommendations(scenario_json: str, allow_method_change: bool, global_batch_tokens: int | None):
    """calc.recommend.recommend for the scenario (ValueError when it needs a GPU preset)."""
    from calc.recommend import RecommendRequest, recommend

    req = RecommendRequest(scenario=Scenario.model_validate_json(scenario_json),
                           allow_method_change=allow_method_change, global_batch_tokens=global_batch_tokens,
                           max_candidates=10)
    return recommend(req)


@st.cache_data(max_entries=64, show_spinner=False)
def fastest_fitting(scenario_json: str):
    """calc.recommend.fastest_fitting for the scenario (None when nothing fits)."""
    from calc.recommend import fastest_fitting as search

    return search(Scenario.model_validate_json(scenario_json))


def speed(sc: Scenario):
    """calc.speed's estimate for the scenario; None without a GPU preset (a custom memory size)."""
    from calc.speed import estimate_speed

    try:
        return estimate_speed(sc)
    except ValueError:
        return None


def column_scenario(base: Scenario, col) -> tuple[Scenario, object | None]:
    """A Compare column's scenario, and the recommender's candidate when the column asks for the fastest
    configuration that fits (the plain column scenario when nothing fits). ValueError if invalid."""
    sc = col.apply(base)
    if not col.fastest:
        return sc, None
    cand = fastest_fitting(sc.model_dump_json())
    return (cand.scenario, cand) if cand is not None else (sc, None)

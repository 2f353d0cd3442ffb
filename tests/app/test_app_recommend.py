"""Recommend page: the waterfall, the ranked configurations and the model x hardware table equal what
calc.recommend returns; the "use this" buttons make that configuration the scenario."""

from __future__ import annotations

import itertools
import math

import pytest

from calc.contract.scenario import DEFAULT_GLOBAL_BATCH_TOKENS, Scenario
from calc.contract.units import GiB
from calc.memory.engine import estimate
from calc.memory.verdict import short
from calc.recommend import (
    TABLE_HARDWARE,
    TABLE_MODELS,
    RecommendRequest,
    optimization_waterfall,
    recommend,
    recommendation_table,
)
from tests.app.test_app_helpers import all_text, assert_clean, chart, go, open_app, scenario, tables
from ui import compute, fmt, state


def _table(at, first_col: str):
    for df in tables(at):
        if first_col in df.columns:
            return df
    raise KeyError(first_col)


def _tables(at, first_col: str) -> list:
    return [t for t in tables(at) if first_col in t.columns]


def check_groups(at, rec) -> None:
    """One table per group that has candidates, equal to calc.recommend's; every explanation and advice shown."""
    tables = _tables(at, "configuration")
    groups = [g for g in rec.groups if any(c.group == g.group for c in rec.candidates)]
    assert len(tables) == len(groups)
    text = all_text(at)
    for df, g in zip(tables, groups, strict=True):
        cands = [c for c in rec.candidates if c.group == g.group]
        assert list(df["configuration"]) == [c.label for c in cands]
        assert list(df["tokens/s per GPU"]) == [f"{c.tokens_per_s_per_gpu:,.0f}" for c in cands]
        assert list(df["device total"]) == [fmt.gib(c.device_total_expected_bytes) for c in cands]
        assert list(df["verdict"]) == [short(c.verdict) for c in cands]
    for g in rec.groups:
        assert g.label in text and g.explanation in text
        for line in g.advice:
            assert line in text


def check_waterfall(at, sc: Scenario) -> list:
    steps = optimization_waterfall(sc)
    fig = chart(at, "rec_waterfall")
    wf = [t for t in fig["data"] if t["type"] == "waterfall"][0]
    assert wf["x"] == [f"{s.step}. {s.name}" for s in steps]
    assert list(itertools.accumulate(wf["y"])) == pytest.approx([s.device_total_expected_bytes / GiB for s in steps])
    speed = [t for t in fig["data"] if t.get("name", "").startswith("tokens/s")][0]
    assert speed["y"] == pytest.approx([s.tokens_per_s_per_gpu for s in steps])
    df = _table(at, "turns on")
    assert list(df["device total"]) == [fmt.gib(s.device_total_expected_bytes) for s in steps]
    assert list(df["verdict"]) == [short(s.verdict) + (" (under 10 % free)" if s.tight else "") for s in steps]
    assert "%" not in "".join(df["speed vs previous step"]).replace(" % ", "")  # times, never "3013%"
    return steps


def test_default_render_and_waterfall_button():
    at = open_app("recommend")
    sc = scenario(at)
    steps = check_waterfall(at, sc)
    first = next(s for s in steps if s.fits)
    assert f"The first step that fits is **{first.step}. {first.name}**" in all_text(at)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    check_groups(at, rec)
    assert rec.explanation in all_text(at)
    [b for b in at.button if b.key == "rec_apply_waterfall"][0].click()
    at.run()
    assert_clean(at)
    assert scenario(at) == first.scenario
    go(at, "calculator")
    assert scenario(at) == first.scenario
    est = estimate(first.scenario)
    assert [m.value for m in at.metric if m.label == "Peak allocated (GiB)"] == [fmt.gib(est.peak_allocated_bytes)]


def test_pick_a_ranked_configuration():
    sc = Scenario(model="llama-3.2-1b", hardware={"cluster": "8x-a100-80gb"}, training={"micro_batch_size": 4})
    at = open_app("recommend", state.scenario_to_params(sc))
    check_waterfall(at, sc)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    adapters = [c for c in rec.candidates if c.group == "adapters"]
    assert len(adapters) >= 2
    [s for s in at.selectbox if s.key == "rec_pick_adapters"][0].set_value(2)
    at.run()
    [b for b in at.button if b.key == "rec_apply_adapters"][0].click()
    at.run()
    assert_clean(at)
    assert scenario(at) == adapters[1].scenario


def test_method_change_toggle():
    sc = Scenario(model="llama-2-13b", hardware={"gpu": "rtx-4090"})
    at = open_app("recommend", state.scenario_to_params(sc))
    plain = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    assert plain.explanation in all_text(at)
    [t for t in at.toggle if t.key == "rec_allow"][0].set_value(True)
    at.run()
    assert_clean(at)
    changed = recommend(RecommendRequest(scenario=sc, max_candidates=10, allow_method_change=True))
    assert changed.explanation in all_text(at)
    check_groups(at, changed)


def test_70b_on_8x_a100_shows_both_groups_and_what_would_make_full_fine_tuning_practical():
    # 8 sequences per step: the offloaded optimizer step is shared by one sequence per GPU, far below the rate
    sc = Scenario(model="llama-2-70b", hardware={"cluster": "8x-a100-80gb"},
                  training={"precision": "bf16-mixed", "global_batch_tokens": 8 * 2048})
    at = open_app("recommend", state.scenario_to_params(sc))
    assert_clean(at)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    check_groups(at, rec)
    text = all_text(at)
    assert "More GPUs:" in text and "Adapters: LoRA / QLoRA train about" in text


def _whole_table(at, seq: int, batch: int):
    """A page run draws the cells found so far ("searching…" for the rest, with a count) and searches none;
    the table section's own timed reruns (a fragment, run by the browser) search the rest. Fill the table
    as those runs do, through ui.compute, and check that the page then shows all of it."""
    df = _table(at, "model")
    missing = int((df == "searching…").sum().sum())
    total = len(TABLE_MODELS) * len(TABLE_HARDWARE)
    if missing:
        assert f"{missing} of {total} cells are still being searched" in all_text(at)
    assert all(c is not None for row in compute.table_cells(seq, batch, budget_s=math.inf) for c in row)
    at.run()
    assert_clean(at)
    assert "still being searched" not in all_text(at)
    df = _table(at, "model")
    assert not (df == "searching…").any().any()
    return df


def test_model_by_hardware_table_and_its_widgets():
    at = open_app("recommend")
    # the table's batch is the sidebar's global batch (one source for every speed on the page)
    for seq, batch in ((2048, DEFAULT_GLOBAL_BATCH_TOKENS), (1024, 2**17)):
        if seq != 2048:
            [s for s in at.selectbox if s.key == "rec_seq"][0].set_value(seq)
            at.number_input(key="sc_gbt").set_value(batch)
            at.run()
            assert_clean(at)
        table = recommendation_table(seq_len=seq, global_batch_tokens=batch)
        df = _whole_table(at, seq, batch)
        assert len(df) == len(table.models)
        for row, cells in zip(df.to_dict("records"), table.cells, strict=True):
            values = [v for k, v in row.items() if k != "model"]
            for v, c in zip(values, cells, strict=True):
                if c.status == "nothing-fits":
                    assert v.startswith("does not fit")
                else:
                    assert c.label in v
                    assert f"{c.tokens_per_s_per_gpu:,.0f} tok/s/GPU" in v
                    assert fmt.gib(c.device_total_expected_bytes) in v
        assert f"{seq}-token sequences" in all_text(at)
        assert f"Every cell's speed is at {batch:,} tokens per step" in all_text(at)


def test_custom_memory_hardware_is_explained():
    sc = Scenario(model="gpt2", hardware={"memory_bytes": 16 * GiB})
    at = open_app("recommend", state.scenario_to_params(sc))
    assert any("needs a GPU preset" in i.value for i in at.info)


def test_fsdp2_scenario_is_recommended_without_an_error():
    """Issue 8: the recommender's copy of the scenario dropped `sharding`, and the waterfall set ZeRO-1 on an
    FSDP2 scenario (a ValidationError on the page)."""
    sc = Scenario(model="llama-3.2-1b", hardware={"cluster": "8x-a100-80gb"},
                  training={"precision": "bf16-mixed", "zero_stage": 3, "sharding": "fsdp2"})
    at = open_app("recommend", state.scenario_to_params(sc))
    assert_clean(at)
    assert not at.main.error, [e.value for e in at.main.error]
    check_waterfall(at, sc)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    check_groups(at, rec)
    assert all(c.scenario.training.sharding == "fsdp2" for c in rec.candidates)


def test_table_is_drawn_at_once_and_searched_afterwards():
    """Issue 12: a page run never waits for the table's 36 searches; it draws the cells found so far."""
    at = open_app("recommend")
    [s for s in at.selectbox if s.key == "rec_seq"][0].set_value(512)
    at.number_input(key="sc_gbt").set_value(2**17)
    at.run()
    assert_clean(at)
    df = _table(at, "model")
    total = len(TABLE_MODELS) * len(TABLE_HARDWARE)
    assert (df.drop(columns="model") == "searching…").all().all()
    assert f"{total} of {total} cells are still being searched" in all_text(at)
    cell = compute.table_cells(512, 2**17, budget_s=1e-3)[0][0]  # a short positive budget adds one cell
    assert cell is not None and cell.model == TABLE_MODELS[0] and cell.hardware == TABLE_HARDWARE[0]
    at.run()
    assert f"{total - 1} of {total} cells are still being searched" in all_text(at)

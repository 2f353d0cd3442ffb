"""Recommend page: the waterfall, the ranked configurations and the model x hardware table equal what
calc.recommend returns; the "use this" buttons make that configuration the scenario."""

from __future__ import annotations

import itertools

import pytest
from test_app_helpers import all_text, assert_clean, chart, go, open_app, scenario

from calc.engine import estimate
from calc.recommend import RecommendRequest, optimization_waterfall, recommend, recommendation_table
from calc.scenario import Scenario
from calc.units import GiB
from ui import fmt, state


def _table(at, first_col: str):
    for t in at.table:
        df = t.value
        if first_col in df.columns:
            return df
    raise KeyError(first_col)


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
    assert list(df["verdict"]) == ["fits" if s.fits else "does not fit" for s in steps]
    return steps


def test_default_render_and_waterfall_button():
    at = open_app("recommend")
    sc = scenario(at)
    steps = check_waterfall(at, sc)
    first = next(s for s in steps if s.fits)
    assert f"The first step that fits is **{first.step}. {first.name}**" in all_text(at)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=10))
    df = _table(at, "configuration")
    assert list(df["configuration"]) == [c.label for c in rec.candidates]
    assert list(df["tokens/s per GPU"]) == [f"{c.tokens_per_s_per_gpu:,.0f}" for c in rec.candidates]
    assert list(df["device total"]) == [fmt.gib(c.device_total_expected_bytes) for c in rec.candidates]
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
    assert len(rec.candidates) >= 2
    [s for s in at.selectbox if s.key == "rec_pick"][0].set_value(2)
    at.run()
    [b for b in at.button if b.key == "rec_apply"][0].click()
    at.run()
    assert_clean(at)
    assert scenario(at) == rec.candidates[1].scenario


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
    if changed.candidates:
        df = _table(at, "configuration")
        assert list(df["configuration"]) == [c.label for c in changed.candidates]


def test_model_by_hardware_table_and_its_widgets():
    at = open_app("recommend")
    for seq, batch in ((2048, 2**20), (1024, 2**18)):
        if seq != 2048:
            [s for s in at.selectbox if s.key == "rec_seq"][0].set_value(seq)
            [s for s in at.selectbox if s.key == "rec_batch"][0].set_value(batch)
            at.run()
            assert_clean(at)
        table = recommendation_table(seq_len=seq, global_batch_tokens=batch)
        df = _table(at, "model")
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


def test_custom_memory_hardware_is_explained():
    sc = Scenario(model="gpt2", hardware={"memory_bytes": 16 * GiB})
    at = open_app("recommend", state.scenario_to_params(sc))
    assert any("needs a GPU preset" in i.value for i in at.info)

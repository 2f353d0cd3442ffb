"""Compare page: the default pair (1x RTX 4090 vs 8x A100-80GB), every column widget, the verdicts, the
stacked bars and the difference table equal calc.memory.engine.estimate for each column's scenario."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.memory.engine import estimate
from calc.memory.verdict import headline
from calc.recommend import fastest_fitting
from calc.recommend.describe import method_words, stack_words
from tests.app.test_app_helpers import all_text, assert_clean, chart, open_app, scenario
from ui import fmt, state
from ui import plots as charts
from ui.compare_columns import column_name


def expected_scenario(base: Scenario, col: state.CompareColumn) -> Scenario:
    """What a column shows: its own settings, or calc.recommend's fastest configuration that fits."""
    sc = col.apply(base)
    if col.fastest:
        cand = fastest_fitting(sc)
        return cand.scenario if cand else sc
    return sc


def check_compare(at, cols: list[state.CompareColumn]) -> None:
    assert_clean(at)
    base = scenario(at)
    assert at.session_state[state.COMPARE] == cols
    shown = [expected_scenario(base, c) for c in cols]
    items = [(column_name(i, c), estimate(sc)) for i, (c, sc) in enumerate(zip(cols, shown, strict=True))]
    text = all_text(at)
    for (name, est), sc in zip(items, shown, strict=True):  # the method it trains, the engine's one verdict
        assert f"**{name}**, {method_words(sc)}: **{headline(est.verdict)}**" in text
    fig = chart(at, "cmp_chart")
    bars = {t["name"]: t for t in fig["data"] if t["type"] == "bar"}
    for key, label in charts.SHORT_LABELS.items():
        assert bars[label]["x"] == [n for n, _ in items]
        want = [dict(charts.segments(e))[key] for _, e in items]
        assert bars[label]["y"] == pytest.approx([v / GiB for v in want])
        assert bars[label]["customdata"] == [f"{v:,}" for v in want]
    caps = [t for t in fig["data"] if t.get("name") == "GPU memory"][0]
    assert caps["y"] == pytest.approx([e.gpu_memory_bytes / GiB for _, e in items])
    table = at.dataframe[0].value
    rows = {r["GiB per GPU"]: r for r in table.to_dict("records")}
    a, b = items[0][1], items[1][1]
    assert rows["Device total (expected)"]["A"] == pytest.approx(a.device_total_bytes.expected / GiB)
    assert rows["Device total (expected)"]["B − A"] == pytest.approx(
        (b.device_total_bytes.expected - a.device_total_bytes.expected) / GiB)
    assert rows["Peak allocated"]["B"] == pytest.approx(b.peak_allocated_bytes / GiB)
    assert rows["Headroom"]["B"] == pytest.approx(b.headroom_bytes / GiB)
    assert at.query_params[state.COMPARE_PARAM] == state.compare_to_param(cols)


def _w(at, key):
    for kind in ("selectbox", "number_input", "radio", "toggle"):
        for w in getattr(at, kind):
            if w.key == key:
                return w
    raise KeyError(key)


def test_default_pair():
    at = open_app("compare")
    assert at.title[0].value == "Compare scenarios"
    check_compare(at, list(state.DEFAULT_COMPARE))
    assert scenario(at) == state.DEFAULT_SCENARIO


def test_every_column_widget():
    at = open_app("compare")
    cols = list(state.DEFAULT_COMPARE)
    steps = [
        ("cmp_1_fastest", False, 1, {"fastest": False}),
        ("cmp_0_fastest", False, 0, {"fastest": False}),
        ("cmp_1_zero", 3, 1, {"zero_stage": 3}),
        ("cmp_1_off_opt", "cpu", 1, {"offload_optimizer": "cpu"}),
        ("cmp_1_off_par", "cpu", 1, {"offload_params": "cpu"}),
        ("cmp_0_cluster", "1x-a100-80gb", 0, {"cluster": "1x-a100-80gb"}),
        ("cmp_0_kind", "gpu", 0, {"cluster": None, "gpu": "a100-80gb", "num_gpus": 1}),
        ("cmp_0_gpu", "h100-sxm", 0, {"gpu": "h100-sxm"}),
        ("cmp_0_n", 2, 0, {"num_gpus": 2}),
        ("cmp_0_zero", 1, 0, {"zero_stage": 1}),
    ]
    for key, value, i, change in steps:
        _w(at, key).set_value(value)
        at.run()
        cols[i] = state.CompareColumn.model_validate({**cols[i].model_dump(), **change})
        check_compare(at, cols)
    _w(at, "cmp_count").set_value(4)
    at.run()
    from ui.compare_columns import EXTRA_COMPARE

    cols += list(EXTRA_COMPARE[:2])
    check_compare(at, cols)
    _w(at, "cmp_3_kind").set_value("gpu")
    at.run()
    cols[3] = state.CompareColumn(gpu="a100-80gb", num_gpus=1)
    check_compare(at, cols)
    _w(at, "cmp_count").set_value(2)
    at.run()
    check_compare(at, cols[:2])


def test_zero_and_offload_change_the_verdict():
    """The headline use: Llama-2-7B does not fit plain 8x A100; ZeRO-3 makes it fit; on one 4090
    even ZeRO-3 with everything offloaded to the CPU leaves activations that the engine weighs."""
    at = open_app("compare")
    base = scenario(at)
    b0 = estimate(state.CompareColumn(cluster="8x-a100-80gb").apply(base))
    _w(at, "cmp_0_fastest").set_value(False)
    _w(at, "cmp_1_fastest").set_value(False)
    at.run()
    _w(at, "cmp_1_zero").set_value(3)
    at.run()
    b3 = estimate(state.CompareColumn(cluster="8x-a100-80gb", zero_stage=3).apply(base))
    assert b3.device_total_bytes.expected < b0.device_total_bytes.expected
    text = all_text(at)
    assert f"**B: 8x A100 80GB, ZeRO-3**, full fine-tuning: **{headline(b3.verdict)}**" in text
    _w(at, "cmp_0_zero").set_value(3)
    _w(at, "cmp_0_off_opt").set_value("cpu")
    _w(at, "cmp_0_off_par").set_value("cpu")
    at.run()
    a = estimate(state.CompareColumn(cluster="1x-rtx-4090", zero_stage=3, offload_optimizer="cpu",
                                     offload_params="cpu").apply(base))
    assert fmt.gib(abs(a.headroom_bytes)) in all_text(at)


def test_invalid_column_is_a_message():
    at = open_app("compare")
    _w(at, "cmp_0_fastest").set_value(False)
    at.run()
    _w(at, "cmp_0_off_opt").set_value("cpu")  # ZeRO 0 cannot offload
    at.run()
    assert_clean(at)
    assert any("offload_optimizer needs zero_stage" in e.value for e in at.main.error)
    # the other column is still drawn, under its own letter (not "A")
    fig = chart(at, "cmp_chart")
    assert [t for t in fig["data"] if t["type"] == "bar"][0]["x"] == [column_name(1, state.DEFAULT_COMPARE[1])]
    table = at.dataframe[0].value
    assert "B" in table.columns and "A" not in table.columns
    b = estimate(expected_scenario(scenario(at), state.DEFAULT_COMPARE[1]))
    rows = {r["GiB per GPU"]: r for r in table.to_dict("records")}
    assert rows["Peak allocated"]["B"] == pytest.approx(b.peak_allocated_bytes / GiB)


def test_default_pair_shows_what_each_machine_can_do():
    """Issue 8: 1x RTX 4090 vs 8x A100 opens on each machine's fastest configuration that fits, so the
    A100s are not shown failing a 7B at ZeRO-0."""
    at = open_app("compare")
    base = scenario(at)
    a, b = (fastest_fitting(c.apply(base)) for c in state.DEFAULT_COMPARE)
    assert a is not None and b is not None and a.verdict.fits and b.verdict.fits
    # 8 A100s full-fine-tune a 7B; at the default global batch (262,144 tokens) the 4090's ZeRO-Infinity run
    # is no longer offload-bound, so it keeps full fine-tuning too
    assert not b.method_change
    text = all_text(at)
    assert not at.main.error and len(at.success) == 2  # both verdict boxes green
    # each headline names its method, each caption its stack in words and the batch its speed is at; one GPU is
    # never "DDP"
    for i, c in enumerate((a, b)):
        assert c.global_batch_tokens == base.training.global_batch_tokens
        assert f"**{column_name(i, state.DEFAULT_COMPARE[i])}**, full fine-tuning: **fits" in text
        assert (f"{stack_words(c.scenario)}; {c.tokens_per_s_per_gpu:,.0f} tokens/s per GPU at "
                f"{c.global_batch_tokens:,} tokens per step.") in text
    assert "one GPU" in stack_words(a.scenario) and "DDP" not in text
    assert "The columns train different methods" not in text  # both full fine-tuning: like for like


def test_link_with_columns():
    cols = [state.CompareColumn(gpu="rtx-4090", num_gpus=4, zero_stage=2),
            state.CompareColumn(cluster="8x-h100-sxm", zero_stage=3, offload_params="cpu"),
            state.CompareColumn(cluster="1x-a100-80gb", zero_stage=3, offload_optimizer="nvme")]
    sc = Scenario(model="llama-3.2-3b", hardware={"gpu": "rtx-4090"})
    at = open_app("compare", {**state.scenario_to_params(sc), state.COMPARE_PARAM: state.compare_to_param(cols)})
    assert scenario(at) == sc
    check_compare(at, cols)


def test_bad_compare_link_falls_back():
    at = open_app("compare", {"model": "gpt2", state.COMPARE_PARAM: "c.nope~z.9"})
    assert any("comparison is not valid" in w.value for w in at.warning)
    check_compare(at, list(state.DEFAULT_COMPARE))

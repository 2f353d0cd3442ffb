"""The engine's fast paths (memoized estimates, cached block profiles) give the same bytes as a cold
computation: on the whole committed data set and on random scenarios, including scenarios that differ
from a memoized one in a single field."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from test_properties import FAST, scenarios

import calc.presets as presets
from calc.engine import clear_memo, estimate
from calc.scenario import Scenario
from calc.speed import SpeedAssumptions, hardware_of, step_time
from calc.validate import load_all


def _cold(sc: Scenario, **kw) -> str:
    clear_memo()
    return estimate(sc, **kw).model_dump_json()


def _kw(rec) -> dict:
    return {"target": "cuda" if rec.device == "cuda" else "cpu",
            "sharding": "fsdp2" if rec.engine == "fsdp2" else "deepspeed"}


def test_data_set_memo_equals_cold():
    records = load_all()
    assert len(records) > 100
    cold = [_cold(r.scenario, **_kw(r)) for r in records]
    clear_memo()
    warm = [estimate(r.scenario, **_kw(r)) for r in records]  # fills the memo in data-set order
    again = [estimate(Scenario.model_validate_json(r.scenario.model_dump_json()), **_kw(r)) for r in records]
    assert [w.model_dump_json() for w in warm] == cold
    assert all(a is w for a, w in zip(again, warm, strict=True))  # an equal scenario is a memo hit


@FAST
@given(scenarios(), scenarios())
def test_random_scenarios_memo_equals_cold(a, b):
    sa, sb = Scenario.model_validate(a), Scenario.model_validate(b)
    want_a, want_b = _cold(sa), _cold(sb)
    clear_memo()
    assert estimate(sa).model_dump_json() == want_a
    assert estimate(sb).model_dump_json() == want_b
    assert estimate(sa).model_dump_json() == want_a
    assert estimate(sa, target="cpu").model_dump_json() == _cold(sa, target="cpu")


@FAST
@given(scenarios())
def test_one_field_apart_is_a_different_answer(data):
    sc = Scenario.model_validate(data)
    first = estimate(sc)
    data["training"]["micro_batch_size"] += 1
    bigger = Scenario.model_validate(data)
    assert estimate(bigger).model_dump_json() == _cold(bigger)
    assert estimate(bigger).peak_allocated_bytes > first.peak_allocated_bytes or sc.mode.value == "inference"


def test_reloaded_presets_are_not_served_from_the_memo():
    sc = Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"})
    before = estimate(sc)
    presets.gpu_presets.cache_clear()  # what a test or a reload does: new preset objects
    after = estimate(Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"}))
    assert after is not before and after.model_dump_json() == before.model_dump_json()


@FAST
@given(scenarios())
def test_step_time_without_formulas_has_the_same_numbers(data):
    sc = Scenario.model_validate(data)
    hw, a = hardware_of(sc), SpeedAssumptions()
    full = dataclasses.asdict(step_time(sc.spec, sc.training, hw, sc.mode, a))
    quick = dataclasses.asdict(step_time(sc.spec, sc.training, hw, sc.mode, a, explain=False))
    assert all(t["formula"] for t in full["terms"]) and not any(t["formula"] for t in quick["terms"])
    for t in full["terms"]:
        t["formula"] = ""
    assert quick == full

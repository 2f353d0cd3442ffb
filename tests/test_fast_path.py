"""The engine's fast paths give the same bytes as the long way: memoized estimates and cached block
profiles equal a cold computation, and the peak found by asking each run of identical layers only at its
ends (calc.engine.estimate) equals the largest of every listed moment (calc.engine.reference_estimate);
on the whole committed data set and on random scenarios, including scenarios that differ from a memoized
one in a single field."""

from __future__ import annotations

import dataclasses
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import FAST, scenarios

import calc.presets as presets
from calc.engine import clear_memo, estimate, reference_estimate
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


def _same_as_reference(fast, ref) -> None:
    """Peak, its event, phase and step, components, device total and verdict, and every timeline point the
    charts draw (the fast estimate lists its timeline only now, when it is read)."""
    assert fast.model_dump_json(exclude={"timeline"}) == ref.model_dump_json(exclude={"timeline"})
    assert fast.timeline.model_dump_json() == ref.timeline.model_dump_json()
    tl = fast.timeline
    assert (tl.events[tl.peak_index], tl.phases[tl.peak_index]) == (fast.peak_event, fast.peak_phase)
    assert tl.total(tl.peak_index) == fast.peak_allocated_bytes == max(map(tl.total, range(len(tl.events))))


def test_data_set_fast_peak_equals_every_moment():
    records = load_all()
    assert len(records) > 100
    for r in records:
        clear_memo()
        _same_as_reference(estimate(r.scenario, **_kw(r)), reference_estimate(r.scenario, **_kw(r)))


# beyond test_properties.scenarios: pipeline and tensor parallelism, LoRA, FSDP2, offload, kept outputs,
# fused cross-entropy, models whose layers differ (Gemma 3's and gpt-oss's sliding layers, DeepSeek's dense
# first layers) and checkpointing every k-th layer
@st.composite
def broad_scenarios(draw):
    data = draw(scenarios())
    t = data["training"]
    data["model"] = draw(st.sampled_from([data["model"], "gemma-3-1b", "gpt-oss-20b", "deepseek-v2-lite"]))
    t["checkpoint_every"] = draw(st.sampled_from([1, 2, 3]))
    t["keep_outputs"] = draw(st.booleans())
    t["cross_entropy"] = draw(st.sampled_from(["standard", "liger-fused"]))
    parallel = draw(st.sampled_from(["data", "pipeline", "tensor", "fsdp2", "offload"]))
    if parallel in ("pipeline", "tensor", "fsdp2"):
        data["hardware"]["num_gpus"] = 8
    if parallel == "pipeline":
        t["pipeline_parallel"], t["zero_stage"] = draw(st.sampled_from([2, 4])), draw(st.sampled_from([0, 1]))
    elif parallel == "tensor":
        t["tensor_parallel"], t["sequence_parallel"] = 2, draw(st.booleans())
    elif parallel == "fsdp2":
        t["sharding"], t["zero_stage"] = "fsdp2", draw(st.sampled_from([2, 3]))
    elif parallel == "offload":
        t["offload_optimizer"], t["zero_stage"] = "cpu", draw(st.sampled_from([1, 2, 3]))
    if data["model"] != "deepseek-v2-lite" and draw(st.booleans()):  # no LoRA on latent attention
        quantized = t["precision"] in ("amp-bf16", "amp-fp16", "bf16")
        t["lora"] = {"rank": draw(st.sampled_from([8, 64])), "targets": draw(st.sampled_from(["all-linear", "attention"])),
                     "base_weights": draw(st.sampled_from(["bf16", "nf4"] if quantized else ["bf16"]))}
    return data


@settings(FAST, max_examples=150)
@given(broad_scenarios(), st.sampled_from(["cuda", "cpu"]))
def test_random_scenarios_fast_peak_equals_every_moment(data, target):
    try:
        sc = Scenario.model_validate(data)
        ref = reference_estimate(sc, target=target)
    except ValueError:  # a combination the scenario or the engine rejects
        return
    clear_memo()
    _same_as_reference(estimate(sc, target=target), ref)


def test_a_pickled_estimate_keeps_its_timeline():
    """st.cache_data pickles estimates: the timeline is listed before the builder is left behind."""
    est = estimate(Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"}))
    again = pickle.loads(pickle.dumps(est))
    assert again.model_dump_json() == est.model_dump_json() and again == est

"""The recommender's shortcuts change nothing but its work. It skips the memory estimate of a configuration
whose weights and optimizer states alone exceed the usable memory (calc.recommend.state.states_floor), or do
with the activations the forward pass holds on top of them (calc.memory.engine.forward_activations_floor), does
not rank the members of a group whose most frugal member is such a configuration, and evaluates a
combination's micro-batch splits only when a rate bound from one split (calc.speed.split_rate_bound) says it
could be next. The floor is a lower bound of the engine's peak and the rate an upper bound of every split's
speed (on the committed data set and on random scenarios), and the search with them answers exactly as the
search without them: the same candidates, explanations, advice and notes, in both languages; only the
counts of memory estimates and speed evaluations go down."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calc.recommend.search as search
import calc.recommend.state as state
from calc.cli.recommend import format_recommendation
from calc.contract.scenario import Mode, Scenario
from calc.evidence.validate import load_all
from calc.memory.engine import estimate, forward_activations_floor
from calc.recommend import RecommendRequest, recommend
from calc.speed import SpeedAssumptions, compute_rate_bound, hardware_of, split_rate_bound, step_time
from tests.calc.memory.test_fast_path import broad_scenarios
from tests.calc.memory.test_properties import FAST


def _floor(sc: Scenario) -> int:
    """What the search compares with the usable memory once the states fit."""
    states = state.states_floor(sc)
    return states + forward_activations_floor(sc) if states else 0


def test_data_set_floor_is_below_the_peak():
    records = [r for r in load_all() if r.scenario.mode == Mode.train]
    assert len(records) > 100
    floors = [(state.states_floor(r.scenario), _floor(r.scenario), estimate(r.scenario).peak_allocated_bytes)
              for r in records]
    assert all(states <= floor <= peak for states, floor, peak in floors)
    assert sum(states > 0 for states, _, _ in floors) > 100  # the bound is taken, not 0 everywhere
    assert sum(floor > states > 0 for states, floor, _ in floors) > 100  # and the activations with them


@settings(FAST, max_examples=100)
@given(broad_scenarios())
def test_random_scenarios_floor_is_below_the_peak(data):
    try:
        sc = Scenario.model_validate(data)
        peak = estimate(sc).peak_allocated_bytes
    except ValueError:  # a combination the scenario or the engine rejects
        return
    assert state.states_floor(sc) <= _floor(sc) <= peak


@settings(FAST, max_examples=40)
@given(broad_scenarios(), st.integers(1, 16), st.integers(1, 8), st.sampled_from(["none", "full", "selective"]),
       st.sampled_from(["eager", "sdpa"]), st.sampled_from([128, 4096]))
def test_floor_depends_on_the_states_only(data, mb, ga, ckpt, attention, seq):
    """The search keeps one floor per Combo.states_key: the batch split, checkpointing, attention and sequence
    length do not change it."""
    try:
        sc = Scenario.model_validate(data)
        other = sc.with_training(micro_batch_size=mb, gradient_accumulation_steps=ga, activation_checkpointing=ckpt,
                                 attention=attention, seq_len=seq)
    except ValueError:
        return
    assert state.states_floor(other) == state.states_floor(sc)


@settings(FAST, max_examples=60)
@given(broad_scenarios(), st.sampled_from(["train", "inference"]), st.integers(0, 4))
def test_compute_rate_bounds_every_split(data, mode, shift):
    """The rate from one split bounds the speed of every split of the same sequences per replica."""
    try:
        sc = Scenario.model_validate({**data, "mode": mode})
        hw = hardware_of(sc)
    except ValueError:
        return
    t, a = sc.training, SpeedAssumptions()
    per = t.micro_batch_size * t.gradient_accumulation_steps << shift
    splits = [mb for mb in range(1, per + 1) if per % mb == 0][:12]
    gpus = sc.data_parallel * t.tensor_parallel * t.pipeline_parallel
    raws = [step_time(sc.spec, t.model_copy(update={"micro_batch_size": mb, "gradient_accumulation_steps": per // mb}),
                      hw, sc.mode, a, explain=False) for mb in splits]
    for raw in raws:
        assert all(compute_rate_bound(raw, gpus, a) >= r.tokens_per_s for r in raws)
        bound = split_rate_bound(raw, gpus, a, sc.mode == Mode.train)
        assert bound <= compute_rate_bound(raw, gpus, a)  # never looser
        assert all(bound >= r.tokens_per_s for r in raws)


def _answer(rec) -> tuple[dict, str]:
    data = rec.model_dump(mode="json")
    combinations = data.pop("stats")["combinations"]  # the rest counts the work the search did
    zh = format_recommendation(rec, "zh").splitlines()[:-1]  # the last line reports the estimates and seconds
    return {**data, "combinations": combinations}, "\n".join(zh)


def _both(req: RecommendRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(state, "states_floor", lambda sc: 0)  # every configuration estimated and ranked: as it was
        m.setattr(state, "forward_activations_floor", lambda sc: 0)
        m.setattr(search, "split_rate_bound", lambda *a: math.inf)  # every split's speed evaluated first
        full = recommend(req)
    floored = recommend(req)
    assert _answer(floored) == _answer(full)
    assert floored.stats.memory_estimates <= full.stats.memory_estimates
    assert floored.stats.speed_evaluations <= full.stats.speed_evaluations


def _req(model: str, hw: dict, **kw) -> RecommendRequest:
    training = kw.pop("training", {})
    return RecommendRequest(scenario=Scenario(model=model, hardware=hw, training=training), **kw)


CASES = {
    # the case: the floor skips about a quarter of the estimates
    "405b-64xh100": _req("llama-3.1-405b", {"cluster": "64x-h100-sxm"}),
    "70b-8xa100": _req("llama-3.1-70b", {"cluster": "8x-a100-80gb"}, training={"seq_len": 4096},
                       global_batch_tokens=2**20),
    # host RAM is the limit: the advice quotes the configuration that needs more RAM
    "405b-1xa100": _req("llama-3.1-405b", {"cluster": "1x-a100-80gb"}, global_batch_size=8, max_candidates=3),
    # nothing fits: the explanation quotes the smallest need tried, the floor decides which to estimate
    "70b-3gib": _req("llama-3.1-70b", {"gpu": "rtx-4090", "memory_bytes": 3 * 2**30}, global_batch_size=8),
    # ... where many of the configurations tried were skipped by the floor: only those that can be the smallest
    # are estimated
    "405b-4x4090": _req("llama-3.1-405b", {"cluster": "4x-rtx-4090"}, global_batch_size=8),
    "70b-3gib-widened": _req("llama-3.1-70b", {"gpu": "rtx-4090", "memory_bytes": 3 * 2**30}, global_batch_size=8,
                             allow_method_change=True),
    "32b-4x4090-lora": _req("qwen2.5-32b", {"cluster": "4x-rtx-4090"}, training={"lora": {"rank": 16}}),
    "8b-1x4090-fsdp2": _req("llama-3.1-8b", {"cluster": "1x-rtx-4090"}, training={"sharding": "fsdp2"}),
}


@pytest.mark.parametrize("name", CASES)
def test_floor_changes_nothing_but_the_estimates(name, monkeypatch):
    _both(CASES[name], monkeypatch)


MODELS = ["llama-3.2-1b", "llama-3.1-8b", "qwen2.5-14b", "mixtral-8x7b", "llama-3.1-70b", "gemma-2-9b"]
HARDWARE = ["1x-rtx-4090", "4x-rtx-4090", "1x-a100-80gb", "8x-a100-80gb", "8x-h100-sxm", "64x-a100-80gb"]


@settings(FAST, max_examples=8)
@given(st.sampled_from(MODELS), st.sampled_from(HARDWARE), st.sampled_from([512, 2048, 8192]),
       st.sampled_from([8, 64, 512]), st.integers(1, 5), st.booleans())
def test_random_requests_floor_changes_nothing(model, hw, seq, batch, top, widen):
    req = _req(model, {"cluster": hw}, training={"seq_len": seq}, global_batch_size=batch, max_candidates=top,
               allow_method_change=widen)
    with pytest.MonkeyPatch.context() as mp:
        _both(req, mp)


# one cell of each kind: full fine-tuning fits (small and large), only a method change fits, nothing fits
@pytest.mark.parametrize("model,hw,status", [
    ("llama-3.2-1b", "1x-rtx-4090", "fits"), ("llama-3.1-70b", "8x-h100-sxm", "fits"),
    ("llama-2-13b", "1x-rtx-4090", "method-change"), ("qwen2.5-32b", "1x-rtx-4090", "nothing-fits")])
def test_table_cell_searches_full_fine_tuning_first_and_answers_as_the_whole_search(model, hw, status):
    from calc.contract.scenario import TrainingConfig
    from calc.recommend.table import TABLE_GLOBAL_BATCH_TOKENS, TABLE_SEQ_LEN, hardware_config, table_cell

    cell = table_cell(model, hw)
    sc = Scenario(model=model, hardware=hardware_config(hw), training=TrainingConfig(seq_len=TABLE_SEQ_LEN))
    whole = recommend(RecommendRequest(scenario=sc, global_batch_tokens=TABLE_GLOBAL_BATCH_TOKENS, max_candidates=1,
                                       allow_method_change=True))
    own = [c for c in whole.candidates if c.group == "full" and not c.method_change]
    expected = own[0] if own else max(whole.candidates, key=lambda c: c.tokens_per_s_per_gpu, default=None)
    assert cell.status == status and cell.usable_bytes == whole.usable_bytes
    if expected is None:
        assert cell.scenario is None and cell.label == whole.explanation
    else:
        assert (cell.scenario, cell.tokens_per_s, cell.device_total_expected_bytes) == \
            (expected.scenario, expected.tokens_per_s, expected.device_total_expected_bytes)

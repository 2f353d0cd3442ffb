"""optimizer_in_backward (torchtune's optimizer_in_bwd): each parameter is stepped in its post-accumulate-grad
hook and its gradient freed there. The engine against the committed CPU records, its invariants, the refusals,
and the reference loop's hooks."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.scenario import Scenario
from calc.evidence.validate import load_all
from calc.memory.estimate import estimate, reference_estimate
from calc.memory.result import HOOK_STEP_EMBEDDING, HOOK_STEP_HEAD

DATA = Path(__file__).resolve().parents[3] / "data"
SMALL = {"model_type": "llama", "vocab_size": 8000, "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2}


def _sc(model=None, **training) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "training": {
        "micro_batch_size": 1, "seq_len": 64, "optimizer_in_backward": True, **training}})


def _records(device: str = "cpu"):
    return [r for r in load_all([DATA / f"measured_{device}.jsonl"]) if r.scenario.training.optimizer_in_backward]


def test_engine_matches_the_cpu_records():
    recs = _records()
    assert len(recs) >= 30
    assert {"llama", "gpt2", "qwen2"} <= {r.scenario.spec.family for r in recs}
    assert {"fp32", "bf16", "amp-bf16"} <= {r.scenario.training.precision.value for r in recs}
    _within_bounds(recs)


def test_engine_matches_the_presets_under_fake_tensors():
    """160M-47B presets, where the step of the lm_head's or a layer's fused experts' hook is the peak."""
    recs = _records("fake")
    assert len(recs) >= 4
    assert {"gpt_neox", "qwen3_moe", "mixtral"} <= {r.scenario.spec.family for r in recs}
    _within_bounds(recs, hooks=len(recs))


def _within_bounds(recs, hooks: int = 5) -> None:
    # at least `hooks` of them peak in a gradient hook's step, not in the logits' backward
    at_hooks = 0
    errors = []
    for r in recs:
        est = estimate(r.run_scenario(), "cpu")
        errors.append(abs(est.peak_allocated_bytes - r.peak_allocated_bytes) / r.peak_allocated_bytes * 100)
        at_hooks += "gradient hook" in est.peak_event
    assert at_hooks >= hooks
    assert statistics.median(errors) <= 0.5
    assert max(errors) <= 2.0


def test_records_step_nothing_after_backward():
    """The measured optimizer phase holds the weights and states only: every gradient was freed in its hook."""
    for r in _records():
        assert r.phase_peaks_bytes.optimizer < r.phase_peaks_bytes.backward
        est = estimate(r.run_scenario(), "cpu")
        assert "optimizer" not in est.timeline.phases and est.peak_step == 2


@settings(max_examples=25, deadline=None)
@given(precision=st.sampled_from(["fp32", "bf16", "amp-bf16"]),
       optimizer=st.sampled_from(["adamw", "adam", "sgd-momentum", "adafactor"]),
       impl=st.sampled_from(["foreach", "for-loop"]), tied=st.booleans(),
       ckpt=st.sampled_from(["none", "full", "selective"]), seq=st.sampled_from([16, 64, 256]))
def test_gradients_never_pile_up(precision, optimizer, impl, tied, ckpt, seq):
    """No moment holds more than one parameter's gradient, beside a tied lm_head's waiting for the embedding's;
    the forward is the plain loop's (the states exist from step 2 on in both)."""
    model = {**SMALL, "tie_word_embeddings": tied}
    sc = _sc(model, precision=precision, optimizer=optimizer, optimizer_impl=impl, activation_checkpointing=ckpt,
             seq_len=seq)
    est = estimate(sc, "cpu")
    grad_bytes = 4 if precision != "bf16" else 2
    vocab_grad = SMALL["vocab_size"] * SMALL["hidden_size"] * grad_bytes
    assert max(est.timeline.gradients) <= vocab_grad * (2 if tied else 1)
    plain = estimate(sc.with_training(optimizer_in_backward=False), "cpu").timeline
    tl = est.timeline
    fwd = [i for i, ph in enumerate(tl.phases) if ph == "forward"]
    assert [tl.total(i) for i in fwd] == [plain.total(i) for i in fwd]
    assert est.peak_allocated_bytes == reference_estimate(sc, "cpu").peak_allocated_bytes


def test_hook_temporaries_are_one_parameters():
    """foreach AdamW's hook allocates one state-dtype copy of its parameter (the sqrt of exp_avg_sq); fused none."""
    foreach, fused = (estimate(_sc(precision="fp32", optimizer_impl=impl), "cpu").timeline
                      for impl in ("foreach", "fused"))
    layer = "optimizer step in layer 1's gradient hook"
    largest_layer = SMALL["hidden_size"] * SMALL["intermediate_size"]
    vocab = SMALL["vocab_size"] * SMALL["hidden_size"]
    for event, elements in ((layer, largest_layer), (HOOK_STEP_HEAD, vocab), (HOOK_STEP_EMBEDDING, vocab)):
        i, j = foreach.events.index(event), fused.events.index(event)
        assert foreach.other[i] - fused.other[j] == 4 * elements
        assert foreach.gradients[i] == 4 * elements


def test_it_lowers_a_step_bound_peak():
    """Where the plain loop peaks in its step (all gradients + the foreach temporaries), stepping in the hooks
    saves at least the gradients but the largest."""
    sc = _sc(precision="fp32", activation_checkpointing="full", seq_len=16)
    plain = estimate(sc.with_training(optimizer_in_backward=False), "cpu")
    assert plain.peak_phase == "optimizer"
    saved = plain.peak_allocated_bytes - estimate(sc, "cpu").peak_allocated_bytes
    assert saved >= plain.breakdown.gradients - 4 * SMALL["vocab_size"] * SMALL["hidden_size"]


@pytest.mark.parametrize(("training", "hardware"), [
    ({"gradient_accumulation_steps": 2}, {}),
    ({"zero_stage": 2, "precision": "bf16"}, {"num_gpus": 2}),
    ({"sharding": "fsdp2", "zero_stage": 3}, {"num_gpus": 2}),
    ({}, {"num_gpus": 2}),
    ({"precision": "bf16-mixed"}, {}),
    ({"precision": "amp-fp16"}, {}),
])
def test_refused_where_it_cannot_run(training, hardware):
    with pytest.raises(ValueError, match="optimizer_in_backward"):
        Scenario.model_validate({"model": SMALL, "hardware": hardware,
                                 "training": {"optimizer_in_backward": True, **training}})


@pytest.mark.slow
def test_reference_loop_frees_every_gradient_in_its_hook():
    import torch

    from measure.workload import NullTracker, build_workload, prepare_optimizer, train_step

    sc = _sc({**SMALL, "vocab_size": 500, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
             precision="fp32", seq_len=16)
    w = build_workload(sc, torch.device("cpu"))
    prepare_optimizer(w, NullTracker())
    before = [p.detach().clone() for p in w.params]
    train_step(w, NullTracker())
    assert all(p.grad is None for p in w.params)
    assert len(w.optimizer.state) == len(w.params)  # each parameter's optimizer stepped once
    assert all(not torch.equal(a, p) for a, p in zip(before, w.params, strict=True))

"""calc.per_param: bytes per parameter read from the engine's own model states, agreeing with the
breakdown's components and with the ZeRO paper's formula."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

from calc import parallel, precision
from calc.engine import estimate
from calc.per_param import bytes_per_param, bytes_per_param_table
from calc.scenario import Scenario


def _sc(**training) -> Scenario:
    return Scenario(model="llama-2-7b", hardware={"gpu": "a100-80gb", "num_gpus": 8},
                    training={"precision": "bf16-mixed", **training})


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_held_is_the_zero_paper_model_states(stage):
    b = bytes_per_param(_sc(zero_stage=stage))
    want = parallel.zero_model_state_bytes(b.params, stage, 8) / b.params
    assert b.held == pytest.approx(want)
    assert b.master_weights == pytest.approx(4 / (8 if stage else 1))


def test_mixed_precision_step_uses_fp32_gradient_copies():
    b = bytes_per_param(_sc(zero_stage=0))
    assert (b.weights, b.gradients, b.master_weights, b.optimizer_states) == (2, 2, 4, 8)
    assert b.held == 16
    # at the step: 16-bit grads freed, fp32 copies (4 B) and foreach AdamW's sqrt list (4 B)
    assert (b.step_gradients, b.optimizer_temporaries, b.at_step) == (4, 4, 22)
    fused = bytes_per_param(_sc(zero_stage=0, optimizer_impl="fused"))
    assert fused.at_step == 18


def test_pure_bf16_with_8bit_adamw_is_leaner_than_pure_bf16_adamw():
    bf16, bf16_8bit = bytes_per_param_table(_sc(), [{"precision": "bf16"},
                                                     {"precision": "bf16", "optimizer": "adamw-8bit"}])
    assert bf16.held == 8
    assert bf16_8bit.held < bf16.held
    assert bf16_8bit.optimizer_states == pytest.approx(2 + 8 / 256, rel=1e-3)


@pytest.mark.parametrize("training", [{"zero_stage": 0}, {"zero_stage": 2}, {"zero_stage": 3},
                                      {"precision": "fp32"}, {"precision": "bf16"}])
def test_components_quote_the_same_bytes_per_param(training):
    """The breakdown's components at an optimizer-step peak divide to the table's at-step figures."""
    sc = Scenario(model="llama-2-7b", hardware={"gpu": "h200", "num_gpus": 8},
                  training={"precision": "bf16-mixed", "seq_len": 128, "activation_checkpointing": "full",
                            **training})
    est = estimate(sc)
    assert est.peak_phase == "optimizer"
    b = bytes_per_param(sc)
    comp = {c.key: c for c in est.components}
    n = b.params
    assert comp["weights"].bytes / n == pytest.approx(b.weights)
    assert comp["gradients"].bytes / n == pytest.approx(b.step_gradients)
    assert comp["optimizer_states"].bytes / n == pytest.approx(b.optimizer_states)
    assert comp.get("master_weights", comp["weights"]).bytes / n == pytest.approx(b.master_weights or b.weights)
    if sc.training.precision.is_mixed:
        assert comp["gradients"].label == "fp32 gradient copies for the optimizer step"
        assert comp["gradients"].source == precision.MIXED_STEP_GRADIENTS_WHY
        assert f"x {precision.FP32} B" in comp["gradients"].formula


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(precision=hs.sampled_from(["fp32", "amp-bf16", "bf16-mixed", "fp16-mixed", "bf16"]),
       optimizer=hs.sampled_from(["adamw", "adam", "sgd-momentum", "adafactor", "adamw-8bit"]),
       impl=hs.sampled_from(["foreach", "fused", "for-loop"]), stage=hs.integers(0, 3), gpus=hs.sampled_from([1, 2, 8]),
       model=hs.sampled_from(["gpt2", "qwen2.5-0.5b", "llama-3.2-1b"]))
def test_optimizer_step_components_are_bytes_per_param_times_params(precision, optimizer, impl, stage, gpus, model):
    """Wherever the peak is the optimizer step, the breakdown's model-state components are exactly the
    bytes-per-parameter figures times the parameters (one story, whatever the combination)."""
    try:
        sc = Scenario(model=model, hardware={"gpu": "h200", "num_gpus": gpus},
                      training={"precision": precision, "optimizer": optimizer, "optimizer_impl": impl,
                                "zero_stage": stage, "seq_len": 64, "activation_checkpointing": "full"})
    except ValueError:
        assume(False)
    est = estimate(sc)
    assume(est.peak_phase == "optimizer")
    b = bytes_per_param(sc)
    comp = {c.key: c.bytes for c in est.components}
    n = b.params
    assert comp.get("weights", 0) == pytest.approx(b.weights * n)
    assert comp.get("gradients", 0) == pytest.approx(b.step_gradients * n)
    assert comp.get("optimizer_states", 0) == pytest.approx(b.optimizer_states * n)
    assert comp.get("master_weights", 0) == pytest.approx(b.master_weights * n)

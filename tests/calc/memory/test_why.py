"""calc.memory.why: the reasons for the figures a reader does not expect, said only where they hold; and the
plain words of calc.recommend.describe and the waterfall's steps that save nothing."""

from __future__ import annotations

from calc.contract.scenario import Scenario
from calc.memory.engine import estimate
from calc.memory.why import mixed_above_amp, offload_above_16_bytes
from calc.recommend import optimization_waterfall
from calc.recommend.describe import method_words, stack_words

RTX = {"gpu": "rtx-4090"}


def test_mixed_above_amp_only_when_amp_needs_less():
    mixed = Scenario(model="llama-2-7b", hardware=RTX, training={"precision": "bf16-mixed"})
    amp = Scenario(model="llama-2-7b", hardware=RTX, training={"precision": "amp-bf16"})
    assert estimate(mixed).device_total_bytes.expected > estimate(amp).device_total_bytes.expected
    why = mixed_above_amp(mixed, estimate(mixed))
    assert str(why).startswith("bf16-mixed needs more than amp-bf16 here (24 against 20 B per parameter")
    assert "fp32 master weights" in str(why) and "DeepSpeed casts each 16-bit gradient" in str(why)
    assert mixed_above_amp(amp, estimate(amp)) is None


def test_offload_above_16_bytes_per_parameter():
    off = Scenario(model="llama-2-7b", hardware=RTX,
                   training={"precision": "bf16-mixed", "zero_stage": 2, "offload_optimizer": "cpu"})
    est = estimate(off)
    assert est.cpu_ram_bytes > 16 * est.model.trainable_params
    assert "B per parameter of host RAM" in str(offload_above_16_bytes(off, est))
    plain = Scenario(model="llama-2-7b", hardware=RTX)
    assert offload_above_16_bytes(plain, estimate(plain)) is None


def test_describe_names_the_method_and_the_stack_in_words():
    one = Scenario(model="llama-2-7b", hardware=RTX,
                   training={"lora": {"base_weights": "nf4"}, "precision": "amp-bf16"})
    assert method_words(one) == "QLoRA r16 nf4" and "DDP" not in stack_words(one)
    assert str(stack_words(one)).startswith("PyTorch AMP bf16, one GPU, ")
    eight = Scenario(model="llama-2-7b", hardware={"cluster": "8x-a100-80gb"},
                     training={"precision": "bf16-mixed", "zero_stage": 3})
    assert method_words(eight) == "full fine-tuning"
    assert "DeepSpeed ZeRO-3 over 8 GPUs" in stack_words(eight)


def test_a_waterfall_step_that_saves_nothing_says_why():
    steps = optimization_waterfall(Scenario(model="llama-2-7b", hardware=RTX))
    same = [s for s in steps[1:] if s.why_same]
    assert same and all(s.why_more is None for s in same)
    for s in same:
        before = steps[s.step - 1].device_total_expected_bytes
        assert abs(s.device_total_expected_bytes - before) < 2**30 // 200
    back_up = next(s for s in steps if s.method_change)
    assert back_up.why_more is not None and "offload off again" in back_up.why_more

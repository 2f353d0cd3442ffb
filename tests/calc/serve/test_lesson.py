"""calc.serve.lesson: the serving lesson's figures, against the KV cache arithmetic written out by hand."""

from __future__ import annotations

import pytest

from calc.contract.scenario import HardwareConfig, Scenario
from calc.contract.units import GiB
from calc.serve import budget
from calc.serve.lesson import (
    PAIR_UTILIZATIONS,
    TYPICAL_REQUESTS,
    formula_bytes_per_token,
    serving_lesson,
    serving_variant,
)
from calc.serve.plan import plan

LLAMA2_ON_4090 = Scenario(model="llama-2-7b", hardware=HardwareConfig(gpu="rtx-4090", num_gpus=1))


def test_the_default_scenario_by_hand():
    lesson = serving_lesson(LLAMA2_ON_4090)
    # Llama 2 7B: 32 layers, 32 KV heads (no GQA), head_dim 128, bf16: 2 x 32 x 32 x 128 x 2 bytes = 512 KiB
    assert lesson.formula_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert lesson.plan.kv_bytes_per_token == lesson.formula_bytes_per_token  # the engine's spec classes agree
    # 16 requests of its 4,096-token context: 16 x 4,096 x 512 KiB = 32 GiB, against 12.55 GiB of weights
    assert lesson.context == 4096
    assert lesson.typical_kv_bytes == TYPICAL_REQUESTS * 4096 * 512 * 1024 == 32 * GiB
    assert lesson.typical_kv_bytes > 2 * lesson.plan.weights_bytes
    assert lesson.plan.starts and lesson.plan.gpu_memory_utilization == 0.9


def test_features_come_from_named_presets_where_the_model_lacks_them():
    f = serving_lesson(LLAMA2_ON_4090).features
    assert f["gqa"].preset == "llama-3.1-8b" and f["gqa"].with_bytes == 2 * 32 * 8 * 128 * 2  # 8 KV heads of 32
    assert f["gqa"].without_bytes == 2 * 32 * 32 * 128 * 2
    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) x 2 bytes; MHA form: 128 heads x (192 K + 128 V)
    assert f["mla"].preset == "deepseek-v3" and f["mla"].with_bytes == 61 * (512 + 64) * 2 == 70272
    assert f["mla"].without_bytes == 61 * 128 * (192 + 128) * 2
    assert f["fp8"].preset is None and f["fp8"].with_bytes * 2 == f["fp8"].without_bytes == 512 * 1024
    # Gemma 3 12B at 32,768 tokens: 8 of 48 layers are global; without windows all 48 hold every token
    s = f["sliding"]
    per_layer_token = 2 * 8 * 256 * 2
    assert s.preset == "gemma-3-12b" and s.without_bytes == 48 * 32768 * per_layer_token
    # the 40 sliding layers keep the window (1,023) plus one chunk (2,048 on an RTX 4090), in 16-token blocks + 1
    sliding_blocks = -(-(1023 + 2048) // 16) + 1
    assert s.with_bytes == (8 * 32768 + 40 * sliding_blocks * 16) * per_layer_token


def test_the_model_itself_when_it_has_the_feature():
    sc = Scenario(model="deepseek-v3", hardware=HardwareConfig(gpu="h200", num_gpus=8))
    f = serving_lesson(sc).features
    assert f["mla"].preset is None and f["gqa"].preset == "llama-3.1-8b"
    g = serving_lesson(Scenario(model="gemma-3-12b", hardware=HardwareConfig(gpu="h100-sxm"))).features
    assert g["sliding"].preset is None and g["gqa"].preset is None


def test_two_servers_on_one_gpu():
    lesson = serving_lesson(LLAMA2_ON_4090)
    total, context = lesson.gpu_memory_bytes, budget.cuda_context_bytes()
    both_default, both_half = lesson.pairs
    assert (both_default.utilization, both_half.utilization) == PAIR_UTILIZATIONS
    # the first holds 0.9 x total plus its CUDA graphs and context; the second's own context comes out too
    first = plan(serving_variant(LLAMA2_ON_4090), 0.9)
    assert both_default.free_bytes == total - int(total * 0.9) - first.cuda_graph_bytes - 2 * context
    assert both_default.requested_bytes == int(total * 0.9) and both_default.reason == "free_memory"
    # at 0.45 each the free-memory check passes, but 0.45 x 24 GiB cannot hold the 12.55 GiB of weights
    assert both_half.free_bytes >= both_half.requested_bytes and both_half.reason == "no_kv_memory"
    assert both_half.largest_second == pytest.approx(both_half.free_bytes / total, abs=0.001)
    assert both_half.largest_second < 1 - 0.45


def test_an_already_serving_scenario_is_kept():
    sc = Scenario.model_validate({"model": "llama-3.1-8b", "mode": "serve", "hardware": {"gpu": "h100-sxm"},
                                  "serving": {"kv_cache_dtype": "fp8", "max_model_len": 4096}})
    assert serving_variant(sc) is sc
    assert formula_bytes_per_token(sc) == 2 * 32 * 8 * 128 * 1


def test_a_lora_training_scenario_is_served_as_its_base_model():
    sc = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {"gpu": "rtx-4090"},
                                  "training": {"lora": {"rank": 16, "base_weights": "nf4"}, "seq_len": 1024}})
    lesson = serving_lesson(sc)
    assert lesson.formula_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert lesson.plan.weights_bytes == serving_lesson(Scenario(model="llama-3.1-8b", hardware={"gpu": "rtx-4090"})
                                                       ).plan.weights_bytes


def test_no_gpu_is_a_value_error():
    with pytest.raises(ValueError):
        serving_lesson(Scenario(model="llama-2-7b"))

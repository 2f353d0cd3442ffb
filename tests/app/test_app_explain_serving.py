"""Explain page, the serving lesson: the KV cache's bytes per token for the sidebar's model, what GQA, MLA, sliding
windows and fp8 do to it (the model's own figures, or a named preset's), and gpu_memory_utilization as a share of
the total; every number the planner's (calc.serve.plan), checked against the arithmetic written out here."""

from __future__ import annotations

from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.serve.plan import plan
from tests.app.test_app_helpers import all_text, chart, open_app, traces
from ui import fmt, state

SECTION = "Serving: the KV cache"


def lesson_text(at) -> str:
    text = all_text(at)
    start = text.index("Training memory is model states")
    return text[start:text.index("Every quantitative claim")]


def test_the_default_scenario_served_with_vllm_defaults():
    at = open_app("explain")  # Llama 2 7B on one RTX 4090
    assert SECTION in [h.value for h in at.header]
    text = lesson_text(at)
    # 2 x 32 layers x 32 KV heads x 128 x 2 bytes
    assert "2 (K and V) x 32 layers x 32 KV heads x 128 (head_dim) x 2 bytes = **524,288 bytes** (512 KiB)" in text
    # 16 requests of Llama 2's 4,096-token context: 16 x 4,096 x 512 KiB = 32 GiB
    assert "16 x 4,096 x 512 KiB = **32.00 GiB** of KV cache" in text
    served = plan(Scenario.model_validate({"model": "llama-2-7b", "mode": "serve",
                                           "hardware": {"gpu": "rtx-4090", "num_gpus": 1}}))
    assert f"the {fmt.gib(served.weights_bytes)} of weights" in text
    assert f"**{fmt.gib(served.kv_cache_bytes)}**, {served.kv_cache_tokens:,} tokens" in text
    # the presets stand in for what Llama 2 lacks: GQA (Llama 3.1 8B), MLA (DeepSeek-V3), windows (Gemma 3)
    assert "Llama 3.1 8B preset (this model lacks it): 128 KiB per token, against 512 KiB" in text
    assert f"{61 * 576 * 2 / 1024:,.2f} KiB per token" in text
    assert "Gemma 3 12B (text) preset" in text
    assert "for this model (Llama 2 7B), 256 KiB per token instead of 512 KiB" in text
    # a share of the TOTAL: 0.9 x the card's total, and the second of two servers at 0.9 is refused
    assert f"0.9 x {fmt.gib(served.gpu_memory_bytes)} = **{fmt.gib(served.requested_bytes)}**" in text
    assert "both at 0.9:" in text and "it refuses to start: the free memory" in text
    assert "both at 0.45:" in text and "no KV cache is left" in text
    bars = traces(chart(at, "explain_serve_kv"))
    assert list(bars["with it"]["x"]) == [256.0, 128.0, 61 * 576 * 2 / 1024]
    budget = traces(chart(at, "explain_serve_budget"))
    assert abs(budget["KV cache"]["x"][0] - served.kv_cache_bytes / GiB) < 1e-9


def test_the_models_own_feature():
    sc = Scenario(model="deepseek-v2-lite", hardware={"gpu": "h100-sxm"})
    text = lesson_text(open_app("explain", state.scenario_to_params(sc)))
    # MLA: 27 layers x (512 + 64) x 2 bytes, this model's own latent
    assert f"27 layers x (512 kv_lora_rank + 64 qk_rope_head_dim) x 2 bytes = **{27 * 576 * 2:,} bytes**" in text
    assert "For this model (DeepSeek-V2-Lite (16B MoE)): 30.38 KiB per token" in text


def test_a_model_that_does_not_start_on_this_gpu():
    sc = Scenario(model="llama-3.1-70b", hardware={"gpu": "rtx-4090"})
    text = lesson_text(open_app("explain", state.scenario_to_params(sc)))
    served = plan(Scenario.model_validate({"model": "llama-3.1-70b", "mode": "serve", "hardware": {"gpu": "rtx-4090"}}))
    assert served.reason == "no_kv_memory"
    assert f"On this GPU vLLM does not start: the weights ({fmt.gib(served.weights_bytes)})" in text
    # Llama 3.1 70B has GQA of its own: 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 320 KiB
    assert "For this model (Llama 3.1 70B): 320 KiB per token, against 2,560 KiB" in text


def test_the_lesson_in_chinese():
    at = open_app("explain", {"lang": "zh"})
    assert "推理服务：KV 缓存" in [h.value for h in at.header]
    text = all_text(at)
    assert "2（K 和 V）x 32 层 x 32 个 KV 头 x 128（head_dim）x 2 字节 = 每个 token **524,288 字节**（512 KiB）" in text
    assert "预设 Llama 3.1 8B（本模型没有这一特性）" in text
    assert "**gpu_memory_utilization 是 GPU 总显存的比例，而不是空闲显存的比例。**" in text

"""How the served weights are stored: the hub checkpoint's format by default (gpt-oss's MXFP4 experts), padded
as vLLM's MoE backend for the GPU pads them, and a launch line that loads what the plan assumed."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario
from calc.serve import budget
from calc.serve.plan import launch_command, plan


def _serve(model: str, gpu: str, weights: str | None = None) -> Scenario:
    inference = {} if weights is None else {"weights": weights}
    return Scenario.model_validate({"model": model, "mode": "serve", "inference": inference, "hardware": {"gpu": gpu},
                                    "serving": {"max_model_len": 8192}})


def test_gpt_oss_is_served_as_its_checkpoint_stores_it():
    default, bf16 = _serve("gpt-oss-20b", "a100-80gb"), _serve("gpt-oss-20b", "a100-80gb", "bf16")
    assert budget.served_weights(default) == "mxfp4"
    assert budget.weights_bytes(default, 1) < 0.4 * budget.weights_bytes(bf16, 1)
    assert plan(default).max_concurrency > plan(bf16).max_concurrency
    assert budget.served_weights(_serve("llama-3.1-8b", "a100-80gb")) == "bf16"


def test_marlin_pads_the_experts_where_hopper_does_not():
    """gpt-oss-20b: hidden 2,880 and intermediate 2,880. Marlin (A100, L40S) pads them to 3,072 and 2,944; the
    Triton kernels of an H100 keep 2,880 (a multiple of 64)."""
    a100, h100 = _serve("gpt-oss-20b", "a100-80gb"), _serve("gpt-oss-20b", "h100-sxm")
    assert budget.mxfp4_padding_bytes(h100, 1) == 0
    per_expert = (2 * 2944 * (3072 // 2 + 3072 // 32) + 3072 * (2944 // 2 + 2944 // 32) + 2 * (2 * 2944 + 3072)
                  - 2 * 2880 * (2880 // 2 + 2880 // 32) - 2880 * (2880 // 2 + 2880 // 32) - 2 * (2 * 2880 + 2880))
    assert budget.mxfp4_padding_bytes(a100, 1) == per_expert * 32 * 24
    assert budget.weights_bytes(a100, 1) - budget.weights_bytes(h100, 1) == per_expert * 32 * 24


@pytest.mark.parametrize(("model", "weights", "expected"), [
    ("gpt-oss-20b", None, "vllm serve openai/gpt-oss-20b --tensor-parallel-size 1"),
    ("gpt-oss-20b", "bf16", "vllm serve <bf16 checkpoint of openai/gpt-oss-20b>"),
    ("llama-3.1-8b", "fp8", "--quantization fp8"),
    ("llama-3.1-8b", "nf4", "--quantization bitsandbytes"),
    ("llama-3.1-8b", "fp16", "--dtype float16"),
    ("llama-3.1-8b", "awq-int4", "vllm serve <awq-int4 checkpoint of meta-llama/Llama-3.1-8B>"),
])
def test_the_launch_line_loads_the_weights_the_plan_assumed(model, weights, expected):
    line = launch_command(_serve(model, "a100-80gb", weights))
    assert expected in line
    if weights in (None, "bf16"):
        assert "--quantization" not in line and "--dtype" not in line

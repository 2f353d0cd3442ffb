"""What the GPU records (data/measured_cuda.jsonl, one H200) taught the CUDA side of the engine: the cuBLAS
workspaces stay allocated through the optimizer step, fp32 SDPA with grouped heads runs the math kernel, and a
static-cache generation is compiled by transformers (said, not counted)."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario
from calc.evidence.validate import DATA_DIR, compare, load_all
from calc.memory.engine import estimate

TINY_GQA = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}


def _scenario(model: dict = TINY_GQA, **training) -> Scenario:
    mode = training.pop("mode", "train")
    inference = training.pop("inference", {})
    return Scenario.model_validate({"model": model, "mode": mode, "hardware": {"gpu": "h200"},
                                    "training": {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32",
                                                 **training}, "inference": inference})


def _workspace(est) -> int:
    return sum(c.bytes for c in est.components if c.key == "cublas_workspace")


def test_cublas_workspaces_are_counted_at_an_optimizer_step_peak():
    """AdamW foreach at a short sequence peaks in the step (params, grads, states and the sqrt list): the two
    workspaces are still there, as every GPU record's optimizer phase shows."""
    est = estimate(_scenario(seq_len=16, micro_batch_size=1), target="cuda")
    assert est.peak_phase == "optimizer"
    assert _workspace(est) == 2 * 32 * 2**20  # Hopper: two handles of 32 MiB
    assert sum(c.bytes for c in est.components) == est.peak_allocated_bytes


def test_fp32_grouped_heads_sdpa_keeps_the_math_kernels_probabilities_on_cuda():
    """Flash and cuDNN take 16-bit inputs and memory-efficient attention refuses enable_gqa, so fp32 with grouped
    heads saves the fp32 B x H x S x S probabilities per layer on CUDA; at 16 bits the fused kernel keeps none."""
    probs = 4 * 2 * 4 * 256 * 256 * 4  # layers x batch x heads x seq x seq, fp32

    def quadratic(model: dict, precision: str = "fp32") -> int:
        """Activations at 256 tokens less twice those at 128: what grows with the square of the sequence."""
        def acts(seq: int) -> int:
            return estimate(_scenario(model, seq_len=seq, precision=precision), target="cuda").breakdown.activations
        return acts(256) - 2 * acts(128)

    # at the backward peak the last layers' probabilities are already freed: at least half of them are alive
    assert quadratic(TINY_GQA) >= probs // 2
    assert quadratic({**TINY_GQA, "num_key_value_heads": 4}) == 0  # full heads: memory-efficient attention
    assert quadratic(TINY_GQA, "bf16") == 0  # 16 bits: flash attention takes grouped heads


@pytest.fixture(scope="module")
def gpu_cases():
    return {c.name: c for c in (compare(r, i) for i, r in enumerate(load_all([DATA_DIR / "measured_cuda.jsonl"])))}


@pytest.mark.parametrize("name", ["llama-fp32-adamw-fused", "llama-fp32-sgd", "llama-fp32-none-seq512",
                                  "llama-keep-fp32-seq512", "qwen2-tied-fp32-adamw-foreach",
                                  "llama-fp32-b1-seq32", "mixtral-fp32-adamw-foreach"])
def test_gpu_records_of_these_mechanisms_are_matched(gpu_cases, name):
    assert abs(gpu_cases[name].error_pct) <= 0.5, gpu_cases[name]


def test_static_cache_generation_on_a_gpu_says_it_is_compiled():
    gen = {"new_tokens": 32, "kv_cache": "static"}
    note = "transformers compiles the decoding step"
    assert any(note in n for n in estimate(_scenario(mode="inference", inference=gen), target="cuda").notes)
    assert not any(note in n for n in estimate(_scenario(mode="inference", inference=gen), target="cpu").notes)
    dynamic = {"new_tokens": 32, "kv_cache": "dynamic"}
    assert not any(note in n for n in estimate(_scenario(mode="inference", inference=dynamic), target="cuda").notes)

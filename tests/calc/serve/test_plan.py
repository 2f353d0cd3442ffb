"""calc.serve.plan: the budget, the verdict and the inverse questions, against vLLM's arithmetic by hand."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.cli.main import main
from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.serve import budget
from calc.serve.plan import plan, utilization_for


def serve(model: str = "llama-3.1-8b", gpu: str = "h100-sxm", gpus: int = 1, **serving) -> Scenario:
    return Scenario.model_validate({"model": model, "mode": "serve", "hardware": {"gpu": gpu, "num_gpus": gpus},
                                    "serving": serving})


def test_llama_8b_on_an_h100_by_hand():
    p = plan(serve(max_model_len=32768))
    # 8 KV heads x 128 x 2 (K, V) x 2 bytes x 32 layers
    assert p.kv_bytes_per_token == 8 * 128 * 2 * 2 * 32 == 131072
    # Worker.determine_available_memory: int(total x 0.9 - non-KV memory)
    non_kv = p.weights_bytes + p.activation_peak_bytes + p.non_torch_bytes
    assert p.kv_cache_bytes == int(p.gpu_memory_bytes * 0.9 - non_kv)
    page = 2 * 16 * 8 * 128 * 2
    assert p.num_blocks == p.kv_cache_bytes // page // 32  # get_num_blocks
    assert p.kv_cache_tokens == p.num_blocks * 16
    assert p.max_concurrency == p.num_blocks / (32768 // 16)
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (8192, 1024)  # H100-class defaults of `vllm serve`
    assert abs(p.weights_bytes / GiB - 14.99) < 0.01  # "Model loading took 14.99 GiB" in vLLM's logs
    assert p.starts


def test_fp8_kv_halves_the_bytes_and_tensor_parallel_splits_or_replicates_kv_heads():
    assert plan(serve(kv_cache_dtype="fp8")).kv_bytes_per_token == 65536
    # Llama 3.1 70B has 8 KV heads: TP 8 leaves one per GPU, TP 16 replicates it (max(1, 8 // 16))
    tp8 = plan(serve("llama-3.1-70b", "h100-sxm", 8, tensor_parallel=8)).kv_bytes_per_token
    tp16 = plan(serve("llama-3.1-70b", "h100-sxm", 16, tensor_parallel=16)).kv_bytes_per_token
    assert tp8 == tp16 == 1 * 128 * 2 * 2 * 80


def test_mla_caches_one_latent_per_layer_whatever_the_tensor_parallelism():
    p = plan(serve("deepseek-v3", "h200", 8, tensor_parallel=8))
    assert p.kv_bytes_per_token == (512 + 64) * 2 * 61


def test_hybrid_sliding_window_models_need_far_less_per_request():
    # gpt-oss: 12 sliding (128 tokens) + 12 full layers in 2 groups of 12
    p = plan(serve("gpt-oss-20b", max_model_len=131072))
    assert p.kv_groups == 2
    full_blocks = 131072 // 16
    sliding_blocks = -(-(128 - 1 + p.max_num_batched_tokens) // 16) + 1
    assert p.max_concurrency == p.num_blocks / (full_blocks + sliding_blocks)
    # Gemma 3 27B: 52 sliding + 10 full layers -> 6 + 1 groups of 10 (8 padding layers)
    g = plan(serve("gemma-3-27b"))
    assert g.kv_groups == 7 and g.kv_pool_bytes_per_token == 70 * g.kv_bytes_per_token // 62


def test_does_not_start_when_the_weights_exceed_the_budget_and_says_by_how_much():
    p = plan(serve("llama-3.1-70b", "a100-80gb"))
    assert not p.starts and p.reason == "no_kv_memory"
    # vLLM needs available_kv_cache_memory > 0: the shortfall is what brings it to one byte
    assert p.kv_cache_bytes < 0 and p.shortfall_bytes == -p.kv_cache_bytes + 1
    assert p.weights_bytes > 130 * GiB  # 70.6 B parameters in bf16 on one GPU


def test_the_largest_max_model_len_starts_and_one_more_token_does_not():
    p = plan(serve(gpu="rtx-4090"))
    assert p.reason == "max_model_len" and 0 < p.largest_max_model_len < 131072
    assert plan(serve(gpu="rtx-4090", max_model_len=p.largest_max_model_len)).starts
    assert not plan(serve(gpu="rtx-4090", max_model_len=p.largest_max_model_len + 16)).starts


def test_utilization_for_a_concurrency_is_the_smallest_step_that_holds_it():
    sc = serve(max_model_len=32768)
    u = utilization_for(sc, 10)
    assert u is not None
    assert plan(sc, u).max_concurrency >= 10 > plan(sc, round(u - 0.001, 3)).max_concurrency
    assert utilization_for(sc, 1000) is None  # 1,000 requests of 32k tokens: 4 TB of KV cache


@settings(max_examples=25, deadline=None)
@given(util=st.floats(0.3, 0.98), length=st.integers(1, 131072), fp8=st.booleans())
def test_whole_blocks_fit_in_the_kv_budget(util, length, fp8):
    p = plan(serve(max_model_len=length, kv_cache_dtype="fp8" if fp8 else "auto"), util)
    assert p.kv_cache_tokens * p.kv_pool_bytes_per_token <= max(p.kv_cache_bytes, 0)
    assert p.starts == (p.reason == "starts")


def test_sglang_pool_is_mem_fraction_static_minus_the_weights():
    p = plan(serve(engine="sglang", mem_fraction_static=0.85, page_size=1))
    free = p.gpu_memory_bytes - budget.cuda_context_bytes() - p.weights_bytes - p.non_torch_bytes
    assert p.kv_cache_bytes == int(free - p.gpu_memory_bytes * (1 - 0.85))
    assert p.kv_cache_tokens == p.kv_cache_bytes // 131072


@pytest.mark.parametrize(("data", "message"), [
    ({"model": "llama-3.1-8b", "serving": {}}, "the serving block applies to mode serve"),
    ({"model": "llama-3.1-8b", "mode": "serve", "serving": {"tensor_parallel": 3}, "hardware": {"num_gpus": 3}},
     "must divide the 32 attention heads"),
    ({"model": "llama-3.1-8b", "mode": "serve", "serving": {"max_model_len": 10**6}}, "exceeds the model's"),
    ({"model": "llama-3.1-8b", "mode": "serve", "serving": {"mem_fraction_static": 0.8,
                                                            "gpu_memory_utilization": 0.8}}, "not both"),
    ({"model": "llama-3.1-8b", "mode": "serve", "serving": {"kv_cache_dtype": "fp4"}}, "kv_cache_dtype"),
    ({"model": "llama-3.1-8b", "mode": "serve"}, "names no GPU"),
])
def test_bad_serving_input_is_one_line(tmp_path, capsys, data, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert main(["serve", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_prints_the_plan_and_the_utilization_for_a_concurrency(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "qwen2.5-7b", "mode": "serve", "hardware": {"gpu": "l40s"},
                                "inference": {"weights": "awq-int4"},
                                "serving": {"max_model_len": 16384, "kv_cache_dtype": "fp8"}}))
    assert main(["serve", str(path), "--format", "json", "--concurrency", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["starts"] and out["kv_bytes_per_token"] == 4 * 128 * 2 * 1 * 28
    assert out["gpu_memory_utilization_needed"] <= 0.9
    assert main(["serve", str(path)]) == 0
    assert "requests of 16,384 tokens at once" in capsys.readouterr().out


def test_launch_command_carries_the_planned_flags():
    from calc.serve.plan import launch_command

    line = launch_command(serve(gpus=2, tensor_parallel=2, max_model_len=8192, kv_cache_dtype="fp8",
                                cuda_graphs=False))
    assert line == ("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --gpu-memory-utilization 0.9 "
                    "--max-model-len 8192 --kv-cache-dtype fp8 --enforce-eager")
    sglang = launch_command(serve(engine="sglang", mem_fraction_static=0.85))
    assert "--mem-fraction-static 0.85" in sglang and "--page-size" not in sglang  # SGLang's page size 1


def test_concurrency_falls_with_the_context_length():
    from calc.serve.plan import concurrency_curve

    curve = concurrency_curve(serve(), [4096, 16384, 65536])
    assert [n for n, _ in curve] == [4096, 16384, 65536]
    assert curve[0][1] > curve[1][1] > curve[2][1] > 0
    assert curve[1][1] == plan(serve(max_model_len=16384)).max_concurrency


def test_kv_projections_are_replicated_when_gpus_outnumber_kv_heads():
    from calc.serve.budget import replicated_kv_bytes, weights_bytes

    sc = serve("llama-3.1-70b", "h100-sxm", 16, tensor_parallel=16)
    # 8 KV heads over 16 GPUs: each holds one whole head (128 wide) of K and V, not half of one
    assert replicated_kv_bytes(sc, 16) == 2 * (128 - 64) * 8192 * 80 * 2
    assert replicated_kv_bytes(serve("llama-3.1-70b", "h100-sxm", 8, tensor_parallel=8), 8) == 0
    assert weights_bytes(sc, 16) > weights_bytes(serve("llama-3.1-70b", "h100-sxm", 8, tensor_parallel=8), 8) / 2


def test_the_readme_example_runs(capsys):
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "docs" / "serve_scenario.json"
    assert main(["serve", str(example), "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert "launch: vllm serve meta-llama/Llama-3.1-8B" in out and "need gpu_memory_utilization >=" in out


def test_the_step_estimate_refuses_a_serving_scenario_in_one_line(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama-3.1-8b", "mode": "serve", "hardware": {"gpu": "h100-sxm"}}))
    assert main(["estimate", str(path)]) == 2
    assert "python -m calc serve" in capsys.readouterr().err

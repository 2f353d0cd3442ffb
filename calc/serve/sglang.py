"""SGLang's budget and token pool, where they differ from vLLM's.

SGLang's ModelRunner.profile_max_num_token (python/sglang/srt/model_executor/model_runner.py, the 0.4 line) sizes the
pool from the free memory after the weights are loaded: rest_memory = free - total x (1 - mem_fraction_static), and
max_total_num_tokens = rest_memory // cell_size, rounded down to whole pages (init_memory_pool), with cell_size =
KV heads per GPU x head_dim x layers x 2 x dtype bytes (MLA: (kv_lora_rank + qk_rope_head_dim) x layers x dtype
bytes). Activations and CUDA graphs live in the 1 - mem_fraction_static outside. Every layer keeps every token:
SGLang's separate sliding-window pool (--swa-full-tokens-ratio) is not modelled here.
"""

from __future__ import annotations

from calc.contract.scenario import Scenario
from calc.contract.serving import ServingConfig
from calc.serve import budget
from calc.serve.parts import ServePlan, gpu_memory, kv_dtype_bytes, non_kv_bytes, verdict


def cell_bytes(sc: Scenario, serving: ServingConfig, dtype_bytes: int) -> int:
    """profile_max_num_token's cell_size: one token's KV cache over all layers on one GPU."""
    spec = sc.spec
    if spec.mla:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.num_layers * dtype_bytes
    heads = max(1, spec.num_kv_heads // serving.tensor_parallel)
    return heads * spec.head_dim * spec.num_layers * 2 * dtype_bytes


def plan(sc: Scenario, serving: ServingConfig, utilization: float | None) -> ServePlan:
    util = serving.gpu_memory_utilization if utilization is None else utilization
    total, name = gpu_memory(sc)
    model_len = serving.max_model_len or sc.spec.max_position_embeddings
    tokens, seqs = budget.batch_limits(serving, total, name, model_len)
    weights, activations, non_torch = non_kv_bytes(sc, serving, tokens, seqs)
    context = budget.cuda_context_bytes()
    free_after_load = total - context - weights - non_torch
    rest = int(free_after_load - total * (1 - util))
    cell = cell_bytes(sc, serving, kv_dtype_bytes(sc, serving))
    page = serving.block_size
    pool_tokens = max(0, rest // cell) // page * page
    needed = model_len * cell
    graphs = budget.cuda_graph_bytes(serving)
    outside = int(total * (1 - util)) - context
    reason, shortfall = verdict(outside, activations + graphs, rest, needed)
    return ServePlan(
        engine="sglang", gpu_memory_bytes=total, gpu_memory_utilization=util, requested_bytes=int(total * util),
        weights_bytes=weights, activation_peak_bytes=activations, non_torch_bytes=non_torch, cuda_graph_bytes=graphs,
        kv_cache_bytes=max(rest, 0), kv_bytes_per_token=cell, kv_pool_bytes_per_token=cell,
        kv_cache_tokens=pool_tokens, num_blocks=pool_tokens // page, kv_groups=1, max_model_len=model_len,
        max_num_batched_tokens=tokens, max_num_seqs=seqs, max_concurrency=pool_tokens / model_len,
        starts=reason == "starts", reason=reason, shortfall_bytes=shortfall,
        largest_max_model_len=min(max(rest, 0) // cell, sc.spec.max_position_embeddings),
        headroom_bytes=outside - activations - graphs)


__all__ = ["cell_bytes", "plan"]

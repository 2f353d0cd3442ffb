"""The serving plan of one scenario (mode serve) on one GPU of a replica, and the inverse questions.

plan(sc) follows vLLM 0.13.0's start-up: the budget (calc.serve.budget), then the KV cache blocks
(calc.serve.kv_cache). SGLang scenarios take SGLang's budget (calc.serve.sglang).
"""

from __future__ import annotations

from calc.contract.errors import UserError
from calc.contract.scenario import Scenario
from calc.serve import budget, kv_cache, sglang
from calc.serve.budget import checkpoint_weights, served_weights
from calc.serve.parts import (  # noqa: F401 - the plan's face: pages and the CLI import these from here
    Reason,
    ServePlan,
    gpu_memory,
    kv_dtype_bytes,
    layer_specs,
    non_kv_bytes,
    serving_of,
    verdict,
)

UTILIZATION_STEP = 0.001  # the answer to "which gpu_memory_utilization" is rounded up to this


def plan(sc: Scenario, utilization: float | None = None) -> ServePlan:
    """The plan of `sc` (utilization: another gpu_memory_utilization, for the inverse question)."""
    serving = serving_of(sc)
    if serving.engine == "sglang":
        return sglang.plan(sc, serving, utilization)
    util = serving.gpu_memory_utilization if utilization is None else utilization
    total, name = gpu_memory(sc)
    model_len = serving.max_model_len or sc.spec.max_position_embeddings
    tokens, seqs = budget.batch_limits(serving, total, name, model_len)
    weights, activations, non_torch = non_kv_bytes(sc, serving, tokens, seqs)
    available = budget.available_kv_bytes(total, util, weights + activations + non_torch)
    layers = layer_specs(sc, serving)
    groups = kv_cache.kv_groups(layers)
    bs = serving.block_size
    blocks = kv_cache.num_blocks(groups, bs, available)
    needed = kv_cache.needed_bytes(layers, bs, model_len, tokens)
    graphs, context = budget.cuda_graph_bytes(serving), budget.cuda_context_bytes()
    requested = budget.requested_bytes(total, util)
    reason, shortfall = verdict(total - context, requested, available, needed)
    return ServePlan(
        engine="vllm", gpu_memory_bytes=total, gpu_memory_utilization=util, requested_bytes=int(requested),
        weights_bytes=weights, activation_peak_bytes=activations, non_torch_bytes=non_torch, cuda_graph_bytes=graphs,
        kv_cache_bytes=available, kv_bytes_per_token=kv_cache.spec_bytes_per_token(layers),
        kv_pool_bytes_per_token=kv_cache.pool_bytes_per_token(groups),
        kv_cache_tokens=kv_cache.kv_cache_tokens(groups, bs, blocks), num_blocks=blocks, kv_groups=len(groups.specs),
        max_model_len=model_len, max_num_batched_tokens=tokens, max_num_seqs=seqs,
        max_concurrency=kv_cache.max_concurrency(groups, bs, blocks, model_len, tokens),
        starts=reason == "starts", reason=reason, shortfall_bytes=shortfall,
        largest_max_model_len=kv_cache.longest_model_len(layers, bs, available, sc.spec.max_position_embeddings,
                                                         tokens),
        headroom_bytes=int(total - requested) - context - graphs)


def utilization_for(sc: Scenario, concurrency: float) -> float | None:
    """The smallest gpu_memory_utilization (in steps of 0.001) at which `concurrency` requests of max_model_len fit
    and the engine starts; None when no step does. Enough KV cache is monotone in the utilization, so a binary
    search finds the smallest step; the free-memory check at start-up then decides whether that step starts."""
    steps = round(1 / UTILIZATION_STEP)

    def enough(step: int) -> bool:
        p = plan(sc, step * UTILIZATION_STEP)
        return p.reason in ("starts", "free_memory") and p.max_concurrency >= concurrency

    if not enough(steps):
        return None
    lo, hi = 1, steps
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return round(lo * UTILIZATION_STEP, 3) if plan(sc, lo * UTILIZATION_STEP).starts else None


def hub_id(sc: Scenario) -> str:
    """The Hugging Face repository a preset's config comes from (its source URL), else a placeholder."""
    from calc.contract.presets import model_presets

    if isinstance(sc.model, str):
        source = model_presets()[sc.model].source
        parts = source.removeprefix("https://huggingface.co/").split("/")
        if source.startswith("https://huggingface.co/") and len(parts) >= 2:
            return f"{parts[0]}/{parts[1]}"
    return "<model>"


# Weights an engine quantizes itself as it loads a 16-bit checkpoint (vLLM: Fp8Config with a 16-bit checkpoint,
# the in-flight bitsandbytes 4-bit loader; SGLang accepts the same names); the other formats need a checkpoint
# saved in them
ONLINE_QUANTIZATION = {"fp8": "fp8", "nf4": "bitsandbytes"}
DTYPE_FLAGS = {"fp16": "float16", "fp32": "float32"}


def weights_flags(sc: Scenario, model: str) -> tuple[str, list[str]]:
    """(the model to load, its flags) for the weights the plan assumed: the checkpoint as it is, a 16-bit one
    quantized as it loads, or a placeholder for a checkpoint saved in that format."""
    stored, weights = checkpoint_weights(sc.model), served_weights(sc)
    if weights == stored or isinstance(sc.model, dict):  # a pasted config: its own quantization_config
        return model, []
    if stored == "bf16" and weights in DTYPE_FLAGS:
        return model, [f"--dtype {DTYPE_FLAGS[weights]}"]
    if stored == "bf16" and weights in ONLINE_QUANTIZATION:
        return model, [f"--quantization {ONLINE_QUANTIZATION[weights]}"]
    return f"<{weights} checkpoint of {model}>", []


def launch_command(sc: Scenario) -> str:
    """The command that starts the planned server: vLLM's `vllm serve` flags, or SGLang's launch_server; the
    defaults the plan assumed are spelled out where they matter (tensor parallelism, memory share, context,
    weights the engine quantizes as it loads)."""
    s = serving_of(sc)
    model, weight_flags = weights_flags(sc, hub_id(sc))
    length = s.max_model_len or sc.spec.max_position_embeddings
    if s.engine == "sglang":
        parts = [f"python -m sglang.launch_server --model-path {model} --tp {s.tensor_parallel}",
                 f"--mem-fraction-static {s.gpu_memory_utilization:g} --context-length {length}"]
        parts += weight_flags
        parts += ["--kv-cache-dtype fp8_e4m3"] if s.kv_cache_dtype == "fp8" else []
        parts += [f"--page-size {s.block_size}"] if s.block_size != 1 else []
        parts += [] if s.cuda_graphs else ["--disable-cuda-graph"]
        return " ".join(parts)
    parts = [f"vllm serve {model} --tensor-parallel-size {s.tensor_parallel}",
             f"--gpu-memory-utilization {s.gpu_memory_utilization:g} --max-model-len {length}"]
    parts += weight_flags
    parts += ["--kv-cache-dtype fp8"] if s.kv_cache_dtype == "fp8" else []
    parts += [f"--block-size {s.block_size}"] if s.block_size != 16 else []
    parts += [] if s.cuda_graphs else ["--enforce-eager"]
    parts += [f"--max-num-batched-tokens {s.max_num_batched_tokens}"] if s.max_num_batched_tokens else []
    parts += [f"--max-num-seqs {s.max_num_seqs}"] if s.max_num_seqs else []
    return " ".join(parts)


MAX_CURVE_POINTS = 64  # a chart's worth of context lengths


def concurrency_curve(sc: Scenario, lengths: list[int]) -> list[tuple[int, float]]:
    """(max_model_len, requests of that length at once) for each length (at most MAX_CURVE_POINTS, each within
    the model's positions): the plan with only max_model_len changed."""
    if len(lengths) > MAX_CURVE_POINTS:
        raise UserError(f"at most {MAX_CURVE_POINTS} context lengths, got {len(lengths)}")
    serving = serving_of(sc)
    out = []
    for n in lengths:
        varied = sc.variant(serving=serving.model_copy(update={"max_model_len": n}))
        out.append((n, plan(varied).max_concurrency))
    return out

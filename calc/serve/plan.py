"""The serving plan of one scenario (mode serve) on one GPU of a replica, and the inverse questions.

plan(sc) follows vLLM 0.13.0's start-up: the budget (calc.serve.budget), then the KV cache blocks
(calc.serve.kv_cache). SGLang scenarios take SGLang's budget (calc.serve.sglang).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.errors import UserError
from calc.contract.presets import gpu_presets
from calc.contract.scenario import Mode, Scenario
from calc.contract.serving import ServingConfig
from calc.serve import budget, kv_cache, sglang

Reason = Literal["starts", "free_memory", "no_kv_memory", "max_model_len"]
UTILIZATION_STEP = 0.001  # the answer to "which gpu_memory_utilization" is rounded up to this


class ServePlan(BaseModel):
    """Per GPU of one replica: where its memory goes and what the KV cache holds. Bytes, tokens, requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    gpu_memory_bytes: int = Field(description="the GPU's total memory (nvidia-smi's total)")
    gpu_memory_utilization: float
    requested_bytes: int = Field(description="gpu_memory_utilization x total: the engine's budget")
    weights_bytes: int
    activation_peak_bytes: int = Field(description="the profile run's peak above the weights, at "
                                       "max_num_batched_tokens (modelled from source)")
    non_torch_bytes: int = Field(description="NCCL, cuBLAS and backend buffers (a cited estimate)")
    cuda_graph_bytes: int = Field(description="captured after the KV cache, outside the budget (a cited estimate)")
    kv_cache_bytes: int = Field(description="the budget left for the KV cache (vLLM's 'Available KV cache memory')")
    kv_bytes_per_token: int = Field(description="KV cache of one token on this GPU, summed over the layers' specs")
    kv_pool_bytes_per_token: int = Field(description="KV cache memory per token of kv_cache_tokens (hybrid models "
                                         "count their padding layers)")
    kv_cache_tokens: int = Field(description="whole blocks x block size (vLLM's 'GPU KV cache size')")
    num_blocks: int
    kv_groups: int = Field(description="KV cache groups (1 unless the model mixes layer types)")
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_concurrency: float = Field(description="requests of max_model_len tokens at once (vLLM's 'Maximum "
                                   "concurrency')")
    starts: bool
    reason: Reason
    shortfall_bytes: int = Field(description="how much memory is missing when it does not start (0 when it does)")
    largest_max_model_len: int = Field(description="the longest max_model_len that starts with one request")
    headroom_bytes: int = Field(description="total - budget - CUDA context - CUDA graphs: what is left outside")


def serving_of(sc: Scenario) -> ServingConfig:
    if sc.mode != Mode.serve:
        raise UserError("this command plans a serving scenario: set \"mode\": \"serve\"")
    return sc.serving or ServingConfig()


def gpu_memory(sc: Scenario) -> tuple[int, str]:
    """(total bytes, name) of the scenario's GPU: its preset, or hardware.memory_bytes."""
    hw = sc.resolved_hardware()
    if hw.gpu is not None:
        gpu = gpu_presets()[hw.gpu]
        return gpu.memory_bytes, gpu.name
    if hw.memory_bytes is not None:
        return hw.memory_bytes, "custom"
    raise UserError("the scenario names no GPU (hardware.gpu, hardware.cluster or hardware.memory_bytes)")


def kv_dtype_bytes(sc: Scenario, serving: ServingConfig) -> int:
    """--kv-cache-dtype: auto is the model dtype (16-bit, or 4 bytes for weights served in fp32), fp8 one byte."""
    if serving.kv_cache_dtype == "fp8":
        return kv_cache.FP8_BYTES
    return 4 if sc.inference.weights == "fp32" else budget.MODEL_DTYPE_BYTES


def layer_specs(sc: Scenario, serving: ServingConfig) -> list[kv_cache.LayerSpec]:
    return kv_cache.layer_specs(sc.spec, serving.tensor_parallel, kv_dtype_bytes(sc, serving),
                                budget.config_sliding_window(sc))


def non_kv_bytes(sc: Scenario, serving: ServingConfig, tokens: int, seqs: int) -> tuple[int, int, int]:
    """(weights, activation peak, non-torch) on one GPU."""
    tp = serving.tensor_parallel
    return (budget.weights_bytes(sc, tp), budget.activation_terms(sc, tp, tokens, seqs).total,
            budget.non_torch_bytes(tp))


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


def verdict(free_bytes: int, requested: float, available: int, needed: int) -> tuple[Reason, int]:
    """vLLM's start-up refusals, in the order it meets them: init_device (free memory below requested_memory),
    _check_enough_kv_cache_memory (no memory left for blocks; not enough for one request of max_model_len).
    Returns the reason and the missing bytes."""
    if free_bytes < requested:
        return "free_memory", int(requested - free_bytes) + 1
    if available <= 0:
        return "no_kv_memory", -available + 1
    if needed > available:
        return "max_model_len", needed - available
    return "starts", 0


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


def launch_command(sc: Scenario) -> str:
    """The command that starts the planned server: vLLM's `vllm serve` flags, or SGLang's launch_server; the
    defaults the plan assumed are spelled out where they matter (tensor parallelism, memory share, context)."""
    s, model = serving_of(sc), hub_id(sc)
    length = s.max_model_len or sc.spec.max_position_embeddings
    if s.engine == "sglang":
        parts = [f"python -m sglang.launch_server --model-path {model} --tp {s.tensor_parallel}",
                 f"--mem-fraction-static {s.gpu_memory_utilization:g} --context-length {length}"]
        parts += ["--kv-cache-dtype fp8_e4m3"] if s.kv_cache_dtype == "fp8" else []
        parts += [f"--page-size {s.block_size}"] if s.block_size != 1 else []
        parts += [] if s.cuda_graphs else ["--disable-cuda-graph"]
        return " ".join(parts)
    parts = [f"vllm serve {model} --tensor-parallel-size {s.tensor_parallel}",
             f"--gpu-memory-utilization {s.gpu_memory_utilization:g} --max-model-len {length}"]
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

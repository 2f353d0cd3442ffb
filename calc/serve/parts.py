"""What both engines' plans share: the plan's fields, the scenario's GPU, the KV cache dtype, the memory outside
the KV cache on one GPU and the start-up verdict (calc.serve.plan for vLLM, calc.serve.sglang for SGLang)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.errors import UserError
from calc.contract.presets import gpu_presets
from calc.contract.scenario import Mode, Scenario
from calc.contract.serving import ServingConfig
from calc.serve import budget, kv_cache

Reason = Literal["starts", "free_memory", "no_kv_memory", "max_model_len"]


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

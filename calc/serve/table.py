"""The serving view of the model x hardware table: what vLLM gives for a model preset on a GPU or cluster preset,
with its defaults (gpu_memory_utilization 0.9, KV cache in the model's dtype, CUDA graphs), for requests of a stated
context. Tensor parallelism is the smallest power of two within a node at which the server starts; replicas fill
the rest of the GPUs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.hardware import preset_hardware
from calc.contract.presets import model_presets, resolve_hardware
from calc.contract.scenario import HardwareConfig, Scenario
from calc.contract.serving import DEFAULT_GPU_MEMORY_UTILIZATION
from calc.serve.parts import Reason
from calc.serve.plan import plan

SERVING_CONTEXT = 8192  # tokens per request the serving view states (the model's own limit when shorter)
SERVING_CONTEXTS = (2048, 4096, 8192, 32768, 131072)  # the lengths the view offers: chat, RAG, long documents


class ServingCell(BaseModel):
    """One model x hardware cell of the serving view: per replica of `tensor_parallel` GPUs, and for all of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    hardware: str
    context: int = Field(description="tokens per request: the table's context, or the model's limit when shorter")
    tensor_parallel: int = Field(description="GPUs per replica: the smallest that starts, else the largest tried")
    replicas: int
    starts: bool
    reason: Reason
    weights_bytes: int = Field(description="weights on one GPU of a replica")
    budget_bytes: int = Field(description="gpu_memory_utilization x the GPU's total memory")
    max_concurrency: float = Field(description="requests of `context` tokens at once per replica")
    kv_cache_tokens: int = Field(description="KV cache tokens per replica")
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION

    @property
    def weights_exceed_budget(self) -> bool:
        """The weights alone are more than the budget (else the profile run's peak took what was left)."""
        return self.weights_bytes > self.budget_bytes

    @property
    def total_concurrency(self) -> float:
        """Requests of `context` tokens at once over every replica."""
        return self.max_concurrency * self.replicas


def hardware_of(hardware: str) -> HardwareConfig:
    """A cluster or GPU preset id as the scenario's hardware (calc.contract.hardware.preset_hardware)."""
    return preset_hardware(hardware)


def tensor_parallel_choices(model: str, hardware: HardwareConfig) -> list[int]:
    """Powers of two up to the GPUs of one node that vLLM accepts for this model (calc.contract.serving
    check_serving_fits: they divide the attention heads and the GPUs, and divide the KV heads or are a multiple)."""
    spec, hw = model_presets()[model].spec, resolve_hardware(hardware)
    node = hw.gpus_per_node or hw.num_gpus
    out, tp = [], 1
    while tp <= node:
        kv_ok = spec.mla or spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0
        if spec.num_heads % tp == 0 and hw.num_gpus % tp == 0 and kv_ok:
            out.append(tp)
        tp *= 2
    return out


def serving_cell(model: str, hardware: str, context: int = SERVING_CONTEXT) -> ServingCell:
    """vLLM with its defaults for `model` on `hardware`: the plan at the smallest tensor parallelism that starts
    with requests of `context` tokens (capped at the model's positions); where none does, the plan at the largest."""
    hw = hardware_of(hardware)
    n = min(context, model_presets()[model].spec.max_position_embeddings)
    tried = None
    for tp in tensor_parallel_choices(model, hw):
        sc = Scenario.model_validate({"model": model, "mode": "serve", "hardware": hw,
                                      "serving": {"tensor_parallel": tp, "max_model_len": n}})
        tried = (tp, plan(sc))
        if tried[1].starts:
            break
    if tried is None:
        raise ValueError(f"{model} cannot be split over the GPUs of {hardware}")
    tp, p = tried
    return ServingCell(model=model, hardware=hardware, context=n, tensor_parallel=tp,
                       replicas=resolve_hardware(hw).num_gpus // tp, starts=p.starts, reason=p.reason,
                       weights_bytes=p.weights_bytes, budget_bytes=p.requested_bytes,
                       max_concurrency=p.max_concurrency if p.starts else 0.0,
                       kv_cache_tokens=p.kv_cache_tokens if p.starts else 0,
                       gpu_memory_utilization=p.gpu_memory_utilization)


def serving_table(models: list[str] | tuple[str, ...], hardware: list[str] | tuple[str, ...],
                  context: int = SERVING_CONTEXT) -> list[list[ServingCell]]:
    """Rows = models, columns = hardware."""
    return [[serving_cell(m, h, context) for h in hardware] for m in models]

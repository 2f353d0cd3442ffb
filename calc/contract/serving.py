"""The serving block of a scenario (mode serve): which engine serves the model and the flags it is started with.

vLLM's own flags are the fields (`vllm serve --gpu-memory-utilization --max-model-len --kv-cache-dtype --block-size
--tensor-parallel-size --enforce-eager --max-num-batched-tokens --max-num-seqs`); SGLang's `mem_fraction_static` and
`page_size` are accepted as the same fields (SGLang's server_args.py names them so), and the planner reads them with
SGLang's meaning. Defaults are vLLM 0.13.0's (calc.serve cites where each comes from).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.limits import MAX_POSITIONS

Engine = Literal["vllm", "sglang"]
KvCacheDtype = Literal["auto", "fp8"]
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vllm/config/cache.py CacheConfig.gpu_memory_utilization
DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py: block_size None becomes 16 on CUDA (platforms/cuda.py)
MAX_BATCHED_TOKENS = 2**22  # 4 M tokens in one forward: 30x vLLM's largest default (16,384 for LLM())
MAX_NUM_SEQS = 2**16  # 64x vLLM's largest default (1,024 on H100-class GPUs)
SGLANG_PAGE_SIZE = 1  # SGLang's server_args.py: page_size defaults to one token per page
SGLANG_ALIASES = {"mem_fraction_static": "gpu_memory_utilization", "page_size": "block_size"}


class ServingConfig(BaseModel):
    """How a serving engine is started on the scenario's GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Engine = Field("vllm", description="vllm or sglang")
    gpu_memory_utilization: float = Field(
        DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1,
        description="the share of the GPU's total memory the engine may use (SGLang: mem_fraction_static)")
    max_model_len: int | None = Field(None, ge=1, le=MAX_POSITIONS,
                                      description="longest request in tokens; null = the model's context length")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="auto = the model's dtype; fp8 = one byte per value")
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=1024,
                            description="tokens per KV cache block (SGLang: page_size)")
    tensor_parallel: int = Field(1, ge=1, le=1024, description="GPUs one replica spans (--tensor-parallel-size)")
    cuda_graphs: bool = Field(True, description="false = --enforce-eager (no CUDA graphs)")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=MAX_BATCHED_TOKENS, description="tokens per forward; null = the engine's default for the GPU")
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_NUM_SEQS,
                                     description="requests per batch; null = the engine's default for the GPU")

    @model_validator(mode="before")
    @classmethod
    def _sglang_names(cls, data: Any) -> Any:
        """SGLang's own names for the same knobs; giving both names of one knob is an error."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for sglang, field in SGLANG_ALIASES.items():
            if sglang in out:
                if field in out:
                    raise UserError(T_("serving: give {a} or {b}, not both", a=sglang, b=field))
                out[field] = out.pop(sglang)
        if out.get("engine") == "sglang" and "block_size" not in out:
            out["block_size"] = SGLANG_PAGE_SIZE
        return out


def check_serving_fits(serving: ServingConfig, heads: int, kv_heads: int, num_gpus: int, mla: bool,
                       max_positions: int) -> None:
    """The engine's own start-up checks that do not need memory: vLLM's QKVParallelLinear splits the query heads
    over tensor_parallel and either splits the KV heads or replicates them (tp a multiple of them); replicas
    fill the GPUs; max_model_len at most the model's positions (vllm/config/model.py _get_and_verify_max_len)."""
    tp = serving.tensor_parallel
    if heads % tp:
        raise UserError(T_("serving.tensor_parallel={tp} must divide the {heads} attention heads", tp=tp,
                           heads=heads))
    if not mla and kv_heads % tp and tp % kv_heads:
        raise UserError(T_("serving.tensor_parallel={tp} must divide the {kv} KV heads or be a multiple of them",
                           tp=tp, kv=kv_heads))
    if num_gpus % tp:
        raise UserError(T_("num_gpus={gpus} is not a multiple of serving.tensor_parallel={tp}", gpus=num_gpus,
                           tp=tp))
    if serving.max_model_len is not None and serving.max_model_len > max_positions:
        raise UserError(T_("serving.max_model_len={n} exceeds the model's {positions} positions", n=serving.max_model_len,
                           positions=max_positions))

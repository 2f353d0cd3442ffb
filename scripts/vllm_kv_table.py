"""Regenerate data/vllm_kv_cache.yaml from vLLM's own KV cache classes (vLLM 0.13.0).

For every model preset this builds the KV cache spec of each layer as vLLM's model code does from the preset's
config.json (independently of calc/), then asks vLLM's own functions for the groups, the blocks, the logged
"GPU KV cache size" and "Maximum concurrency", and the memory one request needs:
vllm/v1/kv_cache_interface.py (FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec) and
vllm/v1/core/kv_cache_utils.py (get_kv_cache_groups, get_kv_cache_config_from_groups,
get_max_concurrency_for_kv_cache_config, max_memory_usage_bytes). tests/serve/test_vllm_table.py checks that
calc.serve gives the same numbers.

vLLM needs a GPU to run, but these modules import on a CPU with vLLM's Python source on the path (the wheel's
vllm/ folder, unzipped) and a few of its pure-Python dependencies:

    pip download vllm==0.13.0 --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-0.13.0-*.whl 'vllm/*.py' -d /tmp/vllm
    pip install --no-deps --target /tmp/vllm-deps cbor2 gguf pyzmq blake3 cachetools pybase64 msgspec cloudpickle \
        prometheus_client openai-harmony openai llguidance fastapi diskcache xgrammar apache-tvm-ffi
    PYTHONPATH=/tmp/vllm:/tmp/vllm-deps python scripts/vllm_kv_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml
from vllm.v1.core import kv_cache_utils as kvu
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "vllm_kv_cache.yaml"
AVAILABLE_BYTES = 16 * 2**30  # the memory the cases hand to the KV cache
MAX_MODEL_LEN = 8192
BATCHED_TOKENS = 8192
BLOCK_SIZE = 16
CASES = [  # (tensor_parallel, kv_cache_dtype)
    (1, "auto"), (1, "fp8"), (8, "auto"),
]
DTYPES = {"auto": torch.bfloat16, "fp8": torch.uint8}  # fp8 caches are stored as uint8 (STR_DTYPE_TO_TORCH_DTYPE)


def layers_of(cfg: dict) -> int:
    return cfg.get("num_hidden_layers") or cfg["n_layer"]


def window_of(cfg: dict, layer: int) -> int | None:
    """The sliding window vLLM's model code gives `layer`: per layer for the interleaved families (gemma2.py and
    gemma3.py from config.layer_types as transformers' configs fill it, gpt_oss.py on even layers), the
    model-level CacheConfig.sliding_window for the rest (arg_utils.py: only when not interleaved; Qwen's configs
    null it without use_sliding_window), none for Llama 4 (hybrid manager off for chunked attention, its local
    layers unified into full attention)."""
    family, window = cfg["model_type"], cfg.get("sliding_window")
    if window is None or family == "llama4_text":
        return None
    if cfg.get("layer_types"):
        return window if cfg["layer_types"][layer] == "sliding_attention" else None
    if family == "gemma2":  # Gemma2Config: "sliding_attention" if not bool((i + 1) % 2)
        return window if (layer + 1) % 2 else None
    if family == "gemma3_text":  # Gemma3TextConfig: sliding unless (i + 1) % sliding_window_pattern == 0
        return window if (layer + 1) % cfg.get("sliding_window_pattern", 6) else None
    if family == "gpt_oss":
        return window if layer % 2 == 0 else None
    if family in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        return None
    return window


def layer_specs(cfg: dict, tp: int, kv_dtype: str) -> dict:
    """{layer name: vLLM's spec} for one GPU of a tensor-parallel group."""
    dtype = DTYPES[kv_dtype]
    if cfg.get("kv_lora_rank"):  # MLAAttention.get_kv_cache_spec: one head of kv_lora_rank + qk_rope_head_dim
        spec = MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                head_size=cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], dtype=dtype,
                                cache_dtype_str=kv_dtype)
        return {f"layers.{i}": spec for i in range(layers_of(cfg))}
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    hidden = cfg.get("hidden_size") or cfg["n_embd"]
    head_size = cfg.get("head_dim") or hidden // heads
    kv_heads = max(1, cfg.get("num_key_value_heads", heads) // tp)  # ModelConfig.get_num_kv_heads
    out = {}
    for i in range(layers_of(cfg)):
        w = window_of(cfg, i)
        common = dict(block_size=BLOCK_SIZE, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype)
        out[f"layers.{i}"] = FullAttentionSpec(**common) if w is None else SlidingWindowSpec(**common,
                                                                                              sliding_window=w)
    return out


def splits(cfg: dict, tp: int) -> bool:
    """vLLM starts with this tensor parallelism: the heads split, the KV heads split or are replicated
    (QKVParallelLinear: tp a multiple of them)."""
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    kv = cfg.get("num_key_value_heads", heads)
    return heads % tp == 0 and (kv % tp == 0 or tp % kv == 0 or bool(cfg.get("kv_lora_rank")))


def vllm_config() -> SimpleNamespace:
    """The fields of VllmConfig these functions read."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=BATCHED_TOKENS, disable_hybrid_kv_cache_manager=False),
        cache_config=SimpleNamespace(num_gpu_blocks_override=None))


def case(cfg: dict, tp: int, kv_dtype: str) -> dict:
    specs = layer_specs(cfg, tp, kv_dtype)
    conf = vllm_config()
    needed = kvu.max_memory_usage_bytes(conf, specs.values())
    groups = kvu.get_kv_cache_groups(conf, dict(specs))
    config = kvu.get_kv_cache_config_from_groups(conf, groups, AVAILABLE_BYTES)
    block = min(g.kv_cache_spec.block_size for g in groups)
    return {"tensor_parallel": tp, "kv_cache_dtype": kv_dtype,
            "kv_bytes_per_token": sum(s.page_size_bytes for s in specs.values()) // BLOCK_SIZE,
            "kv_groups": len(groups), "num_blocks": config.num_blocks,
            "kv_cache_tokens": config.num_blocks // len(groups) * block,  # _report_kv_cache_config
            "max_concurrency": round(kvu.get_max_concurrency_for_kv_cache_config(conf, config), 6),
            "needed_bytes": needed}


def main() -> int:
    import vllm

    rows = {}
    for path in sorted((ROOT / "presets" / "models").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())["config"]
        rows[path.stem] = [case(cfg, tp, d) for tp, d in CASES if splits(cfg, tp)]
    header = {"vllm_version": vllm.__version__, "available_bytes": AVAILABLE_BYTES, "max_model_len": MAX_MODEL_LEN,
              "max_num_batched_tokens": BATCHED_TOKENS, "block_size": BLOCK_SIZE,
              "generated_by": "scripts/vllm_kv_table.py (vLLM's own KV cache classes)"}
    OUT.write_text(yaml.safe_dump({**header, "models": rows}, sort_keys=False))
    print(f"wrote {OUT} ({len(rows)} models)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

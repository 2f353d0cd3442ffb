"""The measured suite's building blocks: `Entry` (a named scenario and the devices it runs on), the default
training shape of the small entries, and the small model configs they run (random weights; vocab 2000 unless the
point is the logits), as Hugging Face config dicts. measure.suite_small and measure.suite_large name the entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SMALL = ("cpu", "cuda")


@dataclass(frozen=True)
class Entry:
    name: str
    model: str | dict[str, Any]
    training: dict[str, Any] = field(default_factory=dict)
    mode: str = "train"
    devices: tuple[str, ...] = SMALL
    extrapolate: bool = False  # fake: measure two short depths and extrapolate in the layer count
    hardware: dict[str, Any] | None = None
    inference: dict[str, Any] | None = None  # mode inference: generation (new_tokens, kv_cache)

    def scenario(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "mode": self.mode, "training": self.training}
        if self.hardware:
            out["hardware"] = self.hardware
        if self.inference:
            out["inference"] = self.inference
        return out


BASE = {"micro_batch_size": 2, "seq_len": 128}


def training(**kw: Any) -> dict[str, Any]:
    """The small entries' training: micro-batch 2, 128 tokens, with `kw` on top."""
    return {**BASE, **kw}


V = 2000
LLAMA_GQA = {"model_type": "llama", "vocab_size": V, "hidden_size": 128, "intermediate_size": 344,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 2048}
LLAMA_TIED = {**LLAMA_GQA, "tie_word_embeddings": True}
GPT2 = {"model_type": "gpt2", "vocab_size": V, "n_embd": 128, "n_layer": 4, "n_head": 4, "n_positions": 1024,
        "bos_token_id": 0, "eos_token_id": 0}  # dropout 0.1 everywhere (GPT-2's defaults)
GPT_NEOX = {"model_type": "gpt_neox", "vocab_size": V, "hidden_size": 128, "intermediate_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": 4, "max_position_embeddings": 2048,
            "bos_token_id": 0, "eos_token_id": 0}
QWEN2 = {"model_type": "qwen2", "vocab_size": V, "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
         "bos_token_id": 0, "eos_token_id": 0}
PHI3 = {"model_type": "phi3", "vocab_size": V, "hidden_size": 128, "intermediate_size": 344,
        "num_hidden_layers": 4, "num_attention_heads": 4, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
GEMMA2 = {"model_type": "gemma2", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "sliding_window": 64, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
MIXTRAL = {"model_type": "mixtral", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2}
MISTRAL_WINDOW = {"model_type": "mistral", "vocab_size": V, "hidden_size": 128, "intermediate_size": 344,
                  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 2048, "sliding_window": 64}
QWEN3_MOE = {"model_type": "qwen3_moe", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
             "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
             "max_position_embeddings": 2048}
GEMMA3 = {"model_type": "gemma3_text", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "sliding_window": 64, "max_position_embeddings": 2048}  # five local layers, then one global
GLM4_MOE = {"model_type": "glm4_moe", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
            "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "attention_bias": True, "use_qk_norm": True,
            "max_position_embeddings": 2048}  # one dense layer, then MoE with a shared expert; partial RoPE
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "vocab_size": V, "hidden_size": 128, "intermediate_size": 256,
               "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
               "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
               "n_group": 2, "topk_group": 1, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_rope_head_dim": 16,
               "qk_nope_head_dim": 32, "v_head_dim": 24, "max_position_embeddings": 2048}  # MLA + shared experts
DEEPSEEK_NO_QLORA = {**DEEPSEEK_V3, "q_lora_rank": None, "n_shared_experts": 2}  # V2-Lite-style q_proj
DEEPSEEK_V2 = {**DEEPSEEK_NO_QLORA, "model_type": "deepseek_v2"}  # softmax router, complex RoPE
for _k in ("n_group", "topk_group"):
    DEEPSEEK_V2.pop(_k)
GPT_OSS = {"model_type": "gpt_oss", "vocab_size": V, "hidden_size": 128, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 32,
           "max_position_embeddings": 2048}  # sliding + full layer, attention sinks, biased experts
PHI3_WINDOW = {**PHI3, "sliding_window": 64}  # Phi-3 attends through config.sliding_window
QWEN2_WINDOW = {**QWEN2, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2,
                "num_hidden_layers": 4}  # layers 2-3 slide, 0-1 attend fully
LLAMA4 = {"model_type": "llama4_text", "vocab_size": V, "hidden_size": 128, "intermediate_size": 64,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
          "num_local_experts": 4, "num_experts_per_tok": 1, "attention_chunk_size": 64,
          "max_position_embeddings": 2048}  # three chunked RoPE layers, then a NoPE layer; every token x every expert
# expert parallelism: experts wide enough that the MoE block, not the logits, sets the peak
QWEN3_MOE_EP = {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
                "moe_intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
                "norm_topk_prob": True, "max_position_embeddings": 2048}
MIXTRAL_EP = {"model_type": "mixtral", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
              "num_experts_per_tok": 2, "max_position_embeddings": 2048}
DEEPSEEK_V3_EP = {"model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
                  "moe_intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
                  "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "q_lora_rank": 64, "kv_lora_rank": 32,
                  "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "max_position_embeddings": 2048}
GLM4_MOE_EP = {"model_type": "glm4_moe", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
               "moe_intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 64, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
               "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "attention_bias": True, "use_qk_norm": True,
               "max_position_embeddings": 2048}
# FSDP2 without expert parallelism on a MoE-dominated layer: 64 experts hold 98 % of a layer's parameters
QWEN3_MOE_WIDE = {**QWEN3_MOE_EP, "num_experts": 64, "num_experts_per_tok": 2}
# GLM-4.5-Air's shapes as a config dict (zai-org/GLM-4.5-Air config.json; the records before the preset)
GLM45_AIR = {"model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
             "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96,
             "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128, "n_shared_experts": 1,
             "num_experts_per_tok": 8, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
             "norm_topk_prob": True, "routed_scaling_factor": 1.0, "attention_bias": True, "use_qk_norm": False,
             "partial_rotary_factor": 0.5, "max_position_embeddings": 131072, "tie_word_embeddings": False}
# Long sequences: logits (vocab 32000) or eager attention scores dominate.
LLAMA_BIGVOCAB = {**LLAMA_GQA, "vocab_size": 32000, "num_hidden_layers": 2}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama-gqa": LLAMA_GQA, "llama-tied": LLAMA_TIED, "gpt2-dropout": GPT2, "gpt-neox": GPT_NEOX,
    "qwen2-tied": QWEN2, "phi3": PHI3, "gemma2": GEMMA2, "mixtral": MIXTRAL, "qwen3-moe": QWEN3_MOE,
    "glm4-moe": GLM4_MOE,
}

"""The measured data set: named scenarios and the devices each one runs on.

    python -m measure.suite --device cpu|fake|cuda [--only NAME ...] [-o data/measured_cpu.jsonl]

runs every entry meant for that device and appends one record per entry (JSON lines). `--list` prints
the names. The small entries (hidden 64-256, 2-6 layers) run in seconds on two CPU cores and on any GPU;
the preset entries (1B-70B) run under FakeTensorMode (nothing allocated), and some of them on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
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

    def scenario(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "mode": self.mode, "training": self.training}
        if self.hardware:
            out["hardware"] = self.hardware
        return out


# ---- small configs (random weights; vocab 2000 unless the point is the logits) ----------------------
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
BASE = {"micro_batch_size": 2, "seq_len": 128}


def _t(**kw: Any) -> dict[str, Any]:
    return {**BASE, **kw}


def _small_entries() -> list[Entry]:
    out: list[Entry] = []
    # Every family x four precisions / modes.
    for fam, cfg in FAMILIES.items():
        attn = {"attention": "eager"} if fam == "gemma2" else {}  # transformers 5.23: gemma2 has no SDPA path
        out += [
            Entry(f"{fam}-fp32-adamw-foreach", cfg, _t(precision="fp32", **attn)),
            Entry(f"{fam}-amp-bf16", cfg, _t(precision="amp-bf16", **attn)),
            Entry(f"{fam}-bf16-mixed", cfg, _t(precision="bf16-mixed", **attn)),
            Entry(f"{fam}-inference-bf16", cfg, _t(precision="bf16", **attn), mode="inference"),
        ]
    L = LLAMA_GQA
    out += [
        # precisions
        Entry("llama-bf16-adamw", L, _t(precision="bf16")),
        Entry("llama-amp-fp16-gradscaler", L, _t(precision="amp-fp16")),
        Entry("llama-fp16-mixed", L, _t(precision="fp16-mixed")),
        # optimizers and their implementations
        Entry("llama-fp32-adam", L, _t(precision="fp32", optimizer="adam")),
        Entry("llama-fp32-sgd", L, _t(precision="fp32", optimizer="sgd")),
        Entry("llama-fp32-sgd-momentum", L, _t(precision="fp32", optimizer="sgd-momentum")),
        Entry("llama-fp32-adafactor-foreach", L, _t(precision="fp32", optimizer="adafactor")),
        Entry("llama-fp32-adafactor-for-loop", L, _t(precision="fp32", optimizer="adafactor",
                                                     optimizer_impl="for-loop")),
        Entry("llama-fp32-adamw-for-loop", L, _t(precision="fp32", optimizer_impl="for-loop")),
        Entry("llama-fp32-adamw-fused", L, _t(precision="fp32", optimizer_impl="fused")),
        Entry("llama-fp32-adam-fused", L, _t(precision="fp32", optimizer="adam", optimizer_impl="fused")),
        Entry("llama-fp32-sgd-momentum-fused", L, _t(precision="fp32", optimizer="sgd-momentum",
                                                     optimizer_impl="fused")),
        Entry("llama-fp32-sgd-momentum-for-loop", L, _t(precision="fp32", optimizer="sgd-momentum",
                                                        optimizer_impl="for-loop")),
        Entry("llama-bf16-mixed-adamw-for-loop", L, _t(precision="bf16-mixed", optimizer_impl="for-loop")),
        Entry("llama-bf16-adamw-fused", L, _t(precision="bf16", optimizer_impl="fused")),
        # attention
        Entry("llama-fp32-eager", L, _t(precision="fp32", attention="eager")),
        Entry("llama-amp-bf16-eager", L, _t(precision="amp-bf16", attention="eager")),
        Entry("llama-bf16-eager-seq512", L, _t(precision="bf16", attention="eager", seq_len=512)),
        Entry("llama-bf16-sdpa-seq512", L, _t(precision="bf16", seq_len=512)),
        # activation checkpointing
        Entry("llama-fp32-full", L, _t(precision="fp32", activation_checkpointing="full", seq_len=512)),
        Entry("llama-fp32-full-every2", L, _t(precision="fp32", activation_checkpointing="full",
                                              checkpoint_every=2, seq_len=512)),
        Entry("llama-bf16-mixed-full-every2", L, _t(precision="bf16-mixed", activation_checkpointing="full",
                                                    checkpoint_every=2, seq_len=256)),
        Entry("llama-amp-bf16-full", L, _t(precision="amp-bf16", activation_checkpointing="full", seq_len=512)),
        Entry("llama-fp32-selective-sdpa", L, _t(precision="fp32", activation_checkpointing="selective",
                                                 seq_len=512)),
        Entry("llama-fp32-selective-eager", L, _t(precision="fp32", activation_checkpointing="selective",
                                                  attention="eager", seq_len=512)),
        Entry("llama-fp32-none-seq512", L, _t(precision="fp32", seq_len=512)),
        # gradient accumulation
        Entry("llama-fp32-accum2", L, _t(precision="fp32", gradient_accumulation_steps=2)),
        Entry("llama-amp-bf16-accum2", L, _t(precision="amp-bf16", gradient_accumulation_steps=2, seq_len=256)),
        Entry("llama-bf16-mixed-accum2", L, _t(precision="bf16-mixed", gradient_accumulation_steps=2)),
        # inference
        Entry("llama-inference-fp32", L, _t(precision="fp32"), mode="inference"),
        Entry("llama-inference-amp-bf16", L, _t(precision="amp-bf16"), mode="inference"),
        Entry("llama-inference-bf16-eager-b4", L, _t(precision="bf16", attention="eager", micro_batch_size=4,
                                                     seq_len=256), mode="inference"),
        # LoRA (bf16 frozen base)
        Entry("llama-lora-all-linear-amp-bf16", L, _t(precision="amp-bf16", lora={"rank": 8})),
        Entry("llama-lora-attention-bf16", L, _t(precision="bf16", lora={"rank": 16, "targets": "attention"})),
        Entry("llama-lora-full-ckpt-bf16-mixed", L, _t(precision="bf16-mixed", lora={"rank": 8},
                                                       activation_checkpointing="full", seq_len=512)),
        Entry("llama-lora-inference", L, _t(precision="bf16", lora={"rank": 8}), mode="inference"),
        # shapes
        Entry("llama-fp32-b1-seq32", L, {"micro_batch_size": 1, "seq_len": 32, "precision": "fp32"}),
        Entry("llama-amp-bf16-b4-seq512", L, {"micro_batch_size": 4, "seq_len": 512, "precision": "amp-bf16"}),
        # long sequences: logits (vocab 32000) and eager scores dominate
        Entry("llama-vocab32k-seq1024-amp-bf16", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "amp-bf16"}),
        Entry("llama-vocab32k-seq1024-fp32", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "fp32"}),
        Entry("llama-vocab32k-seq1024-bf16-full", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "bf16", "activation_checkpointing": "full"}),
        Entry("llama-seq1024-eager-fp32", {**LLAMA_GQA, "num_hidden_layers": 2},
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "fp32", "attention": "eager"}),
        Entry("llama-vocab32k-seq1024-inference", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "bf16"}, mode="inference"),
        # other families beyond the base four
        Entry("gpt2-dropout-full", GPT2, _t(precision="fp32", activation_checkpointing="full", seq_len=512)),
        Entry("gpt2-dropout-selective-eager", GPT2, _t(precision="amp-bf16", activation_checkpointing="selective",
                                                       attention="eager")),
        Entry("gpt2-dropout-eager-fp32", GPT2, _t(precision="fp32", attention="eager", seq_len=512)),
        Entry("gpt2-dropout-sgd-for-loop", GPT2, _t(precision="fp32", optimizer="sgd", optimizer_impl="for-loop")),
        Entry("gpt-neox-full-every2", GPT_NEOX, _t(precision="bf16-mixed", activation_checkpointing="full",
                                                   checkpoint_every=2, seq_len=512)),
        Entry("qwen2-selective", QWEN2, _t(precision="amp-bf16", activation_checkpointing="selective",
                                           seq_len=512)),
        Entry("phi3-eager-amp-bf16", PHI3, _t(precision="amp-bf16", attention="eager", seq_len=256)),
        Entry("gemma2-full-eager", GEMMA2, _t(precision="bf16", attention="eager",
                                             activation_checkpointing="full", seq_len=256)),
        Entry("mixtral-full", MIXTRAL, _t(precision="fp32", activation_checkpointing="full", seq_len=256)),
        Entry("mixtral-accum2-bf16", MIXTRAL, _t(precision="bf16", gradient_accumulation_steps=2)),
        Entry("deepseek-v3-eager-bf16", DEEPSEEK_V3, _t(precision="bf16", attention="eager")),
        Entry("deepseek-v3-sdpa-amp-bf16", DEEPSEEK_V3, _t(precision="amp-bf16")),
        Entry("deepseek-v3-sdpa-fp32", DEEPSEEK_V3, _t(precision="fp32")),
        Entry("deepseek-v3-full-keep-bf16-seq512", DEEPSEEK_V3, _t(precision="bf16", activation_checkpointing="full",
                                                                   keep_outputs=True, seq_len=512)),
        Entry("deepseek-v3-inference-eager-bf16", DEEPSEEK_V3, _t(precision="bf16", attention="eager"),
              mode="inference"),
        Entry("deepseek-noqlora-eager-bf16-seq512", DEEPSEEK_NO_QLORA, {"micro_batch_size": 1, "seq_len": 512,
                                                                        "precision": "bf16", "attention": "eager"}),
        Entry("deepseek-noqlora-sdpa-amp-bf16-seq512", DEEPSEEK_NO_QLORA, {"micro_batch_size": 1, "seq_len": 512,
                                                                           "precision": "amp-bf16"}),
        Entry("deepseek-v2-eager-bf16", DEEPSEEK_V2, _t(precision="bf16", attention="eager")),
        Entry("deepseek-v2-sdpa-amp-bf16-seq512", DEEPSEEK_V2, _t(precision="amp-bf16", seq_len=512)),
        Entry("deepseek-v2-full-keep-fp32", DEEPSEEK_V2, _t(precision="fp32", activation_checkpointing="full",
                                                            keep_outputs=True)),
        Entry("gpt-oss-eager-bf16", GPT_OSS, _t(precision="bf16", attention="eager")),
        Entry("gpt-oss-eager-fp32", GPT_OSS, _t(precision="fp32", attention="eager")),
        Entry("gpt-oss-eager-amp-bf16-seq256", GPT_OSS, _t(precision="amp-bf16", attention="eager", seq_len=256)),
        Entry("gpt-oss-eager-bf16-full-keep", GPT_OSS, _t(precision="bf16", attention="eager",
                                                          activation_checkpointing="full", keep_outputs=True)),
        Entry("gpt-oss-inference-eager-bf16", GPT_OSS, _t(precision="bf16", attention="eager"), mode="inference"),
        # LoRA on MLA (q_a / q_b / kv_a_proj_with_mqa / kv_b / o) and on sigmoid-router MoE layers
        Entry("deepseek-v3-lora-attention-bf16", DEEPSEEK_V3, _t(precision="bf16", lora={"rank": 8,
                                                                                         "targets": "attention"})),
        Entry("deepseek-v2-lora-attention-amp-bf16", DEEPSEEK_V2, _t(precision="amp-bf16", lora={"rank": 8,
                                                                                                 "targets": "attention"})),
        Entry("deepseek-noqlora-lora-attention-full-ckpt-fp32", DEEPSEEK_NO_QLORA,
              _t(precision="fp32", activation_checkpointing="full", lora={"rank": 8, "targets": "attention"})),
        Entry("glm4-moe-lora-attention-bf16-mixed", GLM4_MOE, _t(precision="bf16-mixed", lora={"rank": 8,
                                                                                               "targets": "attention"})),
        # held out: measured after the frozen-embedding, Phi-3 window and Qwen window-layer changes
        Entry("heldout-phi3-window-lora-all-linear-fp32", PHI3_WINDOW, _t(precision="fp32", seq_len=96,
                                                                           lora={"rank": 8})),
        Entry("heldout-qwen2-window-layers-sdpa-bf16", QWEN2_WINDOW, _t(precision="bf16", seq_len=96)),
        Entry("heldout-qwen2-window-layers-eager-amp-bf16", QWEN2_WINDOW, _t(precision="amp-bf16", seq_len=96,
                                                                              attention="eager")),
        Entry("heldout-mistral-lora-attention-bf16-window", MISTRAL_WINDOW, _t(precision="bf16", lora={"rank": 4,
                                                                                "targets": "attention"})),
        Entry("llama4-sdpa-bf16-past-chunk", LLAMA4, _t(precision="bf16", seq_len=160)),
        Entry("llama4-sdpa-amp-bf16", LLAMA4, _t(precision="amp-bf16")),
        Entry("llama4-eager-fp32-past-chunk", LLAMA4, _t(precision="fp32", attention="eager", seq_len=96)),
        Entry("llama4-full-ckpt-bf16-mixed", LLAMA4, _t(precision="bf16-mixed", activation_checkpointing="full")),
        Entry("llama4-lora-attention-amp-bf16", LLAMA4, _t(precision="amp-bf16", lora={"rank": 8,
                                                                                      "targets": "attention"})),
        Entry("llama4-inference-bf16", LLAMA4, _t(precision="bf16"), mode="inference"),
        Entry("glm4-moe-full-every2-bf16", GLM4_MOE, _t(precision="bf16", activation_checkpointing="full",
                                                       checkpoint_every=2, seq_len=256)),
        Entry("qwen3-moe-keep-amp-bf16", QWEN3_MOE, _t(precision="amp-bf16", keep_outputs=True)),
    ]
    return out + _mask_entries() + _keep_outputs_entries() + _gemma3_entries()


def _gemma3_entries() -> list[Entry]:
    """Gemma 3: local (sliding) and global layers differ once the sequence reaches the window."""
    G = GEMMA3
    return [
        Entry("gemma3-sdpa-fp32-below-window", G, _t(precision="fp32", seq_len=32)),
        Entry("gemma3-sdpa-bf16-past-window", G, _t(precision="bf16")),
        Entry("gemma3-sdpa-amp-bf16-past-window", G, _t(precision="amp-bf16")),
        Entry("gemma3-eager-bf16-mixed", G, _t(precision="bf16-mixed", attention="eager")),
        Entry("gemma3-sdpa-bf16-full-past-window", G, _t(precision="bf16", activation_checkpointing="full",
                                                         seq_len=256)),
        Entry("gemma3-sdpa-bf16-keep-past-window", G, _t(precision="bf16", keep_outputs=True)),
        Entry("gemma3-inference-bf16-past-window", G, _t(precision="bf16"), mode="inference"),
    ]


def _keep_outputs_entries() -> list[Entry]:
    """`outputs = model(**batch)`: logits and the KV cache held through backward, the step and the next forward."""
    L, B = LLAMA_GQA, LLAMA_BIGVOCAB
    keep = {"keep_outputs": True}
    return [
        Entry("llama-vocab32k-keep-amp-bf16-seq1024", B, {"micro_batch_size": 1, "seq_len": 1024,
                                                          "precision": "amp-bf16", **keep}),
        Entry("llama-vocab32k-keep-fp32-full-seq1024", B, {"micro_batch_size": 1, "seq_len": 1024, "precision": "fp32",
                                                           "activation_checkpointing": "full", **keep}),
        Entry("llama-keep-fp32-seq512", L, _t(precision="fp32", seq_len=512, **keep)),
        Entry("llama-keep-bf16-accum2", L, _t(precision="bf16", gradient_accumulation_steps=2, **keep)),
        Entry("llama-keep-fp32-selective-seq512", L, _t(precision="fp32", activation_checkpointing="selective",
                                                        seq_len=512, **keep)),
        Entry("llama-keep-bf16-mixed-b1-seq32", L, {"micro_batch_size": 1, "seq_len": 32, "precision": "bf16-mixed",
                                                    **keep}),
        Entry("gemma2-keep-amp-bf16-eager", GEMMA2, _t(precision="amp-bf16", attention="eager", **keep)),
        Entry("mixtral-keep-bf16", MIXTRAL, _t(precision="bf16", **keep)),
        Entry("gpt2-keep-fp32", GPT2, _t(precision="fp32", **keep)),
        Entry("phi3-keep-amp-bf16", PHI3, _t(precision="amp-bf16", **keep)),
    ]


def _mask_entries() -> list[Entry]:
    """Attention masks kept by checkpointing (eager) and sliding windows under SDPA at and past the window."""
    L, W = LLAMA_GQA, MISTRAL_WINDOW
    return [
        Entry("llama-eager-full-fp32-seq512", L, _t(precision="fp32", attention="eager",
                                                    activation_checkpointing="full", seq_len=512)),
        Entry("llama-eager-full-every2-bf16-seq512", L, _t(precision="bf16", attention="eager",
                                                           activation_checkpointing="full", checkpoint_every=2,
                                                           seq_len=512)),
        Entry("gemma2-eager-full-amp-bf16-seq256", GEMMA2, _t(precision="amp-bf16", attention="eager",
                                                              activation_checkpointing="full", seq_len=256)),
        Entry("mistral-window-sdpa-fp32-seq256", W, _t(precision="fp32", seq_len=256)),
        Entry("mistral-window-sdpa-amp-bf16-seq256", W, _t(precision="amp-bf16", seq_len=256)),
        Entry("mistral-window-sdpa-bf16-at-window", W, _t(precision="bf16", seq_len=64)),
        Entry("mistral-window-sdpa-bf16-full-seq256", W, _t(precision="bf16", activation_checkpointing="full",
                                                           seq_len=256)),
        Entry("mistral-window-eager-bf16-seq256", W, _t(precision="bf16", attention="eager", seq_len=256)),
        Entry("mistral-window-sdpa-bf16-selective-seq256", W, _t(precision="bf16",
                                                                activation_checkpointing="selective", seq_len=256)),
    ]


# ---- 1B-70B presets: fake mode (and a GPU where they fit) -------------------------------------------
FAKE = ("fake",)
FAKE_AND_GPU = ("fake", "cuda")


def _fake_entries() -> list[Entry]:
    return [
        Entry("llama-3.2-1b-amp-bf16-b1-s2048", "llama-3.2-1b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "amp-bf16"}, devices=FAKE_AND_GPU),
        Entry("llama-3.2-1b-bf16-mixed-full-b4-s2048", "llama-3.2-1b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "bf16-mixed",
               "activation_checkpointing": "full"}, devices=FAKE_AND_GPU),
        Entry("llama-2-7b-amp-bf16-b1-s512", "llama-2-7b",
              {"micro_batch_size": 1, "seq_len": 512, "precision": "amp-bf16"}, devices=FAKE_AND_GPU),
        Entry("llama-2-7b-amp-bf16-b1-s512-extrapolated", "llama-2-7b",
              {"micro_batch_size": 1, "seq_len": 512, "precision": "amp-bf16"}, devices=FAKE, extrapolate=True),
        Entry("llama-2-7b-bf16-mixed-full-b4-s2048", "llama-2-7b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "bf16-mixed",
               "activation_checkpointing": "full"}, devices=FAKE_AND_GPU),
        Entry("qwen2.5-0.5b-amp-bf16-b8-s1024", "qwen2.5-0.5b",
              {"micro_batch_size": 8, "seq_len": 1024, "precision": "amp-bf16"}, devices=FAKE_AND_GPU),
        Entry("qwen2.5-0.5b-inference-bf16-b8-s2048", "qwen2.5-0.5b",
              {"micro_batch_size": 8, "seq_len": 2048, "precision": "bf16"}, mode="inference",
              devices=FAKE_AND_GPU),
        Entry("tinyllama-1.1b-bf16-selective-b8-s2048", "tinyllama-1.1b",
              {"micro_batch_size": 8, "seq_len": 2048, "precision": "bf16",
               "activation_checkpointing": "selective"}, devices=FAKE_AND_GPU),
        Entry("mistral-7b-bf16-full-b1-s4096", "mistral-7b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "activation_checkpointing": "full"},
              devices=FAKE_AND_GPU),
        Entry("mistral-7b-lora-amp-bf16-b4-s2048", "mistral-7b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "amp-bf16", "lora": {"rank": 16}},
              devices=FAKE_AND_GPU),
        Entry("llama-3-8b-lora-attention-bf16-full-b1-s8192", "llama-3-8b",
              {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16", "activation_checkpointing": "full",
               "lora": {"rank": 16, "targets": "attention"}}, devices=FAKE_AND_GPU),
        Entry("gemma-2-2b-amp-bf16-eager-b2-s1024", "gemma-2-2b",
              {"micro_batch_size": 2, "seq_len": 1024, "precision": "amp-bf16", "attention": "eager"},
              devices=FAKE_AND_GPU),
        Entry("phi-3-mini-bf16-mixed-full-b2-s4096", "phi-3-mini",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16-mixed",
               "activation_checkpointing": "full"}, devices=FAKE_AND_GPU),
        Entry("pythia-1.4b-amp-fp16-b8-s2048", "pythia-1.4b",
              {"micro_batch_size": 8, "seq_len": 2048, "precision": "amp-fp16"}, devices=FAKE_AND_GPU),
        Entry("gpt2-xl-fp32-eager-b4-s1024", "gpt2-xl",
              {"micro_batch_size": 4, "seq_len": 1024, "precision": "fp32", "attention": "eager"},
              devices=FAKE_AND_GPU),
        Entry("qwen2.5-7b-bf16-sgd-full-b2-s4096", "qwen2.5-7b",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd",
               "activation_checkpointing": "full"}, devices=FAKE_AND_GPU),
        Entry("llama-2-70b-bf16-mixed-full-b1-s4096-extrapolated", "llama-2-70b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed",
               "activation_checkpointing": "full"}, devices=FAKE, extrapolate=True),
        Entry("llama-2-70b-inference-bf16-b1-s4096-extrapolated", "llama-2-70b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16"}, mode="inference", devices=FAKE,
              extrapolate=True),
        Entry("llama-3.1-70b-lora-amp-bf16-full-b1-s2048-extrapolated", "llama-3.1-70b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "amp-bf16", "activation_checkpointing": "full",
               "lora": {"rank": 16}}, devices=FAKE, extrapolate=True),
        # 2026 families
        Entry("qwen3-30b-a3b-bf16-full-b1-s4096-extrapolated", "qwen3-30b-a3b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "activation_checkpointing": "full"},
              devices=FAKE, extrapolate=True),
        Entry("qwen3-235b-a22b-bf16-full-b1-s2048-extrapolated", "qwen3-235b-a22b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16", "activation_checkpointing": "full"},
              devices=FAKE, extrapolate=True),
        Entry("qwen3-14b-bf16-mixed-keep-b1-s4096-extrapolated", "qwen3-14b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed", "keep_outputs": True},
              devices=FAKE, extrapolate=True),
        Entry("qwen3-32b-bf16-full-b2-s4096-extrapolated", "qwen3-32b",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "activation_checkpointing": "full"},
              devices=FAKE, extrapolate=True),
        Entry("gemma-3-1b-amp-bf16-b2-s2048", "gemma-3-1b",
              {"micro_batch_size": 2, "seq_len": 2048, "precision": "amp-bf16"}, devices=FAKE),
        Entry("gemma-3-4b-bf16-sgd-b1-s4096-extrapolated", "gemma-3-4b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd"},
              devices=FAKE, extrapolate=True),
        Entry("gemma-3-27b-lora-attention-bf16-full-b1-s8192-extrapolated", "gemma-3-27b",
              {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16", "activation_checkpointing": "full",
               "lora": {"rank": 16, "targets": "attention"}}, devices=FAKE, extrapolate=True),
        Entry("qwen3-30b-a3b-lora-attention-bf16-b2-s4096-extrapolated", "qwen3-30b-a3b",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "lora": {"rank": 16, "targets": "attention"}},
              devices=FAKE, extrapolate=True),
        Entry("deepseek-v3-bf16-sgd-full-b1-s4096-extrapolated", "deepseek-v3",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd",
               "activation_checkpointing": "full"}, devices=FAKE, extrapolate=True),
        Entry("deepseek-v3-inference-bf16-b1-s8192-extrapolated", "deepseek-v3",
              {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16"}, mode="inference", devices=FAKE,
              extrapolate=True),
        Entry("deepseek-v2-lite-bf16-sgd-b2-s4096-extrapolated", "deepseek-v2-lite",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd"},
              devices=FAKE, extrapolate=True),
        Entry("deepseek-v2-lite-bf16-mixed-full-keep-b4-s4096-extrapolated", "deepseek-v2-lite",
              {"micro_batch_size": 4, "seq_len": 4096, "precision": "bf16-mixed", "activation_checkpointing": "full",
               "keep_outputs": True}, devices=FAKE, extrapolate=True),
        Entry("gpt-oss-20b-bf16-eager-sgd-b1-s4096-extrapolated", "gpt-oss-20b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "attention": "eager", "optimizer": "sgd"},
              devices=FAKE, extrapolate=True),
        Entry("gpt-oss-120b-bf16-eager-full-b1-s8192-extrapolated", "gpt-oss-120b",
              {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16", "attention": "eager",
               "activation_checkpointing": "full", "optimizer": "sgd"}, devices=FAKE, extrapolate=True),
        Entry("glm-4.5-air-bf16-sgd-b1-s4096-extrapolated", GLM45_AIR,
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd"},
              devices=FAKE, extrapolate=True),
        Entry("glm-4.5-air-bf16-full-keep-b2-s4096-extrapolated", GLM45_AIR,
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd",
               "activation_checkpointing": "full", "keep_outputs": True}, devices=FAKE, extrapolate=True),
        Entry("glm-4.5-bf16-sgd-full-b1-s4096-extrapolated", "glm-4.5",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16", "optimizer": "sgd",
               "activation_checkpointing": "full"}, devices=FAKE, extrapolate=True),
        Entry("glm-4.5-air-bf16-mixed-full-b1-s4096-extrapolated", "glm-4.5-air",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed", "activation_checkpointing": "full"},
              devices=FAKE, extrapolate=True),
        Entry("llama-4-scout-bf16-full-b1-s8192-extrapolated", "llama-4-scout",
              {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16", "optimizer": "sgd",
               "activation_checkpointing": "full"}, devices=FAKE, extrapolate=True),
        Entry("llama-4-scout-lora-attention-bf16-b1-s4096-extrapolated", "llama-4-scout",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16",
               "lora": {"rank": 16, "targets": "attention"}}, devices=FAKE, extrapolate=True),
        Entry("mixtral-8x7b-inference-bf16-b1-s2048-extrapolated", "mixtral-8x7b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16"}, mode="inference", devices=FAKE,
              extrapolate=True),
    ]


# ---- GPU-only: too slow for two CPU cores, too big to be interesting at tiny scale ----------------
GPU = ("cuda",)


def _gpu_entries() -> list[Entry]:
    return [
        Entry("gpu-llama-3.2-1b-bf16-adamw-b4-s2048", "llama-3.2-1b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "bf16"}, devices=GPU),
        Entry("gpu-llama-3.2-1b-amp-bf16-adamw-b4-s2048", "llama-3.2-1b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "amp-bf16"}, devices=GPU),
        Entry("gpu-llama-3.2-1b-amp-bf16-full-b8-s4096", "llama-3.2-1b",
              {"micro_batch_size": 8, "seq_len": 4096, "precision": "amp-bf16", "activation_checkpointing": "full"},
              devices=GPU),
        Entry("gpu-qwen2.5-1.5b-bf16-mixed-b4-s2048", "qwen2.5-1.5b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "bf16-mixed"}, devices=GPU),
        Entry("gpu-llama-3.1-8b-inference-bf16-b8-s4096", "llama-3.1-8b",
              {"micro_batch_size": 8, "seq_len": 4096, "precision": "bf16"}, mode="inference", devices=GPU),
        Entry("gpu-llama-3.1-8b-lora-nf4-b4-s2048", "llama-3.1-8b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "amp-bf16",
               "lora": {"rank": 16, "base_weights": "nf4"}, "activation_checkpointing": "full"}, devices=GPU),
        Entry("gpu-llama-3.2-1b-adamw-8bit-b4-s2048", "llama-3.2-1b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "amp-bf16", "optimizer": "adamw-8bit"},
              devices=GPU),
    ]


def _sharded_entries() -> list[Entry]:
    """FSDP2 over a fake process group (measure/sharded.py): rank 0 of num_gpus ranks."""

    def gpus(n: int) -> dict[str, Any]:
        return {"num_gpus": n}

    cpu_fake = ("cpu", "fake")
    L = LLAMA_GQA
    return [
        Entry("fsdp-llama-zero3-ws2-fp32", L, _t(precision="fp32", zero_stage=3), hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-fp32", L, _t(precision="fp32", zero_stage=3), hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero2-ws4-fp32", L, _t(precision="fp32", zero_stage=2), hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-bf16-mixed", L, _t(precision="bf16-mixed", zero_stage=3), hardware=gpus(4),
              devices=cpu_fake),
        Entry("fsdp-llama-zero2-ws4-bf16-mixed", L, _t(precision="bf16-mixed", zero_stage=2), hardware=gpus(4),
              devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-amp-bf16-full", L, _t(precision="amp-bf16", zero_stage=3,
                                                          activation_checkpointing="full", seq_len=512),
              hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws8-bf16-seq512", L, _t(precision="bf16", zero_stage=3, seq_len=512),
              hardware=gpus(8), devices=cpu_fake),
        Entry("fsdp-gpt2-zero3-ws2-amp-bf16", GPT2, _t(precision="amp-bf16", zero_stage=3), hardware=gpus(2),
              devices=cpu_fake),
        Entry("fsdp-qwen2-zero2-ws2-bf16", QWEN2, _t(precision="bf16", zero_stage=2), hardware=gpus(2),
              devices=cpu_fake),
        Entry("fsdp-llama-vocab32k-zero3-ws4-seq1024", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "bf16-mixed", "zero_stage": 3},
              hardware=gpus(4), devices=cpu_fake),
        # presets, fake only
        Entry("fsdp-llama-3.2-1b-zero3-ws4-amp-bf16-b4-s2048", "llama-3.2-1b",
              {"micro_batch_size": 4, "seq_len": 2048, "precision": "amp-bf16", "zero_stage": 3},
              hardware=gpus(4), devices=FAKE),
        Entry("fsdp-llama-2-7b-zero3-ws8-bf16-mixed-full-b1-s2048", "llama-2-7b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-mixed", "zero_stage": 3,
               "activation_checkpointing": "full"}, hardware=gpus(8), devices=FAKE, extrapolate=True),
        Entry("fsdp-llama-2-7b-zero2-ws8-bf16-mixed-full-b1-s2048", "llama-2-7b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-mixed", "zero_stage": 2,
               "activation_checkpointing": "full"}, hardware=gpus(8), devices=FAKE, extrapolate=True),
        Entry("fsdp-mistral-7b-zero3-ws16-bf16-full-b2-s4096", "mistral-7b",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "zero_stage": 3,
               "activation_checkpointing": "full"}, hardware=gpus(16), devices=FAKE, extrapolate=True),
        Entry("fsdp-llama-2-70b-zero3-ws64-bf16-mixed-full-b1-s4096", "llama-2-70b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed", "zero_stage": 3,
               "activation_checkpointing": "full"}, hardware=gpus(64), devices=FAKE, extrapolate=True),
    ]


def _expert_parallel_entries() -> list[Entry]:
    """transformers' expert parallelism (AllToAllEP) under FSDP2 over a fake process group, real CPU tensors
    (measure/sharded.py). The `ep-heldout-` entries were measured after the engine change
    (data/measured_ep_heldout.jsonl)."""
    cpu = ("cpu",)

    def ep(name: str, model: dict[str, Any], gpus: int, **kw: Any) -> Entry:
        return Entry(name, model, _t(**{"zero_stage": 3, "sharding": "fsdp2", "seq_len": 512, **kw}),
                     hardware={"num_gpus": gpus}, devices=cpu)

    return [
        ep("ep-qwen3-moe-ep1-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32"),
        ep("ep-qwen3-moe-ep2-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32", expert_parallel=2),
        ep("ep-qwen3-moe-ep8-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32", expert_parallel=8),
        ep("ep-qwen3-moe-ep4-ws8-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed", expert_parallel=4),
        ep("ep-qwen3-moe-ep2-ws4-zero2-fp32", QWEN3_MOE_EP, 4, precision="fp32", zero_stage=2, expert_parallel=2),
        ep("ep-mixtral-ep4-ws4-bf16", MIXTRAL_EP, 4, precision="bf16", expert_parallel=4),
        ep("ep-mixtral-ep2-ws4-fp32", MIXTRAL_EP, 4, precision="fp32", expert_parallel=2),
        ep("ep-deepseek-v3-ep8-ws8-fp32", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=8),
        ep("ep-heldout-qwen3-moe-ep4-ws4-bf16-b1", QWEN3_MOE_EP, 4, precision="bf16", expert_parallel=4,
           micro_batch_size=1, seq_len=256),
        ep("ep-heldout-deepseek-v3-ep2-ws4-bf16-mixed", DEEPSEEK_V3_EP, 4, precision="bf16-mixed", expert_parallel=2),
        ep("ep-heldout-mixtral-ep8-ws8-fp32-s1024", MIXTRAL_EP, 8, precision="fp32", expert_parallel=8, seq_len=1024),
        ep("ep-heldout-qwen3-moe-ep4-ws8-zero2-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed", zero_stage=2,
           expert_parallel=4),
        ep("ep-heldout-deepseek-v3-ep4-ws8-fp32-full", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=4,
           activation_checkpointing="full"),
        # measured after the FSDP2 input cast of the experts module was modelled
        ep("ep-heldout-mixtral-ep4-ws8-bf16-mixed", MIXTRAL_EP, 8, precision="bf16-mixed", expert_parallel=4),
        ep("ep-heldout-glm4-moe-ep2-ws2-zero2-fp32", GLM4_MOE_EP, 2, precision="fp32", zero_stage=2,
           expert_parallel=2),
        ep("ep-heldout-qwen3-moe-ep4-ws4-amp-bf16", QWEN3_MOE_EP, 4, precision="amp-bf16", expert_parallel=4),
        # full checkpointing under EP, measured last
        ep("ep-heldout-qwen3-moe-ep2-ws8-bf16-full", QWEN3_MOE_EP, 8, precision="bf16", expert_parallel=2,
           activation_checkpointing="full"),
        # FSDP2 + MoE without EP: the runs that traced the FSDP2 backward terms (data/measured_cpu.jsonl)
        ep("fsdp-moe-qwen3-moe-ws8-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed"),
        ep("fsdp-moe-qwen3-moe-ws4-amp-bf16-full", QWEN3_MOE_EP, 4, precision="amp-bf16",
           activation_checkpointing="full"),
        ep("fsdp-moe-qwen3-moe-wide-ws4-bf16-mixed", QWEN3_MOE_WIDE, 4, precision="bf16-mixed", seq_len=256),
        ep("fsdp-moe-qwen3-moe-wide-ws4-amp-bf16-full", QWEN3_MOE_WIDE, 4, precision="amp-bf16",
           activation_checkpointing="full", seq_len=256),
        # measured after the engine modelled the checkpoint's early stop, the MoE locals and FSDP2's backward
        # buffers (data/measured_ep_heldout.jsonl)
        ep("ep-heldout2-glm4-moe-ep2-ws4-bf16-full", GLM4_MOE_EP, 4, precision="bf16", expert_parallel=2,
           activation_checkpointing="full"),
        ep("ep-heldout2-deepseek-v3-ep2-ws8-bf16-mixed-full", DEEPSEEK_V3_EP, 8, precision="bf16-mixed",
           expert_parallel=2, activation_checkpointing="full"),
        ep("ep-heldout2-deepseek-v3-ep8-ws8-fp32-full", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=8,
           activation_checkpointing="full"),
        ep("ep-heldout2-mixtral-ep4-ws8-fp32-full", MIXTRAL_EP, 8, precision="fp32", expert_parallel=4,
           activation_checkpointing="full"),
        ep("ep-heldout2-qwen3-moe-ep4-ws8-amp-bf16-full", QWEN3_MOE_EP, 8, precision="amp-bf16", expert_parallel=4,
           activation_checkpointing="full"),
        ep("ep-heldout2-qwen3-moe-ep2-ws4-zero2-bf16-full", QWEN3_MOE_EP, 4, precision="bf16", zero_stage=2,
           expert_parallel=2, activation_checkpointing="full"),
        ep("fsdp-moe-heldout-mixtral-wide-ws8-bf16-mixed", {**MIXTRAL_EP, "num_local_experts": 32}, 8,
           precision="bf16-mixed", seq_len=256),
        ep("fsdp-moe-heldout-deepseek-v3-ws4-fp32-full", DEEPSEEK_V3_EP, 4, precision="fp32",
           activation_checkpointing="full"),
        ep("fsdp-moe-heldout-qwen3-moe-wide-ws8-zero2-bf16", QWEN3_MOE_WIDE, 8, precision="bf16", zero_stage=2,
           seq_len=256),
        # measured after the mechanisms the runs above exposed were modelled
        ep("ep-heldout3-glm4-moe-ep4-ws8-amp-bf16-full", GLM4_MOE_EP, 8, precision="amp-bf16", expert_parallel=4,
           activation_checkpointing="full"),
        ep("ep-heldout3-mixtral-ep2-ws8-bf16-mixed-full", MIXTRAL_EP, 8, precision="bf16-mixed", expert_parallel=2,
           activation_checkpointing="full"),
        ep("ep-heldout3-deepseek-v3-ep4-ws4-bf16-full-b1-s1024", DEEPSEEK_V3_EP, 4, precision="bf16",
           expert_parallel=4, activation_checkpointing="full", micro_batch_size=1, seq_len=1024),
        ep("fsdp-moe-heldout3-glm4-moe-ws4-bf16-mixed-full", GLM4_MOE_EP, 4, precision="bf16-mixed",
           activation_checkpointing="full"),
        ep("fsdp-moe-heldout3-qwen3-moe-wide-ws4-amp-bf16", QWEN3_MOE_WIDE, 4, precision="amp-bf16", seq_len=256),
        # measured after the mechanisms the third set exposed were modelled
        ep("fsdp-moe-heldout4-deepseek-v3-ws8-bf16-mixed", DEEPSEEK_V3_EP, 8, precision="bf16-mixed"),
        ep("fsdp-moe-heldout4-mixtral-wide-ws4-fp32-full", {**MIXTRAL_EP, "num_local_experts": 32}, 4,
           precision="fp32", activation_checkpointing="full", seq_len=256),
        ep("ep-heldout4-glm4-moe-ep4-ws4-fp32", GLM4_MOE_EP, 4, precision="fp32", expert_parallel=4),
        ep("ep-heldout4-deepseek-v3-ep2-ws4-amp-bf16-full", DEEPSEEK_V3_EP, 4, precision="amp-bf16",
           expert_parallel=2, activation_checkpointing="full"),
        ep("ep-heldout4-qwen3-moe-wide-ep8-ws8-bf16-mixed-full", QWEN3_MOE_WIDE, 8, precision="bf16-mixed",
           expert_parallel=8, activation_checkpointing="full", seq_len=256),
        # measured after the experts' mid-layer reduce-scatter (and the down projection's gradient it leaves
        # alive) was modelled on the run above: one rank per expert group and others, other families
        ep("ep-heldout5-mixtral-wide-ep8-ws8-bf16-mixed-full", {**MIXTRAL_EP, "num_local_experts": 32}, 8,
           precision="bf16-mixed", expert_parallel=8, activation_checkpointing="full", seq_len=256),
        ep("ep-heldout5-qwen3-moe-wide-ep4-ws4-fp32-full", QWEN3_MOE_WIDE, 4, precision="fp32", expert_parallel=4,
           activation_checkpointing="full", seq_len=256),
        ep("ep-heldout5-deepseek-v3-ep8-ws8-bf16-mixed-full", DEEPSEEK_V3_EP, 8, precision="bf16-mixed",
           expert_parallel=8, activation_checkpointing="full"),
        ep("ep-heldout5-qwen3-moe-wide-ep8-ws8-bf16-mixed", QWEN3_MOE_WIDE, 8, precision="bf16-mixed",
           expert_parallel=8, seq_len=256),
    ]


def entries() -> list[Entry]:
    return _small_entries() + _fake_entries() + _gpu_entries() + _sharded_entries() + _expert_parallel_entries()


def _clean_up(device: str) -> None:
    """After a failed run: free what its traceback held, and a process group it left behind."""
    import gc

    import torch

    gc.collect()
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.suite", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "fake", "cuda"), required=True)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these entries")
    ap.add_argument("-o", "--output", help="append records to this JSON-lines file")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--list", action="store_true", help="print the entries for this device and exit")
    args = ap.parse_args(argv)

    chosen = [e for e in entries() if args.device in e.devices]
    if args.only:
        known = {e.name for e in entries()}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print(f"error: unknown suite entries: {', '.join(unknown)}", file=sys.stderr)
            return 2
        chosen = [e for e in chosen if e.name in args.only]
    if args.list:
        for e in chosen:
            print(e.name)
        return 0

    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import torch

    from calc.contract.scenario import Scenario
    from measure.entry import measure
    from measure.workload import UnsupportedError

    failed, skipped, started = [], [], time.perf_counter()
    for i, e in enumerate(chosen, 1):
        t0 = time.perf_counter()
        try:
            sc = Scenario.model_validate(e.scenario())
            rec = measure(sc, args.device, steps=args.steps, name=e.name, extrapolate_layers=e.extrapolate)
        except (UnsupportedError, torch.OutOfMemoryError) as exc:
            skipped.append(e.name)
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"[{i}/{len(chosen)}] {e.name}: skipped: {why}", file=sys.stderr, flush=True)
            _clean_up(args.device)
            continue
        except Exception as exc:  # noqa: BLE001 - report and go on with the rest of the suite
            failed.append(e.name)
            print(f"[{i}/{len(chosen)}] {e.name}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            _clean_up(args.device)
            continue
        line = rec.to_json_line()
        if args.output:
            with open(args.output, "a") as f:
                f.write(line + "\n")
        else:
            print(line, flush=True)
        print(f"[{i}/{len(chosen)}] {e.name}: peak {rec.peak_allocated_bytes / 2**20:.2f} MiB in {rec.peak_phase}"
              f" ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    total = time.perf_counter() - started
    print(f"{len(chosen) - len(failed) - len(skipped)} measured, {len(skipped)} skipped, {len(failed)} failed "
          f"in {total:.0f} s", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

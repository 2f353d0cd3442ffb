"""The suite's large and sharded entries: the presets (1B-70B and the 2026 families) under FakeTensorMode, some
of them on a GPU and some only there; FSDP2 and transformers' expert parallelism over a fake process group
(measure/sharded.py)."""

from __future__ import annotations

from typing import Any

from measure.suite_models import (
    DEEPSEEK_V3_EP,
    GLM4_MOE_EP,
    GLM45_AIR,
    GPT2,
    LLAMA_BIGVOCAB,
    LLAMA_GQA,
    MIXTRAL_EP,
    QWEN2,
    QWEN3_MOE_EP,
    QWEN3_MOE_WIDE,
    Entry,
    training,
)

# ---- 1B-70B presets: fake mode (and a GPU where they fit) -------------------------------------------
FAKE = ("fake",)
FAKE_AND_GPU = ("fake", "cuda")


def _fake_entries() -> list[Entry]:
    """The presets up to 70B (fake mode, and a GPU where they fit)."""
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
        Entry("llama-2-7b-lora-qv-dropout-bf16-b2-s2048", "llama-2-7b",
              {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16",
               "lora": {"rank": 16, "targets": ["q_proj", "v_proj"], "dropout": 0.05}}, devices=FAKE_AND_GPU),
        Entry("llama-3-8b-lora-qv-lm-head-dropout-amp-bf16-full-b1-s4096", "llama-3-8b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "amp-bf16", "activation_checkpointing": "full",
               "lora": {"rank": 16, "targets": ["q_proj", "v_proj", "lm_head"], "dropout": 0.1}}, devices=FAKE_AND_GPU),
        Entry("mistral-7b-lora-qv-save-lm-head-bf16-mixed-full-b2-s2048", "mistral-7b",
              {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-mixed", "activation_checkpointing": "full",
               "lora": {"rank": 16, "targets": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]}},
              devices=FAKE_AND_GPU),
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
    ]


def _fake_2026_entries() -> list[Entry]:
    """The 2026 families: MoE up to 235B, Gemma 3, gpt-oss, GLM-4.5, Llama 4 (fake mode)."""
    return [
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
        Entry("fsdp-llama-zero3-ws2-fp32", L, training(precision="fp32", zero_stage=3), hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-fp32", L, training(precision="fp32", zero_stage=3), hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero2-ws4-fp32", L, training(precision="fp32", zero_stage=2), hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-bf16-mixed", L, training(precision="bf16-mixed", zero_stage=3), hardware=gpus(4),
              devices=cpu_fake),
        Entry("fsdp-llama-zero2-ws4-bf16-mixed", L, training(precision="bf16-mixed", zero_stage=2), hardware=gpus(4),
              devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws4-amp-bf16-full", L, training(precision="amp-bf16", zero_stage=3,
                                                          activation_checkpointing="full", seq_len=512),
              hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-zero3-ws8-bf16-seq512", L, training(precision="bf16", zero_stage=3, seq_len=512),
              hardware=gpus(8), devices=cpu_fake),
        Entry("fsdp-gpt2-zero3-ws2-amp-bf16", GPT2, training(precision="amp-bf16", zero_stage=3), hardware=gpus(2),
              devices=cpu_fake),
        Entry("fsdp-qwen2-zero2-ws2-bf16", QWEN2, training(precision="bf16", zero_stage=2), hardware=gpus(2),
              devices=cpu_fake),
        Entry("fsdp-llama-vocab32k-zero3-ws4-seq1024", LLAMA_BIGVOCAB,
              {"micro_batch_size": 1, "seq_len": 1024, "precision": "bf16-mixed", "zero_stage": 3},
              hardware=gpus(4), devices=cpu_fake),
        # LoRA: the frozen base sharded beside the adapters, gradients and optimizer states for the adapters only
        Entry("fsdp-llama-lora-qv-zero3-ws2-bf16", L, training(precision="bf16", zero_stage=3, sharding="fsdp2", lora={
            "rank": 16, "targets": ["q_proj", "v_proj"]}), hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-llama-lora-all-dropout-zero3-ws4-bf16", L, training(precision="bf16", zero_stage=3,
                                                                        sharding="fsdp2", lora={"rank": 8, "dropout": 0.1}),
              hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-qwen2-lora-lm-head-zero2-ws2-bf16", QWEN2, training(precision="bf16", zero_stage=2, sharding="fsdp2",
                                                                        lora={"rank": 8, "targets": ["q_proj", "v_proj",
                                                                                                     "lm_head"]}),
              hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-llama-lora-qv-dropout-zero3-ws2-amp-bf16", L, training(precision="amp-bf16", zero_stage=3,
                                                                           sharding="fsdp2", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "dropout": 0.05}), hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-gpt2-lora-zero2-ws2-fp32", GPT2, training(precision="fp32", zero_stage=2, sharding="fsdp2",
                                                              lora={"rank": 8, "targets": ["c_attn", "c_proj"]}),
              hardware=gpus(2), devices=cpu_fake),
        Entry("fsdp-llama-lora-save-lm-head-zero3-ws2-bf16", L, training(precision="bf16", zero_stage=3,
                                                                          sharding="fsdp2", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]}), hardware=gpus(2),
              devices=cpu_fake),
        Entry("fsdp-qwen2-lora-save-embed-zero2-ws4-bf16", QWEN2, training(precision="bf16", zero_stage=2,
                                                                           sharding="fsdp2", lora={
            "rank": 8, "modules_to_save": ["embed_tokens"]}), hardware=gpus(4), devices=cpu_fake),
        Entry("fsdp-llama-lora-full-ckpt-zero3-ws4-bf16", L, training(precision="bf16", zero_stage=3, sharding="fsdp2",
                                                                      activation_checkpointing="full",
                                                                      lora={"rank": 8, "targets": "attention"}),
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
        Entry("fsdp-llama-2-7b-lora-qv-zero3-ws2-bf16-b1-s2048", "llama-2-7b",
              {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16", "zero_stage": 3, "sharding": "fsdp2",
               "lora": {"rank": 16, "targets": ["q_proj", "v_proj"], "dropout": 0.05}},
              hardware=gpus(2), devices=FAKE, extrapolate=True),
        Entry("fsdp-mistral-7b-zero3-ws16-bf16-full-b2-s4096", "mistral-7b",
              {"micro_batch_size": 2, "seq_len": 4096, "precision": "bf16", "zero_stage": 3,
               "activation_checkpointing": "full"}, hardware=gpus(16), devices=FAKE, extrapolate=True),
        Entry("fsdp-llama-2-70b-zero3-ws64-bf16-mixed-full-b1-s4096", "llama-2-70b",
              {"micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed", "zero_stage": 3,
               "activation_checkpointing": "full"}, hardware=gpus(64), devices=FAKE, extrapolate=True),
    ]


def _ep(name: str, model: dict[str, Any], gpus: int, **kw: Any) -> Entry:
    """An expert-parallel entry: FSDP2 ZeRO-3, 512 tokens, on the CPU (what the keywords do not change)."""
    return Entry(name, model, training(**{"zero_stage": 3, "sharding": "fsdp2", "seq_len": 512, **kw}),
                 hardware={"num_gpus": gpus}, devices=("cpu",))


def _expert_parallel_entries() -> list[Entry]:
    """transformers' expert parallelism (AllToAllEP) under FSDP2 over a fake process group, real CPU tensors
    (measure/sharded.py). The `ep-heldout-` entries were measured after the engine change
    (data/measured_ep_heldout.jsonl)."""
    return [
        _ep("ep-qwen3-moe-ep1-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32"),
        _ep("ep-qwen3-moe-ep2-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32", expert_parallel=2),
        _ep("ep-qwen3-moe-ep8-ws8-fp32", QWEN3_MOE_EP, 8, precision="fp32", expert_parallel=8),
        _ep("ep-qwen3-moe-ep4-ws8-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed", expert_parallel=4),
        _ep("ep-qwen3-moe-ep2-ws4-zero2-fp32", QWEN3_MOE_EP, 4, precision="fp32", zero_stage=2, expert_parallel=2),
        _ep("ep-mixtral-ep4-ws4-bf16", MIXTRAL_EP, 4, precision="bf16", expert_parallel=4),
        _ep("ep-mixtral-ep2-ws4-fp32", MIXTRAL_EP, 4, precision="fp32", expert_parallel=2),
        _ep("ep-deepseek-v3-ep8-ws8-fp32", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=8),
        _ep("ep-heldout-qwen3-moe-ep4-ws4-bf16-b1", QWEN3_MOE_EP, 4, precision="bf16", expert_parallel=4,
           micro_batch_size=1, seq_len=256),
        _ep("ep-heldout-deepseek-v3-ep2-ws4-bf16-mixed", DEEPSEEK_V3_EP, 4, precision="bf16-mixed", expert_parallel=2),
        _ep("ep-heldout-mixtral-ep8-ws8-fp32-s1024", MIXTRAL_EP, 8, precision="fp32", expert_parallel=8, seq_len=1024),
        _ep("ep-heldout-qwen3-moe-ep4-ws8-zero2-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed", zero_stage=2,
           expert_parallel=4),
        _ep("ep-heldout-deepseek-v3-ep4-ws8-fp32-full", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=4,
           activation_checkpointing="full"),
        # measured after the FSDP2 input cast of the experts module was modelled
        _ep("ep-heldout-mixtral-ep4-ws8-bf16-mixed", MIXTRAL_EP, 8, precision="bf16-mixed", expert_parallel=4),
        _ep("ep-heldout-glm4-moe-ep2-ws2-zero2-fp32", GLM4_MOE_EP, 2, precision="fp32", zero_stage=2,
           expert_parallel=2),
        _ep("ep-heldout-qwen3-moe-ep4-ws4-amp-bf16", QWEN3_MOE_EP, 4, precision="amp-bf16", expert_parallel=4),
        # full checkpointing under EP, measured last
        _ep("ep-heldout-qwen3-moe-ep2-ws8-bf16-full", QWEN3_MOE_EP, 8, precision="bf16", expert_parallel=2,
           activation_checkpointing="full"),
        # FSDP2 + MoE without EP: the runs that traced the FSDP2 backward terms (data/measured_cpu.jsonl)
        _ep("fsdp-moe-qwen3-moe-ws8-bf16-mixed", QWEN3_MOE_EP, 8, precision="bf16-mixed"),
        _ep("fsdp-moe-qwen3-moe-ws4-amp-bf16-full", QWEN3_MOE_EP, 4, precision="amp-bf16",
           activation_checkpointing="full"),
        _ep("fsdp-moe-qwen3-moe-wide-ws4-bf16-mixed", QWEN3_MOE_WIDE, 4, precision="bf16-mixed", seq_len=256),
        _ep("fsdp-moe-qwen3-moe-wide-ws4-amp-bf16-full", QWEN3_MOE_WIDE, 4, precision="amp-bf16",
           activation_checkpointing="full", seq_len=256),
    ]


def _expert_parallel_heldout_entries() -> list[Entry]:
    """Expert and FSDP2 MoE entries measured after each later engine change, each set held out from the last."""
    return [
        # measured after the engine modelled the checkpoint's early stop, the MoE locals and FSDP2's backward
        # buffers (data/measured_ep_heldout.jsonl)
        _ep("ep-heldout2-glm4-moe-ep2-ws4-bf16-full", GLM4_MOE_EP, 4, precision="bf16", expert_parallel=2,
           activation_checkpointing="full"),
        _ep("ep-heldout2-deepseek-v3-ep2-ws8-bf16-mixed-full", DEEPSEEK_V3_EP, 8, precision="bf16-mixed",
           expert_parallel=2, activation_checkpointing="full"),
        _ep("ep-heldout2-deepseek-v3-ep8-ws8-fp32-full", DEEPSEEK_V3_EP, 8, precision="fp32", expert_parallel=8,
           activation_checkpointing="full"),
        _ep("ep-heldout2-mixtral-ep4-ws8-fp32-full", MIXTRAL_EP, 8, precision="fp32", expert_parallel=4,
           activation_checkpointing="full"),
        _ep("ep-heldout2-qwen3-moe-ep4-ws8-amp-bf16-full", QWEN3_MOE_EP, 8, precision="amp-bf16", expert_parallel=4,
           activation_checkpointing="full"),
        _ep("ep-heldout2-qwen3-moe-ep2-ws4-zero2-bf16-full", QWEN3_MOE_EP, 4, precision="bf16", zero_stage=2,
           expert_parallel=2, activation_checkpointing="full"),
        _ep("fsdp-moe-heldout-mixtral-wide-ws8-bf16-mixed", {**MIXTRAL_EP, "num_local_experts": 32}, 8,
           precision="bf16-mixed", seq_len=256),
        _ep("fsdp-moe-heldout-deepseek-v3-ws4-fp32-full", DEEPSEEK_V3_EP, 4, precision="fp32",
           activation_checkpointing="full"),
        _ep("fsdp-moe-heldout-qwen3-moe-wide-ws8-zero2-bf16", QWEN3_MOE_WIDE, 8, precision="bf16", zero_stage=2,
           seq_len=256),
        # measured after the mechanisms the runs above exposed were modelled
        _ep("ep-heldout3-glm4-moe-ep4-ws8-amp-bf16-full", GLM4_MOE_EP, 8, precision="amp-bf16", expert_parallel=4,
           activation_checkpointing="full"),
        _ep("ep-heldout3-mixtral-ep2-ws8-bf16-mixed-full", MIXTRAL_EP, 8, precision="bf16-mixed", expert_parallel=2,
           activation_checkpointing="full"),
        _ep("ep-heldout3-deepseek-v3-ep4-ws4-bf16-full-b1-s1024", DEEPSEEK_V3_EP, 4, precision="bf16",
           expert_parallel=4, activation_checkpointing="full", micro_batch_size=1, seq_len=1024),
        _ep("fsdp-moe-heldout3-glm4-moe-ws4-bf16-mixed-full", GLM4_MOE_EP, 4, precision="bf16-mixed",
           activation_checkpointing="full"),
        _ep("fsdp-moe-heldout3-qwen3-moe-wide-ws4-amp-bf16", QWEN3_MOE_WIDE, 4, precision="amp-bf16", seq_len=256),
        # measured after the mechanisms the third set exposed were modelled
        _ep("fsdp-moe-heldout4-deepseek-v3-ws8-bf16-mixed", DEEPSEEK_V3_EP, 8, precision="bf16-mixed"),
        _ep("fsdp-moe-heldout4-mixtral-wide-ws4-fp32-full", {**MIXTRAL_EP, "num_local_experts": 32}, 4,
           precision="fp32", activation_checkpointing="full", seq_len=256),
        _ep("ep-heldout4-glm4-moe-ep4-ws4-fp32", GLM4_MOE_EP, 4, precision="fp32", expert_parallel=4),
        _ep("ep-heldout4-deepseek-v3-ep2-ws4-amp-bf16-full", DEEPSEEK_V3_EP, 4, precision="amp-bf16",
           expert_parallel=2, activation_checkpointing="full"),
        _ep("ep-heldout4-qwen3-moe-wide-ep8-ws8-bf16-mixed-full", QWEN3_MOE_WIDE, 8, precision="bf16-mixed",
           expert_parallel=8, activation_checkpointing="full", seq_len=256),
        # measured after the experts' mid-layer reduce-scatter (and the down projection's gradient it leaves
        # alive) was modelled on the run above: one rank per expert group and others, other families
        _ep("ep-heldout5-mixtral-wide-ep8-ws8-bf16-mixed-full", {**MIXTRAL_EP, "num_local_experts": 32}, 8,
           precision="bf16-mixed", expert_parallel=8, activation_checkpointing="full", seq_len=256),
        _ep("ep-heldout5-qwen3-moe-wide-ep4-ws4-fp32-full", QWEN3_MOE_WIDE, 4, precision="fp32", expert_parallel=4,
           activation_checkpointing="full", seq_len=256),
        _ep("ep-heldout5-deepseek-v3-ep8-ws8-bf16-mixed-full", DEEPSEEK_V3_EP, 8, precision="bf16-mixed",
           expert_parallel=8, activation_checkpointing="full"),
        _ep("ep-heldout5-qwen3-moe-wide-ep8-ws8-bf16-mixed", QWEN3_MOE_WIDE, 8, precision="bf16-mixed",
           expert_parallel=8, seq_len=256),
    ]


def _optimizer_in_backward_entries() -> list[Entry]:
    """optimizer_in_backward on presets (fake), where a gradient hook's step is the peak: the lm_head's (Pythia),
    the top layer's fused experts (Qwen3-MoE, Mixtral: one 3-D tensor larger than the embedding)."""
    full = {"micro_batch_size": 1, "activation_checkpointing": "full", "optimizer_in_backward": True}
    return [
        Entry("pythia-160m-fp32-full-b1-s128-optim-in-bwd", "pythia-160m",
              {**full, "seq_len": 128, "precision": "fp32"}, devices=FAKE),
        Entry("pythia-160m-bf16-full-b1-s128-optim-in-bwd", "pythia-160m",
              {**full, "seq_len": 128, "precision": "bf16"}, devices=FAKE),
        Entry("qwen3-30b-a3b-bf16-full-b1-s32-optim-in-bwd-extrapolated", "qwen3-30b-a3b",
              {**full, "seq_len": 32, "precision": "bf16"}, devices=FAKE, extrapolate=True),
        Entry("mixtral-8x7b-bf16-full-b1-s32-optim-in-bwd-extrapolated", "mixtral-8x7b",
              {**full, "seq_len": 32, "precision": "bf16"}, devices=FAKE, extrapolate=True),
    ]


def preset_entries() -> list[Entry]:
    """The presets: fake mode, and a GPU where they fit or only there."""
    return _fake_entries() + _fake_2026_entries() + _gpu_entries() + _optimizer_in_backward_entries()


def sharded_entries() -> list[Entry]:
    """FSDP2, with and without transformers' expert parallelism, over a fake process group."""
    return _sharded_entries() + _expert_parallel_entries() + _expert_parallel_heldout_entries()

"""The suite's small entries (hidden 64-256, 2-6 layers): every family at four precisions, then Llama through
every option the engine branches on, the other families' own mechanisms, and the held-out sets. They run in
seconds on two CPU cores and on any GPU."""

from __future__ import annotations

from measure.suite_models import (
    DEEPSEEK_NO_QLORA,
    DEEPSEEK_V2,
    DEEPSEEK_V3,
    FAMILIES,
    GEMMA2,
    GEMMA3,
    GLM4_MOE,
    GPT2,
    GPT_NEOX,
    GPT_OSS,
    LLAMA4,
    LLAMA_BIGVOCAB,
    LLAMA_GQA,
    LLAMA_TIED,
    MISTRAL_WINDOW,
    MIXTRAL,
    PHI3,
    PHI3_WINDOW,
    QWEN2,
    QWEN2_WINDOW,
    QWEN3_MOE,
    Entry,
    training,
)


def small_entries() -> list[Entry]:
    return (_family_entries() + _precision_entries() + _attention_checkpoint_entries() + _inference_lora_shape_entries()
            + _other_family_entries() + _adapter_and_heldout_entries() + _mask_entries() + _keep_outputs_entries()
            + _gemma3_entries() + _loop_mechanism_entries() + _generate_entries())


def _family_entries() -> list[Entry]:
    """Every family x four precisions / modes."""
    out: list[Entry] = []
    for fam, cfg in FAMILIES.items():
        attn = {"attention": "eager"} if fam == "gemma2" else {}  # transformers 5.23: gemma2 has no SDPA path
        out += [
            Entry(f"{fam}-fp32-adamw-foreach", cfg, training(precision="fp32", **attn)),
            Entry(f"{fam}-amp-bf16", cfg, training(precision="amp-bf16", **attn)),
            Entry(f"{fam}-bf16-mixed", cfg, training(precision="bf16-mixed", **attn)),
            Entry(f"{fam}-inference-bf16", cfg, training(precision="bf16", **attn), mode="inference"),
        ]
    return out


def _precision_entries() -> list[Entry]:
    """Llama with each precision, optimizer and optimizer implementation."""
    L = LLAMA_GQA
    return [
        # precisions
        Entry("llama-bf16-adamw", L, training(precision="bf16")),
        Entry("llama-amp-fp16-gradscaler", L, training(precision="amp-fp16")),
        Entry("llama-fp16-mixed", L, training(precision="fp16-mixed")),
        # optimizers and their implementations
        Entry("llama-fp32-adam", L, training(precision="fp32", optimizer="adam")),
        Entry("llama-fp32-sgd", L, training(precision="fp32", optimizer="sgd")),
        Entry("llama-fp32-sgd-momentum", L, training(precision="fp32", optimizer="sgd-momentum")),
        Entry("llama-fp32-adafactor-foreach", L, training(precision="fp32", optimizer="adafactor")),
        Entry("llama-fp32-adafactor-for-loop", L, training(precision="fp32", optimizer="adafactor",
                                                     optimizer_impl="for-loop")),
        Entry("llama-fp32-adamw-for-loop", L, training(precision="fp32", optimizer_impl="for-loop")),
        Entry("llama-fp32-adamw-fused", L, training(precision="fp32", optimizer_impl="fused")),
        Entry("llama-fp32-adam-fused", L, training(precision="fp32", optimizer="adam", optimizer_impl="fused")),
        Entry("llama-fp32-sgd-momentum-fused", L, training(precision="fp32", optimizer="sgd-momentum",
                                                     optimizer_impl="fused")),
        Entry("llama-fp32-sgd-momentum-for-loop", L, training(precision="fp32", optimizer="sgd-momentum",
                                                        optimizer_impl="for-loop")),
        Entry("llama-bf16-mixed-adamw-for-loop", L, training(precision="bf16-mixed", optimizer_impl="for-loop")),
        Entry("llama-bf16-adamw-fused", L, training(precision="bf16", optimizer_impl="fused")),
    ]


def _attention_checkpoint_entries() -> list[Entry]:
    """Llama with each attention kernel, checkpointing granularity and accumulation."""
    L = LLAMA_GQA
    return [
        # attention
        Entry("llama-fp32-eager", L, training(precision="fp32", attention="eager")),
        Entry("llama-amp-bf16-eager", L, training(precision="amp-bf16", attention="eager")),
        Entry("llama-bf16-eager-seq512", L, training(precision="bf16", attention="eager", seq_len=512)),
        Entry("llama-bf16-sdpa-seq512", L, training(precision="bf16", seq_len=512)),
        # activation checkpointing
        Entry("llama-fp32-full", L, training(precision="fp32", activation_checkpointing="full", seq_len=512)),
        Entry("llama-fp32-full-every2", L, training(precision="fp32", activation_checkpointing="full",
                                              checkpoint_every=2, seq_len=512)),
        Entry("llama-bf16-mixed-full-every2", L, training(precision="bf16-mixed", activation_checkpointing="full",
                                                    checkpoint_every=2, seq_len=256)),
        Entry("llama-amp-bf16-full", L, training(precision="amp-bf16", activation_checkpointing="full", seq_len=512)),
        Entry("llama-fp32-selective-sdpa", L, training(precision="fp32", activation_checkpointing="selective",
                                                 seq_len=512)),
        Entry("llama-fp32-selective-eager", L, training(precision="fp32", activation_checkpointing="selective",
                                                  attention="eager", seq_len=512)),
        Entry("llama-fp32-none-seq512", L, training(precision="fp32", seq_len=512)),
        # gradient accumulation
        Entry("llama-fp32-accum2", L, training(precision="fp32", gradient_accumulation_steps=2)),
        Entry("llama-amp-bf16-accum2", L, training(precision="amp-bf16", gradient_accumulation_steps=2, seq_len=256)),
        Entry("llama-bf16-mixed-accum2", L, training(precision="bf16-mixed", gradient_accumulation_steps=2)),
    ]


def _inference_lora_shape_entries() -> list[Entry]:
    """Llama in inference, with LoRA, at other shapes and long sequences."""
    L = LLAMA_GQA
    return [
        # inference
        Entry("llama-inference-fp32", L, training(precision="fp32"), mode="inference"),
        Entry("llama-inference-amp-bf16", L, training(precision="amp-bf16"), mode="inference"),
        Entry("llama-inference-bf16-eager-b4", L, training(precision="bf16", attention="eager", micro_batch_size=4,
                                                     seq_len=256), mode="inference"),
        # LoRA (bf16 frozen base)
        Entry("llama-lora-all-linear-amp-bf16", L, training(precision="amp-bf16", lora={"rank": 8})),
        Entry("llama-lora-attention-bf16", L, training(precision="bf16", lora={"rank": 16, "targets": "attention"})),
        Entry("llama-lora-full-ckpt-bf16-mixed", L, training(precision="bf16-mixed", lora={"rank": 8},
                                                       activation_checkpointing="full", seq_len=512)),
        Entry("llama-lora-inference", L, training(precision="bf16", lora={"rank": 8}), mode="inference"),
        # LoRA as people configure it: module-name targets (peft's q_proj + v_proj default, each family's own
        # names, lm_head), lora_dropout
        Entry("llama-lora-qv-bf16", L, training(precision="bf16", lora={"rank": 16, "targets": ["q_proj", "v_proj"]})),
        Entry("llama-lora-qv-dropout-amp-bf16", L, training(precision="amp-bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "dropout": 0.05})),
        Entry("llama-lora-all-dropout-fp32", L, training(precision="fp32", lora={
            "rank": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "dropout": 0.1})),
        Entry("llama-lora-lm-head-bf16", L, training(precision="bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj", "lm_head"], "dropout": 0.1})),
        Entry("gpt2-lora-c-attn-c-proj-fp32", GPT2, training(precision="fp32", lora={
            "rank": 8, "targets": ["c_attn", "c_proj"], "dropout": 0.05})),
        Entry("qwen2-lora-qv-lm-head-bf16", QWEN2, training(precision="bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj", "lm_head"]})),
        Entry("phi3-lora-qkv-gate-up-dropout-bf16-mixed", PHI3, training(precision="bf16-mixed", lora={
            "rank": 8, "targets": ["qkv_proj", "gate_up_proj"], "dropout": 0.1})),
        Entry("deepseek-v3-lora-mla-names-dropout-bf16", DEEPSEEK_V3, training(precision="bf16", lora={
            "rank": 8, "targets": ["q_a_proj", "kv_b_proj", "o_proj"], "dropout": 0.05})),
        Entry("neox-lora-names-lm-head-amp-bf16", GPT_NEOX, training(precision="amp-bf16", lora={
            "rank": 8, "targets": ["query_key_value", "dense_h_to_4h", "lm_head"], "dropout": 0.1})),
        Entry("gemma2-lora-lm-head-softcap-eager-bf16", GEMMA2, training(precision="bf16", attention="eager", lora={
            "rank": 8, "targets": ["q_proj", "down_proj", "lm_head"]})),
        # one factor of a product needs no gradient in the first layer (its input needs none): one side adapted
        Entry("gemma2-lora-q-only-eager-bf16", GEMMA2, training(precision="bf16", attention="eager", lora={
            "rank": 8, "targets": ["q_proj"]})),
        Entry("llama-lora-up-only-eager-fp32", L, training(precision="fp32", attention="eager", lora={
            "rank": 8, "targets": ["up_proj"]})),
        # modules_to_save: peft's trainable copies beside the frozen originals (tied embeddings untied)
        Entry("llama-lora-qv-save-lm-head-bf16", L, training(precision="bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]})),
        Entry("llama-lora-save-embed-lm-head-bf16-mixed", L, training(precision="bf16-mixed", lora={
            "rank": 8, "modules_to_save": ["embed_tokens", "lm_head"]})),
        Entry("qwen2-tied-lora-save-lm-head-bf16", QWEN2, training(precision="bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"], "dropout": 0.05})),
        Entry("gpt2-tied-lora-save-wte-bf16", GPT2, training(precision="bf16", lora={
            "rank": 8, "targets": ["c_attn"], "modules_to_save": ["wte"]})),
        Entry("llama-lora-qv-save-lm-head-amp-bf16", L, training(precision="amp-bf16", lora={
            "rank": 8, "targets": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]})),
        Entry("qwen2-tied-lora-save-embed-lm-head-fp32-adafactor", QWEN2, training(
            precision="fp32", optimizer="adafactor", lora={"rank": 8, "modules_to_save": ["embed_tokens", "lm_head"]})),
        Entry("llama-lora-save-embed-full-ckpt-bf16", L, training(precision="bf16", activation_checkpointing="full",
                                                                  lora={"rank": 8, "targets": "attention",
                                                                        "modules_to_save": ["embed_tokens"]})),
        Entry("llama-lora-qv-dropout-full-ckpt-bf16", L, training(precision="bf16", activation_checkpointing="full",
                                                                  lora={"rank": 8, "targets": ["q_proj", "v_proj"],
                                                                        "dropout": 0.05})),
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
    ]


def _other_family_entries() -> list[Entry]:
    """The other families beyond the base four: their own mechanisms (MLA, sinks, shared experts, ...)."""
    return [
        # other families beyond the base four
        Entry("gpt2-dropout-full", GPT2, training(precision="fp32", activation_checkpointing="full", seq_len=512)),
        Entry("gpt2-dropout-selective-eager", GPT2, training(precision="amp-bf16", activation_checkpointing="selective",
                                                       attention="eager")),
        Entry("gpt2-dropout-eager-fp32", GPT2, training(precision="fp32", attention="eager", seq_len=512)),
        Entry("gpt2-dropout-sgd-for-loop", GPT2, training(precision="fp32", optimizer="sgd", optimizer_impl="for-loop")),
        Entry("gpt-neox-full-every2", GPT_NEOX, training(precision="bf16-mixed", activation_checkpointing="full",
                                                   checkpoint_every=2, seq_len=512)),
        Entry("qwen2-selective", QWEN2, training(precision="amp-bf16", activation_checkpointing="selective",
                                           seq_len=512)),
        Entry("phi3-eager-amp-bf16", PHI3, training(precision="amp-bf16", attention="eager", seq_len=256)),
        Entry("gemma2-full-eager", GEMMA2, training(precision="bf16", attention="eager",
                                             activation_checkpointing="full", seq_len=256)),
        Entry("mixtral-full", MIXTRAL, training(precision="fp32", activation_checkpointing="full", seq_len=256)),
        Entry("mixtral-accum2-bf16", MIXTRAL, training(precision="bf16", gradient_accumulation_steps=2)),
        Entry("deepseek-v3-eager-bf16", DEEPSEEK_V3, training(precision="bf16", attention="eager")),
        Entry("deepseek-v3-sdpa-amp-bf16", DEEPSEEK_V3, training(precision="amp-bf16")),
        Entry("deepseek-v3-sdpa-fp32", DEEPSEEK_V3, training(precision="fp32")),
        Entry("deepseek-v3-full-keep-bf16-seq512", DEEPSEEK_V3, training(precision="bf16", activation_checkpointing="full",
                                                                   keep_outputs=True, seq_len=512)),
        Entry("deepseek-v3-inference-eager-bf16", DEEPSEEK_V3, training(precision="bf16", attention="eager"),
              mode="inference"),
        Entry("deepseek-noqlora-eager-bf16-seq512", DEEPSEEK_NO_QLORA, {"micro_batch_size": 1, "seq_len": 512,
                                                                        "precision": "bf16", "attention": "eager"}),
        Entry("deepseek-noqlora-sdpa-amp-bf16-seq512", DEEPSEEK_NO_QLORA, {"micro_batch_size": 1, "seq_len": 512,
                                                                           "precision": "amp-bf16"}),
        Entry("deepseek-v2-eager-bf16", DEEPSEEK_V2, training(precision="bf16", attention="eager")),
        Entry("deepseek-v2-sdpa-amp-bf16-seq512", DEEPSEEK_V2, training(precision="amp-bf16", seq_len=512)),
        Entry("deepseek-v2-full-keep-fp32", DEEPSEEK_V2, training(precision="fp32", activation_checkpointing="full",
                                                            keep_outputs=True)),
        Entry("gpt-oss-eager-bf16", GPT_OSS, training(precision="bf16", attention="eager")),
        Entry("gpt-oss-eager-fp32", GPT_OSS, training(precision="fp32", attention="eager")),
        Entry("gpt-oss-eager-amp-bf16-seq256", GPT_OSS, training(precision="amp-bf16", attention="eager", seq_len=256)),
        Entry("gpt-oss-eager-bf16-full-keep", GPT_OSS, training(precision="bf16", attention="eager",
                                                          activation_checkpointing="full", keep_outputs=True)),
        Entry("gpt-oss-inference-eager-bf16", GPT_OSS, training(precision="bf16", attention="eager"), mode="inference"),
    ]


def _adapter_and_heldout_entries() -> list[Entry]:
    """LoRA on MLA and MoE layers, and the held-out entries measured after the engine changes."""
    return [
        # LoRA on MLA (q_a / q_b / kv_a_proj_with_mqa / kv_b / o) and on sigmoid-router MoE layers
        Entry("deepseek-v3-lora-attention-bf16", DEEPSEEK_V3, training(precision="bf16", lora={"rank": 8,
                                                                                         "targets": "attention"})),
        Entry("deepseek-v2-lora-attention-amp-bf16", DEEPSEEK_V2, training(precision="amp-bf16", lora={"rank": 8,
                                                                                                 "targets": "attention"})),
        Entry("deepseek-noqlora-lora-attention-full-ckpt-fp32", DEEPSEEK_NO_QLORA,
              training(precision="fp32", activation_checkpointing="full", lora={"rank": 8, "targets": "attention"})),
        Entry("glm4-moe-lora-attention-bf16-mixed", GLM4_MOE, training(precision="bf16-mixed", lora={"rank": 8,
                                                                                               "targets": "attention"})),
        # held out: measured after the frozen-embedding, Phi-3 window and Qwen window-layer changes
        Entry("heldout-phi3-window-lora-all-linear-fp32", PHI3_WINDOW, training(precision="fp32", seq_len=96,
                                                                           lora={"rank": 8})),
        Entry("heldout-qwen2-window-layers-sdpa-bf16", QWEN2_WINDOW, training(precision="bf16", seq_len=96)),
        Entry("heldout-qwen2-window-layers-eager-amp-bf16", QWEN2_WINDOW, training(precision="amp-bf16", seq_len=96,
                                                                              attention="eager")),
        Entry("heldout-mistral-lora-attention-bf16-window", MISTRAL_WINDOW, training(precision="bf16", lora={"rank": 4,
                                                                                "targets": "attention"})),
        Entry("llama4-sdpa-bf16-past-chunk", LLAMA4, training(precision="bf16", seq_len=160)),
        Entry("llama4-sdpa-amp-bf16", LLAMA4, training(precision="amp-bf16")),
        Entry("llama4-eager-fp32-past-chunk", LLAMA4, training(precision="fp32", attention="eager", seq_len=96)),
        Entry("llama4-full-ckpt-bf16-mixed", LLAMA4, training(precision="bf16-mixed", activation_checkpointing="full")),
        Entry("llama4-lora-attention-amp-bf16", LLAMA4, training(precision="amp-bf16", lora={"rank": 8,
                                                                                      "targets": "attention"})),
        Entry("llama4-inference-bf16", LLAMA4, training(precision="bf16"), mode="inference"),
        Entry("glm4-moe-full-every2-bf16", GLM4_MOE, training(precision="bf16", activation_checkpointing="full",
                                                       checkpoint_every=2, seq_len=256)),
        Entry("qwen3-moe-keep-amp-bf16", QWEN3_MOE, training(precision="amp-bf16", keep_outputs=True)),
    ]



def _gemma3_entries() -> list[Entry]:
    """Gemma 3: local (sliding) and global layers differ once the sequence reaches the window."""
    G = GEMMA3
    return [
        Entry("gemma3-sdpa-fp32-below-window", G, training(precision="fp32", seq_len=32)),
        Entry("gemma3-sdpa-bf16-past-window", G, training(precision="bf16")),
        Entry("gemma3-sdpa-amp-bf16-past-window", G, training(precision="amp-bf16")),
        Entry("gemma3-eager-bf16-mixed", G, training(precision="bf16-mixed", attention="eager")),
        Entry("gemma3-sdpa-bf16-full-past-window", G, training(precision="bf16", activation_checkpointing="full",
                                                         seq_len=256)),
        Entry("gemma3-sdpa-bf16-keep-past-window", G, training(precision="bf16", keep_outputs=True)),
        Entry("gemma3-inference-bf16-past-window", G, training(precision="bf16"), mode="inference"),
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
        Entry("llama-keep-fp32-seq512", L, training(precision="fp32", seq_len=512, **keep)),
        Entry("llama-keep-bf16-accum2", L, training(precision="bf16", gradient_accumulation_steps=2, **keep)),
        Entry("llama-keep-fp32-selective-seq512", L, training(precision="fp32", activation_checkpointing="selective",
                                                        seq_len=512, **keep)),
        Entry("llama-keep-bf16-mixed-b1-seq32", L, {"micro_batch_size": 1, "seq_len": 32, "precision": "bf16-mixed",
                                                    **keep}),
        Entry("gemma2-keep-amp-bf16-eager", GEMMA2, training(precision="amp-bf16", attention="eager", **keep)),
        Entry("mixtral-keep-bf16", MIXTRAL, training(precision="bf16", **keep)),
        Entry("gpt2-keep-fp32", GPT2, training(precision="fp32", **keep)),
        Entry("phi3-keep-amp-bf16", PHI3, training(precision="amp-bf16", **keep)),
    ]


def _mask_entries() -> list[Entry]:
    """Attention masks kept by checkpointing (eager) and sliding windows under SDPA at and past the window."""
    L, W = LLAMA_GQA, MISTRAL_WINDOW
    return [
        Entry("llama-eager-full-fp32-seq512", L, training(precision="fp32", attention="eager",
                                                    activation_checkpointing="full", seq_len=512)),
        Entry("llama-eager-full-every2-bf16-seq512", L, training(precision="bf16", attention="eager",
                                                           activation_checkpointing="full", checkpoint_every=2,
                                                           seq_len=512)),
        Entry("gemma2-eager-full-amp-bf16-seq256", GEMMA2, training(precision="amp-bf16", attention="eager",
                                                              activation_checkpointing="full", seq_len=256)),
        Entry("mistral-window-sdpa-fp32-seq256", W, training(precision="fp32", seq_len=256)),
        Entry("mistral-window-sdpa-amp-bf16-seq256", W, training(precision="amp-bf16", seq_len=256)),
        Entry("mistral-window-sdpa-bf16-at-window", W, training(precision="bf16", seq_len=64)),
        Entry("mistral-window-sdpa-bf16-full-seq256", W, training(precision="bf16", activation_checkpointing="full",
                                                           seq_len=256)),
        Entry("mistral-window-eager-bf16-seq256", W, training(precision="bf16", attention="eager", seq_len=256)),
        Entry("mistral-window-sdpa-bf16-selective-seq256", W, training(precision="bf16",
                                                                activation_checkpointing="selective", seq_len=256)),
    ]


def _loop_mechanism_entries() -> list[Entry]:
    """The loop's memory mechanisms (torchtune's recipes ship both): optimizer_in_backward, with and without full
    checkpointing, on three families at three precisions; then on 32 tokens, where the weights outweigh the
    activations and the peak is a gradient hook's step (each optimizer implementation's temporaries)."""
    out: list[Entry] = []
    families = (("llama", LLAMA_GQA), ("gpt2", GPT2), ("qwen2", QWEN2))
    for fam, cfg in families:
        for precision in ("fp32", "bf16", "amp-bf16"):
            loop = {"precision": precision, "optimizer_in_backward": True}
            out += [
                Entry(f"{fam}-{precision}-optim-in-bwd", cfg, training(**loop)),
                Entry(f"{fam}-{precision}-full-optim-in-bwd", cfg,
                      training(**loop, activation_checkpointing="full", seq_len=256)),
            ]
    short = {"micro_batch_size": 1, "seq_len": 32, "optimizer_in_backward": True}
    for fam, cfg in families:
        out += [Entry(f"{fam}-{name}-optim-in-bwd-seq32", cfg, training(**short, **kw)) for name, kw in (
            ("fp32", {"precision": "fp32"}), ("bf16", {"precision": "bf16"}), ("amp-bf16", {"precision": "amp-bf16"}),
            ("fp32-for-loop", {"precision": "fp32", "optimizer_impl": "for-loop"}),
            ("fp32-full", {"precision": "fp32", "activation_checkpointing": "full"}))]
    out += [Entry(f"llama-{name}-optim-in-bwd-seq32", LLAMA_GQA, training(**short, **kw)) for name, kw in (
        ("fp32-adafactor", {"precision": "fp32", "optimizer": "adafactor"}),
        ("fp32-sgd-momentum", {"precision": "fp32", "optimizer": "sgd-momentum"}))]
    return out


def _generate_entries() -> list[Entry]:
    """model.generate: a prompt-dominated and a decode-dominated length, dynamic and static caches, eager, and the
    families whose caches differ (GPT-2's fused projection, tied Qwen2, sliding-window Mistral, Gemma 2 and 3).
    Short generations: MemTracker sees every op of every decode step (run them with --steps 1)."""
    L, bf16 = LLAMA_GQA, {"precision": "bf16"}
    long_decode = training(seq_len=16, **bf16)

    def gen(name: str, model: dict, tr: dict, **inference: object) -> Entry:
        return Entry(name, model, tr, mode="inference", inference={"new_tokens": 96, **inference})

    return [
        gen("llama-generate-bf16", L, training(**bf16), new_tokens=16),
        gen("llama-generate-bf16-long-decode", L, long_decode),
        gen("llama-generate-bf16-static", L, long_decode, kv_cache="static"),
        gen("llama-generate-bf16-static-prompt", L, training(**bf16), new_tokens=16, kv_cache="static"),
        gen("llama-generate-eager-b4", L, training(attention="eager", micro_batch_size=4, seq_len=32, **bf16),
            new_tokens=64),
        gen("llama-generate-fp32", L, training(precision="fp32", seq_len=16), new_tokens=64),
        gen("llama-generate-amp-bf16", L, training(precision="amp-bf16", seq_len=16), new_tokens=64),
        gen("gpt2-generate-bf16", GPT2, long_decode),
        gen("qwen2-generate-bf16", QWEN2, long_decode),
        gen("mistral-window-generate-bf16", MISTRAL_WINDOW, training(seq_len=32, **bf16), new_tokens=64),
        gen("mistral-window-generate-bf16-static", MISTRAL_WINDOW, training(seq_len=32, **bf16), new_tokens=64,
            kv_cache="static"),
        gen("gemma2-generate-bf16", GEMMA2, training(attention="eager", seq_len=32, **bf16), new_tokens=64),
        gen("gemma3-generate-bf16", GEMMA3, training(seq_len=32, **bf16), new_tokens=64),
        gen("gemma3-generate-bf16-past-window-prompt", GEMMA3, training(**bf16), new_tokens=8),
        # inference.weights plain: the model built in that dtype whatever the training precision says
        gen("llama-generate-weights-fp32", L, training(precision="amp-bf16", seq_len=16), new_tokens=64,
            weights="fp32"),
        gen("llama-generate-weights-fp16", L, training(precision="amp-bf16", seq_len=16), new_tokens=64,
            weights="fp16"),
        # held out: measured once the generation model stood, not tuned on
        gen("heldout-generate-qwen2-static-eager-b3", QWEN2, training(attention="eager", micro_batch_size=3,
                                                                      seq_len=24, **bf16), new_tokens=40,
            kv_cache="static"),
        gen("heldout-generate-gpt2-fp32-static", GPT2, training(precision="fp32", seq_len=20), new_tokens=48,
            kv_cache="static"),
        gen("heldout-generate-phi3-window", PHI3_WINDOW, training(seq_len=24, **bf16), new_tokens=64),
        gen("heldout-generate-llama-tied-amp-eager-b1", LLAMA_TIED, training(precision="amp-bf16", attention="eager",
                                                                           micro_batch_size=1, seq_len=40),
            new_tokens=48),
        gen("heldout-generate-gemma3-static", GEMMA3, training(seq_len=32, **bf16), new_tokens=48, kv_cache="static"),
        gen("heldout-generate-mixtral", MIXTRAL, training(seq_len=16, **bf16), new_tokens=32),
    ]

"""The suite's quantized-base and bitsandbytes-optimizer entries: QLoRA (nf4 / fp4, double quant) and LLM.int8
LoRA on small Llama, Qwen2 (tied embeddings) and GPT-2 (Conv1D) models, a plain fp16 frozen base, and
bitsandbytes' AdamW8bit / PagedAdamW / PagedAdamW8bit. bitsandbytes quantizes and runs these on CPU and on CUDA;
not under FakeTensorMode (it needs real tensors)."""

from __future__ import annotations

from measure.suite_models import GPT2, LLAMA_GQA, QWEN2, SMALL, Entry, training


def qlora_entries() -> list[Entry]:
    return _quantized_base_entries() + _optimizer_entries()


def _quantized_base_entries() -> list[Entry]:
    out: list[Entry] = []
    for fam, cfg in (("llama", LLAMA_GQA), ("qwen2", QWEN2), ("gpt2", GPT2)):
        out += [
            Entry(f"{fam}-qlora-nf4-bf16", cfg, training(precision="bf16", lora={"rank": 8, "base_weights": "nf4"}),
                  devices=SMALL),
            Entry(f"{fam}-qlora-nf4-double-quant-amp-bf16", cfg, training(
                precision="amp-bf16", lora={"rank": 8, "base_weights": "nf4", "double_quant": True}), devices=SMALL),
            Entry(f"{fam}-qlora-fp4-bf16", cfg, training(precision="bf16", lora={"rank": 8, "base_weights": "fp4"}),
                  devices=SMALL),
            Entry(f"{fam}-lora-int8-bf16", cfg, training(precision="bf16", lora={"rank": 8, "base_weights": "int8"}),
                  devices=SMALL),
        ]
    L = LLAMA_GQA
    return out + [
        Entry("llama-qlora-fp4-double-quant-attention-fp32", L, training(
            precision="fp32", lora={"rank": 16, "targets": "attention", "base_weights": "fp4", "double_quant": True}),
            devices=SMALL),
        Entry("llama-qlora-nf4-full-ckpt-bf16-seq512", L, training(
            precision="bf16", seq_len=512, activation_checkpointing="full", lora={"rank": 8, "base_weights": "nf4"}),
            devices=SMALL),
        Entry("llama-lora-fp16-base-amp-fp16", L, training(precision="amp-fp16", lora={"rank": 8,
                                                                                        "base_weights": "fp16"})),
    ]


def _optimizer_entries() -> list[Entry]:
    L = LLAMA_GQA
    out = [Entry(f"llama-{opt}-{p}", L, training(precision=p, optimizer=opt), devices=SMALL)
           for opt in ("adamw-8bit", "paged-adamw", "paged-adamw-8bit") for p in ("fp32", "bf16")]
    return out + [Entry("llama-qlora-nf4-paged-adamw-8bit-bf16", L, training(
        precision="bf16", optimizer="paged-adamw-8bit", lora={"rank": 8, "base_weights": "nf4"}), devices=SMALL)]

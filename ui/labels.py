"""The labels of the sidebar's choices: English message ids (N_) that widgets show through tr() (format_func);
the option values stay the enum values, so the URL and the scenario never see a translated word."""

from __future__ import annotations

from calc.contract.i18n import N_
from calc.contract.scenario import (
    Attention,
    Checkpointing,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
)

# A select box cannot wrap its choice: these stay short enough for the sidebar (ui.layout); the widgets' help
# says the rest.
PRECISION_LABELS = {
    Precision.fp32: N_("fp32 (everything fp32)"),
    Precision.amp_bf16: N_("AMP bf16 (fp32 weights)"),
    Precision.amp_fp16: N_("AMP fp16 (fp32 weights, GradScaler)"),
    Precision.bf16_mixed: N_("bf16 mixed (+ fp32 master)"),
    Precision.fp16_mixed: N_("fp16 mixed (+ fp32 master)"),
    Precision.bf16: N_("pure bf16 (bf16 states too)"),
}
OPTIMIZER_LABELS = {
    Optimizer.adamw: "AdamW", Optimizer.adam: "Adam", Optimizer.sgd: "SGD",
    Optimizer.sgd_momentum: N_("SGD + momentum"), Optimizer.adafactor: "Adafactor",
    Optimizer.adamw_8bit: "AdamW 8-bit (bitsandbytes)",
    Optimizer.paged_adamw: N_("paged AdamW (bitsandbytes)"),
    Optimizer.paged_adamw_8bit: N_("paged AdamW 8-bit (bitsandbytes)"),
}
IMPL_LABELS = {
    OptimizerImpl.foreach: N_("foreach (PyTorch default on CUDA)"),
    OptimizerImpl.fused: N_("fused (one kernel, no temporaries)"),
    OptimizerImpl.for_loop: N_("for-loop (one tensor at a time)"),
}
CKPT_LABELS = {
    Checkpointing.none: N_("none"),
    Checkpointing.full: N_("full layers (every k-th layer)"),
    Checkpointing.selective: N_("selective (attention only)"),
}
ATTENTION_LABELS = {
    Attention.sdpa: "SDPA / FlashAttention",
    Attention.eager: N_("eager (materialises S x S scores)"),
}
OFFLOAD_LABELS = {Offload.none: N_("none (on GPU)"), Offload.cpu: N_("CPU RAM"), Offload.nvme: "NVMe"}
SHARDING_LABELS = {"deepspeed": "DeepSpeed ZeRO", "fsdp2": "PyTorch FSDP2"}
# At ZeRO 0 a 16-bit (*-mixed) model runs under DeepSpeed's FP16_(Unfused)Optimizer or a plain PyTorch loop.
ZERO0_RUNNER_LABELS = {"deepspeed": N_("DeepSpeed (ZeRO 0)"), "torch": N_("plain PyTorch (no DeepSpeed)")}
ZERO_LABELS = {
    0: N_("0 (plain data parallel)"), 1: N_("1 (shard optimizer states)"),
    2: N_("2 (+ gradients)"), 3: N_("3 (+ weights)"),
}
MODE_LABELS = {Mode.train: N_("train"), Mode.inference: N_("inference")}
CROSS_ENTROPY_LABELS = {"standard": N_("standard (full logits)"),
                        "liger-fused": N_("Liger fused (from its source)"),
                        "chunked": N_("chunked (the framework's own)")}
FRAMEWORK_LABELS = {"transformers": N_("Hugging Face transformers (Trainer)"), "torchtune": "torchtune",
                    "litgpt": "LitGPT", "torchtitan": "torchtitan"}
KEEP_OUTPUTS_LABEL = N_("my loop keeps the model outputs (outputs = model(...))")
EXPERT_PARALLEL_LABEL = N_("Split the experts over this many GPUs (expert parallel)")
LORA_TARGET_LABELS = {"all-linear": N_("all linear layers"), "attention": N_("attention projections only")}
LORA_BASE_LABELS = {"bf16": "bf16 (LoRA)", "fp16": "fp16 (LoRA)", "int8": "int8 (LLM.int8)",
                    "nf4": N_("nf4 4-bit (QLoRA)"), "fp4": N_("fp4 4-bit (bitsandbytes)")}
LORA_LIST_LABEL = N_("modules I choose")
KV_CACHE_LABELS = {"dynamic": N_("dynamic (grows per token)"), "static": N_("static (preallocated)")}
INFERENCE_WEIGHT_LABELS = {"": N_("as the precision says"), "bf16": "bf16", "fp16": "fp16", "fp32": "fp32",
                           "int8": "int8 (bitsandbytes LLM.int8)", "nf4": "nf4 (bitsandbytes)",
                           "fp4": "fp4 (bitsandbytes)", "gptq-int4": "GPTQ int4", "gptq-int8": "GPTQ int8",
                           "awq-int4": "AWQ int4",
                           "fp8": N_("FP8 (block scales)"), "mxfp4": N_("MXFP4 experts (gpt-oss)")}
MODEL_SOURCE_LABELS = {"preset": N_("Preset"), "config": "Hugging Face config.json"}
HW_KIND_LABELS = {"gpu": N_("GPU preset"), "cluster": N_("Cluster preset"), "custom": N_("Custom memory")}
COMPARE_KIND_LABELS = {"cluster": N_("Cluster"), "gpu": N_("GPU x count")}
# The labels above are English message ids (N_): widgets show them through tr() (format_func), the
# option values stay the enum values.

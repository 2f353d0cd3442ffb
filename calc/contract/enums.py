"""The settings a scenario chooses from (precision, optimizer, checkpointing, attention, offload, mode, framework,
weight formats): plain enums and literals, imported by the scenario contract and by the modules it asks
(calc.contract.precision), so none of them has to import the scenario."""

from __future__ import annotations

from enum import Enum
from typing import Literal


class Precision(str, Enum):
    """Where 16-bit numbers live during training."""

    fp32 = "fp32"  # everything fp32
    amp_bf16 = "amp-bf16"  # fp32 weights/grads/states, torch.autocast(bf16) compute (HF Trainer bf16=True)
    amp_fp16 = "amp-fp16"  # same with fp16 autocast and a GradScaler
    bf16_mixed = "bf16-mixed"  # bf16 weights+grads on GPU, fp32 master+states in the optimizer (DeepSpeed)
    fp16_mixed = "fp16-mixed"  # same in fp16, with dynamic loss scaling
    bf16 = "bf16"  # everything bf16, optimizer states included

    @property
    def is_amp(self) -> bool:
        return self in (Precision.amp_bf16, Precision.amp_fp16)

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.bf16_mixed, Precision.fp16_mixed)

    @property
    def uses_fp16(self) -> bool:
        return self in (Precision.amp_fp16, Precision.fp16_mixed)

    def for_inference(self, gpu_bf16: bool) -> Precision:
        """The precision to propose when switching to inference: 16-bit weights. fp32 and AMP keep fp32
        weights (a training choice: autocast needs fp32 masters, inference does not), so they become
        bf16, or fp16-mixed (fp16 weights; no optimizer in inference) on GPUs without bf16."""
        if self in (Precision.bf16, Precision.bf16_mixed, Precision.fp16_mixed):
            return self
        return Precision.bf16 if gpu_bf16 and not self.uses_fp16 else Precision.fp16_mixed


class Optimizer(str, Enum):
    adamw = "adamw"
    adam = "adam"
    sgd = "sgd"
    sgd_momentum = "sgd-momentum"
    adafactor = "adafactor"
    adamw_8bit = "adamw-8bit"
    paged_adamw = "paged-adamw"  # bitsandbytes PagedAdamW: 32-bit states in CUDA managed (unified) memory
    paged_adamw_8bit = "paged-adamw-8bit"  # bitsandbytes PagedAdamW8bit: 8-bit states, paged the same way

    @property
    def paged(self) -> bool:
        """States in CUDA managed memory: outside torch.cuda.max_memory_allocated, inside nvidia-smi's figure."""
        return self in (Optimizer.paged_adamw, Optimizer.paged_adamw_8bit)

    @property
    def bitsandbytes(self) -> bool:
        return self in (Optimizer.adamw_8bit, Optimizer.paged_adamw, Optimizer.paged_adamw_8bit)


class OptimizerImpl(str, Enum):
    foreach = "foreach"  # PyTorch's default on CUDA: whole-list kernels with list-sized temporaries
    fused = "fused"  # one fused kernel per group, no temporaries
    for_loop = "for-loop"  # one parameter at a time


class Checkpointing(str, Enum):
    none = "none"
    full = "full"  # whole decoder layers, 1 of every `checkpoint_every`
    selective = "selective"  # only the attention core is recomputed (Korthikanti et al. 2022)


class Attention(str, Enum):
    eager = "eager"  # materialises the B x heads x S x S scores and probabilities
    sdpa = "sdpa"  # torch SDPA / FlashAttention: keeps only the output and the logsumexp


class Offload(str, Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class Mode(str, Enum):
    train = "train"
    inference = "inference"
    serve = "serve"  # a serving engine (vLLM, SGLang): calc.serve plans its memory from the `serving` block


Framework = Literal["transformers", "torchtune", "litgpt", "torchtitan"]
FRAMEWORKS: tuple[str, ...] = ("transformers", "torchtune", "litgpt", "torchtitan")
LoraTargetSet = Literal["all-linear", "attention"]
BaseWeights = Literal["bf16", "fp16", "int8", "nf4", "fp4"]
BASE_WEIGHTS: tuple[str, ...] = ("bf16", "fp16", "int8", "nf4", "fp4")
InferenceWeights = Literal["bf16", "fp16", "fp32", "int8", "nf4", "fp4", "gptq-int4", "gptq-int8", "awq-int4", "fp8",
                           "mxfp4"]
PLAIN_WEIGHT_PRECISION = {"bf16": Precision.bf16, "fp16": Precision.fp16_mixed, "fp32": Precision.fp32}

"""A training setup in plain words, for a reader who does not know the field names: the method it trains (full
fine-tuning, LoRA r16, QLoRA r16 nf4; with 8-bit AdamW) and its stack (precision, how the GPUs share the model,
checkpointing, offload, batch). The Compare page heads each column with these words, so that two columns that
train differently say so where the verdict is."""

from __future__ import annotations

from calc.contract.i18n import N_
from calc.contract.scenario import Checkpointing, Mode, Offload, Optimizer, Precision, Scenario
from calc.recommend.phrase import T_, Phrase, joined

PRECISION_WORDS = {
    Precision.fp32: N_("fp32"),
    Precision.amp_bf16: N_("PyTorch AMP bf16"),
    Precision.amp_fp16: N_("PyTorch AMP fp16"),
    Precision.bf16_mixed: N_("bf16 mixed precision"),
    Precision.fp16_mixed: N_("fp16 mixed precision"),
    Precision.bf16: N_("pure bf16"),
}


def method_words(sc: Scenario) -> Phrase:
    """'full fine-tuning', 'LoRA r16', 'QLoRA r16 nf4', 'full fine-tuning with 8-bit AdamW', 'inference'."""
    if sc.mode != Mode.train:
        return T_("inference")
    t = sc.training
    if t.lora is not None:
        base = t.lora.base_weights
        if base in ("nf4", "fp4"):
            return T_("QLoRA r{rank} {base}", rank=t.lora.rank, base=base)
        if t.lora.quantized:
            return T_("LoRA r{rank} on an {base} base", rank=t.lora.rank, base=base)
        return T_("LoRA r{rank}", rank=t.lora.rank)
    if t.optimizer in (Optimizer.adamw_8bit, Optimizer.paged_adamw_8bit):
        return T_("full fine-tuning with 8-bit AdamW")
    return T_("full fine-tuning")


def stack_words(sc: Scenario) -> Phrase:
    """'bf16 mixed precision, DeepSpeed ZeRO-3 over 8 GPUs, full checkpointing, micro-batch 1 x 1 accumulation';
    one GPU is 'one GPU', never data parallel."""
    t = sc.training
    gpus = sc.resolved_hardware().num_gpus
    parts: list[object] = [Phrase(PRECISION_WORDS[t.precision])]
    if gpus == 1:
        parts.append(T_("one GPU"))
    elif t.zero_stage:
        runner = T_("FSDP2") if t.sharding == "fsdp2" else T_("DeepSpeed ZeRO-{stage}", stage=t.zero_stage)
        parts.append(T_("{runner} over {gpus} GPUs", runner=runner, gpus=gpus))
    else:
        parts.append(T_("a full copy on each of {gpus} GPUs (data parallel)", gpus=gpus))
    if t.tensor_parallel > 1 or t.pipeline_parallel > 1:
        parts.append(T_("tensor parallel {tp} x pipeline parallel {pp}", tp=t.tensor_parallel, pp=t.pipeline_parallel))
    if sc.mode == Mode.train:
        if t.activation_checkpointing == Checkpointing.full:
            parts.append(T_("full checkpointing"))
        elif t.activation_checkpointing == Checkpointing.selective:
            parts.append(T_("selective checkpointing"))
        if t.offload_optimizer != Offload.none:
            parts.append(T_("optimizer states offloaded to {device}", device=_device(t.offload_optimizer)))
        if t.offload_params != Offload.none:
            parts.append(T_("weights offloaded to {device}", device=_device(t.offload_params)))
        parts.append(T_("micro-batch {mb} x {ga} accumulation", mb=t.micro_batch_size, ga=t.gradient_accumulation_steps))
    return joined(", ", parts)


def _device(o: Offload) -> str:
    return "CPU RAM" if o == Offload.cpu else "NVMe"

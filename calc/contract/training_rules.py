"""Cross-field rules of the training block that belong to one framework or mechanism (torchtune's and LitGPT's
recipes, optimizer_in_backward, activation_offload): each takes a TrainingConfig (calc.contract.scenario) and raises
a UserError naming what it refuses."""

from __future__ import annotations

from typing import Any

from calc.contract.enums import Attention, Checkpointing, Optimizer, Precision
from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.litgpt_lora import litgpt_lora_flags


def activation_offload_fits(t: Any) -> None:
    """What the engine models of torchtune's OffloadActivations (calc.memory.offload): its recipes refuse it
    without activation checkpointing (enable_activation_offloading needs enable_activation_checkpointing) and run
    it on one GPU; modelled around torchtune's model and transformers' reference loop, every layer checkpointed,
    in plain PyTorch, with the parameters' gradients stepped after backward."""
    if t.framework not in ("transformers", "torchtune"):
        raise UserError(T_("activation_offload is modelled for framework torchtune (its recipes' "
                           "enable_activation_offloading) and transformers"))
    if t.activation_checkpointing != Checkpointing.full or t.checkpoint_every != 1:
        raise UserError(T_("activation_offload needs activation_checkpointing full on every layer (checkpoint_every "
                           "1): torchtune's recipes refuse enable_activation_offloading without "
                           "enable_activation_checkpointing"))
    if t.zero_stage or t.sharding == "fsdp2" or t.tensor_parallel > 1 or t.pipeline_parallel > 1 \
            or t.optimizer_in_backward:
        raise UserError(T_("activation_offload is modelled on one GPU without sharding (zero_stage 0, no FSDP2, "
                           "tensor or pipeline parallelism, optimizer_in_backward off)"))


def refuse_optimizer_in_backward(t: Any) -> None:
    """What torchtune's optimizer_in_bwd (one optimizer per parameter, stepped in its gradient hook) cannot do."""
    if t.gradient_accumulation_steps > 1:
        raise UserError(T_("optimizer_in_backward steps in the gradient hooks, so it cannot accumulate "
                           "gradients: use gradient_accumulation_steps 1"))
    if t.zero_stage or t.sharding == "fsdp2":
        raise UserError(T_("optimizer_in_backward is modelled for plain PyTorch on one GPU: DeepSpeed ZeRO and "
                           "FSDP2 step sharded gradients; use zero_stage 0"))
    if t.precision.is_mixed or t.precision == Precision.amp_fp16:
        raise UserError(T_("optimizer_in_backward steps each weight in its own dtype: fp32 master weights "
                           "(*-mixed) and GradScaler (amp-fp16) step all gradients at once; use fp32, bf16 or "
                           "amp-bf16"))


# the families whose torchtune builders the engine models (torchtune.models.llama3 / llama3_1 / llama3_2, qwen2,
# mistral)
TORCHTUNE_FAMILIES = ("llama", "qwen2", "mistral")


def torchtune_supported(t: Any) -> None:
    """What torchtune's single-device recipes run, as modelled: a bf16 or fp32 model (its `dtype`; no autocast,
    no master copies), SDPA, whole-layer checkpointing, one GPU without DeepSpeed; full fine-tuning, or LoRA on
    a bf16 model (lora_finetune_single_device), its base bf16 or torchao NF4 (QLoRA: quantize_base)."""
    if t.precision not in (Precision.bf16, Precision.fp32):
        raise UserError(T_("framework torchtune builds the model in its dtype (bf16 or fp32): choose precision "
                           "bf16 or fp32"))
    if t.attention != Attention.sdpa:
        raise UserError(T_("framework torchtune runs attention through SDPA: choose attention sdpa"))
    if t.activation_checkpointing == Checkpointing.selective:
        raise UserError(T_("framework torchtune: choose activation_checkpointing none or full (whole layers)"))
    if t.activation_checkpointing == Checkpointing.full and t.checkpoint_every != 1:
        raise UserError(T_("torchtune's single-device recipes checkpoint every layer: use checkpoint_every 1"))
    if t.sharding != "torch" or t.tensor_parallel > 1 or t.pipeline_parallel > 1:
        raise UserError(T_("framework torchtune is modelled for its single-device recipes: choose sharding torch "
                           "without tensor or pipeline parallelism"))
    if t.lora is not None and t.lora.base_weights not in ("bf16", "nf4"):
        raise UserError(T_("framework torchtune: its QLoRA builders store the base as torchao NF4 tensors; choose "
                           "base_weights nf4 (QLoRA) or bf16 (LoRA)"))
    if t.lora is not None and t.precision != Precision.bf16:
        raise UserError(T_("framework torchtune: LoRA is modelled on a bf16 model (precision bf16)"))
    if t.lora is not None and t.lora.quantized and not isinstance(t.lora.targets, str) and "lm_head" in t.lora.targets:
        raise UserError(T_("framework torchtune: QLoRA with an adapter on the output projection (an NF4 output) "
                           "is not modelled yet; leave lm_head out of the targets"))
    if t.lora is not None and t.lora.modules_to_save:  # torchtune's recipes train adapters only
        raise UserError(T_("framework torchtune trains LoRA adapters only: its recipes have no modules_to_save"))
    if t.cross_entropy == "liger-fused":
        raise UserError(T_("framework torchtune computes its own loss: choose cross_entropy chunked or standard"))


def _litgpt_lora_sets(t: Any) -> None:
    """What LitGPT's flags can say (calc.contract.litgpt_lora), less the adapter on its chunked lm_head, which the
    engine does not model: q, k and v in any subset (LoRAQKVLinear with its zero_pad), the projection, the MLP as a
    whole, each with lora_dropout on the adapter's input."""
    lora = t.lora
    if lora is None:
        return
    litgpt_lora_flags(lora)
    if isinstance(lora.targets, tuple) and "lm_head" in lora.targets:
        raise UserError(T_("framework {framework}: an adapter on lm_head (lora_head) is not modelled; leave "
                           "lm_head out of lora.targets", framework="litgpt"))


def _litgpt_qlora_fits(t: Any) -> None:
    """finetune/lora.py's --quantize bnb.nf4 / bnb.nf4-dq / bnb.fp4 / bnb.fp4-dq: Lightning's BitsandbytesPrecision
    in bf16-true (the script refuses mixed precision with it) and the PagedAdamW it makes for a quantized model."""
    if t.lora.base_weights == "int8":
        raise UserError(T_("framework litgpt: --quantize bnb.int8-training is not modelled; choose base_weights "
                           "nf4 or fp4"))
    if t.precision != Precision.bf16:
        raise UserError(T_("framework litgpt quantizes in bf16-true only (finetune/lora.py refuses quantization "
                           "with mixed precision): choose precision bf16"))
    if t.optimizer != Optimizer.paged_adamw:
        raise UserError(T_("framework litgpt trains a quantized model with bitsandbytes' PagedAdamW "
                           "(instantiate_bnb_optimizer): choose optimizer paged-adamw"))


def litgpt_training_fits(t: Any) -> None:
    """What the LitGPT path models: finetune/full.py's and finetune/lora.py's steps on one device (chunked loss,
    no checkpointing), the precisions bf16-true (bf16) and bf16-mixed (amp-bf16; LoRA in
    bf16-true only, where the frozen base is bf16 as lora.base_weights says), and CausalSelfAttention's
    F.scaled_dot_product_attention (litgpt/model.py; no eager path without softcapping)."""
    if t.cross_entropy != "chunked":
        raise UserError(T_("framework litgpt computes its loss with chunked_cross_entropy: use cross_entropy "
                           "chunked"))
    if t.precision not in (Precision.bf16, Precision.amp_bf16):
        raise UserError(T_("framework litgpt is modelled for precision bf16 (bf16-true) and amp-bf16 "
                           "(bf16-mixed)"))
    if t.attention != Attention.sdpa:
        raise UserError(T_("framework litgpt calls torch SDPA for attention: use attention sdpa"))
    if t.activation_checkpointing != Checkpointing.none or t.keep_outputs:
        raise UserError(T_("framework litgpt is modelled without activation checkpointing"))
    if t.lora is not None and t.lora.quantized:
        _litgpt_qlora_fits(t)
    elif t.lora is not None and (t.precision != Precision.bf16 or t.lora.base_weights != "bf16"):
        raise UserError(T_("framework litgpt with LoRA is modelled in bf16-true (precision bf16, bf16 base "
                           "weights): LitGPT's bf16-mixed keeps the frozen base in fp32"))
    _litgpt_lora_sets(t)
    if t.sharding != "torch" or t.tensor_parallel > 1 or t.pipeline_parallel > 1:
        raise UserError(T_("framework litgpt is modelled on one GPU in plain PyTorch (sharding torch)"))


__all__ = ["TORCHTUNE_FAMILIES", "activation_offload_fits", "litgpt_training_fits", "refuse_optimizer_in_backward",
           "torchtune_supported"]

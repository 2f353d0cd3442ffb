"""LitGPT's LoRA flags (litgpt 0.5.13 finetune/lora.py: lora_query / key / value / projection / mlp / head) for a
scenario's lora block: the one place lora.targets is mapped to LitGPT. The contract validates with it (what the
flags cannot say is refused before any estimate), the export writes it, and the measurement builds its models with it.
"""

from __future__ import annotations

from typing import Any

from calc.contract.errors import UserError
from calc.contract.i18n import T_

# Hugging Face module names -> finetune/lora.py's flags (the llama-style families LitGPT's path covers)
LITGPT_LORA_NAMES = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value",
                     "o_proj": "lora_projection", "lm_head": "lora_head"}
LITGPT_MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj"})  # lora_mlp adapts the three together


def litgpt_lora_flags(lora: Any) -> dict[str, Any]:
    """finetune/lora.py's LoRA arguments: attention = lora_query / key / value (the fused qkv's LoRAQKVLinear) and
    lora_projection; all-linear adds lora_mlp (lm_head stays without, as peft's all-linear leaves it); a list of
    Hugging Face names maps one to one (the MLP only as a whole)."""
    if lora.modules_to_save:
        raise UserError(T_("LitGPT's LoRA fine-tuning trains no modules in full beside the adapters: leave "
                           "modules_to_save empty"))
    flags = dict(lora_r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout)
    if lora.targets in ("attention", "all-linear"):
        return {**flags, "lora_query": True, "lora_key": True, "lora_value": True, "lora_projection": True,
                "lora_mlp": lora.targets == "all-linear", "lora_head": False}
    names = set(lora.targets)
    if (names - set(LITGPT_LORA_NAMES) - LITGPT_MLP_NAMES
            or (names & LITGPT_MLP_NAMES and not names >= LITGPT_MLP_NAMES)):
        raise UserError(T_("LitGPT's LoRA flags cannot adapt exactly {targets} (the MLP only as a whole)",
                           targets=", ".join(sorted(lora.targets))))
    return {**flags, **{flag: hf in names for hf, flag in LITGPT_LORA_NAMES.items()},
            "lora_mlp": names >= LITGPT_MLP_NAMES}


def litgpt_quantize_mode(lora: Any) -> str:
    """The mode of finetune/lora.py's --quantize bnb.<mode> (and of Lightning's BitsandbytesPrecision) for a
    quantized lora block: nf4 / nf4-dq / fp4 / fp4-dq (-dq: double quantization)."""
    return lora.base_weights + ("-dq" if lora.double_quant else "")

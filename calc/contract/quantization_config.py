"""A pasted config.json's quantization_config: which stored weights it means (transformers' BitsAndBytesConfig,
GPTQConfig, AwqConfig, FineGrainedFP8Config, FbgemmFp8Config and Mxfp4Config as save_pretrained writes them) and
which modules it keeps out of the conversion (modules_to_not_convert; bitsandbytes' llm_int8_skip_modules). Apart
from calc.contract.quantized, whose byte counts need the precision tables: the scenario reads this module while it
is itself being defined."""

from __future__ import annotations

from typing import Any, NamedTuple

from calc.contract.boundary import excerpt
from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.module_paths import check_patterns

INT4_GROUP = 128  # GPTQ / AWQ group_size default
FP8_BLOCK = 128  # FineGrainedFP8Config weight_block_size (128, 128)


# ---- a pasted config.json's quantization_config ------------------------------------------------------------------

class ConfigQuantization(NamedTuple):
    """What a config.json's quantization_config says about the stored weights."""

    weights: str  # an InferenceWeights / lora.base_weights value
    double_quant: bool = False
    not_converted: tuple[str, ...] = ()  # modules_to_not_convert (calc.contract.module_paths patterns)


QUANT_METHODS = ("bitsandbytes", "gptq", "awq", "fp8", "fbgemm_fp8", "mxfp4")


def config_quantization(config: dict[str, Any]) -> ConfigQuantization | None:
    """The weights a Hugging Face config's quantization_config stores (transformers' BitsAndBytesConfig, GPTQConfig,
    AwqConfig, FineGrainedFP8Config, as saved by save_pretrained), None without one; UserError for a method or a
    setting the estimate does not model."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise UserError(T_("the config's quantization_config must be an object"))
    method = qc.get("quant_method")
    skip = check_patterns(qc.get("llm_int8_skip_modules" if method == "bitsandbytes" else "modules_to_not_convert"))
    if method == "bitsandbytes":
        return _bitsandbytes(qc)._replace(not_converted=skip)
    if method in ("gptq", "awq"):
        bits = _groups_of_128(qc, method)
        return ConfigQuantization(f"{method}-int{bits}", not_converted=skip)
    if method == "fp8":
        block = qc.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
        if block not in ([FP8_BLOCK, FP8_BLOCK], (FP8_BLOCK, FP8_BLOCK)):
            raise UserError(T_("the config's fp8 quantization_config is modelled for weight_block_size [128, 128], "
                               "not {block}", block=excerpt(block)))
        return ConfigQuantization("fp8", not_converted=skip)
    if method == "fbgemm_fp8":  # fp8 weights with one fp32 scale per output channel: the block-scale bytes within
        return ConfigQuantization("fp8", not_converted=skip)  # 0.01 % (calc.contract.quantized.fp8_weight_bytes)
    if method == "mxfp4":  # Mxfp4Config: the routed experts in MXFP4, every nn.Linear 16-bit
        return ConfigQuantization("mxfp4", not_converted=skip)
    raise UserError(T_("the config's quantization_config quant_method {method} is not modelled; modelled: {known}",
                       method=excerpt(method), known=", ".join(QUANT_METHODS)))


def _bitsandbytes(qc: dict[str, Any]) -> ConfigQuantization:
    """BitsAndBytesConfig: load_in_4bit with bnb_4bit_quant_type (its default fp4) and bnb_4bit_use_double_quant,
    or load_in_8bit."""
    four, eight = qc.get("load_in_4bit") is True, qc.get("load_in_8bit") is True
    if four == eight:
        raise UserError(T_("the config's bitsandbytes quantization_config sets neither or both of load_in_4bit and "
                           "load_in_8bit"))
    if eight:
        return ConfigQuantization("int8")
    kind = qc.get("bnb_4bit_quant_type", "fp4")
    if kind not in ("nf4", "fp4"):
        raise UserError(T_("the config's bnb_4bit_quant_type {kind} is not nf4 or fp4", kind=excerpt(kind)))
    double = qc.get("bnb_4bit_use_double_quant", False)
    if not isinstance(double, bool):
        raise UserError(T_("the config's bnb_4bit_use_double_quant must be true or false"))
    return ConfigQuantization(kind, double)


def _groups_of_128(qc: dict[str, Any], method: str) -> int:
    """GPTQ is modelled for 4- and 8-bit weights, AWQ for 4-bit, in groups of 128 (their defaults): the bits."""
    bits = qc.get("bits", qc.get("w_bit", 4))
    group = qc.get("group_size", qc.get("q_group_size", INT4_GROUP))
    allowed = (4, 8) if method == "gptq" else (4,)
    if bits not in allowed or isinstance(bits, bool) or group != INT4_GROUP:
        raise UserError(T_("the config's {method} quantization_config is modelled for bits {allowed} and group_size "
                           "128, not bits {bits} and group_size {group}", method=method,
                           allowed=" or ".join(map(str, allowed)), bits=excerpt(bits), group=excerpt(group)))
    return int(bits)

"""Bytes of one quantized nn.Linear weight, as each quantization library stores it on the GPU.

Modelled from the libraries' source, not measured (their kernels need CUDA):
  * bitsandbytes 0.50.2 (`bnb_weight_bytes`): int8 = Int8Params' int8 CB (out x in) + fp32 SCB row scales (out)
    (nn/modules.py Int8Params, functional.int8_vectorwise_quant); nf4 / fp4 = Params4bit's packed uint8 data (two
    values a byte) + its QuantState: fp32 absmax per block of 64 (functional.quantize_4bit, blocksize 64) and the
    16-value fp32 code; with double quant (compress_statistics) the absmax is quantized again to uint8 by
    quantize_blockwise(blocksize=256), which keeps one fp32 absmax per 256 blocks and the fp32 offset (its 256-value
    dynamic code is one cached tensor for every weight);
  * GPTQ (`gptq_weight_bytes`; transformers' GPTQ integration through gptqmodel / auto-gptq's QuantLinear): qweight
    int32 (in / 8 x out, 8 four-bit values an int32), qzeros int32 (in / group x out / 8), fp16 scales
    (in / group x out) and g_idx int32 (in);
  * AWQ (`awq_weight_bytes`; autoawq's WQLinear_GEMM): qweight int32 (in x out / 8), qzeros int32
    (in / group x out / 8), fp16 scales (in / group x out);
  * FP8 (`fp8_weight_bytes`; transformers integrations/finegrained_fp8.py FP8Linear, FineGrainedFP8Config):
    float8_e4m3 weight (out x in) and an fp32 weight_scale_inv per 128 x 128 block.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from calc.contract.boundary import excerpt
from calc.contract.errors import UserError
from calc.contract.i18n import T_

BnbKind = Literal["int8", "nf4", "fp4"]
BNB_4BIT_BLOCK = 64  # functional.quantize_4bit's default blocksize
BNB_NESTED_BLOCK = 256  # double quant: quantize_blockwise(absmax, blocksize=256)
BNB_4BIT_CODE_VALUES = 16  # get_4bit_type: the nf4 / fp4 code, fp32
INT4_GROUP = 128  # GPTQ / AWQ group_size default
FP8_BLOCK = 128  # FineGrainedFP8Config weight_block_size (128, 128)
INT32_BYTES = 4
FP16_BYTES = 2
FP32_BYTES = 4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bnb_weight_bytes(kind: BnbKind, out_features: int, in_features: int, double_quant: bool) -> int:
    """Bytes bitsandbytes keeps for one out x in weight stored as int8, nf4 or fp4 (the bias is not included)."""
    n = out_features * in_features
    if kind == "int8":
        return n + FP32_BYTES * out_features
    blocks = ceil_div(n, BNB_4BIT_BLOCK)
    absmax = (blocks + FP32_BYTES * ceil_div(blocks, BNB_NESTED_BLOCK) + FP32_BYTES if double_quant
              else FP32_BYTES * blocks)
    return ceil_div(n, 2) + absmax + FP32_BYTES * BNB_4BIT_CODE_VALUES


def gptq_weight_bytes(out_features: int, in_features: int, group_size: int = INT4_GROUP) -> int:
    """GPTQ 4-bit QuantLinear: qweight, qzeros, scales and g_idx of one out x in weight."""
    groups = ceil_div(in_features, group_size)
    return (INT32_BYTES * ceil_div(in_features, 8) * out_features + INT32_BYTES * groups * ceil_div(out_features, 8)
            + FP16_BYTES * groups * out_features + INT32_BYTES * in_features)


def awq_weight_bytes(out_features: int, in_features: int, group_size: int = INT4_GROUP) -> int:
    """AWQ 4-bit WQLinear_GEMM: qweight, qzeros and scales of one out x in weight."""
    groups = ceil_div(in_features, group_size)
    return (INT32_BYTES * in_features * ceil_div(out_features, 8) + INT32_BYTES * groups * ceil_div(out_features, 8)
            + FP16_BYTES * groups * out_features)


def fp8_weight_bytes(out_features: int, in_features: int) -> int:
    """FineGrainedFP8 FP8Linear: the fp8 weight and its fp32 scale per 128 x 128 block."""
    return out_features * in_features + FP32_BYTES * ceil_div(out_features, FP8_BLOCK) * ceil_div(in_features,
                                                                                                  FP8_BLOCK)


QUANTIZED_WEIGHTS = ("int8", "nf4", "fp4", "gptq-int4", "awq-int4", "fp8")


def quantized_weight_bytes(kind: str, out_features: int, in_features: int, double_quant: bool = False,
                           group_size: int = INT4_GROUP) -> int:
    """One weight's bytes for an inference.weights / lora.base_weights quantized kind."""
    if kind in ("int8", "nf4", "fp4"):
        return bnb_weight_bytes(kind, out_features, in_features, double_quant)  # type: ignore[arg-type]
    if kind == "gptq-int4":
        return gptq_weight_bytes(out_features, in_features, group_size)
    if kind == "awq-int4":
        return awq_weight_bytes(out_features, in_features, group_size)
    if kind == "fp8":
        return fp8_weight_bytes(out_features, in_features)
    raise ValueError(f"not a quantized kind: {kind}")


# ---- a pasted config.json's quantization_config ------------------------------------------------------------------

class ConfigQuantization(NamedTuple):
    """What a config.json's quantization_config says about the stored weights."""

    weights: str  # an InferenceWeights / lora.base_weights value
    double_quant: bool = False


QUANT_METHODS = ("bitsandbytes", "gptq", "awq", "fp8")


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
    if method == "bitsandbytes":
        return _bitsandbytes(qc)
    if method in ("gptq", "awq"):
        _int4_groups(qc, method)
        return ConfigQuantization(f"{method}-int4")
    if method == "fp8":
        block = qc.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
        if block not in ([FP8_BLOCK, FP8_BLOCK], (FP8_BLOCK, FP8_BLOCK)):
            raise UserError(T_("the config's fp8 quantization_config is modelled for weight_block_size [128, 128], "
                               "not {block}", block=excerpt(block)))
        return ConfigQuantization("fp8")
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


def _int4_groups(qc: dict[str, Any], method: str) -> None:
    """GPTQ and AWQ are modelled for 4-bit weights in groups of 128 (their defaults)."""
    bits = qc.get("bits", qc.get("w_bit", 4))
    group = qc.get("group_size", qc.get("q_group_size", INT4_GROUP))
    if bits != 4 or group != INT4_GROUP:
        raise UserError(T_("the config's {method} quantization_config is modelled for bits 4 and group_size 128, "
                           "not bits {bits} and group_size {group}", method=method, bits=excerpt(bits),
                           group=excerpt(group)))

"""Bytes of a bitsandbytes-quantized weight, and of a frozen base that transformers' BitsAndBytesConfig quantizes.

Sources (bitsandbytes 0.50.2, transformers 5.23):
- 4-bit (nf4 / fp4): bitsandbytes/functional.py quantize_4bit packs two values per uint8 (quant_storage
  uint8) and keeps a QuantState with one fp32 absmax per block of 64 (Params4bit's default blocksize,
  nn/modules.py) and the 16-value fp32 code (get_4bit_type, made anew for every weight). Double quant
  (bnb_4bit_use_double_quant = compress_statistics) quantizes the absmax again with quantize_blockwise
  (blocksize 256): uint8 absmax + an fp32 0-d offset + a nested state with one fp32 absmax per 256 blocks and
  a copy of the 256-value fp32 dynamic map (`code.to(A.device, copy=True)`). nf4 and fp4 take the same bytes.
- 8-bit (LLM.int8): Int8Params._quantize keeps int8 data (out x in) and SCB, one fp32 scale per output row
  (functional.int8_vectorwise_quant); Linear8bitLt's state points at the same two tensors.
- What is quantized: transformers' replace_with_bnb_linear (integrations/bitsandbytes.py) replaces every
  plain nn.Linear and Conv1D except the modules get_keys_to_not_convert (quantizers/base.py) names: the output
  embeddings (lm_head), tied weights and the last parameter. Embeddings, norms, biases and MoE expert stacks
  (3-D nn.Parameters, not nn.Linear) stay in the model's torch dtype.
- Inference weights, modelled from source, not measured (their kernels need CUDA): GPTQ (`gptq_weight_bytes`;
  transformers' GPTQ integration through gptqmodel / auto-gptq's QuantLinear, 32 / bits values per int32):
  qweight int32 (in / 8 x out at 4 bits, in / 4 x out at 8), qzeros int32 (in / group x out / 8, or out / 4),
  fp16 scales (in / group x out) and g_idx int32 (in); AWQ
  (`awq_weight_bytes`; autoawq's WQLinear_GEMM): qweight int32 (in x out / 8), qzeros int32 (in / group x out / 8),
  fp16 scales; FP8 (`fp8_weight_bytes`; transformers integrations/finegrained_fp8.py FP8Linear,
  FineGrainedFP8Config): float8_e4m3 weight (out x in) and an fp32 weight_scale_inv per 128 x 128 block; MXFP4
  (`mxfp4_weight_bytes`; transformers integrations/mxfp4.py Mxfp4GptOssExperts, vLLM's Mxfp4MoEMethod): each
  routed expert's matrix as uint8 blocks of two e2m1 values and one uint8 (e8m0) scale per 32 values of a row.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from calc.contract.model_spec import Linear, ModelSpec, per_spec
from calc.contract.module_paths import converted_layers
from calc.contract.precision import BF16, FP32
from calc.contract.quantization_config import FP8_BLOCK, INT4_GROUP

BnbKind = Literal["bf16", "fp16", "int8", "nf4", "fp4"]
SIXTEEN_BIT = BF16  # bf16 / fp16: the torch dtype the unquantized weights keep
BNB_4BIT_BLOCKSIZE = 64  # Params4bit.__new__: blocksize None -> 64
BNB_NESTED_BLOCKSIZE = 256  # quantize_4bit(compress_statistics=True): quantize_blockwise(absmax, blocksize=256)
BNB_4BIT_CODE_VALUES = 16  # get_4bit_type: the nf4 / fp4 code, fp32, one per quantized weight
BNB_DYNAMIC_MAP_VALUES = 256  # create_dynamic_map: the 8-bit map the nested absmax state copies
QUANTIZED_KINDS = ("int8", "nf4", "fp4")
INT32_BYTES = 4
INT64_BYTES = 8
FP16_BYTES = 2
FP32_BYTES = 4
DATA_BITS: dict[str, int] = {"bf16": 16, "fp16": 16, "int8": 8, "nf4": 4, "fp4": 4}  # per weight, without state


def data_bytes_per_weight(kind: BnbKind) -> float:
    """The weight data alone (no quantization state): what a kernel reads per weight."""
    return DATA_BITS[kind] / 8


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bnb_4bit_bytes(numel: int, double_quant: bool) -> int:
    """One Params4bit weight and its QuantState (packed data, absmax, code; double quant's nested state)."""
    blocks = _ceil_div(numel, BNB_4BIT_BLOCKSIZE)
    packed, code = _ceil_div(numel, 2), BNB_4BIT_CODE_VALUES * FP32
    if not double_quant:
        return packed + blocks * FP32 + code
    nested = _ceil_div(blocks, BNB_NESTED_BLOCKSIZE) * FP32 + BNB_DYNAMIC_MAP_VALUES * FP32
    return packed + blocks + FP32 + nested + code  # uint8 absmax + fp32 offset + nested state + code


TORCHAO_NF4_BLOCK = 64  # torchao.dtypes.nf4tensor.to_nf4: block_size
TORCHAO_NF4_SCALER_BLOCK = 256  # to_nf4: scaler_block_size (the scalers' own quantization blocks)
TORCHAO_NF4_TABLE = 16  # NF4Tensor.nf4: the 16 NF4 values, in the weight's dtype, one table per weight


def torchao_nf4_block_elements() -> int:
    """to_nf4 asserts a weight divides into whole scaler blocks: 64 x 256 weights."""
    return TORCHAO_NF4_BLOCK * TORCHAO_NF4_SCALER_BLOCK


def torchao_nf4_bytes(numel: int, elem_bytes: int = SIXTEEN_BIT) -> int:
    """One NF4Tensor as torchtune's QLoRA builders store a frozen weight (to_nf4 of a 16-bit weight): packed
    uint8 data, the int8 scalers (always double-quantized), a factor per 256 scalers and the scalers' mean in the
    weight's dtype, and its NF4 table. to_nf4 asserts numel divides into whole scaler blocks. With a single scaler
    block the factor is a view of a 256-wide tensor, whose storage it keeps whole (measured: 16,384 weights)."""
    blocks = numel // TORCHAO_NF4_BLOCK
    factors = blocks // TORCHAO_NF4_SCALER_BLOCK
    factor_storage = TORCHAO_NF4_SCALER_BLOCK if factors == 1 else factors
    return numel // 2 + blocks + elem_bytes * (factor_storage + 1 + TORCHAO_NF4_TABLE)


def torchao_nf4_dequant_bytes(numel: int, elem_bytes: int = SIXTEEN_BIT) -> int:
    """The peak of NF4Tensor.get_original_weight (every .to(dtype) of the weight), beside the NF4Tensor: both
    halves of each byte as int64 indices (kept to the return), their NF4 values, the dequantized scalers, each
    half scaled, then torch.stack of the halves: the 16-bit weight itself."""
    half = numel // 2
    scalers = elem_bytes * (numel // TORCHAO_NF4_BLOCK)
    return 2 * INT64_BYTES * half + 2 * elem_bytes * half + scalers + 2 * elem_bytes * half + elem_bytes * numel


def bnb_weight_bytes(kind: BnbKind, out_features: int, in_features: int, double_quant: bool = False) -> int:
    """Bytes one out x in weight takes as bitsandbytes stores it (kind int8 / nf4 / fp4), or as a 16-bit tensor
    (bf16 / fp16)."""
    numel = out_features * in_features
    if kind in ("bf16", "fp16"):
        return SIXTEEN_BIT * numel
    if kind == "int8":
        return numel + FP32 * out_features  # int8 data + SCB
    if kind in ("nf4", "fp4"):
        return bnb_4bit_bytes(numel, double_quant)
    raise ValueError(f"unknown weight kind {kind!r}")


def is_quantized_linear(lin: Linear) -> bool:
    """replace_with_bnb_linear converts nn.Linear / Conv1D modules; expert stacks and raw parameters stay."""
    return lin.module and not lin.expert


class FrozenBase(NamedTuple):
    """The frozen base on one GPU: its quantized linears and the rest, which keeps the 16-bit dtype."""

    quantized_bytes: int  # the bitsandbytes weights and their quantization state
    quantized_elements: int  # how many weight elements they stand for

    def total_bytes(self, params_local: int) -> int:
        """Every base parameter on this GPU: the quantized linears + the rest at 2 B (embeddings, norms, biases,
        lm_head)."""
        return self.quantized_bytes + SIXTEEN_BIT * (params_local - self.quantized_elements)


# torchtune's QLoRA builders (quantize_base=True): lora_llama3 / lora_llama2 / lora_mistral make a linear without an
# adapter a FrozenNF4Linear, lora_qwen2 leaves it a plain nn.Linear (models/qwen2/_component_builders.py, 0.6.1)
TORCHTUNE_ADAPTED_NF4_ONLY = frozenset({"qwen2"})


def torchtune_nf4(family: str, linear: str, adapted: frozenset[str]) -> bool:
    """Whether torchtune's QLoRA model stores decoder linear `linear` as an NF4Tensor, given the linears that
    have an adapter."""
    return linear in adapted or family not in TORCHTUNE_ADAPTED_NF4_ONLY


def frozen_base(spec: ModelSpec, kind: BnbKind, double_quant: bool, layers: int, tp: int, first: bool,
                not_converted: tuple[str, ...] = (), torchao: frozenset[str] | None = None) -> FrozenBase:
    """The decoder layers' linears on this GPU (this tensor-parallel slice; a MoE model's dense layers on the
    first stage; the first `layers` layers, or the last ones) as `kind` stores them, less those a pasted config's
    modules_to_not_convert names, memoized per spec. `torchao` (torchtune's QLoRA: the linears with an adapter):
    NF4Tensors (torchao_nf4_bytes) where torchtune_nf4 says so, instead of bitsandbytes' layout."""
    key = ("frozen base", kind, double_quant, layers, tp, first, not_converted, torchao)
    return per_spec(spec, key, lambda: _count_frozen_base(spec, kind, double_quant, layers, tp, first, not_converted,
                                                          torchao))


def _count_frozen_base(spec: ModelSpec, kind: BnbKind, double_quant: bool, layers: int, tp: int,
                       first: bool, not_converted: tuple[str, ...],
                       torchao: frozenset[str] | None = None) -> FrozenBase:
    if kind not in QUANTIZED_KINDS:
        return FrozenBase(0, 0)
    dense = min(layers, spec.dense_layers) if first else 0
    start = 0 if first else spec.num_layers - layers
    stored = elements = 0
    for is_dense, indices in ((True, range(start, start + dense)), (False, range(start + dense, start + layers))):
        for lin in spec.linear_layers(is_dense) if indices else []:
            n = converted_layers(spec, lin, indices, not_converted) if is_quantized_linear(lin) else 0
            if torchao is not None and not torchtune_nf4(spec.family, lin.name, torchao):
                n = 0
            if n:
                fin, fout = lin.in_features // lin.tp_in(tp), lin.out_features // lin.tp_out(tp)
                stored += lin.count * n * (torchao_nf4_bytes(fout * fin) if torchao is not None else
                                           bnb_weight_bytes(kind, fout, fin, double_quant))
                elements += lin.count * n * fin * fout
    return FrozenBase(stored, elements)


def gptq_weight_bytes(out_features: int, in_features: int, group_size: int = INT4_GROUP, bits: int = 4) -> int:
    """GPTQ QuantLinear (4 or 8 bits): qweight, qzeros, scales and g_idx of one out x in weight."""
    groups, per_int32 = _ceil_div(in_features, group_size), 32 // bits
    return (INT32_BYTES * _ceil_div(in_features, per_int32) * out_features
            + INT32_BYTES * groups * _ceil_div(out_features, per_int32)
            + FP16_BYTES * groups * out_features + INT32_BYTES * in_features)


def awq_weight_bytes(out_features: int, in_features: int, group_size: int = INT4_GROUP) -> int:
    """AWQ 4-bit WQLinear_GEMM: qweight, qzeros and scales of one out x in weight."""
    groups = _ceil_div(in_features, group_size)
    return (INT32_BYTES * in_features * _ceil_div(out_features, 8) + INT32_BYTES * groups * _ceil_div(out_features, 8)
            + FP16_BYTES * groups * out_features)


def fp8_weight_bytes(out_features: int, in_features: int) -> int:
    """FineGrainedFP8 FP8Linear: the fp8 weight and its fp32 scale per 128 x 128 block."""
    return out_features * in_features + FP32_BYTES * _ceil_div(out_features, FP8_BLOCK) * _ceil_div(in_features,
                                                                                                  FP8_BLOCK)


MXFP4_BLOCK = 32  # values per e8m0 scale (OCP microscaling)


def mxfp4_weight_bytes(out_features: int, in_features: int) -> int:
    """An MXFP4 matrix: in / 2 bytes of packed values and in / 32 scale bytes per output row."""
    return out_features * (_ceil_div(in_features, 2) + _ceil_div(in_features, MXFP4_BLOCK))


QUANTIZED_WEIGHTS = ("int8", "nf4", "fp4", "gptq-int4", "gptq-int8", "awq-int4", "fp8", "mxfp4")
EXPERT_ONLY_WEIGHTS = ("mxfp4",)  # Mxfp4Config converts the routed experts and leaves every nn.Linear 16-bit


def quantized_weight_bytes(kind: str, out_features: int, in_features: int, double_quant: bool = False,
                           group_size: int = INT4_GROUP) -> int:
    """One weight's bytes for an inference.weights / lora.base_weights quantized kind."""
    if kind in ("int8", "nf4", "fp4"):
        return bnb_weight_bytes(kind, out_features, in_features, double_quant)  # type: ignore[arg-type]
    if kind in ("gptq-int4", "gptq-int8"):
        return gptq_weight_bytes(out_features, in_features, group_size, 8 if kind == "gptq-int8" else 4)
    if kind == "awq-int4":
        return awq_weight_bytes(out_features, in_features, group_size)
    if kind == "fp8":
        return fp8_weight_bytes(out_features, in_features)
    if kind == "mxfp4":
        return mxfp4_weight_bytes(out_features, in_features)
    raise ValueError(f"not a quantized kind: {kind}")

"""inference.weights: how an inference run stores its weights, and what that changes in the estimate.

Plain bf16 / fp16 / fp32 weights run the model in that dtype (the estimate takes the matching precision). Quantized
weights (bitsandbytes int8 / nf4 / fp4, GPTQ and AWQ int4, FineGrainedFP8) replace every decoder layer's nn.Linear
weight by the library's packed tensors (calc.contract.quantized), but those a pasted config's modules_to_not_convert
names (calc.contract.module_paths; Meta's FP8 405B keeps attention and its first and last layers 16-bit); MXFP4
(gpt-oss) converts only the routed experts; what transformers leaves out of the conversion
stays 16-bit: the embeddings, the norms, the biases, lm_head (quantizers/base.py get_keys_to_not_convert: the output
embedding and tied weights) and a MoE model's routed experts (3-D nn.Parameters, no nn.Linear), except under
FineGrainedFP8, which converts the experts too (integrations/finegrained_fp8.py FP8Experts: fp8 stacks with a
scale per 128 x 128 block of each expert). Activations run in
the 16-bit compute dtype. Modelled from the libraries' source and not measured: their kernels need CUDA.
"""

from __future__ import annotations

from dataclasses import replace

from calc.contract.architectures import ModelSpec, per_spec
from calc.contract.i18n import N_
from calc.contract.model_spec import Linear
from calc.contract.module_paths import converted_layers
from calc.contract.quantized import EXPERT_ONLY_WEIGHTS, QUANTIZED_WEIGHTS, quantized_weight_bytes
from calc.contract.scenario import Mode, Scenario
from calc.memory.result import Component, words
from calc.memory.states import States

COMPUTE_BYTES = 2  # the 16-bit dtype quantized models compute in and keep their unconverted weights in
QUANTIZED_SOURCE = N_("modelled from the quantization library's source, not measured (its kernels need CUDA): "
                      "packed weights and their scales for every decoder-layer nn.Linear (under FP8 the routed "
                      "experts too); embeddings, norms, biases and lm_head stay 16-bit")
BNB_SOURCE = N_("bitsandbytes' packed weights and their constants for every decoder-layer nn.Linear, checked against "
                "a model bitsandbytes quantized; embeddings, norms, biases, lm_head and routed experts stay 16-bit. "
                "The matmuls' transients are modelled from its CUDA source, not measured")
MXFP4_SOURCE = N_("modelled from the MXFP4 source of transformers and vLLM, not measured (its kernels need CUDA): "
                  "the routed experts as 4-bit values with one 8-bit scale per 32; attention, router, embeddings "
                  "and lm_head stay 16-bit")


def weights_kind(sc: Scenario) -> str | None:
    """inference.weights where it applies (mode inference), else None."""
    return sc.inference.weights if sc.mode == Mode.inference else None


def quantized(sc: Scenario) -> bool:
    return sc.mode == Mode.inference and sc.inference.quantized


def inference_scenario(sc: Scenario) -> Scenario:
    """The scenario the inference estimate runs: the precision inference.weights computes in
    (InferenceConfig.precision); unchanged without inference.weights."""
    if weights_kind(sc) is None:
        return sc
    p = sc.inference.precision(sc.training.precision)
    return sc if p == sc.training.precision else sc.with_training(precision=p)


def converts(lin: Linear, kind: str) -> bool:
    """Whether the quantizer of `kind` converts this weight kind: every nn.Linear (bitsandbytes, GPTQ, AWQ); FP8
    (FineGrainedFP8's FP8Experts) the routed experts' stacks too; MXFP4 only the routed experts."""
    if kind in EXPERT_ONLY_WEIGHTS:
        return lin.expert
    return (lin.module and not lin.expert) or (kind == "fp8" and lin.expert)


def quantized_linears(spec: ModelSpec, layers: int, first: bool, tp: int, kind: str = "int8",
                      not_converted: tuple[str, ...] = ()) -> list[tuple[int, int, int]]:
    """(out_features / tp, in_features, how many) of each weight the quantizer of `kind` converts on this stage
    (the first `layers` decoder layers, or the last ones), less the layers whose module modules_to_not_convert
    names (calc.contract.module_paths)."""
    dense = min(layers, spec.dense_layers) if first else 0
    start = 0 if first else spec.num_layers - layers
    out: list[tuple[int, int, int]] = []
    for is_dense, indices in ((True, range(start, start + dense)), (False, range(start + dense, start + layers))):
        for lin in spec.linear_layers(is_dense) if indices else []:
            n = converted_layers(spec, lin, indices, not_converted) if converts(lin, kind) else 0
            if n:
                out.append((lin.out_features // tp, lin.in_features, n * lin.count))
    return out


def quantized_states(sc: Scenario, st: States, layers: int, first: bool) -> States:
    """The stage's weights with its decoder-layer linears stored quantized (inference.weights)."""
    kind, t = sc.inference.weights, sc.training
    assert kind is not None
    skip = sc.not_converted
    linears = per_spec(sc.spec, ("quantized linears", layers, first, t.tensor_parallel, kind, skip),
                       lambda: quantized_linears(sc.spec, layers, first, t.tensor_parallel, kind, skip))
    params = sum(o * i * n for o, i, n in linears)
    packed = sum(quantized_weight_bytes(kind, o, i, sc.inference.double_quant) * n for o, i, n in linears)
    weights = st.weights - COMPUTE_BYTES * params + packed
    formula = words("formula", N_("{rest} B of 16-bit weights + {params} linear weights stored as {kind} "
                                  "({packed} B)"), rest=f"{st.weights - COMPUTE_BYTES * params:,}",
                    params=f"{params:,}", kind=kind, packed=f"{packed:,}")
    source = (BNB_SOURCE if kind in ("int8", "nf4", "fp4") else MXFP4_SOURCE if kind in EXPERT_ONLY_WEIGHTS
              else QUANTIZED_SOURCE)
    component = Component(key="weights", category="parameters", label=N_("Model weights"), bytes=weights,
                          source=source, **formula)
    return replace(st, weights=weights, components=[component])


def dequantize_bytes(sc: Scenario, tokens: int) -> int:
    """The largest transient a quantized linear adds to a forward over `tokens` tokens: bitsandbytes 4-bit
    dequantizes the whole weight to the compute dtype before the matmul (autograd/_functions.py MatMul4Bit, unless
    a single token takes the gemv kernel); int8 quantizes the input to int8 and returns an int32 product before
    scaling it back (MatMul8bitLt, int8_vectorwise_quant, int8_linear_matmul); FP8Linear quantizes the input to fp8
    with an fp32 scale per 128 values (finegrained_fp8.py act_quant); GPTQ's and AWQ's kernels dequantize inside
    the matmul; MXFP4's expert kernels read the packed values (Mxfp4GptOssExperts, triton_kernels matmul_ogs)."""
    kind = weights_kind(sc)
    if kind not in QUANTIZED_WEIGHTS or kind in EXPERT_ONLY_WEIGHTS:
        return 0
    t, skip = sc.training, sc.not_converted
    linears = [(o, i) for o, i, _ in quantized_linears(sc.spec, sc.spec.num_layers, True, t.tensor_parallel, "int8",
                                                        skip)]  # the nn.Linear modules: the FP8 experts run apart
    if kind in ("nf4", "fp4"):
        return 0 if tokens == 1 else max((COMPUTE_BYTES * o * i for o, i in linears), default=0)
    if kind == "int8":
        return max((tokens * (i + 4 * o) + 4 * tokens for o, i in linears), default=0)
    if kind == "fp8":
        return max((tokens * i + 4 * tokens * -(-i // 128) for o, i in linears), default=0)
    return 0

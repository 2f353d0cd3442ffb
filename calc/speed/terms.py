"""The step's terms as numbers: its shape, its FLOPs per token, and each term's seconds with the quantities
behind them (bytes, weights, passes, messages). calc.speed.step adds the terms up; calc.speed.formulas words
them. Nothing here formats a string."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from calc.contract import precision as prec
from calc.contract.architectures import ModelSpec, per_spec
from calc.contract.parallel import REDUCE_BUCKET_ELEMENTS, layers_on_stage
from calc.contract.quantized import data_bytes_per_weight
from calc.contract.scenario import Attention, Checkpointing, LoraConfig, Mode, Offload, Optimizer, Precision
from calc.speed.assumptions import (
    EAGER_SCORE_PASSES,
    EAGER_SCORE_PASSES_INFERENCE,
    ZERO3_FETCH_LATENCY_S,
    SpeedAssumptions,
)
from calc.speed.hardware import Link, SpeedHardware, link, peak_flops_per_s

STATE_SAMPLE_SHAPE = ((4096, 4096), 1)  # one large matrix: the optimizer's state bytes per parameter, measured on it


class StepConfig(Protocol):
    """What the speed model reads of a training configuration: a TrainingConfig, or the recommender's light
    stand-in with the same attribute names (calc.recommend.combos.LightConfig: no validation, thousands per
    search)."""

    precision: Precision
    activation_checkpointing: Checkpointing
    checkpoint_every: int
    attention: Attention
    zero_stage: int
    offload_optimizer: Offload
    offload_params: Offload
    tensor_parallel: int
    pipeline_parallel: int
    optimizer: Optimizer
    lora: LoraConfig | None
    micro_batch_size: int
    gradient_accumulation_steps: int
    seq_len: int
    framework: str


class ShapeNumbers(NamedTuple):
    """A model's matmul weights and parameters, as the FLOPs per token count them."""

    layer_active_matmul_params: int  # a decoder layer's matmul weights one token multiplies (its routed experts)
    layer_matmul_params: int  # all of a decoder layer's matmul weights
    head_matmul_params: int  # the LM head, V x H (also when tied)
    attention_width: int  # d_attn = heads x head_dim
    total_params: int


def shape_numbers(spec: ModelSpec) -> ShapeNumbers:
    """The spec's ShapeNumbers (memoized by the spec's value)."""

    def numbers() -> ShapeNumbers:
        layer_all = spec.layer_matmul_params()
        inactive = (spec.num_experts - spec.experts_run_per_token) * spec.mlp_params_per_expert()
        return ShapeNumbers(layer_all - inactive, layer_all, spec.vocab_size * spec.hidden_size, spec.q_width,
                            spec.total_params())

    return per_spec(spec, "speed shape numbers", numbers)


def lora_params_per_layer(spec: ModelSpec, t: StepConfig) -> int:
    """Adapter weights per layer: r x (in + out) for each targeted linear (peft; ModelSpec.linear_layers)."""
    if t.lora is None:
        return 0
    rank, targets = t.lora.rank, t.lora.targets
    return per_spec(spec, ("lora", rank, targets), lambda: spec.lora_params_per_layer(rank, targets))


def lora_params_total(spec: ModelSpec, t: StepConfig) -> int:
    """Adapter weights of the whole model (a MoE model's dense layers have their own MLP adapters)."""
    if t.lora is None:
        return 0
    rank, targets = t.lora.rank, t.lora.targets
    return per_spec(spec, ("lora total", rank, targets), lambda: spec.lora_params(rank, targets))


def linears_per_layer(spec: ModelSpec) -> int:
    """Weights per decoder layer that ZeRO-3 partitions and fetches (ModelSpec.linear_layers: fused
    projections and 3-D expert tensors are one weight each)."""
    return per_spec(spec, "linears", lambda: len(spec.linear_layers()))


# ---- the step's shape and FLOPs ----------------------------------------------------------------------

class StepShape(NamedTuple):
    """Everything the terms read: the configuration, the model's numbers and the work of one step."""

    spec: ModelSpec
    config: StepConfig
    training: bool
    tp: int
    pp: int
    dp: int
    micro_batch: int
    seq_len: int
    accumulation_steps: int  # micro-batches per optimizer step (1 in inference)
    layers: int
    stage_layers: int  # decoder layers on the first pipeline stage
    shape: ShapeNumbers
    matmul_params_per_token: int  # N: every layer's matmul weights a token multiplies, plus the LM head
    attention_flops_per_layer: float  # QK^T and PV forward, per token and layer: 4 x S x d_attn (half if causal)
    peak_flops_per_s: float
    dtype: str
    tokens_per_replica: int
    tokens_per_step: int
    lora_params_per_layer: int  # 0 in inference
    lora_params_total: int  # 0 in inference
    checkpointing: Checkpointing  # none in inference


def step_shape(spec: ModelSpec, t: StepConfig, hw: SpeedHardware, mode: Mode, a: SpeedAssumptions) -> StepShape:
    training = mode == Mode.train
    tp, pp = t.tensor_parallel, t.pipeline_parallel
    dp = hw.num_gpus // (tp * pp)
    ga = t.gradient_accumulation_steps if training else 1
    shape = shape_numbers(spec)
    layers = spec.num_layers
    peak, dtype = peak_flops_per_s(hw.gpu, t.precision)
    tokens_replica = t.micro_batch_size * t.seq_len * ga
    return StepShape(
        spec, t, training, tp, pp, dp, t.micro_batch_size, t.seq_len, ga, layers, layers_on_stage(layers, pp), shape,
        layers * shape.layer_active_matmul_params + shape.head_matmul_params,
        4 * t.seq_len * shape.attention_width * (0.5 if a.attention_flops == "causal" else 1.0), peak, dtype,
        tokens_replica, tokens_replica * dp, lora_params_per_layer(spec, t) if training else 0,
        lora_params_total(spec, t) if training else 0,
        t.activation_checkpointing if training else Checkpointing.none)


class Flops(NamedTuple):
    """FLOPs per token: the model's (PaLM's MFU counts these), the forward's, the recomputation's, and all that
    runs (model + recomputation)."""

    model_per_token: float
    forward_per_token: float
    recompute_per_token: float
    executed_per_token: float
    checkpointed_layers: int  # full checkpointing: the layers that rerun their forward (1 in k, rounded up)


def flops(x: StepShape) -> Flops:
    """6N + 12 L S d_attn per token in training (4N + 6 N_lora + ... with frozen LoRA base weights), 2N + 4 L S
    d_attn in inference, plus what checkpointing recomputes (see calc.speed's docstring)."""
    n_mm, layers, att_fwd = x.matmul_params_per_token, x.layers, x.attention_flops_per_layer
    if not x.training:
        model = 2 * n_mm + layers * att_fwd
        forward = model
    elif x.config.lora is not None:
        n_lora = x.lora_params_total
        model = 4 * n_mm + 6 * n_lora + 3 * layers * att_fwd
        forward = 2 * n_mm + 2 * n_lora + layers * att_fwd
    else:
        model = 6 * n_mm + 3 * layers * att_fwd
        forward = 2 * n_mm + layers * att_fwd
    recompute, checkpointed = 0.0, 0
    if x.checkpointing == Checkpointing.full:
        checkpointed = -(-layers // x.config.checkpoint_every)
        recompute = checkpointed * (2 * (x.shape.layer_active_matmul_params + x.lora_params_per_layer) + att_fwd)
    elif x.checkpointing == Checkpointing.selective:
        recompute = layers * att_fwd
    return Flops(model, forward, recompute, model + recompute, checkpointed)


# ---- compute ------------------------------------------------------------------------------------------

def compute_seconds(x: StepShape, f: Flops, a: SpeedAssumptions) -> float:
    """The executed FLOPs of one replica's tokens, split over tp x pp GPUs, at MFU x peak."""
    return f.executed_per_token * x.tokens_per_replica / (x.tp * x.pp) / (x.peak_flops_per_s * a.mfu)


def bubble_seconds(x: StepShape, compute_s: float) -> float:
    """1F1B's bubble, (p-1)/m of the compute in training; filling the pipeline once in inference."""
    return compute_s * (x.pp - 1) / (x.accumulation_steps if x.training else x.pp)


class EagerTraffic(NamedTuple):
    """Eager attention's passes over the B x heads/tp x S x S scores through HBM."""

    passes: int
    activation_bytes: int
    score_bytes: int
    seconds: float


def eager_traffic(x: StepShape, hw: SpeedHardware) -> EagerTraffic:
    a_bytes = prec.activation_bytes(x.config.precision)
    passes = EAGER_SCORE_PASSES if x.training else EAGER_SCORE_PASSES_INFERENCE
    score_bytes = x.micro_batch * (x.spec.num_heads // x.tp) * x.seq_len * x.seq_len * a_bytes
    seconds = passes * score_bytes * x.stage_layers * x.accumulation_steps / hw.gpu.memory_bandwidth_bytes_per_s
    return EagerTraffic(passes, a_bytes, score_bytes, seconds)


class Dequantization(NamedTuple):
    """QLoRA's frozen int8/nf4 weights read and written as bf16 before every matmul that uses them."""

    quantized_bytes_per_weight: float
    traffic_bytes_per_weight: float  # HBM bytes read and written per weight per dequantisation
    weights: int  # the first stage's frozen weights on one GPU
    passes: float  # forward and backward, plus the share of checkpointed layers whose forward reruns
    seconds: float


# torchao's NF4Tensor.get_original_weight in eager PyTorch, op by op, in bytes per weight read + written: the two
# nibble shifts/masks of the packed bytes (1 + 1), each half's indices widened to int64 (0.5 + 4, twice), the two
# lookups of the NF4 table by those indices (4 + 1, twice), the scalers expanded to each half (1, twice), each half
# scaled (2 + 1, twice) and torch.stack of the halves (2 + 2). Counted from torchao 0.17's source and the ops its
# CPU run dispatches, not timed on a GPU.
TORCHAO_NF4_DEQUANT_TRAFFIC = 2 * 1 + 2 * 4.5 + 2 * 5 + 2 * 1 + 2 * 3 + 4


def dequantization(x: StepShape, f: Flops, hw: SpeedHardware, lora: LoraConfig) -> Dequantization:
    q_bytes = data_bytes_per_weight(lora.base_weights)
    traffic = TORCHAO_NF4_DEQUANT_TRAFFIC if x.config.framework == "torchtune" else q_bytes + 2
    weights = x.stage_layers * x.shape.layer_matmul_params // x.tp
    passes = (2 if x.training else 1) + f.checkpointed_layers / x.layers
    seconds = weights * traffic * passes * x.accumulation_steps / hw.gpu.memory_bandwidth_bytes_per_s
    return Dequantization(q_bytes, traffic, weights, passes, seconds)


# ---- communication ------------------------------------------------------------------------------------

class DataParallelComm(NamedTuple):
    """The data-parallel collectives of a step at its ZeRO stage: what they move, how long they take and how
    much of that overlap_comm hides behind compute."""

    zero_stage: int
    grad_bytes: int  # one GPU's (trainable) gradients
    weight_bytes: int  # one GPU's weights
    link: Link
    total_seconds: float
    exposed_seconds: float
    hidden_seconds: float  # ZeRO 0-2: the backward compute the reduction can hide behind
    forward_gather_seconds: float  # ZeRO-3, per micro-batch: the forward all-gather ...
    forward_compute_seconds: float  # ... and the forward compute it hides behind
    backward_comm_seconds: float  # ZeRO-3, per micro-batch: the backward all-gather + reduce-scatter ...
    backward_compute_seconds: float  # ... and the backward compute it hides behind


def data_parallel_comm(x: StepShape, f: Flops, compute_s: float, hw: SpeedHardware,
                       a: SpeedAssumptions) -> DataParallelComm:
    """Ring volumes per ZeRO stage (Rajbhandari et al. 2020, section 7) over the data-parallel link; with
    overlap_comm, stage 0/1 reduce at the accumulation boundary, so only the last micro-batch's backward hides
    them; stage 2 reduces during every micro-batch's backward; stage 3 prefetches the forward all-gather behind
    forward compute and the backward all-gather + reduce-scatter behind backward compute. The last reduce bucket
    always waits for the end of backward."""
    t, dp, ga = x.config, x.dp, x.accumulation_steps
    params_local = x.shape.total_params // (x.tp * x.pp)
    trainable_local = x.lora_params_total // (x.tp * x.pp) if t.lora is not None else params_local
    gb = prec.grad_bytes_per_param(t.precision) if t.lora is None else 4
    wb = prec.weight_bytes_per_param(t.precision) if t.lora is None else data_bytes_per_weight(t.lora.base_weights)
    m_grad, m_w = trainable_local * gb, params_local * wb
    lk = link(hw, dp, x.tp, a)
    bw, frac, z = lk.bytes_per_s, (dp - 1) / dp, t.zero_stage
    if z == 0:
        over_b, after_b = 2 * frac * m_grad, 0.0
    elif z == 1:
        over_b, after_b = frac * m_grad, frac * m_w
    elif z == 2:
        over_b, after_b = ga * frac * m_grad, frac * m_w
    else:
        over_b, after_b = ga * frac * (2 * m_w + m_grad), 0.0
    total = (over_b + after_b) / bw
    hide = fwd_c = fwd_mb = bwd_c = bwd_mb = 0.0
    if not a.overlap_comm:
        return DataParallelComm(z, m_grad, m_w, lk, total, total, hide, fwd_c, fwd_mb, bwd_c, bwd_mb)
    bwd_share = 1.0 - f.forward_per_token / f.executed_per_token
    fwd_mb = compute_s * (1 - bwd_share) / ga
    bwd_mb = compute_s * bwd_share / ga
    last_bucket = min(frac * min(m_grad, REDUCE_BUCKET_ELEMENTS * gb) / bw, over_b / bw)
    if z < 3:
        hide = bwd_mb if z < 2 else bwd_mb * ga
        exposed = max(over_b / bw - hide, last_bucket) + after_b / bw
    else:
        fwd_c, bwd_c = frac * m_w / bw, frac * (m_w + m_grad) / bw
        exposed = ga * (max(0.0, fwd_c - fwd_mb) + max(0.0, bwd_c - bwd_mb))
        exposed = max(exposed, last_bucket)
    return DataParallelComm(z, m_grad, m_w, lk, total, exposed, hide, fwd_c, fwd_mb, bwd_c, bwd_mb)


class FetchLatency(NamedTuple):
    """ZeRO-3's fixed cost per module all-gather, forward and backward, which prefetching does not hide."""

    fetches: int  # per micro-batch
    seconds: float


def zero3_fetch_latency(x: StepShape) -> FetchLatency:
    fetches = 2 * (x.stage_layers * linears_per_layer(x.spec) + 2)
    return FetchLatency(fetches, x.accumulation_steps * fetches * ZERO3_FETCH_LATENCY_S)


class TensorParallelComm(NamedTuple):
    """Megatron's all-reduces of the B x S x H activations, on the critical path."""

    per_layer: int  # all-reduces per layer: 2 forward (+ 2 backward)
    recomputed_layers: float  # the first stage's share of the checkpointed layers, whose forward reruns
    message_bytes: int
    link: Link
    seconds: float


def tensor_parallel_comm(x: StepShape, f: Flops, hw: SpeedHardware, a: SpeedAssumptions) -> TensorParallelComm:
    t, tp, layers = x.config, x.tp, x.layers
    msg = x.micro_batch * x.seq_len * x.spec.hidden_size * prec.activation_bytes(t.precision)
    lk = link(hw, tp, 1, a)
    recomputed = f.checkpointed_layers * x.stage_layers / layers
    per_layer = 4 if x.training else 2
    n_ar = x.accumulation_steps * (per_layer * x.stage_layers + 2 * recomputed)
    return TensorParallelComm(per_layer, recomputed, msg, lk, n_ar * 2 * (tp - 1) / tp * msg / lk.bytes_per_s)


class PipelineComm(NamedTuple):
    """The activations (and gradients) sent between adjacent stages."""

    messages: int
    message_bytes: int
    link: Link
    seconds: float


def pipeline_comm(x: StepShape, hw: SpeedHardware, a: SpeedAssumptions) -> PipelineComm:
    msg = x.micro_batch * x.seq_len * x.spec.hidden_size * prec.activation_bytes(x.config.precision)
    lk = link(hw, x.pp, x.tp * x.dp, a)
    messages = x.accumulation_steps * (2 if x.training else 1)
    return PipelineComm(messages, msg, lk, messages * msg / lk.bytes_per_s)


# ---- offload ------------------------------------------------------------------------------------------

class OffloadNumbers(NamedTuple):
    """What ZeRO-Offload / ZeRO-Infinity move each step: every term's seconds, and the sizes the words quote.
    A term that does not apply takes 0 s (and is not listed)."""

    pcie_bytes_per_s: float
    part_params: float  # the optimizer's partition on one GPU
    grad_moves: int  # gradient copies to the host per step (every micro-batch from ZeRO-2)
    grad_bytes: int
    weight_bytes: int
    pcie_seconds: float
    cpu_adam_seconds: float
    state_bytes_per_param: float  # master + optimizer states, read and written from NVMe
    nvme_optimizer_seconds: float
    param_part: float  # offloaded parameters on one GPU, fetched before every use
    param_fetches: int
    param_pcie_seconds: float
    nvme_params_seconds: float


def _state_bytes_per_param(t: StepConfig) -> float:
    """Master weights and optimizer states per parameter (fp32 states for LoRA adapters)."""
    if t.lora is not None:
        return 4 + prec.optimizer_state_bytes(t.optimizer, Precision.fp32, [STATE_SAMPLE_SHAPE]) / 4096**2
    return (prec.master_bytes_per_param(t.precision)
            + prec.optimizer_state_bytes(t.optimizer, t.precision, [STATE_SAMPLE_SHAPE]) / 4096**2)


def offload_numbers(x: StepShape, hw: SpeedHardware, a: SpeedAssumptions) -> OffloadNumbers:
    """PCIe copies (not overlapped), the CPU Adam step and NVMe traffic of an offloading training step."""
    t, ga, per_node = x.config, x.accumulation_steps, hw.gpus_per_node
    pcie = hw.gpu.pcie_bandwidth_bytes_per_s * a.comm_efficiency  # pinned-memory copies reach ~80% of x16
    trainable = (x.lora_params_total if t.lora is not None else x.shape.total_params) // (x.tp * x.pp)
    part = trainable / (x.dp if t.zero_stage >= 1 else 1)
    gb = prec.grad_bytes_per_param(t.precision) if t.lora is None else 4
    wb = prec.weight_bytes_per_param(t.precision) if t.lora is None else 2
    grad_moves = ga if t.zero_stage >= 2 else 1
    pcie_s = adam_s = sb = nv_opt_s = w_part = w_s = nv_par_s = 0.0
    fetches = 0
    if t.offload_optimizer != Offload.none:
        pcie_s = part * (grad_moves * gb + wb) / pcie
        adam_s = part * per_node / a.cpu_adam_params_per_s_per_node
        if t.offload_optimizer == Offload.nvme:
            sb = _state_bytes_per_param(t)
            nv_opt_s = 2 * part * sb * per_node / hw.nvme_bytes_per_s
    if t.offload_params != Offload.none:
        w_part = x.shape.total_params // (x.tp * x.pp) / x.dp
        fetches = ga * (2 + (1 if x.checkpointing == Checkpointing.full else 0))
        w_s = fetches * w_part * wb / pcie
        if t.offload_params == Offload.nvme:
            nv_par_s = fetches * w_part * wb * per_node / hw.nvme_bytes_per_s
    return OffloadNumbers(pcie, part, grad_moves, gb, wb, pcie_s, adam_s, sb, nv_opt_s, w_part, fetches, w_s,
                          nv_par_s)

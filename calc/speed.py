"""Step time and tokens/s per GPU for a scenario: compute, exposed communication and offload, each
term with its formula and source. Seconds and bytes inside; convert at the edge.

Conventions (said once, used everywhere below):

* FLOPs per token follow PaLM (Chowdhery et al. 2022, arXiv 2204.02311, appendix B) and
  Narayanan et al. 2021 (arXiv 2104.04473, eq. 3): a matmul with weight W costs 2|W| FLOPs per token
  forward and 4|W| backward (input gradient + weight gradient), so training costs 6 x N per token
  (Kaplan et al. 2020, arXiv 2001.08361, table 1). N counts the weights that are multiplied per token:
  every decoder layer's linear maps (for MoE only the experts a token is routed to) plus the LM head
  (V x H, also when tied); the embedding lookup and norms do no matmul.
* Attention scores and context (QK^T and PV) add 2 x 2 x S x d_attn per layer per token forward,
  i.e. 12 x L x S x d_attn per token for training, counting the full S x S square (non-causal), as
  PaLM and Megatron do. FlashAttention's causal kernels skip the masked half, but the published MFU
  figures we calibrate against use the full-square convention, so using it keeps our MFU comparable;
  `SpeedAssumptions.attention_flops="causal"` halves the term instead.
* Frozen LoRA base weights need no weight gradient: 4 x N_base (forward + input gradient) plus 6 x the
  adapters' own weights (Hu et al. 2021, arXiv 2106.09685; the QLoRA paper, Dettmers et al. 2023,
  arXiv 2305.14314, section 2, for the dequantise-then-matmul scheme).
* Recomputation: full checkpointing of 1 in k layers reruns those layers' forward (2 x N_layer +
  4 x S x d_attn per token and layer); selective checkpointing reruns only the attention core
  (4 x S x d_attn per layer; Korthikanti et al. 2022, arXiv 2205.05198, section 5).
* The executed FLOPs (model FLOPs + recomputation) run at `mfu` x the GPU's dense peak for the compute
  dtype. Because recomputation is included, `mfu` is strictly a hardware-FLOPs utilisation in PaLM's
  terms; `SpeedEstimate.mfu_model` reports the model-FLOPs utilisation the step time implies.

Calibration of the default `mfu` = 0.40 (bf16 dense decoder training, A100/H100 class):
* Llama 2 (Touvron et al. 2023, arXiv 2307.09288, table 2): 184,320 A100-80GB GPU hours for 2T
  tokens at 7B and 1,720,320 at 70B, i.e. 3,014 and 323 tokens/s per GPU; with 6N + 12LSd FLOPs per
  token that is an MFU of 0.46 (7B) and 0.45 (70B) at 312 TFLOPS, including all cluster overheads.
* PaLM table 3 lists MFU 46.2% (PaLM 540B), 32.5% (Gopher), 29.7% (MT-NLG 530B), 21.3% (GPT-3).
* Megatron-LM (Narayanan et al. 2021, table 1) reaches 44-52% of A100 peak in hardware FLOPs with
  full recomputation on 3D-parallel GPT models.
* llm-analysis (cli99/llm-analysis) defaults to a flops efficiency of 1.0 and notes "~0.5" for
  Megatron-LM; we take the lower 0.40 because the models here are run with DeepSpeed/HF, not
  Megatron's fused kernels. tests/calc/speed/test_speed.py checks the Llama 2 figures within a stated tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from calc.contract import precision as prec
from calc.contract.architectures import ModelSpec, per_spec
from calc.contract.i18n import N_
from calc.contract.parallel import REDUCE_BUCKET_ELEMENTS, layers_on_stage
from calc.contract.presets import ClusterPreset, GpuPreset, cluster_presets, gpu_presets
from calc.contract.scenario import Attention, Checkpointing, Mode, Offload, Optimizer, Precision, Scenario

T = TypeVar("T")

# ---- named assumptions ------------------------------------------------------------------------

DEFAULT_MFU = 0.40  # see the module docstring: Llama 2 GPU hours, PaLM table 3, Megatron-LM table 1

# Achieved bus bandwidth of NCCL ring collectives relative to the link's per-direction peak for large
# messages: nccl-tests all_reduce_perf reaches ~230-240 GB/s busbw on DGX A100 NVLink (300 GB/s per
# direction) and ~23-24 GB/s on a 200 Gb/s HDR NIC (NVIDIA nccl-tests PERFORMANCE.md; DGX A100 user guide).
COMM_EFFICIENCY = 0.80

# DeepSpeed's CPUAdam (AVX2/AVX512, ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840, section 5.1; 5-7x
# PyTorch's CPU Adam per the DeepSpeed ZeRO-Offload tutorial) updates about 1-2e9 fp32 parameters per
# second on a two-socket host. DeepSpeed PR #7474 reports 2.4-3.1 s per step for Qwen2.5-3B with ZeRO-Offload
# on 2 A100-40GB and a 128-core host (compute included), i.e. >= ~1e9 params/s. We use the middle.
CPU_ADAM_PARAMS_PER_S_PER_NODE = 1.5e9

# Between nodes when the hardware names no cluster preset: one 200 Gb/s HDR InfiniBand NIC per GPU
# (DGX A100), 25e9 bytes/s per direction.
DEFAULT_INTER_NODE_BYTES_PER_S = 25e9
DEFAULT_NVME_BYTES_PER_S = 3.5e9  # one PCIe 4.0 NVMe SSD, sequential (ClusterPreset's default)

# Eager attention writes and re-reads the B x heads x S x S scores/probabilities: forward writes the
# scores, softmax reads them and writes the probabilities, PV reads those (4 passes); backward about
# twice that (8): 12 passes over the S x S tensors through HBM (FlashAttention, Dao et al. 2022,
# arXiv 2205.14135, section 3.2: standard attention needs Theta(N d + N^2) HBM accesses).
EAGER_SCORE_PASSES = 12

# NVLink bridges on PCIe cards (RTX 3090, RTX A6000, A100/H100 PCIe) join pairs of GPUs only; beyond a
# pair, collectives go over PCIe. SXM parts sit on an NVSwitch and reach every GPU in the node.
NVLINK_BRIDGE_GROUP = 2

# ZeRO-3 gathers every partitioned module (each linear weight above stage3_param_persistence_threshold)
# just before use, forward and backward. Prefetching hides the transfer but not each collective's fixed
# cost: NCCL's small-message all-gather latency is tens of microseconds (nccl-tests all_gather_perf at
# 8 bytes on 8 GPUs) and DeepSpeed's fetch coordinator adds Python hook work per module. This is why
# ZeRO-3 is slower than ZeRO-2 even where bandwidth is plentiful ("Stage 3 is slower than Stage 2",
# Hugging Face Transformers DeepSpeed guide, "How to choose which ZeRO stage").
ZERO3_FETCH_LATENCY_S = 50e-6


class SpeedAssumptions(BaseModel):
    """The editable constants of the speed model (defaults documented above)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Lower bounds keep step times finite and meaningful: 0.1 % of peak is 100x below any real run.
    mfu: float = Field(DEFAULT_MFU, ge=1e-3, le=1, description="fraction of dense peak reached by the executed FLOPs")
    comm_efficiency: float = Field(COMM_EFFICIENCY, ge=1e-3, le=1, description="achieved / peak link bandwidth")
    overlap_comm: bool = Field(
        True, description="DeepSpeed overlap_comm: DP/ZeRO collectives run on a side stream during backward "
                          "(and, for ZeRO-3 prefetch, forward); the export writes the same value")
    cpu_adam_params_per_s_per_node: float = Field(CPU_ADAM_PARAMS_PER_S_PER_NODE, ge=1e6, le=1e13)  # 1.5e9 typical
    attention_flops: Literal["full", "causal"] = Field(
        "full", description="count the full S x S attention square (PaLM/Megatron) or half of it (causal)")


# ---- results ----------------------------------------------------------------------------------

class SpeedTerm(BaseModel):
    """One term of the step time, with its formula (this scenario's numbers) and source."""

    model_config = ConfigDict(extra="forbid")

    key: str
    group: Literal["compute", "communication", "offload"]
    label: str
    seconds: float = Field(description="time this term adds to the step (exposed part only)")
    total_seconds: float = Field(description="time of the work before any overlap")
    formula: str
    source: str


class SpeedEstimate(BaseModel):
    """Estimated time of one optimizer step (all micro-batches) and the resulting throughput."""

    model_config = ConfigDict(extra="forbid")

    compute_s: float = Field(description="matmul compute incl. recomputation, pipeline bubble, eager/dequant traffic")
    communication_s: float = Field(description="exposed communication, after overlap with compute")
    communication_total_s: float = Field(description="all communication before overlap")
    offload_s: float = Field(description="PCIe transfers, CPU Adam and NVMe traffic of ZeRO-Offload/Infinity")
    step_s: float
    tokens_per_step: int = Field(description="global batch: micro x accumulation x data parallel x seq_len")
    tokens_per_s: float = Field(description="whole job")
    tokens_per_s_per_gpu: float
    model_flops_per_token: float = Field(description="6N + 12 L S d_attn (training) or 2N + 4 L S d_attn")
    executed_flops_per_token: float = Field(description="model FLOPs + recomputation")
    peak_tflops: float = Field(description="dense peak of the GPU for the compute dtype")
    mfu_assumed: float
    mfu_model: float = Field(description="model FLOPs utilisation implied by step_s (PaLM's definition)")
    bottleneck: Literal["compute", "communication", "offload"]
    interconnect: str = Field(description="link that carries the data-parallel collectives")
    terms: list[SpeedTerm]
    notes: list[str] = Field(default_factory=list)


# ---- the model ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Hw:
    gpu: GpuPreset
    num_gpus: int
    gpus_per_node: int
    inter_node_bytes_per_s: float
    nvme_bytes_per_s: float


@dataclass
class _Term:
    key: str
    group: str
    label: str
    seconds: float
    total: float
    formula: str
    source: str


@dataclass
class _Raw:
    terms: list[_Term]
    compute_s: float
    comm_s: float
    comm_total_s: float
    offload_s: float
    step_s: float
    tokens_per_step: int
    model_fpt: float
    exec_fpt: float
    peak_flops: float
    interconnect: str
    notes: list[str]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0


def hardware_of(sc: Scenario) -> _Hw:
    """GPU preset, node shape and link speeds for a scenario (cluster preset or defaults)."""
    hw = sc.resolved_hardware()
    if hw.gpu is None:
        raise ValueError("the speed model needs a GPU preset (hardware.gpu or hardware.cluster) for its TFLOPS "
                         "and link bandwidths; memory_bytes alone is not enough")
    cluster: ClusterPreset | None = cluster_presets().get(hw.cluster) if sc.hardware.cluster else None
    per_node = hw.gpus_in_node()
    inter = cluster.inter_node_bandwidth_bytes_per_s if cluster and cluster.inter_node_bandwidth_bytes_per_s \
        else DEFAULT_INTER_NODE_BYTES_PER_S
    nvme = cluster.nvme_bandwidth_bytes_per_s if cluster else DEFAULT_NVME_BYTES_PER_S
    return _Hw(gpu_presets()[hw.gpu], hw.num_gpus, per_node, inter, nvme)


def peak_flops_per_s(gpu: GpuPreset, p: Precision) -> tuple[float, str]:
    """Dense peak for the compute dtype: fp32 -> fp32_tflops (PyTorch leaves TF32 matmuls off by
    default), bf16 / amp-bf16 / bf16-mixed -> bf16_tflops, fp16 variants -> fp16_tflops. A GPU without
    bf16 units (V100, T4) runs bf16 through fp32 paths: fp32_tflops."""
    if p == Precision.fp32:
        return gpu.fp32_tflops * 1e12, "fp32"
    if p.uses_fp16:
        return gpu.fp16_tflops * 1e12, "fp16"
    if gpu.bf16 and gpu.bf16_tflops > 0:
        return gpu.bf16_tflops * 1e12, "bf16"
    return gpu.fp32_tflops * 1e12, "fp32 (no bf16 units)"


def _shape_numbers(spec: ModelSpec) -> tuple[int, int, int, int, int]:
    """(matmul weights per layer touched per token, all matmul weights per layer, LM head V*H,
    d_attn = heads x head_dim, all parameters)."""

    def numbers() -> tuple[int, int, int, int, int]:
        layer_all = spec.layer_matmul_params()
        inactive = (spec.num_experts - spec.experts_run_per_token) * spec.mlp_params_per_expert()
        return layer_all - inactive, layer_all, spec.vocab_size * spec.hidden_size, spec.q_width, spec.total_params()

    return per_spec(spec, "shape", numbers)


def _lora_params_per_layer(spec: ModelSpec, t: Any) -> int:
    """Adapter weights per layer: r x (in + out) for each targeted linear (peft; ModelSpec.linear_layers)."""
    if t.lora is None:
        return 0
    rank, targets = t.lora.rank, t.lora.targets
    return per_spec(spec, ("lora", rank, targets), lambda: spec.lora_params_per_layer(rank, targets))


def _lora_params_total(spec: ModelSpec, t: Any) -> int:
    """Adapter weights of the whole model (a MoE model's dense layers have their own MLP adapters)."""
    if t.lora is None:
        return 0
    rank, targets = t.lora.rank, t.lora.targets
    return per_spec(spec, ("lora total", rank, targets), lambda: spec.lora_params(rank, targets))


def _linears_per_layer(spec: ModelSpec) -> int:
    """Weights per decoder layer that ZeRO-3 partitions and fetches (ModelSpec.linear_layers: fused
    projections and 3-D expert tensors are one weight each)."""
    return per_spec(spec, "linears", lambda: len(spec.linear_layers()))


def _fmt_s(x: float) -> str:
    return f"{x:.3g} s"


_DP_LABELS = ("Data-parallel gradient all-reduce", "ZeRO-1 reduce-scatter + parameter all-gather",
              "ZeRO-2 gradient reduce-scatter + parameter all-gather",
              "ZeRO-3 parameter all-gathers + gradient reduce-scatter")


def _dp_volume_text(z: int, dp: int, ga: int, m_grad: int, m_w: int) -> str:
    """What the data-parallel collectives move at ZeRO stage z, as the formula shown for dp_comm."""
    if z == 0:
        return f"2 x ({dp}-1)/{dp} x {m_grad:,} B grads (all-reduce once per step)"
    if z == 1:
        return (f"({dp}-1)/{dp} x {m_grad:,} B grads (reduce-scatter) + ({dp}-1)/{dp} x {m_w:,} B "
                "weights (all-gather after the step)")
    if z == 2:
        return (f"{ga} micro-batches x ({dp}-1)/{dp} x {m_grad:,} B grads (reduce-scatter) + "
                f"({dp}-1)/{dp} x {m_w:,} B weights (all-gather after the step)")
    return (f"{ga} micro-batches x ({dp}-1)/{dp} x (2 x {m_w:,} B weights all-gathered forward and "
            f"backward + {m_grad:,} B grads reduce-scattered)")


def _bw_name(bw_kind: str) -> str:
    return {"nvlink": "NVLink", "pcie": "PCIe", "network": N_("inter-node network"), "none": "none"}[bw_kind]


def _link(hw: _Hw, group: int, stride: int, a: SpeedAssumptions) -> tuple[float, str]:
    """Per-direction bandwidth a ring collective over `group` GPUs spaced `stride` ranks apart gets:
    the network when the group leaves the node (ranks are laid out TP fastest, then DP, then PP, as in
    Megatron-LM), else NVLink (half the preset's bidirectional figure; only pairs on bridged PCIe
    cards) or PCIe."""
    if group <= 1:
        return math.inf, "none"
    if group * stride > hw.gpus_per_node:
        return hw.inter_node_bytes_per_s * a.comm_efficiency, "network"
    g = hw.gpu
    bridged = g.id.endswith("-pcie") or g.nvlink_bandwidth_bytes_per_s < 300e9
    if g.nvlink_bandwidth_bytes_per_s > 0 and (not bridged or group <= NVLINK_BRIDGE_GROUP):
        return g.nvlink_bandwidth_bytes_per_s / 2 * a.comm_efficiency, "nvlink"
    return g.pcie_bandwidth_bytes_per_s * a.comm_efficiency, "pcie"


def step_time(spec: ModelSpec, t: Any, hw: _Hw, mode: Mode, a: SpeedAssumptions, explain: bool = True) -> _Raw:
    """The whole model. `t` is a TrainingConfig or any object with the same attribute names (the
    recommender passes light stand-ins to avoid re-validating thousands of candidates). explain=False
    leaves every term's formula empty: the same seconds, without formatting a dozen strings (a search
    ranks thousands of candidates by their numbers and explains only the few it shows)."""
    notes: list[str] = []
    terms: list[_Term] = []
    p: Precision = t.precision
    tp, pp = t.tensor_parallel, t.pipeline_parallel
    dp = hw.num_gpus // (tp * pp)
    B, S, ga = t.micro_batch_size, t.seq_len, t.gradient_accumulation_steps
    training = mode == Mode.train
    if not training:
        ga = 1
    L = spec.num_layers
    layer_mm, layer_all, head_mm, d_attn, n_params = _shape_numbers(spec)
    n_mm = L * layer_mm + head_mm
    att_fwd = 4 * S * d_attn * (0.5 if a.attention_flops == "causal" else 1.0)  # per layer per token
    peak, dtype = peak_flops_per_s(hw.gpu, p)
    if dtype.startswith("fp32 (no"):
        notes.append(f"{hw.gpu.name} has no bf16 tensor cores: bf16 compute is costed at its fp32 rate")
    eff = peak * a.mfu
    tokens_replica = B * S * ga
    tokens_step = tokens_replica * dp

    # -- compute -------------------------------------------------------------------------------
    lora_layer = _lora_params_per_layer(spec, t) if training else 0
    lora_all = _lora_params_total(spec, t) if training else 0
    if not training:
        model_fpt = 2 * n_mm + L * att_fwd
        f_text = f"2 x {n_mm:,} (matmul weights) + {L} x {att_fwd:,.0f} (attention)" if explain else ""
        src = "forward only: 2 FLOPs per weight per token (Kaplan et al. 2020, table 1)"
        fwd_fpt = model_fpt
    elif t.lora is not None:
        n_lora = lora_all
        model_fpt = 4 * n_mm + 6 * n_lora + 3 * L * att_fwd
        f_text = (f"4 x {n_mm:,} (frozen base: forward + input grad) + 6 x {n_lora:,} (LoRA) "
                  f"+ 3 x {L} x {att_fwd:,.0f} (attention)") if explain else ""
        src = "frozen weights skip the weight gradient (Hu et al. 2021); attention per PaLM appendix B"
        fwd_fpt = 2 * n_mm + 2 * n_lora + L * att_fwd
    else:
        model_fpt = 6 * n_mm + 3 * L * att_fwd
        f_text = f"6 x {n_mm:,} (matmul weights) + 3 x {L} x {att_fwd:,.0f} (attention = 12 L S d_attn)" \
            if explain else ""
        src = "6N + 12LSd per token (PaLM appendix B; Narayanan et al. 2021 eq. 3; Kaplan et al. 2020)"
        fwd_fpt = 2 * n_mm + L * att_fwd
    recompute_fpt = 0.0
    rec_text = ""
    ckpt = t.activation_checkpointing if training else Checkpointing.none
    if ckpt == Checkpointing.full:
        k = t.checkpoint_every
        n_ck = -(-L // k)
        recompute_fpt = n_ck * (2 * (layer_mm + lora_layer) + att_fwd)
        rec_text = f" + {n_ck} checkpointed layers x (2 x {layer_mm + lora_layer:,} + {att_fwd:,.0f}) (recompute)" \
            if explain else ""
    elif ckpt == Checkpointing.selective:
        recompute_fpt = L * att_fwd
        rec_text = f" + {L} x {att_fwd:,.0f} (attention-core recompute)" if explain else ""
    exec_fpt = model_fpt + recompute_fpt
    compute_s = exec_fpt * tokens_replica / (tp * pp) / eff
    terms.append(_Term(
        "compute", "compute", "Matmul compute" + (" incl. recomputation" if recompute_fpt else ""), compute_s,
        compute_s,
        (f"({f_text}{rec_text}) FLOPs/token x {tokens_replica:,} tokens / (tp {tp} x pp {pp}) / "
         f"({peak / 1e12:g} TFLOPS {dtype} x MFU {a.mfu:g})") if explain else "",
        src + ("; recompute per Korthikanti et al. 2022" if recompute_fpt else "")))
    if pp > 1 and training:
        bubble = compute_s * (pp - 1) / ga
        terms.append(_Term("pipeline_bubble", "compute", "Pipeline bubble (1F1B)", bubble, bubble,
                           f"{_fmt_s(compute_s)} x (pp {pp} - 1) / {ga} micro-batches" if explain else "",
                           "bubble fraction (p-1)/m (Narayanan et al. 2021, section 2.2)"))
    elif pp > 1:
        bubble = compute_s * (pp - 1) / pp
        terms.append(_Term("pipeline_bubble", "compute", "Pipeline fill (one batch, no interleaving)", bubble,
                           bubble, f"{_fmt_s(compute_s)} x (pp {pp} - 1) / {pp}" if explain else "",
                           "GPipe/1F1B fill time"))
    layers_here = layers_on_stage(L, pp)
    if t.attention == Attention.eager:
        a_bytes = prec.activation_bytes(p)
        passes = EAGER_SCORE_PASSES if training else 4
        score_bytes = B * (spec.num_heads // tp) * S * S * a_bytes
        eager_s = passes * score_bytes * layers_here * ga / hw.gpu.memory_bandwidth_bytes_per_s
        terms.append(_Term("eager_attention", "compute", "Eager attention S x S traffic", eager_s, eager_s,
                           (f"{passes} passes x {score_bytes:,} B (B x heads/tp x S x S x {a_bytes} B) x "
                            f"{layers_here} layers x {ga} micro-batches / "
                            f"{hw.gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s HBM") if explain else "",
                           "standard attention is memory-bound on the S x S tensors (Dao et al. 2022, sec. 3)"))
    if t.lora is not None and t.lora.base_weights != "bf16":
        q_bytes = 0.5 if t.lora.base_weights == "nf4" else 1.0
        base_local = layers_here * layer_all // tp
        passes = (2 if training else 1) + (1 if ckpt == Checkpointing.full else 0)
        dq_s = base_local * (q_bytes + 2) * passes * ga / hw.gpu.memory_bandwidth_bytes_per_s
        terms.append(_Term("dequantize", "compute", f"{t.lora.base_weights} dequantisation", dq_s, dq_s,
                           (f"{base_local:,} weights x ({q_bytes:g} B read + 2 B bf16 write) x {passes} passes x "
                            f"{ga} micro-batches / {hw.gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s HBM")
                           if explain else "",
                           "QLoRA dequantises each frozen weight to bf16 before every matmul "
                           "(Dettmers et al. 2023; bitsandbytes)"))
    compute_total = sum(x.seconds for x in terms)

    # -- communication ---------------------------------------------------------------------------
    bwd_share = 1.0 - fwd_fpt / exec_fpt if training else 0.0
    comm_terms: list[_Term] = []
    interconnect = "none"
    if training and dp > 1:
        params_local = n_params // (tp * pp)
        trainable_local = lora_all // (tp * pp) if t.lora is not None else params_local
        gb = prec.grad_bytes_per_param(p) if t.lora is None else 4
        wb = prec.weight_bytes_per_param(p) if t.lora is None else (2 if t.lora.base_weights == "bf16" else 1)
        m_grad, m_w = trainable_local * gb, params_local * wb
        bw, kind = _link(hw, dp, tp, a)
        interconnect = _bw_name(kind)
        f = (dp - 1) / dp
        z = t.zero_stage
        if z == 0:
            over_b, after_b = 2 * f * m_grad, 0.0
        elif z == 1:
            over_b, after_b = f * m_grad, f * m_w
        elif z == 2:
            over_b, after_b = ga * f * m_grad, f * m_w
        else:
            over_b, after_b = ga * f * (2 * m_w + m_grad), 0.0
        total = (over_b + after_b) / bw
        if a.overlap_comm:
            # stage 0/1 reduce at the accumulation boundary: only the last micro-batch's backward hides
            # them; stage 2 reduces during every micro-batch's backward; stage 3 prefetches the forward
            # all-gather behind forward compute and the backward all-gather + reduce-scatter behind
            # backward compute. The last reduce bucket always waits for the end of backward.
            fwd_mb = compute_s * (1 - bwd_share) / ga
            bwd_mb = compute_s * bwd_share / ga
            last_bucket = min(f * min(m_grad, REDUCE_BUCKET_ELEMENTS * gb) / bw, over_b / bw)
            if z < 3:
                hide = bwd_mb if z < 2 else bwd_mb * ga
                exposed = max(over_b / bw - hide, last_bucket) + after_b / bw
                ov = (f"; overlap_comm hides up to {_fmt_s(hide)} of "
                      + ("the last micro-batch's backward" if z < 2 else "backward")) if explain else ""
            else:
                fwd_c, bwd_c = f * m_w / bw, f * (m_w + m_grad) / bw
                exposed = ga * (max(0.0, fwd_c - fwd_mb) + max(0.0, bwd_c - bwd_mb))
                exposed = max(exposed, last_bucket)
                ov = (f"; per micro-batch the forward all-gather ({_fmt_s(fwd_c)}) hides behind {_fmt_s(fwd_mb)} of "
                      f"forward and the backward all-gather + reduce-scatter ({_fmt_s(bwd_c)}) behind "
                      f"{_fmt_s(bwd_mb)} of backward") if explain else ""
            ov += f"; the last {REDUCE_BUCKET_ELEMENTS:,}-element reduce bucket stays exposed" if explain else ""
        else:
            exposed, ov = total, "; overlap_comm off: nothing hidden"
        comm_terms.append(_Term(
            "dp_comm", "communication", _DP_LABELS[z], exposed, total,
            f"[{_dp_volume_text(z, dp, ga, m_grad, m_w)}] / {bw / 1e9:.3g} GB/s ({_bw_name(kind)}, "
            f"x{a.comm_efficiency:g} efficiency){ov}" if explain else "",
            "ring collectives move 2(N-1)/N (all-reduce) or (N-1)/N (reduce-scatter, all-gather) of the data "
            "per GPU (Patarasuk & Yuan 2009); ZeRO-1/2 = DP volume, ZeRO-3 = 1.5x (Rajbhandari et al. 2020, "
            "section 7)"))
        if z == 3:
            fetches = 2 * (layers_on_stage(L, pp) * _linears_per_layer(spec) + 2)
            lat = ga * fetches * ZERO3_FETCH_LATENCY_S
            comm_terms.append(_Term(
                "zero3_fetch_latency", "communication", "ZeRO-3 per-module fetch latency", lat, lat,
                (f"{ga} micro-batches x {fetches} module all-gathers (forward + backward) x "
                 f"{ZERO3_FETCH_LATENCY_S * 1e6:g} us") if explain else "", "alpha of the alpha-beta (Hockney) cost model: "
                "small-message NCCL all-gather latency plus DeepSpeed's per-module fetch hooks; not hidden by "
                "prefetching"))
    if tp > 1:
        a_bytes = prec.activation_bytes(p)
        msg = B * S * spec.hidden_size * a_bytes
        bw, kind = _link(hw, tp, 1, a)
        n_ck = (-(-L // t.checkpoint_every) if ckpt == Checkpointing.full else 0) * layers_here / L
        per_layer = (4 if training else 2)
        n_ar = ga * (per_layer * layers_here + 2 * n_ck)
        tp_s = n_ar * 2 * (tp - 1) / tp * msg / bw
        comm_terms.append(_Term(
            "tp_comm", "communication", "Tensor-parallel all-reduces", tp_s, tp_s,
            (f"{ga} micro-batches x ({per_layer} x {layers_here} layers"
             + (f" + 2 x {n_ck:g} recomputed" if n_ck else "")
             + f") all-reduces x 2 x ({tp}-1)/{tp} x {msg:,} B (B x S x H) / {bw / 1e9:.3g} GB/s "
             f"({_bw_name(kind)}); on the critical path") if explain else "",
            "Megatron-LM: 2 all-reduces forward + 2 backward per layer (Shoeybi et al. 2019, fig. 4; "
            "Narayanan et al. 2021, section 3.2)"))
    if pp > 1:
        msg = B * S * spec.hidden_size * prec.activation_bytes(p)
        bw, kind = _link(hw, pp, tp * dp, a)
        n_msg = ga * (2 if training else 1)
        pp_s = n_msg * msg / bw
        comm_terms.append(_Term(
            "pp_comm", "communication", "Pipeline send/receive", pp_s, pp_s,
            f"{n_msg} messages x {msg:,} B (B x S x H activations/gradients) / {bw / 1e9:.3g} GB/s "
            f"({_bw_name(kind)})" if explain else "",
            "point-to-point between adjacent stages (Narayanan et al. 2021, section 2.2)"))
    terms += comm_terms
    comm_s = sum(x.seconds for x in comm_terms)
    comm_total = sum(x.total for x in comm_terms)

    # -- offload ---------------------------------------------------------------------------------
    off_s = 0.0
    if training and (t.offload_optimizer != Offload.none or t.offload_params != Offload.none):
        pcie = hw.gpu.pcie_bandwidth_bytes_per_s * a.comm_efficiency  # pinned-memory copies reach ~80% of x16
        trainable = (lora_all if t.lora is not None else n_params) // (tp * pp)
        part = trainable / (dp if t.zero_stage >= 1 else 1)
        gb = prec.grad_bytes_per_param(p) if t.lora is None else 4
        wb = prec.weight_bytes_per_param(p) if t.lora is None else 2
        per_node = hw.gpus_per_node
        if t.offload_optimizer != Offload.none:
            grad_moves = ga if t.zero_stage >= 2 else 1
            x_bytes = part * (grad_moves * gb + wb)
            x_s = x_bytes / pcie
            terms.append(_Term(
                "offload_pcie", "offload", "Gradients to CPU, updated weights back (PCIe)", x_s, x_s,
                (f"{part:,.0f} params x ({grad_moves} x {gb} B grads + {wb} B weights) / {pcie / 1e9:g} GB/s "
                 f"PCIe gen{hw.gpu.pcie_gen} (x{a.comm_efficiency:g})") if explain else "",
                "ZeRO-Offload moves gradients down and 16-bit parameters up every step (Ren et al. 2021, "
                "section 4); transfers counted as not overlapped"))
            adam_s = part * per_node / a.cpu_adam_params_per_s_per_node
            terms.append(_Term(
                "cpu_adam", "offload", "CPU Adam step", adam_s, adam_s,
                (f"{part:,.0f} params x {per_node} GPUs per node / {a.cpu_adam_params_per_s_per_node:.3g} "
                 "params/s per node") if explain else "",
                "DeepSpeed CPUAdam throughput (ZeRO-Offload paper; DeepSpeed PR #7474)"))
            off_s += x_s + adam_s
            if t.offload_optimizer == Offload.nvme:
                sb = (prec.master_bytes_per_param(p) + prec.optimizer_state_bytes(
                    t.optimizer, p, [((4096, 4096), 1)]) / 4096**2)
                if t.lora is not None:
                    sb = 4 + prec.optimizer_state_bytes(t.optimizer, Precision.fp32, [((4096, 4096), 1)]) / 4096**2
                nv_s = 2 * part * sb * per_node / hw.nvme_bytes_per_s
                terms.append(_Term(
                    "nvme_optimizer", "offload", "Optimizer states NVMe read + write", nv_s, nv_s,
                    (f"2 x {part:,.0f} params x {sb:g} B (master + states) x {per_node} GPUs per node / "
                     f"{hw.nvme_bytes_per_s / 1e9:g} GB/s NVMe") if explain else "",
                    "ZeRO-Infinity swaps optimizer states in and out each step (Rajbhandari et al. 2021, "
                    "arXiv 2104.07857)"))
                off_s += nv_s
        if t.offload_params != Offload.none:
            w_part = n_params // (tp * pp) / dp
            fetches = ga * (2 + (1 if ckpt == Checkpointing.full else 0))
            w_s = fetches * w_part * wb / pcie
            terms.append(_Term(
                "offload_params_pcie", "offload", "Parameters fetched from CPU (PCIe)", w_s, w_s,
                f"{ga} micro-batches x {fetches // ga} fetches x {w_part:,.0f} params x {wb} B / {pcie / 1e9:g} GB/s"
                if explain else "",
                "ZeRO-3 offload_param copies each partition to the GPU before it is all-gathered, in forward "
                "and backward (DeepSpeed ZeRO-Infinity)"))
            off_s += w_s
            if t.offload_params == Offload.nvme:
                nv_s = fetches * w_part * wb * per_node / hw.nvme_bytes_per_s
                terms.append(_Term(
                    "nvme_params", "offload", "Parameters read from NVMe", nv_s, nv_s,
                    (f"{fetches} reads x {w_part:,.0f} params x {wb} B x {per_node} GPUs per node / "
                     f"{hw.nvme_bytes_per_s / 1e9:g} GB/s") if explain else "", "ZeRO-Infinity parameter offload to NVMe"))
                off_s += nv_s

    step_s = compute_total + comm_s + off_s
    return _Raw(terms, compute_total, comm_s, comm_total, off_s, step_s, tokens_step, model_fpt, exec_fpt, peak,
                interconnect, notes)


def compute_rate_bound(raw: _Raw, gpus: int, a: SpeedAssumptions) -> float:
    """Tokens/s that `gpus` GPUs (dp x tp x pp) reach on the executed FLOPs alone: step_time's compute term
    (executed FLOPs per token x tokens / (tp x pp) / (peak x MFU)) inverted. Every other term (pipeline bubble,
    eager attention, dequantisation, exposed communication, offload) only adds time, and the FLOPs per token
    do not depend on the micro-batch split, so this bounds `raw`'s tokens_per_s at every split of the same
    tokens per replica from above (with a relative 1e-9 for rounding)."""
    return gpus * raw.peak_flops * a.mfu / raw.exec_fpt * (1 + 1e-9)


# Terms whose seconds are the same at every micro-batch split of the same sequences per replica in training: what
# is proportional to micro-batch x accumulation steps (the compute, eager attention's S x S traffic, the tensor-
# parallel all-reduces and the pipeline's sends, each B x S x H per micro-batch) and what happens once per optimizer
# step (the CPU Adam step and the optimizer states' NVMe traffic). The other terms depend on the split; all are >= 0.
_SPLIT_FREE_TERMS = frozenset({"compute", "eager_attention", "tp_comm", "pp_comm", "cpu_adam", "nvme_optimizer"})


def split_rate_bound(raw: _Raw, gpus: int, a: SpeedAssumptions, training: bool) -> float:
    """An upper bound of the tokens/s of every micro-batch split of `raw`'s sequences per replica, at least as
    tight as compute_rate_bound: in training, the tokens per step over the seconds of the terms that do not depend
    on the split (with a relative 1e-9 for rounding); in inference (one micro-batch of varying size) the
    compute-bound rate."""
    rate = compute_rate_bound(raw, gpus, a)
    if not training:
        return rate
    fixed = sum(x.seconds for x in raw.terms if x.key in _SPLIT_FREE_TERMS)
    return min(rate, raw.tokens_per_step / fixed * (1 + 1e-9)) if fixed > 0 else rate


def estimate_speed(sc: Scenario, assumptions: SpeedAssumptions | None = None) -> SpeedEstimate:
    """Step time and tokens/s per GPU for `sc`, with every term shown."""
    a = assumptions or SpeedAssumptions()
    hw = hardware_of(sc)
    raw = step_time(sc.spec, sc.training, hw, sc.mode, a)
    return to_estimate(raw, hw, a)


def to_estimate(raw: _Raw, hw: _Hw, a: SpeedAssumptions) -> SpeedEstimate:
    groups = {"compute": raw.compute_s, "communication": raw.comm_s, "offload": raw.offload_s}
    bottleneck = max(groups, key=groups.__getitem__)
    notes = list(raw.notes)
    if raw.offload_s > 0.5 * raw.step_s:
        notes.append(f"offload dominates the step: {raw.offload_s / raw.step_s:.0%} of {raw.step_s:.3g} s")
    if raw.comm_s > 0.5 * raw.step_s:
        notes.append(f"exposed communication dominates the step: {raw.comm_s / raw.step_s:.0%}")
    per_gpu = raw.tokens_per_s / hw.num_gpus
    return SpeedEstimate(
        compute_s=raw.compute_s, communication_s=raw.comm_s, communication_total_s=raw.comm_total_s,
        offload_s=raw.offload_s, step_s=raw.step_s, tokens_per_step=raw.tokens_per_step,
        tokens_per_s=raw.tokens_per_s, tokens_per_s_per_gpu=per_gpu,
        model_flops_per_token=raw.model_fpt, executed_flops_per_token=raw.exec_fpt,
        peak_tflops=raw.peak_flops / 1e12, mfu_assumed=a.mfu,
        mfu_model=raw.model_fpt * per_gpu / raw.peak_flops if raw.peak_flops else 0.0,
        bottleneck=bottleneck, interconnect=raw.interconnect,
        terms=[SpeedTerm(key=x.key, group=x.group, label=x.label, seconds=x.seconds, total_seconds=x.total,
                         formula=x.formula, source=x.source) for x in raw.terms],
        notes=notes,
    )


def uses_method_change(t: Any) -> bool:
    """8-bit optimizer or LoRA/QLoRA: a change of what is trained, not only of how."""
    return t.optimizer == Optimizer.adamw_8bit or t.lora is not None

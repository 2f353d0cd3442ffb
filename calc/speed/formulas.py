"""The speed model's words: each term's label, its formula with this step's numbers (calc.speed.terms) and its
source, the links' names and the notes. Nothing here computes a term."""

from __future__ import annotations

from calc.contract.i18n import N_
from calc.contract.parallel import REDUCE_BUCKET_ELEMENTS
from calc.contract.presets import GpuPreset
from calc.contract.scenario import Checkpointing
from calc.speed.assumptions import ZERO3_FETCH_LATENCY_S, SpeedAssumptions
from calc.speed.hardware import LinkKind, SpeedHardware
from calc.speed.terms import (
    DataParallelComm,
    Dequantization,
    EagerTraffic,
    FetchLatency,
    Flops,
    OffloadNumbers,
    PipelineComm,
    StepShape,
    TensorParallelComm,
)

LINK_NAMES: dict[LinkKind, str] = {"nvlink": "NVLink", "pcie": "PCIe", "network": N_("inter-node network"),
                                   "none": "none"}


def link_name(kind: LinkKind) -> str:
    """'NVLink', 'PCIe', 'inter-node network' (marked for translation; calc.recommend.words translates it)."""
    return LINK_NAMES[kind]


def seconds_text(seconds: float) -> str:
    return f"{seconds:.3g} s"


def no_bf16_note(gpu: GpuPreset) -> str:
    return f"{gpu.name} has no bf16 tensor cores: bf16 compute is costed at its fp32 rate"


# ---- compute ------------------------------------------------------------------------------------------

def compute_label(f: Flops) -> str:
    return "Matmul compute" + (" incl. recomputation" if f.recompute_per_token else "")


def compute_source(x: StepShape, f: Flops) -> str:
    if not x.training:
        src = "forward only: 2 FLOPs per weight per token (Kaplan et al. 2020, table 1)"
    elif x.config.lora is not None:
        src = "frozen weights skip the weight gradient (Hu et al. 2021); attention per PaLM appendix B"
    else:
        src = "6N + 12LSd per token (PaLM appendix B; Narayanan et al. 2021 eq. 3; Kaplan et al. 2020)"
    return src + ("; recompute per Korthikanti et al. 2022" if f.recompute_per_token else "")


def flops_text(x: StepShape, f: Flops) -> str:
    """The FLOPs per token as a sum of its parts, recomputation included."""
    n_mm, layers, att_fwd = x.matmul_params_per_token, x.layers, x.attention_flops_per_layer
    if not x.training:
        text = f"2 x {n_mm:,} (matmul weights) + {layers} x {att_fwd:,.0f} (attention)"
    elif x.config.lora is not None:
        text = (f"4 x {n_mm:,} (frozen base: forward + input grad) + 6 x {x.lora_params_total:,} (LoRA) "
                f"+ 3 x {layers} x {att_fwd:,.0f} (attention)")
    else:
        text = f"6 x {n_mm:,} (matmul weights) + 3 x {layers} x {att_fwd:,.0f} (attention = 12 L S d_attn)"
    layer_mm = x.shape.layer_active_matmul_params + x.lora_params_per_layer
    if x.checkpointing == Checkpointing.full:
        text += (f" + {f.checkpointed_layers} checkpointed layers x (2 x {layer_mm:,} + {att_fwd:,.0f}) "
                 "(recompute)")
    elif x.checkpointing == Checkpointing.selective:
        text += f" + {layers} x {att_fwd:,.0f} (attention-core recompute)"
    return text


def compute_formula(x: StepShape, f: Flops, a: SpeedAssumptions) -> str:
    return (f"({flops_text(x, f)}) FLOPs/token x {x.tokens_per_replica:,} tokens / (tp {x.tp} x pp {x.pp}) / "
            f"({x.peak_flops_per_s / 1e12:g} TFLOPS {x.dtype} x MFU {a.mfu:g})")


def bubble_words(x: StepShape, compute_s: float, explain: bool) -> tuple[str, str, str]:
    """(label, formula, source) of the pipeline bubble (the formula empty unless `explain`)."""
    if x.training:
        return ("Pipeline bubble (1F1B)",
                f"{seconds_text(compute_s)} x (pp {x.pp} - 1) / {x.accumulation_steps} micro-batches" if explain
                else "", "bubble fraction (p-1)/m (Narayanan et al. 2021, section 2.2)")
    return ("Pipeline fill (one batch, no interleaving)",
            f"{seconds_text(compute_s)} x (pp {x.pp} - 1) / {x.pp}" if explain else "", "GPipe/1F1B fill time")


EAGER_LABEL = "Eager attention S x S traffic"
EAGER_SOURCE = "standard attention is memory-bound on the S x S tensors (Dao et al. 2022, sec. 3)"


def eager_formula(x: StepShape, e: EagerTraffic, hw: SpeedHardware) -> str:
    return (f"{e.passes} passes x {e.score_bytes:,} B (B x heads/tp x S x S x {e.activation_bytes} B) x "
            f"{x.stage_layers} layers x {x.accumulation_steps} micro-batches / "
            f"{hw.gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s HBM")


def dequantization_label(base_weights: str) -> str:
    return f"{base_weights} dequantisation"


DEQUANTIZATION_SOURCE = "QLoRA dequantises each frozen weight to bf16 before every matmul (Dettmers et al. 2023; " \
    "bitsandbytes)"


def dequantization_formula(x: StepShape, d: Dequantization, hw: SpeedHardware) -> str:
    if d.traffic_bytes_per_weight != d.quantized_bytes_per_weight + 2:  # torchao's eager get_original_weight
        return (f"{d.weights:,} weights x {d.traffic_bytes_per_weight:g} B (torchao's NF4 dequantisation, eager: "
                f"int64 indices, table lookups, scaling, stack) x {d.passes:.3g} passes x {x.accumulation_steps} "
                f"micro-batches / {hw.gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s HBM")
    return (f"{d.weights:,} weights x ({d.quantized_bytes_per_weight:g} B read + 2 B bf16 write) x {d.passes:.3g} "
            f"passes x {x.accumulation_steps} micro-batches / {hw.gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s HBM")


# ---- communication ------------------------------------------------------------------------------------

DP_LABELS = ("Data-parallel gradient all-reduce", "ZeRO-1 reduce-scatter + parameter all-gather",
             "ZeRO-2 gradient reduce-scatter + parameter all-gather",
             "ZeRO-3 parameter all-gathers + gradient reduce-scatter")
DP_SOURCE = ("ring collectives move 2(N-1)/N (all-reduce) or (N-1)/N (reduce-scatter, all-gather) of the data "
             "per GPU (Patarasuk & Yuan 2009); ZeRO-1/2 = DP volume, ZeRO-3 = 1.5x (Rajbhandari et al. 2020, "
             "section 7)")


def dp_volume_text(z: int, dp: int, ga: int, m_grad: int, m_w: int) -> str:
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


def overlap_text(c: DataParallelComm, a: SpeedAssumptions) -> str:
    """What overlap_comm hides of the data-parallel collectives, in the formula's words."""
    if not a.overlap_comm:
        return "; overlap_comm off: nothing hidden"
    if c.zero_stage < 3:
        text = (f"; overlap_comm hides up to {seconds_text(c.hidden_seconds)} of "
                + ("the last micro-batch's backward" if c.zero_stage < 2 else "backward"))
    else:
        text = (f"; per micro-batch the forward all-gather ({seconds_text(c.forward_gather_seconds)}) hides behind "
                f"{seconds_text(c.forward_compute_seconds)} of forward and the backward all-gather + reduce-scatter "
                f"({seconds_text(c.backward_comm_seconds)}) behind {seconds_text(c.backward_compute_seconds)} of "
                "backward")
    return text + f"; the last {REDUCE_BUCKET_ELEMENTS:,}-element reduce bucket stays exposed"


def dp_formula(x: StepShape, c: DataParallelComm, a: SpeedAssumptions) -> str:
    return (f"[{dp_volume_text(c.zero_stage, x.dp, x.accumulation_steps, c.grad_bytes, c.weight_bytes)}] / "
            f"{c.link.bytes_per_s / 1e9:.3g} GB/s ({link_name(c.link.kind)}, x{a.comm_efficiency:g} efficiency)"
            f"{overlap_text(c, a)}")


FETCH_LABEL = "ZeRO-3 per-module fetch latency"
FETCH_SOURCE = ("alpha of the alpha-beta (Hockney) cost model: small-message NCCL all-gather latency plus "
                "DeepSpeed's per-module fetch hooks; not hidden by prefetching")


def fetch_formula(x: StepShape, lat: FetchLatency) -> str:
    return (f"{x.accumulation_steps} micro-batches x {lat.fetches} module all-gathers (forward + backward) x "
            f"{ZERO3_FETCH_LATENCY_S * 1e6:g} us")


TP_LABEL = "Tensor-parallel all-reduces"
TP_SOURCE = ("Megatron-LM: 2 all-reduces forward + 2 backward per layer (Shoeybi et al. 2019, fig. 4; "
             "Narayanan et al. 2021, section 3.2)")


def tp_formula(x: StepShape, c: TensorParallelComm) -> str:
    recomputed = f" + 2 x {c.recomputed_layers:g} recomputed" if c.recomputed_layers else ""
    return (f"{x.accumulation_steps} micro-batches x ({c.per_layer} x {x.stage_layers} layers{recomputed}) "
            f"all-reduces x 2 x ({x.tp}-1)/{x.tp} x {c.message_bytes:,} B (B x S x H) / "
            f"{c.link.bytes_per_s / 1e9:.3g} GB/s ({link_name(c.link.kind)}); on the critical path")


PP_LABEL = "Pipeline send/receive"
PP_SOURCE = "point-to-point between adjacent stages (Narayanan et al. 2021, section 2.2)"


def pp_formula(c: PipelineComm) -> str:
    return (f"{c.messages} messages x {c.message_bytes:,} B (B x S x H activations/gradients) / "
            f"{c.link.bytes_per_s / 1e9:.3g} GB/s ({link_name(c.link.kind)})")


# ---- offload ------------------------------------------------------------------------------------------

OFFLOAD_LABELS = {
    "offload_pcie": "Gradients to CPU, updated weights back (PCIe)",
    "cpu_adam": "CPU Adam step",
    "nvme_optimizer": "Optimizer states NVMe read + write",
    "offload_params_pcie": "Parameters fetched from CPU (PCIe)",
    "nvme_params": "Parameters read from NVMe",
}
OFFLOAD_SOURCES = {
    "offload_pcie": "ZeRO-Offload moves gradients down and 16-bit parameters up every step (Ren et al. 2021, "
                    "section 4); transfers counted as not overlapped",
    "cpu_adam": "DeepSpeed CPUAdam throughput (ZeRO-Offload paper; DeepSpeed PR #7474)",
    "nvme_optimizer": "ZeRO-Infinity swaps optimizer states in and out each step (Rajbhandari et al. 2021, "
                      "arXiv 2104.07857)",
    "offload_params_pcie": "ZeRO-3 offload_param copies each partition to the GPU before it is all-gathered, in "
                           "forward and backward (DeepSpeed ZeRO-Infinity)",
    "nvme_params": "ZeRO-Infinity parameter offload to NVMe",
}


def offload_formula(key: str, x: StepShape, o: OffloadNumbers, hw: SpeedHardware, a: SpeedAssumptions) -> str:
    """The formula of the offload term `key` (one of OFFLOAD_LABELS)."""
    per_node, nvme = hw.gpus_per_node, hw.nvme_bytes_per_s / 1e9
    if key == "offload_pcie":
        return (f"{o.part_params:,.0f} params x ({o.grad_moves} x {o.grad_bytes} B grads + {o.weight_bytes} B "
                f"weights) / {o.pcie_bytes_per_s / 1e9:g} GB/s PCIe gen{hw.gpu.pcie_gen} (x{a.comm_efficiency:g})")
    if key == "cpu_adam":
        return (f"{o.part_params:,.0f} params x {per_node} GPUs per node / {a.cpu_adam_params_per_s_per_node:.3g} "
                "params/s per node")
    if key == "nvme_optimizer":
        return (f"2 x {o.part_params:,.0f} params x {o.state_bytes_per_param:g} B (master + states) x {per_node} "
                f"GPUs per node / {nvme:g} GB/s NVMe")
    if key == "offload_params_pcie":
        return (f"{x.accumulation_steps} micro-batches x {o.param_fetches // x.accumulation_steps} fetches x "
                f"{o.param_part:,.0f} params x {o.weight_bytes} B / {o.pcie_bytes_per_s / 1e9:g} GB/s")
    return (f"{o.param_fetches} reads x {o.param_part:,.0f} params x {o.weight_bytes} B x {per_node} GPUs per node / "
            f"{nvme:g} GB/s")

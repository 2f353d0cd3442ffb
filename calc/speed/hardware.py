"""What the speed model reads of the hardware: the GPU preset, the node shape, the links' bandwidths, and which
link a collective over a group of GPUs takes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

from calc.contract.presets import ClusterPreset, GpuPreset, cluster_presets, gpu_presets
from calc.contract.scenario import Precision, Scenario
from calc.speed.assumptions import (
    DEFAULT_INTER_NODE_BYTES_PER_S,
    DEFAULT_NVME_BYTES_PER_S,
    NVLINK_BRIDGE_GROUP,
    SpeedAssumptions,
)

LinkKind = Literal["nvlink", "pcie", "network", "none"]
NO_BF16_DTYPE = "fp32 (no bf16 units)"  # the compute dtype of bf16 on a GPU without bf16 units


@dataclass(frozen=True)
class SpeedHardware:
    """The GPU, how many there are and how many share a node, and the bandwidths off the GPU."""

    gpu: GpuPreset
    num_gpus: int
    gpus_per_node: int
    inter_node_bytes_per_s: float
    nvme_bytes_per_s: float


class Link(NamedTuple):
    """The per-direction bandwidth a ring collective gets (after the efficiency), and over which link."""

    bytes_per_s: float
    kind: LinkKind


def hardware_of(sc: Scenario) -> SpeedHardware:
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
    return SpeedHardware(gpu_presets()[hw.gpu], hw.num_gpus, per_node, inter, nvme)


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
    return gpu.fp32_tflops * 1e12, NO_BF16_DTYPE


def link(hw: SpeedHardware, group: int, stride: int, a: SpeedAssumptions) -> Link:
    """Per-direction bandwidth a ring collective over `group` GPUs spaced `stride` ranks apart gets:
    the network when the group leaves the node (ranks are laid out TP fastest, then DP, then PP, as in
    Megatron-LM), else NVLink (half the preset's bidirectional figure; only pairs on bridged PCIe
    cards) or PCIe."""
    if group <= 1:
        return Link(math.inf, "none")
    if group * stride > hw.gpus_per_node:
        return Link(hw.inter_node_bytes_per_s * a.comm_efficiency, "network")
    g = hw.gpu
    bridged = g.id.endswith("-pcie") or g.nvlink_bandwidth_bytes_per_s < 300e9
    if g.nvlink_bandwidth_bytes_per_s > 0 and (not bridged or group <= NVLINK_BRIDGE_GROUP):
        return Link(g.nvlink_bandwidth_bytes_per_s / 2 * a.comm_efficiency, "nvlink")
    return Link(g.pcie_bandwidth_bytes_per_s * a.comm_efficiency, "pcie")

"""The speed model's named assumptions: the constants (each with its source) and `SpeedAssumptions`, the ones a
user may edit."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MFU = 0.40  # see calc.speed's docstring: Llama 2 GPU hours, PaLM table 3, Megatron-LM table 1

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
EAGER_SCORE_PASSES_INFERENCE = 4  # forward only

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

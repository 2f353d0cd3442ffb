"""Sharding rules: what each GPU holds under ZeRO, tensor and pipeline parallelism.

ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054, Fig. 1): stage 1 partitions optimizer states
(and fp32 master weights), stage 2 also gradients, stage 3 also the 16-bit weights, each over the
data-parallel degree N. DeepSpeed's defaults for the buffers it adds are named below and are the
values the DeepSpeed export writes, so the estimate and the exported config agree.
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepSpeed ZeRO defaults (deepspeed/runtime/zero/config.py), in elements.
REDUCE_BUCKET_ELEMENTS = 500_000_000  # reduce_bucket_size: the stage-2 IPG gradient bucket
ALLGATHER_BUCKET_ELEMENTS = 500_000_000  # allgather_bucket_size
STAGE3_PREFETCH_ELEMENTS = 50_000_000  # stage3_prefetch_bucket_size
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000  # stage3_max_live_parameters
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000  # params below this stay unpartitioned
OVERLAP_COMM = True  # overlap_comm: reduction on a side stream (the export writes it; doubles the IPG bucket)


@dataclass(frozen=True)
class Sharding:
    """Fractions of each model-state category that one GPU holds."""

    weights: float
    gradients: float
    optimizer: float


def zero_sharding(stage: int, dp: int) -> Sharding:
    """Stage 0: everything replicated; 1: optimizer states / dp; 2: + gradients; 3: + weights."""
    inv = 1.0 / dp
    return Sharding(
        weights=inv if stage >= 3 else 1.0,
        gradients=inv if stage >= 2 else 1.0,
        optimizer=inv if stage >= 1 else 1.0,
    )


def zero_model_state_bytes(params: int, stage: int, dp: int, k_bytes: int = 12,
                           weight_bytes: int = 2, grad_bytes: int = 2) -> int:
    """ZeRO paper's model-state memory per GPU for mixed-precision Adam:
    (2 + 2 + K) * P at stage 0, 2P + 2P + K*P/N at stage 1, 2P + (2 + K)*P/N at stage 2 and
    (2 + 2 + K)*P/N at stage 3, with K = 12 (fp32 master, momentum, variance)."""
    s = zero_sharding(stage, dp)
    return round(params * (weight_bytes * s.weights + grad_bytes * s.gradients + k_bytes * s.optimizer))


def reduce_bucket_bytes(grad_bytes: int, stage: int) -> int:
    """ZeRO-1/2 reduce gradients through an IPG bucket of reduce_bucket_size elements in the
    gradient dtype, two of them when overlap_comm is on, allocated by DeepSpeed whatever the
    data-parallel size (deepspeed/runtime/zero/stage_1_and_2.py, ipg_buffer)."""
    if stage not in (1, 2):
        return 0
    return REDUCE_BUCKET_ELEMENTS * grad_bytes * (2 if OVERLAP_COMM else 1)


def stage3_live_param_bytes(layer_params: int, edge_params: int, weight_bytes: int, stage: int, dp: int,
                            params_offloaded: bool = False) -> int:
    """ZeRO-3 gathers each module's full weights just before use and frees them after; with
    prefetch, the current layer and the next bucket are alive. Bounded by max_live_parameters.
    The largest single gathered module (embedding / lm_head) is used when larger. On one GPU
    without offload the weights are whole already; with offload_param they live in host memory
    and are fetched to the GPU the same way whatever the data-parallel size."""
    if stage < 3 or (dp == 1 and not params_offloaded):
        return 0
    live = min(2 * layer_params + STAGE3_PREFETCH_ELEMENTS, STAGE3_MAX_LIVE_PARAMETERS)
    return max(live, edge_params) * weight_bytes


def layers_on_stage(num_layers: int, pp: int) -> int:
    """Pipeline stages get ceil(L / pp) layers; the first stage is the worst case (it also holds
    the embedding and keeps the most micro-batches in flight under 1F1B)."""
    return -(-num_layers // pp)


def microbatches_in_flight(pp: int, grad_accum: int) -> int:
    """1F1B: stage 0 holds activations of min(pp, micro-batches) micro-batches at its peak
    (Narayanan et al. 2021, arXiv 2104.04473, section 2.2)."""
    return max(1, min(pp, grad_accum))

"""Sharding rules: what each GPU holds under ZeRO, tensor and pipeline parallelism.

ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054, Fig. 1): stage 1 partitions optimizer states
(and fp32 master weights), stage 2 also gradients, stage 3 also the 16-bit weights, each over the
data-parallel degree N. DeepSpeed's defaults for the buffers it adds are named below and are the
values the DeepSpeed export writes, so the estimate and the exported config agree.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

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


def reduce_bucket_bytes(grad_bytes: int, stage: int, autocast_bytes: int = 0,
                        elements: int = REDUCE_BUCKET_ELEMENTS) -> int:
    """DeepSpeed's IPG (reduce) buckets of reduce_bucket_size elements, one set per communication dtype,
    allocated whatever the data-parallel size: ZeRO-1/2 hold two per dtype when overlap_comm is on
    (stage_1_and_2.py, setup_buckets); ZeRO-3 with contiguous_gradients, which the export writes, one per
    dtype from initialisation on (stage3.py, _setup_for_real_optimizer). The dtype is the gradients';
    under torch_autocast (amp-*) the parameters of nn.Linear-like modules communicate in the autocast
    dtype (`autocast_bytes`) and the rest (embeddings, norms) in fp32, so there are two
    (runtime/torch_autocast.py, get_all_comm_dtypes). Measured on the CPU at ZeRO-1/2/3 (bf16, fp32) and
    ZeRO-3 amp-bf16 (data/measured_deepspeed*.jsonl)."""
    per_dtype = grad_bytes + autocast_bytes
    if stage in (1, 2):
        return elements * per_dtype * (2 if OVERLAP_COMM else 1)
    if stage == 3:
        return elements * per_dtype
    return 0


@dataclass(frozen=True)
class Zero12Partition:
    """Rank 0's gradient partition under DeepSpeed ZeRO-1/2 with contiguous_gradients (no offload)."""

    elements: int  # grads_in_partition: every parameter tensor that starts in rank 0's range, whole
    block: int  # backward block whose hooks run the first reduction holding one of them (see below)
    pending_at_end: int  # elements of an oversized gradient still waiting for the epilogue's reduction
    largest: int = 0  # the largest of its gradients within its range (the step's fp64 norm copies one at a time)
    trigger: int = 0  # elements of the gradient whose hook ran that reduction (alive beside the new partition)


class ParamOrder:
    """A model's parameter tensors (elements each) in registration order, grouped as backward meets them
    (calc.contract.architectures.ModelSpec.param_numel_blocks: the embedding's, each layer's, the top's); built once
    per model, asked for any world size and bucket (zero12_rank0_partition)."""

    def __init__(self, emb: tuple[int, ...], layers: list[tuple[int, ...]], top: tuple[int, ...]) -> None:
        flat = [*emb, *[x for layer in layers for x in layer], *top]
        self.starts = list(accumulate(flat, initial=0))
        self.numels = flat
        self.largest_before = list(accumulate(flat, max, initial=0))  # [k]: the largest of the first k tensors
        firsts = list(accumulate([len(emb)] + [len(layer) for layer in layers], initial=0))  # each block's first
        # (first flat index, elements) of each block in backward order: the top, the layers down, the embedding
        self.blocks = ([(firsts[-1], top)] + [(firsts[1 + i], layers[i]) for i in reversed(range(len(layers)))]
                       + [(0, emb)])


def zero12_rank0_partition(order: ParamOrder, world: int, bucket: int) -> Zero12Partition:
    """Modelled from DeepSpeed 0.19's stage_1_and_2.py, then measured (data/measured_deepspeed*.jsonl).
    The parameters (`order`) are flattened into one group padded to a multiple of 2 x world
    (nccl_start_alignment_factor) and cut into `world` equal ranges; the export leaves
    round_robin_gradients off, so the order is the model's. Rank 0's params_in_partition are the tensors
    that start in its range, and copy_grads_in_partition allocates grads_in_partition for all of them,
    whole, at the first bucket reduction (reduce_ipg_grads) that holds one of them. A gradient's hook adds
    it to the bucket after reducing the bucket if it would overflow reduce_bucket_size elements; one larger
    than the bucket is reduced on its own at the next hook (or the epilogue). Gradients reach the hooks
    from the top block (lm_head, then the final norm) down through the layers to the embedding, each
    block's in reverse registration order (within a layer the norms' hooks run beside their neighbours,
    not where this order puts them: a few hidden-size tensors). `block`: 0 the top, 1 + k the k-th layer
    from the top, the number of layers + 1 the embedding, + 2 the backward epilogue."""
    starts = order.starts
    align = 2 * world
    size = -(-starts[-1] // align) * align // world
    count = bisect_left(starts, size) if size < starts[-1] else len(order.numels)  # rank 0's tensors
    mine = starts[count]
    # the step's gradient norm (get_grad_norm_direct) reads each whole, the last one's part inside the range
    largest = max(order.largest_before[count - 1], min(order.numels[count - 1], size - starts[count - 1]))
    last = order.blocks[-1][1][0]  # the embedding's weight: the last gradient to reach a hook
    pending = last if last > bucket else 0  # an oversized one waits for the epilogue
    held = holds_mine = 0
    passed: dict[tuple[int, int], int] = {}  # (id of a layer's tuple, held before) -> held after, none of it mine
    for b, (first, numels) in enumerate(order.blocks):
        if starts[first] >= size and not holds_mine and (id(numels), held) in passed:
            held = passed[id(numels), held]  # identical layers above rank 0's range: one look-up each
            continue
        before = held
        for k in reversed(range(len(numels))):
            n = numels[k]
            if held + n > bucket:
                if holds_mine:
                    return Zero12Partition(mine, b, pending, largest, n)
                held = holds_mine = 0
            held += n
            holds_mine |= starts[first + k] < size
        if not holds_mine:
            passed[id(numels), before] = held
    return Zero12Partition(mine, len(order.blocks), pending, largest)


def pinned_bytes(nbytes: int, target: str) -> int:
    """Host memory that one pinned buffer takes. On CUDA, tensor.pin_memory() copies into PyTorch's
    caching host allocator, which rounds each block up to a power of two; DeepSpeed's CPU accelerator
    pins nothing (accelerator/cpu_accelerator.py, pin_memory returns the tensor). Modelled from source."""
    if target != "cuda" or nbytes <= 0:
        return max(nbytes, 0)
    return 1 << (nbytes - 1).bit_length()


def zero12_offload_buffers(partition: int, largest_param: int, weight_bytes: int, target: str) -> tuple[int, int]:
    """(device bytes, pinned host bytes) that ZeRO-1/2 CPU offload adds besides the offloaded fp32 master
    weights, gradients and states: a 16-bit copy of this rank's partition for the updated weights
    (param_buffer_of_bit16_for_cpu_offload, pinned) and a gradient staging buffer of the largest
    parameter's size on each side (temp_grad_buffer_for_cpu_offload, pinned; ..._for_gpu_offload on the
    device), both in the weights' dtype (stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__). Modelled
    from source, not yet measured."""
    device = largest_param * weight_bytes
    host = pinned_bytes(partition * weight_bytes, target) + pinned_bytes(largest_param * weight_bytes, target)
    return device, host


def model_load_host_bytes(params_local: int, largest_param: int, weight_bytes: int, stage: int) -> int:
    """Host RAM one process needs while the model is built or loaded: the whole model in its load dtype
    below ZeRO-3 (from_pretrained / from_config materialise it on the CPU before DeepSpeed moves it), only
    the tensor being created at ZeRO-3, where zero.Init partitions each parameter as it is made
    (the exported train.py builds TrainingArguments first for that). Modelled from source."""
    return (largest_param if stage == 3 else params_local) * weight_bytes


def stage3_live_param_bytes(layer_params: int, edge_params: int, weight_bytes: int, stage: int, dp: int,
                            params_offloaded: bool = False, total_params: int | None = None) -> int:
    """ZeRO-3 gathers each module's full weights just before use and frees them after; with
    prefetch, the current layer and the next bucket are alive. Bounded by max_live_parameters and
    by the model itself (a prefetch bucket larger than the model gathers the model; measured).
    The largest single gathered module (embedding / lm_head) is used when larger. On one GPU
    without offload the weights are whole already; with offload_param they live in host memory
    and are fetched to the GPU the same way whatever the data-parallel size."""
    total_params = STAGE3_MAX_LIVE_PARAMETERS if total_params is None else total_params
    if stage < 3 or (dp == 1 and not params_offloaded):
        return 0
    live = min(2 * layer_params + STAGE3_PREFETCH_ELEMENTS, STAGE3_MAX_LIVE_PARAMETERS)
    return min(max(live, edge_params), total_params) * weight_bytes


def layers_on_stage(num_layers: int, pp: int) -> int:
    """Pipeline stages get ceil(L / pp) layers; the first stage is the worst case (it also holds
    the embedding and keeps the most micro-batches in flight under 1F1B)."""
    return -(-num_layers // pp)


def microbatches_in_flight(pp: int, grad_accum: int) -> int:
    """1F1B: stage 0 holds activations of min(pp, micro-batches) micro-batches at its peak
    (Narayanan et al. 2021, arXiv 2104.04473, section 2.2)."""
    return max(1, min(pp, grad_accum))

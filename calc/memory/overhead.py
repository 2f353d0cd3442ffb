"""What nvidia-smi shows beyond `max_memory_allocated`: the CUDA context, library workspaces
and the caching allocator's reserve. These are ranges, not constants: they depend on the driver,
the GPU and the allocation pattern. The figures below are named assumptions with their sources;
they are to be recalibrated against committed GPU measurements (data/measured_cuda.jsonl).
"""

from __future__ import annotations

from calc.contract.presets import Architecture

MiB = 2**20

# CUDA context + loaded kernels (cuBLAS, cuDNN, NCCL modules) with lazy module loading
# (CUDA_MODULE_LOADING=LAZY, the default since PyTorch 2.0 / CUDA 11.7). Reported ranges:
# ~300 MiB on Ampere with lazy loading, 500-600 MiB on Hopper, up to ~1 GiB with eager loading
# (PyTorch forum "CUDA context memory", NVIDIA CUDA lazy loading docs).
CUDA_CONTEXT_BYTES = {"low": 300 * MiB, "expected": 500 * MiB, "high": 1024 * MiB}

# cuBLAS workspace, allocated through the caching allocator (so it IS inside max_memory_allocated):
# CUBLAS_WORKSPACE_CONFIG default ":4096:8" = 32 MiB on sm90+, ":4096:2:16:8" = 8.125 MiB before
# (aten/src/ATen/cuda/CublasHandlePool.cpp). One handle per thread that runs matmuls: the main
# thread (forward) and the autograd engine's device thread (backward).
CUBLAS_WORKSPACE_BYTES_SM90 = 32 * MiB
CUBLAS_WORKSPACE_BYTES_OLDER = 8 * MiB + 128 * 1024
SM90_AND_LATER: frozenset[Architecture] = frozenset({"hopper", "blackwell"})

# NCCL communicator buffers live outside the caching allocator: NCCL_BUFFSIZE (4 MiB) per channel
# per peer plus proxy buffers; a few hundred MiB per rank on one node, more across nodes.
NCCL_BYTES = {"low": 128 * MiB, "expected": 384 * MiB, "high": 1024 * MiB}

# Caching-allocator reserve (reserved - allocated) at the peak, as a fraction of the peak plus a
# floor for partially used 2 MiB / 20 MiB segments. Fragmentation grows with varied tensor sizes;
# expandable_segments:True shrinks it (torchtune report: 16.4 -> 10.8 GiB reserved).
RESERVE_FRACTION = {"low": 0.01, "expected": 0.05, "high": 0.15}
RESERVE_FLOOR_BYTES = {"low": 20 * MiB, "expected": 64 * MiB, "high": 256 * MiB}


def cublas_workspace_bytes(architecture: Architecture | None, training: bool) -> int:
    """Workspaces inside peak allocated: one per matmul thread (2 in training, 1 in inference).
    sm90+ (Hopper, Blackwell) get the larger default; without a GPU preset the architecture is
    unknown and the pre-sm90 default is assumed."""
    per_handle = CUBLAS_WORKSPACE_BYTES_SM90 if architecture in SM90_AND_LATER else CUBLAS_WORKSPACE_BYTES_OLDER
    return per_handle * (2 if training else 1)


_NO_NCCL = dict.fromkeys(NCCL_BYTES, 0)


def device_total(peak_allocated_bytes: int, num_gpus: int, managed_bytes: int = 0) -> dict[str, int]:
    """calc.memory.result.DeviceTotal's fields: the peak plus the context, the NCCL buffers (multi-GPU only), the
    allocator reserve and CUDA managed memory (bitsandbytes' paged optimizer states: on the device while they are
    resident, outside the caching allocator and so outside its reserve), as low / expected / high, and each term's
    expected (and the reserve's every) value."""
    context = CUDA_CONTEXT_BYTES
    nccl = NCCL_BYTES if num_gpus > 1 else _NO_NCCL
    reserve = {level: round(peak_allocated_bytes * RESERVE_FRACTION[level]) + RESERVE_FLOOR_BYTES[level]
               for level in ("low", "expected", "high")}
    total = {level: peak_allocated_bytes + context[level] + nccl[level] + reserve[level] + managed_bytes
             for level in reserve}
    return {**total, "cuda_context_bytes": context["expected"], "workspace_bytes": nccl["expected"],
            "managed_bytes": managed_bytes,
            "reserve_low_bytes": reserve["low"], "reserve_expected_bytes": reserve["expected"],
            "reserve_high_bytes": reserve["high"]}

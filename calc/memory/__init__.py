"""The memory model: the peak of one training or inference step, where every byte goes, and whether it fits.

Owns the model states (weights, gradients, optimizer states and their ZeRO / FSDP2 partitions), the activations
saved between forward and backward, the step's timeline (forward, loss, backward, optimizer step) and its peak,
the breakdown into components with their formulas and sources (`result`), the device total above the allocator's
peak (`overhead`: CUDA context, NCCL, cuBLAS workspace, the caching allocator's reserve), the verdict (`verdict`:
does it fit, and what limits it), bytes per parameter (`per_param`) and the largest micro-batch that fits (`fit`).

May import calc.contract, calc.sim and calc.memo.
"""

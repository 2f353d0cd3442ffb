"""Bytes per weight, gradient, master weight and optimizer state, and optimizer-step temporaries.

Every function returns bytes for `n` trainable elements (or a list of tensor shapes where the
optimizer's memory depends on shapes). Sources: torch/optim/{adam,adamw,sgd,_adafactor}.py in
PyTorch 2.13, the ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054, section 3.1), and
bitsandbytes' blockwise 8-bit optimizers (Dettmers et al. 2022, arXiv 2110.02861).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from calc.contract.enums import Optimizer, OptimizerImpl, Precision
from calc.contract.i18n import N_

FP32, BF16 = 4, 2

# Why *-mixed gradients are 2 B/param through backward but 4 B/param during the step. One text,
# shown by the Calculator's breakdown and by Explain.
MIXED_STEP_GRADIENTS_WHY = N_(
    "DeepSpeed's mixed-precision optimizer casts each 16-bit gradient partition to an fp32 .grad of its "
    "fp32 master partition, frees the 16-bit gradients, runs the step and then frees the fp32 copy "
    "(deepspeed/runtime/zero/stage_1_and_2.py, step): 2 B/param through backward, 4 B/param (sharded like "
    "the optimizer states) during the step; modelled from DeepSpeed's source"
)
# The same at ZeRO-0 under DeepSpeed, where the optimizer wrapper keeps the 16-bit gradients (calc.memory.states).
ZERO0_MIXED_STEP_GRADIENTS_WHY = N_(
    "At ZeRO-0 DeepSpeed wraps torch's optimizer in FP16_UnfusedOptimizer, which casts each 16-bit gradient to "
    "an fp32 .grad of its fp32 master copy and frees neither before the step "
    "(deepspeed/runtime/fp16/unfused_optimizer.py, step): 2 B/param through backward, 2 + 4 B/param during the "
    "step; measured with DeepSpeed on its CPU accelerator"
)


def step_gradients_why(keeps_16bit_step_grads: bool) -> str:
    """Why *-mixed gradients take what they take during the step (one text for Calculator and Explain)."""
    return ZERO0_MIXED_STEP_GRADIENTS_WHY if keeps_16bit_step_grads else MIXED_STEP_GRADIENTS_WHY


def weight_bytes_per_param(p: Precision) -> int:
    """Weights as stored on the GPU: fp32 for fp32 and autocast (AMP keeps fp32 weights),
    16-bit for pure bf16 and for *-mixed (whose fp32 copy lives in the optimizer)."""
    return FP32 if p in (Precision.fp32, Precision.amp_bf16, Precision.amp_fp16) else BF16


def activation_bytes(p: Precision) -> int:
    """Dtype of matmul outputs: fp32 only when no 16-bit compute is used."""
    return FP32 if p == Precision.fp32 else BF16


def residual_bytes(p: Precision) -> int:
    """Residual stream dtype = embedding output dtype = weight dtype (fp32 under autocast,
    because embeddings and additions are not autocast ops)."""
    return weight_bytes_per_param(p)


def grad_bytes_per_param(p: Precision) -> int:
    """`.grad` has the parameter's dtype (AccumulateGrad); fp32 under AMP, 16-bit otherwise."""
    return weight_bytes_per_param(p)


def master_bytes_per_param(p: Precision) -> int:
    """fp32 master weights exist only for *-mixed: 4 bytes (ZeRO paper's 'K' includes them)."""
    return FP32 if p.is_mixed else 0


def state_dtype_bytes(p: Precision) -> int:
    """Optimizer states follow the dtype of the params the optimizer sees: fp32 except for pure
    bf16, where torch.optim keeps exp_avg/exp_avg_sq in bf16 (zeros_like(param))."""
    return BF16 if p == Precision.bf16 else FP32


def adapter_bytes(p: Precision, base_weights: str = "bf16") -> int:
    """LoRA adapter dtype: peft upcasts adapters to fp32 (autocast_adapter_dtype) unless the run
    keeps everything in 16 bits (pure bf16, or *-mixed whose master copies are fp32). On an int8 base they stay
    in torch's default fp32: peft casts new adapters only to a floating base dtype (a 4-bit base's compute_dtype;
    peft/tuners/tuners_utils.py _move_adapter_to_device_of_base_layer)."""
    if base_weights == "int8":
        return 4
    return 2 if p == Precision.bf16 or p.is_mixed else 4


def optimizer_state_bytes(opt: Optimizer, p: Precision, shapes: list[tuple[tuple[int, ...], int]]) -> int:
    """Persistent optimizer state for the trainable tensors `shapes`.

    AdamW/Adam: exp_avg + exp_avg_sq = 2 x state dtype per element.
    SGD: none. SGD with momentum: one momentum buffer.
    Adafactor (torch.optim.Adafactor): tensors with >= 2 dims keep a row and a column variance
    (shape[:-1] and shape[:-2] + shape[-1:]), vectors keep a full variance; no first moment.
    bitsandbytes (bnb_state_bytes): AdamW8bit / PagedAdamW8bit, PagedAdamW.
    """
    if opt.bitsandbytes:
        return bnb_state_bytes(opt, shapes)
    state_bytes = state_dtype_bytes(p)  # per state element
    elements = sum(prod(s) * c for s, c in shapes)
    if opt in (Optimizer.adam, Optimizer.adamw):
        return 2 * state_bytes * elements
    if opt == Optimizer.sgd:
        return 0
    if opt == Optimizer.sgd_momentum:
        return state_bytes * elements
    return state_bytes * sum(adafactor_state_elements(s) * c for s, c in shapes)


# The bitsandbytes.optim class of each bitsandbytes optimizer (the reference loop and the exports name it)
BNB_OPTIMIZER_CLASSES = {Optimizer.adamw_8bit: "AdamW8bit", Optimizer.paged_adamw: "PagedAdamW",
                         Optimizer.paged_adamw_8bit: "PagedAdamW8bit"}

# bitsandbytes/optim/optimizer.py (0.50.2), Optimizer2State.init_state and get_state_buffer
BNB_MIN_8BIT_SIZE = 4096  # min_8bit_size: smaller tensors keep 32-bit states
BNB_STATE_BLOCKSIZE = 256  # blockwise 8-bit states: one fp32 absmax per 256 elements
BNB_QMAP_VALUES = 256  # the "dynamic" / "udynamic" maps, one fp32 copy each per optimizer
BNB_PAGED_MIN_ELEMENTS = 100_000  # get_state_buffer pages only tensors of at least 1e5 elements


def _bnb_8bit(opt: Optimizer) -> bool:
    return opt in (Optimizer.adamw_8bit, Optimizer.paged_adamw_8bit)


def bnb_tensor_state_bytes(opt: Optimizer, numel: int) -> tuple[int, int]:
    """(all, paged) state bytes of one tensor: two fp32 states (PagedAdamW; 8-bit ones below min_8bit_size), or
    two uint8 states + two fp32 absmax per 256-element block; on CUDA, get_state_buffer puts state1 / state2 of
    a paged optimizer in managed memory (F.get_paged) from 1e5 elements on (the absmax never)."""
    blockwise = _bnb_8bit(opt) and numel >= BNB_MIN_8BIT_SIZE
    states = 2 * numel if blockwise else 2 * FP32 * numel
    absmax = 2 * FP32 * -(-numel // BNB_STATE_BLOCKSIZE) if blockwise else 0
    paged = states if opt.paged and numel >= BNB_PAGED_MIN_ELEMENTS else 0
    return states + absmax, paged


def bnb_state_bytes(opt: Optimizer, shapes: list[tuple[tuple[int, ...], int]]) -> int:
    """A bitsandbytes optimizer's states for `shapes` (bnb_tensor_state_bytes) + the two shared fp32 quantile
    maps an 8-bit optimizer keeps once (name2qmap, state["qmap1"] / ["qmap2"]). bitsandbytes' states are fp32
    or uint8 whatever the parameters' dtype."""
    total = sum(c * bnb_tensor_state_bytes(opt, prod(s))[0] for s, c in shapes)
    quantized = _bnb_8bit(opt) and any(prod(s) >= BNB_MIN_8BIT_SIZE for s, _ in shapes)
    return total + (2 * BNB_QMAP_VALUES * FP32 if quantized else 0)


def paged_state_bytes(opt: Optimizer, shapes: list[tuple[tuple[int, ...], int]]) -> int:
    """The part of bnb_state_bytes a paged optimizer keeps in CUDA managed memory (cudaMallocManaged): outside
    torch.cuda.max_memory_allocated, inside the device's used memory until the driver pages it to host RAM.
    Modelled from bitsandbytes' source; CUDA only (on CPU bitsandbytes keeps ordinary tensors)."""
    if not opt.paged:
        return 0
    return sum(c * bnb_tensor_state_bytes(opt, prod(s))[1] for s, c in shapes)


def optimizer_temp_bytes(opt: Optimizer, impl: OptimizerImpl, p: Precision, shapes: list[tuple[tuple[int, ...], int]],
                         order: Sequence[int] = ()) -> int:
    """Scratch memory inside optimizer.step(), on top of params, grads and states.

    foreach Adam/AdamW (_multi_tensor_adam): `exp_avg_sq_sqrt = torch._foreach_sqrt(...)` is a
    list as large as all params (in state dtype); everything else is in place.
    for-loop Adam/AdamW (_single_tensor_adam): `(exp_avg_sq.sqrt() / bc2_sqrt)` makes two
    temporaries the size of the largest single param; with the parameters' `order` (elements of each tensor as
    the optimizer walks them) the previous parameter's `denom`, still bound while the next one's two are made,
    is counted too (for_loop_adam_elements).
    fused: one kernel per group, no temporaries. SGD: in-place (foreach clones grads into the
    momentum buffers on step 1, which are the states themselves).
    Adafactor foreach: the row_var x col_var outer products (`var_estimates`, then rsqrt'd and
    multiplied in place into the update) form one param-sized list; row/col norms are small
    (torch/optim/_adafactor.py, _multi_tensor_adafactor). For-loop: the same per tensor.
    bitsandbytes (AdamW8bit, PagedAdamW, PagedAdamW8bit): one kernel per tensor updates in place.
    """
    state_bytes = state_dtype_bytes(p)  # per state element
    elements = sum(prod(s) * c for s, c in shapes)
    largest = max((prod(s) for s, _ in shapes), default=0)  # elements of the largest tensor
    if opt in (Optimizer.adam, Optimizer.adamw):
        if impl == OptimizerImpl.foreach:
            return state_bytes * elements
        if impl == OptimizerImpl.for_loop:
            return state_bytes * (for_loop_adam_elements(order) if order else 2 * largest)
        return 0
    if opt == Optimizer.adafactor:
        return state_bytes * (elements if impl == OptimizerImpl.foreach else largest)
    return 0


def for_loop_adam_elements(order: Sequence[int]) -> int:
    """_single_tensor_adam's scratch elements: `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`
    makes the square root and the quotient of one parameter while the loop's local `denom` still holds the
    previous parameter's (rebound only when the new one is assigned): the largest previous + 2 x current over
    the parameters in the optimizer's order (torch/optim/adam.py; measured, LitGPT's lm_head then wte)."""
    return max((prev + 2 * cur for prev, cur in zip((0, *order), order, strict=False)), default=0)


def adafactor_state_elements(shape: tuple[int, ...]) -> int:
    """Adafactor's state elements for one tensor: a row and a column variance for a matrix (and the leading dims),
    a full variance for a vector."""
    if len(shape) >= 2:
        return prod(shape[:-1]) + prod(shape[:-2] + shape[-1:])
    return prod(shape)

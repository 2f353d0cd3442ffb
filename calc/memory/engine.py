"""The memory model's old single module, kept as an import path: its names now live in the modules of
calc.memory (see the package docstring for which holds what)."""

from calc.memory.activations import (
    HeldOutputs,
    autocast_weight_copies_bytes,
    block_context,
    block_profiles,
    checkpoint_kept_bytes,
    embeddings_need_grad,
    forward_activations_floor,
    held_outputs,
    layer_ctxs,
    layer_profile,
    layer_saved_bytes,
    model_level_bytes,
    residual_stream_bytes,
)
from calc.memory.breakdown import FLATTEN_EVENTS, peak_components
from calc.memory.estimate import clear_memo, estimate, reference_estimate, shape_free_values
from calc.memory.fsdp2 import fsdp2_shard_shapes, fsdp2_states
from calc.memory.repeats import identical_layers, per_layer, prefix_sums, repeats
from calc.memory.states import (
    States,
    adapter_bytes,
    local_params,
    lora_shapes,
    model_states,
    partition_bytes,
    step_gradient_bytes,
)

__all__ = [
    "FLATTEN_EVENTS", "HeldOutputs", "States", "adapter_bytes", "autocast_weight_copies_bytes", "block_context",
    "block_profiles", "checkpoint_kept_bytes", "clear_memo", "embeddings_need_grad", "estimate",
    "forward_activations_floor", "fsdp2_shard_shapes", "fsdp2_states", "held_outputs", "identical_layers",
    "layer_ctxs", "layer_profile", "layer_saved_bytes", "local_params", "lora_shapes", "model_level_bytes",
    "model_states", "partition_bytes", "peak_components", "per_layer", "prefix_sums", "reference_estimate",
    "repeats", "residual_stream_bytes", "shape_free_values", "step_gradient_bytes",
]

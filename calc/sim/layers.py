"""The ops each transformers block runs, written for the autograd simulator (calc.sim.graph), by part:

- calc.sim.context: the context a block is built in (Ctx: shape, bytes per element, parallel layout, LoRA);
- calc.sim.ops: dropout, nn.Linear (autocast, LoRA adapters), RMSNorm, LayerNorm, activations;
- calc.sim.attention: RoPE, SDPA and eager attention, the KV cache, each family's attention module;
- calc.sim.mlp: the gated and the plain MLP; calc.sim.moe: routers and experts;
- calc.sim.blocks: a decoder layer of each family, the embedding, the final norm and the heads.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves. Sizes are bytes for the tokens
this GPU processes (micro-batch x sequence, divided by tensor parallelism where the op is split).
This module names the builders that the memory engine and the tests ask for.
"""

from __future__ import annotations

from calc.sim.attention import attention_block, sdpa_needs_mask
from calc.sim.blocks import (
    decoder_layer,
    embedding_block,
    final_norm_block,
    head_block,
    inference_head_block,
    liger_chunk_tokens,
    liger_head_block,
    stack_locals_bytes,
)
from calc.sim.context import Ctx
from calc.sim.moe import moe_mlp
from calc.sim.ops import layer_norm, rms_norm

__all__ = ["Ctx", "attention_block", "decoder_layer", "embedding_block", "final_norm_block", "head_block",
           "inference_head_block", "layer_norm", "liger_chunk_tokens", "liger_head_block", "moe_mlp", "rms_norm",
           "sdpa_needs_mask", "stack_locals_bytes"]

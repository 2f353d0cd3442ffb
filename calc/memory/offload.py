"""activation_offload: torchtune's OffloadActivations (torchtune/training/_activation_offloading.py, torchtune 0.6.1)
as the training step's memory sees it, with its defaults (use_streams=True, min_offload_size=1024,
max_fwd_stash_size=5, use_pin_memory=True). Read from torchtune's source:

- pack (forward): every saved tensor takes the next id; one of at least MIN_OFFLOAD_BYTES that is not a
  Parameter or Buffer is copied to pinned host memory, and its device tensor is kept in the forward stash (the
  copy stream's overlap) until a later offloaded pack's id is at least FWD_STASH_PACKS above its own;
- unpack (backward): the first node that unpacks an offloaded tensor clears the forward stash after it runs; a
  tensor not in the stash is copied back to the device and kept (the backward stash) until the next node that
  unpacks one has run, unless something else holds it by the end of its own node (then it lives as long as that);
- the recipes (full_finetune_single_device, lora_finetune_single_device) enter the context around
  `self._model(**batch)` with the output head opted out (NoOpManager hooks on model.output), and refuse it
  without enable_activation_checkpointing: what it packs is the embedding's indices, each checkpointed layer's
  stored input (torch.utils.checkpoint, non-reentrant: _CheckpointFrame.save_inputs saves the positional tensor
  arguments, the hidden state alone in transformers' and torchtune's layers) and the final norm's saved tensors.

On a CPU the "device" and the host are one memory: the reference loop's emulation (measure/activation_offload.py)
measures the device side; the CUDA streams' overlap (when the stash frees) is modelled from torchtune's source.
"""

from __future__ import annotations

from typing import NamedTuple

from calc.contract.i18n import N_
from calc.contract.scenario import Mode, Scenario
from calc.memory.activations import residual_stream_bytes
from calc.memory.host import HostPart
from calc.sim.context import Ctx

MIN_OFFLOAD_BYTES = 1024  # OffloadActivations(min_offload_size=1024)
FWD_STASH_PACKS = 5  # OffloadActivations(max_fwd_stash_size=5)
SOURCE = ("torchtune/training/_activation_offloading.py OffloadActivations (defaults), read from its source; "
          "device side measured on the CPU through measure/activation_offload.py")


class Pack(NamedTuple):
    """One tensor an autograd node saves, in the order forward packs them."""

    key: str  # the tensor (its storage): a tensor two nodes save is packed, and copied, twice
    nbytes: int
    param: bool = False  # a Parameter (kept as it is)

    @property
    def offloaded(self) -> bool:
        return not self.param and self.nbytes >= MIN_OFFLOAD_BYTES


def forward_stash(packs: list[Pack]) -> list[frozenset[str]]:
    """After each pack, the tensors the forward stash keeps on the device (pack_tensor: at each offloaded pack,
    the stash drops every id <= its id - max_fwd_stash_size)."""
    stash: list[int] = []
    out = []
    for pid, p in enumerate(packs, 1):
        if p.offloaded:
            stash = [k for k in stash if k > pid - FWD_STASH_PACKS]
            stash.append(pid)
        out.append(frozenset(packs[k - 1].key for k in stash))
    return out


def layer_key(i: int) -> str:
    return f"input of layer {i}"


def embedding_packs(ctx: Ctx) -> list[Pack]:
    """nn.Embedding saves its indices (int64) when its weight trains; a frozen one records no node."""
    return [Pack("input_ids", 8 * ctx.tokens)] if ctx.trains("embed_tokens") else []


def layer_packs(i: int, h_bytes: int) -> list[Pack]:
    """A checkpointed layer: torch.utils.checkpoint saves its positional tensor arguments (the hidden state alone:
    the mask and the positions are keyword arguments); what the layer saves inside goes to the checkpoint's own
    hooks, the innermost, which the offload never sees."""
    return [Pack(layer_key(i), h_bytes)]


def final_norm_packs(ctx: Ctx, layers: int) -> list[Pack]:
    """An RMSNorm (calc.sim.ops.rms_norm): pow saves the fp32 input (the input itself when fp32), rsqrt its
    output, x * rsqrt both, and the product with the weight the weight (a Parameter) and, when the weight trains,
    the normed tensor. A product's node saves its second operand before its first (MulBackward0, as the reference
    loop's packs show): rsqrt before x; transformers' `weight * normed` the normed tensor first, torchtune's
    `normed * scale` the scale first."""
    t, hidden, x_bytes = ctx.tokens, ctx.spec.hidden_size, ctx.residual_elem_bytes
    x32 = layer_key(layers) if x_bytes == 4 else "final norm fp32 input"
    packs = [Pack(x32, 4 * t * hidden), Pack("final norm rsqrt", 4 * t), Pack("final norm rsqrt", 4 * t),
             Pack(x32, 4 * t * hidden)]
    weight = [Pack("final norm weight", 0, param=True)]
    if not ctx.frozen_base:
        normed = Pack("final norm output", max(ctx.weight_elem_bytes, x_bytes) * t * hidden)
        weight = [*weight, normed] if ctx.framework == "torchtune" else [normed, *weight]
    return packs + weight


class OffloadPlan(NamedTuple):
    """What the decoder stack of one micro-batch packs, and what the device keeps of it."""

    host_tensors: tuple[int, ...]  # the pinned host copies, one per offloaded pack
    layer_inputs_on_device: tuple[int, ...]  # [i]: layer inputs the forward stash keeps once layer i has packed
    inputs_at_loss: int  # layer inputs still in the stash when the decoder returns (the lm_head and the loss)
    norm_on_device: bool  # every tensor the final norm saved is still in the stash then


def offload_plan(ctx: Ctx, layers: int, h_bytes: int, leaf_input: bool = False) -> OffloadPlan:
    """The decoder stack's packs, in forward order, through the forward stash. `leaf_input`: layer 0's input is a
    leaf that requires grad (a frozen embedding's output under transformers' enable_input_require_grads): its
    AccumulateGrad node holds it on the device while the graph lives, offloaded or not."""
    packs = embedding_packs(ctx)
    ends = []
    for i in range(layers):
        packs += layer_packs(i, h_bytes)
        ends.append(len(packs) - 1)
    norm = final_norm_packs(ctx, layers)
    packs += norm
    stash = forward_stash(packs)
    inputs = {layer_key(i) for i in range(layers)}
    if leaf_input:
        stash = [keys | {layer_key(0)} for keys in stash]
    return OffloadPlan(host_tensors=tuple(p.nbytes for p in packs if p.offloaded),
                       layer_inputs_on_device=tuple(len(stash[e] & inputs) for e in ends),
                       inputs_at_loss=len(stash[-1] & inputs),
                       norm_on_device=all(p.key in stash[-1] for p in norm if p.offloaded))


def activation_offload_parts(sc: Scenario, ctx: Ctx, layers: int) -> list[HostPart]:
    """The host RAM part of activation_offload in training (none otherwise): the pinned host copies of one
    micro-batch, all alive at the end of its forward (torch.empty_like(..., pin_memory=True) each; the next
    micro-batch packs after backward has unpacked them all)."""
    if not (sc.training.activation_offload and sc.mode == Mode.train):
        return []
    plan = offload_plan(ctx, layers, residual_stream_bytes(ctx))
    return [HostPart("activation_offload", N_("offloaded activations (pinned, torchtune's OffloadActivations)"),
                    sum(plan.host_tensors), plan.host_tensors, "host_ram", SOURCE)]


__all__ = ["FWD_STASH_PACKS", "MIN_OFFLOAD_BYTES", "SOURCE", "OffloadPlan", "Pack", "activation_offload_parts", "forward_stash",
           "offload_plan"]

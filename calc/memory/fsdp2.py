"""PyTorch FSDP2 (fully_shard on every decoder layer and on the root): its model states on one rank and the
per-layer terms the training timeline adds (calc.memory.train_timeline): the gathered groups, the all-gather
output kept in forward, the reduce-scatter buffers, and expert parallelism's own experts group. Modelled from
torch/distributed/fsdp/_fully_shard (FSDPParamGroup) and measured on the CPU over the fake process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from math import prod

from calc.contract import precision
from calc.contract.architectures import ModelSpec
from calc.contract.i18n import N_
from calc.contract.scenario import Precision, Scenario
from calc.memory.result import Component, words
from calc.memory.states import Shapes, States, adapter_bytes, lora_shapes
from calc.sim.layers import Ctx


def fsdp2_states(sc: Scenario) -> States:
    """FSDP2's model states on one rank: full fine-tuning (fsdp2_full_states) or a peft LoRA model
    (fsdp2_lora_states)."""
    return fsdp2_full_states(sc) if sc.training.lora is None else fsdp2_lora_states(sc)


def fsdp2_full_states(sc: Scenario) -> States:
    """PyTorch FSDP2 (fully_shard on every decoder layer and on the root), the ZeRO-3 analogue
    with reshard_after_forward=True and the ZeRO-2 analogue with False. Each parameter is sharded
    on dim 0, padded to a multiple of the world size N; gradients are reduce-scattered into the
    same shards and the optimizer runs on them. *-mixed uses MixedPrecisionPolicy(param_dtype=16-bit,
    reduce_dtype=fp32): the fp32 shards are the master weights. The root's gathered weights
    (embedding, final norm, lm_head) stay unsharded from forward to the end of backward
    (torch/distributed/fsdp/_fully_shard, FSDPParamGroup)."""
    spec, t = sc.spec, sc.training
    p = t.precision
    ranks, ep = sc.data_parallel, t.expert_parallel
    stored_bytes = 2 if p == Precision.bf16 else 4  # per shard element
    compute_bytes = 2 if (p == Precision.bf16 or p.is_mixed) else 4  # per gathered element
    reduce_bytes = 4 if p.is_mixed else stored_bytes  # the reduce dtype: fp32 under MixedPrecisionPolicy(reduce_dtype)
    shapes = fsdp2_shard_shapes(spec, ranks, ep)
    sharded_params = sum(prod(s) * c for s, c in shapes)
    routed_params = spec.routed_expert_params_per_layer() if ep > 1 else 0  # one layer's, all experts
    layer_params = spec.layer_params() - routed_params  # a decoder layer's group (under EP without its experts)
    state_precision = Precision.bf16 if p == Precision.bf16 else Precision.fp32
    root_params = spec.embedding_params() + spec.norm_params() + spec.lm_head_params()
    dense_layer_params = spec.layer_params() + spec.dense_layer_delta() if spec.dense_layers else 0
    # an experts group of one rank (efsdp = 1) "reduces" into a full-size output, through a divided
    # temporary: reduce_output.copy_(input / gradient_divide_factor)
    experts_reduce_bytes = routed_params // ep * (3 if ep > 1 and ranks // ep == 1 else 1) * reduce_bytes
    # ...and through that reduce the group's last parameter (the down projection) keeps its unsharded gradient:
    # a DTensor that autograd, not Python, still holds once the list of gradients is cleared (measured on the CPU
    # over the fake process group: Qwen3-MoE, 64 experts, ep 8 of 8)
    last_expert_grad_bytes = prod(spec.routed_expert_shapes()[-1][0]) // ep * compute_bytes if routed_params else 0
    weights = Component(key="weights", category="parameters", label=N_("Model weights (FSDP2 shards)"),
                        bytes=sharded_params * stored_bytes,
                        **words("formula", N_("{params} params / {ranks} ranks x {bytes} B"),
                                params=f"{spec.total_params():,}", ranks=ranks, bytes=stored_bytes),
                        source=N_("FSDP2 dim-0 sharding, padded to a multiple of the world size"))
    return States(
        weights=sharded_params * stored_bytes, grads=sharded_params * stored_bytes,
        optimizer=precision.optimizer_state_bytes(t.optimizer, state_precision, shapes), master=0,
        opt_temp=precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, state_precision, shapes),
        grad_fp32_step=0, zero_buffers=0, trainable=spec.total_params(), params_local=spec.total_params(),
        offloaded_cpu=0, offloaded_nvme=0, components=[weights], gathered_root=root_params * compute_bytes,
        gathered_layer=layer_params * compute_bytes, gathered_experts=routed_params // ep * compute_bytes,
        reshard_after_forward=t.zero_stage == 3,
        forward_all_gather=fsdp2_forward_all_gather_elements(spec, ranks, ep) * compute_bytes,
        # the unsharded grads are copied into one flat reduce-scatter input in the reduce dtype (fp32
        # under mixed precision: chunk_cat casts as it copies; foreach_reduce, torch 2.13) and freed after
        # (under expert parallelism the experts reduce-scatter as their own group, before the layer's)
        reduce_scatter_input=max(layer_params * reduce_bytes, experts_reduce_bytes),
        reduce_scatter_experts=experts_reduce_bytes + last_expert_grad_bytes,
        # comm_ctx.reduce_scatter_states keeps one input (reduce_scatter_max_input_buffers = 1) until the
        # next group's post-backward: a decoder layer's (its dense group's) through the next layer's backward
        reduce_scatter_kept=layer_params * reduce_bytes,
        gathered_dense_layer=dense_layer_params * compute_bytes, reduce_scatter_dense=dense_layer_params * reduce_bytes)


@dataclass(frozen=True)
class Fsdp2LayerTerms:
    """FSDP2's bytes for each decoder layer in the timeline (a MoE model's dense first layers are smaller groups,
    without experts)."""

    gathered_bytes: list[int]  # the layer's unsharded parameters (under EP without its experts)
    gathered_below_bytes: list[int]  # [i]: gathered over the layers below i (ZeRO-2 analogue: all stay gathered)
    experts_bytes: list[int]  # EP: the layer's local experts, their own group
    all_gather_bytes: list[int]  # the layer's last group's all-gather output, kept until the next copy-out
    reduce_scatter_kept_bytes: list[int]  # the layer's (dense group's) reduce-scatter input, kept to the next group's
    reduce_scatter_peak_bytes: list[int]  # the larger of its groups' reduce-scatter inputs
    experts_reduce_bytes: list[int]  # EP: the experts group's reduce-scatter buffers (0 for a dense layer)


def fsdp2_layer_terms(st: States, ctxs: list[Ctx]) -> Fsdp2LayerTerms:
    """Each layer's FSDP2 terms, from the states of one rank and the layers' contexts (dense or MoE)."""
    dense = [c.dense_mlp for c in ctxs]
    gathered = [st.gathered_dense_layer if d else st.gathered_layer for d in dense]
    return Fsdp2LayerTerms(
        gathered_bytes=gathered, gathered_below_bytes=list(accumulate(gathered, initial=0)),
        experts_bytes=[0 if d else st.gathered_experts for d in dense],
        all_gather_bytes=[g if d else st.forward_all_gather for g, d in zip(gathered, dense, strict=True)],
        reduce_scatter_kept_bytes=[st.reduce_scatter_dense if d else st.reduce_scatter_kept for d in dense],
        reduce_scatter_peak_bytes=[st.reduce_scatter_dense if d else st.reduce_scatter_input for d in dense],
        experts_reduce_bytes=[0 if d else st.reduce_scatter_experts for d in dense])


def fsdp2_local_expert_grad_bytes(c: Ctx) -> int:
    """Gradient bytes of one MoE layer's E / ep local routed experts, unsharded (0 for a dense layer or a
    frozen base)."""
    s = c.spec
    if c.ep == 1 or c.dense_mlp or c.frozen_base or not s.moe:
        return 0
    return c.weight_elem_bytes * s.routed_expert_params_per_layer() // c.ep


def fsdp2_experts_unshard_in_recompute(c: Ctx) -> bool:
    """Under expert parallelism with full checkpointing, whether a MoE layer's recompute unshards its experts
    group before the group's pre-backward hook does: when the shared experts run after the routed ones
    (DeepSeek-V2/V3, GLM-4.5: experts(x) + shared_experts(x)), their saved tensors are unpacked first, which
    starts the recompute; the experts' pre-forward then unshards in forward state and keeps the all-gather
    output (comm_ctx.all_gather_state). Where the routed experts' output is the block's last op (Qwen3-MoE,
    Mixtral), their pre-backward runs first and frees it. Measured on the CPU over the fake process group."""
    s = c.spec
    return c.ep > 1 and s.shared_experts > 0 and s.moe and not c.dense_mlp


def fsdp2_forward_all_gather_elements(spec: ModelSpec, n: int, ep: int) -> int:
    """Elements of the all-gather output FSDP2 keeps in forward after a group's copy-out, to overlap it with the
    next all-gather, until the next group's copy-out (or the root's post-forward: so through the loss)
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, wait_for_unshard, `all_gather_state`): a decoder
    layer's, or under expert parallelism the last group of a layer, its experts', which a group of one rank (efsdp =
    1) initialises from its shard without an all-gather. Measured on the CPU over the fake process group."""
    if ep == 1:
        return spec.layer_params()
    return spec.routed_expert_params_per_layer() // ep if n // ep > 1 else 0


def fsdp2_shard_shapes(spec: ModelSpec, n: int, ep: int) -> Shapes:
    """(shape, count) of this rank's FSDP2 shards: every parameter split on dim 0 over the n ranks, padded
    to a multiple of n. Under expert parallelism each routed-expert stack (E x ...) first keeps its
    E / ep experts (transformers' grouped_gemm Shard(0) on the ep mesh), then those are split over the
    n / ep ranks of the efsdp mesh that hold the same experts (fsdp.apply_fully_sharded_data_parallelism)."""
    routed = spec.routed_expert_shapes() if ep > 1 else []
    rest = list(spec.param_shapes())
    for entry in routed:
        rest.remove(entry)
    efsdp = n // ep
    return ([((-(-s[0] // n),) + s[1:], c) for s, c in rest]
            + [((-(-(s[0] // ep) // efsdp),) + s[1:], c) for s, c in routed])



_LORA_SOURCE = N_("FSDP2 dim-0 sharding of the frozen base and the adapters, padded to a multiple of the world "
                  "size; gradients and optimizer states for the adapters only")
_LORA_MIXED_SOURCE = N_("FSDP2 dim-0 sharding of the frozen base and the adapters, padded to a multiple of the world "
                        "size; gradients and optimizer states for the adapters only (with a mixed-precision policy: "
                        "modelled from PyTorch's source, not measured)")


def fsdp2_lora_states(sc: Scenario) -> States:
    """FSDP2 (fully_shard per decoder layer and on the root) over a peft LoRA model: every parameter, the frozen
    bf16 base and the adapters (peft's dtype, calc.memory.states.adapter_bytes) alike, is sharded on dim 0 and
    padded to a multiple of the world size; the groups FSDP2 gathers hold the layer's base weights and its
    adapters. Only parameters that require grad get a gradient: FSDPParamGroup.post_backward collects the
    unsharded gradients of `fsdp_params_with_grad` (the frozen base has none), so the reduce-scatter input and the
    sharded gradients are the adapters' alone, and the optimizer keeps states for the adapter shards only
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward, _fsdp_collectives.py foreach_reduce).
    FSDP2 asks one dtype of a group's trainable parameters only (FSDPParamGroup._init_mp_dtypes), so fp32 adapters
    shard beside the bf16 base as they are; measured on the CPU over the fake process group in bf16, amp-bf16 and
    fp32 without a MixedPrecisionPolicy. *-mixed (a MixedPrecisionPolicy over 16-bit adapters) is modelled the
    same way, not measured. Expert parallelism is not applied to LoRA runs (the adapters sit on the attention and
    dense linears). modules_to_save's trainable copies belong to the root group (gathered with it, their
    gradients and states sharded as the adapters'); measured in bf16."""
    spec, t = sc.spec, sc.training
    lora, ranks = t.lora, sc.data_parallel
    assert lora is not None
    ad = adapter_bytes(t.precision, t.lora.base_weights)
    # modules_to_save's trainable copies (lm_head, the embedding) are the root group's, beside its frozen originals
    adapters = lora_shapes(spec, lora.rank, lora.targets, spec.num_layers, 1) \
        + spec.modules_to_save_shapes(lora.modules_to_save)
    copies = sum(prod(s) * c for s, c in spec.modules_to_save_shapes(lora.modules_to_save))
    base_params = sum(prod(s) * c for s, c in fsdp2_shard_shapes(spec, ranks, 1))
    adapter_shards = [((-(-s[0] // ranks),) + s[1:], c) for s, c in adapters]
    adapter_shard_params = sum(prod(s) * c for s, c in adapter_shards)
    trainable = sum(prod(s) * c for s, c in adapters)
    state_precision = Precision.bf16 if ad == 2 else Precision.fp32
    layer_adapters = spec.lora_params_per_layer(lora.rank, lora.targets)
    dense_adapters = spec.lora_params_per_layer(lora.rank, lora.targets, dense=True) if spec.dense_layers else 0
    layer_bytes = spec.layer_params() * 2 + layer_adapters * ad
    dense_layer_bytes = (spec.layer_params() + spec.dense_layer_delta()) * 2 + dense_adapters * ad \
        if spec.dense_layers else 0
    root_bytes = (spec.embedding_params() + spec.norm_params() + spec.lm_head_params() + copies) * 2 \
        + spec.lora_lm_head_params(lora.rank, lora.targets) * ad
    weights = Component(key="weights", category="parameters", label=N_("Model weights (FSDP2 shards)"),
                        bytes=base_params * 2 + adapter_shard_params * ad,
                        **words("formula", N_("{base} frozen base params x 2 B + {lora} LoRA params x {bytes} B, "
                                              "/ {ranks} ranks"),
                                base=f"{spec.total_params():,}", lora=f"{trainable:,}", bytes=ad, ranks=ranks),
                        source=_LORA_MIXED_SOURCE if t.precision.is_mixed else _LORA_SOURCE)
    return States(
        weights=base_params * 2 + adapter_shard_params * ad, grads=adapter_shard_params * ad,
        optimizer=precision.optimizer_state_bytes(t.optimizer, state_precision, adapter_shards), master=0,
        opt_temp=precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, state_precision, adapter_shards),
        grad_fp32_step=0, zero_buffers=0, trainable=trainable, params_local=spec.total_params() + trainable,
        offloaded_cpu=0, offloaded_nvme=0, components=[weights], gathered_root=root_bytes,
        gathered_layer=layer_bytes, reshard_after_forward=t.zero_stage == 3, forward_all_gather=layer_bytes,
        reduce_scatter_input=layer_adapters * ad, reduce_scatter_kept=layer_adapters * ad,
        gathered_dense_layer=dense_layer_bytes, reduce_scatter_dense=dense_adapters * ad)

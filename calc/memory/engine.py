"""The estimate: per-GPU memory through the first training steps, from a Scenario.

Model states come from calc.contract.precision and calc.contract.parallel; activations and transients come from
replaying the transformers ops of one decoder layer, the embedding and the LM head + loss in the
autograd simulator (calc.sim.graph, calc.sim.layers). Layers are identical, so the step's timeline is
composed from the three block profiles:

  forward layer i : base + embedding saved + sum_{j<i} saved_j + layer forward peak
  loss backward   : base + all saved + head backward peak (logits' fp32 grads)
  backward layer i: base + sum_{j<i} saved_j + grads of layers > i + layer backward peak
  optimizer step  : weights + grads + states (+ master) + optimizer temporaries

where base = weights (+ states and master weights from step 2 on, since torch.optim creates them
lazily in step 1) + input ids. The peak is the largest of these moments over three steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import accumulate
from math import lcm, prod
from operator import itemgetter
from typing import Literal, TypeVar

from calc.contract import parallel, precision
from calc.contract.architectures import GEMMA_FAMILIES, ModelSpec, per_spec
from calc.contract.i18n import N_
from calc.contract.presets import cluster_presets, gpu_presets
from calc.contract.scenario import (
    Attention,
    Checkpointing,
    HardwareConfig,
    LoraConfig,
    Mode,
    Offload,
    OptimizerImpl,
    Precision,
    Scenario,
    TrainingConfig,
)
from calc.memory.overhead import cublas_workspace_bytes, device_total
from calc.memory.result import (
    ALL_GATHER_LAYER,
    BACKWARD_LAYER,
    EXPERTS_REDUCE_LAYER,
    FORWARD_LAYER,
    INFERENCE_LAYER,
    RECOMPUTED_LAYER,
    REDUCE_SCATTER_LAYER,
    Component,
    Estimate,
    Timeline,
    make_estimate,
    words,
)
from calc.memory.verdict import gpu_headroom, verdict_data
from calc.sim.graph import BlockProfile, Graph
from calc.sim.layers import (
    Ctx,
    attention_block,
    decoder_layer,
    embedding_block,
    final_norm_block,
    head_block,
    inference_head_block,
    layer_norm,
    liger_head_block,
    rms_norm,
    sdpa_needs_mask,
)
from calc.sim.profiles import block_profile, forget_recordings, forget_shapes

T = TypeVar("T")
Target = Literal["cuda", "cpu"]
Sharder = Literal["deepspeed", "fsdp2", "torch"]
_QUANT_BYTES = {"bf16": 2.0, "int8": 1.0 + 4 / 4096, "nf4": 0.5 + 1 / 64 + 4 / (64 * 256)}


# ---- model states ------------------------------------------------------------------------

@dataclass(frozen=True)
class States:
    """Model-state bytes on one GPU (after sharding)."""

    weights: int
    grads: int
    optimizer: int  # states (+ fp32 master weights for *-mixed)
    master: int
    opt_temp: int  # optimizer.step() temporaries
    grad_fp32_step: int  # fp32 copies of grads alive during the step (*-mixed)
    zero_buffers: int  # ZeRO-2 bucket / ZeRO-3 gathered weights
    trainable: int  # trainable params on this GPU before ZeRO sharding
    params_local: int  # params on this GPU before ZeRO sharding
    offloaded_cpu: int
    offloaded_nvme: int
    components: list[Component] = field(default_factory=list)
    gathered_root: int = 0  # FSDP2: unsharded root weights (embedding, final norm, lm_head), fwd + bwd
    gathered_layer: int = 0  # FSDP2: one decoder layer's unsharded weights while it runs
    gathered_experts: int = 0  # FSDP2 + expert parallelism: one layer's local experts, their own FSDP group
    forward_all_gather: int = 0  # FSDP2: the last all-gather's output, kept in forward until the next copy-out
    reshard_after_forward: bool = True  # FSDP2 zero_stage 3 (True) or 2 (False)
    reduce_scatter_input: int = 0  # FSDP2: a layer's gradients copied (reduce dtype) for reduce-scatter
    reduce_scatter_kept: int = 0  # FSDP2: the last reduce-scatter input, kept until the next group's reduce
    gathered_dense_layer: int = 0  # FSDP2: a MoE model's dense layer (first_k_dense_replace), unsharded
    reduce_scatter_dense: int = 0  # FSDP2: a dense layer's reduce-scatter input
    reduce_scatter_experts: int = 0  # FSDP2 + EP: the experts group's reduce buffers (+ a gradient kept through it)
    load_host: int = 0  # host RAM one process needs to build / load the model (calc.contract.parallel.model_load_host_bytes)
    persistent_grads: bool = False  # DeepSpeed ZeRO-3: the gradient partitions are one buffer kept from init on
    zero3_gathered: int = 0  # DeepSpeed ZeRO-3: gathered (and prefetched) weights, in forward and backward only
    reduce_buckets: int = 0  # DeepSpeed ZeRO-1/2: IPG buckets, from the first gradient hook to the end of backward
    # DeepSpeed ZeRO-1/2 without offload: the gradient partition appears whole at the first bucket reduction,
    # once this many gradient elements have been produced in backward (None: grads grow as produced)
    first_reduction_elements: int | None = None
    # ...and with the model's parameter order known (full fine-tuning, one pipeline stage, no tensor or expert
    # parallelism): rank 0's partition as DeepSpeed allocates it (calc.contract.parallel.zero12_rank0_partition)
    rank0_partition: parallel.Zero12Partition | None = None
    grad_bytes: int = 0  # bytes per gradient element
    keeps_16bit_step_grads: bool = False  # DeepSpeed ZeRO-0 *-mixed: FP16_(Unfused)Optimizer keeps them in step
    flattens_step_grads: bool = False  # DeepSpeed FP16_Optimizer (ZeRO-0 fused): fp32 copies flattened first


def _count(spec: ModelSpec, method: str) -> int:
    """spec.<method>() (a parameter count), memoized per spec: listing a model's linears costs more than
    composing a new shape's timeline."""
    return per_spec(spec, method, getattr(spec, method))


def lora_shapes(spec: ModelSpec, rank: int, targets: str, layers: int, tp: int,
                first: bool = True) -> list[tuple[tuple[int, ...], int]]:
    """LoRA A (r x in) and B (out x r) for each targeted linear of each layer (peft; the layer list is
    ModelSpec.linear_layers of each kind of layer, this GPU's tensor-parallel slice). Shared: treat as
    read-only."""
    return per_spec(spec, ("lora_shapes", rank, targets, layers, tp, first),
                    lambda: _lora_shapes(spec, rank, targets, layers, tp, first))


def _lora_shapes(spec: ModelSpec, rank: int, targets: str, layers: int, tp: int,
                 first: bool) -> list[tuple[tuple[int, ...], int]]:
    dense = min(layers, spec.dense_layers) if first else 0
    shapes: list[tuple[tuple[int, ...], int]] = []
    for kind, n in ((False, layers - dense), (True, dense)):
        for lin in spec.linear_layers(kind) if n else []:
            if lin.lora_target(targets):
                fin, fout = lin.in_features // lin.tp_in(tp), lin.out_features // lin.tp_out(tp)
                shapes += [((rank, fin), lin.count * n), ((fout, rank), lin.count * n)]
    return shapes


def local_params(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> int:
    """Parameters on one GPU: layer weights / tp (norms replicated), the vocab-parallel embedding
    on the first pipeline stage and the final norm + lm_head on the last."""
    return per_spec(spec, ("local_params", tp, layers, first, last),
                    lambda: _local_params(spec, tp, layers, first, last))


def _local_params(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> int:
    n = layers * (spec.layer_matmul_params() // tp + spec.layer_norm_params())
    if first:  # a MoE model's first layers are dense
        n += min(layers, spec.dense_layers) * spec.dense_layer_delta() // tp
    if first:
        n += spec.embedding_params() // tp
    if last:
        n += spec.norm_params() + spec.lm_head_params() // tp
        if spec.tie_word_embeddings and not first:
            n += spec.vocab_size * spec.hidden_size // tp
    return n


def model_states(sc: Scenario, layers: int, first: bool, last: bool, target: Target = "cuda",
                 deepspeed: bool = True) -> States:
    """Weights, gradients, optimizer states and their sharding for one GPU; `target` decides how
    DeepSpeed's pinned host buffers are sized (calc.contract.parallel.pinned_bytes); `deepspeed` False is plain
    PyTorch (the reference loop, DDP) at zero_stage 0."""
    spec, t = sc.spec, sc.training
    p = t.precision
    dp = sc.data_parallel
    tp = t.tensor_parallel
    n_local = local_params(spec, tp, layers, first, last)
    shard = parallel.zero_sharding(t.zero_stage, dp)
    comps: list[Component] = []
    if t.lora is not None:
        which = ("lora", t.lora.rank, t.lora.targets, layers, tp, first)  # names `shapes` in the per-spec memo
        shapes = lora_shapes(spec, t.lora.rank, t.lora.targets, layers, tp, first)
        trainable = per_spec(spec, (which, "numel"), lambda: sum(prod(s) * c for s, c in shapes))
        base_b = _QUANT_BYTES[t.lora.base_weights]
        ad = adapter_bytes(p)
        weights = round(n_local * base_b * shard.weights) + ad * trainable
        grad_b = ad
        state_p = p if ad == 2 else Precision.fp32
        w_formula = words("formula", N_("{base} frozen base params x {base_bytes} B ({quant}) + {lora} LoRA params "
                                        "x {lora_bytes} B"), base=f"{n_local:,}", base_bytes=f"{base_b:g}",
                          quant=t.lora.base_weights, lora=f"{trainable:,}", lora_bytes=ad)
    else:
        which = ("local", tp, layers, first, last)
        shapes = _local_shapes(spec, tp, layers, first, last)
        trainable = n_local
        wb = precision.weight_bytes_per_param(p)
        weights = round(n_local * wb * shard.weights)
        grad_b, state_p = precision.grad_bytes_per_param(p), p
        w_formula = words("formula", N_("{params} params x {bytes} B{zero}"), params=f"{n_local:,}", bytes=wb,
                          zero=f" / {dp} (ZeRO-3)" if shard.weights < 1 else "")
    # DeepSpeed ZeRO-1 with overlap_comm (the export writes it) reduces through the buckets in backward as
    # ZeRO-2 does and keeps only this rank's partition (stage_1_and_2.py, process_gradients)
    zero12 = deepspeed and (t.zero_stage == 2 or (t.zero_stage == 1 and parallel.OVERLAP_COMM))
    grads = round(trainable * grad_b * (shard.optimizer if zero12 else shard.gradients))
    # sums over the parameter shapes, once per spec: a new batch shape or parallel layout does not change them
    states = round(per_spec(spec, (which, t.optimizer, state_p),
                            lambda: precision.optimizer_state_bytes(t.optimizer, state_p, shapes)) * shard.optimizer)
    master = round(trainable * precision.master_bytes_per_param(p) * shard.optimizer)
    if t.zero_stage >= 1 and not master:
        # DeepSpeed ZeRO-1/2/3 always hand the optimizer a clone of this rank's partition in the master
        # dtype (fp32; bf16 under bf16_master_weights_and_grads), even when the model is fp32
        # (stage_1_and_2.py single_partition_of_fp32_groups, stage3.py fp32_partitioned_groups_flat)
        master = round(trainable * (2 if p == Precision.bf16 else 4) * shard.optimizer)
    temp = round(per_spec(spec, (which, t.optimizer, t.optimizer_impl, state_p),
                          lambda: precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, state_p, shapes))
                 * shard.optimizer)
    grad32 = round(trainable * 4 * shard.optimizer) if p.is_mixed else 0
    buckets = parallel.reduce_bucket_bytes(grad_b, t.zero_stage, autocast_bytes=2 if p.is_amp else 0,
                                           elements=t.reduce_bucket_size)
    # ZeRO-3's bucket lives from initialisation on; ZeRO-1/2's from the first gradient hook to the end of
    # backward (stage_1_and_2.py setup_buckets, _release_ipg_buffers)
    zero_buf, reduce_buckets = (0, buckets) if t.zero_stage in (1, 2) else (buckets, 0)
    layer_p = _count(spec, "layer_params") // tp
    edge = max(_count(spec, "embedding_params"), _count(spec, "lm_head_params")) // tp
    # released again before the optimizer step (measured: ZeRO-3 step peaks hold no gathered weights)
    gathered = parallel.stage3_live_param_bytes(layer_p, edge, precision.weight_bytes_per_param(p), t.zero_stage, dp,
                                                params_offloaded=t.offload_params != Offload.none, total_params=n_local)
    cpu = nvme = 0
    if t.offload_optimizer != Offload.none:
        # ZeRO-Offload (stage_1_and_2.py / stage3.py, cpu_offload): the optimizer states and a partition
        # of master weights in the master dtype (fp32, or bf16 for pure bf16; a clone even when the model
        # is fp32) live in host memory, the master in pinned memory, beside a pinned fp32 gradient
        # partition; only the reduce buckets stay on the GPU
        part = round(trainable * shard.optimizer)
        master_bytes = part * (2 if p == Precision.bf16 else 4)
        if t.offload_optimizer == Offload.cpu:
            cpu += states + parallel.pinned_bytes(master_bytes, target)
        else:
            nvme += states + master_bytes
        cpu += parallel.pinned_bytes(part * 4, target)
        if t.zero_stage == 3:  # the gradient partition buffer lives on the host with the optimizer
            cpu += parallel.pinned_bytes(grads, target)
        if t.zero_stage in (1, 2):  # the gradients go straight to the host's fp32 partition
            zero12 = False
            largest = per_spec(spec, (which, "largest"), lambda: max((prod(s) for s, _ in shapes), default=0))
            dev_buf, host_buf = parallel.zero12_offload_buffers(part, largest, grad_b, target)
            zero_buf += dev_buf
            cpu += host_buf
        states, master, temp, grad32, grads = 0, 0, 0, 0, 0
    if t.offload_params != Offload.none:
        if t.offload_params == Offload.cpu:
            cpu += weights
        else:
            nvme += weights
        weights = 0
    if target == "cpu":
        # DeepSpeed's CPU accelerator: the "device" is the host, so what is offloaded to CPU RAM is in
        # the same memory as everything else (and pin_memory is a no-op: pinned_bytes is exact)
        zero_buf += cpu
    comps.append(Component(key="weights", category="parameters", label=N_("Model weights"), bytes=weights,
                           **w_formula, source=N_("parameter count x bytes per weight (calc.contract.precision)")))
    largest_all = per_spec(spec, ("local", tp, layers, first, last, "largest"),
                           lambda: max((prod(s) for s, _ in _local_shapes(spec, tp, layers, first, last)), default=0))
    load = parallel.model_load_host_bytes(n_local, largest_all, precision.weight_bytes_per_param(p), t.zero_stage)
    # ZeRO-3 keeps every gradient partition in one flat buffer (grad dtype) allocated at initialisation
    # (stage3.py, grad_partitions_flat_buffer), so the gradients are there in every phase
    # DeepSpeed ZeRO-0 with a 16-bit model wraps the optimizer in FP16_UnfusedOptimizer (FP16_Optimizer for
    # FusedAdam), which casts each 16-bit .grad to an fp32 .grad of its master copy and frees neither before
    # the step (fp16/unfused_optimizer.py, step; engine.py _do_optimizer_sanity_check: DDP_BFLOAT16 / FP16)
    fp16_wrapper = deepspeed and t.zero_stage == 0 and p.is_mixed
    exact_order = zero12 and t.lora is None and tp == 1 and first and last and t.expert_parallel == 1
    return States(weights, grads, states + master, master, temp, grad32, zero_buf, trainable, n_local, cpu, nvme, comps,
                  load_host=load, persistent_grads=t.zero_stage == 3, zero3_gathered=gathered,
                  reduce_buckets=reduce_buckets,
                  first_reduction_elements=t.reduce_bucket_size if zero12 else None,
                  rank0_partition=_rank0_partition(spec, dp, t.reduce_bucket_size) if exact_order else None,
                  grad_bytes=grad_b,
                  keeps_16bit_step_grads=fp16_wrapper,
                  flattens_step_grads=fp16_wrapper and t.optimizer_impl == OptimizerImpl.fused)


def _rank0_partition(spec: ModelSpec, dp: int, bucket: int) -> parallel.Zero12Partition:
    """calc.contract.parallel.zero12_rank0_partition of the whole model, memoized per spec, world size and bucket."""
    return per_spec(spec, ("zero12 rank 0", dp, bucket), lambda: parallel.zero12_rank0_partition(
        per_spec(spec, "param order", lambda: parallel.ParamOrder(*spec.param_numel_blocks())), dp, bucket))


def _local_shapes(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> list[tuple[tuple[int, ...], int]]:
    """Parameter shapes on this GPU (layer counts scaled to this stage; TP splits the first dim). Shared:
    treat as read-only."""
    return per_spec(spec, ("local_shapes", tp, layers, first, last),
                    lambda: _count_local_shapes(spec, tp, layers, first, last))


def _count_local_shapes(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) \
        -> list[tuple[tuple[int, ...], int]]:
    out = []
    per_layer = spec.num_layers
    for shape, count in spec.param_shapes():
        if count >= per_layer and count % per_layer == 0:
            count = count // per_layer * layers
            if len(shape) >= 2 and tp > 1:
                shape = (max(1, shape[0] // tp),) + shape[1:]
        elif shape[0] == spec.vocab_size:
            shape = (max(1, shape[0] // tp),) + shape[1:]
        out.append((shape, count))
    return out



# ---- activations -------------------------------------------------------------------------

def _profiles(ctx: Ctx, eager: bool, fused_ce: bool = False,
              replay: bool = False) -> tuple[BlockProfile, BlockProfile, BlockProfile]:
    head = liger_head_block if fused_ce else head_block
    return (_layer_profile(ctx, eager, replay), block_profile(embedding_block, ctx, replay=replay),
            block_profile(head, ctx, replay=replay))


def _layer_profile(ctx: Ctx, eager: bool, replay: bool = False) -> BlockProfile:
    return block_profile(decoder_layer, ctx, eager, replay=replay)


def layer_ctxs(ctx: Ctx, layers: int, first_input_grad: bool = True) -> list[Ctx]:
    """Each layer's context: models that mix sliding-window and full-attention layers (Gemma 3's
    layer_types) or dense and MoE layers (first_k_dense_replace) run several kinds of layer;
    counted from the stage's first layer. first_input_grad=False: layer 0 reads an embedding
    output that requires no grad (embeddings_need_grad), which makes it a kind of its own."""
    spec = ctx.spec
    if spec.layer_types is None and not spec.dense_layers and first_input_grad:
        return [ctx] * layers
    kinds, pattern = per_spec(spec, ("kinds of layer", layers, first_input_grad),
                              lambda: _kinds_of_layer(spec, layers, first_input_grad))
    # each kind made once (a dataclass replace per layer cost more than the layer's rows)
    return _of_kinds([ctx.with_kind(*kind) for kind in kinds], pattern)


class _Layers(list):
    """Per-layer values of a few kinds of layer (layer_ctxs, per_layer): the list of each layer's value, and
    `kinds`, the values of the kinds first seen first, and `pattern`, each layer's kind (one list per model), so
    that what follows the kinds (per_layer, _identical_layers, _repeats) asks them, not every layer."""

    __slots__ = ("kinds", "pattern")


def _of_kinds(kinds: list[T], pattern: list[int]) -> _Layers:
    out = _Layers(map(kinds.__getitem__, pattern))
    out.kinds, out.pattern = kinds, pattern
    return out


def _kinds_of_layer(spec: ModelSpec, layers: int, first_input_grad: bool) -> tuple[list[tuple], list[int]]:
    """The kinds of layer of the stage (sliding window, dense MLP, input requires grad), first seen first, and
    the kind of each layer: one list of the model's, asked once (126 layers' questions cost more than a new
    shape's profiles)."""
    kinds: dict[tuple[bool, bool, bool], int] = {}
    pattern = [kinds.setdefault((spec.is_sliding(i), i < spec.dense_layers, i > 0 or first_input_grad), len(kinds))
               for i in range(layers)]
    return list(kinds), pattern


def embeddings_need_grad(ctx: Ctx, ckpt: Checkpointing) -> bool:
    """Whether the embedding output requires grad: yes unless the embedding is frozen (LoRA). With a
    frozen base, transformers' activation_checkpointing_enable (and peft when the model already
    checkpoints) hooks the input embeddings to require grad (enable_input_require_grads), so the
    checkpointed layers' recompute can reach the adapters; without that hook layer 0's input norm and
    frozen projections record no autograd node and save nothing."""
    return not ctx.frozen_base or ckpt == Checkpointing.full


def per_layer(ctxs: list[Ctx], fn: Callable[[Ctx], T]) -> list[T]:
    """fn of each layer's context, called once per kind of layer: layer_ctxs gives the layers of one
    kind the same Ctx object, and hashing a Ctx (its ModelSpec) for every one of 80 layers costs more
    than building a new shape's profiles."""
    if isinstance(ctxs, _Layers):  # several kinds, as layer_ctxs made them
        return _of_kinds([fn(c) for c in ctxs.kinds], ctxs.pattern)
    if _one_object(ctxs):  # one kind of layer, the common case
        return [fn(ctxs[0])] * len(ctxs)
    out = {k: fn(c) for k, c in _distinct(ctxs).items()}
    return list(map(out.__getitem__, map(id, ctxs)))


def _one_object(items: list) -> bool:
    """Every item is the first object. list.count compares identity first, but another object it compares by
    value (a Ctx's 22 fields, its ModelSpec among them: 0.2 ms for a 126-layer model whose layer 0 is a kind of
    its own), so a list whose last item is another object is told apart without it."""
    first = items[0]
    return items[-1] is first and items.count(first) == len(items)


def _distinct(items: list[T]) -> dict[int, T]:
    """The distinct objects of `items` by identity, first seen first."""
    return dict(zip(map(id, items), items, strict=True))


def _attention_saved(ctx: Ctx, eager: bool, replay: bool = False) -> int:
    """Bytes the attention sub-block saves (what selective checkpointing drops), from a graph of
    the layer without its MLP half."""
    return (block_profile(_norm_and_attention, ctx, eager, replay=replay).saved
            - block_profile(_norm_and_attention, ctx, None, replay=replay).saved)


def forward_activations_floor(sc: Scenario) -> int:
    """A lower bound of what a training estimate's peak holds beyond the first stage's weights and optimizer
    states (calc.recommend.search.states_floor): the activations alive at the end of the first pipeline stage's
    forward, the row of its last layer in _train_timeline (every in-flight micro-batch's saved tensors of the
    embedding and of each layer, and the rotary tables). 0 where no bound is taken (inference, FSDP2). A layer
    checkpointed at every layer keeps only its input, so no layer profile is built for it. The recommender
    skips the estimate of a configuration whose floor exceeds the usable memory; tests/calc/recommend/test_recommend_shortcuts.py
    checks the bound against the engine."""
    t = sc.training
    if sc.mode != Mode.train or t.sharding == "fsdp2":
        return 0
    ctx = _ctx(sc, "cuda")
    eager, ckpt = t.attention == Attention.eager, t.activation_checkpointing
    layers = parallel.layers_on_stage(sc.spec.num_layers, t.pipeline_parallel)
    h_bytes = residual_stream_bytes(ctx)
    every = t.checkpoint_every if ckpt == Checkpointing.full else 0
    if every == 1:
        saved = layers * h_bytes
    else:
        ctxs = layer_ctxs(ctx, layers, first_input_grad=embeddings_need_grad(ctx, ckpt))
        lay = per_layer(ctxs, lambda c: _layer_profile(c, eager))
        drop = per_layer(ctxs, lambda c: _attention_saved(c, eager)) if ckpt == Checkpointing.selective \
            else [0] * layers

        # the sum composed from the first layers and one period of their repeat, as the timeline's
        lead, period = _layers_repeat(lay, drop, every, _identical_layers(lay, drop))
        saved = _prefix_sums(lambda i: layer_saved_bytes(lay[i], drop[i], bool(every) and i % every == 0, h_bytes),
                             layers, period, 0, lead)[layers]
    in_flight = parallel.microbatches_in_flight(t.pipeline_parallel, t.gradient_accumulation_steps)
    return in_flight * (saved + block_profile(embedding_block, ctx).saved) + model_level_bytes(ctx, eager)[0]


def residual_stream_bytes(ctx: Ctx) -> int:
    """One layer's input (the residual stream): B x S x hidden in the residual dtype, S / tp under sequence
    parallelism."""
    return ctx.residual_elem_bytes * (ctx.tokens // ctx.tp if ctx.sp else ctx.tokens) * ctx.spec.hidden_size


def layer_saved_bytes(p: BlockProfile, drop: int, checkpointed: bool, h_bytes: int) -> int:
    """What a layer keeps for backward after its forward: only its input when its checkpoint wraps it, else
    its saved tensors less what selective checkpointing drops (`drop`, the attention core's), plus the
    attention input selective checkpointing stores instead."""
    if checkpointed:
        return h_bytes
    return p.saved - drop + (h_bytes if drop else 0)


def _norm_and_attention(ctx: Ctx, eager: bool | None) -> Graph:
    """A layer's input norm and (unless eager is None) its attention module."""
    g = Graph(input_bytes=ctx.residual_elem_bytes * ctx.tokens * ctx.spec.hidden_size, input_requires_grad=ctx.input_grad)
    norm = layer_norm if ctx.spec.uses_layernorm else rms_norm
    y, _ = norm(g, 0, ctx.residual_elem_bytes, ctx)
    if eager is not None:
        attention_block(g, y, ctx, eager)
    return g


def adapter_bytes(p: Precision) -> int:
    """LoRA adapter dtype: peft upcasts adapters to fp32 (autocast_adapter_dtype) unless the run
    keeps everything in 16 bits (pure bf16, or *-mixed whose master copies are fp32)."""
    return 2 if p == Precision.bf16 or p.is_mixed else 4


def _ctx(sc: Scenario, target: Target, fsdp: bool = False) -> Ctx:
    t = sc.training
    p = t.precision
    if fsdp and p.is_mixed:  # MixedPrecisionPolicy: forward/backward on gathered 16-bit weights
        p = Precision.bf16
    lora = t.lora
    common = dict(spec=sc.spec, batch=t.micro_batch_size, seq=t.seq_len, cuda=target == "cuda",
                  tp=t.tensor_parallel, sp=t.sequence_parallel, ep=t.expert_parallel,
                  cast_expert_inputs=fsdp and t.precision.is_mixed and t.expert_parallel > 1,
                  use_cache=t.activation_checkpointing != Checkpointing.full or sc.mode == Mode.inference,
                  train=sc.mode == Mode.train)
    if lora is None:
        return Ctx(weight_elem_bytes=precision.weight_bytes_per_param(p), act_elem_bytes=precision.activation_bytes(p),
                   residual_elem_bytes=precision.residual_bytes(p), amp=p.is_amp, **common)
    # LoRA: the frozen base runs in bf16 whatever the precision (quantized bases dequantize to it)
    targets = sc.spec.lora_target_names(lora.targets)
    return Ctx(weight_elem_bytes=2, act_elem_bytes=2, residual_elem_bytes=2, amp=False, lora_rank=lora.rank, lora_targets=targets, frozen_base=True,
               adapter_bytes=adapter_bytes(p), adapter_amp=p.is_amp and adapter_bytes(p) == 4, **common)


def _amp_cached_weight_bytes(spec: ModelSpec, ctx: Ctx) -> int:
    """16-bit copies of one layer's matmul weights and biases (everything but the norms). transformers' grouped_mm
    experts are no autocast op and read the routed experts' weights as they are: no copies of those (Llama 4's
    bmm experts are cast)."""
    routed = 0 if spec.family == "llama4_text" else spec.routed_expert_params_per_layer()
    return 2 * (_count(spec, "layer_matmul_params") - routed) // ctx.tp


def autocast_weight_copies_bytes(sc: Scenario) -> int:
    """Under AMP, the 16-bit copies autocast makes of every decoder layer's matmul weights on one
    GPU (autograd saves them for backward, so they sit among the activations); 0 otherwise."""
    ctx = _ctx(sc, "cuda")
    layers = parallel.layers_on_stage(sc.spec.num_layers, sc.training.pipeline_parallel)
    return _amp_cached_weight_bytes(sc.spec, ctx) * layers if ctx.amp else 0


def model_level_bytes(ctx: Ctx, eager: bool) -> tuple[int, int]:
    """(saved, forward-only) model-level tensors: RoPE cos/sin (1 x S x rotary_dim each, from the
    (1, S) position ids, residual dtype, saved by every layer's RoPE) and the eager float causal mask (B x 1 x S x S in the model
    dtype, freed when the decoder stack returns; transformers masking_utils.eager_mask)."""
    s = ctx.spec
    rope = 0
    if s.rope_complex:  # DeepSeek-V2: one complex64 freqs_cis (1, S, rotary_dim / 2)
        rope = 4 * ctx.seq * s.rotary_dim
    elif s.family != "gpt2":
        rope = 2 * ctx.seq * s.rotary_dim * ctx.residual_elem_bytes
    mask = ctx.batch * ctx.seq * ctx.seq * (4 if ctx.residual_elem_bytes == 4 else ctx.act_elem_bytes) if eager else 0
    two_kinds = s.layer_types is not None and len(set(s.layer_types)) > 1
    if eager and (s.family in GEMMA_FAMILIES or two_kinds):  # a full-causal and a sliding-window mask
        mask *= 2
    if two_kinds and not s.rope_complex:  # Gemma 3: a local and a global RoPE (Llama 4: one freqs_cis)
        rope *= 2
    elif not eager and sdpa_needs_mask(ctx):
        # SDPA's boolean sliding-window mask: built (1, 1, S, S) and expanded over the batch (a view)
        mask = ctx.seq * ctx.seq
    return rope, mask


def checkpoint_kept_bytes(ctx: Ctx, mask: int, ckpt: Checkpointing) -> int:
    """What non-reentrant checkpointing keeps alive until the first checkpointed layer (layer 0) is
    recomputed in backward: the arguments of every checkpointed call, among them the attention
    mask(s) and the (1, S) int64 position_ids (torch.utils.checkpoint keeps the call's args for the
    recompute; transformers passes them as keyword arguments). Without checkpointing they are freed
    when the decoder stack returns."""
    return mask + 8 * ctx.seq if ckpt in (Checkpointing.full, Checkpointing.selective) else 0


@dataclass(frozen=True)
class HeldOutputs:
    """The model output a loop keeps (`outputs = model(**batch)`): logits and the DynamicCache.

    `outputs` is rebound only after the next forward returns, so in the steady state the previous
    step's output is alive through the whole next forward; the current one from the loss on
    through backward and the optimizer step. During backward the simulator already counts the
    cache tensors that autograd saved, so only the cache of layers whose backward has run
    (their saved tensors released, the cache still holding them) and the unsaved copies are added."""

    logits: int = 0
    cache_unsaved: int = 0  # all layers: cache copies no autograd node saved
    cache_saved: tuple[int, ...] = ()  # per layer: cache copies autograd saved (counted until released)

    def __post_init__(self) -> None:
        # tails[i] = sum(cache_saved[i:]): backward() is asked once per layer, so O(L) in all, not O(L^2)
        object.__setattr__(self, "_tails", tuple(accumulate(reversed(self.cache_saved), initial=0))[::-1])

    @property
    def previous(self) -> int:
        """The whole output object (previous step's, or this one's after backward)."""
        return self.logits + self.cache_unsaved + self._tails[0]

    def backward(self, unreleased: int) -> int:
        """Held bytes the simulator does not count while the lowest `unreleased` layers still hold
        their saved tensors (the layers above them have run their backward)."""
        tails = self._tails
        return self.logits + self.cache_unsaved + tails[unreleased if unreleased < len(tails) else -1]


_NOTHING_HELD = HeldOutputs()  # frozen: one for every estimate whose loop keeps no output


def held_outputs(ctx: Ctx, lay: list[BlockProfile], keep: bool, selective: bool,
                 fused_ce: bool = False) -> HeldOutputs:
    """`outputs.logits` is the lm_head output (B x S x V/tp in the compute dtype, soft-capped where
    the family caps; the fp32 upcast for the loss is a separate tensor) and `outputs.past_key_values`
    the DynamicCache transformers builds in training whenever checkpointing is not full
    (transformers/modeling_outputs.py CausalLMOutputWithPast). Liger's fused
    loss returns no logits in training."""
    if not keep:
        return _NOTHING_HELD
    logits = 0 if fused_ce else ctx.act_elem_bytes * ctx.tokens * (ctx.spec.vocab_size // ctx.tp)
    if selective:  # the reference's checkpointed attention runs without a cache (measure/workload.py)
        return HeldOutputs(logits)
    return HeldOutputs(logits, sum(p.cached_unsaved for p in lay),
                       tuple(p.cached_total - p.cached_unsaved for p in lay))


# ---- timeline ----------------------------------------------------------------------------

Row = tuple  # (event, phase, parameters, gradients, optimizer_states, activations, other)


class _Timeline:
    """The step's moments in order: single rows, and runs of per-layer rows.

    A run asks one function for layer i's rows (`rows(i)`, a tuple of `width` rows), for the layers in
    `order`. The run's layers fall into pieces (ranges of layer indices, see _pieces): within a piece every
    column of a row is affine in the piece's own index, or the larger of such a term and a constant (the
    clamp at 0, the gradients' floor), so a row's total is convex along the piece: it is largest at one of
    the piece's two ends, and where it is largest first also at an end. `peak()` therefore asks rows(i)
    only at the ends of the pieces (a closed form per phase, from the same row definitions); `build()`
    asks it for every layer (the chart, and the reference that the tests compare peak() with)."""

    def __init__(self) -> None:
        self.parts: list[tuple] = []  # (row,) or (order, rows, width, ends of the pieces)

    def add(self, event: str, phase: str, params: int, grads: int, opt: int, acts: int, other: int) -> None:
        self.parts.append(((event, phase, params, grads, opt, acts, other if other > 0 else 0),))

    def run(self, order: range, rows: Callable[[int], tuple[Row, ...]], width: int, pieces: list[range]) -> None:
        """Layer rows for each i in `order`; `pieces` cover the layers of `order`."""
        self.parts.append((order, rows, width, _piece_ends(tuple(pieces))))

    def peak(self) -> tuple[int, Row]:
        """(index, row) of the first largest total, asking each run only at its pieces' ends."""
        best, best_at, best_row = -1, 0, None
        at = 0
        for part in self.parts:
            if len(part) == 1:
                row = part[0]
                total = row[2] + row[3] + row[4] + row[5] + row[6]
                if total > best:
                    best, best_at, best_row = total, at, row
                at += 1
                continue
            order, rows, width, ends = part
            for i in ends:
                base = at + (i - order.start) // order.step * width  # order.index(i)
                for j, row in enumerate(rows(i)):
                    total = row[2] + row[3] + row[4] + row[5] + row[6]
                    if total > best or (total == best and base + j < best_at):
                        best, best_at, best_row = total, base + j, row
            at += len(order) * width
        assert best_row is not None
        return best_at, best_row

    def all_rows(self) -> list[Row]:
        out: list[Row] = []
        for part in self.parts:
            if len(part) == 1:
                out.append(part[0])
            else:
                rows = part[1]
                for i in part[0]:
                    listed = None
                    for row in rows(i):
                        # a layer without one of the run's moments repeats a row object to keep the run's width
                        # (a dense layer under expert parallelism): the chart lists that moment once
                        if row is not listed:
                            out.append(row)
                        listed = row
        return out

    def build(self) -> Timeline:
        """Every row, and the peak as the first largest total over all of them."""
        rows = self.all_rows()
        totals = [r[2] + r[3] + r[4] + r[5] + r[6] for r in rows]
        peak = max(range(len(totals)), key=totals.__getitem__)
        ev, ph, p, g, o, a, x = (list(c) for c in zip(*rows, strict=True))
        return Timeline.model_construct(events=ev, phases=ph, parameters=p, gradients=g, optimizer_states=o,
                                        activations=a, other=x, peak_index=peak)


@lru_cache(maxsize=1024)
def _piece_ends(pieces: tuple[range, ...]) -> tuple[int, ...]:
    """The layers at the ends of the pieces, each once (a run's moments are largest at one of them); a new
    shape's runs are cut into the same pieces as before."""
    return tuple(dict.fromkeys(i for p in pieces for i in (p[0], p[-1])))


def _identical_layers(lay: list[BlockProfile], sel_drop: list[int] | None = None) -> bool:
    """Every layer's profile is equal (the distinct objects compared by value: per_layer gives the layers of
    one kind one profile object), and so is what selective checkpointing drops from it."""
    first, n = lay[0], len(lay)
    if isinstance(lay, _Layers):  # several kinds (per_layer): equal if their profiles are
        alike = all(p == first for p in lay.kinds)
    else:
        alike = _one_object(lay) or all(p == first for p in _distinct(lay).values())
    return alike and (sel_drop is None or sel_drop.count(sel_drop[0]) == n)


def _pieces(lay: list[BlockProfile], every: int = 0, sel_drop: list[int] | None = None,
            alike: bool | None = None, repeat: tuple[int, int] = (0, 0)) -> list[range]:
    """The pieces of a run of layers (see _Timeline): layer 0 alone (rows treat it apart), then, when every
    layer is alike, the rest as one piece, or under checkpointing of every k-th layer one piece per residue
    of i mod k (the activations and gradients before layer i grow by one period's sum every k layers). Layers
    that are not all alike but repeat (`repeat`: (lead, period), see _repeats) the same way: each of the first
    `lead` layers alone, then one piece per residue of the period. Otherwise a new piece wherever the layer's
    profile, its checkpointing or its selective drop changes."""
    n = len(lay)
    if n == 1:
        return [range(1)]
    if _identical_layers(lay, sel_drop) if alike is None else alike:  # alike: the caller has asked already
        if every <= 1:
            return [range(1), range(1, n)]
        return [range(1)] + [p for r in range(every) if (p := range(r or every, n, every))]
    lead, period = repeat
    if period:
        first = max(lead, 1)
        return [range(i, i + 1) for i in range(first)] + [range(r, n, period) for r in range(first, first + period)
                                                          if r < n]

    def key(i: int) -> tuple:
        return id(lay[i]), bool(every) and i % every == 0, sel_drop[i] if sel_drop else 0

    starts = [0, 1] + [i for i in range(2, n) if key(i) != key(i - 1)] + [n]
    return [range(a, b) for a, b in zip(starts, starts[1:], strict=False)]


def _split(pieces: list[range], differs: Callable[[int, int], bool]) -> list[range]:
    """The pieces cut again between neighbours a, b of a piece where differs(a, b): a row's term steps there
    (DeepSpeed ZeRO-1/2's gradient partition appearing at the first bucket reduction)."""
    out = []
    for p in pieces:
        start = p[0]
        for a, b in zip(p, p[1:], strict=False):
            if differs(a, b):
                out.append(range(start, b, p.step))
                start = b
        out.append(range(start, p[-1] + p.step, p.step))
    return out


class _PrefixSums:
    """start + fn(0) + ... + fn(i - 1), for i = 0 .. layers. Values that repeat with a period after the first
    `lead` layers (`period` 1 and no lead: identical layers; k: every k-th checkpointed; a lead of 1: layer 0 a
    kind of its own; a period of 6: Gemma 3's five local layers and a global one) are asked for the lead and one
    period and the sums composed (listing 126 running sums per column cost more than the rest of a new shape's
    timeline); period 0: asked for every layer."""

    def __init__(self, fn: Callable[[int], int], layers: int, period: int, start: int = 0, lead: int = 0) -> None:
        self.period = period if period > 0 and lead + period < layers else 0
        self.lead = lead if self.period else 0
        self.sums = list(accumulate(map(fn, range(self.lead + self.period if self.period else layers)),
                                    initial=start))
        self.step = self.sums[-1] - self.sums[self.lead]  # the sum over one period

    def __getitem__(self, i: int) -> int:
        p = self.period
        if not p:
            return self.sums[i]
        j = i - self.lead
        return self.sums[i] if j < 0 else self.sums[self.lead + j % p] + j // p * self.step

    def value(self, i: int) -> int:
        """fn(i)."""
        return self[i + 1] - self[i]


class _Linear:
    """_PrefixSums of a value every layer shares (period 1): start + i * fn(0), without the list of sums."""

    __slots__ = ("start", "step")

    def __init__(self, start: int, step: int) -> None:
        self.start, self.step = start, step

    def __getitem__(self, i: int) -> int:
        return self.start + i * self.step

    def value(self, i: int) -> int:
        return self.step


def _prefix_sums(fn: Callable[[int], int], layers: int, period: int, start: int = 0,
                 lead: int = 0) -> _PrefixSums | _Linear:
    """start + fn(0) + ... + fn(i - 1) for i = 0 .. layers (see _PrefixSums)."""
    return _Linear(start, fn(0)) if period == 1 and not lead else _PrefixSums(fn, layers, period, start, lead)


def _layers_repeat(lay: list[BlockProfile], sel_drop: list[int], every: int, alike: bool) -> tuple[int, int]:
    """(lead, period): from layer `lead` on, a layer's values are those of the layer `period` further on. Alike
    layers repeat from layer 0 with their checkpointing (every k-th layer, else every layer); others as
    _repeats finds."""
    return (0, every if every > 1 else 1) if alike else _repeats(lay, sel_drop, every)


_MAX_PERIOD = 16  # the longest repeat of kinds of layer looked for (Gemma 3: 6, Llama 4: 4, gpt-oss: 2)


def _repeats(lay: list[BlockProfile], sel_drop: list[int], every: int) -> tuple[int, int]:
    """(lead, period) of a run of layers that are not all alike: from layer `lead` on, layer i has layer
    i + period's profile (the same object: per_layer gives a kind of layer one), selective drop and
    checkpointing (every k-th layer from layer 0); (0, 0) where no repeat shorter than the run is found. The
    shortest lead + period is taken, so that the fewest layers are listed."""
    if isinstance(lay, _Layers):  # the layers' kinds decide their profiles and drops: once per model
        key = (id(lay.pattern), every)
        hit = _PATTERN_REPEATS.get(key)
        if hit is None:
            if len(_PATTERN_REPEATS) >= 1024:
                _PATTERN_REPEATS.clear()
            hit = _PATTERN_REPEATS[key] = (lay.pattern, _find_repeats((lay.pattern,), every))  # keeps its id
        return hit[1]
    return _find_repeats((list(map(id, lay)), sel_drop), every)


_PATTERN_REPEATS: dict[tuple[int, int], tuple[list[int], tuple[int, int]]] = {}


def _find_repeats(lists: tuple[list, ...], every: int) -> tuple[int, int]:
    """_repeats of the layers whose items in `lists` (what tells them apart) are given."""
    n = len(lists[0])
    best = (0, 0)
    for p in range(1, min(_MAX_PERIOD, n - 1) + 1):
        if best[1] and p >= sum(best):  # lead + period >= p: no shorter one to come
            break
        h = _lead(lists, p)
        period = p if every <= 1 else lcm(p, every)
        if h + period < n and (not best[1] or h + period < sum(best)):
            best = (h, period)
    return best


def _lead(lists: tuple[list, ...], p: int) -> int:
    """The first index from which every item equals the one p further on, in each list (an index from which
    they do stays so further on: bisection over slice comparisons, which run in C)."""
    n = len(lists[0])
    lo, hi = 0, n - p
    while lo < hi:
        mid = (lo + hi) // 2
        if all(x[mid:n - p] == x[mid + p:] for x in lists):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _train_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool,
                    ws: int, replay: bool = False) -> _Timeline:
    t = sc.training
    eager = t.attention == Attention.eager
    fused_ce = t.cross_entropy == "liger-fused"
    layer, emb, head = _profiles(ctx, eager, fused_ce, replay)
    ckpt = t.activation_checkpointing
    ctxs = layer_ctxs(ctx, layers, first_input_grad=not first or embeddings_need_grad(ctx, ckpt))
    # layers of one kind share a profile; the stage's own context's is `layer`
    lay = per_layer(ctxs, lambda c: layer if c is ctx else _layer_profile(c, eager, replay))
    rope, mask = model_level_bytes(ctx, eager)
    inputs = 8 * ctx.tokens
    kept = checkpoint_kept_bytes(ctx, mask, ckpt)  # alive from forward to layer 0's recompute
    every = t.checkpoint_every if ckpt == Checkpointing.full else 0
    in_flight = parallel.microbatches_in_flight(t.pipeline_parallel, t.gradient_accumulation_steps)
    sel_drop = per_layer(ctxs, lambda c: _attention_saved(c, eager, replay)) if ckpt == Checkpointing.selective \
        else [0] * layers
    h_bytes = residual_stream_bytes(ctx)
    alike = _identical_layers(lay, sel_drop)
    lead, period = _layers_repeat(lay, sel_drop, every, alike)  # per-layer values repeat after the first `lead`
    pieces = _pieces(lay, every, sel_drop, alike, (lead, period))
    if alike:  # equal profiles (e.g. sliding and full attention on a sequence inside the window): one object
        lay = [lay[0]] * layers
    kinds = [lay[0]] if alike else lay.kinds if isinstance(lay, _Layers) else list(_distinct(lay).values())
    out = held_outputs(ctx, lay, t.keep_outputs and last, ckpt == Checkpointing.selective, fused_ce)

    def saved(i: int) -> int:
        return layer_saved_bytes(lay[i], sel_drop[i], bool(every) and i % every == 0, h_bytes)

    saved_by_layer = _prefix_sums(saved, layers, period, 0, lead)
    tl = _Timeline()
    w = st.weights + st.gathered_root  # FSDP2's root stays gathered through forward and backward
    gl, keep_gathered = st.gathered_layer, not st.reshard_after_forward
    fsdp = fsdp2_layer_terms(st, ctxs) if gl else None  # per layer: a MoE model's dense layers are smaller groups
    root_ag = st.gathered_root if gl else 0  # the root group's all-gather output (padded like its parameters)
    opt = st.optimizer
    part = partition_bytes(st)
    # DeepSpeed ZeRO-1/2: between micro-steps the accumulated gradients are views of the last partition
    ga_grads = part if t.gradient_accumulation_steps > 1 or st.persistent_grads else 0
    other0 = inputs + ws + st.zero_buffers + st.zero3_gathered
    # a layer's share of the (sharded) gradients: under expert parallelism its profile holds the E / ep local
    # experts' gradients, which FSDP2 shards over n / ep ranks, not n: count them ep times against the total
    ep_extra = [fsdp2_local_expert_grad_bytes(c) * (c.ep - 1) for c in ctxs] if st.gathered_experts else None

    def sharded_share(i: int) -> int:
        return lay[i].param_grad_bytes + (ep_extra[i] if ep_extra else 0)

    layer_pgrads = _prefix_sums(sharded_share, layers, period, 0, lead)[layers]
    scale_g = st.grads / max(1, (layer_pgrads + head.param_grad_bytes + emb.param_grad_bytes)) if st.grads else 0.0

    # forward
    acts = (in_flight - 1) * (saved_by_layer[layers] + (emb.saved if first else 0))
    acts += rope
    if first:
        # FSDP2: the root's all-gather output is kept (all_gather_state) until layer 0's copy-out
        tl.add("embedding", "forward", w + root_ag, ga_grads, opt, acts + emb.saved,
               other0 + out.previous + max(mask, kept) + emb.fwd_peak - emb.saved)
        acts += emb.saved
    cur_before = _prefix_sums(saved, layers, period, acts, lead)  # activations alive before layer i
    # autocast's weight cache keeps each 16-bit weight copy until autocast exits; inside a
    # checkpointed layer nothing else holds them, so they pile up until the loss is computed
    cache_per_layer = _amp_cached_weight_bytes(sc.spec, ctx) if ctx.amp else 0
    sel_cache = 2 * _count(sc.spec, "attention_params") // ctx.tp if ctx.amp and sel_drop[0] else 0

    def amp_cache_of(i: int) -> int:  # + KV-cache copies nobody saved
        return cache_per_layer if every and i % every == 0 else sel_cache + lay[i].cached_unsaved

    amp_sums = _prefix_sums(amp_cache_of, layers, period, 0, lead)  # [i]: before layer i
    fwd_other = other0 + out.previous + max(mask, kept)
    names = _layer_names(layers)

    def forward_rows(i: int) -> tuple[Row]:
        s_i = saved_by_layer.value(i)
        ckpt_i = every and i % every == 0
        peak = lay[i].fwd_peak_nosave if ckpt_i else lay[i].fwd_peak
        # the running layer's own unsaved KV-cache copies are already in its forward peak
        o = fwd_other + amp_sums[i + 1] - (0 if ckpt_i else lay[i].cached_unsaved) + peak - s_i
        if fsdp is None:
            return ((names[0][i], "forward", w, ga_grads, opt, cur_before[i] + s_i, o if o > 0 else 0),)
        gls, upto = fsdp.gathered, fsdp.gathered_upto
        layer_row = (names[0][i], "forward", w + (upto[i + 1] if keep_gathered else gls[i]) + fsdp.experts[i]
                     + fsdp.all_gather[i], ga_grads, opt, cur_before[i] + s_i, o if o > 0 else 0)
        # FSDP2 pre-forward: the all-gather output and the unsharded parameters it is copied into, and the previous
        # group's all-gather output, which wait_for_unshard frees only when it returns (`prev_all_gather_state`
        # is a local of it): the previous layer's last group, or for layer 0 the root's
        before = w + (upto[i] if keep_gathered else 0)
        prev_ag = fsdp.all_gather[i - 1] if i else root_ag
        return ((ALL_GATHER_LAYER.format(layer=i), "forward", before + 2 * gls[i] + prev_ag, ga_grads, opt,
                 cur_before[i], fwd_other + amp_sums[i + 1]), layer_row)

    if fsdp is not None:  # a row reads its neighbours' group sizes (prefetch, kept buffers): cut where they change
        kind = [c.dense_mlp for c in ctxs]

        def neighbours_differ(a: int, b: int) -> bool:
            return ((a > 0 and kind[a - 1]) != (b > 0 and kind[b - 1])
                    or (a + 1 < layers and kind[a + 1]) != (b + 1 < layers and kind[b + 1]))

        pieces = _split(pieces, neighbours_differ)
    tl.run(range(layers), forward_rows, 2 if gl else 1, pieces)
    cur, amp_cache = cur_before[layers], amp_sums[layers]
    if last:
        w_all = w + (fsdp.gathered_upto[layers] if fsdp and keep_gathered else 0)  # ZeRO-2: every layer gathered
        tl.add("lm_head + loss", "loss", w_all + (fsdp.all_gather[-1] if fsdp else 0), ga_grads, opt, cur + head.saved,
               other0 + out.previous + kept + amp_cache + head.fwd_peak - head.saved)
        # FSDP2: the root group's gradients (lm_head, final norm) stay unsharded until the root's post-backward,
        # at the end of backward (the root's parameters are one FSDPParamGroup, reduced last)
        g_head = head.param_grad_bytes if gl else round(head.param_grad_bytes * scale_g)
        # FSDP2 (reshard): the root's pre-backward already prefetches the last layer's weights
        tl.add("loss backward", "backward", w_all if keep_gathered else w + (fsdp.gathered[-1] if fsdp else 0),
               ga_grads + round(head.bwd_peak_pgrad * scale_g), opt,
               cur + head.bwd_peak_saved,
               other0 + out.backward(layers) + kept + head.bwd_peak - head.bwd_peak_saved - head.bwd_peak_pgrad)
        grads = g_head
        if st.reduce_buckets:
            # DeepSpeed ZeRO-1/2 allocates its buckets in the first gradient hook, after the lm_head's backward:
            # its gradient and the hidden state's gradient are alive, and what the final norm saved (its backward
            # runs after the hook; a tied lm_head has none, its first hook is the norm's) (stage_1_and_2.py
            # setup_buckets)
            other0 += st.reduce_buckets
            tied_head = sc.spec.tie_word_embeddings and first
            norm = 0 if fused_ce or tied_head else block_profile(final_norm_block, ctx, replay=replay).saved
            tl.add("first gradient hook (buckets allocated)", "backward", w, ga_grads + head.param_grad_bytes, opt,
                   cur + norm, other0 + out.backward(layers) + kept + h_bytes)
    else:
        grads = 0
        other0 += st.reduce_buckets  # DeepSpeed ZeRO-1/2: allocated at the first gradient hook
        tl.add("receive output grad", "backward", w, ga_grads, opt, cur, other0 + kept + h_bytes)
    # backward

    def backward_moments(layer: BlockProfile) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(plain, recomputed) backward peak of one layer: (param grads, saved alive, other)."""
        plain = (round(layer.bwd_peak_pgrad * scale_g), layer.bwd_peak_saved,
                 other0 + layer.bwd_peak - layer.bwd_peak_saved - layer.bwd_peak_pgrad)
        recompute = layer.recompute_peak + h_bytes  # the recompute stops at the layer's last saved tensor
        bwd = layer.bwd_peak + (0 if layer.input_saved else h_bytes)
        if recompute >= bwd:
            again = (0, layer.saved, other0 + recompute - layer.saved)
        else:
            again = (round(layer.bwd_peak_pgrad * scale_g), layer.bwd_peak_saved,
                     other0 + bwd - layer.bwd_peak_saved - layer.bwd_peak_pgrad)
        if gl:  # FSDP2: the layer's own unsharded grads are alive until its reduce-scatter
            plain = (layer.bwd_peak_pgrad,) + plain[1:]
            again = (layer.bwd_peak_pgrad if again[0] else 0,) + again[1:]
        return plain, again

    moments = {id(p): backward_moments(p) for p in kinds}
    early_experts = [fsdp2_experts_unshard_in_recompute(c) for c in ctxs] if st.gathered_experts and every else None
    tied = sc.spec.tie_word_embeddings and first and last
    reduced = _first_reduction(st, head if last else None, lay, emb if first else None, scale_g, tied)
    # a tied lm_head's gradient is summed with the embedding's inside autograd: it is alive from the head's
    # backward on, but reaches the gradient hook (and the bucket) only with the embedding's
    tied_partial = head.param_grad_bytes if tied else 0

    def grads_of(i: int) -> int:
        return round(sharded_share(i) * scale_g) if st.grads else 0

    # grads_below[i]: gradients of the layers below i; those alive once the top k layers have run their backward
    # are grads + grads_below[layers] - grads_below[layers - k]
    grads_below = _prefix_sums(grads_of, layers, period, 0, lead)
    grads_of_all, grads_top = grads_below[layers], grads

    def backward_rows(i: int) -> tuple[Row, ...]:
        cur = cur_before[i]  # layer i's saved tensors are released by its own backward
        grads = grads_top + grads_of_all - grads_below[i + 1]
        ckpt_i = every and i % every == 0
        plain, again = moments[id(lay[i])]
        pg, alive, o = again if ckpt_i else plain
        g_now = grads + pg
        if reduced is not None:  # DeepSpeed ZeRO-1/2: the layer's own full grads + the partition once reduced
            g_now = ga_grads + (part if reduced(i) else 0) + (round(pg / scale_g) if scale_g else 0) + tied_partial
        o += kept + out.backward(i + 1)
        if fsdp is None:
            return ((names[2][i] if ckpt_i else names[1][i], "backward", w, g_now if g_now > ga_grads else ga_grads,
                     opt, cur + alive, o if o > 0 else 0),)
        gls, upto = fsdp.gathered, fsdp.gathered_upto
        rs_kept = fsdp.reduce_scatter[i + 1] if i < layers - 1 else 0  # the layer above's, until this one reduces
        # FSDP2: this layer gathered, and the next one prefetched (ZeRO-2 analogue: all below too)
        gathered = upto[i + 1] if keep_gathered else gls[i] + (gls[i - 1] if i else 0)
        o += rs_kept
        if ckpt_i and early_experts and early_experts[i] and not pg:
            # the recompute reaches the experts before their pre-backward: they unshard in forward state, keeping
            # the all-gather output, and the next layer is not prefetched yet
            gathered -= gls[i - 1] if i and not keep_gathered else 0
            o += fsdp.all_gather[i]
        row = (names[2][i] if ckpt_i else names[1][i], "backward", w + gathered + fsdp.experts[i],
               g_now if g_now > ga_grads else ga_grads, opt, cur + alive, o if o > 0 else 0)
        # FSDP2 post-backward: weights resharded, unsharded grads copied into the reduce buffer
        left = upto[i] if keep_gathered else (gls[i - 1] if i else 0)
        # expert parallelism: the experts group's reduce, mid-layer (a dense layer repeats its row: one width)
        rows = (row, experts_reduce_row(i, ckpt_i, gathered) or row) if st.gathered_experts else (row,)
        reduce = (REDUCE_SCATTER_LAYER.format(layer=i), "backward", w + left, grads + lay[i].param_grad_bytes, opt,
                  cur, other0 + kept * (i > 0) + out.backward(i) + h_bytes + fsdp.reduce_scatter_peak[i])
        if keep_gathered:
            return *rows, reduce
        # FSDP2 pre-backward (reshard after forward): the layer's prefetched all-gather output is copied out into
        # its unsharded parameters, both alive until the copy-out returns (in backward the output is freed at once)
        copy_out = (ALL_GATHER_LAYER.format(layer=i), "backward", w + 2 * gls[i], grads, opt, cur_before[i + 1],
                    other0 + kept + out.backward(i + 1) + h_bytes + rs_kept)
        return copy_out, *rows, reduce

    def experts_reduce_row(i: int, ckpt_i: bool, gathered: int) -> Row | None:
        """Expert parallelism: the experts group's post-backward runs when the MoE block's backward ends, mid-layer
        (FSDP2 registers it on the experts module's inputs): the rest of the layer is still gathered and its saved
        tensors (the attention's) alive, the experts' own gradients already copied into the reduce buffers (the
        foreach_reduce of torch 2.13, measured on the CPU over the fake process group)."""
        p = lay[i]
        if not fsdp.reduce_scatter_experts[i] or not fsdp2_local_expert_grad_bytes(ctxs[i]):
            return None  # a dense layer, or experts without gradients (a frozen base): no experts reduce
        h = h_bytes if ckpt_i and not p.input_saved else 0  # the checkpoint's stored input (see backward_moments)
        grads = grads_top + grads_of_all - grads_below[i + 1]
        return (EXPERTS_REDUCE_LAYER.format(layer=i), "backward", w + gathered, grads, opt,
                cur_before[i] + p.experts_done_saved,
                other0 + kept + out.backward(i + 1) + h + p.experts_done_grads + fsdp.reduce_scatter_experts[i])

    bwd_pieces = pieces if reduced is None else _split(pieces, lambda a, b: reduced(a) != reduced(b))
    if gl:  # the top layer's backward runs before any layer's reduce-scatter
        bwd_pieces = _split(bwd_pieces, lambda a, b: (a == layers - 1) != (b == layers - 1))
    width = ((2 if keep_gathered else 3) + (1 if st.gathered_experts else 0)) if gl else 1
    tl.run(range(layers - 1, -1, -1), backward_rows, width, bwd_pieces)
    cur, grads = cur_before[0], grads_top + grads_of_all
    if first:
        cur -= emb.saved
        g_e = round(emb.param_grad_bytes * scale_g)
        g_emb = max(ga_grads, grads + g_e)
        if reduced is not None:
            g_emb = ga_grads + (part if reduced(-1) else 0) + emb.param_grad_bytes + tied_partial
        tl.add("embedding backward", "backward", w, g_emb, opt, cur,
               other0 + out.previous + emb.bwd_peak - emb.bwd_peak_pgrad)
    if reduced is not None:
        # the backward epilogue reduces what is left in the bucket into the partition, then frees the buckets;
        # a gradient larger than the bucket waits as its own tensor until then, and one of the embedding's whose
        # hook made the partition appear is alive beside it at that moment
        rp = st.rank0_partition
        pending = max(rp.pending_at_end, rp.trigger if rp.block == len(lay) + 1 else 0) * st.grad_bytes if rp else 0
        tl.add("gradient reduction (epilogue)", "backward", st.weights, ga_grads + part + pending, opt, 0,
               other0 + out.previous)
    _optimizer_rows(tl, sc, st, inputs + out.previous + st.zero_buffers)
    return tl


def _first_reduction(st: States, head: BlockProfile | None, lay: list[BlockProfile], emb: BlockProfile | None,
                     scale_g: float, tied: bool = False) -> Callable[[int], bool] | None:
    """DeepSpeed ZeRO-1/2 (no offload): whether the first bucket reduction, which allocates the rank's whole
    gradient partition (stage_1_and_2.py copy_grads_in_partition: grads_in_partition), has happened by the
    backward of layer i (-1: the embedding). Gradients are produced from the lm_head down and DeepSpeed reduces
    the bucket when the next gradient would overflow reduce_bucket_size elements; the engine counts the partition
    from the block whose gradients pass that size (block granularity). None outside ZeRO-1/2. With the model's
    parameter order known (States.rank0_partition), the block whose hooks run the first reduction that holds
    one of rank 0's parameters."""
    if st.first_reduction_elements is None or not scale_g:
        return None
    n = len(lay)
    if st.rank0_partition is not None:
        # a block's hooks run as its gradients are produced, after the moment its row stands for (the embedding's
        # after its backward: measured, GPT-2 on 3 ranks), so the partition is there from the next block on
        block = st.rank0_partition.block  # 0: the top, n - i: layer i, n + 1: the embedding
        return lambda i: block < (n + 1 if i < 0 else n - i)
    # gradient bytes that reached the hooks by the end of each block (a tied lm_head's with the embedding's)
    produced = [head.param_grad_bytes if head and not tied else 0]
    for layer in reversed(lay):
        produced.append(produced[-1] + layer.param_grad_bytes)
    total = produced[-1] + (emb.param_grad_bytes if emb else 0) + (head.param_grad_bytes if head and tied else 0)
    limit = st.first_reduction_elements * total / max(1, st.trainable)  # in bytes of produced gradients
    return lambda i: (total if i < 0 else produced[n - i]) > limit


def _optimizer_rows(tl: _Timeline, sc: Scenario, st: States, other: int) -> None:
    """The optimizer step, and the moment before it where DeepSpeed flattens the gradients: ZeRO-1/2 copy
    the partition into one flat tensor and cast it to fp32 while the partition is still held
    (stage_1_and_2.py step: flatten, .to(fp32)); FP16_Optimizer (ZeRO-0, FusedAdam) casts each 16-bit grad
    to fp32 and flattens the copies (fp16/fused_optimizer.py step). Modelled from DeepSpeed's source; the
    ZeRO-1/2 one is measured on the CPU."""
    if st.rank0_partition is not None:
        # the gradient norm first (get_grad_norm_direct): each of the rank's gradients copied to fp64 in turn
        # (zero/utils.py get_norm_dtype), beside the partition; measured on the CPU
        tl.add("gradient norm (fp64 copy)", "optimizer", st.weights,
               partition_bytes(st) + 8 * st.rank0_partition.largest, st.optimizer, 0, other)
    if st.first_reduction_elements is not None:
        flat = st.grads + st.grad_fp32_step  # the flat copy of the rank's range, and its fp32 cast for a 16-bit model
        tl.add("gradient partition flattened", "optimizer", st.weights, partition_bytes(st) + flat, st.optimizer, 0,
               other)
    elif st.flattens_step_grads:
        tl.add("gradients cast to fp32 and flattened", "optimizer", st.weights, st.grads + 2 * st.grad_fp32_step,
               st.optimizer, 0, other)
    tl.add("optimizer step", "optimizer", st.weights, step_gradient_bytes(sc, st), st.optimizer, 0, other + st.opt_temp)


def partition_bytes(st: States) -> int:
    """DeepSpeed ZeRO-1/2 (no offload): the bytes of the rank's gradient partition (grads_in_partition),
    every parameter tensor starting in its range, whole, where the parameter order is known (rank 0),
    else its share."""
    if st.rank0_partition is None:
        return st.grads
    return st.rank0_partition.elements * st.grad_bytes


def step_gradient_bytes(sc: Scenario, st: States) -> int:
    """Gradient bytes alive during optimizer.step(). *-mixed under DeepSpeed (no offload): each
    16-bit gradient partition is cast to an fp32 `.grad` of its master partition and the 16-bit
    grads are freed before the step (precision.MIXED_STEP_GRADIENTS_WHY); otherwise `.grad` itself."""
    t = sc.training
    if st.flattens_step_grads:  # FP16_Optimizer: the 16-bit grads are freed once flattened into fp32
        return st.grad_fp32_step
    # DeepSpeed ZeRO-3 keeps its flat gradient-partition buffer through the step (persistent_grads)
    keeps_16bit = not (t.precision.is_mixed and t.offload_optimizer == Offload.none and not st.gathered_layer
                       and not st.persistent_grads) or st.keeps_16bit_step_grads
    return (st.grads if keeps_16bit else 0) + st.grad_fp32_step


@lru_cache(maxsize=64)
def _layer_names(layers: int) -> tuple[list[str], list[str], list[str]]:
    return ([FORWARD_LAYER.format(layer=i) for i in range(layers)], [BACKWARD_LAYER.format(layer=i) for i in range(layers)],
            [RECOMPUTED_LAYER.format(layer=i) for i in range(layers)])


def _inference_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, ws: int, replay: bool = False) -> _Timeline:
    """no_grad forward with use_cache=True: weights + the KV cache growing layer by layer + one
    layer's transients; at the end the logits (B x S x V in compute dtype) are returned."""
    from calc.sim.layers import stack_locals_bytes

    t = sc.training
    eager = t.attention == Attention.eager
    layer, emb, head = _profiles(ctx, eager, replay=replay)
    lay = per_layer(layer_ctxs(ctx, layers), lambda c: _layer_profile(c, eager, replay))
    rope, mask = model_level_bytes(ctx, eager)
    s = ctx.spec
    # the cache keeps k (RoPE dtype) and v promoted to it; the layer's own copies are in its peak
    kv_layer = ctx.tokens * (s.kv_width // ctx.tp) * 2 * ctx.rope_elem_bytes if ctx.use_cache else 0
    if s.mla and ctx.use_cache:  # the compressed latent and the rotary key
        kv_layer = ctx.tokens * (s.kv_lora_rank * ctx.act_elem_bytes + s.qk_rope_head_dim * max(ctx.act_elem_bytes, ctx.rope_elem_bytes))
    tl = _Timeline()
    base = 8 * ctx.tokens + rope + mask + ws
    tl.add("embedding", "inference", st.weights, 0, 0, 0, base + emb.fwd_peak_nosave)
    # autocast caches a 16-bit copy of every fp32 weight that requires grad, even under no_grad,
    # until the autocast region ends (aten/src/ATen/autocast_mode.cpp, cached_cast)
    cache = _amp_cached_weight_bytes(s, ctx) if ctx.amp else 0

    def layer_rows(i: int) -> tuple[Row]:
        o = base + i * cache + lay[i].fwd_peak_nosave + stack_locals_bytes(ctx, i)
        return ((INFERENCE_LAYER.format(layer=i), "inference", st.weights, 0, 0, i * kv_layer, o if o > 0 else 0),)

    tl.run(range(layers), layer_rows, 1, _pieces(lay))
    tl.add("final norm + lm_head", "inference", st.weights, 0, 0, layers * kv_layer,
           base - mask + layers * cache + _inference_head_peak(ctx, replay))
    return tl


def _inference_head_peak(ctx: Ctx, replay: bool = False) -> int:
    return block_profile(inference_head_block, ctx, replay=replay).fwd_peak_nosave


# ---- entry point -------------------------------------------------------------------------

_MEMO_SIZE = 1024
_memo: dict[tuple, tuple[ModelSpec, dict, dict, Estimate]] = {}
_SHAPE_FIELDS = ("micro_batch_size", "seq_len")
# a scenario's fields as a tuple of values, read straight from each model's fields (its JSON, which this key
# replaced, cost 5 us, most of a memo hit and a twentieth of a new shape): the batch shape apart, and the
# LoRA settings (a model that is not hashable) as their own tuple
_hardware_values = itemgetter(*HardwareConfig.model_fields)
_training_values = itemgetter(*(f for f in TrainingConfig.model_fields if f not in (*_SHAPE_FIELDS, "lora")))
_lora_values = itemgetter(*LoraConfig.model_fields)


def _shape_free_values(sc: Scenario) -> tuple:
    """Every field of `sc` but the batch shape, as hashable values (a config.json model by its JSON): two
    scenarios have equal keys exactly when they are equal but for the shape (each field has one type)."""
    t = sc.training
    model = sc.model if isinstance(sc.model, str) else sc.model_dump_json(include={"model"})
    return (model, _hardware_values(sc.hardware.__dict__), sc.mode, _training_values(t.__dict__),
            None if t.lora is None else _lora_values(t.lora.__dict__))


_states_memo: dict[tuple, tuple[tuple, States]] = {}  # the entry holds what the key's ids stand for
_ctx_memo: dict[tuple, tuple[tuple, Ctx]] = {}  # the same, for the blocks' context without its shape


def estimate(sc: Scenario, target: Target = "cuda", sharding: Sharder | None = None) -> Estimate:
    """Predict per-GPU memory for `sc`. target="cpu" predicts a CPU run of the same workload
    (dropout noise tensors instead of masks, no CUDA workspaces). `sharding` overrides the
    scenario's training.sharding: "fsdp2" models PyTorch FSDP2 (fully_shard per layer) instead of
    DeepSpeed ZeRO for zero_stage 2/3 with several GPUs.

    A repeated scenario (an equal one, not only the same object) returns the same Estimate object (a
    bounded memo keyed on the scenario's field values and the loaded presets' identity): treat it as read-only."""
    gpus, clusters, spec = gpu_presets(), cluster_presets(), sc.spec
    # the presets' identity is in the key, so reloading them (cache_clear) never serves a stale answer;
    # the entry holds them so their ids cannot be reused while it lives. A config.json model is in the key.
    # The batch shape is apart: the rest is the key of what does not depend on it (the model states).
    t = sc.training
    shape_free = (id(spec) if isinstance(sc.model, str) else 0, id(gpus), id(clusters),
                  _shape_free_values(sc), target, sharding)
    key = (shape_free, t.micro_batch_size, t.seq_len)
    hit = _memo.get(key)
    if hit is not None:
        return hit[3]
    est = _estimate(sc, target, sharding, states_key=shape_free, keep=(spec, gpus, clusters))
    if len(_memo) >= _MEMO_SIZE:
        del _memo[next(iter(_memo))]  # oldest first
    _memo[key] = (spec, gpus, clusters, est)
    return est


def clear_memo(profiles: bool = True, shape_free: bool = False) -> None:
    """Forget memoized estimates and, unless profiles=False, the block profiles cached per shape (benchmarks of
    new shapes; profiles=False: a new parallel layout of a shape seen before, as a search asks); shape_free=True
    also forgets what is kept per shape-free scenario: the blocks recorded per context (calc.sim.profiles) and the
    model states (a model and options never seen)."""
    _memo.clear()
    if shape_free:
        forget_recordings()
        _states_memo.clear()
        _ctx_memo.clear()
    if profiles:
        forget_shapes()


def reference_estimate(sc: Scenario, target: Target = "cuda", sharding: Sharder | None = None) -> Estimate:
    """estimate() the long way (no memo): every moment of the timeline listed and the peak taken as the
    largest of them, where estimate() asks each run of identical layers only at its ends. The tests
    check that both give the same bytes."""
    return _estimate(sc, target, sharding, reference=True)


def _shaped_ctx(key: tuple | None, keep: tuple, sc: Scenario, target: Target, fsdp: bool) -> Ctx:
    """_ctx(sc, target, fsdp), its shape-free fields memoized as the model states are (`key`, `keep`: see
    _states; fsdp follows from the key's scenario and sharding): a new shape copies them."""
    if key is None:
        return _ctx(sc, target, fsdp)
    ctx = _shape_free(_ctx_memo, key, keep, lambda: _ctx(sc, target, fsdp))
    shape = sc.training.micro_batch_size, sc.training.seq_len
    return ctx if (ctx.batch, ctx.seq) == shape else ctx.with_shape(*shape)


def _states(key: tuple | None, keep: tuple, first: bool, last: bool, make: Callable[[], States]) -> States:
    """make(), memoized on the scenario without its batch shape (`key` as estimate() makes it; None: not
    memoized) and the pipeline stage: model states do not depend on the micro-batch or the sequence. Shared:
    treat as read-only."""
    return make() if key is None else _shape_free(_states_memo, (key, first, last), keep, make)


def _shape_free(memo: dict[tuple, tuple[tuple, T]], key: tuple, keep: tuple, make: Callable[[], T]) -> T:
    """make(), memoized in `memo` on `key` (bounded, oldest first). The entry holds `keep`, what the key's ids
    stand for, so that they cannot be reused while it lives."""
    hit = memo.get(key)
    if hit is not None:
        return hit[1]
    value = make()
    if len(memo) >= _MEMO_SIZE:
        del memo[next(iter(memo))]  # oldest first
    memo[key] = (keep, value)
    return value


def _estimate(sc: Scenario, target: Target, sharding: Sharder | None, reference: bool = False,
              states_key: tuple | None = None, keep: tuple = ()) -> Estimate:
    sharding = sharding or sc.training.sharding
    t, spec = sc.training, sc.spec
    hw = sc.resolved_hardware()
    gpu = gpu_presets().get(hw.gpu) if hw.gpu else None
    pp = t.pipeline_parallel
    layers = parallel.layers_on_stage(spec.num_layers, pp)
    training = sc.mode == Mode.train
    ws = cublas_workspace_bytes(gpu.architecture if gpu else None, training) if target == "cuda" else 0
    fsdp = sharding == "fsdp2" and training and sc.data_parallel > 1 and t.zero_stage in (2, 3)
    ctx = _shaped_ctx(states_key, keep, sc, target, fsdp)
    stages = [(True, pp == 1)] if pp == 1 else [(True, False), (False, True)]
    best: tuple[int, Row, Callable[[], Timeline], States] | None = None
    for first, last in stages:
        st = _states(states_key, keep, first, last, lambda first=first, last=last: fsdp2_states(sc) if fsdp else
                     model_states(sc, layers, first, last, target, sharding == "deepspeed"))
        tl = (_train_timeline(sc, st, ctx, layers, first, last, ws, reference) if training
              else _inference_timeline(sc, _inference_states(st), ctx, layers, ws, reference))
        if reference:
            full = tl.build()
            i = full.peak_index
            row = (full.events[i], full.phases[i], full.parameters[i], full.gradients[i], full.optimizer_states[i],
                   full.activations[i], full.other[i])
            listing: Callable[[], Timeline] = lambda full=full: full  # noqa: E731 - already listed
        else:
            _, row = tl.peak()
            listing = partial(_listed_timeline, sc, st, ctx, layers, first, last, ws, training)
        peak = row[2] + row[3] + row[4] + row[5] + row[6]
        if best is None or peak > best[0]:
            best = (peak, row, listing, st)
    assert best is not None
    peak, row, listing, st = best
    return _result(sc, spec, hw, gpu, peak, row, listing, st, layers, ws, training, validate=reference)


def _listed_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool, ws: int,
                     training: bool) -> Timeline:
    """Every moment of the stage's timeline, listed again from its inputs when a chart asks for it. An
    estimate keeps these inputs, not the timeline it found the peak in: that one's per-layer closures and
    sums would outlive the estimate in every memo entry, and the cyclic collector would scan them over and
    over (a fifth of a new shape's estimate); few estimates are ever drawn."""
    tl = (_train_timeline(sc, st, ctx, layers, first, last, ws) if training
          else _inference_timeline(sc, _inference_states(st), ctx, layers, ws))
    return tl.build()


def fsdp2_states(sc: Scenario) -> States:
    """PyTorch FSDP2 (fully_shard on every decoder layer and on the root), the ZeRO-3 analogue
    with reshard_after_forward=True and the ZeRO-2 analogue with False. Each parameter is sharded
    on dim 0, padded to a multiple of the world size N; gradients are reduce-scattered into the
    same shards and the optimizer runs on them. *-mixed uses MixedPrecisionPolicy(param_dtype=16-bit,
    reduce_dtype=fp32): the fp32 shards are the master weights. The root's gathered weights
    (embedding, final norm, lm_head) stay unsharded from forward to the end of backward
    (torch/distributed/fsdp/_fully_shard, FSDPParamGroup)."""
    spec, t = sc.spec, sc.training
    p = t.precision
    n, ep = sc.data_parallel, t.expert_parallel
    store = 2 if p == Precision.bf16 else 4
    compute = 2 if (p == Precision.bf16 or p.is_mixed) else 4
    shapes = fsdp2_shard_shapes(spec, n, ep)
    sharded = sum(prod(s) * c for s, c in shapes)
    experts = spec.routed_expert_params_per_layer() if ep > 1 else 0
    state_p = Precision.bf16 if p == Precision.bf16 else Precision.fp32
    states = precision.optimizer_state_bytes(t.optimizer, state_p, shapes)
    temp = precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, state_p, shapes)
    root = spec.embedding_params() + spec.norm_params() + spec.lm_head_params()
    dense = spec.layer_params() + spec.dense_layer_delta() if spec.dense_layers else 0
    rs_bytes = 4 if p.is_mixed else store  # the reduce dtype: fp32 under MixedPrecisionPolicy(reduce_dtype=fp32)
    # an experts group of one rank (efsdp = 1) "reduces" into a full-size output, through a divided
    # temporary: reduce_output.copy_(input / gradient_divide_factor)
    rs_experts = experts // ep * (3 if ep > 1 and n // ep == 1 else 1) * rs_bytes
    # ...and through that reduce the group's last parameter (the down projection) keeps its unsharded gradient:
    # a DTensor that autograd, not Python, still holds once the list of gradients is cleared (measured on the CPU
    # over the fake process group: Qwen3-MoE, 64 experts, ep 8 of 8)
    last_grad = prod(spec.routed_expert_shapes()[-1][0]) // ep * compute if experts else 0
    comps = [Component(key="weights", category="parameters", label=N_("Model weights (FSDP2 shards)"),
                       bytes=sharded * store, **words("formula", N_("{params} params / {ranks} ranks x {bytes} B"),
                                                      params=f"{spec.total_params():,}", ranks=n, bytes=store),
                       source=N_("FSDP2 dim-0 sharding, padded to a multiple of the world size"))]
    return States(weights=sharded * store, grads=sharded * store, optimizer=states, master=0, opt_temp=temp,
                  grad_fp32_step=0, zero_buffers=0, trainable=spec.total_params(), params_local=spec.total_params(),
                  offloaded_cpu=0, offloaded_nvme=0, components=comps, gathered_root=root * compute,
                  gathered_layer=(spec.layer_params() - experts) * compute,
                  gathered_experts=experts // ep * compute, reshard_after_forward=t.zero_stage == 3,
                  forward_all_gather=fsdp2_forward_all_gather(spec, n, ep) * compute,
                  # the unsharded grads are copied into one flat reduce-scatter input in the reduce dtype (fp32
                  # under mixed precision: chunk_cat casts as it copies; foreach_reduce, torch 2.13) and freed after
                  # (under expert parallelism the experts reduce-scatter as their own group, before the layer's)
                  reduce_scatter_input=max((spec.layer_params() - experts) * rs_bytes, rs_experts),
                  reduce_scatter_experts=rs_experts + last_grad,
                  # comm_ctx.reduce_scatter_states keeps one input (reduce_scatter_max_input_buffers = 1) until the
                  # next group's post-backward: a decoder layer's (its dense group's) through the next layer's backward
                  reduce_scatter_kept=(spec.layer_params() - experts) * rs_bytes,
                  gathered_dense_layer=dense * compute, reduce_scatter_dense=dense * rs_bytes)


@dataclass(frozen=True)
class Fsdp2LayerTerms:
    """FSDP2's per-layer bytes in the timeline (a MoE model's dense first layers are smaller groups, no experts)."""

    gathered: list[int]  # the layer's unsharded parameters (under EP without its experts)
    gathered_upto: list[int]  # sum of gathered over the layers below i (ZeRO-2 analogue: all stay gathered)
    experts: list[int]  # EP: the layer's local experts, their own group
    all_gather: list[int]  # the layer's last group's all-gather output, kept until the next copy-out
    reduce_scatter: list[int]  # the layer's (dense group's) reduce-scatter input, kept until the next group's
    reduce_scatter_peak: list[int]  # the larger of its groups' reduce-scatter inputs
    reduce_scatter_experts: list[int]  # EP: the experts group's reduce-scatter buffers (0 for a dense layer)


def fsdp2_layer_terms(st: States, ctxs: list[Ctx]) -> Fsdp2LayerTerms:
    dense = [c.dense_mlp for c in ctxs]
    gathered = [st.gathered_dense_layer if d else st.gathered_layer for d in dense]
    return Fsdp2LayerTerms(
        gathered=gathered, gathered_upto=list(accumulate(gathered, initial=0)),
        experts=[0 if d else st.gathered_experts for d in dense],
        all_gather=[g if d else st.forward_all_gather for g, d in zip(gathered, dense, strict=True)],
        reduce_scatter=[st.reduce_scatter_dense if d else st.reduce_scatter_kept for d in dense],
        reduce_scatter_peak=[st.reduce_scatter_dense if d else st.reduce_scatter_input for d in dense],
        reduce_scatter_experts=[0 if d else st.reduce_scatter_experts for d in dense])


def fsdp2_local_expert_grad_bytes(c: Ctx) -> int:
    """Gradient bytes of one MoE layer's E / ep local routed experts, unsharded (0 for a dense layer or a
    frozen base)."""
    s = c.spec
    if c.ep == 1 or c.dense_mlp or c.frozen_base or s.num_experts == 1:
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
    return c.ep > 1 and s.shared_experts > 0 and s.num_experts > 1 and not c.dense_mlp


def fsdp2_forward_all_gather(spec: ModelSpec, n: int, ep: int) -> int:
    """Elements of the all-gather output FSDP2 keeps in forward after a group's copy-out, to overlap it with the
    next all-gather, until the next group's copy-out (or the root's post-forward: so through the loss)
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, wait_for_unshard, `all_gather_state`): a decoder
    layer's, or under expert parallelism the last group of a layer, its experts', which a group of one rank (efsdp =
    1) initialises from its shard without an all-gather. Measured on the CPU over the fake process group."""
    if ep == 1:
        return spec.layer_params()
    return spec.routed_expert_params_per_layer() // ep if n // ep > 1 else 0


def fsdp2_shard_shapes(spec: ModelSpec, n: int, ep: int) -> list[tuple[tuple[int, ...], int]]:
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


def _inference_states(st: States) -> States:
    return States(st.weights, 0, 0, 0, 0, 0, 0, 0, st.params_local, 0, 0, st.components)


def _result(sc, spec, hw, gpu, peak, row: Row, listing: Callable[[], Timeline], st: States, layers, ws,
            training, validate: bool) -> Estimate:
    event, phase, params, grads, opt, acts, other = row
    device = device_total(peak, hw.num_gpus)
    mem = hw.memory_bytes or (gpu.memory_bytes if gpu else None)
    step = 1 if (phase == "optimizer" or st.optimizer == 0 or not training) else 2
    per_node = hw.gpus_in_node()
    # offload: the host must also hold the model while it is loaded, before DeepSpeed moves it
    cpu_ram = max(st.offloaded_cpu, st.load_host) * per_node if st.offloaded_cpu else 0
    nvme = st.offloaded_nvme * per_node
    verdict = verdict_data(device["expected"], mem, cpu_ram, hw.cpu_ram_bytes, nvme, hw.nvme_bytes)
    return make_estimate({
        "model": {"name": spec.name or spec.family, "family": spec.family,
                  "total_params": _count(spec, "total_params"), "trainable_params": st.trainable if training else 0,
                  "params_on_this_gpu": st.params_local, "num_layers": spec.num_layers,
                  "layers_on_this_gpu": layers},
        "peak_allocated_bytes": peak, "peak_phase": phase, "peak_event": event, "peak_step": step,
        "breakdown": {"parameters": params, "gradients": grads, "optimizer_states": opt, "activations": acts,
                      "other": other},
        "device_total_bytes": device, "gpu_memory_bytes": mem, "fits": verdict["fits"],
        "headroom_bytes": gpu_headroom(verdict), "cpu_ram_bytes": cpu_ram, "nvme_bytes": nvme, "verdict": verdict,
        "notes": [],
    }, partial(peak_components, sc, st, row, ws), listing, validate=validate)


def peak_components(sc: Scenario, st: States, row: Row, ws: int) -> list[Component]:
    """The breakdown at the peak as named terms, each with its formula and source; they sum to
    the peak allocated bytes."""
    event, phase, params, grads, opt, acts, other = row
    t = sc.training
    p = t.precision
    out = list(st.components)  # weights
    gathered = params - sum(c.bytes for c in out if c.category == "parameters")
    if gathered > 0:  # FSDP2: the root module's and the running layers' all-gathered full 16-bit weights
        out.append(Component(key="gathered_weights", category="parameters", label=N_("Gathered full weights (FSDP2)"),
                             bytes=gathered, formula=N_("root weights (embedding, final norm, lm_head) gathered "
                             "through forward and backward + the running (and prefetched) decoder layers' full weights"),
                             source=N_("torch.distributed.fsdp.fully_shard: unsharded parameters between all-gather "
                                       "and reshard (modelled from FSDP2's source, calc.memory.engine.fsdp2_states)")))
    if event in FLATTEN_EVENTS:
        out.append(Component(key="gradients", category="gradients", label=FLATTEN_EVENTS[event][0], bytes=grads,
                             formula=FLATTEN_EVENTS[event][1],
                             source=N_("DeepSpeed's source (calc.memory.engine._optimizer_rows)")))
        return out + _states_and_rest(sc, st, row, ws)
    gb = precision.grad_bytes_per_param(p) if t.lora is None else adapter_bytes(p)
    fp32_copies = phase == "optimizer" and st.grad_fp32_step > 0
    both = fp32_copies and st.keeps_16bit_step_grads  # DeepSpeed ZeRO-0: the 16-bit grads stay beside them
    label = N_("Parameter gradients (.grad)")
    if fp32_copies:
        label = N_("16-bit gradients and their fp32 copies for the optimizer step") if both else \
            N_("fp32 gradient copies for the optimizer step")
        gb = f"({gb} + {precision.FP32})" if both else precision.FP32  # *-mixed: the step works on fp32 copies
    full = st.grad_fp32_step + (st.grads if both else 0) if fp32_copies else st.grads
    grad_fields = dict(params=f"{st.trainable:,}", bytes=gb, zero=_zero_note(t.zero_stage, 1 if fp32_copies else 2, sc))
    out.append(Component(
        key="gradients", category="gradients", label=label, bytes=grads,
        **(words("formula", N_("{params} trainable params x {bytes} B{zero} ({share} created so far)"),
                 share=f"{grads / full:.0%}", **grad_fields) if full and grads < full else
           words("formula", N_("{params} trainable params x {bytes} B{zero}"), **grad_fields)),
        source=precision.step_gradients_why(st.keeps_16bit_step_grads) if fp32_copies else
        N_("AccumulateGrad creates .grad in the parameter dtype; zero_grad(set_to_none=True) frees them after the "
           "step")))
    return out + _states_and_rest(sc, st, row, ws)


# The moments before DeepSpeed's optimizer step where gradients are copied (calc.memory.engine._optimizer_rows): label,
# formula
_FLATTENED = N_("Gradients flattened and cast to fp32 for the optimizer step")
FLATTEN_EVENTS = {
    "gradient norm (fp64 copy)": (N_("Gradients and an fp64 copy for the gradient norm"),
                                  N_("the rank's gradient partition + an fp64 copy of its largest gradient")),
    "gradient partition flattened": (_FLATTENED, N_("the rank's gradient partition + its flat copy (+ that copy "
                                                    "cast to fp32 for a 16-bit model)")),
    "gradients cast to fp32 and flattened": (_FLATTENED, N_("the 16-bit gradients + an fp32 copy of each + the flat "
                                                            "fp32 tensor they are joined into")),
}


def _states_and_rest(sc: Scenario, st: States, row: Row, ws: int) -> list[Component]:
    """The peak's optimizer states, master weights, activations and other terms (peak_components)."""
    event, phase, params, grads, opt, acts, other = row
    t = sc.training
    out: list[Component] = []
    master = st.master if opt else 0
    states = opt - master
    out.append(Component(key="optimizer_states", category="optimizer_states", label=N_("Optimizer states"),
                         bytes=states, **words("formula", N_("{optimizer} states for {params} params{zero}; created "
                                                            "lazily in step 1"), optimizer=t.optimizer.value,
                                               params=f"{st.trainable:,}", zero=_zero_note(t.zero_stage, 1, sc)),
                         source=N_("torch.optim state dicts (calc.contract.precision.optimizer_state_bytes)")))
    if master:
        out.append(Component(key="master_weights", category="optimizer_states", label=N_("fp32 master weights"),
                             bytes=master, **words("formula", N_("{params} params x {bytes} B{zero}"),
                                                   params=f"{st.trainable:,}", bytes=4,
                                                   zero=_zero_note(t.zero_stage, 1, sc)),
                             source=N_("ZeRO paper section 3.1 (mixed-precision training keeps fp32 copies)")))
    out.append(Component(key="activations", category="activations", label=N_("Activations saved for backward"),
                         bytes=acts,
                         **words("formula", N_("tensors autograd keeps at '{event}' (per-layer ops in calc.sim.layers)"),
                                 event=event),
                         source=N_("replay of the transformers ops in the autograd simulator (calc.sim.graph)")))
    inputs = 8 * t.micro_batch_size * t.seq_len
    named = [("inputs", N_("input_ids (int64)"), inputs, f"{t.micro_batch_size} x {t.seq_len} x 8 B",
              N_("the token batch on the device")),
             ("cublas_workspace", N_("cuBLAS workspaces"), ws, N_("one per matmul thread (forward + autograd)"),
              N_("CUBLAS_WORKSPACE_CONFIG defaults (calc.memory.overhead)")),
             ("zero_buffers", N_("ZeRO buckets / gathered weights"),
              st.zero_buffers + (st.zero3_gathered if phase != "optimizer" else 0),
              N_("reduce bucket (stage 1-2) or gathered layer weights + prefetch (stage 3; none on a single "
                 "data-parallel rank, where DeepSpeed uses the local partition without an all-gather)"),
              N_("DeepSpeed defaults in calc.contract.parallel; partition_parameters._no_gather_coalesced for one rank"))]
    if event == "optimizer step":
        named += [("optimizer_temporaries", N_("optimizer.step() temporaries"), st.opt_temp,
                   f"{t.optimizer_impl.value} {t.optimizer.value}", "calc.contract.precision.optimizer_temp_bytes"),
                  ]
    for key, label, n, formula, source in named:
        n = min(n, other)
        if n:
            out.append(Component(key=key, category="other", label=label, bytes=n, formula=formula, source=source))
            other -= n
    if other:
        out.append(Component(key="transients", category="other", **words("label", N_("Transients at '{event}'"),
                                                                          event=event),
                             bytes=other, formula=N_("block-local temporaries alive at this moment (logits and loss "
                             "gradients, activation gradients, autocast copies, attention scores)"),
                             source=N_("autograd simulator (calc.sim.graph) over calc.sim.layers")))
    return out


def _zero_note(stage: int, from_stage: int, sc: Scenario) -> str:
    return f" / {sc.data_parallel} (ZeRO-{stage})" if stage >= from_stage and sc.data_parallel > 1 else ""

"""Model states on one GPU: weights, gradients, optimizer states, fp32 master weights, their ZeRO partitions,
DeepSpeed's buffers (reduce buckets, ZeRO-3's gathered weights) and what offload moves to the host or NVMe.

The bytes per element come from calc.contract.precision, the sharding rules from calc.contract.parallel; FSDP2's
states are built in calc.memory.fsdp2. Parameter counts and shapes are asked once per model
(calc.contract.architectures.per_spec): listing a model's linears costs more than composing a new shape's timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, Literal, NamedTuple

from calc.contract import parallel, precision, quantized
from calc.contract.architectures import ModelSpec, per_spec
from calc.contract.i18n import N_
from calc.contract.precision import adapter_bytes
from calc.contract.scenario import Offload, OptimizerImpl, Precision, Scenario
from calc.memory import host as hostmem
from calc.memory.result import HOOK_STEP_EMBEDDING, HOOK_STEP_HEAD, Component, is_hook_step_layer, words
from calc.sim.frameworks.litgpt import litgpt_param_numels, litgpt_qlora_base_bytes
from calc.sim.frameworks.torchtune import rope_cache_bytes

Target = Literal["cuda", "cpu"]
Shapes = list[tuple[tuple[int, ...], int]]  # (tensor shape, how many tensors of it)

WEIGHTS_SOURCE = N_("parameter count x bytes per weight (calc.contract.precision)")
# A quantized base: what bitsandbytes stores (calc.contract.quantized), and what stays 16-bit without peft's
# prepare_model_for_kbit_training, which the HF Trainer does not call (it upcasts those weights to fp32)
QUANTIZED_BASE_SOURCE = N_(
    "bitsandbytes' storage of each nn.Linear / Conv1D that transformers' BitsAndBytesConfig quantizes (packed data "
    "+ its quantization state, calc.contract.quantized); lm_head, embeddings, norms and biases stay 16-bit, as "
    "without peft's prepare_model_for_kbit_training (which upcasts them to fp32); measured with bitsandbytes on CPU")

LITGPT_QLORA_SOURCE = N_(
    "bitsandbytes' storage of every nn.Linear LitGPT's --quantize bnb.* makes 4-bit (lm_head included), the rest "
    "in bf16, and finetune/lora.py's StableEmbedding beside the embedding it replaced (kept alive by the script); "
    "measured with LitGPT and bitsandbytes on CPU")


@dataclass(frozen=True)
class States:
    """Model-state bytes on one GPU (after sharding); every int is bytes unless its name says otherwise."""

    weights: int
    grads: int
    optimizer: int  # states (+ fp32 master weights for *-mixed)
    master: int
    opt_temp: int  # optimizer.step() temporaries
    grad_fp32_step: int  # fp32 copies of grads alive during the step (*-mixed)
    zero_buffers: int  # ZeRO-2 bucket / ZeRO-3 gathered weights
    trainable: int  # trainable params on this GPU before ZeRO sharding (a count)
    params_local: int  # params on this GPU before ZeRO sharding (a count)
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
    load_host: int = 0  # host RAM a process needs to build / load the model (parallel.model_load_host_bytes)
    host_parts: list[hostmem.HostPart] = field(default_factory=list)  # offloaded_cpu / _nvme, part by part
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
    # bitsandbytes' paged optimizers on CUDA: states in managed memory, outside `optimizer` and the peak allocated
    # bytes, inside the device total (precision.paged_state_bytes; calc.memory.overhead.device_total)
    paged_optimizer: int = 0
    # optimizer_in_backward: every parameter is stepped in its own gradient hook (opt_temp: the largest one's)
    in_backward: InBackwardStep | None = None


class InBackwardStep(NamedTuple):
    """optimizer_in_backward (torchtune training/memory.py register_optim_in_bwd_hooks): one optimizer per
    parameter, stepped by the parameter's post-accumulate-grad hook, which then frees its gradient."""

    temp_per_element: int  # one hook's optimizer.step() temporaries per element of its parameter
    largest_layer_param: int  # elements of a decoder layer's largest trainable tensor
    vocab_param: int  # elements of the token embedding (and an untied lm_head), 0 where frozen (LoRA)

    def hook_temp_bytes(self, event: str) -> int:
        """The step temporaries of the hook a timeline event names (0 for other events)."""
        if event in (HOOK_STEP_HEAD, HOOK_STEP_EMBEDDING):
            return self.temp_per_element * self.vocab_param
        return self.temp_per_element * self.largest_layer_param if is_hook_step_layer(event) else 0


# ---- parameter counts and shapes, once per model ---------------------------------------------------------------------

def param_count(spec: ModelSpec, method: str) -> int:
    """spec.<method>() (a parameter count such as "layer_params"), memoized per spec."""
    return per_spec(spec, method, getattr(spec, method))


def local_params(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> int:
    """Parameters on one GPU: layer weights / tp (norms replicated), the vocab-parallel embedding
    on the first pipeline stage and the final norm + lm_head on the last."""
    return per_spec(spec, ("local_params", tp, layers, first, last),
                    lambda: _count_local_params(spec, tp, layers, first, last))


def _count_local_params(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> int:
    n = layers * (spec.layer_matmul_params() // tp + spec.layer_norm_params())
    if first:  # a MoE model's first layers are dense
        n += min(layers, spec.dense_layers) * spec.dense_layer_delta() // tp
        n += spec.embedding_params() // tp
    if last:
        n += spec.norm_params() + spec.lm_head_params() // tp
        if spec.tie_word_embeddings and not first:
            n += spec.vocab_size * spec.hidden_size // tp
    return n


def local_shapes(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> Shapes:
    """Parameter shapes on this GPU (layer counts scaled to this stage; TP splits the first dim). Shared:
    treat as read-only."""
    return per_spec(spec, ("local_shapes", tp, layers, first, last),
                    lambda: _list_local_shapes(spec, tp, layers))


def _list_local_shapes(spec: ModelSpec, tp: int, layers: int) -> Shapes:
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


def lora_shapes(spec: ModelSpec, rank: int, targets: str | tuple[str, ...], layers: int, tp: int,
                first: bool = True, last: bool = True) -> Shapes:
    """LoRA A (r x in) and B (out x r) for each targeted linear of each layer (peft; the layer list is
    ModelSpec.linear_layers of each kind of layer, this GPU's tensor-parallel slice), and lm_head's on the last
    stage when a target list names it (A: r x H, B: V / tp x r). Shared: treat as read-only."""
    return per_spec(spec, ("lora_shapes", rank, targets, layers, tp, first, last),
                    lambda: _list_lora_shapes(spec, rank, targets, layers, tp, first, last))


def _list_lora_shapes(spec: ModelSpec, rank: int, targets: str | tuple[str, ...], layers: int, tp: int,
                      first: bool, last: bool) -> Shapes:
    dense = min(layers, spec.dense_layers) if first else 0
    shapes: Shapes = []
    for kind, n in ((False, layers - dense), (True, dense)):
        for lin in spec.linear_layers(kind) if n else []:
            if spec.lora_targeted(lin, targets):
                fin, fout = lin.in_features // lin.tp_in(tp), lin.out_features // lin.tp_out(tp)
                shapes += [((rank, fin), lin.count * n), ((fout, rank), lin.count * n)]
    if last and spec.lora_on_lm_head(targets):
        shapes += [((rank, spec.hidden_size), 1), ((spec.vocab_size // tp, rank), 1)]
    return shapes


def largest_tensor(spec: ModelSpec, shapes_key: tuple, shapes: Shapes) -> int:
    """Elements of the largest tensor among `shapes` (named `shapes_key` in the per-spec memo)."""
    return per_spec(spec, (shapes_key, "largest"), lambda: max((prod(s) for s, _ in shapes), default=0))


# ---- the terms of model_states ---------------------------------------------------------------------------------------

class TrainableWeights(NamedTuple):
    """The weights on one GPU and what trains (model_states' first step)."""

    weight_bytes: int  # after ZeRO-3's sharding
    trainable_params: int  # before ZeRO sharding
    grad_bytes_per_param: int
    state_precision: Precision  # the dtype the optimizer's states follow
    shapes: Shapes  # the trainable tensors
    shapes_key: tuple  # names `shapes` in the per-spec memo
    formula: dict[str, Any]  # the weights component's formula (words)
    source: str = WEIGHTS_SOURCE  # what the weights component rests on
    # LoRA modules_to_save beside fp32 adapters: peft leaves its trainable copies in the base's bf16 (it upcasts
    # only the adapters), so they keep bf16 gradients and states of their own (not among `shapes`)
    bf16_copies: Shapes = []
    bf16_copy_params: int = 0


def torchtune_adapted(sc: Scenario) -> frozenset[str] | None:
    """torchtune's QLoRA: the linears with an adapter (which of the rest are NF4 is quantized.torchtune_nf4's);
    None for the other frameworks (bitsandbytes' layout)."""
    t = sc.training
    return sc.spec.lora_target_names(t.lora.targets) if t.framework == "torchtune" and t.lora is not None else None


def trainable_weights(sc: Scenario, params_local: int, layers: int, first: bool, last: bool,
                      shard: parallel.Sharding) -> TrainableWeights:
    """Full fine-tuning trains every local parameter in the weights' dtype; LoRA trains its adapters (peft's
    dtype, calc.contract.precision.adapter_bytes) beside a frozen, possibly quantized base."""
    spec, t = sc.spec, sc.training
    p, tp = t.precision, t.tensor_parallel
    if t.lora is None:
        shapes_key: tuple = ("local", tp, layers, first, last)
        per_weight = precision.weight_bytes_per_param(p)
        formula = words("formula", N_("{params} params x {bytes} B{zero}"), params=f"{params_local:,}",
                        bytes=per_weight, zero=f" / {sc.data_parallel} (ZeRO-3)" if shard.weights < 1 else "")
        return TrainableWeights(round(params_local * per_weight * shard.weights), params_local,
                                precision.grad_bytes_per_param(p), p, local_shapes(spec, tp, layers, first, last),
                                shapes_key, formula)
    lora = t.lora
    per_adapter = adapter_bytes(p, lora.base_weights)
    shapes_key = ("lora", lora.rank, lora.targets, lora.modules_to_save, per_adapter, layers, tp, first, last)
    adapters = lora_shapes(spec, lora.rank, lora.targets, layers, tp, first, last)
    copies = spec.modules_to_save_shapes(lora.modules_to_save, tp, first, last)
    same_dtype = per_adapter == 2  # 16-bit adapters: the copies train as the adapters do
    shapes = per_spec(spec, shapes_key, lambda: adapters + copies if same_dtype else adapters)
    copy_params = sum(prod(s) * c for s, c in copies)
    trainable = per_spec(spec, (shapes_key, "numel"), lambda: sum(prod(s) * c for s, c in adapters)) + copy_params
    litgpt_qlora = t.framework == "litgpt" and lora.quantized
    base_bytes = litgpt_qlora_base_bytes(spec, lora.base_weights, lora.double_quant, params_local) if litgpt_qlora \
        else quantized.frozen_base(spec, lora.base_weights, lora.double_quant, layers, tp, first,
                                   sc.not_converted, torchtune_adapted(sc)).total_bytes(params_local)
    formula = words("formula", N_("{base} frozen base params = {base_bytes} B ({quant}) + {lora} LoRA params "
                                  "x {lora_bytes} B"), base=f"{params_local:,}", base_bytes=f"{base_bytes:,}",
                    quant=lora.base_weights, lora=f"{trainable:,}", lora_bytes=per_adapter)
    # the modules_to_save copies stay in the base's 16 bits (peft upcasts only the adapters)
    weight_bytes = round(base_bytes * shard.weights) + per_adapter * (trainable - copy_params) + 2 * copy_params
    return TrainableWeights(weight_bytes, trainable, per_adapter, p if same_dtype else Precision.fp32, shapes,
                            shapes_key, formula, source=LITGPT_QLORA_SOURCE if litgpt_qlora
                            else QUANTIZED_BASE_SOURCE if lora.quantized else WEIGHTS_SOURCE,
                            bf16_copies=[] if same_dtype else copies, bf16_copy_params=0 if same_dtype else copy_params)


class OptimizerBytes(NamedTuple):
    """Gradients and what the optimizer holds on one GPU (model_states' second step)."""

    grad_bytes: int
    state_bytes: int  # the optimizer's states alone
    master_bytes: int  # fp32 (or DeepSpeed's) master weights
    step_temp_bytes: int  # optimizer.step() temporaries
    fp32_step_grad_bytes: int  # *-mixed: the fp32 gradient copies of the step


NO_OPTIMIZER_BYTES = OptimizerBytes(0, 0, 0, 0, 0)  # all of it offloaded


def optimizer_bytes(sc: Scenario, w: TrainableWeights, shard: parallel.Sharding, zero12: bool) -> OptimizerBytes:
    """Gradients (ZeRO-2's partition, or ZeRO-1's under DeepSpeed's bucketed reduction: `zero12`), optimizer states,
    master weights and step temporaries, each sharded as ZeRO shards it."""
    spec, t = sc.spec, sc.training
    p = t.precision
    grad_bytes = w.trainable_params * w.grad_bytes_per_param - (w.grad_bytes_per_param - 2) * w.bf16_copy_params
    grads = round(grad_bytes * (shard.optimizer if zero12 else shard.gradients))
    # sums over the parameter shapes, once per spec: a new batch shape or parallel layout does not change them
    states = per_spec(spec, (w.shapes_key, t.optimizer, w.state_precision),
                      lambda: precision.optimizer_state_bytes(t.optimizer, w.state_precision, w.shapes)
                      + precision.optimizer_state_bytes(t.optimizer, Precision.bf16, w.bf16_copies))
    master = round(w.trainable_params * precision.master_bytes_per_param(p) * shard.optimizer)
    if t.zero_stage >= 1 and not master:
        # DeepSpeed ZeRO-1/2/3 always hand the optimizer a clone of this rank's partition in the master
        # dtype (fp32; bf16 under bf16_master_weights_and_grads), even when the model is fp32
        # (stage_1_and_2.py single_partition_of_fp32_groups, stage3.py fp32_partitioned_groups_flat)
        master = round(w.trainable_params * (2 if p == Precision.bf16 else 4) * shard.optimizer)
    # optimizer_in_backward: each hook steps one parameter, so the step's temporaries are the largest one's
    temp_shapes = [((largest_tensor(spec, w.shapes_key, w.shapes),), 1)] if t.optimizer_in_backward else w.shapes
    # LitGPT's full fine-tuning: the parameters in GPT's order (its for-loop Adam keeps one more temporary)
    order = litgpt_param_numels(spec) if t.framework == "litgpt" and t.lora is None and not t.optimizer_in_backward \
        else ()
    temp = per_spec(spec, (w.shapes_key, t.optimizer, t.optimizer_impl, w.state_precision, t.optimizer_in_backward,
                           bool(order)),
                    lambda: precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, w.state_precision,
                                                           temp_shapes, order)
                    + precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, Precision.bf16, w.bf16_copies))
    fp32_grads = round(w.trainable_params * 4 * shard.optimizer) if p.is_mixed else 0
    return OptimizerBytes(grads, round(states * shard.optimizer), master, round(temp * shard.optimizer), fp32_grads)


def paged_optimizer_bytes(sc: Scenario, w: TrainableWeights, shard: parallel.Sharding) -> int:
    """What a bitsandbytes paged optimizer keeps in CUDA managed memory (precision.paged_state_bytes), sharded
    as ZeRO shards the optimizer."""
    opt = sc.training.optimizer
    if not opt.paged:
        return 0
    paged = per_spec(sc.spec, (w.shapes_key, opt, "paged"), lambda: precision.paged_state_bytes(opt, w.shapes))
    return round(paged * shard.optimizer)


class ZeroBuffers(NamedTuple):
    """DeepSpeed's buffers beside the model states."""

    persistent_bytes: int  # from initialisation on: ZeRO-3's reduce bucket (offload adds its staging buffers)
    reduce_bucket_bytes: int  # ZeRO-1/2: from the first gradient hook to the end of backward
    zero3_gathered_bytes: int  # ZeRO-3: gathered (and prefetched) weights, in forward and backward only


def zero_buffers(sc: Scenario, w: TrainableWeights, params_local: int) -> ZeroBuffers:
    """The IPG reduce buckets (ZeRO-3's live from initialisation on, ZeRO-1/2's from the first gradient hook to the
    end of backward: stage_1_and_2.py setup_buckets, _release_ipg_buffers) and ZeRO-3's gathered weights, released
    again before the optimizer step (measured: ZeRO-3 step peaks hold no gathered weights)."""
    spec, t = sc.spec, sc.training
    p, tp = t.precision, t.tensor_parallel
    buckets = parallel.reduce_bucket_bytes(w.grad_bytes_per_param, t.zero_stage, autocast_bytes=2 if p.is_amp else 0,
                                           elements=t.reduce_bucket_size)
    persistent, reduce_buckets = (0, buckets) if t.zero_stage in (1, 2) else (buckets, 0)
    layer_params = param_count(spec, "layer_params") // tp
    edge_params = max(param_count(spec, "embedding_params"), param_count(spec, "lm_head_params")) // tp
    gathered = parallel.stage3_live_param_bytes(
        layer_params, edge_params, precision.weight_bytes_per_param(p), t.zero_stage, sc.data_parallel,
        params_offloaded=t.offload_params != Offload.none, total_params=params_local)
    return ZeroBuffers(persistent, reduce_buckets, gathered)


class OptimizerOffload(NamedTuple):
    """Where ZeRO-Offload puts the optimizer's bytes: host RAM and NVMe per rank as allocated, and their parts."""

    host_bytes: int
    nvme_bytes: int
    device_buffer_bytes: int  # ZeRO-1/2: the gradient staging buffer on the device
    parts: list[hostmem.HostPart]


def optimizer_offload(sc: Scenario, w: TrainableWeights, opt: OptimizerBytes, shard: parallel.Sharding,
                      target: Target) -> OptimizerOffload:
    """ZeRO-Offload (stage_1_and_2.py / stage3.py, cpu_offload): the optimizer states and a partition of master
    weights in the master dtype (fp32, or bf16 for pure bf16; a clone even when the model is fp32) live in host
    memory beside an fp32 gradient partition; only the reduce buckets stay on the GPU. Which buffers are pinned
    (and so rounded up by PyTorch's host allocator) is each stage's own: calc.memory.host."""
    spec, t = sc.spec, sc.training
    part = round(w.trainable_params * shard.optimizer)
    master_element = 2 if t.precision == Precision.bf16 else 4
    on_cpu = t.offload_optimizer == Offload.cpu
    device = 0
    if t.zero_stage == 3:
        parts = hostmem.zero3_parts(opt.state_bytes, part * master_element, zero3_sub_groups(sc, w, part),
                                 master_element, opt.grad_bytes, on_cpu)
    else:  # the gradients go straight to the host's fp32 partition
        largest = largest_tensor(spec, w.shapes_key, w.shapes)
        device = largest * w.grad_bytes_per_param
        parts = hostmem.zero12_parts(opt.state_bytes, part * master_element, part, largest, w.grad_bytes_per_param,
                                  on_cpu)
    ram = sum(p.allocated_bytes(target) for p in parts if p.where == "host_ram")
    nvme = sum(p.allocated_bytes(target) for p in parts if p.where == "nvme")
    return OptimizerOffload(ram, nvme, device, parts)


def zero3_sub_groups(sc: Scenario, w: TrainableWeights, part: int) -> list[int]:
    """One rank's ZeRO-3 sub-groups (elements each, calc.memory.hostmem.zero3_sub_groups): from the model's parameter
    order for full fine-tuning without tensor, pipeline or expert parallelism, whose partitions are
    ceil(numel / world) each (partition_parameters.py pads every tensor); else full sub-groups of the partition.
    The HF Trainer's no-weight-decay group (norms, biases: hidden-size tensors) is not split off."""
    spec, t = sc.spec, sc.training
    dp = sc.data_parallel
    if t.lora is not None or t.tensor_parallel > 1 or t.pipeline_parallel > 1 or t.expert_parallel > 1:
        return hostmem.even_sub_groups(part)
    return per_spec(spec, ("zero3 sub-groups", dp), lambda: hostmem.zero3_sub_groups(
        [-(-n // dp) for n in per_spec(spec, "param order", lambda: parallel.ParamOrder(
            *spec.param_numel_blocks())).numels]))


def zero12_rank0_partition(spec: ModelSpec, dp: int, bucket_elements: int) -> parallel.Zero12Partition:
    """calc.contract.parallel.zero12_rank0_partition of the whole model, memoized per spec, world size and bucket."""
    return per_spec(spec, ("zero12 rank 0", dp, bucket_elements), lambda: parallel.zero12_rank0_partition(
        per_spec(spec, "param order", lambda: parallel.ParamOrder(*spec.param_numel_blocks())), dp, bucket_elements))


def in_backward_step(sc: Scenario, w: TrainableWeights) -> InBackwardStep | None:
    """optimizer_in_backward's per-hook terms: the step temporaries per element of one parameter
    (calc.contract.precision.optimizer_temp_bytes of a single tensor) and a decoder layer's largest trainable
    tensor (LoRA: its largest adapter matrix; else the largest of ModelSpec.layer_param_numels, dense layers'
    too, split by tensor parallelism)."""
    t, spec = sc.training, sc.spec
    if not t.optimizer_in_backward:
        return None
    per_element = precision.optimizer_temp_bytes(t.optimizer, t.optimizer_impl, w.state_precision, [((1,), 1)])
    if t.lora is not None:
        largest = largest_tensor(spec, w.shapes_key, w.shapes)
    else:
        kinds = (False, True) if spec.dense_layers else (False,)
        largest = per_spec(spec, "largest layer tensor", lambda: max(
            max(spec.layer_param_numels(dense), default=0) for dense in kinds)) // t.tensor_parallel
    vocab = 0 if t.lora is not None else spec.vocab_size // t.tensor_parallel * spec.hidden_size
    return InBackwardStep(per_element, largest, vocab)


# ---- model_states ----------------------------------------------------------------------------------------------------

def model_states(sc: Scenario, layers: int, first: bool, last: bool, target: Target = "cuda",
                 deepspeed: bool = True) -> States:
    """Weights, gradients, optimizer states and their sharding for one GPU; `target` decides how
    DeepSpeed's pinned host buffers are sized (calc.contract.parallel.pinned_bytes); `deepspeed` False is plain
    PyTorch (the reference loop, DDP) at zero_stage 0."""
    spec, t = sc.spec, sc.training
    p, tp = t.precision, t.tensor_parallel
    params_local = local_params(spec, tp, layers, first, last)
    shard = parallel.zero_sharding(t.zero_stage, sc.data_parallel)
    w = trainable_weights(sc, params_local, layers, first, last, shard)
    # DeepSpeed ZeRO-1 with overlap_comm (the export writes it) reduces through the buckets in backward as
    # ZeRO-2 does and keeps only this rank's partition (stage_1_and_2.py, process_gradients)
    zero12 = deepspeed and (t.zero_stage == 2 or (t.zero_stage == 1 and parallel.OVERLAP_COMM))
    opt = optimizer_bytes(sc, w, shard, zero12)
    paged = paged_optimizer_bytes(sc, w, shard) if target == "cuda" else 0
    opt = opt._replace(state_bytes=opt.state_bytes - paged)
    buffers = zero_buffers(sc, w, params_local)
    weights, persistent, host, nvme = w.weight_bytes, buffers.persistent_bytes, 0, 0
    parts: list[hostmem.HostPart] = []
    weights_source = w.source
    if t.framework == "torchtune":  # torchtune's RoPE cache is a buffer of the model, built once
        weights += rope_cache_bytes(spec, lora=t.lora is not None)
        weights_source = N_("parameter count x bytes per weight (calc.contract.precision), and torchtune's RoPE "
                            "cache buffer (max_seq_len x head_dim, fp32)")
    if t.offload_optimizer != Offload.none:
        off = optimizer_offload(sc, w, opt, shard, target)
        host, nvme, persistent = off.host_bytes, off.nvme_bytes, persistent + off.device_buffer_bytes
        parts = off.parts
        opt, zero12, paged = NO_OPTIMIZER_BYTES, False, 0  # the gradients are reduced to the host, not into a partition
    if t.offload_params != Offload.none:
        on_cpu = t.offload_params == Offload.cpu
        parts = [*parts, hostmem.param_offload_part(weights, on_cpu)]
        if on_cpu:
            host, weights = host + parts[-1].allocated_bytes(target), 0
        else:
            nvme, weights = nvme + weights, 0
    if target == "cpu":
        # DeepSpeed's CPU accelerator: the "device" is the host, so what is offloaded to CPU RAM is in
        # the same memory as everything else (and pin_memory is a no-op: pinned_bytes is exact)
        persistent += host
    weights_component = Component(
        key="weights", category="parameters", label=N_("Model weights"), bytes=weights, **w.formula,
        source=weights_source)
    all_shapes_key = ("local", tp, layers, first, last)
    largest = largest_tensor(spec, all_shapes_key, local_shapes(spec, tp, layers, first, last))
    load = parallel.model_load_host_bytes(params_local, largest, precision.weight_bytes_per_param(p), t.zero_stage)
    # DeepSpeed ZeRO-0 with a 16-bit model wraps the optimizer in FP16_UnfusedOptimizer (FP16_Optimizer for
    # FusedAdam), which casts each 16-bit .grad to an fp32 .grad of its master copy and frees neither before
    # the step (fp16/unfused_optimizer.py, step; engine.py _do_optimizer_sanity_check: DDP_BFLOAT16 / FP16)
    fp16_wrapper = deepspeed and t.zero_stage == 0 and p.is_mixed
    exact_order = zero12 and t.lora is None and tp == 1 and first and last and t.expert_parallel == 1
    return States(
        weights=weights, grads=opt.grad_bytes, optimizer=opt.state_bytes + opt.master_bytes, master=opt.master_bytes,
        opt_temp=opt.step_temp_bytes, grad_fp32_step=opt.fp32_step_grad_bytes, zero_buffers=persistent,
        trainable=w.trainable_params, params_local=params_local, offloaded_cpu=host, offloaded_nvme=nvme,
        components=[weights_component], load_host=load, host_parts=parts,
        # ZeRO-3 keeps every gradient partition in one flat buffer (grad dtype) allocated at initialisation
        # (stage3.py, grad_partitions_flat_buffer), so the gradients are there in every phase
        persistent_grads=t.zero_stage == 3, zero3_gathered=buffers.zero3_gathered_bytes,
        reduce_buckets=buffers.reduce_bucket_bytes, first_reduction_elements=t.reduce_bucket_size if zero12 else None,
        rank0_partition=zero12_rank0_partition(spec, sc.data_parallel, t.reduce_bucket_size) if exact_order else None,
        grad_bytes=w.grad_bytes_per_param, keeps_16bit_step_grads=fp16_wrapper,
        flattens_step_grads=fp16_wrapper and t.optimizer_impl == OptimizerImpl.fused, paged_optimizer=paged,
        in_backward=in_backward_step(sc, w))


def inference_states(st: States) -> States:
    """The weights alone: an inference step holds no gradients or optimizer states."""
    return States(st.weights, 0, 0, 0, 0, 0, 0, 0, st.params_local, 0, 0, st.components)


# ---- what the optimizer step reads -----------------------------------------------------------------------------------

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

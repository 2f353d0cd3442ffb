"""Multi-GPU sharding without GPUs: FSDP2 as the analogue of ZeRO-2 / ZeRO-3, measured on rank 0.

The scenario's hardware.num_gpus ranks form one data-parallel group over torch's *fake* process group
(torch.testing._internal.distributed.fake_pg: every collective returns at once, its output buffers are
still allocated), so one process sees exactly what rank 0 of the real job allocates:

  fully_shard(layer) for every decoder layer, then fully_shard(model) for the root (embeddings, final
  norm, lm_head), on a 1-D mesh of num_gpus ranks;
  zero_stage 3 -> reshard_after_forward=True  (parameters are gathered again for backward);
  zero_stage 2 -> reshard_after_forward=False (parameters stay gathered from forward to backward);
  gradients are reduce-scattered and optimizer states are sharded in both.

Precision: fp32, amp-bf16 (fp32 params, autocast forward) and bf16 as for one device; bf16-mixed and
fp16-mixed are FSDP2's MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32): sharded fp32
parameters (the masters) and gradients, 16-bit gathered parameters for compute.
Each rank holds its own micro-batch of micro_batch_size sequences.
On cpu the tensors are real (gathered parameters hold garbage, the bytes are right); under fake they
are fake; on cuda the caching allocator is read, as for one device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from calc.contract.record import MeasurementRecord, Sharding
from calc.contract.scenario import Mode, Precision, Scenario
from measure.trackers import fsdp_tracker
from measure.workload import (
    PrecisionPlan,
    UnsupportedError,
    Workload,
    build_model,
    decoder_layers,
    fake_mode_patches,
    precision_plan,
    prepare_optimizer,
    run_steps,
)


def check_sharded(scenario: Scenario) -> tuple[int, int]:
    """(world_size, zero_stage), or UnsupportedError saying what is not measured."""
    t = scenario.training
    world = scenario.resolved_hardware().num_gpus
    if t.tensor_parallel != 1 or t.pipeline_parallel != 1:
        raise UnsupportedError("tensor / pipeline parallelism is not measured; sharded runs are FSDP2 data parallel")
    if t.zero_stage not in (2, 3):
        raise UnsupportedError(f"zero_stage {t.zero_stage} with num_gpus > 1 is not measured: sharded runs are "
                               "FSDP2 analogues of ZeRO-2 (zero_stage 2) and ZeRO-3 (zero_stage 3)")
    if t.offload_optimizer.value != "none" or t.offload_params.value != "none":
        raise UnsupportedError("offload is not measured")
    if t.lora is not None and t.precision.is_mixed:
        raise UnsupportedError("LoRA in sharded runs is measured without a MixedPrecisionPolicy (bf16, amp-bf16, fp32)")
    if t.lora is not None and t.expert_parallel > 1:
        raise UnsupportedError("LoRA with expert parallelism is not measured")
    if t.precision == Precision.amp_fp16:
        raise UnsupportedError("amp-fp16 is not measured in sharded runs (it needs FSDP's sharded grad scaler)")
    if t.optimizer.value == "adamw-8bit":
        raise UnsupportedError("adamw-8bit is not measured in sharded runs")
    if scenario.mode == Mode.inference:
        raise UnsupportedError("sharded runs measure training (ZeRO shards training state)")
    return world, t.zero_stage


def check_expert_parallel(scenario: Scenario, device: str) -> int:
    """The expert-parallel degree, or UnsupportedError: AllToAllEP reads the all-to-all split sizes back to the
    host (`.tolist()`), which FakeTensorMode cannot do, so expert parallelism is measured with real tensors."""
    ep = scenario.training.expert_parallel
    if ep > 1 and device == "fake":
        raise UnsupportedError("expert_parallel > 1 is measured with --device cpu (real tensors over the fake "
                               "process group): the all-to-all split sizes are read back to the host")
    return ep


def _sharded_plan(precision: Precision) -> tuple[PrecisionPlan, Any]:
    """The precision plan of the model as built, and FSDP2's MixedPrecisionPolicy (or None)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision.is_mixed:
        low = torch.float16 if precision == Precision.fp16_mixed else torch.bfloat16
        plan = PrecisionPlan(torch.float32, None, False, False, None)
        return plan, MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    return precision_plan(precision), None


@contextlib.contextmanager
def fake_process_group(world: int, device_type: str) -> Iterator[Any]:
    """A fake process group of `world` ranks (this process is rank 0) and its 1-D device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UnsupportedError("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield init_device_mesh(device_type, (world,))  # built outside FakeTensorMode: it reads rank values
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def rank0_routes_for_every_rank() -> Iterator[None]:
    """The fake process group delivers nothing, so the token counts AllToAllEP exchanges before dispatch would
    be uninitialised. Deliver rank 0's own counts instead: every rank of the expert-parallel group routes as rank
    0 does, so rank 0 receives from each peer as many rows as it sends it, B x S x top_k rows in all (the
    balanced-routing assumption the estimate makes; measured token imbalance depends on the trained router).
    Only the counts exchange (the module's `all_to_all_single`) is redirected; the token all-to-alls are the
    fake group's, which allocate their outputs."""
    from transformers.distributed import expert_parallel

    original = expert_parallel.all_to_all_single

    def counts_from_rank0(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        output.copy_(input)

    expert_parallel.all_to_all_single = counts_from_rank0
    try:
        yield
    finally:
        expert_parallel.all_to_all_single = original


def apply_expert_parallel(model: Any, world: int, ep: int, fsdp_kwargs: dict[str, Any]) -> None:
    """transformers' expert parallelism as `from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=world,
    ep_size=ep))` applies it (transformers/distributed: mixin.maybe_distribute_model): the model's own ep plan
    shards each experts module's 3-D weights on the expert dim over the `ep` mesh (grouped_gemm) and routes its
    tokens with AllToAllEP (ep_dispatch_experts); then each experts module is fully_shard-ed over the `efsdp`
    mesh (world / ep ranks holding the same experts), resharded after forward, as fsdp.apply_fully_sharded_data_
    parallelism does. The dense modules are sharded afterwards by the caller, as for ep = 1."""
    from torch.distributed.fsdp import fully_shard
    from transformers.distributed.configuration_utils import DistributedConfig
    from transformers.distributed.expert_parallel import apply_expert_parallelism
    from transformers.distributed.utils import initialize_distributed_mesh

    config = DistributedConfig(fsdp_size=world, ep_size=ep, ep_implementation="all_to_all")
    _, meshes = initialize_distributed_mesh(config)
    _, ep_plan, _ = model._resolve_parallel_plans(config)
    apply_expert_parallelism(model, meshes.get_mesh("ep"), meshes.get_mesh("tp"), ep_plan, "all_to_all")
    for name, module in model.named_modules():
        if ep_plan.get(name) == "ep_dispatch_experts":
            fully_shard(module, **{**fsdp_kwargs, "mesh": meshes.get_mesh("efsdp"), "reshard_after_forward": True})
            module.set_gradient_divide_factor(float(world))
            if config.efsdp_size > 1:
                module.set_force_sum_reduction_for_comms(True)


@contextlib.contextmanager
def _sharding_propagation_outside_fake_mode() -> Iterator[None]:
    """DTensor computes each op's global output shape by running it on global-size fake tensors, in the
    active fake mode if there is one. Under our FakeTensorMode MemTracker would count those global
    tensors; give the propagation its own fake mode, as it has for real tensors."""
    import torch.distributed.tensor._sharding_prop as sharding_prop

    original = sharding_prop.detect_fake_mode
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode = original


def _local_bytes(tensors: Any) -> int:
    """Bytes of the distinct local storages (DTensor -> its local shard)."""
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        st = local.untyped_storage()
        if st._cdata not in seen:
            seen.add(st._cdata)
            total += st.nbytes()
    return total


def measure_sharded_once(scenario: Scenario, device: str, steps: int, num_layers: int | None) -> dict[str, Any]:
    """One sharded run; the record fields as in measure.runner's single-process run."""
    import gc

    from measure.runner import warm_up_cuda

    world, stage = check_sharded(scenario)
    ep = check_expert_parallel(scenario, device)
    t = scenario.training
    fake = device == "fake"
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UnsupportedError("--device cuda: no CUDA device is available")
    plan, mp_policy = _sharded_plan(t.precision)
    gc.collect()
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(fake_process_group(world, dev.type))
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            stack.enter_context(fake_mode_patches())
            stack.enter_context(_sharding_propagation_outside_fake_mode())
            stack.enter_context(FakeTensorMode())
        baseline = 0
        if device == "cuda":
            torch.cuda.empty_cache()
            warm_up_cuda(dev)
            baseline = torch.cuda.memory_allocated(dev)
        # a LoRA base is built in bf16 as in single-process runs (build_model's default for LoRA)
        weights = None if t.lora is not None else plan.weights
        model = build_model(scenario, dev, num_layers=num_layers, fake=fake, weights=weights)
        _shard(stack, model, mesh, world, stage, ep, mp_policy)
        vocab = model.config.get_text_config().vocab_size
        input_ids = torch.randint(0, vocab, (t.micro_batch_size, t.seq_len), device=dev)
        w = Workload(scenario, dev, model, input_ids, plan, fake=fake)
        out = _run_tracked(w, device, dev, steps, baseline)
        out["peak_allocated_bytes"] = max(out["phase"].values())
        out["weights_bytes"] = _local_bytes(list(model.parameters()) + list(model.buffers()))
        states = [v for s in w.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        out["optimizer_state_bytes"] = _local_bytes(states)
        out["num_params"] = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size
        out["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        out["notes"] = _sharded_notes(w, device, world, stage, ep, mp_policy)
        del w, model
    gc.collect()
    return out


def _shard(stack: contextlib.ExitStack, model: Any, mesh: Any, world: int, stage: int, ep: int,
           mp_policy: Any) -> None:
    """fully_shard per decoder layer and on the root (ZeRO-3: reshard after forward), experts first over their
    own group when expert parallelism is on."""
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": stage == 3}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if ep > 1:
        stack.enter_context(rank0_routes_for_every_rank())
        apply_expert_parallel(model, world, ep, kwargs)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def _run_tracked(w: Workload, device: str, dev: torch.device, steps: int, baseline: int) -> dict[str, Any]:
    """The steps, tracked by the allocator (cuda) or by MemTracker over the sharded model (cpu, fake)."""
    from measure.runner import measure_on_cuda, memtracker_fields

    if device == "cuda":
        return measure_on_cuda(w, dev, steps, baseline)
    out: dict[str, Any] = {}
    prepare_optimizer(w, None)
    mt = fsdp_tracker(w.model, w.optimizer)
    mt.track_inputs((w.input_ids,))
    with mt:
        out["initial_allocated_bytes"] = mt.current_total()
        run_steps(w, mt, steps)
    out.update(memtracker_fields(mt))
    return out


def _sharded_notes(w: Workload, device: str, world: int, stage: int, ep: int, mp_policy: Any) -> list[str]:
    from measure.runner import workload_notes

    notes = [n for n in workload_notes(w, device) if "master" not in n]
    notes.append(f"FSDP2 over a fake process group of {world} ranks (rank 0 measured): fully_shard per "
                 f"decoder layer and on the root, reshard_after_forward={stage == 3} (ZeRO-{stage} analogue)")
    if ep > 1:
        notes.append(f"expert parallelism {ep}: transformers' ep plan (grouped_gemm + ep_dispatch_experts, "
                     f"AllToAllEP) with experts fully_shard-ed over efsdp = {world // ep} ranks; the fake group "
                     "delivers rank 0's own token counts (every rank routes as rank 0)")
    if mp_policy is not None:
        notes.append(f"MixedPrecisionPolicy(param_dtype={mp_policy.param_dtype}, reduce_dtype=float32): "
                     "sharded fp32 params and grads are the masters")
    if device == "cpu":
        notes.append("real tensors: the fake collectives leave gathered parameters uninitialised (the "
                     "bytes are right, the numbers are garbage)")
    return notes


def sharding_info(scenario: Scenario) -> Sharding:
    world, stage = check_sharded(scenario)
    return Sharding(world_size=world, zero_stage=stage, reshard_after_forward=stage == 3,  # type: ignore[arg-type]
                    process_group="fake", rank=0)


def measure_sharded(scenario: Scenario, device: str, steps: int = 3, name: str | None = None,
                    num_layers: int | None = None, extrapolate_layers: bool = False) -> MeasurementRecord:
    from measure.runner import measure_depths

    return measure_depths(measure_sharded_once, scenario, device, steps, name, num_layers, extrapolate_layers,
                          engine="fsdp2", sharding=sharding_info(scenario))

"""The estimate: per-GPU memory through the first training steps (or one inference step), from a Scenario.

`estimate` finds the peak of each pipeline stage's timeline (calc.memory.train_timeline, calc.memory.timeline)
asking its runs of layers only at their pieces' ends, and builds the Estimate (calc.memory.result) with its
breakdown (calc.memory.breakdown), device total (calc.memory.overhead) and verdict (calc.memory.verdict);
`reference_estimate` lists every moment instead, and the tests compare the two.

Three memos (calc.memo), each keyed by value: whole estimates; and, per scenario without its batch shape, the
model states of each pipeline stage and the blocks' context (a new shape copies it). `clear_memo` clears them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import Any, Literal, NamedTuple

from calc.contract import parallel
from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.multimodal import model_note
from calc.contract.presets import Architecture, gpu_presets
from calc.contract.scenario import HardwareConfig, InferenceConfig, LoraConfig, Mode, Scenario, TrainingConfig
from calc.memo import Memo
from calc.memory.activations import Target, block_context
from calc.memory.breakdown import peak_components
from calc.memory.fsdp2 import fsdp2_states
from calc.memory.generate import static_cache_compile_note
from calc.memory.host import host_memory
from calc.memory.inference_weights import inference_scenario, quantized, quantized_states
from calc.memory.offload import activation_offload_parts
from calc.memory.overhead import cublas_workspace_bytes, device_total
from calc.memory.result import Estimate, Timeline, make_estimate
from calc.memory.states import States, inference_states, model_states, param_count
from calc.memory.timeline import StepTimeline, TimelineRow, inference_timeline
from calc.memory.train_timeline import train_timeline
from calc.memory.verdict import gpu_headroom, verdict_data
from calc.sim.layers import Ctx
from calc.sim.profiles import forget_recordings, forget_shapes

Sharder = Literal["deepspeed", "fsdp2", "torch"]

MEMO_ENTRIES = 1024
_estimates: Memo[tuple, Estimate] = Memo("estimates", MEMO_ENTRIES)
_states: Memo[tuple, States] = Memo("model states per shape-free scenario and stage", MEMO_ENTRIES)
_contexts: Memo[tuple, Ctx] = Memo("block contexts per shape-free scenario", MEMO_ENTRIES)

# A scenario's fields as values, read from each model's fields (its JSON cost 5 us, more than a memo hit; a
# generator over the fields 1.2 us against 0.4): the batch shape apart, and the LoRA settings (a model that is
# not hashable) as their own tuple
SHAPE_FIELDS = ("micro_batch_size", "seq_len")
_hardware_values = itemgetter(*HardwareConfig.model_fields)
_training_values = itemgetter(*(f for f in TrainingConfig.model_fields if f not in (*SHAPE_FIELDS, "lora")))
_lora_values = itemgetter(*LoraConfig.model_fields)
_inference_values = itemgetter(*InferenceConfig.model_fields)


def shape_free_values(sc: Scenario) -> tuple:
    """Every field of `sc` but the batch shape, as hashable values (a config.json model by its JSON): two
    scenarios have equal values exactly when they are equal but for the shape (each field has one type)."""
    t = sc.training
    model = sc.model if isinstance(sc.model, str) else sc.model_dump_json(include={"model"})
    return (model, _hardware_values(sc.hardware.__dict__), sc.mode, _training_values(t.__dict__),
            None if t.lora is None else _lora_values(t.lora.__dict__), _inference_values(sc.inference.__dict__))


class GpuFacts(NamedTuple):
    """What an estimate reads of its GPU preset."""

    architecture: Architecture  # decides the cuBLAS workspaces
    memory_bytes: int


def gpu_facts(hw: HardwareConfig) -> GpuFacts | None:
    """The facts of the hardware's GPU preset, as the presets hold them now; None without a preset."""
    gpu = gpu_presets().get(hw.gpu) if hw.gpu else None
    return GpuFacts(gpu.architecture, gpu.memory_bytes) if gpu else None


def shape_free_key(sc: Scenario, hw: HardwareConfig, gpu: GpuFacts | None, target: Target,
                   sharding: Sharder | None) -> tuple:
    """What an estimate depends on besides the batch shape, by value: the scenario's fields, the preset model's
    architecture (a reloaded preset may differ; a config.json model is its JSON), the hardware with a cluster
    preset expanded (where it is not the scenario's own), what it reads of the GPU preset, the target and the
    sharding."""
    spec_value = sc.spec.value_key if isinstance(sc.model, str) else None
    resolved = None if hw is sc.hardware else _hardware_values(hw.__dict__)
    return spec_value, shape_free_values(sc), resolved, gpu, target, sharding


def estimate(sc: Scenario, target: Target = "cuda", sharding: Sharder | None = None) -> Estimate:
    """Predict per-GPU memory for `sc`. target="cpu" predicts a CPU run of the same workload
    (dropout noise tensors instead of masks, no CUDA workspaces). `sharding` overrides the
    scenario's training.sharding: "fsdp2" models PyTorch FSDP2 (fully_shard per layer) instead of
    DeepSpeed ZeRO for zero_stage 2/3 with several GPUs.

    A repeated scenario (an equal one, not only the same object) returns the same Estimate object (a
    bounded memo keyed by value: the scenario's fields, the presets it reads): treat it as read-only."""
    hw = sc.resolved_hardware()
    gpu = gpu_facts(hw)
    shape_free = shape_free_key(sc, hw, gpu, target, sharding)
    t = sc.training
    return _estimates.get((shape_free, t.micro_batch_size, t.seq_len),
                          lambda: _estimate(sc, hw, gpu, target, sharding, shape_free=shape_free))


def reference_estimate(sc: Scenario, target: Target = "cuda", sharding: Sharder | None = None) -> Estimate:
    """estimate() the long way (no memo): every moment of the timeline listed and the peak taken as the
    largest of them, where estimate() asks each run of identical layers only at its ends. The tests
    check that both give the same bytes."""
    hw = sc.resolved_hardware()
    return _estimate(sc, hw, gpu_facts(hw), target, sharding, reference=True)


def clear_memo(profiles: bool = True, shape_free: bool = False) -> None:
    """Forget memoized estimates and, unless profiles=False, the block profiles cached per shape (benchmarks of
    new shapes; profiles=False: a new parallel layout of a shape seen before, as a search asks); shape_free=True
    also forgets what is kept per shape-free scenario: the blocks recorded per context (calc.sim.profiles), the
    model states and the blocks' contexts (a model and options never seen)."""
    _estimates.clear()
    if shape_free:
        forget_recordings()
        _states.clear()
        _contexts.clear()
    if profiles:
        forget_shapes()


class StagePeak:
    """A pipeline stage's peak row, its model states and how to list its whole timeline."""

    __slots__ = ("row", "states", "listing")

    def __init__(self, row: TimelineRow, states: States, listing: Callable[[], Timeline]) -> None:
        self.row, self.states, self.listing = row, states, listing


def _estimate(sc: Scenario, hw: HardwareConfig, gpu: GpuFacts | None, target: Target, sharding: Sharder | None,
              reference: bool = False, shape_free: tuple | None = None) -> Estimate:
    """The estimate of `sc` on `hw` (`gpu`: its preset's facts), the peak over its pipeline stages (the first and the
    last; the layers between repeat the first's); `shape_free`: the memos' key of the states and the context
    (None: not memoized)."""
    if sc.mode == Mode.serve:  # a serving engine budgets its memory itself: calc.serve plans it
        raise UserError(T_("mode serve is planned by the serving planner (python -m calc serve, the Serve page), "
                           "not by the per-step estimate"))
    sharding = sharding or sc.training.sharding
    sc = inference_scenario(sc)  # inference.weights: plain weights in their dtype, quantized ones with 16-bit compute
    t, spec = sc.training, sc.spec
    pp = t.pipeline_parallel
    layers = parallel.layers_on_stage(spec.num_layers, pp)
    training = sc.mode == Mode.train
    workspace_bytes = cublas_workspace_bytes(gpu.architecture if gpu else None, training) if target == "cuda" else 0
    fsdp = sharding == "fsdp2" and training and sc.data_parallel > 1 and t.zero_stage in (2, 3)
    ctx = _shaped_context(shape_free, sc, target, fsdp)
    best: StagePeak | None = None
    for first, last in [(True, pp == 1)] if pp == 1 else [(True, False), (False, True)]:
        def make_states(first: bool = first, last: bool = last) -> States:
            st = fsdp2_states(sc) if fsdp else model_states(sc, layers, first, last, target, sharding == "deepspeed")
            return quantized_states(sc, st, layers, first) if quantized(sc) else st

        st = make_states() if shape_free is None else _states.get((shape_free, first, last), make_states)
        stage = _stage_peak(sc, st, ctx, layers, first, last, workspace_bytes, training, reference)
        if best is None or stage.row.total > best.row.total:
            best = stage
    assert best is not None
    host_parts = best.states.host_parts + activation_offload_parts(sc, ctx, layers)
    return make_estimate(_estimate_fields(sc, hw, gpu, best.row, best.states, host_parts, layers, training, target),
                         partial(peak_components, sc, best.states, best.row, workspace_bytes), best.listing)


def _shaped_context(shape_free: tuple | None, sc: Scenario, target: Target, fsdp: bool) -> Ctx:
    """block_context(sc, target, fsdp), its shape-free fields memoized on `shape_free` (fsdp follows from the
    key's scenario and sharding): a new shape copies them."""
    if shape_free is None:
        return block_context(sc, target, fsdp)
    ctx = _contexts.get(shape_free, lambda: block_context(sc, target, fsdp))
    shape = sc.training.micro_batch_size, sc.training.seq_len
    return ctx if (ctx.batch, ctx.seq) == shape else ctx.with_shape(*shape)


def _stage_peak(sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool, workspace_bytes: int,
                training: bool, reference: bool) -> StagePeak:
    """The stage's peak: at its runs' pieces' ends, or (`reference`) the largest of every listed moment."""
    tl = (train_timeline(sc, st, ctx, layers, first, last, workspace_bytes, reference) if training
          else inference_timeline(sc, inference_states(st), ctx, layers, workspace_bytes, reference))
    if not reference:
        _, row = tl.peak()
        return StagePeak(row, st, partial(listed_timeline, sc, st, ctx, layers, first, last, workspace_bytes, training))
    full = tl.build()
    i = full.peak_index
    row = TimelineRow(full.events[i], full.phases[i], full.parameters[i], full.gradients[i],
                      full.optimizer_states[i], full.activations[i], full.other[i])
    return StagePeak(row, st, lambda: full)


def listed_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool, workspace_bytes: int,
                    training: bool) -> Timeline:
    """Every moment of the stage's timeline, listed again from its inputs when a chart asks for it. An
    estimate keeps these inputs, not the timeline it found the peak in: that one's per-layer closures and
    sums would outlive the estimate in every memo entry, and the cyclic collector would scan them over and
    over (a fifth of a new shape's estimate); few estimates are ever drawn."""
    tl: StepTimeline = (train_timeline(sc, st, ctx, layers, first, last, workspace_bytes) if training
                        else inference_timeline(sc, inference_states(st), ctx, layers, workspace_bytes))
    return tl.build()


def _estimate_fields(sc: Scenario, hw: HardwareConfig, gpu: GpuFacts | None, row: TimelineRow, st: States,
                     host_parts: list, layers: int, training: bool, target: Target) -> dict[str, Any]:
    """The Estimate's fields (calc.memory.result.make_estimate) from the peak's row and the stage's states."""
    spec, peak = sc.spec, row.total
    device = device_total(peak, hw.num_gpus, st.paged_optimizer if training else 0)
    mem = hw.memory_bytes or (gpu.memory_bytes if gpu else None)
    step = 1 if (row.phase == "optimizer" or st.optimizer == 0 or not training) else 2
    per_node = hw.gpus_in_node()
    # offload: the host must also hold the model while it is loaded, before DeepSpeed moves it
    host_mem = host_memory(host_parts, st.load_host, per_node, target)
    cpu_ram, nvme = host_mem.ram_per_node_bytes, host_mem.nvme_per_node_bytes
    verdict = verdict_data(device["expected"], mem, cpu_ram, hw.cpu_ram_bytes, nvme, hw.nvme_bytes)
    return {
        "model": {"name": spec.name or spec.family, "family": spec.family,
                  "total_params": param_count(spec, "total_params"),
                  "trainable_params": st.trainable if training else 0, "params_on_this_gpu": st.params_local,
                  "num_layers": spec.num_layers, "layers_on_this_gpu": layers},
        "peak_allocated_bytes": peak, "peak_phase": row.phase, "peak_event": row.event, "peak_step": step,
        "breakdown": {"parameters": row.parameters, "gradients": row.gradients,
                      "optimizer_states": row.optimizer_states, "activations": row.activations, "other": row.other},
        "device_total_bytes": device, "gpu_memory_bytes": mem, "fits": verdict["fits"],
        "headroom_bytes": gpu_headroom(verdict), "cpu_ram_bytes": cpu_ram, "nvme_bytes": nvme, "host_memory": host_mem,
        "verdict": verdict,
        "notes": [str(note) for note in (sc.quantization_note(), model_note(spec), static_cache_compile_note(sc, target))
                  if note is not None],
    }

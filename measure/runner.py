"""Run the reference workload of one scenario on one device and return its MeasurementRecord."""

from __future__ import annotations

import contextlib
import gc
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from calc.contract.record import Categories, Env, MeasurementRecord, PhasePeaks, Sharding, utc_now
from calc.contract.scenario import Scenario
from measure.trackers import PHASES, CudaTracker, PhaseMemTracker
from measure.workload import (
    UnsupportedError,
    Workload,
    build_workload,
    prepare_optimizer,
    quantization_state_tensors,
    run_steps,
)

CUDA_BLOCK_BYTES = 512  # the caching allocator rounds every block up to 512 bytes


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: str) -> Env:
    import transformers

    try:
        import peft

        peft_version: str | None = peft.__version__
    except ImportError:
        peft_version = None
    name, driver, cuda = cpu_name(), None, None
    if device == "cuda":
        name = torch.cuda.get_device_name()
        cuda = torch.version.cuda
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    return Env(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
               peft=peft_version, device_name=name, driver=driver, cuda=cuda)


def unique_storage_bytes(tensors: Any, round_to: int = 1) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights once), each rounded up to `round_to`."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        st = t.untyped_storage()
        key = st._cdata  # the StorageImpl's address: also defined for fake tensors
        if key in seen:
            continue
        seen.add(key)
        total += -(-st.nbytes() // round_to) * round_to
    return total


def measure_on_cuda(w: Workload, dev: torch.device, steps: int, baseline: int) -> dict[str, Any]:
    """Run the steps on the GPU and read the caching allocator. The numbers are raw, as a user's
    torch.cuda.max_memory_allocated() shows them: they include the cuBLAS workspace the warm-up
    created (`baseline`), which the calculator also predicts."""
    tracker = CudaTracker(dev)
    prepare_optimizer(w, tracker)
    out: dict[str, Any] = {"initial_allocated_bytes": torch.cuda.memory_allocated(dev)}
    run_steps(w, tracker, steps)
    free, total = torch.cuda.mem_get_info(dev)
    out.update(phase=dict(tracker.phase_peak), steps_phase=[dict(s) for s in tracker.step_peaks],
               peak_reserved_bytes=max(tracker.phase_peak_reserved.values()), device_used_bytes=total - free,
               num_alloc_retries=int(torch.cuda.memory_stats(dev).get("num_alloc_retries", 0)),
               baseline_allocated_bytes=baseline, categories=None)
    return out


def memtracker_fields(mt: Any) -> dict[str, Any]:
    """The record fields a finished PhaseMemTracker run yields: per-phase and per-step peaks and the
    categories (and raw MemTracker snapshot) at the peak phase."""
    phase = peak_phase(mt.phase_peak)
    return {"phase": dict(mt.phase_peak), "steps_phase": list(mt.step_peaks),
            "categories": mt.phase_peak_categories[phase], "categories_by_phase": dict(mt.phase_peak_categories),
            "raw": mt.phase_peak_raw[phase], "raw_by_phase": dict(mt.phase_peak_raw),
            "memtracker_peak_bytes": mt.peak_total()}


def weights_bytes(w: Workload) -> int:
    round_to = CUDA_BLOCK_BYTES if w.device.type == "cuda" else 1
    tensors = list(w.model.parameters()) + list(w.model.buffers()) + quantization_state_tensors(w.model)
    return unique_storage_bytes(tensors, round_to)


def optimizer_state_bytes(w: Workload) -> int | None:
    if w.optimizer is None:
        return None
    round_to = CUDA_BLOCK_BYTES if w.device.type == "cuda" else 1
    tensors = [v for state in w.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return unique_storage_bytes(tensors, round_to)


def _phase_peaks(d: dict[str, int]) -> PhasePeaks:
    return PhasePeaks(**{k: v for k, v in d.items() if k in PHASES})


def peak_phase(phase_peak: dict[str, int]) -> str:
    return max(PHASES, key=lambda p: phase_peak.get(p, -1))  # ties: the earliest phase


def workload_notes(w: Workload, device: str) -> list[str]:
    """What a reader of the record must know about how this workload was measured."""
    notes = []
    t = w.scenario.training
    if device in ("cpu", "fake"):
        notes.append("peak = MemTracker's live tensor bytes (no 512-byte rounding, no allocator cache, no "
                     "kernel-internal workspaces); CPU kernels: CPU autocast op lists and CPU SDPA")
    if w.masters is not None:
        notes.append("fp32 master copies are filed under optimizer_states; master grads under gradients")
    if t.lora is not None:
        quant = " (bitsandbytes; its quantization state counted as parameters)" if t.lora.quantized else ""
        notes.append(f"LoRA: base weights {t.lora.base_weights} frozen{quant}; adapters "
                     + ("16-bit" if w.plan.weights != torch.float32 and t.precision.value != "fp32" else "fp32"))
    if t.optimizer.paged and w.device.type != "cuda":
        notes.append(f"{t.optimizer.value} off CUDA: bitsandbytes keeps the states in ordinary tensors")
    if w.fake and w.scaler is not None:
        notes.append("fake: GradScaler.step replaced by unscale_ + step (found_inf needs .item())")
    return notes


def _measure_once(scenario: Scenario, device: str, steps: int, num_layers: int | None) -> dict[str, Any]:
    """One run; returns the record fields (without env / timing)."""
    gc.collect()
    fake = device == "fake"
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    fake_ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from measure.workload import fake_mode_patches

        fake_ctx = contextlib.ExitStack()
        fake_ctx.enter_context(fake_mode_patches())
        fake_ctx.enter_context(FakeTensorMode())
    out: dict[str, Any] = {}
    with fake_ctx:
        if device == "cuda":
            if not torch.cuda.is_available():
                raise UnsupportedError("--device cuda: no CUDA device is available")
            torch.cuda.empty_cache()
            warm_up_cuda(dev)
            baseline = torch.cuda.memory_allocated(dev)
            w = build_workload(scenario, dev, num_layers=num_layers)
            out["weights_bytes"] = weights_bytes(w)
            out.update(measure_on_cuda(w, dev, steps, baseline))
            out["peak_allocated_bytes"] = max(out["phase"].values())
        else:
            w = build_workload(scenario, dev, num_layers=num_layers, fake=fake)
            mt = PhaseMemTracker()
            mt.track_external(w.model, w.input_ids)
            mt.track_parameters(*quantization_state_tensors(w.model))
            with mt:
                prepare_optimizer(w, mt)
                out["weights_bytes"] = weights_bytes(w)
                out["initial_allocated_bytes"] = mt.current_total()
                run_steps(w, mt, steps)
            out.update(memtracker_fields(mt))
            out["peak_allocated_bytes"] = mt.phase_peak[peak_phase(mt.phase_peak)]
        out["optimizer_state_bytes"] = optimizer_state_bytes(w)
        out["num_params"] = sum(p.numel() for p in w.model.parameters())
        out["trainable_params"] = sum(p.numel() for p in w.model.parameters() if p.requires_grad)
        out["notes"] = workload_notes(w, device)
        w.release()
        del w
    gc.collect()
    return out


def warm_up_cuda(dev: torch.device) -> None:
    """Allocate the cuBLAS / cuBLASLt workspaces once (fp32 and bf16 GEMMs) so every run starts alike."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.ones(64, 64, device=dev, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()
    torch.cuda.synchronize(dev)


def measurement_record(scenario: Scenario, device: str, steps: int, raw: dict[str, Any], started: float,
                       name: str | None, layers: list[int] | None, engine: str = "torch-single",
                       sharding: Sharding | None = None) -> MeasurementRecord:
    """The record of a run from its raw fields (measure_once's, or a sharded or DeepSpeed run's)."""
    phase = peak_phase(raw["phase"])
    notes = list(raw["notes"])
    if raw.get("baseline_allocated_bytes"):
        notes.append(f"raw allocator bytes: they include {raw['baseline_allocated_bytes']} allocated before the "
                     "model was built (the cuBLAS workspace of a warm-up GEMM)")
    mt_peak = raw.get("memtracker_peak_bytes")
    if mt_peak is not None and mt_peak != raw["peak_allocated_bytes"]:
        notes.append(f"MemTracker's own global peak {mt_peak} differs from the largest phase peak")
    return MeasurementRecord(
        name=name,
        scenario=scenario,
        device=device,  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        sharding=sharding,
        env=environment(device),
        peak_allocated_bytes=raw["peak_allocated_bytes"],
        peak_reserved_bytes=raw.get("peak_reserved_bytes"),
        device_used_bytes=raw.get("device_used_bytes"),
        num_alloc_retries=raw.get("num_alloc_retries"),
        peak_phase=phase,  # type: ignore[arg-type]
        phase_peaks_bytes=_phase_peaks(raw["phase"]),
        step_phase_peaks_bytes=[_phase_peaks(s) for s in raw["steps_phase"]],
        categories_at_peak_bytes=Categories(**raw["categories"]) if raw["categories"] else None,
        raw_categories_at_peak_bytes=raw.get("raw"),
        weights_bytes=raw["weights_bytes"],
        initial_allocated_bytes=raw["initial_allocated_bytes"],
        optimizer_state_bytes=raw["optimizer_state_bytes"],
        baseline_allocated_bytes=raw.get("baseline_allocated_bytes"),
        num_params=raw["num_params"],
        trainable_params=raw["trainable_params"],
        steps=steps,
        extrapolated_from_layers=layers,
        notes=notes,
        measured_at=utc_now(),
        wall_seconds=round(time.perf_counter() - started, 3),
    )


# ---- linear extrapolation in the layer count (fake mode) ------------------------------------------

def layer_period(scenario: Scenario) -> int:
    """Layers repeat with this period: the lcm of checkpoint_every (full checkpointing) and the model's
    attention pattern (2 for gemma2's alternating local / global layers, Gemma 3's layer_types)."""
    t = scenario.training
    period = t.checkpoint_every if t.activation_checkpointing.value == "full" else 1
    kinds = scenario.spec.layer_period
    return period * kinds // _gcd(period, kinds)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


MIN_EXTRAPOLATION_LAYERS = 3  # shorter models still change which event is the peak (c checks the rest)


def extrapolation_layers(scenario: Scenario) -> tuple[int, int, int]:
    """Three short depths a < b < c, a period apart, with (L - a) a multiple of the period.

    a and b give the line; c checks it (the extrapolation to c must equal the run at c)."""
    period = layer_period(scenario)
    total = scenario.spec.num_layers
    a = period + total % period
    while a < MIN_EXTRAPOLATION_LAYERS:
        a += period
    return a, a + period, a + 2 * period


def _lin(va: int | None, vb: int | None, k: int) -> int | None:
    if va is None or vb is None:
        return None
    return va + k * (vb - va)


def extrapolate(ra: dict[str, Any], rb: dict[str, Any], k: int) -> dict[str, Any]:
    """Per quantity: value(L) = value(a) + k * (value(b) - value(a)), k = (L - a) / (b - a).

    Phase peaks are extrapolated one phase at a time and the peak is their maximum, so a peak that moves
    from the optimizer step to the backward pass as layers are added is still found. The categories are
    those of the winning phase, extrapolated the same way (they still sum to the peak).
    """
    out = dict(ra)
    out["phase"] = {p: _lin(ra["phase"][p], rb["phase"][p], k) for p in ra["phase"]}
    out["steps_phase"] = [{p: _lin(sa[p], sb[p], k) for p in sa} for sa, sb in zip(ra["steps_phase"], rb["steps_phase"],
                                                                               strict=True)]
    phase = peak_phase(out["phase"])
    out["peak_allocated_bytes"] = out["phase"][phase]
    for key in ("weights_bytes", "initial_allocated_bytes", "optimizer_state_bytes", "num_params", "trainable_params"):
        out[key] = _lin(ra[key], rb[key], k)
    if ra.get("categories_by_phase") and rb.get("categories_by_phase"):
        ca, cb = ra["categories_by_phase"][phase], rb["categories_by_phase"][phase]
        out["categories"] = {c: _lin(ca[c], cb[c], k) for c in ca}
        ca, cb = ra["raw_by_phase"][phase], rb["raw_by_phase"][phase]
        out["raw"] = {c: _lin(ca[c], cb[c], k) for c in ca}
    out.pop("memtracker_peak_bytes", None)
    return out


def measure_single(scenario: Scenario, device: str, steps: int = 3, name: str | None = None,
                   num_layers: int | None = None, extrapolate_layers: bool = False) -> MeasurementRecord:
    """Measure a one-GPU `scenario` on `device` (measure.entry.measure dispatches here)."""
    _check_single(scenario)
    return measure_depths(_measure_once, scenario, device, steps, name, num_layers, extrapolate_layers)


def _comparable(raw: dict[str, Any]) -> tuple[Any, ...]:
    return (raw["phase"], raw["steps_phase"], raw.get("raw"), raw["weights_bytes"], raw["optimizer_state_bytes"])


Once = Callable[[Scenario, str, int, int | None], dict[str, Any]]  # one run at a depth: its raw fields


def measure_depths(once: Once, scenario: Scenario, device: str, steps: int, name: str | None,
                   num_layers: int | None, extrapolate_layers: bool, engine: str = "torch-single",
                   sharding: Sharding | None = None) -> MeasurementRecord:
    """Run `once` at full depth, or (extrapolate_layers) at depths a, b, c and extrapolate from a and b
    when that reproduces c exactly; otherwise fall back to full depth and say so in the notes."""
    started = time.perf_counter()
    total_layers = scenario.spec.num_layers
    a, b, c = extrapolation_layers(scenario)
    note = None
    if extrapolate_layers and num_layers is None and total_layers > c:
        ra, rb, rc = (once(scenario, device, steps, n) for n in (a, b, c))
        check = extrapolate(ra, rb, (c - a) // (b - a))
        if _comparable(check) == _comparable(rc):
            raw = extrapolate(ra, rb, (total_layers - a) // (b - a))
            raw["notes"] = raw["notes"] + [f"linear extrapolation from {a} and {b} layers to {total_layers}, "
                                           f"phase by phase; it reproduces the run at {c} layers exactly"]
            return measurement_record(scenario, device, steps, raw, started, name, [a, b, c], engine=engine,
                                      sharding=sharding)
        note = f"extrapolation from {a} and {b} layers did not reproduce {c} layers: measured at full depth"
    raw = once(scenario, device, steps, num_layers)
    if num_layers is not None and num_layers != total_layers:
        raw["notes"].append(f"measured with {num_layers} of the model's {total_layers} layers")
    if note:
        raw["notes"].append(note)
    return measurement_record(scenario, device, steps, raw, started, name, None, engine=engine, sharding=sharding)


def _check_single(scenario: Scenario) -> None:
    t = scenario.training
    if t.zero_stage:
        raise UnsupportedError("zero_stage > 0 needs hardware.num_gpus > 1 (sharded runs)")
    for what, value in (("tensor_parallel", t.tensor_parallel), ("pipeline_parallel", t.pipeline_parallel)):
        if value != 1:
            raise UnsupportedError(f"{what}={value} is not measured (single-device reference workload)")
    if t.offload_optimizer.value != "none" or t.offload_params.value != "none":
        raise UnsupportedError("offload is not measured (single-device reference workload)")

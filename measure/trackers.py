"""Where the bytes are counted: the CUDA caching allocator, or torch's MemTracker (cpu and fake).

Both trackers offer the interface the step calls (measure.workload.NullTracker):
  phase(name)     forward / backward / optimizer: the peak inside each phase is kept, per step too;
  category(name)  MemTracker only: tensors created inside are filed under that category;
  step_done()     end of one optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType

# MemTracker's reference types -> the record's category names (calc.contract.record.Categories).
CATEGORY_OF: dict[_MemRefType, str] = {
    _MemRefType.PARAM: "parameters",
    _MemRefType.BUFFER: "buffers",
    _MemRefType.GRAD: "gradients",
    _MemRefType.ACT: "activations",
    _MemRefType.TEMP: "temporaries",
    _MemRefType.OPT: "optimizer_states",
    _MemRefType.OTH: "inputs",  # track_external(tensor): the input_ids
}
REFTYPE_OF = {name: ref for ref, name in CATEGORY_OF.items()}
PHASES = ("forward", "backward", "optimizer")


class _NoHook:
    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


class _PhaseMixin:
    def _init_phases(self) -> None:
        self.current_phase: str | None = None
        self.phase_peak: dict[str, int] = {}
        self.step_peaks: list[dict[str, int]] = []
        self._step_peak: dict[str, int] = {}

    def _note(self, total: int) -> bool:
        """Record `total` for the current phase; True when it is a new peak of that phase."""
        ph = self.current_phase
        if ph is None:
            return False
        if total > self._step_peak.get(ph, -1):
            self._step_peak[ph] = total
        if total > self.phase_peak.get(ph, -1):
            self.phase_peak[ph] = total
            return True
        return False

    def step_done(self) -> None:
        self.step_peaks.append(self._step_peak)
        self._step_peak = {}


class _MemTrackerPhases(_PhaseMixin):
    """Per-phase peaks and forced categories for torch's MemTracker and FSDPMemTracker.

    MemTracker counts every tensor storage created by an op inside its context (a TorchDispatchMode),
    drops it when the storage is freed (a weakref callback), and updates its peak after every op. We
    hook that same update (`_update_peak_stats`) so the phase peaks are taken at exactly the points
    where MemTracker takes its own peak. Works on real cpu tensors and on fake tensors.
    Overridden private methods are those of torch 2.13 (measure/requirements.txt pins torch).
    """

    CATEGORY_OF: dict[Any, str] = {}  # MemTracker reference type -> record category
    FORCE: dict[str, Any] = {}  # category(name) -> the reference type new tensors get

    # attributes that MemTracker.__init__ sets
    _curr_mem_snap: dict[torch.device, dict[Any, int]]
    _peak_mem: dict[torch.device, int]
    _peak_mem_snap: dict[torch.device, dict[Any, int]]
    _param_to_grad_hook_handles: Any

    def _init_tracking(self) -> None:
        self._init_phases()
        self.phase_peak_categories: dict[str, dict[str, int]] = {}
        self.phase_peak_raw: dict[str, dict[str, int]] = {}
        self._forced: Any = None
        self._grad_hook_handles: list[Any] = []
        self._unpatch: Any = None

    # MemTracker's ModTracker puts a multi-grad hook on every module input and output that requires
    # grad. The hook's closure holds the tensors' autograd nodes and the hook is stored on those
    # nodes: a cycle through C++ that Python's GC cannot collect, so each step's graph stays alive.
    # That costs nothing until the graph reaches a leaf that is not a parameter (the embedding output
    # that peft's enable_input_require_grads makes require grad under gradient checkpointing): its
    # AccumulateGrad node then keeps the leaf and its .grad, +2 x B x S x H bytes per step. A run
    # without the tracker has no such hook, so the hooks are removed once each step is done.
    def __enter__(self) -> Any:
        import torch.distributed._tools.mod_tracker as mod_tracker

        original = mod_tracker.register_multi_grad_hook

        def recording(*args: Any, **kwargs: Any) -> Any:
            handle = original(*args, **kwargs)
            self._grad_hook_handles.append(handle)
            return handle

        mod_tracker.register_multi_grad_hook = recording
        self._unpatch = lambda: setattr(mod_tracker, "register_multi_grad_hook", original)
        return super().__enter__()  # type: ignore[misc]

    def __exit__(self, *args: Any) -> Any:
        try:
            return super().__exit__(*args)  # type: ignore[misc]
        finally:
            self._unpatch()

    def step_done(self) -> None:
        for handle in self._grad_hook_handles:
            handle.remove()
        self._grad_hook_handles.clear()
        super().step_done()  # type: ignore[misc]

    def _track(self, reftype: Any, t: torch.Tensor) -> None:
        super()._track(self._forced if self._forced is not None else reftype, t)  # type: ignore[misc]

    def _update_peak_stats(self, peak_state: Any) -> None:
        # MemTracker's own version also keeps a per-module peak snapshot, walking every module it has
        # seen after every op (half the run time of a large model); we keep only its global part.
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)
        self._note_now()

    def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> tuple[int, int]:
        # MemTracker registers a grad hook on every parameter, which torch refuses for frozen ones (LoRA's
        # base weights): mark those as already hooked.
        for p in module.parameters():
            if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                self._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
        return super()._track_module_params_and_buffers(module, install_grad_hooks)  # type: ignore[misc]

    # -- our interface --
    def track_parameters(self, *tensors: torch.Tensor) -> None:
        """Count tensors made before tracking began as parameters: bitsandbytes keeps a quantized weight's
        state (absmax, scales) in plain attributes, which MemTracker's walk over parameters and buffers misses."""
        for t in tensors:
            self._update_and_maybe_create_winfos(t, _MemRefType.PARAM)  # type: ignore[attr-defined]

    def _real_snaps(self, snaps: dict[Any, Any]) -> list[Any]:
        # MemTracker sizes every tensor it sees, meta-device ones too; those hold no memory (DeepSpeed
        # ZeRO-1/2 keep a meta copy of every parameter's shape, stage_1_and_2.py round_robin_bit16_meta)
        return [snap for dev, snap in snaps.items() if torch.device(dev).type != "meta"]

    def current_total(self) -> int:
        return sum(snap[_TOTAL_KEY] for snap in self._real_snaps(self._curr_mem_snap))

    def current_categories(self) -> dict[str, int]:
        out = dict.fromkeys(dict.fromkeys(self.CATEGORY_OF.values()), 0)
        for snap in self._real_snaps(self._curr_mem_snap):
            for ref, name in self.CATEGORY_OF.items():
                out[name] += snap.get(ref, 0)
        return out

    def current_raw(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for snap in self._real_snaps(self._curr_mem_snap):
            for ref, v in snap.items():
                if ref != _TOTAL_KEY:
                    out[ref.value] = out.get(ref.value, 0) + v
        return out

    def _note_now(self) -> None:
        if self._note(self.current_total()):
            self.phase_peak_categories[self.current_phase] = self.current_categories()  # type: ignore[index]
            self.phase_peak_raw[self.current_phase] = self.current_raw()  # type: ignore[index]

    def peak_total(self) -> int:
        return sum(snap[_TOTAL_KEY] for snap in self._real_snaps(self._peak_mem_snap))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "forward":
            # MemTracker refuses a second call of the root module unless the module stats are reset
            # (its docs: once per iteration); every backward has finished when a forward begins.
            self.reset_mod_stats()  # type: ignore[attr-defined]
        self.current_phase = name
        self._note_now()  # what is live when the phase begins counts for the phase
        try:
            yield
        finally:
            self.current_phase = None

    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        old, self._forced = self._forced, self.FORCE[name]
        try:
            yield
        finally:
            self._forced = old


class PhaseMemTracker(_MemTrackerPhases, MemTracker):
    """torch.distributed._tools.mem_tracker.MemTracker with phase peaks (single device)."""

    CATEGORY_OF = CATEGORY_OF
    FORCE = {"optimizer_states": _MemRefType.OPT, "gradients": _MemRefType.GRAD}

    def __init__(self) -> None:
        super().__init__()
        self._init_tracking()


def fsdp_tracker(model: Any, optimizer: Any) -> Any:
    """FSDPMemTracker (FSDP2: sharded / unsharded params and grads, all-gather and reduce-scatter buffers)
    with phase peaks."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType

    class PhaseFSDPMemTracker(_MemTrackerPhases, FSDPMemTracker):
        CATEGORY_OF = {
            _FSDPRefType.SHARDED_PARAM: "parameters",
            _FSDPRefType.UNSHARDED_PARAM: "parameters",
            _FSDPRefType.BUFFER: "buffers",
            _FSDPRefType.SHARDED_GRAD: "gradients",
            _FSDPRefType.UNSHARDED_GRAD: "gradients",
            _FSDPRefType.ACT: "activations",
            _FSDPRefType.TEMP: "temporaries",
            _FSDPRefType.ALL_GATHER: "temporaries",
            _FSDPRefType.REDUCE_SCATTER: "temporaries",
            _FSDPRefType.OPT: "optimizer_states",
            _FSDPRefType.INP: "inputs",
        }
        FORCE = {"optimizer_states": _FSDPRefType.OPT, "gradients": _FSDPRefType.SHARDED_GRAD}

        def __init__(self) -> None:
            super().__init__(model, optimizer)
            self._init_tracking()

    return PhaseFSDPMemTracker()


class CudaTracker(_PhaseMixin):
    """Phase peaks from the caching allocator: reset_peak_memory_stats() at each phase start,
    max_memory_allocated() at its end. Categories are not known on cuda."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._init_phases()
        self.phase_peak_reserved: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.current_phase = name
        try:
            yield
        finally:
            torch.cuda.synchronize(self.device)
            self._note(torch.cuda.max_memory_allocated(self.device))
            reserved = torch.cuda.max_memory_reserved(self.device)
            self.phase_peak_reserved[name] = max(self.phase_peak_reserved.get(name, 0), reserved)
            self.current_phase = None

    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        yield

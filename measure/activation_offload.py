"""torchtune's activation offloading (training/_activation_offloading.py OffloadActivations) as its memory behaves,
for the reference loop (measure.workload): saved tensors copied to the host in forward, back in backward."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """torchtune's OffloadActivations (training/_activation_offloading.py) with its defaults (use_streams,
    min_offload_size 1024 bytes, max_fwd_stash_size 5), as its memory behaves, on any device:

    pack: a saved tensor of at least 1024 bytes that is not a Parameter or Buffer is copied to the host; its device
    tensor stays referenced in a forward stash until a tensor 5 packs later is offloaded (the copy stream's
    overlap), and the first backward node that unpacks an offloaded tensor drops the whole stash (its hook).
    unpack: a tensor still in the stash is used as it is; any other is copied back to the device and kept in a
    backward stash until the hook of the next node that unpacks one, unless something else holds it by then.

    The host copies are made where the tracker cannot see them (on the CPU the "device" is the host too) and
    counted in `host_bytes` / `peak_host_bytes`; fake tensors cannot be copied outside the fake mode."""

    MIN_BYTES, STASH = 1024, 5

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.backward_started = False
        self.host: dict[int, tuple[torch.Tensor, bool]] = {}  # pack id -> (host copy, True) or (tensor, False)
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.bwd_stash: dict[int, torch.Tensor] = {}
        self.last_id = 0
        self.node: Any = None
        self.host_bytes = self.peak_host_bytes = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> int:
        from torch.utils._python_dispatch import _disable_current_modes

        self.last_id += 1
        self.backward_started = False
        i, nbytes = self.last_id, t.element_size() * t.nelement()
        if nbytes < self.MIN_BYTES or isinstance(t, (nn.Parameter, nn.Buffer)):
            self.host[i] = (t, False)
            return i
        for old in [k for k in self.fwd_stash if k <= i - self.STASH]:
            del self.fwd_stash[old]
        with _disable_current_modes(), torch.no_grad():
            self.host[i] = (t.detach().to("cpu", copy=True), True)
        self.fwd_stash[i] = t
        self.host_bytes += nbytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
        return i

    def _unpack(self, i: int) -> torch.Tensor:
        if not self.backward_started:  # torchtune queues the end-of-backward callback at the first unpack
            self.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        t, offloaded = self.host.pop(i)
        if not offloaded:
            return t
        self.host_bytes -= t.element_size() * t.nelement()
        node = torch._C._current_autograd_node()
        earlier = list(self.bwd_stash) if node is not self.node else []
        self.node = node
        back = i not in self.fwd_stash
        dev = self.fwd_stash[i] if not back else t.to(self.device, copy=True)
        if back:
            self.bwd_stash[i] = dev
        uses = torch._C._storage_Use_Count(dev.untyped_storage()._cdata) if back else 0

        def after_node(*_: Any) -> None:
            # the hook looks the tensor up (it must not hold it: the node may outlive the step)
            kept = self.bwd_stash.get(i) if back else None
            if kept is not None and torch._C._storage_Use_Count(kept.untyped_storage()._cdata) > uses:
                del self.bwd_stash[i]  # something else holds it now (torchtune: record_stream and drop)
            self.fwd_stash.clear()
            for k in earlier:
                self.bwd_stash.pop(k, None)

        node.register_hook(after_node)
        return dev

    def _backward_done(self) -> None:
        """torchtune's end-of-backward callback: what is left in the backward stash is dropped."""
        self.bwd_stash.clear()
        self.node = None


def offload_decoder_activations(model: nn.Module, device: torch.device) -> ActivationOffload:
    """Offload what the decoder stack (embedding, layers, final norm) saves, as torchtune's recipes do around the
    model's forward with its output head opted out; the lm_head and the loss (outside torchtune's model) keep theirs."""
    offload = ActivationOffload(device)
    decoder = model.get_decoder()
    decoder.register_forward_pre_hook(lambda *_: offload.__enter__())
    decoder.register_forward_hook(lambda *_: offload.__exit__(), always_call=True)
    return offload


def offload_torchtune_activations(model: nn.Module, device: torch.device) -> ActivationOffload:
    """torchtune's get_act_offloading_ctx_manager: the context the recipe enters around `self._model(**batch)`,
    with a NoOpManager entered and left by hooks on model.output (the output head keeps its tensors as they are)."""
    offload = ActivationOffload(device)
    noop = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    head = model.output if isinstance(model.output, nn.Module) else model.output.linear
    head.register_forward_pre_hook(lambda *_: noop.__enter__())
    head.register_forward_hook(lambda *_: noop.__exit__(), always_call=True)
    return offload

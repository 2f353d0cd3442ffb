"""A tiny autograd simulator: replay one block's forward and backward and track live bytes.

A block (one decoder layer, or the embedding / LM-head-and-loss ends of the model) is written as
the list of ops that the transformers implementation runs, each with the tensor it creates, the
tensors it reads and the tensors its autograd node saves for backward. The simulator then applies
PyTorch's own lifetime rules:

- forward: a tensor is freed after its last reader unless an autograd node saved it (or it is the
  block's output); a node's saved tensors live until that node's backward has run
  (`torch.autograd` releases SavedVariables when the node is executed with retain_graph=False);
- backward runs the nodes in reverse creation order (the engine's sequence-number priority);
  each node creates a gradient for every input that requires one, accumulating into an existing
  gradient buffer (the new gradient is briefly alive next to it), and the gradient of its output
  is freed once the producing node has run;
- parameter gradients (`pgrad`) are created when their node runs and stay alive.

The result is a BlockProfile: bytes saved for backward, and the peaks above the surrounding live
memory reached inside the block during forward and during backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OUT = -1  # placeholder in `saves` for the op's own output


@dataclass(slots=True)
class Op:
    out: int  # tensor id created by this op (or an alias id), -2 when it creates nothing
    ins: tuple[int, ...]
    saves: tuple[int, ...]
    grad_ins: tuple[int, ...]
    pgrad: int = 0  # parameter-gradient bytes produced by this node's backward
    ws_fwd: int = 0  # scratch bytes alive only while the forward op runs
    ws_bwd: int = 0  # scratch bytes alive only while the backward node runs
    name: str = ""


@dataclass(frozen=True)
class BlockProfile:
    """What one block costs, in bytes, relative to what is live around it."""

    saved: int  # activations kept for backward after the block's forward (input included if saved)
    fwd_peak: int  # max live bytes of the block during forward, its input and output included
    bwd_peak: int  # max of (block saved still alive + grads in flight + new param grads) in backward
    out_bytes: int  # the block's output (the next block's input)
    in_grad_bytes: int  # gradient w.r.t. the block input left at the end of backward
    param_grad_bytes: int  # parameter gradients created by this block's backward
    input_saved: bool  # whether `saved` includes the block input
    fwd_peak_nosave: int  # forward peak when nothing is saved (no_grad / checkpointed forward)
    bwd_peak_saved: int  # of bwd_peak: saved activations still alive at that moment
    bwd_peak_pgrad: int  # of bwd_peak: parameter gradients already created
    cached_unsaved: int  # KV-cache tensors no autograd node saved: alive until the model's forward ends
    cached_total: int = 0  # all KV-cache tensors of the block (what a kept output's cache holds)
    recompute_peak: int = 0  # forward peak of a checkpoint's recompute, which stops at the last saved tensor


@dataclass
class Graph:
    """Builder for one block. Tensor 0 is the block input."""

    input_bytes: int
    input_requires_grad: bool = True
    round_to: int = 1  # CUDA's caching allocator rounds every block up to 512 bytes
    held: list[int] = field(default_factory=list)  # tensors a Python local keeps until the block returns
    cached: list[int] = field(default_factory=list)  # tensors the DynamicCache keeps until forward ends
    sizes: list[int] = field(default_factory=list)
    needs_grad: list[bool] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    output: int = 0

    def __post_init__(self) -> None:
        self.sizes.append(self.input_bytes)
        self.needs_grad.append(self.input_requires_grad)

    def op(self, out_bytes: int, ins: tuple[int, ...] = (), saves: tuple[int, ...] = (),
           grad: bool = True, pgrad: int = 0, ws_fwd: int = 0, ws_bwd: int = 0, name: str = "",
           grad_ins: tuple[int, ...] | None = None) -> int:
        """Add an op creating a new tensor of `out_bytes`; returns its id."""
        tid = len(self.sizes)
        r = self.round_to
        self.sizes.append(-(-out_bytes // r) * r)
        if ins and pgrad == 0 and not any(self.needs_grad[i] for i in ins):
            # no input and no parameter requires grad: autograd records no node, so nothing is
            # saved and the output needs no gradient (a frozen base on a frozen embedding's output)
            saves, grad, grad_ins = (), False, ()
        self.needs_grad.append(grad)
        if OUT in saves:
            saves = tuple(tid if s == OUT else s for s in saves)
        if grad_ins is None:
            ng = self.needs_grad
            grad_ins = tuple([i for i in ins if ng[i]])
        self.ops.append(Op(tid, ins, saves, grad_ins, pgrad, ws_fwd, ws_bwd, name))
        self.output = tid
        return tid

    def keep(self, *tids: int) -> None:
        """Keep tensors alive up to here in forward (a Python argument or local that outlives its
        last use as an op input)."""
        self.ops.append(Op(-2, tids, (), (), 0, 0, 0, "keep alive"))

    # ---- simulation ------------------------------------------------------------------
    def profile(self) -> BlockProfile:
        savers: dict[int, int] = {}
        last_read: dict[int, int] = {}
        for k, op in enumerate(self.ops):
            for t in op.saves:
                savers[t] = savers.get(t, 0) + 1
            for i in op.ins:
                last_read[i] = k
        frees: list[list[int]] = [[] for _ in self.ops]
        for i, k in last_read.items():
            if i != self.output:
                frees[k].append(i)
        for k, op in enumerate(self.ops):  # an output nothing reads (layer norm's mean / rstd under
            if op.out >= 0 and op.out not in last_read and op.out != self.output:  # no_grad) dies at once
                frees[k].append(op.out)
        fwd_peak = self._forward(savers, frees)
        fwd_peak_nosave = self._forward({}, frees)
        recompute_peak = self._forward(savers, frees, stop_at_last_save=True)
        saved_ids = set(savers)
        saved_bytes = sum(self.sizes[t] for t in saved_ids)
        (bwd_peak, bwd_saved, bwd_pgrad), in_grad, pgrads = self._backward(savers, saved_ids)
        return BlockProfile(
            saved=saved_bytes,
            fwd_peak=fwd_peak,
            bwd_peak=bwd_peak,
            out_bytes=self.sizes[self.output] if self.output not in saved_ids else 0,
            in_grad_bytes=in_grad,
            param_grad_bytes=pgrads,
            input_saved=0 in saved_ids,
            fwd_peak_nosave=fwd_peak_nosave,
            bwd_peak_saved=bwd_saved,
            bwd_peak_pgrad=bwd_pgrad,
            cached_unsaved=sum(self.sizes[t] for t in set(self.cached) if t not in saved_ids),
            cached_total=sum(self.sizes[t] for t in set(self.cached)),
            recompute_peak=recompute_peak,
        )

    def _forward(self, savers: dict[int, int], frees: list[list[int]], stop_at_last_save: bool = False) -> int:
        """Peak live bytes of the block during forward, its input included.

        stop_at_last_save: the recompute of non-reentrant checkpointing (torch.utils.checkpoint, early_stop=True)
        raises _StopRecomputationError once the forward's last tensor is packed for backward. Autograd packs a
        node's saved inputs before the kernel runs and a saved output after it, so the recompute ends before the
        last saving op's output is allocated unless that op saves its own output."""
        sizes = self.sizes
        live_bytes = sizes[0]
        peak = live_bytes
        last = max((k for k, op in enumerate(self.ops) if op.saves), default=-1) if stop_at_last_save else -1
        for k, (op, gone) in enumerate(zip(self.ops, frees, strict=True)):
            if k == last and op.out not in op.saves:
                break
            if op.out >= 0:
                live_bytes += sizes[op.out]
            if live_bytes + op.ws_fwd > peak:
                peak = live_bytes + op.ws_fwd
            if k == last:
                break
            for i in gone:
                if i not in savers:
                    live_bytes -= sizes[i]
        return peak

    def _backward(self, savers: dict[int, int], saved_ids: set[int]) -> tuple[tuple[int, int, int], int, int]:
        remaining = dict(savers)
        live_saved = sum(self.sizes[t] for t in saved_ids)
        grads: dict[int, int] = {self.output: self.sizes[self.output]}  # grad of the block output
        grad_bytes = self.sizes[self.output]
        pgrads = 0
        peak = (live_saved + grad_bytes, live_saved, 0)
        for op in reversed(self.ops):
            if op.out >= 0 and op.out not in grads and op.pgrad == 0:
                continue  # no gradient reaches this node (non-differentiable branch)
            new = 0
            transient = 0
            for i in op.grad_ins:
                if i in grads:
                    transient += self.sizes[i]
                else:
                    grads[i] = self.sizes[i]
                    new += self.sizes[i]
            pgrads += op.pgrad
            now = live_saved + grad_bytes + new + transient + pgrads + op.ws_bwd
            if now > peak[0]:
                peak = (now, live_saved, pgrads)
            grad_bytes += new
            if op.out >= 0 and op.out in grads and op.out != 0:
                grad_bytes -= grads.pop(op.out)
            for s in op.saves:
                remaining[s] -= 1
                if remaining[s] == 0:
                    live_saved -= self.sizes[s]
        in_grad = grads.get(0, 0)
        return peak, in_grad, pgrads

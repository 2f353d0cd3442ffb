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
memory reached inside the block during forward and during backward. The rules run over numbers for a
block built for one shape (`Graph.profile`), or once over linear forms for a block recorded with
symbolic batch and sequence (calc.sim.symbolic), giving a Plan that yields the profile of any shape.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter, mul
from typing import NamedTuple

from calc.sim.symbolic import Dim, as_poly
from calc.sim.symbolic import accumulate as _acc

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
    # the node saves a tensor that is not one of the block's (a weight) for backward: a custom autograd.Function
    # (torchao's LinearNF4) whose save_for_backward is packed when its forward returns, after its output and
    # scratch existed, so a checkpoint's recompute runs the whole op before it can stop there
    packs: bool = False
    # what the backward hands its inputs without a new tensor: "add" (AddBackward0: the output's gradient itself,
    # to each input of its dtype), "expand" (SumBackward: a broadcast view of it)
    passes: str = ""


class BlockProfile(NamedTuple):
    """What one block costs, in bytes, relative to what is live around it. An immutable record (a named tuple:
    a recorded block's plan makes one for every new shape, and a frozen dataclass's guarded __init__ cost as
    much as the plan's sums). The fields that are sums of the block's tensors come first (SUMMED_FIELDS), then
    the forward peaks, then the backward peak and what it is made of."""

    saved: int  # activations kept for backward after the block's forward (input included if saved)
    out_bytes: int  # the block's output (the next block's input)
    in_grad_bytes: int  # gradient w.r.t. the block input left at the end of backward
    cached_unsaved: int  # KV-cache tensors no autograd node saved: alive until the model's forward ends
    cached_total: int  # all KV-cache tensors of the block (what a kept output's cache holds)
    # expert parallelism: when the backward of the experts' first op (EXPERTS_ENTRY) is done, where the experts
    # module's FSDP2 post-backward runs: the block's saved tensors still alive, and the gradients in flight
    experts_done_saved: int
    experts_done_grads: int
    fwd_peak: int  # max live bytes of the block during forward, its input and output included
    fwd_peak_nosave: int  # forward peak when nothing is saved (no_grad / checkpointed forward)
    recompute_peak: int  # forward peak of a checkpoint's recompute, which stops at the last saved tensor
    bwd_peak: int  # max of (block saved still alive + grads in flight + new param grads) in backward
    bwd_peak_saved: int  # of bwd_peak: saved activations still alive at that moment
    bwd_peak_pgrad: int  # of bwd_peak: parameter gradients already created
    param_grad_bytes: int  # parameter gradients created by this block's backward
    input_saved: bool  # whether `saved` includes the block input


SUMMED_FIELDS = BlockProfile._fields[:7]  # the sums of the block's tensors, as Graph._simulate names them


# the first op of the experts module under expert parallelism (its input's gradient completes the module's
# backward: FSDP2's post-backward for the experts group runs there, mid-layer)
EXPERTS_ENTRY = "rows to send"


@dataclass
class Graph:
    """Builder for one block. Tensor 0 is the block input."""

    input_bytes: int
    input_requires_grad: bool = True
    round_to: int = 1  # CUDA's caching allocator rounds every block up to 512 bytes
    held: list[int] = field(default_factory=list)  # tensors a Python local keeps until the block returns
    cached: list[int] = field(default_factory=list)  # tensors the DynamicCache keeps until forward ends
    sizes: list[int | Dim] = field(default_factory=list)  # bytes as asked (rounded when evaluated)
    needs_grad: list[bool] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    output: int = 0

    def __post_init__(self) -> None:
        self.sizes.append(self.input_bytes)
        self.needs_grad.append(self.input_requires_grad)

    def op(self, out_bytes: int, ins: tuple[int, ...] = (), saves: tuple[int, ...] = (),
           grad: bool = True, pgrad: int = 0, ws_fwd: int = 0, ws_bwd: int = 0, name: str = "",
           grad_ins: tuple[int, ...] | None = None, packs: bool = False, passes: str = "") -> int:
        """Add an op creating a new tensor of `out_bytes`; returns its id."""
        tid = len(self.sizes)
        self.sizes.append(out_bytes)  # rounded to the allocator's block size when the plan is evaluated
        ng = self.needs_grad
        if ins and pgrad == 0 and not any(map(ng.__getitem__, ins)):
            # no input and no parameter requires grad: autograd records no node, so nothing is
            # saved and the output needs no gradient (a frozen base on a frozen embedding's output)
            saves, grad, grad_ins, packs = (), False, (), False
        ng.append(grad)
        if OUT in saves:
            saves = tuple([tid if s == OUT else s for s in saves])
        if grad_ins is None:
            grad_ins = tuple([i for i in ins if ng[i]])
        self.ops.append(Op(tid, ins, saves, grad_ins, pgrad, ws_fwd, ws_bwd, name, packs, passes))
        self.output = tid
        return tid

    def keep(self, *tids: int) -> None:
        """Keep tensors alive up to here in forward (a Python argument or local that outlives its
        last use as an op input)."""
        self.ops.append(Op(-2, tids, (), (), 0, 0, 0, "keep alive"))

    # ---- simulation ------------------------------------------------------------------
    def profile(self) -> BlockProfile:
        """The profile of a block recorded with concrete sizes (or at the shape it was recorded for)."""
        for x in self.sizes:
            if isinstance(x, Dim):
                return self.plan().at(x.trace.batch.value, x.trace.seq.value)
        fwd, nosave, recompute, bwd, fields, pgrads, input_saved = self._simulate(_Bytes)
        (bwd_peak, (bwd_saved, bwd_pgrad)), = bwd
        return BlockProfile(fwd_peak=fwd[0][0], fwd_peak_nosave=nosave[0][0], recompute_peak=recompute[0][0],
                            bwd_peak=bwd_peak, bwd_peak_saved=bwd_saved, bwd_peak_pgrad=bwd_pgrad,
                            param_grad_bytes=pgrads, input_saved=input_saved, **fields)

    def plan(self) -> Plan:
        """The profile of any (B, S): the lifetime rules run once over the block with every byte count kept as a
        linear form in the sizes' polynomials (and their rounding), so that a shape's profile is a few sums."""
        fwd, nosave, recompute, bwd, fields, pgrads, input_saved = self._simulate(_Forms)
        return Plan(self.round_to, [f for f, _ in fwd], [f for f, _ in nosave], [f for f, _ in recompute],
                    [(now, saved, pgrad) for now, (saved, pgrad) in bwd], fields, pgrads, input_saved)

    def _simulate(self, alg: type[_Bytes] | type[_Forms]) -> tuple:
        """PyTorch's lifetime rules over the block, with byte counts in `alg` (numbers, or linear forms): the
        candidates for the forward peaks and the backward peak, the other fields, the parameter gradients."""
        sizes = alg.sizes(self.sizes, self.round_to)
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
        saved_ids = set(savers)
        saved = alg.total(sizes[t] for t in saved_ids)
        bwd, in_grad, pgrads, (ex_saved, ex_grads) = self._backward(alg, sizes, savers, saved)
        cached = set(self.cached)
        fields = dict(saved=saved, out_bytes=sizes[self.output] if self.output not in saved_ids else alg.total(()),
                      in_grad_bytes=in_grad, cached_unsaved=alg.total(sizes[t] for t in cached - saved_ids),
                      cached_total=alg.total(sizes[t] for t in cached), experts_done_saved=ex_saved,
                      experts_done_grads=ex_grads)
        moments = self._forward(alg, sizes, savers, frees)
        before = self._grads_before_recompute(alg, sizes)
        recompute = [(alg.add(m, before), x) for m, x in moments[:self._recompute_moments()]]
        return (alg.largest(moments), alg.largest(self._forward(alg, sizes, {}, frees)),
                alg.largest(recompute), bwd, fields, pgrads, 0 in saved_ids)

    def _forward(self, alg: type[_Bytes] | type[_Forms], sizes: list, savers: dict[int, int],
                 frees: list[list[int]]) -> list:
        """The block's forward moments (live bytes, its input included): before the first op, then as each op
        runs (its output and scratch alive), its inputs that nothing saves freed after their last read."""
        add, sub, raw = alg.add, alg.sub, alg.raw
        live = sizes[0]
        moments = [(live, ())]
        for op, gone in zip(self.ops, frees, strict=True):
            if op.out >= 0:
                live = add(live, sizes[op.out])
            moments.append((add(live, raw(op.ws_fwd)) if op.ws_fwd else live, ()))
            for i in gone:
                if i not in savers:
                    live = sub(live, sizes[i])
        return moments

    def _recompute_moments(self) -> int:
        """How many of the forward's first moments a checkpoint's recompute reaches. The recompute of
        non-reentrant checkpointing (torch.utils.checkpoint, early_stop=True) raises _StopRecomputationError
        once the forward's last tensor is packed for backward. Autograd packs a node's saved inputs before the
        kernel runs and a saved output after it, so the recompute ends before the last saving op's output is
        allocated unless that op saves its own output or is a custom Function (packs: its saved tensors are
        packed once its forward has returned). Until then it is the forward itself (moment k + 1 is op k's)."""
        last = max((k for k, op in enumerate(self.ops) if op.saves or op.packs), default=-1)
        if last < 0:
            return len(self.ops) + 1
        op = self.ops[last]
        return last + (2 if op.out in op.saves or op.packs else 1)

    def _grads_before_recompute(self, alg: type[_Bytes] | type[_Forms], sizes: list) -> object:
        """Gradients besides the block output's alive while a checkpoint's recompute runs. Autograd runs the
        block's last nodes (latest created first) until one unpacks a saved tensor, which starts the recompute:
        what the nodes before it made stays alive through it (a LoRA branch's scaling: MulBackward0's grad *
        scale), while an add or a sum hands its gradient on (Op.passes). Measured with torchtune's checkpointed QLoRA on the
        CPU, where the recompute's dequantized weights make it the layer's peak."""
        owner: dict[int, int] = {self.output: -1}  # gradient (tensor id) -> the tensor holding it (-1: output's)
        for op in reversed(self.ops):
            if op.out >= 0 and op.out not in owner and op.pgrad == 0:
                continue
            if op.saves or op.packs:
                break
            held = owner.pop(op.out, -1) if op.out >= 0 else -1
            for i in op.grad_ins:
                if i not in owner:
                    view = op.passes == "expand" or op.passes == "add" and sizes[i] == sizes[op.out]
                    owner[i] = held if view else i
        return alg.total(sizes[t] for t in set(owner.values()) if t >= 0)

    def _backward(self, alg: type[_Bytes] | type[_Forms], sizes: list, savers: dict[int, int], saved: object) \
            -> tuple[list, object, int, tuple]:
        """Candidates for the first backward peak, each (live bytes, (saved still alive, parameter gradients
        created)), the input's gradient, the parameter gradients, and (saved alive, gradients in flight) once
        the op named EXPERTS_ENTRY has run its backward (zero without one)."""
        add, sub, raw = alg.add, alg.sub, alg.raw
        remaining = dict(savers)
        live_saved = saved
        grads = {self.output: sizes[self.output]}  # grad of the block output
        grad_bytes = sizes[self.output]
        pgrads = 0
        moments = [(add(live_saved, grad_bytes), (live_saved, 0))]
        experts_done = (alg.total(()), alg.total(()))
        for op in reversed(self.ops):
            if op.out >= 0 and op.out not in grads and op.pgrad == 0:
                continue  # no gradient reaches this node (non-differentiable branch)
            now = add(live_saved, grad_bytes)
            if op.ws_bwd:
                now = add(now, raw(op.ws_bwd))
            for i in op.grad_ins:
                now = add(now, sizes[i])  # a new gradient, or one added to an existing gradient buffer
                if i not in grads:
                    grads[i] = sizes[i]
                    grad_bytes = add(grad_bytes, sizes[i])
            pgrads += op.pgrad
            moments.append((add(now, raw(pgrads)) if pgrads else now, (live_saved, pgrads)))
            if op.out >= 0 and op.out in grads and op.out != 0:
                grad_bytes = sub(grad_bytes, grads.pop(op.out))
            for s in op.saves:
                remaining[s] -= 1
                if remaining[s] == 0:
                    live_saved = sub(live_saved, sizes[s])
            if op.name == EXPERTS_ENTRY:
                experts_done = (live_saved, grad_bytes)
        return alg.largest(moments, first=True), grads.get(0, alg.total(())), pgrads, experts_done


class _Bytes:
    """Byte counts as numbers (a block built for one shape)."""

    add, sub, raw = operator.add, operator.sub, operator.pos  # C functions: a replay stays as fast as before

    @staticmethod
    def sizes(sizes: list[int], r: int) -> list[int]:
        """The input as it is, every tensor the block creates rounded up to a multiple of r (CUDA's caching
        allocator: 512 bytes)."""
        return sizes[:1] + [-(-x // r) * r for x in sizes[1:]]

    @staticmethod
    def largest(moments: list[tuple[int, tuple]], first: bool = False) -> list[tuple[int, tuple]]:
        """The first largest moment (max returns the first of equal ones)."""
        return [max(moments, key=itemgetter(0))]

    @staticmethod
    def total(xs: Iterable[int]) -> int:
        return sum(xs)


# ---- byte counts as linear forms -------------------------------------------------------
# A form maps basis elements to coefficients: a monomial B^b S^s ("m", b, s), or the allocator's rounding of
# a size polynomial p, ("d", r, p): round_up(p, r) - p = (-p) mod r. For B, S >= 1 a monomial is at least 1 and a
# rounding between 0 and r - 1, which bounds the difference of two forms from below (_margin).

Form = dict[tuple, int]
_ONE = ("m", 0, 0)


def as_form(x: Dim | int) -> Form:
    return {("m", *m): c for m, c in as_poly(x).items()}


def _size_form(x: Dim | int, r: int) -> Form:
    """A tensor's bytes rounded up to a multiple of r (CUDA's caching allocator: 512)."""
    p = as_poly(x)
    if r == 1 or all(c % r == 0 for c in p.values()):
        return as_form(x)
    if list(p) == [(0, 0)]:
        return {_ONE: -(-p[(0, 0)] // r) * r}
    return {**as_form(x), ("d", r, tuple(sorted(p.items()))): 1}


def _sum(forms) -> Form:
    out: Form = {}
    for f in forms:
        _acc(out, f)
    return out


def _margin(a: Form, b: Form) -> int | None:
    """A lower bound of a - b over every shape, or None when a - b has no lower bound (a monomial's coefficient is
    smaller): each monomial is at least 1, each rounding of a size to r bytes between 0 and r - 1. (One pass over
    each form's items, not over the union of their keys: a recording compares every moment with the candidates
    it keeps.)"""
    margin = 0
    for k, c in a.items():
        d = c - b.get(k, 0)
        if d < 0:
            if k[0] == "m":
                return None
            margin += d * (k[1] - 1)
        elif k[0] == "m":
            margin += d
    for k, c in b.items():
        if k in a:
            continue
        if c > 0:  # a - b = -c < 0 here
            if k[0] == "m":
                return None
            margin -= c * (k[1] - 1)
        elif k[0] == "m":
            margin -= c
    return margin


def _at_least(a: Form, b: Form) -> bool:
    """a >= b for every shape."""
    m = _margin(a, b)
    return m is not None and m >= 0


def _above(a: Form, b: Form) -> bool:
    """a > b for every shape."""
    m = _margin(a, b)
    return m is not None and m > 0


class _Frontier:
    """The candidates for the largest of a sequence of forms, with what came with each: a form another bounds
    can never be the largest. first=True keeps the first of equal values (a later form must be strictly larger
    to replace one)."""

    def __init__(self, first: bool = False) -> None:
        self.first = first
        self.found: list[tuple[Form, tuple]] = []

    def add(self, form: Form, extra: tuple = ()) -> None:
        if any(f == form or _at_least(f, form) for f, _ in self.found):  # an equal form is bounded, and cheap
            return
        drop = _above if self.first else _at_least
        self.found = [(f, x) for f, x in self.found if not drop(form, f)]
        self.found.append((form, extra))


class _Forms:
    """Byte counts as linear forms (a block recorded with symbolic B and S)."""

    raw = staticmethod(as_form)

    @staticmethod
    def sizes(sizes: list[Dim | int], r: int) -> list[Form]:
        return [as_form(sizes[0])] + [_size_form(x, r) for x in sizes[1:]]

    @staticmethod
    def largest(moments: list[tuple[Form, tuple]], first: bool = False) -> list[tuple[Form, tuple]]:
        """The moments that can be the (first) largest for some shape."""
        frontier = _Frontier(first)
        for form, extra in moments:
            frontier.add(form, extra)
        return frontier.found

    @staticmethod
    def add(a: Form, b: Form) -> Form:
        return _acc(dict(a), b)

    @staticmethod
    def sub(a: Form, b: Form) -> Form:
        return _acc(dict(a), b, -1)

    @staticmethod
    def total(forms: Iterable[Form]) -> Form:
        return _sum(forms)


class Plan:
    """A block's profile for any (B, S): each field a linear form over the block's basis (its monomials B^b S^s,
    the constant 1 first, then the allocator's rounding of each rounded size), the forward peaks the largest of a
    few forms and the backward peak the first largest of a few. The distinct forms that a profile reads whole
    (the sums and the peaks' candidates: 3 to 15 of them) are kept by basis element, a column of coefficients
    each, so that a shape's profile is one pass per basis element that is not 0 there (a block has 2 to 6 of
    them; an aligned shape rounds nothing)."""

    def __init__(self, r: int, fwd: list[Form], nosave: list[Form], recompute: list[Form],
                 bwd: list[tuple[Form, Form, int]], fields: dict[str, Form], param_grad_bytes: int,
                 input_saved: bool) -> None:
        keys = {k for f in (*fwd, *nosave, *recompute, *fields.values(), *(x for b in bwd for x in b[:2])) for k in f}
        monos = sorted({k for k in keys if k[0] == "m"} | {("m", *m) for k in keys if k[0] == "d" for m, _ in k[2]}
                       | {_ONE})  # ("m", 0, 0), the constant, sorts first
        rounded = sorted(k for k in keys if k[0] == "d")
        basis = {k: i for i, k in enumerate(monos + rounded)}

        def dense(f: Form) -> tuple[int, ...]:
            row = [0] * len(basis)
            for k, c in f.items():
                row[basis[k]] = c
            return tuple(row)

        rows: dict[tuple[int, ...], int] = {}  # each distinct form read whole, dense over the basis -> its place

        def place(forms: Iterable[Form]) -> tuple[int, ...]:
            return tuple(rows.setdefault(dense(f), len(rows)) for f in forms)

        self.round_to = r
        self.monos: tuple[tuple[int, int], ...] = tuple(k[1:] for k in monos)  # (b, s) of each monomial
        mono_at = {k[1:]: i for i, k in enumerate(monos)}
        # each rounded size p as coefficients over the monomials: its rounding is (-p) mod r
        self.rounded: tuple[tuple[int, ...], ...] = tuple(
            tuple(dict((mono_at[m], c) for m, c in k[2]).get(i, 0) for i in range(len(monos))) for k in rounded)
        self.sums = place(fields[name] for name in SUMMED_FIELDS)
        self.fwd, self.nosave, self.recompute = place(fwd), place(nosave), place(recompute)
        self.bwd = place(now for now, _, _ in bwd)
        # the forms' constant terms, then their coefficients for each other basis element
        self.constants, *columns = zip(*rows, strict=True)
        self.columns: tuple[tuple[int, ...], ...] = tuple(columns)
        self.bwd_saved = tuple(dense(saved) for _, saved, _ in bwd)  # what is saved at each backward candidate
        self.bwd_pgrad = tuple(pg for _, _, pg in bwd)
        self.param_grad_bytes, self.input_saved = param_grad_bytes, input_saved

    def at(self, batch: int, seq: int) -> BlockProfile:
        """The profile of (batch, seq): the basis there, every form's value (one basis element at a time: its
        column of coefficients times its value added to the forms' sums, skipped where the value is 0), then
        the peaks, each the largest of its candidates (the backward one the first largest, with what was saved
        and the parameter gradients made at that moment). In BlockProfile's order: the sums, the forward
        peaks, the backward peak's three, the rest."""
        monos = [batch ** b * seq ** s for b, s in self.monos]
        basis = monos + [-sum(map(mul, p, monos)) % self.round_to for p in self.rounded]
        v = list(self.constants)
        for x, column in zip(basis[1:], self.columns, strict=True):
            if x:
                v = [total + x * c for total, c in zip(v, column, strict=True)]
        value = v.__getitem__
        bwd = list(map(value, self.bwd))
        best = bwd.index(max(bwd))
        return BlockProfile(*map(value, self.sums), max(map(value, self.fwd)), max(map(value, self.nosave)),
                            max(map(value, self.recompute)), bwd[best], sum(map(mul, self.bwd_saved[best], basis)),
                            self.bwd_pgrad[best], self.param_grad_bytes, self.input_saved)

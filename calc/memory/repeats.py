"""Layers that repeat, and the sums over them: why a new shape's 80-layer timeline costs a few rows, not 165.

A model's decoder layers fall into a few kinds (sliding-window or full attention, dense or MoE, an input that
requires grad or not); `Layers` keeps a value per kind and each layer's kind, and `per_layer` asks a function once
per kind. From some layer on the layers' values repeat with a period (`repeats`: identical layers, every k-th
checkpointed, Gemma 3's five local layers and a global one), so the running sums the timeline needs are composed
from the first layers and one period (`prefix_sums`). A run of layer rows is cut into pieces within which every
column is affine in the layer's index (`pieces`), so the peak is at a piece's end (calc.memory.timeline.StepTimeline
asks only those). The tests compare both with the plain path: every layer listed and summed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from math import lcm
from typing import TypeVar

from calc.memo import Memo, memoized
from calc.sim.graph import BlockProfile

T = TypeVar("T")
U = TypeVar("U")

MAX_PERIOD = 16  # the longest repeat of kinds of layer looked for (Gemma 3: 6, Llama 4: 4, gpt-oss: 2)


class Layers(list):
    """Per-layer values of a few kinds of layer (calc.memory.activations.layer_ctxs, per_layer): the list of each
    layer's value, with `kinds`, the values of the kinds first seen first, and `pattern`, each layer's kind (one
    tuple per model), so that what follows the kinds (per_layer, identical_layers, repeats) asks them, not every
    layer."""

    __slots__ = ("kinds", "pattern")

    kinds: list
    pattern: tuple[int, ...]


def of_kinds(kinds: list[T], pattern: tuple[int, ...]) -> Layers:
    """The Layers whose layer i has the value kinds[pattern[i]]."""
    out = Layers(map(kinds.__getitem__, pattern))
    out.kinds, out.pattern = kinds, pattern
    return out


def per_layer(items: list[T], fn: Callable[[T], U]) -> list[U]:
    """fn of each layer's item, called once per kind of layer: Layers by its kinds, a list of one object
    (layer_ctxs gives the layers of one kind the same Ctx object) once, another list once per distinct object
    (told apart by identity within this call: comparing a Ctx by value compares its 22 fields, its ModelSpec
    among them, which for 80 layers costs more than a new shape's profiles). The last item is checked first:
    list.count compares identity first, but another object by value."""
    if isinstance(items, Layers):  # several kinds, as layer_ctxs made them
        return of_kinds([fn(c) for c in items.kinds], items.pattern)
    first = items[0]
    if items[-1] is first and items.count(first) == len(items):  # one kind of layer, the common case
        return [fn(first)] * len(items)
    distinct = {id(c): c for c in items}  # the objects are alive throughout: their ids are theirs
    out = {key: fn(c) for key, c in distinct.items()}
    return [out[id(c)] for c in items]


def identical_layers(lay: list[BlockProfile], sel_drop: list[int] | None = None) -> bool:
    """Every layer's profile is equal, and so is what selective checkpointing drops from it (`sel_drop`). Layers
    are compared by their kinds; a list by value, each item that is the first object by identity first."""
    first = lay[0]
    kinds = lay.kinds if isinstance(lay, Layers) else lay
    return kinds.count(first) == len(kinds) and (sel_drop is None or sel_drop.count(sel_drop[0]) == len(sel_drop))


# ---- where the layers repeat -----------------------------------------------------------------------------------------

def layers_repeat(lay: list[BlockProfile], sel_drop: list[int], every: int, alike: bool) -> tuple[int, int]:
    """(lead, period): from layer `lead` on, a layer's values are those of the layer `period` further on. Alike
    layers repeat from layer 0 with their checkpointing (every k-th layer, else every layer); others as
    `repeats` finds."""
    return (0, every if every > 1 else 1) if alike else repeats(lay, sel_drop, every)


_PATTERN_REPEATS: Memo[tuple[tuple[int, ...], int], tuple[int, int]] = Memo("repeats of a model's kinds of layer", 1024)


def repeats(lay: list[BlockProfile], sel_drop: list[int], every: int) -> tuple[int, int]:
    """(lead, period) of a run of layers that are not all alike: from layer `lead` on, layer i has layer
    i + period's profile, selective drop and checkpointing (every k-th layer from layer 0); (0, 0) where no repeat
    shorter than the run is found. The shortest lead + period is taken, so that the fewest layers are listed.
    Layers are told apart by their kinds (once per model and `every`), a list by its profiles' values."""
    if isinstance(lay, Layers):  # the layers' kinds decide their profiles and drops
        return _PATTERN_REPEATS.get((lay.pattern, every), lambda: find_repeats((lay.pattern,), every))
    return find_repeats((lay, sel_drop), every)


def find_repeats(lists: tuple[Sequence, ...], every: int) -> tuple[int, int]:
    """`repeats` of the layers whose items in `lists` (what tells them apart) are given."""
    n = len(lists[0])
    best = (0, 0)
    for p in range(1, min(MAX_PERIOD, n - 1) + 1):
        if best[1] and p >= sum(best):  # lead + period >= p: no shorter one to come
            break
        lead = repeat_start(lists, p)
        period = p if every <= 1 else lcm(p, every)
        if lead + period < n and (not best[1] or lead + period < sum(best)):
            best = (lead, period)
    return best


def repeat_start(lists: tuple[Sequence, ...], p: int) -> int:
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


# ---- running sums over the layers ------------------------------------------------------------------------------------

class PrefixSums:
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


class LinearSums:
    """PrefixSums of a value every layer shares (period 1): start + i * fn(0), without the list of sums."""

    __slots__ = ("start", "step")

    def __init__(self, start: int, step: int) -> None:
        self.start, self.step = start, step

    def __getitem__(self, i: int) -> int:
        return self.start + i * self.step

    def value(self, i: int) -> int:
        return self.step


def prefix_sums(fn: Callable[[int], int], layers: int, period: int, start: int = 0,
                lead: int = 0) -> PrefixSums | LinearSums:
    """start + fn(0) + ... + fn(i - 1) for i = 0 .. layers (see PrefixSums)."""
    return LinearSums(start, fn(0)) if period == 1 and not lead else PrefixSums(fn, layers, period, start, lead)


# ---- the pieces of a run of layer rows -------------------------------------------------------------------------------

def pieces(lay: list[BlockProfile], every: int = 0, sel_drop: list[int] | None = None,
           alike: bool | None = None, repeat: tuple[int, int] = (0, 0)) -> list[range]:
    """The pieces of a run of layers (see calc.memory.timeline.StepTimeline): layer 0 alone (rows treat it apart),
    then, when every layer is alike, the rest as one piece, or under checkpointing of every k-th layer one piece
    per residue of i mod k (the activations and gradients before layer i grow by one period's sum every k layers).
    Layers that are not all alike but repeat (`repeat`: (lead, period), see `repeats`) the same way: each of the
    first `lead` layers alone, then one piece per residue of the period. Otherwise a new piece wherever the
    layer's profile, its checkpointing or its selective drop changes."""
    n = len(lay)
    if n == 1:
        return [range(1)]
    if identical_layers(lay, sel_drop) if alike is None else alike:  # alike: the caller has asked already
        if every <= 1:
            return [range(1), range(1, n)]
        return [range(1)] + [p for r in range(every) if (p := range(r or every, n, every))]
    lead, period = repeat
    if period:
        first = max(lead, 1)
        return [range(i, i + 1) for i in range(first)] + [range(r, n, period) for r in range(first, first + period)
                                                          if r < n]

    def key(i: int) -> tuple[BlockProfile, bool, int]:
        return lay[i], bool(every) and i % every == 0, sel_drop[i] if sel_drop else 0

    starts = [0, 1] + [i for i in range(2, n) if key(i) != key(i - 1)] + [n]
    return [range(a, b) for a, b in zip(starts, starts[1:], strict=False)]


def split_pieces(pieces: list[range], differs: Callable[[int, int], bool]) -> list[range]:
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


def split_at_switch(pieces: list[range], switched: Callable[[int], bool]) -> list[range]:
    """The pieces cut where `switched`, a boolean of the layer that changes once over the layers (true below some
    layer and false from it on, or the reverse), changes: split_pieces for such a term, found by bisection in each
    piece that holds the change, not by asking every pair of neighbours (DeepSpeed ZeRO-1/2's gradient partition
    appears once, at the first bucket reduction, and stays)."""
    out = []
    for p in pieces:
        before = switched(p[0])
        if switched(p[-1]) == before:  # no change inside: the term is constant along the piece
            out.append(p)
            continue
        lo, hi = 1, len(p) - 1  # the first position whose value differs from p[0]'s
        while lo < hi:
            mid = (lo + hi) // 2
            if switched(p[mid]) != before:
                hi = mid
            else:
                lo = mid + 1
        out += [p[:lo], p[lo:]]
    return out


@memoized("ends of a run's pieces", 1024)
def piece_ends(pieces: tuple[range, ...]) -> tuple[int, ...]:
    """The layers at the ends of the pieces, each once (a run's moments are largest at one of them); a new
    shape's runs are cut into the same pieces as before."""
    return tuple(dict.fromkeys(i for p in pieces for i in (p[0], p[-1])))

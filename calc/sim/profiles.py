"""Block profiles for any batch shape.

A block (a decoder layer, the embedding, the LM head and loss) is recorded once per shape-free context
with the micro-batch and the sequence length as symbols (calc.sim.symbolic); the simulator's plan of it
(calc.sim.graph.Plan) then gives the profile of any (B, S) in a few sums, the allocator's rounding applied
there. A recording whose builder compared a size (seq >= sliding_window, Liger's chunk of tokens) serves
only the shapes where that answer is the same (its guards); another answer records again. A block the
symbols cannot describe (Unsupported) is replayed for each shape, as `replay=True` always does (the
reference that the tests compare with). Recording a layer costs about six replays (0.64 ms against
0.1 ms for a 70B layer; evaluating its plan a few us), so a context is replayed for its first six shapes and
recorded at its seventh (RECORD_AT): a context asked for few shapes (a search over parallel layouts asks most
contexts for one to six) never pays for a recording, and one asked for many (a sweep over batch and sequence)
pays at most about twice what it would have paid knowing the number in advance.
Profiles are also kept per shape (a new parallel layout of a shape seen before asks for the same
blocks). Both are calc.memo.Memo instances keyed by value: the builder, the context's shape-free key
(calc.sim.context.Ctx.shape_free), the builder's other arguments, and for a profile the shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace

from calc.memo import Memo
from calc.sim.context import Ctx
from calc.sim.graph import BlockProfile, Graph, Plan
from calc.sim.symbolic import Trace, Unsupported

RECORD_AT = 7  # a context is recorded when this many shapes have asked for it (recording ~ 6 replays)
MAX_RECORDINGS = 16  # recordings kept per context (one per set of answers to its guards)

Builder = Callable[..., Graph]


@dataclass
class Context:
    """What is known of one block's shape-free context: how many shapes were replayed before it is recorded, its
    recordings (each a trace with its guards and the plan it gives), and whether the symbols can describe it."""

    shapes_replayed: int = 0
    recordings: list[tuple[Trace, Plan]] = field(default_factory=list)
    describable: bool = True


@dataclass
class Counts:
    """What the recordings did since forget_recordings, by builder name (for tests and benchmarks)."""

    recorded: Counter[str] = field(default_factory=Counter)  # recordings made
    undescribable: Counter[str] = field(default_factory=Counter)  # contexts the symbols could not describe


_contexts: Memo[tuple[Builder, tuple, tuple[Hashable, ...]], Context] = Memo("block contexts", 1024)
_by_shape: Memo[tuple[Builder, tuple, tuple[Hashable, ...], int, int], BlockProfile] = Memo(
    "block profiles per shape", 8192)
counts = Counts()


def block_profile(build: Builder, ctx: Ctx, *args: Hashable, replay: bool = False) -> BlockProfile:
    """build(ctx, *args)'s profile: from the recording of its shape-free context, or replayed for this shape."""
    if replay:
        return build(ctx, *args).profile()
    free = (build, ctx.shape_free, args)
    return _by_shape.get((*free, ctx.batch, ctx.seq), lambda: _recorded(build, ctx, args, free))


def _recorded(build: Builder, ctx: Ctx, args: tuple[Hashable, ...], free: tuple) -> BlockProfile:
    """The profile from a recording of the context that holds for this shape, recorded now if none does; replayed
    for the context's first shapes and where the symbols cannot describe it."""
    known = _contexts.get(free, Context)
    if known.shapes_replayed + 1 < RECORD_AT or not known.describable:
        known.shapes_replayed += 1
        return build(ctx, *args).profile()
    b, s = ctx.batch, ctx.seq
    for trace, plan in known.recordings:
        if trace.holds(b, s):
            return plan.at(b, s)
    trace = Trace(b, s)
    try:
        plan = build(replace(ctx, batch=trace.batch, seq=trace.seq), *args).plan()
    except Unsupported:
        known.describable = False
        counts.undescribable[build.__name__] += 1
        return build(ctx, *args).profile()
    if len(known.recordings) >= MAX_RECORDINGS:
        del known.recordings[0]
    known.recordings.append((trace, plan))
    counts.recorded[build.__name__] += 1
    return plan.at(b, s)


def forget_shapes() -> None:
    """Forget the profiles kept per shape (a benchmark of new shapes)."""
    _by_shape.clear()


def forget_recordings() -> None:
    """Forget every recording (a benchmark of contexts never seen), and the profiles kept per shape."""
    _contexts.clear()
    _by_shape.clear()
    counts.recorded.clear()
    counts.undescribable.clear()

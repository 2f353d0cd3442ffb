"""Block profiles for any batch shape.

A block (a decoder layer, the embedding, the LM head and loss) is recorded once per shape-free context
with the micro-batch and the sequence length as symbols (calc.sim.symbolic); the simulator's plan of it
(calc.sim.graph.Plan) then gives the profile of any (B, S) in a few sums, the allocator's rounding applied
there. A recording whose builder compared a size (seq >= sliding_window, Liger's chunk of tokens) serves
only the shapes where that answer is the same (its guards); another answer records again. A block the
symbols cannot describe (Unsupported) is replayed for each shape, as `replay=True` always does (the
reference that the tests compare with). Recording a layer costs about six replays (0.64 ms against
0.1 ms for a 70B layer; evaluating its plan ~3 us), so a context is replayed for its first six shapes and
recorded at its seventh: a context asked for few shapes (a search over parallel layouts asks most contexts
for one to six) never pays for a recording, and one asked for many (a sweep over batch and sequence) pays at
most about twice what it would have paid knowing the number in advance.
Profiles are also kept per shape (a new parallel layout of a shape seen before asks for the same
blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from calc.contract.architectures import ModelSpec
from calc.sim.graph import BlockProfile, Graph, Plan
from calc.sim.layers import Ctx
from calc.sim.symbolic import Trace, Unsupported

_MAX_CONTEXTS = 1024  # shape-free contexts whose recordings are kept
_MAX_RECORDINGS = 16  # recordings per context (one per set of answers to its guards)
_MAX_SHAPES = 8192  # profiles kept per shape
_RECORD_AT = 7  # a context is recorded when this many shapes have asked for it (recording ~ 6 replays)
# (build, ctx.shape_free, args) -> (the spec its id stands for, recordings; an int: the shapes replayed so far;
# None: replay every shape)
_recordings: dict[tuple, tuple[ModelSpec, list[tuple[Trace, Plan]] | int | None]] = {}
_by_shape: dict[tuple, tuple[ModelSpec, BlockProfile]] = {}


def block_profile(build: Callable[..., Graph], ctx: Ctx, *args: object, replay: bool = False) -> BlockProfile:
    """build(ctx, *args)'s profile: from the recording of its shape-free context, or replayed for this shape."""
    if replay:
        return build(ctx, *args).profile()
    key = (build, ctx.shape_free, args, ctx.batch, ctx.seq)  # one tuple: each new shape keeps its key
    hit = _by_shape.get(key)
    if hit is not None:
        return hit[1]
    profile = _recorded(build, ctx, args, key[:3])
    if len(_by_shape) >= _MAX_SHAPES:
        _by_shape.clear()
    _by_shape[key] = (ctx.spec, profile)
    return profile


def _recorded(build: Callable[..., Graph], ctx: Ctx, args: tuple, free: tuple) -> BlockProfile:
    found = _recordings.get(free)
    if found is None and len(_recordings) >= _MAX_CONTEXTS:
        _recordings.clear()
    recordings = 0 if found is None else found[1]
    if isinstance(recordings, int):  # the first shapes of a context are replayed, the next one records
        if recordings + 1 < _RECORD_AT:
            _recordings[free] = (ctx.spec, recordings + 1)
            return build(ctx, *args).profile()
        recordings = []
        _recordings[free] = (ctx.spec, recordings)
    if recordings is None:  # not describable with symbols
        return build(ctx, *args).profile()
    b, s = ctx.batch, ctx.seq
    for trace, plan in recordings:
        if trace.holds(b, s):
            return plan.at(b, s)
    trace = Trace(b, s)
    try:
        plan = build(replace(ctx, batch=trace.batch, seq=trace.seq), *args).plan()
    except Unsupported:
        _recordings[free] = (ctx.spec, None)
        return build(ctx, *args).profile()
    if len(recordings) >= _MAX_RECORDINGS:
        del recordings[0]
    recordings.append((trace, plan))
    return plan.at(b, s)


def forget_shapes() -> None:
    """Forget the profiles kept per shape (a benchmark of new shapes)."""
    _by_shape.clear()


def forget_recordings() -> None:
    """Forget every recording (a benchmark of contexts never seen)."""
    _recordings.clear()
    _by_shape.clear()

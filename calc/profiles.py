"""Block profiles for any batch shape.

A block (a decoder layer, the embedding, the LM head and loss) is recorded once per shape-free context
with the micro-batch and the sequence length as symbols (calc.symbolic); the simulator's plan of it
(calc.graph.Plan) then gives the profile of any (B, S) in a few sums, the allocator's rounding applied
there. A recording whose builder compared a size (seq >= sliding_window, Liger's chunk of tokens) serves
only the shapes where that answer is the same (its guards); another answer records again. A block the
symbols cannot describe (Unsupported) is replayed for each shape, as `replay=True` always does (the
reference that the tests compare with).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from calc.graph import BlockProfile, Graph, Plan
from calc.layers import Ctx
from calc.symbolic import Trace, Unsupported

_MAX_KEYS = 1024  # shape-free contexts kept
_MAX_RECORDINGS = 16  # recordings per context (one per set of answers to its guards)
_recordings: dict[tuple, list[tuple[Trace, Plan] | None]] = {}


def block_profile(build: Callable[..., Graph], ctx: Ctx, *args: object, replay: bool = False) -> BlockProfile:
    """build(ctx, *args)'s profile: from the recording of its shape-free context, or replayed for this shape."""
    if replay:
        return build(ctx, *args).profile()
    key = (build, ctx.shape_free(), args)
    found = _recordings.get(key)
    if found is None:
        if len(_recordings) >= _MAX_KEYS:
            _recordings.clear()
        found = _recordings[key] = []
    b, s = ctx.batch, ctx.seq
    for rec in found:
        if rec is None:  # not describable with symbols: replay
            return build(ctx, *args).profile()
        if rec[0].holds(b, s):
            return rec[1].at(b, s)
    trace = Trace(b, s)
    try:
        plan = build(replace(ctx, batch=trace.batch, seq=trace.seq), *args).plan()
    except Unsupported:
        found[:] = [None]
        return build(ctx, *args).profile()
    if len(found) >= _MAX_RECORDINGS:
        del found[0]
    found.append((trace, plan))
    return plan.at(b, s)


def forget_recordings() -> None:
    """Forget every recording (a benchmark of contexts never seen)."""
    _recordings.clear()

"""The step's timeline: its moments (rows of live bytes per category), runs of per-layer rows, and the peak.

A training step's rows are composed in calc.memory.train_timeline; an inference step's (a no_grad forward) here.
`StepTimeline.peak` asks each run of layer rows only at the ends of its pieces (calc.memory.repeats.pieces);
`StepTimeline.build` lists every row, for the charts and for the reference that the tests compare the peak with.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

from calc.contract.scenario import Attention, Scenario
from calc.memo import memoized
from calc.memory.activations import (
    amp_cached_weight_bytes,
    block_profiles,
    layer_ctxs,
    layer_profile,
    model_level_bytes,
)
from calc.memory.generate import (
    cache_position_bytes,
    decode_rows,
    generating,
    prefill_cache_bytes,
    prefill_head_block,
    static_prefill_extra,
    static_prefill_mask_bytes,
)
from calc.memory.inference_weights import dequantize_bytes
from calc.memory.repeats import per_layer, piece_ends, pieces
from calc.memory.result import (
    BACKWARD_LAYER,
    FORWARD_LAYER,
    INFERENCE_LAYER,
    PREFILL_HEAD,
    RECOMPUTED_LAYER,
    Timeline,
)
from calc.memory.states import States
from calc.sim.layers import Ctx, inference_head_block, stack_locals_bytes
from calc.sim.profiles import block_profile


class TimelineRow(NamedTuple):
    """One moment of the step: its event and phase, and the bytes alive in each category."""

    event: str
    phase: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.other


class LayerRun(NamedTuple):
    """Rows of each layer i in `order`, made by rows(i) (a tuple of `width` rows); the peak is asked at `ends`."""

    order: range
    rows: Callable[[int], tuple[TimelineRow, ...]]
    width: int
    ends: tuple[int, ...]


class StepTimeline:
    """The step's moments in order: single rows, and runs of per-layer rows.

    A run asks one function for layer i's rows, for the layers in its order. The run's layers fall into pieces
    (ranges of layer indices, calc.memory.repeats.pieces): within a piece every column of a row is affine in the
    piece's own index, or the larger of such a term and a constant (the clamp at 0, the gradients' floor), so a
    row's total is convex along the piece: it is largest at one of the piece's two ends, and where it is largest
    first also at an end. `peak()` therefore asks rows(i) only at the ends of the pieces; `build()` asks it for
    every layer."""

    def __init__(self) -> None:
        self.parts: list[TimelineRow | LayerRun] = []
        # bytes every row counts in `other` (kept beside the model states throughout) that are parameters'
        # gradients no step frees (LitGPT QLoRA's StableEmbedding): each row shows them as gradients
        self.held_gradients = 0

    def shown(self, row: TimelineRow) -> TimelineRow:
        """`row` with the held gradients moved from other to gradients (the total unchanged)."""
        moved = min(self.held_gradients, row.other)
        return row._replace(gradients=row.gradients + moved, other=row.other - moved) if moved > 0 else row

    def add(self, event: str, phase: str, params: int, grads: int, opt: int, acts: int, other: int) -> None:
        """One moment; `other` below 0 (a term that frees more than the block's own transients) counts as 0."""
        self.parts.append(TimelineRow(event, phase, params, grads, opt, acts, other if other > 0 else 0))

    def run(self, order: range, rows: Callable[[int], tuple[TimelineRow, ...]], width: int,
            layer_pieces: list[range]) -> None:
        """Layer rows for each i in `order`; `layer_pieces` cover the layers of `order`."""
        self.parts.append(LayerRun(order, rows, width, piece_ends(tuple(layer_pieces))))

    def peak(self) -> tuple[int, TimelineRow]:
        """(index, row) of the first largest total, asking each run only at its pieces' ends."""
        best, best_at, best_row = -1, 0, None
        at = 0
        for part in self.parts:
            if isinstance(part, TimelineRow):
                total = part.total
                if total > best:
                    best, best_at, best_row = total, at, part
                at += 1
                continue
            order = part.order
            for i in part.ends:
                base = at + (i - order.start) // order.step * part.width  # order.index(i)
                for j, row in enumerate(part.rows(i)):
                    total = row.total
                    if total > best or (total == best and base + j < best_at):
                        best, best_at, best_row = total, base + j, row
            at += len(order) * part.width
        assert best_row is not None
        return best_at, self.shown(best_row)

    def all_rows(self) -> list[TimelineRow]:
        out: list[TimelineRow] = []
        for part in self.parts:
            if isinstance(part, TimelineRow):
                out.append(self.shown(part))
                continue
            for i in part.order:
                listed = None
                for row in part.rows(i):
                    # a layer without one of the run's moments repeats a row object to keep the run's width
                    # (a dense layer under expert parallelism): the chart lists that moment once
                    if row is not listed:
                        out.append(self.shown(row))
                    listed = row
        return out

    def build(self) -> Timeline:
        """Every row, and the peak as the first largest total over all of them."""
        rows = self.all_rows()
        totals = [r.total for r in rows]
        peak = max(range(len(totals)), key=totals.__getitem__)
        ev, ph, p, g, o, a, x = (list(c) for c in zip(*rows, strict=True))
        return Timeline(events=ev, phases=ph, parameters=p, gradients=g, optimizer_states=o, activations=a, other=x,
                        peak_index=peak)


class LayerNames(NamedTuple):
    """Each layer's event names."""

    forward: list[str]
    backward: list[str]
    recomputed: list[str]


@memoized("layers' event names", 64)
def layer_names(layers: int) -> LayerNames:
    return LayerNames([FORWARD_LAYER.format(layer=i) for i in range(layers)],
                      [BACKWARD_LAYER.format(layer=i) for i in range(layers)],
                      [RECOMPUTED_LAYER.format(layer=i) for i in range(layers)])


def inference_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, workspace_bytes: int,
                       replay: bool = False) -> StepTimeline:
    """no_grad forward with use_cache=True: weights + the KV cache growing layer by layer + one
    layer's transients; at the end the logits (B x S x V in compute dtype) are returned. With inference.new_tokens
    the forward is generate's prefill, followed by the decode steps' largest moment (calc.memory.generate).
    `workspace_bytes`: the cuBLAS workspace bytes."""
    eager = sc.training.attention == Attention.eager
    _, emb, _ = block_profiles(ctx, eager, replay=replay)
    lay = per_layer(layer_ctxs(ctx, layers), lambda c: layer_profile(c, eager, replay))
    rope, mask = model_level_bytes(ctx, eager)
    s = ctx.spec
    gen = generating(sc) and ctx.use_cache
    # the cache keeps k (RoPE dtype) and v promoted to it; the layer's own copies are in its peak
    kv = (prefill_cache_bytes(sc, ctx, layers) if gen
          else [sum(cache_position_bytes(ctx)) * ctx.seq * ctx.use_cache] * layers)
    held = prefix_sums_of(kv)
    static = gen and sc.inference.kv_cache == "static"
    own_extra = [static_prefill_extra(sc, ctx, i) if static else 0 for i in range(layers)]
    if static:
        mask = static_prefill_mask_bytes(sc, ctx, layers, mask)
    tl = StepTimeline()
    if gen:  # generate's position ids are B x S (from the attention mask), so are the RoPE tables made from them
        rope *= ctx.batch
    # the prompt's input_ids; generate adds its attention mask and the position ids made from it with their copy
    # for the forward (int64, B x S each: generation/utils.py prepare_inputs_for_generation)
    base = 8 * ctx.tokens * (4 if gen else 1) + rope + mask + workspace_bytes
    tl.add("embedding", "inference", st.weights, 0, 0, 0, base + emb.fwd_peak_nosave)
    # autocast caches a 16-bit copy of every fp32 weight that requires grad, even under no_grad,
    # until the autocast region ends (aten/src/ATen/autocast_mode.cpp, cached_cast)
    cache = amp_cached_weight_bytes(s, ctx) if ctx.amp else 0
    dequantized = dequantize_bytes(sc, ctx.tokens)  # a quantized linear's transient (inference.weights)

    def layer_rows(i: int) -> tuple[TimelineRow]:
        o = base + i * cache + lay[i].fwd_peak_nosave + stack_locals_bytes(ctx, i) + own_extra[i] + dequantized
        return (TimelineRow(INFERENCE_LAYER.format(layer=i), "inference", st.weights, 0, 0, held[i],
                            o if o > 0 else 0),)

    uniform = len(set(kv)) <= 1 and len(set(own_extra)) <= 1
    tl.run(range(layers), layer_rows, 1, pieces(lay) if uniform else [range(i, i + 1) for i in range(layers)])
    head = prefill_head_block if gen else inference_head_block
    head_peak = block_profile(head, ctx, replay=replay).fwd_peak_nosave
    tl.add(PREFILL_HEAD if gen else "final norm + lm_head", "inference", st.weights, 0, 0, held[layers],
           base - mask + layers * cache + head_peak)
    if gen and sc.inference.new_tokens > 1:
        decode_deq = dequantize_bytes(sc, ctx.batch)
        for event, cache_bytes, other in decode_rows(sc, ctx, layers):
            tl.add(event, "inference", st.weights, 0, 0, cache_bytes, other + layers * cache + workspace_bytes
                   + decode_deq)
    return tl


def prefix_sums_of(values: list[int]) -> list[int]:
    """[0, v0, v0 + v1, ...]: what the layers before each one hold."""
    return list(accumulate(values, initial=0))

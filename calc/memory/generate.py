"""Generation: what `model.generate(input_ids, max_new_tokens=N, do_sample=False)` keeps alive (mode inference,
inference.new_tokens > 0), as transformers 5.23 runs it.

The prefill is the no-grad forward of the prompt (calc.memory.timeline.inference_timeline) with two differences:
generate passes `logits_to_keep=1` (generation/utils.py, `_prepare_generation_config`'s "avoid computing the whole
logits"), so the lm_head runs on the last position only after the final norm ran on all of them; and a static cache
allocates each layer's keys and values for prompt + new tokens at its first update (cache_utils.py,
StaticLayer.lazy_initialization), where the dynamic cache's torch.cat holds the prompt's.

Each decode step feeds one token. The largest moments of the decoding are in the last step, when every layer holds its cache at
full length: the last layer's cache update, and the next-token logits after the forward.
  * DynamicLayer.update: `self.keys = torch.cat([self.keys, key_states])`: the new keys exist while the old are
    still referenced, so one layer's keys at the old length come on top (then the same for the values, the old
    keys freed by then);
  * DynamicSlidingWindowLayer concatenates the keys and the values before it rebinds either, then keeps a view of
    the last window - 1 tokens of each concatenation: a sliding layer holds min(tokens so far, window) positions
    (its prefill's whole concatenation until its first decode update), and its old keys and values are alive
    beside the new ones during the update;
  * StaticLayer writes with index_copy_ in place: no transient; attention reads every preallocated position;
  * SDPA attends the single query without repeating the keys and values (integrations/sdpa_attention.py pack_gqa);
    eager attention expands them to every head (repeat_kv) and adds its scores (fp32 softmax and its cast,
    B x heads x 1 x positions);
  * generate's own tensors: input_ids and the attention mask grow by torch.cat each step (int64, B x positions),
    and the previous step's next-token logits (an fp32 copy, B x V) stay referenced as a local of the loop
    through the next forward (greedy search without logits processors: the scores are that same tensor).
Modelled from the transformers source and measured with real tensors on CPU (data/measured_cpu.jsonl, the suite's
`*-generate*` entries).
"""

from __future__ import annotations

from calc.contract.i18n import T_, Text
from calc.contract.scenario import Attention, Mode, Scenario
from calc.memory.result import DECODE_CACHE_UPDATE, DECODE_LOGITS
from calc.sim.blocks import final_norm
from calc.sim.graph import Graph
from calc.sim.layers import Ctx
from calc.sim.ops import linear

INT64_BYTES = 8
FP32_BYTES = 4


def generating(sc: Scenario) -> bool:
    return sc.inference.new_tokens > 0


def static_cache_compile_note(sc: Scenario, target: str) -> Text | None:
    """On a GPU, transformers' generate compiles the decoding forward when the cache is static
    (generation/utils.py _valid_auto_compile_criteria, CompileConfig mode "reduce-overhead"): CUDA graphs and
    their private memory pool join the run, which this estimate does not model (60-120 MiB above it on the small
    models measured on an H200)."""
    if target != "cuda" or sc.mode != Mode.inference or not generating(sc) or sc.inference.kv_cache != "static":
        return None
    return T_("with a static KV cache on a GPU, transformers compiles the decoding step with CUDA graphs; their "
              "memory pool is not in this estimate (60-120 MiB above it on the small models measured)")


def cache_position_bytes(ctx: Ctx) -> tuple[int, int]:
    """(keys, values) bytes one layer's cache holds per position, for the micro-batch: k in RoPE's dtype and v
    promoted to it (the cache stores what attention reads); MLA models: the compressed latent and the rotary key."""
    s = ctx.spec
    if s.mla:
        latent = ctx.batch * s.kv_lora_rank * ctx.act_elem_bytes
        return latent, ctx.batch * s.qk_rope_head_dim * max(ctx.act_elem_bytes, ctx.rope_elem_bytes)
    half = ctx.batch * (s.kv_width // ctx.tp) * ctx.rope_elem_bytes
    return half, half


def window_of(ctx: Ctx, layer: int) -> int | None:
    """The layer's sliding window, or None for a full-attention layer (cache_utils.get_layer_types_and_kwargs: a
    layer slides where the config has a sliding_window and, with layer_types, is a sliding_attention layer). Gemma 2's
    spec names no window (its every other layer slides): its cache is counted at full length, an upper bound."""
    s = ctx.spec
    return s.sliding_window if s.sliding_window is not None and s.is_sliding(layer) else None


def static_cache_positions(sc: Scenario, ctx: Ctx) -> int:
    """A static cache's length: generate sizes it max_length - 1 = prompt + new tokens - 1, the last token never
    being fed back (generation/utils.py, generate: max_cache_length)."""
    return ctx.seq + sc.inference.new_tokens - 1


def prefill_cache_positions(sc: Scenario, ctx: Ctx, layer: int) -> int:
    """Positions layer `layer`'s cache holds once the prefill updated it: the prompt (dynamic, its sliding layers
    too: a view keeps the whole concatenation), or the preallocated static length (a sliding layer's
    StaticSlidingWindowLayer is min(window, that length) long)."""
    if sc.inference.kv_cache == "dynamic":
        return ctx.seq
    window, total = window_of(ctx, layer), static_cache_positions(sc, ctx)
    return total if window is None else min(window, total)


def prefill_cache_bytes(sc: Scenario, ctx: Ctx, layers: int) -> list[int]:
    """Each layer's cache bytes after its prefill update."""
    k, v = cache_position_bytes(ctx)
    return [(k + v) * prefill_cache_positions(sc, ctx, i) for i in range(layers)]


def prefill_head_block(c: Ctx) -> Graph:
    """The prefill's head under generate: the final norm over every position, then the lm_head on the last one
    (`hidden_states[:, slice(-1, None), :]`, a view), soft-capped where the family caps (modeling_*.py
    ForCausalLM.forward with logits_to_keep=1)."""
    s = c.spec
    g = Graph(input_bytes=c.residual_elem_bytes * c.tokens * s.hidden_size, round_to=512 if c.cuda else 1)
    y, _ = final_norm(g, c)
    v = s.vocab_size // c.tp
    logits = linear(g, y, s.hidden_size, v, c, name="lm_head", tokens=c.batch)  # on a view of the last position
    g.keep(y)
    if s.final_logit_softcapping:
        for step in ("/ softcap", "tanh", "* softcap"):
            logits = g.op(c.act_elem_bytes * c.batch * v, ins=(logits,), name=step)
    g.output = logits
    return g


def generate_loop_bytes(ctx: Ctx, positions: int) -> int:
    """generate's own tensors at a decode forward: input_ids and the attention mask at `positions` (int64, the
    previous ones freed after the cat), the prompt's input_ids, attention mask and position ids (int64, B x S, kept
    through the call) and the previous step's next-token logits (the fp32 copy, B x V, a local of the loop)."""
    return (INT64_BYTES * ctx.batch * (2 * positions + 3 * ctx.seq)
            + FP32_BYTES * ctx.batch * (ctx.spec.vocab_size // ctx.tp))


def repeat_kv_bytes(ctx: Ctx, positions: int) -> int:
    """repeat_kv's keys and values expanded to every query head over `positions` (0 without grouped queries:
    repeat_kv returns its input)."""
    s = ctx.spec
    if s.num_heads == s.num_kv_heads or s.mla:
        return 0
    return 2 * ctx.batch * (s.num_heads // ctx.tp) * s.head_dim * positions * ctx.rope_elem_bytes


def scores_bytes(ctx: Ctx, queries: int, positions: int) -> int:
    """Eager attention's fp32 softmax and its cast to the compute dtype (B x heads x queries x positions)."""
    return ctx.batch * (ctx.spec.num_heads // ctx.tp) * queries * positions * (FP32_BYTES + ctx.act_elem_bytes)


def decode_attention_bytes(sc: Scenario, ctx: Ctx, positions: int) -> int:
    """The attention transients of one decoded token over `positions` cached positions: eager's repeat_kv'd keys
    and values and its scores; SDPA reshapes the single query per key-value head instead of repeating them
    (integrations/sdpa_attention.py pack_gqa), so it adds nothing of that size. Under autocast attention reads
    16-bit casts of the layer's fp32 cached keys and values."""
    eager = sc.training.attention == Attention.eager
    out = repeat_kv_bytes(ctx, positions) + scores_bytes(ctx, 1, positions) if eager else 0
    if ctx.amp:
        out += sum(cache_position_bytes(ctx)) * positions * ctx.act_elem_bytes // ctx.rope_elem_bytes
    return out


def autocast_head_copy_bytes(ctx: Ctx) -> int:
    """Under autocast, the 16-bit copy of the lm_head weight the prefill cast: autocast's weight cache keeps it
    until the autocast region (the whole generate call) ends (aten/src/ATen/autocast_mode.cpp, cached_cast)."""
    return 2 * (ctx.spec.vocab_size // ctx.tp) * ctx.spec.hidden_size if ctx.amp else 0


def static_prefill_extra(sc: Scenario, ctx: Ctx, layer: int) -> int:
    """What a static cache adds to layer `layer`'s prefill beyond the prompt-sized cache copies its profile holds:
    the preallocated positions past the prompt; eager attention also reads them (repeat_kv over every position and
    longer scores), where SDPA runs is_causal without a mask and with its grouped-query path (the mask of the
    prompt's queries is skipped: masking_utils._ignore_causal_mask_sdpa)."""
    positions = prefill_cache_positions(sc, ctx, layer)
    k, v = cache_position_bytes(ctx)
    extra = (k + v) * (positions - ctx.seq)
    if sc.training.attention == Attention.eager:
        return extra + repeat_kv_bytes(ctx, positions - ctx.seq) + scores_bytes(ctx, ctx.seq, positions - ctx.seq)
    return extra


def static_prefill_mask_bytes(sc: Scenario, ctx: Ctx, layers: int, eager_mask: int) -> int:
    """Eager attention's prefill mask over every static position (B x 1 x S x positions, as the S x S one is);
    SDPA's prompt needs none."""
    if sc.training.attention != Attention.eager:
        return eager_mask
    return eager_mask * max(prefill_cache_positions(sc, ctx, i) for i in range(layers)) // ctx.seq


def final_cache_bytes(sc: Scenario, ctx: Ctx, layers: int, positions: int) -> int:
    """Every layer's cache once `positions` tokens went through it: a dynamic full-attention layer holds them all,
    a dynamic sliding layer min(positions, window); a static layer its preallocated length."""
    k, v = cache_position_bytes(ctx)
    static = sc.inference.kv_cache == "static"
    total = 0
    for i in range(layers):
        window, held = window_of(ctx, i), static_cache_positions(sc, ctx) if static else positions
        total += (k + v) * (held if window is None else min(window, held))
    return total


def decode_rows(sc: Scenario, ctx: Ctx, layers: int) -> list[tuple[str, int, int]]:
    """(event, cache bytes, other bytes) of the decoding's two largest moments, in the last step (asked only when
    there is a decode step, new_tokens > 1): the last layer's cache update, every other layer's cache already at
    full length, with the update's and attention's transients; and the next-token logits after that forward
    (the step's B x 1 x V logits, their new fp32 copy beside the previous step's). Under autocast attention
    reads 16-bit casts of the layer's fp32 cache and the lm_head's 16-bit copy stays cached."""
    n = sc.inference.new_tokens
    k, v = cache_position_bytes(ctx)
    before = ctx.seq + n - 2  # positions cached when the last decode step starts
    cache = final_cache_bytes(sc, ctx, layers, before + 1)
    window = window_of(ctx, layers - 1)
    if sc.inference.kv_cache == "static":
        full = static_cache_positions(sc, ctx)
        seen, update = full if window is None else min(window, full), 0
    else:
        seen = before + 1 if window is None else min(window, before + 1)
        # DynamicLayer rebinds its keys before concatenating the values: the old keys beside the new; a sliding
        # layer concatenates both before rebinding either: its old keys and values beside the new
        update = k * before if window is None else (k + v) * min(window, before)
    loop = generate_loop_bytes(ctx, before + 1) + autocast_head_copy_bytes(ctx)
    vocab = ctx.batch * (ctx.spec.vocab_size // ctx.tp)
    # the old keys are freed when the update returns, before attention reads the cache
    return [(DECODE_CACHE_UPDATE.format(token=n, layer=layers - 1), cache,
             max(update, decode_attention_bytes(sc, ctx, seen)) + loop),
            (DECODE_LOGITS.format(token=n), cache, loop + vocab * (ctx.act_elem_bytes + FP32_BYTES))]

"""Activations: what the blocks' autograd graphs keep alive, as the timeline reads them.

The context each block is simulated in (`block_context`: shape, bytes per element, parallel layout, LoRA), each
layer's context (`layer_ctxs`: the kinds of layer a model mixes), the block profiles (calc.sim.profiles, recorded
once per shape-free context), what a layer keeps for backward under checkpointing (`layer_saved_bytes`), the
model-level tensors (RoPE tables, attention masks, autocast's weight copies), the output a training loop keeps
(`HeldOutputs`) and the recommender's lower bound of a forward pass (`forward_activations_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from calc.contract import parallel, precision
from calc.contract.architectures import GEMMA_FAMILIES, ModelSpec, per_spec
from calc.contract.scenario import Attention, Checkpointing, Mode, Precision, Scenario
from calc.memory.repeats import identical_layers, layers_repeat, of_kinds, per_layer, prefix_sums
from calc.memory.states import adapter_bytes, param_count
from calc.sim.frameworks.litgpt import litgpt_logits_bytes, litgpt_qlora_fields
from calc.sim.frameworks.torchtune import TORCHTUNE_OUTPUT_CHUNKS, torchtune_embedding_block, torchtune_head_block
from calc.sim.graph import BlockProfile, Graph
from calc.sim.layers import (
    Ctx,
    attention_block,
    decoder_layer,
    embedding_block,
    head_block,
    layer_norm,
    liger_head_block,
    rms_norm,
    sdpa_needs_mask,
)
from calc.sim.profiles import block_profile

Target = Literal["cuda", "cpu"]


# ---- contexts --------------------------------------------------------------------------------------------------------

def block_context(sc: Scenario, target: Target, fsdp: bool = False) -> Ctx:
    """The context the scenario's blocks run in on one GPU: its shape, the bytes per element of weights,
    activations and residual stream (FSDP2's MixedPrecisionPolicy runs *-mixed on gathered 16-bit weights), the
    parallel layout, and LoRA (the frozen base in bf16 whatever the precision: quantized bases dequantize to it)."""
    t = sc.training
    p = t.precision
    if fsdp and p.is_mixed:  # MixedPrecisionPolicy: forward/backward on gathered 16-bit weights
        p = Precision.bf16
    lora = t.lora
    common = dict(spec=sc.spec, batch=t.micro_batch_size, seq=t.seq_len, cuda=target == "cuda",
                  tp=t.tensor_parallel, sp=t.sequence_parallel, ep=t.expert_parallel,
                  cast_expert_inputs=fsdp and t.precision.is_mixed and t.expert_parallel > 1,
                  use_cache=t.activation_checkpointing != Checkpointing.full or sc.mode == Mode.inference,
                  train=sc.mode == Mode.train, framework=t.framework,
                  loss_chunks=t.cross_entropy_chunks, output_chunks=output_chunks(sc))
    if lora is None:
        return Ctx(weight_elem_bytes=precision.weight_bytes_per_param(p), act_elem_bytes=precision.activation_bytes(p),
                   residual_elem_bytes=precision.residual_bytes(p), amp=p.is_amp, **common)
    return Ctx(weight_elem_bytes=2, act_elem_bytes=2, residual_elem_bytes=2, amp=False, lora_rank=lora.rank,
               lora_targets=sc.spec.lora_target_names(lora.targets), frozen_base=True,
               adapter_bytes=adapter_bytes(p, lora.base_weights), adapter_amp=p.is_amp and adapter_bytes(p) == 4,
               quantized_base=lora.base_weights if lora.quantized else "", lora_dropout=lora.dropout,
               lora_trained=frozenset(n for n in ("lm_head", "embed_tokens")
                                      if sc.spec.module_name(n) in lora.modules_to_save),
               **litgpt_qlora_fields(t.framework == "litgpt" and lora.quantized), **common)


def output_chunks(sc: Scenario) -> int:
    """torchtune's output projection chunks (TransformerDecoder.set_num_output_chunks, which the recipes call with
    the chunked loss's num_output_chunks): cross_entropy_chunks, null = torchtune's 8; 0 where the projection
    runs whole."""
    t = sc.training
    if t.framework != "torchtune" or t.cross_entropy != "chunked":
        return 0
    return t.cross_entropy_chunks or TORCHTUNE_OUTPUT_CHUNKS


def layer_ctxs(ctx: Ctx, layers: int, first_input_grad: bool = True) -> list[Ctx]:
    """Each layer's context: models that mix sliding-window and full-attention layers (Gemma 3's
    layer_types) or dense and MoE layers (first_k_dense_replace) run several kinds of layer;
    counted from the stage's first layer. first_input_grad=False: layer 0 reads an embedding
    output that requires no grad (embeddings_need_grad), which makes it a kind of its own."""
    spec = ctx.spec
    if spec.layer_types is None and not spec.dense_layers and first_input_grad:
        return [ctx] * layers
    kinds, pattern = per_spec(spec, ("kinds of layer", layers, first_input_grad),
                              lambda: kinds_of_layer(spec, layers, first_input_grad))
    # each kind made once (a dataclass replace per layer cost more than the layer's rows)
    return of_kinds([ctx.with_kind(*kind) for kind in kinds], pattern)


def kinds_of_layer(spec: ModelSpec, layers: int, first_input_grad: bool) \
        -> tuple[list[tuple[bool, bool, bool]], tuple[int, ...]]:
    """The kinds of layer of the stage (sliding window, dense MLP, input requires grad), first seen first, and
    the kind of each layer: asked once per model (126 layers' questions cost more than a new shape's profiles)."""
    kinds: dict[tuple[bool, bool, bool], int] = {}
    pattern = tuple(kinds.setdefault((spec.is_sliding(i), i < spec.dense_layers, i > 0 or first_input_grad),
                                     len(kinds)) for i in range(layers))
    return list(kinds), pattern


def embeddings_need_grad(ctx: Ctx, ckpt: Checkpointing) -> bool:
    """Whether the embedding output requires grad: yes unless the embedding is frozen (LoRA). With a
    frozen base, transformers' activation_checkpointing_enable (and peft when the model already
    checkpoints) hooks the input embeddings to require grad (enable_input_require_grads), so the
    checkpointed layers' recompute can reach the adapters; without that hook layer 0's input norm and
    frozen projections record no autograd node and save nothing. A trainable copy of the embedding (LoRA
    modules_to_save) makes its output require grad, as LitGPT QLoRA's StableEmbedding does. torchtune sets no such
    hook (its non-reentrant checkpoint needs none)."""
    return ctx.trains("embed_tokens") or ctx.stable_embedding or \
        (ckpt == Checkpointing.full and ctx.framework != "torchtune")


# ---- block profiles --------------------------------------------------------------------------------------------------

def block_profiles(ctx: Ctx, eager: bool, fused_ce: bool = False,
                   replay: bool = False) -> tuple[BlockProfile, BlockProfile, BlockProfile]:
    """(decoder layer, embedding, LM head + loss) profiles; `fused_ce`: Liger's fused linear cross-entropy head;
    `replay`: simulate the graphs again instead of evaluating their recordings (the reference path)."""
    head = torchtune_head_block if ctx.framework == "torchtune" else liger_head_block if fused_ce else head_block
    embedding = torchtune_embedding_block if ctx.framework == "torchtune" else embedding_block
    return (layer_profile(ctx, eager, replay), block_profile(embedding, ctx, replay=replay),
            block_profile(head, ctx, replay=replay))


def layer_profile(ctx: Ctx, eager: bool, replay: bool = False) -> BlockProfile:
    """One decoder layer's profile in its context (eager or SDPA attention)."""
    return block_profile(decoder_layer, ctx, eager, replay=replay)


def attention_saved_bytes(ctx: Ctx, eager: bool, replay: bool = False) -> int:
    """Bytes the attention sub-block saves (what selective checkpointing drops), from a graph of
    the layer without its MLP half."""
    return (block_profile(norm_and_attention, ctx, eager, replay=replay).saved
            - block_profile(norm_and_attention, ctx, None, replay=replay).saved)


def norm_and_attention(ctx: Ctx, eager: bool | None) -> Graph:
    """A layer's input norm and (unless eager is None) its attention module."""
    g = Graph(input_bytes=ctx.residual_elem_bytes * ctx.tokens * ctx.spec.hidden_size,
              input_requires_grad=ctx.input_grad)
    norm = layer_norm if ctx.spec.uses_layernorm else rms_norm
    y, _ = norm(g, 0, ctx.residual_elem_bytes, ctx)
    if eager is not None:
        attention_block(g, y, ctx, eager)
    return g


# ---- what a layer keeps ----------------------------------------------------------------------------------------------

def residual_stream_bytes(ctx: Ctx) -> int:
    """One layer's input (the residual stream): B x S x hidden in the residual dtype, S / tp under sequence
    parallelism."""
    return ctx.residual_elem_bytes * (ctx.tokens // ctx.tp if ctx.sp else ctx.tokens) * ctx.spec.hidden_size


def layer_saved_bytes(p: BlockProfile, drop: int, checkpointed: bool, h_bytes: int) -> int:
    """What a layer keeps for backward after its forward: only its input (`h_bytes`) when its checkpoint wraps it,
    else its saved tensors less what selective checkpointing drops (`drop`, the attention core's), plus the
    attention input selective checkpointing stores instead."""
    if checkpointed:
        return h_bytes
    return p.saved - drop + (h_bytes if drop else 0)


def amp_cached_weight_bytes(spec: ModelSpec, ctx: Ctx) -> int:
    """16-bit copies of one layer's matmul weights and biases (everything but the norms). transformers' grouped_mm
    experts are no autocast op and read the routed experts' weights as they are: no copies of those (Llama 4's
    bmm experts are cast)."""
    routed = 0 if spec.family == "llama4_text" else spec.routed_expert_params_per_layer()
    return 2 * (param_count(spec, "layer_matmul_params") - routed) // ctx.tp


def autocast_weight_copies_bytes(sc: Scenario) -> int:
    """Under AMP, the 16-bit copies autocast makes of every decoder layer's matmul weights on one
    GPU (autograd saves them for backward, so they sit among the activations); 0 otherwise."""
    ctx = block_context(sc, "cuda")
    layers = parallel.layers_on_stage(sc.spec.num_layers, sc.training.pipeline_parallel)
    return amp_cached_weight_bytes(sc.spec, ctx) * layers if ctx.amp else 0


def model_level_bytes(ctx: Ctx, eager: bool) -> tuple[int, int]:
    """(saved, forward-only) model-level tensors: RoPE cos/sin (1 x S x rotary_dim each, from the
    (1, S) position ids, residual dtype, saved by every layer's RoPE) and the eager float causal mask (B x 1 x S x S
    in the model dtype, freed when the decoder stack returns; transformers masking_utils.eager_mask)."""
    s = ctx.spec
    if ctx.framework in ("litgpt", "torchtune"):  # the RoPE cos / sin are model buffers (counted with the weights);
        # SDPA runs is_causal
        return 0, 0
    rope = 0
    if s.rope_complex:  # DeepSeek-V2: one complex64 freqs_cis (1, S, rotary_dim / 2)
        rope = 4 * ctx.seq * s.rotary_dim
    elif s.family != "gpt2":
        rope = 2 * ctx.seq * s.rotary_dim * ctx.residual_elem_bytes
    mask = ctx.batch * ctx.seq * ctx.seq * (4 if ctx.residual_elem_bytes == 4 else ctx.act_elem_bytes) if eager else 0
    two_kinds = s.layer_types is not None and len(set(s.layer_types)) > 1
    if eager and (s.family in GEMMA_FAMILIES or two_kinds):  # a full-causal and a sliding-window mask
        mask *= 2
    if two_kinds and not s.rope_complex:  # Gemma 3: a local and a global RoPE (Llama 4: one freqs_cis)
        rope *= 2
    elif not eager and sdpa_needs_mask(ctx):
        # SDPA's boolean sliding-window mask: built (1, 1, S, S) and expanded over the batch (a view)
        mask = ctx.seq * ctx.seq
    return rope, mask


def checkpoint_kept_bytes(ctx: Ctx, mask: int, ckpt: Checkpointing) -> int:
    """What non-reentrant checkpointing keeps alive until the first checkpointed layer (layer 0) is
    recomputed in backward: the arguments of every checkpointed call, among them the attention
    mask(s) and the (1, S) int64 position_ids (torch.utils.checkpoint keeps the call's args for the
    recompute; transformers passes them as keyword arguments). Without checkpointing they are freed
    when the decoder stack returns. torchtune's layers take no mask and no positions in training (None)."""
    if ctx.framework == "torchtune":
        return 0
    return mask + 8 * ctx.seq if ckpt in (Checkpointing.full, Checkpointing.selective) else 0


# ---- the output a loop keeps -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldOutputs:
    """The model output a loop keeps (`outputs = model(**batch)`): logits and the DynamicCache.

    `outputs` is rebound only after the next forward returns, so in the steady state the previous
    step's output is alive through the whole next forward; the current one from the loss on
    through backward and the optimizer step. During backward the simulator already counts the
    cache tensors that autograd saved, so only the cache of layers whose backward has run
    (their saved tensors released, the cache still holding them) and the unsaved copies are added."""

    logits_bytes: int = 0
    cache_unsaved_bytes: int = 0  # all layers: cache copies no autograd node saved
    # [i]: the cache copies autograd saved in layers i and above (counted until released); the last is 0
    cache_saved_from: tuple[int, ...] = (0,)

    @property
    def previous(self) -> int:
        """The whole output object (previous step's, or this one's after backward)."""
        return self.logits_bytes + self.cache_unsaved_bytes + self.cache_saved_from[0]

    def backward(self, unreleased: int) -> int:
        """Held bytes the simulator does not count while the lowest `unreleased` layers still hold
        their saved tensors (the layers above them have run their backward)."""
        tails = self.cache_saved_from
        return self.logits_bytes + self.cache_unsaved_bytes + tails[unreleased if unreleased < len(tails) else -1]


NOTHING_HELD = HeldOutputs()  # frozen: one for every estimate whose loop keeps no output


def held_outputs(ctx: Ctx, lay: list[BlockProfile], keep: bool, selective: bool,
                 fused_ce: bool = False) -> HeldOutputs:
    """`outputs.logits` is the lm_head output (B x S x V/tp in the compute dtype, soft-capped where
    the family caps; the fp32 upcast for the loss is a separate tensor) and `outputs.past_key_values`
    the DynamicCache transformers builds in training whenever checkpointing is not full
    (transformers/modeling_outputs.py CausalLMOutputWithPast). Liger's fused
    loss returns no logits in training. LitGPT's finetune/full.py keeps its fp32 logits in any case."""
    if ctx.framework == "litgpt":
        return HeldOutputs(litgpt_logits_bytes(ctx))
    if not keep:
        return NOTHING_HELD
    logits = 0 if fused_ce else ctx.act_elem_bytes * ctx.tokens * (ctx.spec.vocab_size // ctx.tp)
    if selective:  # the reference's checkpointed attention runs without a cache (measure/workload.py)
        return HeldOutputs(logits)
    saved = [p.cached_total - p.cached_unsaved for p in lay]
    # sums from each layer up: backward() is asked once per layer, so O(L) in all, not O(L^2)
    return HeldOutputs(logits, sum(p.cached_unsaved for p in lay), tuple(accumulate(reversed(saved), initial=0))[::-1])


# ---- the recommender's bound -----------------------------------------------------------------------------------------

def forward_activations_floor(sc: Scenario) -> int:
    """A lower bound of what a training estimate's peak holds beyond the first stage's weights and optimizer
    states (calc.recommend.search.states_floor): the activations alive at the end of the first pipeline stage's
    forward, the row of its last layer in calc.memory.train_timeline (every in-flight micro-batch's saved tensors
    of the embedding and of each layer, and the rotary tables). 0 where no bound is taken (inference, FSDP2). A
    layer checkpointed at every layer keeps only its input, so no layer profile is built for it. The recommender
    skips the estimate of a configuration whose floor exceeds the usable memory;
    tests/calc/recommend/test_recommend_shortcuts.py checks the bound against the engine."""
    t = sc.training
    if sc.mode != Mode.train or t.sharding == "fsdp2":
        return 0
    ctx = block_context(sc, "cuda")
    eager, ckpt = t.attention == Attention.eager, t.activation_checkpointing
    layers = parallel.layers_on_stage(sc.spec.num_layers, t.pipeline_parallel)
    h_bytes = residual_stream_bytes(ctx)
    every = t.checkpoint_every if ckpt == Checkpointing.full else 0
    if every == 1:
        saved = layers * h_bytes
    else:
        ctxs = layer_ctxs(ctx, layers, first_input_grad=embeddings_need_grad(ctx, ckpt))
        lay = per_layer(ctxs, lambda c: layer_profile(c, eager))
        drop = per_layer(ctxs, lambda c: attention_saved_bytes(c, eager)) if ckpt == Checkpointing.selective \
            else [0] * layers
        # the sum composed from the first layers and one period of their repeat, as the timeline's
        lead, period = layers_repeat(lay, drop, every, identical_layers(lay, drop))
        saved = prefix_sums(lambda i: layer_saved_bytes(lay[i], drop[i], bool(every) and i % every == 0, h_bytes),
                            layers, period, 0, lead)[layers]
    in_flight = parallel.microbatches_in_flight(t.pipeline_parallel, t.gradient_accumulation_steps)
    return in_flight * (saved + block_profile(embedding_block, ctx).saved) + model_level_bytes(ctx, eager)[0]

"""A training step's timeline on one pipeline stage, composed from its three block profiles and model states:

  forward layer i : base + embedding saved + sum_{j<i} saved_j + layer forward peak
  loss backward   : base + all saved + head backward peak (logits' fp32 grads)
  backward layer i: base + sum_{j<i} saved_j + grads of layers > i + layer backward peak
  optimizer step  : weights + grads + states (+ master) + optimizer temporaries

optimizer_in_backward (torchtune's optimizer_in_bwd) steps each parameter in its post-accumulate-grad hook and
frees its gradient there: no gradients pile up in backward, each block adds the moment of its largest parameter's
hook (that gradient + one parameter's step temporaries), and there is no step after backward.

where base = weights (+ states and master weights from step 2 on, since torch.optim creates them lazily in step 1)
+ input ids. `TrainStage` holds what every row reads (the layers, their running sums, the model-state terms); one
method per section of the step adds its rows: the forward, the loss, the backward (with DeepSpeed ZeRO-1/2's
gradient partition, FSDP2's all-gathers and reduce-scatters and expert parallelism's experts group), the
embedding's backward and the gradient epilogue; `optimizer_rows` adds the step itself.
"""

from __future__ import annotations

from collections.abc import Callable

from calc.contract import parallel
from calc.contract.scenario import Attention, Checkpointing, Scenario
from calc.memory.activations import (
    amp_cached_weight_bytes,
    attention_saved_bytes,
    block_profiles,
    checkpoint_kept_bytes,
    embeddings_need_grad,
    held_outputs,
    layer_ctxs,
    layer_profile,
    layer_saved_bytes,
    model_level_bytes,
    residual_stream_bytes,
)
from calc.memory.fsdp2 import (
    fsdp2_experts_unshard_in_recompute,
    fsdp2_layer_terms,
    fsdp2_local_expert_grad_bytes,
)
from calc.memory.offload import offload_plan
from calc.memory.repeats import (
    Layers,
    LinearSums,
    PrefixSums,
    identical_layers,
    layers_repeat,
    per_layer,
    pieces,
    prefix_sums,
    split_at_switch,
    split_pieces,
)
from calc.memory.result import (
    ALL_GATHER_LAYER,
    EXPERTS_REDUCE_LAYER,
    HOOK_STEP_EMBEDDING,
    HOOK_STEP_HEAD,
    HOOK_STEP_LAYER,
    REDUCE_SCATTER_LAYER,
)
from calc.memory.states import States, param_count, partition_bytes, step_gradient_bytes
from calc.memory.timeline import StepTimeline, TimelineRow, layer_names
from calc.sim.frameworks.litgpt import litgpt_resident_bytes, litgpt_stable_embedding_grad_bytes
from calc.sim.graph import BlockProfile
from calc.sim.layers import Ctx, final_norm_block
from calc.sim.profiles import block_profile

# a layer's backward peak as (parameter gradients, saved tensors still alive, other bytes)
Moment = tuple[int, int, int]


def train_timeline(sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool, workspace_bytes: int,
                   replay: bool = False) -> StepTimeline:
    """The training step of a pipeline stage of `layers` layers (`first`: it holds the embedding, `last`: the
    head and loss) with model states `st`; `workspace_bytes`: the cuBLAS workspace bytes; `replay`: simulate the
    blocks again (the reference path)."""
    stage = TrainStage(sc, st, ctx, layers, first, last, workspace_bytes, replay)
    tl = StepTimeline()
    if stage.litgpt and first:  # counted among the resident bytes, drawn as the gradients they are
        tl.held_gradients = litgpt_stable_embedding_grad_bytes(ctx)
    stage.add_forward(tl)
    stage.add_loss(tl)
    stage.add_backward(tl)
    stage.add_embedding_backward(tl)
    stage.add_gradient_epilogue(tl)
    if st.in_backward is None:  # optimizer_in_backward: every parameter was stepped in backward
        # the cuBLAS workspaces stay allocated for the process's life (PyTorch's handle pool keeps them): the
        # GPU records show them in the optimizer phase as in the others
        optimizer_rows(tl, sc, st, stage.input_bytes + stage.held.previous + st.zero_buffers + workspace_bytes)
    return tl


class TrainStage:
    """What the rows of one stage's training step read; each add_* method adds one section's rows."""

    def __init__(self, sc: Scenario, st: States, ctx: Ctx, layers: int, first: bool, last: bool, workspace_bytes: int,
                 replay: bool = False) -> None:
        t = sc.training
        self.sc, self.st, self.ctx, self.layers, self.first, self.last = sc, st, ctx, layers, first, last
        self.replay = replay
        self.eager = t.attention == Attention.eager
        self.fused_ce = t.cross_entropy == "liger-fused"
        self.ckpt = t.activation_checkpointing
        self.every = t.checkpoint_every if self.ckpt == Checkpointing.full else 0  # 0: no full checkpointing
        layer, self.emb, self.head = block_profiles(ctx, self.eager, self.fused_ce, replay)
        self._decoder_layers(layer)
        self._model_level_terms()
        self._state_terms(workspace_bytes)

    # ---- what the rows read ------------------------------------------------------------------------------------------

    def _decoder_layers(self, layer: BlockProfile) -> None:
        """The layers' contexts and profiles (layers of one kind share a profile; the stage's own context's is
        `layer`), selective checkpointing's drops, where they repeat and the pieces of a run of their rows."""
        ctx, eager, replay, layers = self.ctx, self.eager, self.replay, self.layers
        self.ctxs = layer_ctxs(ctx, layers, first_input_grad=not self.first or embeddings_need_grad(ctx, self.ckpt))
        lay = per_layer(self.ctxs, lambda c: layer if c is ctx else layer_profile(c, eager, replay))
        self.sel_drop = per_layer(self.ctxs, lambda c: attention_saved_bytes(c, eager, replay)) \
            if self.ckpt == Checkpointing.selective else [0] * layers
        self.h_bytes = residual_stream_bytes(ctx)  # one layer's input
        alike = identical_layers(lay, self.sel_drop)
        # per-layer values repeat after the first `lead` layers
        self.lead, self.period = layers_repeat(lay, self.sel_drop, self.every, alike)
        self.pieces = pieces(lay, self.every, self.sel_drop, alike, (self.lead, self.period))
        if alike:  # equal profiles (e.g. sliding and full attention on a sequence inside the window): one object
            lay = [lay[0]] * layers
        self.kinds = [lay[0]] if alike else lay.kinds if isinstance(lay, Layers) else list(dict.fromkeys(lay))
        self.lay = lay
        self.saved_by_layer = self.sums(self.saved)

    def _model_level_terms(self) -> None:
        """The RoPE tables and masks, the input ids, what checkpointing keeps to the recompute, the micro-batches
        in flight and the output the loop keeps."""
        ctx, t = self.ctx, self.sc.training
        self.rope_bytes, self.mask_bytes = model_level_bytes(ctx, self.eager)
        self.litgpt = ctx.framework == "litgpt"
        self.input_bytes = litgpt_resident_bytes(ctx) if self.litgpt else 8 * ctx.tokens
        self.kept = checkpoint_kept_bytes(ctx, self.mask_bytes, self.ckpt)  # alive from forward to layer 0's recompute
        self.in_flight = parallel.microbatches_in_flight(t.pipeline_parallel, t.gradient_accumulation_steps)
        self.held = held_outputs(ctx, self.lay, t.keep_outputs and self.last, self.ckpt == Checkpointing.selective,
                                 self.fused_ce)
        # activation_offload (every layer checkpointed): the decoder's packs through torchtune's forward stash
        # a frozen embedding's output made to require grad (a leaf) stays on the device: its AccumulateGrad holds it
        self.leaf_h = self.h_bytes if t.activation_offload and self.first and self.ctxs[0].input_grad \
            and not ctx.trains("embed_tokens") else 0
        self.offload = offload_plan(ctx, self.layers, self.h_bytes, bool(self.leaf_h)) if t.activation_offload \
            else None

    def _state_terms(self, workspace_bytes: int) -> None:
        """The model states as every row counts them: weights (FSDP2's root stays gathered through forward and
        backward), the gradients between micro-steps, the optimizer's bytes, the other bytes alive throughout,
        FSDP2's per-layer terms and the gradients' scale (the sharded gradients over the profiles' own)."""
        st, t = self.st, self.sc.training
        self.w = st.weights + st.gathered_root
        self.gl, self.keep_gathered = st.gathered_layer, not st.reshard_after_forward
        self.fsdp = fsdp2_layer_terms(st, self.ctxs) if self.gl else None  # a MoE model's dense layers: smaller groups
        self.root_ag = st.gathered_root if self.gl else 0  # the root group's all-gather output (padded like its params)
        self.opt = st.optimizer
        self.in_bwd = st.in_backward
        # optimizer_in_backward: the largest gradient one of a decoder layer's hooks holds, and the token
        # embedding's or lm_head's (V x H, vocab-parallel), trained in full fine-tuning
        self.layer_hook_grad = self.in_bwd.largest_layer_param * st.grad_bytes if self.in_bwd else 0
        self.vocab_grad = self.in_bwd.vocab_param * st.grad_bytes if self.in_bwd else 0
        self.part = partition_bytes(st)
        # DeepSpeed ZeRO-1/2: between micro-steps the accumulated gradients are views of the last partition
        self.ga_grads = self.part if t.gradient_accumulation_steps > 1 or st.persistent_grads else 0
        self.other_forward = self.input_bytes + workspace_bytes + st.zero_buffers + st.zero3_gathered
        # DeepSpeed ZeRO-1/2 allocates its reduce buckets at the first gradient hook
        self.other_backward = self.other_forward + st.reduce_buckets
        # a layer's share of the (sharded) gradients: under expert parallelism its profile holds the E / ep local
        # experts' gradients, which FSDP2 shards over n / ep ranks, not n: count them ep times against the total
        self.ep_extra = [fsdp2_local_expert_grad_bytes(c) * (c.ep - 1) for c in self.ctxs] if st.gathered_experts \
            else None
        layer_pgrads = self.sums(self.sharded_share)[self.layers]
        self.scale_g = st.grads / max(1, (layer_pgrads + self.head.param_grad_bytes + self.emb.param_grad_bytes)) \
            if st.grads else 0.0

    def sums(self, fn: Callable[[int], int], start: int = 0) -> PrefixSums | LinearSums:
        """start + fn(0) + ... + fn(i - 1) over the stage's layers, composed from their repeat."""
        return prefix_sums(fn, self.layers, self.period, start, self.lead)

    def checkpointed(self, i: int) -> bool:
        """Whether full checkpointing wraps layer i (every k-th layer from layer 0)."""
        return bool(self.every) and i % self.every == 0

    def saved(self, i: int) -> int:
        return layer_saved_bytes(self.lay[i], self.sel_drop[i], self.checkpointed(i), self.h_bytes)

    def sharded_share(self, i: int) -> int:
        return self.lay[i].param_grad_bytes + (self.ep_extra[i] if self.ep_extra else 0)

    def grads_of(self, i: int) -> int:
        """Layer i's gradients alive once its backward is done (none where its hooks stepped and freed them)."""
        return round(self.sharded_share(i) * self.scale_g) if self.st.grads and self.in_bwd is None else 0

    def hook_temp(self, event: str) -> int:
        """optimizer_in_backward: the step temporaries of the hook that `event` names."""
        return self.in_bwd.hook_temp_bytes(event) if self.in_bwd else 0

    # ---- forward -----------------------------------------------------------------------------------------------------

    def add_forward(self, tl: StepTimeline) -> None:
        """The embedding's row and a run of each layer's rows. The other micro-batches in flight hold their saved
        tensors; autocast's weight cache keeps each 16-bit weight copy until autocast exits (inside a checkpointed
        layer nothing else holds them, so they pile up until the loss is computed)."""
        emb, first, ctx = self.emb, self.first, self.ctx
        acts = (self.in_flight - 1) * (self.saved_by_layer[self.layers] + (emb.saved if first else 0))
        acts += self.rope_bytes
        if first:
            # FSDP2: the root's all-gather output is kept (all_gather_state) until layer 0's copy-out
            tl.add("embedding", "forward", self.w + self.root_ag, self.ga_grads, self.opt, acts + emb.saved,
                   self.other_forward + self.held.previous + max(self.mask_bytes, self.kept) + emb.fwd_peak - emb.saved)
            acts += emb.saved
        self.acts_below = acts  # the activations alive below the layers
        self.cur_before = self.sums(self.saved, acts)  # activations alive before layer i
        self.amp_cache_per_layer = amp_cached_weight_bytes(self.sc.spec, ctx) if ctx.amp else 0
        self.amp_cache_selective = 2 * param_count(self.sc.spec, "attention_params") // ctx.tp \
            if ctx.amp and self.sel_drop[0] else 0
        self.amp_sums = self.sums(self.amp_cache_of)  # [i]: before layer i
        self.fwd_other = self.other_forward + self.held.previous + max(self.mask_bytes, self.kept)
        self.names = layer_names(self.layers)
        if self.fsdp is not None:  # a row reads its neighbours' group sizes (prefetch, kept buffers): cut there
            self.dense = [c.dense_mlp for c in self.ctxs]
            self.pieces = split_pieces(self.pieces, self.neighbours_differ)
        tl.run(range(self.layers), self.forward_rows, 2 if self.gl else 1, self.pieces)

    def amp_cache_of(self, i: int) -> int:
        """Autocast's weight copies layer i adds until the loss (+ KV-cache copies nobody saved)."""
        if self.checkpointed(i):
            return self.amp_cache_per_layer
        return self.amp_cache_selective + self.lay[i].cached_unsaved

    def neighbours_differ(self, a: int, b: int) -> bool:
        """FSDP2: layers a and b have neighbours of different kinds (dense or MoE groups)."""
        kind, layers = self.dense, self.layers
        return ((a > 0 and kind[a - 1]) != (b > 0 and kind[b - 1])
                or (a + 1 < layers and kind[a + 1]) != (b + 1 < layers and kind[b + 1]))

    def forward_rows(self, i: int) -> tuple[TimelineRow, ...]:
        p = self.lay[i]
        s_i = self.saved_by_layer.value(i)
        ckpt_i = self.checkpointed(i)
        peak = p.fwd_peak_nosave if ckpt_i else p.fwd_peak
        # the running layer's own unsaved KV-cache copies are already in its forward peak
        o = self.fwd_other + self.amp_sums[i + 1] - (0 if ckpt_i else p.cached_unsaved) + peak - s_i
        o = o if o > 0 else 0
        event, acts = self.names.forward[i], self.cur_before[i] + s_i
        if self.offload:  # the layers' inputs on the host but those the forward stash still holds
            acts = self.acts_below + self.offload.layer_inputs_on_device[i] * self.h_bytes
        fsdp = self.fsdp
        if fsdp is None:
            return (TimelineRow(event, "forward", self.w, self.ga_grads, self.opt, acts, o),)
        gls, below = fsdp.gathered_bytes, fsdp.gathered_below_bytes
        gathered = below[i + 1] if self.keep_gathered else gls[i]
        layer_row = TimelineRow(event, "forward", self.w + gathered + fsdp.experts_bytes[i] + fsdp.all_gather_bytes[i],
                                self.ga_grads, self.opt, acts, o)
        # FSDP2 pre-forward: the all-gather output and the unsharded parameters it is copied into, and the previous
        # group's all-gather output, which wait_for_unshard frees only when it returns (`prev_all_gather_state`
        # is a local of it): the previous layer's last group, or for layer 0 the root's
        before = self.w + (below[i] if self.keep_gathered else 0)
        prev_ag = fsdp.all_gather_bytes[i - 1] if i else self.root_ag
        all_gather = TimelineRow(ALL_GATHER_LAYER.format(layer=i), "forward", before + 2 * gls[i] + prev_ag,
                                 self.ga_grads, self.opt, self.cur_before[i], self.fwd_other + self.amp_sums[i + 1])
        return all_gather, layer_row

    # ---- the loss ----------------------------------------------------------------------------------------------------

    def add_loss(self, tl: StepTimeline) -> None:
        """The last stage: the LM head and loss, their backward and, under DeepSpeed ZeRO-1/2, the first gradient
        hook; another stage receives the output's gradient. Sets `grads_top`, the gradients above the layers."""
        st, head, layers, fsdp = self.st, self.head, self.layers, self.fsdp
        cur, amp_cache = self.cur_before[layers], self.amp_sums[layers]
        if self.offload:  # the output head is opted out; the final norm's own tensors are in the forward stash
            assert self.offload.norm_on_device, "the final norm's saved tensors left the forward stash"
            cur = self.acts_below + self.offload.inputs_at_loss * self.h_bytes
        if not self.last:
            self.grads_top = 0
            tl.add("receive output grad", "backward", self.w, self.ga_grads, self.opt, cur,
                   self.other_backward + self.kept + self.h_bytes)
            return
        other = self.other_forward
        w_all = self.w + (fsdp.gathered_below_bytes[layers] if fsdp and self.keep_gathered else 0)  # ZeRO-2: all
        # LitGPT's head block holds the previous step's logits itself, until its forward returns
        previous = 0 if self.litgpt else self.held.previous
        tl.add("lm_head + loss", "loss", w_all + (fsdp.all_gather_bytes[-1] if fsdp else 0), self.ga_grads, self.opt,
               cur + head.saved, other + previous + self.kept + amp_cache + head.fwd_peak - head.saved)
        # FSDP2: the root group's gradients (lm_head, final norm) stay unsharded until the root's post-backward,
        # at the end of backward (the root's parameters are one FSDPParamGroup, reduced last)
        self.grads_top = head.param_grad_bytes if self.gl else round(head.param_grad_bytes * self.scale_g)
        tied = self.sc.spec.tie_word_embeddings and self.first
        if self.in_bwd:
            # a tied lm_head's gradient waits in the shared weight's AccumulateGrad input buffer until the
            # embedding's arrives (one node, two edges): its hook runs only after the embedding's backward
            self.grads_top = self.vocab_grad if tied else 0
        # FSDP2 (reshard): the root's pre-backward already prefetches the last layer's weights
        tl.add("loss backward", "backward",
               w_all if self.keep_gathered else self.w + (fsdp.gathered_bytes[-1] if fsdp else 0),
               self.ga_grads + round(head.bwd_peak_pgrad * self.scale_g), self.opt, cur + head.bwd_peak_saved,
               other + self.held.backward(layers) + self.kept + head.bwd_peak - head.bwd_peak_saved
               - head.bwd_peak_pgrad)
        if self.in_bwd and not tied and self.vocab_grad:
            self.add_head_hook(tl, cur)
        if st.reduce_buckets:
            # DeepSpeed ZeRO-1/2 allocates its buckets in the first gradient hook, after the lm_head's backward:
            # its gradient and the hidden state's gradient are alive, and what the final norm saved (its backward
            # runs after the hook; a tied lm_head has none, its first hook is the norm's) (stage_1_and_2.py
            # setup_buckets)
            tied_head = self.sc.spec.tie_word_embeddings and self.first
            norm = 0 if self.fused_ce or tied_head else \
                block_profile(final_norm_block, self.ctx, replay=self.replay).saved
            tl.add("first gradient hook (buckets allocated)", "backward", self.w,
                   self.ga_grads + head.param_grad_bytes, self.opt, cur + norm,
                   self.other_backward + self.held.backward(layers) + self.kept + self.h_bytes)

    def add_head_hook(self, tl: StepTimeline, cur: int) -> None:
        """optimizer_in_backward: the lm_head's hook, right after its matmul's backward (AccumulateGrad runs first
        among the ready nodes): the logits' gradient is freed, the hidden state's gradient and what the final norm
        saved are alive, beside the lm_head's gradient and its step temporaries."""
        norm = 0 if self.fused_ce else block_profile(final_norm_block, self.ctx, replay=self.replay).saved
        tl.add(HOOK_STEP_HEAD, "backward", self.w, self.vocab_grad, self.opt, cur + norm,
               self.other_backward + self.held.backward(self.layers) + self.kept + self.h_bytes
               + self.hook_temp(HOOK_STEP_HEAD))

    # ---- backward ----------------------------------------------------------------------------------------------------

    def add_backward(self, tl: StepTimeline) -> None:
        """A run of each layer's backward rows, from the top layer down."""
        st, layers = self.st, self.layers
        self.moments = {p: self.backward_moments(p) for p in self.kinds}
        self.early_experts = [fsdp2_experts_unshard_in_recompute(c) for c in self.ctxs] \
            if st.gathered_experts and self.every else None
        tied = self.sc.spec.tie_word_embeddings and self.first and self.last
        self.reduced = first_reduction(st, self.head if self.last else None, self.lay,
                                       self.emb if self.first else None, self.scale_g, tied)
        # a tied lm_head's gradient is summed with the embedding's inside autograd: it is alive from the head's
        # backward on, but reaches the gradient hook (and the bucket) only with the embedding's
        self.tied_partial = self.head.param_grad_bytes if tied else 0
        # grads_below[i]: gradients of the layers below i; those alive once the top k layers have run their
        # backward are grads_top + grads_below[layers] - grads_below[layers - k]
        self.grads_below = self.sums(self.grads_of)
        self.grads_of_all = self.grads_below[layers]
        bwd_pieces = self.pieces if self.reduced is None else split_at_switch(self.pieces, self.reduced)
        if self.gl:  # the top layer's backward runs before any layer's reduce-scatter
            bwd_pieces = split_at_switch(bwd_pieces, lambda i: i == layers - 1)
        width = ((2 if self.keep_gathered else 3) + (1 if st.gathered_experts else 0)) if self.gl else 1
        if self.in_bwd:
            tl.run(range(layers - 1, -1, -1), self.in_backward_rows, 2, bwd_pieces)
            return
        tl.run(range(layers - 1, -1, -1), self.backward_rows, width, bwd_pieces)

    def in_backward_rows(self, i: int) -> tuple[TimelineRow, TimelineRow]:
        """optimizer_in_backward: layer i's first hook, then its backward peak, where the gradients its backward
        has created were freed by their hooks (each runs as soon as its op's backward returns). The first hook is
        the output projection's (of the MLP, the layer's largest tensor): the layer's saved tensors but that
        projection's input are alive, its input's gradient in their place (the same shape), with the residual
        stream's gradient, that weight's gradient and its step temporaries. Modelled from torch's autograd engine
        (AccumulateGrad runs first among the ready nodes) and measured on the CPU and under fake tensors."""
        p, ckpt_i = self.lay[i], self.checkpointed(i)
        plain, again = self.moments[p]
        _, alive, o = again if ckpt_i else plain
        grads = self.grads_top
        o += self.kept + self.held.backward(i + 1)
        event = self.names.recomputed[i] if ckpt_i else self.names.backward[i]
        peak = TimelineRow(event, "backward", self.w, grads, self.opt, self.cur_before[i] + alive, o if o > 0 else 0)
        hook_grad = min(self.layer_hook_grad, self.grads_of_layer(i))
        if not hook_grad:
            return peak, peak
        saved = p.saved + (0 if p.input_saved else self.h_bytes) if ckpt_i else self.saved(i)
        event = HOOK_STEP_LAYER.format(layer=i)
        hook = TimelineRow(event, "backward", self.w, grads + hook_grad, self.opt, self.cur_before[i] + saved,
                           self.other_backward + self.kept + self.held.backward(i + 1) + self.h_bytes
                           + self.hook_temp(event))
        return hook, peak

    def grads_of_layer(self, i: int) -> int:
        return round(self.sharded_share(i) * self.scale_g)

    def backward_moments(self, p: BlockProfile) -> tuple[Moment, Moment]:
        """(plain, recomputed) backward peak of one layer: (param grads, saved alive, other)."""
        other, scale_g = self.other_backward, self.scale_g
        plain = (round(p.bwd_peak_pgrad * scale_g), p.bwd_peak_saved,
                 other + p.bwd_peak - p.bwd_peak_saved - p.bwd_peak_pgrad)
        recompute = p.recompute_peak + self.h_bytes  # the recompute stops at the layer's last saved tensor
        bwd = p.bwd_peak + (0 if p.input_saved else self.h_bytes)
        if recompute >= bwd:
            again = (0, p.saved, other + recompute - p.saved)
        else:
            again = (round(p.bwd_peak_pgrad * scale_g), p.bwd_peak_saved,
                     other + bwd - p.bwd_peak_saved - p.bwd_peak_pgrad)
        if self.gl:  # FSDP2: the layer's own unsharded grads are alive until its reduce-scatter
            plain = (p.bwd_peak_pgrad,) + plain[1:]
            again = (p.bwd_peak_pgrad if again[0] else 0,) + again[1:]
        return plain, again

    def copy_left_above(self, i: int) -> int:
        """activation_offload: bytes of layer i + 1's input, brought back to the device for its recompute, still
        in the backward stash while layer i's first node runs: torchtune drops it in the hook of the next node that
        unpacks an offloaded tensor, unless something else held it by the end of its own node (the recompute saved
        it: then it went with that saved tensor)."""
        return 0 if i + 1 >= self.layers or self.lay[i + 1].input_saved else self.h_bytes

    def offload_moment(self, i: int) -> Moment:
        """activation_offload: layer i's backward peak (param grads, saved alive, other): its input brought
        back (h), and during its recompute (the first node's unpack) the copy left from the layer above."""
        p, other, h = self.lay[i], self.other_backward, self.h_bytes
        recompute = p.recompute_peak + h + self.copy_left_above(i)
        bwd = p.bwd_peak + (0 if p.input_saved else h)
        if recompute >= bwd:
            return 0, p.saved, other + recompute - p.saved
        return (round(p.bwd_peak_pgrad * self.scale_g), p.bwd_peak_saved,
                other + bwd - p.bwd_peak_saved - p.bwd_peak_pgrad)

    def grads_alive(self, i: int) -> int:
        """Gradients alive once layers i + 1 and above have run their backward."""
        return self.grads_top + self.grads_of_all - self.grads_below[i + 1]

    def backward_rows(self, i: int) -> tuple[TimelineRow, ...]:
        cur = self.cur_before[i]  # layer i's saved tensors are released by its own backward
        grads = self.grads_alive(i)
        ckpt_i = self.checkpointed(i)
        plain, again = self.moments[self.lay[i]]
        pg, alive, o = again if ckpt_i else plain
        if self.offload:  # the layers below on the host; layer i + 1's input copy maybe still in the stash
            cur = self.acts_below + self.leaf_h
            pg, alive, o = self.offload_moment(i)
        g_now = grads + pg
        if self.reduced is not None:  # DeepSpeed ZeRO-1/2: the layer's own full grads + the partition once reduced
            g_now = (self.ga_grads + (self.part if self.reduced(i) else 0)
                     + (round(pg / self.scale_g) if self.scale_g else 0) + self.tied_partial)
        g_now = g_now if g_now > self.ga_grads else self.ga_grads
        o += self.kept + self.held.backward(i + 1)
        event = self.names.recomputed[i] if ckpt_i else self.names.backward[i]
        if self.fsdp is None:
            return (TimelineRow(event, "backward", self.w, g_now, self.opt, cur + alive, o if o > 0 else 0),)
        return self.fsdp2_backward_rows(i, event, ckpt_i, pg, alive, o, g_now)

    def fsdp2_backward_rows(self, i: int, event: str, ckpt_i: bool, pg: int, alive: int, o: int,
                            g_now: int) -> tuple[TimelineRow, ...]:
        """FSDP2: the layer's backward with it gathered and the next one prefetched (ZeRO-2 analogue: all below
        too), the experts group's reduce under expert parallelism, the layer's reduce-scatter, and (reshard after
        forward) the copy-out of its prefetched all-gather before them."""
        fsdp, layers, w, opt, held = self.fsdp, self.layers, self.w, self.opt, self.held
        cur, grads = self.cur_before[i], self.grads_alive(i)
        gls, below = fsdp.gathered_bytes, fsdp.gathered_below_bytes
        rs_kept = fsdp.reduce_scatter_kept_bytes[i + 1] if i < layers - 1 else 0  # the layer above's, until this one
        gathered = below[i + 1] if self.keep_gathered else gls[i] + (gls[i - 1] if i else 0)
        o += rs_kept
        if ckpt_i and self.early_experts and self.early_experts[i] and not pg:
            # the recompute reaches the experts before their pre-backward: they unshard in forward state, keeping
            # the all-gather output, and the next layer is not prefetched yet
            gathered -= gls[i - 1] if i and not self.keep_gathered else 0
            o += fsdp.all_gather_bytes[i]
        row = TimelineRow(event, "backward", w + gathered + fsdp.experts_bytes[i], g_now, opt, cur + alive,
                          o if o > 0 else 0)
        # FSDP2 post-backward: weights resharded, unsharded grads copied into the reduce buffer
        left = below[i] if self.keep_gathered else (gls[i - 1] if i else 0)
        # expert parallelism: the experts group's reduce, mid-layer (a dense layer repeats its row: one width)
        rows = (row, self.experts_reduce_row(i, ckpt_i, gathered) or row) if self.st.gathered_experts else (row,)
        reduce = TimelineRow(REDUCE_SCATTER_LAYER.format(layer=i), "backward", w + left,
                             grads + self.lay[i].param_grad_bytes, opt, cur,
                             self.other_backward + self.kept * (i > 0) + held.backward(i) + self.h_bytes
                             + fsdp.reduce_scatter_peak_bytes[i])
        if self.keep_gathered:
            return *rows, reduce
        # FSDP2 pre-backward (reshard after forward): the layer's prefetched all-gather output is copied out into
        # its unsharded parameters, both alive until the copy-out returns (in backward the output is freed at once)
        copy_out = TimelineRow(ALL_GATHER_LAYER.format(layer=i), "backward", w + 2 * gls[i], grads, opt,
                               self.cur_before[i + 1],
                               self.other_backward + self.kept + held.backward(i + 1) + self.h_bytes + rs_kept)
        return copy_out, *rows, reduce

    def experts_reduce_row(self, i: int, ckpt_i: bool, gathered: int) -> TimelineRow | None:
        """Expert parallelism: the experts group's post-backward runs when the MoE block's backward ends, mid-layer
        (FSDP2 registers it on the experts module's inputs): the rest of the layer is still gathered and its saved
        tensors (the attention's) alive, the experts' own gradients already copied into the reduce buffers (the
        foreach_reduce of torch 2.13, measured on the CPU over the fake process group)."""
        p, fsdp = self.lay[i], self.fsdp
        if not fsdp.experts_reduce_bytes[i] or not fsdp2_local_expert_grad_bytes(self.ctxs[i]):
            return None  # a dense layer, or experts without gradients (a frozen base): no experts reduce
        h = self.h_bytes if ckpt_i and not p.input_saved else 0  # the checkpoint's stored input (see backward_moments)
        return TimelineRow(EXPERTS_REDUCE_LAYER.format(layer=i), "backward", self.w + gathered, self.grads_alive(i),
                           self.opt, self.cur_before[i] + p.experts_done_saved,
                           self.other_backward + self.kept + self.held.backward(i + 1) + h + p.experts_done_grads
                           + fsdp.experts_reduce_bytes[i])

    # ---- after the layers' backward ----------------------------------------------------------------------------------

    def add_embedding_backward(self, tl: StepTimeline) -> None:
        if not self.first:
            return
        emb = self.emb
        cur, grads = self.cur_before[0] - emb.saved, self.grads_top + self.grads_of_all
        if self.offload:  # the indices come back to the device; layer 0's input copy waits for this node's hook
            cur = self.acts_below - emb.saved + self.leaf_h + self.offload_embedding_bytes()
        g_emb = max(self.ga_grads, grads + round(emb.param_grad_bytes * self.scale_g))
        tied = self.sc.spec.tie_word_embeddings and self.last
        if self.in_bwd:
            # its peak is the token embedding's backward: GPT-2's position embedding ran first and its hook freed
            # that gradient; the token embedding's own is alive (a tied one's is the InputBuffer's, in the profile)
            g_emb = self.grads_top + min(emb.bwd_peak_pgrad, 0 if tied else self.vocab_grad)
        if self.reduced is not None:
            g_emb = (self.ga_grads + (self.part if self.reduced(-1) else 0) + emb.param_grad_bytes
                     + self.tied_partial)
        tl.add("embedding backward", "backward", self.w, g_emb, self.opt, cur,
               self.other_backward + self.held.previous + emb.bwd_peak - emb.bwd_peak_pgrad)
        if self.vocab_grad:
            # its hook: the token embedding's gradient (a tied weight's summed with the lm_head's) and its step
            # temporaries
            tl.add(HOOK_STEP_EMBEDDING, "backward", self.w, self.vocab_grad, self.opt, cur,
                   self.other_backward + self.held.previous + self.hook_temp(HOOK_STEP_EMBEDDING))

    def offload_embedding_bytes(self) -> int:
        """activation_offload, at the embedding's backward: its indices brought back (when it packed them) and
        layer 0's input copy (unless its recompute saved it), dropped by this node's hook or, without a node that
        unpacks, by the end-of-backward callback."""
        ids = self.input_bytes if self.ctx.trains("embed_tokens") else 0
        return ids + (0 if self.lay[0].input_saved else self.h_bytes)

    def add_gradient_epilogue(self, tl: StepTimeline) -> None:
        """DeepSpeed ZeRO-1/2: the backward epilogue reduces what is left in the bucket into the partition, then
        frees the buckets; a gradient larger than the bucket waits as its own tensor until then, and one of the
        embedding's whose hook made the partition appear is alive beside it at that moment."""
        if self.reduced is None:
            return
        st = self.st
        rp = st.rank0_partition
        pending = max(rp.pending_at_end, rp.trigger if rp.block == len(self.lay) + 1 else 0) * st.grad_bytes \
            if rp else 0
        tl.add("gradient reduction (epilogue)", "backward", st.weights, self.ga_grads + self.part + pending, self.opt,
               0, self.other_backward + self.held.previous)


def first_reduction(st: States, head: BlockProfile | None, lay: list[BlockProfile], emb: BlockProfile | None,
                    scale_g: float, tied: bool = False) -> Callable[[int], bool] | None:
    """DeepSpeed ZeRO-1/2 (no offload): whether the first bucket reduction, which allocates the rank's whole
    gradient partition (stage_1_and_2.py copy_grads_in_partition: grads_in_partition), has happened by the
    backward of layer i (-1: the embedding). Gradients are produced from the lm_head down and DeepSpeed reduces
    the bucket when the next gradient would overflow reduce_bucket_size elements; the engine counts the partition
    from the block whose gradients pass that size (block granularity). None outside ZeRO-1/2. With the model's
    parameter order known (States.rank0_partition), the block whose hooks run the first reduction that holds
    one of rank 0's parameters. Once reduced, always: true for the layers below some layer, false above it
    (calc.memory.repeats.split_at_switch relies on it)."""
    if st.first_reduction_elements is None or not scale_g:
        return None
    n = len(lay)
    if st.rank0_partition is not None:
        # a block's hooks run as its gradients are produced, after the moment its row stands for (the embedding's
        # after its backward: measured, GPT-2 on 3 ranks), so the partition is there from the next block on
        block = st.rank0_partition.block  # 0: the top, n - i: layer i, n + 1: the embedding
        return lambda i: block < (n + 1 if i < 0 else n - i)
    # gradient bytes that reached the hooks by the end of each block (a tied lm_head's with the embedding's)
    produced = [head.param_grad_bytes if head and not tied else 0]
    for layer in reversed(lay):
        produced.append(produced[-1] + layer.param_grad_bytes)
    total = produced[-1] + (emb.param_grad_bytes if emb else 0) + (head.param_grad_bytes if head and tied else 0)
    limit = st.first_reduction_elements * total / max(1, st.trainable)  # in bytes of produced gradients
    return lambda i: (total if i < 0 else produced[n - i]) > limit


def optimizer_rows(tl: StepTimeline, sc: Scenario, st: States, other: int) -> None:
    """The optimizer step, and the moment before it where DeepSpeed flattens the gradients: ZeRO-1/2 copy
    the partition into one flat tensor and cast it to fp32 while the partition is still held
    (stage_1_and_2.py step: flatten, .to(fp32)); FP16_Optimizer (ZeRO-0, FusedAdam) casts each 16-bit grad
    to fp32 and flattens the copies (fp16/fused_optimizer.py step). Modelled from DeepSpeed's source; the
    ZeRO-1/2 one is measured on the CPU. The events' labels are calc.memory.breakdown.FLATTEN_EVENTS'."""
    if st.rank0_partition is not None:
        # the gradient norm first (get_grad_norm_direct): each of the rank's gradients copied to fp64 in turn
        # (zero/utils.py get_norm_dtype), beside the partition; measured on the CPU
        tl.add("gradient norm (fp64 copy)", "optimizer", st.weights,
               partition_bytes(st) + 8 * st.rank0_partition.largest, st.optimizer, 0, other)
    if st.first_reduction_elements is not None:
        flat = st.grads + st.grad_fp32_step  # the flat copy of the rank's range, and its fp32 cast for a 16-bit model
        tl.add("gradient partition flattened", "optimizer", st.weights, partition_bytes(st) + flat, st.optimizer, 0,
               other)
    elif st.flattens_step_grads:
        tl.add("gradients cast to fp32 and flattened", "optimizer", st.weights, st.grads + 2 * st.grad_fp32_step,
               st.optimizer, 0, other)
    tl.add("optimizer step", "optimizer", st.weights, step_gradient_bytes(sc, st), st.optimizer, 0, other + st.opt_temp)

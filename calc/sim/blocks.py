"""Whole blocks for the autograd simulator (calc.sim.graph): a decoder layer of each family, the embedding, the
final norm, the LM head with its loss (PyTorch's cross-entropy, Liger's fused one) and the inference head; and the
tensors the base model's forward holds around its layers.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves. Sizes are bytes for the tokens
this GPU processes (micro-batch x sequence, divided by tensor parallelism where the op is split).
"""

from __future__ import annotations

from calc.contract.model_spec import GEMMA_FAMILIES
from calc.sim.attention import gpt2_attention, llama_attention, neox_attention
from calc.sim.context import Ctx
from calc.sim.frameworks.litgpt import litgpt_head_block, litgpt_layer, litgpt_stable_embedding_block
from calc.sim.frameworks.torchtune import torchtune_layer
from calc.sim.graph import OUT, Graph
from calc.sim.mlp import gated_mlp, plain_mlp
from calc.sim.moe import llama4_moe, moe_mlp
from calc.sim.ops import dropout, fp32_product_norm, layer_norm, linear, rms_norm
from calc.sim.symbolic import fixed


def decoder_layer(c: Ctx, eager: bool) -> Graph:
    """One decoder layer of the family, input = the residual stream. With Megatron-style
    sequence parallelism the norms, dropouts and residual adds run on S / tp tokens; an all-gather
    before attention and the MLP and a reduce-scatter after them connect to the tensor-parallel
    parts (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2)."""
    fam = c.spec.family
    if c.framework == "litgpt":
        return litgpt_layer(c)
    if c.framework == "torchtune":
        return torchtune_layer(c)
    if fam == "gpt2":
        return _gpt2_layer(c, eager)
    if fam == "gpt_neox":
        return _neox_layer(c, eager)
    h = c.spec.hidden_size
    ts = c.tokens // c.tp if c.sp else c.tokens  # tokens of the residual stream on this GPU
    g = Graph(input_bytes=c.residual_elem_bytes * ts * h, input_requires_grad=c.input_grad, round_to=512 if c.cuda else 1)
    gemma = fam in GEMMA_FAMILIES
    drop = c.spec.hidden_dropout if fam == "phi3" else 0.0
    y, yb = rms_norm(g, 0, c.residual_elem_bytes, c, gemma=fp32_product_norm(c), tokens=ts)
    att = llama_attention(g, _sp_gather(g, y, yb, c), c, eager)
    att = _sp_scatter(g, att, c)
    if gemma:
        att, _ = rms_norm(g, att, c.act_elem_bytes, c, gemma=True, tokens=ts)
    att = dropout(g, att, ts * h, c.act_elem_bytes * ts * h, drop, c)
    mid = g.op(c.residual_elem_bytes * ts * h, ins=(0, att), name="residual add", passes="add")
    y2, yb2 = rms_norm(g, mid, c.residual_elem_bytes, c, gemma=fp32_product_norm(c), tokens=ts)
    y2 = _sp_gather(g, y2, yb2, c)
    if c.dense_mlp:
        m = gated_mlp(g, y2, c, width=c.spec.dense_intermediate_size)
    elif fam == "llama4_text":
        m = llama4_moe(g, y2, c)
    else:
        m = moe_mlp(g, y2, c) if c.spec.moe else gated_mlp(g, y2, c)
    m = _sp_scatter(g, m, c)
    if gemma:
        m, _ = rms_norm(g, m, c.act_elem_bytes, c, gemma=True, tokens=ts)
    m = dropout(g, m, ts * h, c.act_elem_bytes * ts * h, drop, c)
    g.op(c.residual_elem_bytes * ts * h, ins=(mid, m, *g.held), grad_ins=(mid, m), name="residual add", passes="add")
    g.keep(0, *g.cached)  # the layer loop still references the input; the cache keeps k, v
    return g


def _sp_gather(g: Graph, y: int, y_bytes: int, c: Ctx) -> int:
    """Sequence parallel: all-gather the S/tp norm output into the full sequence (kept by the
    tensor-parallel matmuls that read it)."""
    return g.op(y_bytes * c.tokens * c.spec.hidden_size, ins=(y,), name="SP all-gather") if c.sp else y


def _sp_scatter(g: Graph, x: int, c: Ctx) -> int:
    """Sequence parallel: reduce-scatter the row-parallel output back to S/tp tokens."""
    if not c.sp:
        return x
    return g.op(c.act_elem_bytes * c.tokens // c.tp * c.spec.hidden_size, ins=(x,), name="SP reduce-scatter")


def stack_locals_bytes(c: Ctx, layer: int) -> int:
    """Tensors the base model's forward (LlamaModel, GPT2Model, ...) holds in locals while its
    decoder loop runs: `position_ids` (arange(S) + past length, int64) and `inputs_embeds`, which
    is the first layer's input and becomes extra once the loop rebinds `hidden_states`; GPT-2 adds
    its (1, S, H) `position_embeds` before the loop, so both are extra from layer 0 on
    (transformers 5.x modeling_*.py, *Model.forward)."""
    s = c.spec
    embeds = c.residual_elem_bytes * c.tokens * s.hidden_size
    if s.family == "gpt2":
        return 8 * c.seq + embeds + c.residual_elem_bytes * c.seq * s.hidden_size
    return 8 * c.seq + (embeds if layer > 0 else 0)


def _gpt2_layer(c: Ctx, eager: bool) -> Graph:
    """GPT2Block: ln_1 -> c_attn (Conv1D, fused qkv) -> split -> attention -> c_proj -> dropout
    -> residual; ln_2 -> c_fc -> gelu_new -> c_proj -> dropout -> residual (modeling_gpt2)."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, input_requires_grad=c.input_grad, round_to=512 if c.cuda else 1)
    y, _ = layer_norm(g, 0, c.residual_elem_bytes, c)
    o = gpt2_attention(g, y, c, eager)
    mid = g.op(c.residual_elem_bytes * t * h, ins=(0, o), name="residual add", passes="add")
    y2, _ = layer_norm(g, mid, c.residual_elem_bytes, c)
    m = plain_mlp(g, y2, c)
    m = dropout(g, m, t * h, c.act_elem_bytes * t * h, s.hidden_dropout, c)
    g.op(c.residual_elem_bytes * t * h, ins=(mid, m), name="residual add", passes="add")
    # the block's `attn_output, _ = self.attn(...)` locals, the loop's input and the cache's k, v
    g.keep(0, o, *g.held, *g.cached)
    return g


def _neox_layer(c: Ctx, eager: bool) -> Graph:
    """GPTNeoXLayer with parallel residual: x + attn(ln1(x)) + mlp(ln2(x)); fused qkv, partial
    RoPE on the first rotary_fraction of each head (modeling_gpt_neox)."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, input_requires_grad=c.input_grad, round_to=512 if c.cuda else 1)
    y, _ = layer_norm(g, 0, c.residual_elem_bytes, c)
    o = neox_attention(g, y, c, eager)
    if s.parallel_residual:
        y2, _ = layer_norm(g, 0, c.residual_elem_bytes, c)
        m = plain_mlp(g, y2, c)
        m = dropout(g, m, t * h, c.act_elem_bytes * t * h, s.hidden_dropout, c)
        s1 = g.op(c.residual_elem_bytes * t * h, ins=(m, o), name="mlp + attn", passes="add")
        g.op(c.residual_elem_bytes * t * h, ins=(s1, 0), name="residual add", passes="add")
        g.keep(0, *g.cached)
        return g
    mid = g.op(c.residual_elem_bytes * t * h, ins=(0, o), name="residual add", passes="add")
    y2, _ = layer_norm(g, mid, c.residual_elem_bytes, c)
    m = plain_mlp(g, y2, c)
    g.op(c.residual_elem_bytes * t * h, ins=(mid, m), name="residual add", passes="add")
    g.keep(0, *g.cached)
    return g


def embedding_block(c: Ctx) -> Graph:
    """Token embedding (+ GPT-2's learned positions, + Gemma's sqrt(H) scaling, + embedding
    dropout). nn.Embedding saves only the indices (the persistent input_ids); its backward
    (embedding_dense_backward) materialises a dense V x H gradient in the weight's dtype. A tied
    lm_head has already produced its V x H contribution, which waits in the autograd InputBuffer;
    the buffer sums the two out of place (aten.add, seen with a dispatch-mode trace), so three
    V x H tensors are briefly alive before the sum becomes .grad."""
    if c.stable_embedding:
        return litgpt_stable_embedding_block(c)
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=0, input_requires_grad=False, round_to=512 if c.cuda else 1)
    emb_grad = 0 if not c.trains("embed_tokens") else s.vocab_size * h * (4 if c.amp else c.weight_elem_bytes)
    # LoRA's trainable copy of the embedding (modules_to_save) is untied from lm_head: no summed contribution
    tied = s.tie_word_embeddings and not c.frozen_base
    x = g.op(c.residual_elem_bytes * t * h, pgrad=0 if tied else emb_grad,
             ws_bwd=2 * emb_grad if tied else 0, name="embed_tokens")
    if s.family == "gpt2":
        pos = g.op(c.residual_elem_bytes * t * h, pgrad=s.max_position_embeddings * h * c.weight_elem_bytes, name="wpe")
        x = g.op(c.residual_elem_bytes * t * h, ins=(x, pos), name="tok + pos")
    if s.family in GEMMA_FAMILIES:
        x = g.op(c.residual_elem_bytes * t * h, ins=(x,), name="* sqrt(hidden)")
    return _finish(g, dropout(g, x, t * h, c.residual_elem_bytes * t * h, s.embedding_dropout, c))


def final_norm(g: Graph, c: Ctx) -> tuple[int, int]:
    """The model's final norm on the block input (tensor 0): LayerNorm or RMSNorm, as the family has it.
    Returns (output id, output bytes per element)."""
    if c.spec.uses_layernorm:
        return layer_norm(g, 0, c.residual_elem_bytes, c)
    return rms_norm(g, 0, c.residual_elem_bytes, c, gemma=fp32_product_norm(c))


def final_norm_block(c: Ctx) -> Graph:
    """The final norm alone. What it saves for backward stays alive until its backward runs, after the
    lm_head's weight gradient reached its hook (AccumulateGrad runs first: DeepSpeed ZeRO-1/2's first
    gradient hook, calc.memory.engine)."""
    g = Graph(input_bytes=c.residual_elem_bytes * c.tokens * c.spec.hidden_size, round_to=512 if c.cuda else 1)
    return _finish(g, final_norm(g, c)[0])


def head_block(c: Ctx) -> Graph:
    """Final norm, lm_head and the loss inside `ForCausalLM.forward(labels=...)`:
    logits (B, S, V/tp) in compute dtype, `logits.float()` (a new fp32 copy unless already fp32),
    cross_entropy = log_softmax (saves its fp32 output) + nll_loss (saves the shifted int64
    targets). Backward: nll creates a dense fp32 grad, log_softmax_backward another while its
    saved output is still alive (3 x 4 x B x S x V at once), then the copy back to 16-bit and
    the lm_head matmuls (transformers/loss/loss_utils.py ForCausalLMLoss)."""
    if c.framework == "litgpt":
        return litgpt_head_block(c)
    s = c.spec
    t, h = c.tokens, s.hidden_size
    v = s.vocab_size // c.tp
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, round_to=512 if c.cuda else 1)
    y, _ = final_norm(g, c)
    logits = linear(g, y, h, v, c, name="lm_head")
    lb = c.act_elem_bytes
    if s.final_logit_softcapping:
        d = g.op(lb * t * v, ins=(logits,), name="/ softcap")
        th = g.op(lb * t * v, ins=(d,), saves=(OUT,), name="tanh")
        logits = g.op(lb * t * v, ins=(th,), name="* softcap")
    f32 = logits if lb == 4 else g.op(4 * t * v, ins=(logits,), name="logits.float()")
    pad = g.op(8 * c.batch * (c.seq + 1), grad=False, name="labels pad")
    tgt = g.op(8 * t, ins=(pad,), grad=False, name="shift labels")
    lsm = g.op(4 * t * v, ins=(f32,), saves=(OUT,), name="log_softmax")
    # the model keeps `logits` (for its output) until forward returns
    return _finish(g, g.op(4, ins=(lsm, tgt, logits), saves=(tgt,), grad_ins=(lsm,), name="nll_loss"))


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's chunk: next_power_of_2(ceil(BT / ceil(V / H))) tokens, at most BT, so a chunk's
    logits are about as large as the hidden states (fused_linear_cross_entropy.py)."""
    inc = -(-vocab // hidden)
    chunk = 1 << max(0, (-(-tokens // inc) - 1).bit_length())
    return min(chunk, tokens)


def liger_head_block(c: Ctx) -> Graph:
    """Final norm + Liger Kernel's LigerFusedLinearCrossEntropyFunction (use_liger_kernel=True;
    linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py), modelled from its
    source, not measured (it needs Triton on a GPU). Its forward allocates grad_input (BT x H, the
    hidden dtype), grad_weight (V x H, the weight dtype; none for a frozen base) and an fp32 loss per
    token, then for each chunk of tokens computes the chunk's logits (chunk x V), turns them into
    their gradient in place, and accumulates grad_input (a chunk x H matmul) and grad_weight (addmm).
    The node saves only grad_input and grad_weight; its backward returns them as they are (no new
    buffers for a mean loss), so the logits never exist whole and nothing is recomputed. Under
    autocast the fp32 lm_head weight is cast to 16-bit once and cached until forward ends."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    v = s.vocab_size // c.tp
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, round_to=512 if c.cuda else 1)
    y, yb = final_norm(g, c)
    xb = 2 if c.amp else yb  # autocast runs the chunk matmuls in 16-bit
    w16 = g.op(2 * v * h, grad=False, name="autocast lm_head weight copy") if c.amp else None
    gw = 0 if not c.trains("lm_head") else (4 if c.amp else c.weight_elem_bytes) * v * h
    grad_in = g.op(yb * t * h, grad=False, name="grad_input buffer")
    grad_w = g.op(gw, grad=False, name="grad_weight buffer (filled in forward)")
    chunk = fixed(liger_chunk_tokens, t, h, v)  # no polynomial of the tokens: recorded per chunk size
    ws = 4 * t + xb * chunk * (v + h)  # fp32 loss per token + one chunk's logits and grad_input product
    # backward hands grad_input over as the input gradient and grad_weight to .grad: no new bytes
    loss = g.op(4, ins=(y, grad_in, grad_w, *((w16,) if w16 is not None else ())), saves=(grad_in, grad_w),
                grad_ins=(y,), pgrad=gw, ws_fwd=ws, ws_bwd=-(yb * t * h + gw), name="fused linear cross-entropy")
    return _finish(g, loss)


def inference_head_block(c: Ctx) -> Graph:
    """No-grad final norm + lm_head: the logits (B, S, V/tp, compute dtype) are returned to the
    caller, so the peak is the norm's transients or the logits next to the normalised hidden state."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, round_to=512 if c.cuda else 1)
    y, _ = final_norm(g, c)
    v = s.vocab_size // c.tp
    logits = linear(g, y, h, v, c, name="lm_head")
    g.keep(y)
    if s.final_logit_softcapping:  # logits / cap -> tanh -> * cap, each a new tensor
        for step in ("/ softcap", "tanh", "* softcap"):
            logits = g.op(c.act_elem_bytes * t * v, ins=(logits,), name=step)
    return _finish(g, logits)


def _finish(g: Graph, out: int) -> Graph:
    g.output = out
    return g

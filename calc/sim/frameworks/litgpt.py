"""LitGPT's model code and fine-tuning steps, written for the autograd simulator (calc.sim.graph).

Mirrors litgpt 0.5.13 op by op for its llama-style configs (litgpt/model.py: GPT, Block, CausalSelfAttention,
LLaMAMLP, RMSNorm, apply_rope; litgpt/lora.py: LoRALinear, LoRAQKVLinear) and the loss of its fine-tuning
scripts' `fit`: the model's fp32 logits (Lightning Fabric's convert_output), whole (finetune/full.py) or in
128-token lm_head chunks (finetune/lora.py), passed to litgpt/utils.py's chunked_cross_entropy, which runs
cross_entropy(reduction="none") over chunks of 128 rows (its chunk_size: training.cross_entropy_chunks). Measured
on the CPU (data/measured_litgpt.jsonl); the CUDA kernels' differences (SDPA's output layout, 512-byte rounding)
are the shared ops' own, modelled from source.
"""

from __future__ import annotations

from calc.contract.model_spec import ModelSpec, per_spec
from calc.contract.quantized import BnbKind, bnb_weight_bytes
from calc.sim.attention import attention_core, rope
from calc.sim.context import Ctx
from calc.sim.graph import OUT, Graph
from calc.sim.ops import activation, dequantized_weight_bytes, dropout, linear, rms_normalise
from calc.sim.symbolic import fixed

LITGPT_CHUNK_TOKENS = 128  # chunked_cross_entropy's chunk_size default (litgpt/utils.py)


def litgpt_rms_norm(g: Graph, x: int, x_bytes: int, c: Ctx, tokens: int | None = None) -> tuple[int, int]:
    """litgpt.model.RMSNorm: x.float(); mean(x * x); x * rsqrt(. + eps); (x_normed * weight.float()).to(dtype).
    The product runs in fp32 and keeps the fp32 normalised tensor and the weight's fp32 copy (a copy only when
    the weight is 16-bit); its weight gradient needs one full-size fp32 product. Returns (output, bytes per
    element: the input's dtype)."""
    t = c.tokens if tokens is None else tokens
    w = c.spec.hidden_size
    n = t * w
    xf, rs, normed = rms_normalise(g, x, x_bytes, t, w)
    wb = c.weight_elem_bytes
    if c.frozen_base:  # LoRA: a frozen weight's copy is kept for the normalised tensor's gradient
        wf = g.op(4 * w if wb != 4 else 0, grad=False, name="norm weight.float()")
        y32 = g.op(4 * n, ins=(normed, wf), saves=(wf,), grad_ins=(normed,), name="norm * weight")
    elif wb == 4:  # weight.float() is the weight itself
        y32 = g.op(4 * n, ins=(normed,), saves=(normed,), pgrad=4 * w, ws_bwd=4 * n, name="norm * weight")
    else:
        wf = g.op(4 * w, pgrad=wb * w, name="norm weight.float()")
        y32 = g.op(4 * n, ins=(normed, wf), saves=(normed, wf), ws_bwd=4 * n, name="norm * weight")
    if x_bytes == 4:
        return y32, 4
    return g.op(x_bytes * n, ins=(y32,), name="norm .to(dtype)"), x_bytes


def _litgpt_rope(g: Graph, x: int, width: int, c: Ctx) -> tuple[int, int]:
    """apply_rope (x * cos + cat(-x2, x1) * sin, promoted to the rope cache's dtype, then .to(x.dtype)) and
    CausalSelfAttention's torch.cat((x_roped, x[..., rope_n_elem:])), which copies even when the pass-through
    part is empty. Returns (the roped local, the concatenated tensor)."""
    t, a = c.tokens, c.act_elem_bytes
    roped = rope(g, x, width, c)
    if c.rope_elem_bytes != a:
        roped = g.op(a * t * width, ins=(roped,), name="rope .to(x.dtype)")
    return roped, g.op(a * t * width, ins=(roped,), name="cat(roped, pass-through)")


def litgpt_qkv_adapted(c: Ctx) -> list[int]:
    """The widths of the parts of the fused qkv that LoRAQKVLinear adapts (enable_lora), in q, k, v order."""
    s = c.spec
    widths = {"q": s.q_width, "k": s.kv_width, "v": s.kv_width}
    return [w for part, w in widths.items() if c.lora_rank and part in c.lora_targets]


def litgpt_lora_index_bytes(c: Ctx) -> int:
    """LoRAQKVLinear's `_lora_ind`, registered on the first forward of a layer that adapts only some of q, k and v
    (zero_pad's column index, int64 per adapted column) and kept as a buffer from then on."""
    adapted = litgpt_qkv_adapted(c)
    return 8 * sum(adapted) * c.spec.num_layers if 0 < len(adapted) < 3 else 0


def litgpt_qkv(g: Graph, y: int, y_bytes: int, c: Ctx) -> int:
    """The fused qkv Linear; with LoRA on any of q, k and v, litgpt.lora.LoRAQKVLinear: pretrained = linear(x);
    after_A = F.linear(lora_dropout(x), lora_A) (r per adapted part, keeps its input: the dropped copy when
    lora_dropout > 0); conv1d of its transposed view with lora_B (groups = the adapted parts when every head has its
    own K/V, else one conv1d per part and a cat; each keeps its input); zero_pad when a part is left out
    (new_zeros of the full width, index_copy_ of the adapted columns by a fresh clone of lora_ind, which the copy's
    node keeps); * scaling; pretrained + lora."""
    s = c.spec
    t, h, a = c.tokens, s.hidden_size, c.act_elem_bytes
    out = s.q_width + 2 * s.kv_width
    base = linear(g, y, h, out, c, bias=s.qkv_bias, name="qkv", x_bytes=y_bytes)
    adapted = litgpt_qkv_adapted(c)
    if not adapted:
        return base
    r, ad, lora_w = c.lora_rank, c.adapter_bytes, sum(adapted)
    x = dropout(g, y, t * h, y_bytes * t * h, c.lora_dropout, c)
    after_a = g.op(a * t * len(adapted) * r, ins=(x,), saves=(x,), pgrad=ad * len(adapted) * r * h,
                   name="qkv lora_A")
    if s.num_heads == s.num_kv_heads:
        lora = g.op(a * t * lora_w, ins=(after_a,), saves=(after_a,), pgrad=ad * lora_w * r, name="qkv lora_B conv1d")
    else:
        parts = tuple(g.op(a * t * w, ins=(after_a,), saves=(after_a,), pgrad=ad * w * r, name="qkv lora_B conv1d")
                      for w in adapted)
        lora = g.op(a * t * lora_w, ins=parts, name="cat(conv1d outputs)")
    if len(adapted) < 3:  # IndexCopyBackward0 keeps the index and the source (the conv output's view)
        index = g.op(8 * lora_w, grad=False, name="lora_ind.clone()")
        lora = g.op(a * t * out, ins=(lora, index), saves=(lora, index), grad_ins=(lora,), name="zero_pad index_copy_")
    scaled = g.op(a * t * out, ins=(lora,), name="qkv lora * scaling")
    return g.op(a * t * out, ins=(base, scaled), name="qkv + lora", passes="add")


def litgpt_attention(g: Graph, y: int, y_bytes: int, c: Ctx) -> int:
    """CausalSelfAttention.forward: one fused qkv Linear split into views; RoPE on q and k; with grouped-query
    attention k and v repeat_interleave'd to every query head (new tensors, which SDPA saves); SDPA with
    is_causal and no mask; y.transpose(1, 2).reshape(B, T, C); proj. Its locals (qkv, q_roped, k_roped, q and
    the repeated k, v) stay referenced until it returns."""
    s = c.spec
    t, h, a = c.tokens, s.hidden_size, c.act_elem_bytes
    qw, kvw = s.q_width, s.kv_width
    qkv = litgpt_qkv(g, y, y_bytes, c)
    q_roped, q = _litgpt_rope(g, qkv, qw, c)
    k_roped, k = _litgpt_rope(g, qkv, kvw, c)
    v = qkv
    if s.num_heads != s.num_kv_heads:
        k = g.op(a * t * qw, ins=(k,), name="k.repeat_interleave")
        v = g.op(a * t * qw, ins=(qkv,), name="v.repeat_interleave")
    # q is the cat's contiguous (B, nh, T, hs) tensor: the CPU kernel's output follows it (then reshape copies)
    o = attention_core(g, q, k, v, c, a, eager=False, groups=1, mask=False, q_bshd=False, v_bytes=a)
    out = linear(g, o, qw, h, c, bias=False, name="o", x_bytes=a)
    g.keep(qkv, q_roped, k_roped, q, k, v)
    return out


def litgpt_mlp(g: Graph, y: int, y_bytes: int, c: Ctx) -> int:
    """LLaMAMLP.forward: x_fc_1 = fc_1(x); x_fc_2 = fc_2(x); silu(x_fc_1) * x_fc_2; proj (the two
    projections before the activation, as LitGPT orders them)."""
    s = c.spec
    t, h, i, a = c.tokens, s.hidden_size, s.intermediate_size, c.act_elem_bytes
    fc1 = linear(g, y, h, i, c, bias=s.mlp_bias, name="gate", x_bytes=y_bytes)
    fc2 = linear(g, y, h, i, c, bias=s.mlp_bias, name="up", x_bytes=y_bytes)
    act = activation(g, fc1, t * i, a * t * i, "silu", c)
    prod = g.op(a * t * i, ins=(act, fc2), saves=(act, fc2), name="silu * fc_2")
    return linear(g, prod, i, h, c, bias=s.mlp_bias, name="down", x_bytes=a)


def litgpt_layer(c: Ctx) -> Graph:
    """Block.forward (parallel_residual False): x + attn(norm_1(x)), then + mlp(norm_2(.)). The block's
    locals x_normed and attention_output, and the loop's x, stay referenced until it returns."""
    h, r = c.spec.hidden_size, c.residual_elem_bytes
    t = c.tokens
    g = Graph(input_bytes=r * t * h, input_requires_grad=c.input_grad, round_to=512 if c.cuda else 1)
    y, yb = litgpt_rms_norm(g, 0, r, c)
    att = litgpt_attention(g, y, yb, c)
    mid = g.op(max(r, c.act_elem_bytes) * t * h, ins=(att, 0), name="residual add", passes="add")
    y2, yb2 = litgpt_rms_norm(g, mid, r, c)
    g.keep(y)  # x_normed is rebound only by norm_2's result
    m = litgpt_mlp(g, y2, yb2, c)
    g.op(r * t * h, ins=(m, mid), name="residual add", passes="add")
    g.keep(0, att, y2)
    return g


def litgpt_param_numels(spec: ModelSpec) -> tuple[int, ...]:
    """Elements of GPT's parameters in `named_parameters()` order: lm_head, wte, then each Block (norm_1, qkv
    weight and bias, proj, norm_2, fc_1, fc_2, proj), ln_f (litgpt/model.py registers lm_head first)."""
    h, v, i = spec.hidden_size, spec.vocab_size, spec.intermediate_size
    qkv = spec.q_width + 2 * spec.kv_width
    layer = (h, h * qkv, *((qkv,) if spec.qkv_bias else ()), spec.q_width * h, h, h * i, h * i, i * h)
    return (v * h, v * h, *layer * spec.num_layers, h)


def litgpt_linear_shapes(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(out, in) of every nn.Linear in GPT: per Block the fused qkv, proj, fc_1, fc_2 and the MLP's proj, then
    lm_head."""
    h, i = spec.hidden_size, spec.intermediate_size
    layer = ((spec.q_width + 2 * spec.kv_width, h), (h, spec.q_width), (i, h), (i, h), (h, i))
    return (*layer * spec.num_layers, (spec.vocab_size, h))


def litgpt_qlora_base_bytes(spec: ModelSpec, kind: BnbKind, double_quant: bool, params_local: int) -> int:
    """The frozen model finetune/lora.py --quantize bnb.* trains on: BitsandbytesPrecision makes every nn.Linear
    built under init_module a Linear4bit (lm_head included: no ignore_modules), stored as bitsandbytes stores it;
    the rest (wte, norms, biases) in bf16; then the StableEmbedding put in place of wte, whose LayerNorm adds a
    weight and a bias, while main's `old_embedding` keeps the replaced V x H weight alive through fit."""
    shapes = per_spec(spec, ("litgpt linears",), lambda: litgpt_linear_shapes(spec))
    stored = sum(bnb_weight_bytes(kind, out_f, in_f, double_quant) for out_f, in_f in shapes)
    elements = sum(out_f * in_f for out_f, in_f in shapes)
    h = spec.hidden_size
    return stored + 2 * (params_local - elements) + 2 * (spec.vocab_size * h + 2 * h)


def litgpt_chunk_rows(rows: int, chunk: int) -> tuple[int, ...]:
    """Tensor.split(chunk) of `rows` rows: full chunks, the last one shorter."""
    return (chunk,) * (rows // chunk) + ((rows % chunk,) if rows % chunk else ())


def litgpt_chunked_cross_entropy(g: Graph, flat: int, targets: int, chunk_rows: tuple[int, ...], vocab: int,
                                 logits_bytes: int, view_bytes: int) -> int:
    """litgpt.utils.chunked_cross_entropy over `flat`, rows x vocab logits of `logits_bytes` per element, split
    into chunks of `chunk_rows` rows (views): per chunk cross_entropy(reduction="none") = log_softmax (keeps its
    output) and nll_loss; then cat(losses).sum() / the count of unmasked targets.
    Backward runs the chunks from the last: each nll_loss makes its chunk's dense gradient, log_softmax's
    backward another; every chunk's input gradient waits in the split's input buffer until the split's backward
    concatenates them into one rows x vocab gradient (alive beside them). `view_bytes`: the part of that
    gradient `flat`'s own size does not stand for (flat a view, 0 bytes in forward)."""
    e = logits_bytes
    rows = sum(chunk_rows)
    grad_rows = rows * vocab * e
    split = g.op(0, ins=(flat,), ws_bwd=grad_rows + view_bytes, name="logits.split (views)")
    losses, waiting = [], grad_rows
    for r in chunk_rows:
        waiting -= r * vocab * e
        lsm = g.op(e * r * vocab, ins=(split,), saves=(OUT,), ws_bwd=waiting + r * vocab * e, name="log_softmax")
        losses.append(g.op(e * r, ins=(lsm, targets), saves=(targets,), grad_ins=(lsm,), ws_bwd=waiting,
                           name="nll_loss"))
    loss = _loss_mean(g, losses, rows, targets, e)
    g.keep(flat)  # the chunks (views of it) are the function's locals until it returns
    return loss


def litgpt_logits_bytes(c: Ctx) -> int:
    """The fp32 logits fit's `logits` keeps (Lightning's convert_output casts the model output to the default
    dtype): alive through backward and the step until the next forward returns."""
    return 4 * c.tokens * c.spec.vocab_size


def litgpt_batch_bytes(batch: int, seq: int) -> int:
    """The batch finetune/full.py feeds the step: input_ids and labels, two int64 B x S tensors."""
    return 2 * 8 * batch * seq


def litgpt_rope_cache_bytes(c: Ctx) -> int:
    """GPT's RoPE cache buffers cos and sin (max_seq_length x rope_n_elem each, set to the data's longest
    sequence by finetune/full.py), in the weights' dtype: Fabric converts buffers with the module under
    bf16-true, bf16-mixed keeps them fp32, and so does BitsandbytesPrecision (QLoRA), which casts no buffer."""
    return 2 * c.seq * c.spec.rotary_dim * (4 if c.fp32_rope else c.weight_elem_bytes)


def litgpt_stable_embedding_grad_bytes(c: Ctx) -> int:
    """QLoRA: the gradients of the StableEmbedding finetune/lora.py puts in place of wte after making the optimizer
    (its V x H weight and its LayerNorm's weight and bias, bf16, requires_grad as new parameters are). No optimizer
    holds them, so no zero_grad frees them: made by the first backward, they stay, and later backwards add into
    them in place."""
    if not c.stable_embedding:
        return 0
    h = c.spec.hidden_size
    return 2 * (c.spec.vocab_size * h + 2 * h)


def litgpt_resident_bytes(c: Ctx) -> int:
    """What the step keeps beside the model states throughout: the batch, the RoPE cache, LoRA's qkv index
    buffers and QLoRA's StableEmbedding gradients."""
    return (litgpt_batch_bytes(c.batch, c.seq) + litgpt_rope_cache_bytes(c) + litgpt_lora_index_bytes(c)
            + litgpt_stable_embedding_grad_bytes(c))


def litgpt_qlora_fields(qlora: bool) -> dict[str, bool]:
    """The block context of finetune/lora.py --quantize bnb.*: its StableEmbedding and fp32 RoPE cache."""
    return {"stable_embedding": True, "fp32_rope": True} if qlora else {}


def litgpt_stable_embedding_block(c: Ctx) -> Graph:
    """bitsandbytes' StableEmbedding.forward under BitsandbytesPrecision's forward context (default dtype bf16):
    F.embedding of the bf16 weight (backward: a dense V x H gradient, added in place into the kept .grad and
    freed), `.to(torch.get_default_dtype())` (bf16 already: no copy), its LayerNorm (saves the input, mean and
    rstd; backward makes the weight's and bias's gradients, added in place likewise), `.to(self.weight.dtype)`
    (no copy)."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=0, input_requires_grad=False, round_to=512 if c.cuda else 1)
    emb = g.op(2 * t * h, ws_bwd=2 * s.vocab_size * h, name="StableEmbedding lookup")
    stats = g.op(2 * t * (4 if c.cuda else 2), grad=False, name="layernorm mean+rstd")
    g.output = g.op(2 * t * h, ins=(emb,), saves=(emb, stats), ws_bwd=2 * 2 * h, name="StableEmbedding norm")
    return g


def litgpt_lora_head_block(c: Ctx) -> Graph:
    """finetune/lora.py's head: ln_f; model(input_ids, lm_head_chunk_size=128) runs the frozen lm_head on
    x.split(128, dim=1) views; Fabric's convert_output casts every chunk to fp32 (the 16-bit list and the
    previous step's logits alive until it returns); `logits[-1] = logits[-1][..., :-1, :]`; chunked_cross_entropy
    of the list: per chunk reshape(-1, V) (a view, but a copy of the shortened last chunk when B > 1), the
    targets split the same way (reshape copies when B > 1), cross_entropy(reduction="none"). Backward runs
    every chunk's loss first (their fp32 input gradients wait for the casts' backward), then each cast back to
    16 bits, then the lm_head chunks, whose input gradients wait in the split's buffer. With B = 1 the last
    chunk's gradient is counted at its whole width (one vocabulary row more)."""
    s = c.spec
    b, seq, h, v, a = c.batch, c.seq, s.hidden_size, s.vocab_size, c.act_elem_bytes
    g = Graph(input_bytes=c.residual_elem_bytes * c.tokens * h, round_to=512 if c.cuda else 1)
    previous = g.op(litgpt_logits_bytes(c), grad=False, name="previous step's logits")
    y, _ = litgpt_rms_norm(g, 0, c.residual_elem_bytes, c)
    widths = fixed(litgpt_chunk_rows, seq, c.loss_chunks or LITGPT_CHUNK_TOKENS)
    waiting = a * b * seq * h  # the lm_head chunks' input gradients, filled from the last chunk
    split = g.op(0, ins=(y,), ws_bwd=waiting, name="x.split(128, dim=1) (views)")
    # QLoRA: lm_head is a Linear4bit too; MatMul4Bit dequantizes its weight for each chunk, forward and backward
    dequantized = dequantized_weight_bytes(c, h, v) if c.quantized_base in ("nf4", "fp4") else 0
    heads = []
    for w in widths:
        heads.append(g.op(a * b * w * v, ins=(split,), grad_ins=(), ws_fwd=dequantized, ws_bwd=waiting + dequantized,
                          name="lm_head chunk"))
        waiting -= a * b * w * h
    f32 = [g.op(4 * b * w * v, ins=(x,), name="chunk.float()") for x, w in zip(heads, widths, strict=True)]
    g.keep(previous, *heads)  # convert_output's list is built whole before `logits` is rebound
    rows = [b * w for w in widths[:-1]] + [b * (widths[-1] - 1)]
    inputs = list(f32)
    last = rows[-1] * v * 4
    if b > 1 and rows[-1]:
        sliced = g.op(0, ins=(f32[-1],), ws_bwd=last, name="logits[-1][..., :-1, :] (view)")
        inputs[-1] = g.op(last, ins=(sliced,), name="last chunk reshape(-1, V)")
    targets = [g.op(8 * r if b > 1 else 0, grad=False, name="target chunk reshape(-1)") for r in rows]
    losses = []
    for x, tg, r in zip(inputs, targets, rows, strict=True):
        if not r:
            continue
        lsm = g.op(4 * r * v, ins=(x,), saves=(OUT,), name="log_softmax")
        losses.append(g.op(4 * r, ins=(lsm, tg), saves=(tg,), grad_ins=(lsm,), name="nll_loss"))
    loss = _loss_mean(g, losses, sum(rows), targets[0])
    g.keep(inputs[-1], *f32)  # the chunks' list (the last one's copy) until the function returns; `logits` kept
    g.output = loss
    return g


def _loss_mean(g: Graph, losses: list[int], rows: int, targets: int, e: int = 4) -> int:
    """torch.cat(loss_chunks).sum() / non_masked_elems.maximum(ones_like(non_masked_elems)), the losses in `e`
    bytes per element."""
    cat = g.op(e * rows, ins=tuple(losses), name="cat(loss_chunks)")
    total = g.op(e, ins=(cat,), name="sum")
    mask = g.op(rows, ins=(targets,), grad=False, name="targets != ignore_index")
    count = g.op(8, ins=(mask,), grad=False, name="non_masked_elems")
    return g.op(e, ins=(total, count), grad_ins=(total,), name="loss / non_masked_elems")


def litgpt_head_block(c: Ctx) -> Graph:
    """ln_f, lm_head over the whole sequence (full.py calls model(input_ids)), the logits cast to fp32 while the
    previous step's fp32 logits are still bound (freed when the forward returns), then
    chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]): the slice is a view, reshape(-1, V) copies it
    when B > 1 (and the targets' likewise), the chunks are views of it. Backward: the split's concatenated
    gradient, slice_backward's zero-filled B x S x V gradient, the cast back to the lm_head's dtype."""
    if c.lora_rank:
        return litgpt_lora_head_block(c)
    s = c.spec
    t, h, v, a = c.tokens, s.hidden_size, s.vocab_size, c.act_elem_bytes
    b, seq = c.batch, c.seq
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, round_to=512 if c.cuda else 1)
    previous = g.op(litgpt_logits_bytes(c), grad=False, name="previous step's logits")
    y, yb = litgpt_rms_norm(g, 0, c.residual_elem_bytes, c)
    logits = linear(g, y, h, v, c, name="lm_head", x_bytes=yb)
    f32 = logits if a == 4 else g.op(4 * t * v, ins=(logits, previous), grad_ins=(logits,), name="logits.float()")
    rows = b * (seq - 1)
    copied = b > 1  # (B, S-1, V) of a (B, S, V) tensor is no view of (B(S-1), V) unless B == 1
    grad_bytes = 4 * rows * v
    sliced = g.op(0, ins=(f32,), ws_bwd=grad_bytes, name="logits[..., :-1, :] (view)")
    flat = g.op(grad_bytes if copied else 0, ins=(sliced,), ws_bwd=0 if copied else grad_bytes,
                name="reshape(-1, V)")
    targets = g.op(8 * rows if copied else 0, grad=False, name="targets[..., 1:].reshape(-1)")
    chunks = fixed(litgpt_chunk_rows, rows, c.loss_chunks or LITGPT_CHUNK_TOKENS)
    loss = litgpt_chunked_cross_entropy(g, flat, targets, chunks, v, 4, 0 if copied else grad_bytes)
    g.keep(f32)  # fit's `logits`: counted from here on as held (calc.memory.activations.HeldOutputs)
    g.output = loss
    return g

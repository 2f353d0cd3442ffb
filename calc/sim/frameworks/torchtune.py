"""torchtune's own model code, written for the autograd simulator (calc.sim.graph): a TransformerDecoder's
self-attention layer (Llama 3, Qwen2, Mistral builders; LoRALinear is peft's adapter graph in 16 bits,
calc.sim.ops.lora_adapter), its embedding, chunked output projection and CEWithChunkedOutputLoss (torchtune 0.6.1).

What differs from the transformers blocks (calc.sim.blocks), each from torchtune's source and measured on the
CPU with torchtune itself (data/measured_torchtune.jsonl):

- RMSNorm (modules/rms_norm.py) calls F.rms_norm on `x.float()` with the 16-bit scale and casts back; the
  scale's dtype differs from the input's, so ATen runs the composite rms_norm (aten/.../layer_norm.cpp): pow,
  mean, rsqrt, x * rsqrt, * weight, all in fp32; autograd keeps the fp32 input, the rsqrt and the fp32 normalised
  tensor (so also in fp32, measured).
- RoPE (modules/position_embeddings.py, models/llama3_1/_position_embeddings.py) rotates an fp32 copy of q and k
  interleaved, through four half-size products, their sum and difference and a stack; the products multiply
  by the cache, which needs no gradient, so nothing of the block is saved. Qwen2's RoPE (models/qwen2) is
  transformers' rotate_half in the model's dtype on 16-bit copies of cos and sin. The cache is a buffer of the
  model (`rope_cache_bytes`), not a per-step tensor.
- MultiHeadAttention (modules/attention.py) expands grouped K / V to every head (`expand(...).flatten(1, 2)`
  copies them, but for a single K / V head) before SDPA, which saves the copies; no KV cache in training, no mask (is_causal).
- TransformerSelfAttentionLayer keeps `attn_out` in a local until it returns.
- The output projection in chunks of the sequence (TransformerDecoder.chunked_output, `h.chunk(n, dim=1)`):
  with more than one sequence each chunk is non-contiguous and the linear's reshape copies it (the copy is
  saved); every chunk's 16-bit logits live until the loss returns (the recipe's `del logits`), and the loss
  upcasts one chunk at a time (`chunked_cross_entropy`).
"""

from __future__ import annotations

from calc.contract.model_spec import ModelSpec
from calc.sim.attention import attention_core
from calc.sim.context import Ctx
from calc.sim.graph import OUT, Graph
from calc.sim.mlp import gated_mlp
from calc.sim.ops import linear
from calc.sim.symbolic import fixed

TORCHTUNE_OUTPUT_CHUNKS = 8  # CEWithChunkedOutputLoss(num_output_chunks=8), the recipes' loss
PER_LAYER_ROPE_LORA_FAMILIES = ("qwen2", "mistral")  # their LoRA builders make a RoPE module per layer


# ---- the decoder layer -----------------------------------------------------------------------------------------------

def torchtune_layer(c: Ctx) -> Graph:
    """TransformerSelfAttentionLayer.forward: h = attn(sa_norm(x)) + x; out = h + mlp(mlp_norm(h)), the argument
    x and the local attn_out alive until it returns (modules/transformer.py)."""
    t, h = c.tokens, c.spec.hidden_size
    rb = c.residual_elem_bytes
    g = Graph(input_bytes=rb * t * h, input_requires_grad=c.input_grad, round_to=512 if c.cuda else 1)
    y = torchtune_rms_norm(g, 0, c)
    attn = torchtune_attention(g, y, c)
    mid = g.op(rb * t * h, ins=(attn, 0), name="residual add", passes="add")
    y2 = torchtune_rms_norm(g, mid, c)
    m = gated_mlp(g, y2, c)  # FeedForward: w2(silu(w1(x)) * w3(x)), LlamaMLP's ops in LlamaMLP's order
    g.op(rb * t * h, ins=(mid, m, attn), grad_ins=(mid, m), name="residual add", passes="add")
    g.keep(0)  # the decoder loop's `h` is rebound only when the layer returns
    return g


def torchtune_rms_norm(g: Graph, x: int, c: Ctx, tokens: int | None = None) -> int:
    """torchtune RMSNorm: F.rms_norm(x.float(), weight=scale).to(x.dtype), through ATen's composite rms_norm on
    the CPU (measured in bf16 and fp32; on CUDA assumed the same): pow keeps the fp32 input (a copy for a 16-bit
    model, the input itself in fp32), rsqrt its output, the product both, the scale product the fp32 normalised
    tensor; `add_(eps)` is in place. Returns the output id (the input's dtype)."""
    t = c.tokens if tokens is None else tokens
    h = c.spec.hidden_size
    n, xb = t * h, c.residual_elem_bytes
    pgrad = 0 if c.frozen_base else c.weight_elem_bytes * h
    xf = x if xb == 4 else g.op(4 * n, ins=(x,), name="norm x.float()")
    sq = g.op(4 * n, ins=(xf,), saves=(xf,), name="norm pow")
    mean = g.op(4 * t, ins=(sq,), name="norm mean (+eps in place)")
    rs = g.op(4 * t, ins=(mean,), saves=(OUT,), name="norm rsqrt")
    n32 = g.op(4 * n, ins=(xf, rs), saves=(xf, rs), name="norm x * rsqrt")
    # a frozen scale (LoRA) needs no gradient: the product keeps only the scale itself
    y32 = g.op(4 * n, ins=(n32,), saves=(n32,) if pgrad else (), pgrad=pgrad, ws_bwd=4 * n if pgrad else 0,
               name="norm * scale")
    return y32 if xb == 4 else g.op(xb * n, ins=(y32,), name="norm .to(x.dtype)")


def torchtune_rope(g: Graph, x: int, elems: int, c: Ctx) -> int:
    """RotaryPositionalEmbeddings / Llama3ScaledRoPE.forward on (B, S, heads, head_dim): xshaped = x.float()
    viewed in pairs; stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin]) (four half-size fp32 products, their
    difference and sum); type_as(x). The products save the cache slice only (a buffer), the locals xshaped and
    x_out live until it returns."""
    a = c.act_elem_bytes
    half = 4 * elems // 2
    xf = x if a == 4 else g.op(4 * elems, ins=(x,), name="rope x.float()")
    pairs = []
    for part in ("x0 * cos - x1 * sin", "x1 * cos + x0 * sin"):
        p1 = g.op(half, ins=(xf,), name=f"rope {part}: first product")
        p2 = g.op(half, ins=(xf,), name=f"rope {part}: second product")
        pairs.append(g.op(half, ins=(p1, p2), name=f"rope {part}"))
    stacked = g.op(4 * elems, ins=tuple(pairs), name="rope stack")
    out = stacked if a == 4 else g.op(a * elems, ins=(stacked,), name="rope type_as(x)")
    g.keep(xf, stacked)
    return out


def qwen2_rope(g: Graph, x: int, elems: int, c: Ctx) -> int:
    """Qwen2RotaryPositionalEmbeddings.forward (models/qwen2/_positional_embeddings.py): cos and sin sliced from
    the fp32 cache and cast to x's dtype (a (1, S, 1, head_dim) copy each per call, saved by the products; in fp32
    views of the buffer); rotated = cat(-x2, x1); x * cos + rotated * sin, in x's dtype."""
    a = c.act_elem_bytes
    trig: tuple[int, ...] = ()
    if a != 4:
        trig = tuple(g.op(a * c.seq * c.spec.head_dim, grad=False, name=f"rope {f}.to(x.dtype)") for f in ("cos", "sin"))
    neg = g.op(a * elems // 2, ins=(x,), name="rope -x2")
    rotated = g.op(a * elems, ins=(neg, x), name="rope cat(-x2, x1)")
    by_cos = g.op(a * elems, ins=(x, *trig[:1]), saves=trig[:1], grad_ins=(x,), name="rope x * cos")
    by_sin = g.op(a * elems, ins=(rotated, *trig[1:]), saves=trig[1:], grad_ins=(rotated,), name="rope rotated * sin")
    return g.op(a * elems, ins=(by_cos, by_sin), name="rope add")


def torchtune_attention(g: Graph, y: int, c: Ctx) -> int:
    """MultiHeadAttention.forward(x, y) in training: q_proj, RoPE on q; k_proj, v_proj, RoPE on k; grouped K / V
    expanded to all heads (`unsqueeze(2).expand(...).flatten(1, 2)` copies them, unless there is one K / V head,
    whose flatten is a view; measured); SDPA with is_causal (no mask,
    dropout 0), whose node saves the expanded copies; output_proj. x (= y, the norm output) lives until it returns;
    the unexpanded k and v are rebound and freed (modules/attention.py)."""
    s = c.spec
    t, h, a = c.tokens, s.hidden_size, c.act_elem_bytes
    qw, kvw = s.q_width, s.kv_width
    rope = qwen2_rope if s.family == "qwen2" else torchtune_rope
    q = rope(g, linear(g, y, h, qw, c, bias=s.qkv_bias, name="q"), t * qw, c)
    k = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="k")
    v = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="v")
    k = rope(g, k, t * kvw, c)
    if s.num_heads != s.num_kv_heads and s.num_kv_heads > 1:  # one K / V head: the flatten is a (stride-0) view
        k = g.op(a * t * qw, ins=(k,), name="k expanded to all heads")
        v = g.op(a * t * qw, ins=(v,), name="v expanded to all heads")
    o = attention_core(g, q, k, v, c, a, eager=False, groups=1, mask=False)
    out = linear(g, o, qw, h, c, name="o", x_bytes=a)
    g.keep(y)
    return out


# ---- the embedding ---------------------------------------------------------------------------------------------------

def torchtune_embedding_block(c: Ctx) -> Graph:
    """tok_embeddings (nn.Embedding): saves only the token ids; its backward makes a dense V x H gradient. With
    tied embeddings (TiedLinear, Llama 3.2 / Qwen2.5 small) the output chunks' gradient already waits in the
    weight's autograd input buffer, and the embedding's is added to it out of place once the embedding's node
    has run and released its input gradient (three V x H tensors, without the B x S x H one; measured)."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=0, input_requires_grad=False, round_to=512 if c.cuda else 1)
    emb_grad = 0 if c.frozen_base else s.vocab_size * h * c.weight_elem_bytes
    out = c.residual_elem_bytes * t * h
    if s.tie_word_embeddings and emb_grad:
        weight = g.op(0, ws_bwd=2 * emb_grad, name="tied weight: gradients summed in its input buffer")
        g.output = g.op(out, ins=(weight,), name="tok_embeddings")
    else:
        g.output = g.op(out, pgrad=emb_grad, name="tok_embeddings")
    return g


# ---- the output projection and the loss ------------------------------------------------------------------------------

def output_chunk_lengths(seq: int, chunks: int) -> tuple[int, ...]:
    """Sequence positions in each chunk of torch.chunk(seq, chunks): ceil(seq / chunks) each, the last what is
    left, and fewer chunks where that size covers the sequence sooner (torch.chunk's rule)."""
    size = -(-seq // chunks)
    count = -(-seq // size)
    return (size,) * (count - 1) + (seq - size * (count - 1),)


def _chunk_size(seq: int, chunks: int) -> int:
    return output_chunk_lengths(seq, chunks)[0]


def _chunk_count(seq: int, chunks: int) -> int:
    return len(output_chunk_lengths(seq, chunks))


def _batched(batch: int) -> int:
    return int(batch > 1)


def torchtune_head_block(c: Ctx) -> Graph:
    """TransformerDecoder.unembed and the recipe's loss (recipes/full_finetune_single_device.py _loss_step): the
    final norm, then either the output projection in `c.output_chunks` chunks of the sequence and
    CEWithChunkedOutputLoss, or (no chunks) `self.output(h).float()` and nn.CrossEntropyLoss on the fp32
    logits. The recipe's labels (hstack of labels[..., 1:] and the ignore index, int64) live until the loss
    returns."""
    s = c.spec
    t, h, v = c.tokens, s.hidden_size, s.vocab_size
    a = c.act_elem_bytes
    g = Graph(input_bytes=c.residual_elem_bytes * t * h, round_to=512 if c.cuda else 1)
    y = torchtune_rms_norm(g, 0, c)
    labels = g.op(8 * t, grad=False, name="labels hstack")
    pgrad = 0 if c.frozen_base else c.weight_elem_bytes * v * h
    if not c.output_chunks:
        logits = g.op(a * t * v, ins=(y,), saves=(y,) if pgrad else (), pgrad=pgrad, name="output")
        f32 = logits if a == 4 else g.op(4 * t * v, ins=(logits,), name="logits.float()")
        g.output = chunked_cross_entropy(g, [f32], [t], v, 4, labels, c)
        return g
    seq_b = c.batch  # sequences: chunks of the sequence dimension are strided when there are several
    size = fixed(_chunk_size, c.seq, c.output_chunks)
    count = fixed(_chunk_count, c.seq, c.output_chunks)
    lengths = [size] * (count - 1) + [c.seq - size * (count - 1)]
    tokens = [seq_b * n for n in lengths]
    copies = bool(fixed(_batched, c.batch)) and count > 1
    logits = chunked_output(g, y, tokens, h, v, pgrad, copies, c)
    g.output = chunked_cross_entropy(g, logits, tokens, v, a, labels, c, copies)
    return g


def chunked_output(g: Graph, y: int, tokens: list, h: int, v: int, pgrad: int, copies: bool, c: Ctx) -> list[int]:
    """The output projection on each chunk of the normalised hidden state `y` (`tokens`: tokens per chunk), in
    order; returns the chunks' logits (compute dtype). `copies`: each chunk is a strided view that the linear's
    reshape copies (saved instead of y). The weight is one parameter read by every chunk through its transpose,
    taken before the chunk's matmul (F.linear's `weight.t()`), so in backward a chunk's weight gradient reaches
    the weight after the matmul's node has run and released the chunk's logits gradient: the last chunk's,
    computed first, starts its .grad; each earlier chunk's is added out of place in autograd's input buffer (the
    buffer, the new gradient and their sum alive at once). Only the last chunk passes the input gradient on:
    autograd keeps one gradient per chunk until the chunk's backward concatenates them, which the simulator
    counts as the whole hidden-state gradient from the last chunk's backward on (with one sequence, where no
    copies are made, measured up to 0.4 % over on the backward phase's peak; never the step's peak there)."""
    a = c.act_elem_bytes
    out = []
    for k, tk in enumerate(tokens):
        last = k == len(tokens) - 1
        wt = (g.op(0, pgrad=pgrad if last else 0, ws_bwd=0 if last else 2 * pgrad, name=f"output weight.t() {k}"),) \
            if pgrad else ()
        x = g.op(a * tk * h, ins=(y,), grad_ins=(y,) if last else (), name="chunk contiguous copy") if copies else y
        # a frozen output weight (LoRA) keeps no input: its input gradient needs only the weight
        out.append(g.op(a * tk * v, ins=(x, *wt), saves=(x,) if pgrad else (),
                        grad_ins=((x,) if copies or last else ()) + wt, name=f"output chunk {k}"))
    g.keep(y)  # unembed's local h
    return out


def chunked_cross_entropy(g: Graph, logits: list[int], tokens: list, vocab: int, logit_bytes: int, labels: int,
                          c: Ctx, copies: bool = False) -> int:
    """A cross-entropy summed over chunks of logits (`tokens`: tokens of each chunk, in order): each chunk cast to
    fp32 (`logits.float()`, unless already fp32), log_softmax (saves its fp32 output) and nll_loss (saves the
    chunk's int64 targets: a copy when `copies`, else views of `labels`), one chunk after another, then the sum
    divided by the token count; every chunk's logits live until the loss returns (torchtune's
    CEWithChunkedOutputLoss, modules/loss/ce_chunked_output_loss.py). Backward runs the chunks' loss nodes from
    the last chunk to the first, before any logits' producer. One function for every framework's chunked loss:
    the caller says how the chunks are cut."""
    total = None
    for k, (lg, tk) in enumerate(zip(logits, tokens, strict=True)):
        tgt = g.op(8 * tk, ins=(labels,), grad=False, name=f"chunk {k} labels reshape") if copies else labels
        f32 = lg if logit_bytes == 4 else g.op(4 * tk * vocab, ins=(lg,), name=f"chunk {k} logits.float()")
        lsm = g.op(4 * tk * vocab, ins=(f32,), saves=(OUT,), name=f"chunk {k} log_softmax")
        loss = g.op(4, ins=(lsm, tgt), saves=(tgt,), grad_ins=(lsm,), name=f"chunk {k} nll_loss (sum)")
        total = loss if total is None else g.op(4, ins=(total, loss), name="total_loss +=")
    assert total is not None
    return g.op(4, ins=(total, *logits, labels), grad_ins=(total,), name="/ total_elements")


# ---- model-level buffers ---------------------------------------------------------------------------------------------

def rope_cache_bytes(spec: ModelSpec, lora: bool = False) -> int:
    """The RoPE modules' buffers, fp32 whatever the model's dtype (rope_init builds them from an fp32 arange):
    `theta` (head_dim / 2) and `cache`, (max_seq_len, head_dim / 2, 2) for Llama 3 (RotaryPositionalEmbeddings,
    Llama3ScaledRoPE), (max_seq_len, 2 x head_dim) for Qwen2 (cos and sin of the doubled frequencies side by
    side). One module shared by every layer, except in lora_qwen2 and lora_mistral, whose *_self_attention builds
    one per layer (models/qwen2/_component_builders.py, models/mistral/_component_builders.py). lora_llama3 (Llama
    3 without rope_scaling) does so too, which is not modelled: the Llama family counts as lora_llama3_1 /
    lora_llama3_2, which share one (the spec does not say which Llama 3 it is)."""
    cache_per_position = 2 * spec.head_dim if spec.family == "qwen2" else spec.head_dim
    modules = spec.num_layers if lora and spec.family in PER_LAYER_ROPE_LORA_FAMILIES else 1
    return modules * (4 * spec.max_position_embeddings * cache_per_position + 2 * spec.head_dim)

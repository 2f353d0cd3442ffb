"""The attention modules of transformers' families, written for the autograd simulator (calc.sim.graph): RoPE
(half-rotation, interleaved, complex), SDPA and eager attention, the KV cache, Llama-style, Llama 4, multi-head
latent (DeepSeek), GPT-2 and GPT-NeoX attention.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves.
"""

from __future__ import annotations

from calc.contract.model_spec import GEMMA_FAMILIES
from calc.sim.context import Ctx
from calc.sim.graph import OUT, Graph
from calc.sim.ops import dropout, linear, product_saves, rms_norm


def rope(g: Graph, x: int, width: int, c: Ctx) -> int:
    """apply_rotary_pos_emb: x*cos + rotate_half(x)*sin. cos/sin are model-level tensors, so the
    muls save nothing block-local; rotate_half makes a neg and a cat copy. Partial rotary
    (gpt_neox, phi3 with partial factor) slices, rotates and concatenates the pass-through part."""
    t, a, e = c.tokens, c.act_elem_bytes, c.rope_elem_bytes
    rot = int(width * c.spec.rotary_fraction) // 2 * 2 if c.spec.rotary_fraction < 1 else width
    xc = g.op(e * t * rot, ins=(x,), name="rope x*cos")
    neg = g.op(a * t * rot // 2, ins=(x,), name="rope neg")
    cat = g.op(a * t * rot, ins=(neg, x), name="rope cat")
    xs = g.op(e * t * rot, ins=(cat,), name="rope *sin")
    out = g.op(e * t * rot, ins=(xc, xs), name="rope add")
    if rot < width:
        out = g.op(e * t * width, ins=(out, x), name="rope cat pass-through")
    return out


def attention_core(g: Graph, q: int, k: int, v: int, c: Ctx, qk_bytes: int, eager: bool,
                   groups: int, mask: bool, q_bshd: bool = True, v_bytes: int = 2, v_width: int = 0) -> int:
    """Scaled dot-product attention over q (B, nh, S, hd) and k, v (B, nkv, S, hd).

    sdpa: torch SDPA (flash / memory-efficient); the node saves q, k, v, the output and the
    per-row logsumexp (fp32, B x nh x S). On CUDA in fp32 with grouped heads and no mask no fused
    kernel applies and the math path runs (measured on an H200). HF passes enable_gqa=True when there is no mask
    (transformers/integrations/sdpa_attention.py, use_gqa_in_sdpa), else repeat_kv copies k, v.
    On CUDA the output is laid out (B, S, nh, hd), so the reshape before o_proj is free; the CPU
    kernel follows the query's layout, which is (B, nh, S, hd) after a fused-qkv slice or a
    partial-RoPE cat (q_bshd=False), and then `.contiguous()` copies it. Backward keeps
    an fp32 dq accumulator and the softmax row sums on CUDA (flash-attention 2).
    eager: matmul(q, k^T) * scale (+ mask) -> softmax(fp32) -> .to(dtype) -> dropout -> @ v,
    keeping the fp32 probabilities and their 16-bit copy: B x nh x S x S each
    (modeling_llama.eager_attention_forward)."""
    s = c.spec
    nh = s.num_heads // c.tp
    t, a, bsz, seq = c.tokens, c.act_elem_bytes, c.batch, c.seq
    qw = nh * s.head_dim
    vw = v_width or qw  # MLA: value heads narrower than q / k heads
    if not eager and not c.cuda and (s.attention_dropout > 0 and c.train or vw != qw):
        # CPU SDPA's fused kernel needs no dropout and one head width for q, k and v
        return _math_sdpa(g, q, k, v, c, qw, bsz * nh * seq * seq, vw)
    if not eager and c.cuda and groups > 1 and not mask and a == 4 and not c.amp:
        # enable_gqa in fp32: flash and cuDNN take 16-bit inputs only and memory-efficient attention refuses
        # grouped heads (sdp_utils.cpp: check_batch_size_and_num_heads_dense without GQA support), so CUDA
        # dispatches to the math path, whose expanded K/V and fp32 probabilities are saved per layer
        return _math_sdpa(g, q, k, v, c, qw, bsz * nh * seq * seq, vw)
    if c.amp and qk_bytes == 4:  # autocast casts the fp32 (RoPE-promoted) q and k for the matmul/SDPA
        q = g.op(2 * t * qw, ins=(q,), name="autocast q")
        k = g.op(2 * t * (qw // groups), ins=(k,), name="autocast k")
    if c.amp and v_bytes == 4:  # and v, when the KV cache promoted it to fp32
        v = g.op(2 * t * (qw // groups), ins=(v,), name="autocast v")
    if not eager:
        extra: tuple[int, ...] = ()
        if mask:
            if groups > 1:
                k = g.op(a * t * qw, ins=(k,), name="repeat_kv k")
                v = g.op(a * t * qw, ins=(v,), name="repeat_kv v")
            extra = (_sdpa_float_mask(g, c),)
        lse = g.op(4 * bsz * nh * seq, grad=False, name="logsumexp")
        ws = 4 * t * qw + 4 * bsz * nh * seq if c.cuda else 0
        out = g.op(a * t * vw, ins=(q, k, v, *extra), saves=(q, k, v, OUT, lse, *extra), ws_bwd=ws, name="sdpa")
        if not c.cuda and not q_bshd:
            out = g.op(a * t * vw, ins=(out,), name="attn output contiguous")
        return out
    if groups > 1:
        k = g.op(a * t * qw, ins=(k,), name="repeat_kv k")
        v = g.op(a * t * qw, ins=(v,), name="repeat_kv v")
    ss = bsz * nh * seq * seq
    if s.attention_sinks:
        return _eager_with_sinks(g, q, k, v, c, ss, qw)
    if q_bshd or s.family == "gpt2":  # bmm gets a (saved) contiguous copy of q
        q = g.op(a * t * qw, ins=(q,), name="q contiguous for bmm")
    scores = g.op(a * ss, ins=(q, k), saves=product_saves(g, q, k), name="q @ k^T")
    scaled = g.op(a * ss, ins=(scores,), name="* scaling")
    if s.attn_logit_softcapping:
        d = g.op(a * ss, ins=(scaled,), name="/ softcap")
        th = g.op(a * ss, ins=(d,), saves=(OUT,), name="tanh")
        scaled = g.op(a * ss, ins=(th,), name="* softcap")
    mb = 4 if c.residual_elem_bytes == 4 else a  # the float mask is built in the model dtype
    mbytes = max(a, mb)
    masked = g.op(mbytes * ss, ins=(scaled,), name="+ mask")
    if s.family == "gpt2":  # GPT-2's eager softmax runs in the scores' dtype
        sb, src = mbytes, masked
    else:  # softmax(..., dtype=torch.float32) converts its input first
        sb = 4
        src = masked if mbytes == 4 else g.op(4 * ss, ins=(masked,), name="softmax input to fp32")
    p32 = g.op(sb * ss, ins=(src,), saves=(OUT,), name="softmax")
    g.keep(masked)  # one Python call: its input is referenced until softmax(..., dtype) returns
    probs = p32
    if a != sb:  # .to(query.dtype), or autocast's cast of fp32 probs for the matmul under amp
        probs = g.op(a * ss, ins=(p32,), name="probs to 16-bit")
    probs = dropout(g, probs, ss, a * ss, s.attention_dropout, c)
    g.held.append(probs)  # returned as attn_weights; the decoder layer's `_` holds it until it returns
    if vw != qw:  # MLA: v is a strided slice of kv_b's output; matmul's reshape copies it
        v = g.op(a * t * vw, ins=(v,), name="v contiguous for bmm")
    o = g.op(a * t * vw, ins=(probs, v), saves=product_saves(g, probs, v), name="probs @ v")
    out = g.op(a * t * vw, ins=(o,), name="transpose contiguous")
    g.keep(k, v)
    return out


def _eager_with_sinks(g: Graph, q: int, k: int, v: int, c: Ctx, ss: int, qw: int) -> int:
    """gpt-oss eager_attention_forward: scores * scale + mask, a sink column concatenated to every row
    (B x nh x S x (S + 1)), minus the row max (kept: its indices), softmax in that dtype (kept), the sink
    column sliced off and cast to the value dtype for probs @ v (modeling_gpt_oss.py)."""
    s, a, t = c.spec, c.act_elem_bytes, c.tokens
    rows = ss // c.seq
    ss1 = ss + rows
    mb = max(a, 4 if c.residual_elem_bytes == 4 else a)  # the float mask is in the model dtype (fp32 under autocast)
    scores = g.op(a * ss, ins=(q, k), saves=product_saves(g, q, k), name="q @ k^T")
    scaled = g.op(a * ss, ins=(scores,), name="* scaling")
    masked = g.op(mb * ss, ins=(scaled,), name="+ mask")
    comb = g.op(mb * ss1, ins=(masked,), pgrad=0 if c.frozen_base else c.weight_elem_bytes * s.num_heads // c.tp,
                name="cat sinks")
    idx = g.op(8 * rows, grad=False, name="row max indices")
    mx = g.op(mb * rows, ins=(comb, idx), saves=(idx,), grad_ins=(comb,), name="row max")
    shifted = g.op(mb * ss1, ins=(comb, mx), name="- max")
    probs = g.op(mb * ss1, ins=(shifted,), saves=(OUT,), name="softmax")
    g.keep(masked)  # the local attn_weights holds the masked scores until it is rebound after the softmax
    weights = probs if mb == a else g.op(a * ss, ins=(probs,), name="probs to value dtype")
    g.held.append(weights)  # returned as attn_weights; the decoder layer's `_` holds it until it returns
    o = g.op(a * t * qw, ins=(weights, v), saves=(weights, v), name="probs @ v")
    out = g.op(a * t * qw, ins=(o,), name="transpose contiguous")
    g.keep(k, v)
    return out


def _sdpa_float_mask(g: Graph, c: Ctx) -> int:
    """SDPA given a boolean mask (the sliding window's, (1, 1, S, S) expanded to the batch) first
    converts it to an additive mask in the query's dtype: `where(mask.logical_not(), -inf, 0)`
    materialises B x 1 x S x S (a bool temporary, then the float mask), and the fused kernel's node
    saves it for backward, in every layer. Same on CPU (flash_attention_for_cpu) and CUDA (memory-
    efficient and cuDNN backends; flash takes no mask): aten/src/ATen/native/transformers/
    attention.cpp, convert_boolean_attn_mask / _cudnn. Measured on CPU and on an H200 (Mistral's and
    Qwen2's windows; the memory-efficient path's pad of the last dim to a multiple of 8 when S is not
    one is not modelled)."""
    ss = c.batch * c.seq * c.seq
    inverted = g.op(ss, grad=False, name="mask logical_not")
    return g.op(c.act_elem_bytes * ss, ins=(inverted,), grad=False, name="additive float mask")


def _math_sdpa(g: Graph, q: int, k: int, v: int, c: Ctx, qw: int, ss: int, vw: int = 0) -> int:
    """CPU SDPA with dropout has no fused kernel and runs the math path
    (_scaled_dot_product_attention_math), which upcasts q, k, v to fp32 contiguous copies, keeps
    fp32 scores' softmax, the dropout noise and the dropped probabilities, and casts the output
    back (aten/src/ATen/native/transformers/attention.cpp)."""
    t = c.tokens
    vw = vw or qw
    if not c.train:  # no_grad: query_acc / key_acc stay alive next to the scaled q and k^T (measured)
        acc = [x if c.act_elem_bytes == 4 else g.op(4 * t * qw, ins=(x,), name="math sdpa fp32 copy") for x in (q, k)]
        g.held += acc
    q, k = (g.op(4 * t * qw, ins=(x,), name="math sdpa fp32 copy") for x in (q, k))
    v = g.op(4 * t * vw, ins=(v,), name="math sdpa fp32 copy")
    scores = g.op(4 * ss, ins=(q, k), saves=(q, k), name="q @ k^T")
    masked = g.op(4 * ss, ins=(scores,), name="causal mask")
    probs = g.op(4 * ss, ins=(masked,), saves=(OUT,), name="softmax")
    probs = dropout(g, probs, ss, 4 * ss, c.spec.attention_dropout if c.train else 0.0, c)
    o = g.op(4 * t * vw, ins=(probs, v), saves=(probs, v), name="probs @ v")
    if c.act_elem_bytes != 4:
        o = g.op(c.act_elem_bytes * t * vw, ins=(o,), name="output back to 16-bit")
    return g.op(c.act_elem_bytes * t * vw, ins=(o,), name="transpose contiguous")


def llama_attention(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """LlamaAttention (also Mistral, Qwen2/3, Mixtral, Gemma2): q/k/v projections, RoPE, core
    attention, o_proj. Qwen3 adds per-head RMSNorm on q and k before RoPE."""
    s = c.spec
    if s.mla:
        return mla_attention(g, y, c, eager)
    if s.family == "llama4_text":
        return llama4_attention(g, y, c, eager)
    qw = s.q_width // c.tp
    kvw = s.kv_width // c.tp
    h = s.hidden_size
    if s.family == "phi3":  # one fused qkv_proj; q, k, v are views of its output
        q = k = v = linear(g, y, h, qw + 2 * kvw, c, name="qkv")
    else:
        q = linear(g, y, h, qw, c, bias=s.qkv_bias, name="q")
        k = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="k")
        v = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="v")
    if s.qk_norm:
        q = _head_norm(g, q, qw, c)
        k = _head_norm(g, k, kvw, c)
        if s.family in GEMMA_FAMILIES:  # Gemma3RMSNorm returns the input dtype
            q = g.op(c.act_elem_bytes * c.tokens * qw, ins=(q,), name="q norm cast back") if c.act_elem_bytes != 4 else q
            k = g.op(c.act_elem_bytes * c.tokens * kvw, ins=(k,), name="k norm cast back") if c.act_elem_bytes != 4 else k
    if s.attention_sinks:  # gpt-oss _apply_rotary_emb: halves times cos / sin, then one cat
        qe, ke = _rope_interleaved(g, q, c.tokens * qw, c), _rope_interleaved(g, k, c.tokens * kvw, c)
    else:
        qe, ke = rope(g, q, qw, c), rope(g, k, kvw, c)
    ke, v, vb = kv_cache(g, ke, v, c.tokens * kvw, c.rope_elem_bytes, c.act_elem_bytes, c)
    groups = s.num_heads // s.num_kv_heads
    # a partial-RoPE cat leaves q contiguous in (B, nh, S, hd)
    o = attention_core(g, qe, ke, v, c, c.rope_elem_bytes, eager, groups, mask=eager or sdpa_needs_mask(c),
                       q_bshd=s.family != "phi3" and s.rotary_fraction == 1 and not s.attention_sinks, v_bytes=vb)
    out = linear(g, o, qw, h, c, bias=s.o_bias, name="o", x_bytes=c.act_elem_bytes)
    g.keep(y, qe, ke, v)  # hidden_states and the q/k/v locals stay referenced until attention returns
    return out


def llama4_attention(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """Llama4TextAttention: q/k/v projections; on RoPE layers (c.sliding: they attend in chunks) the
    complex RoPE on (B, S, heads, hd) and, with use_qk_norm, a weightless L2 norm of q and k; on NoPE
    layers with attn_temperature_tuning, q times a per-position fp32 scale, cast back; then the KV
    cache and the attention core (modeling_llama4.py). Every step returns the projections' dtype."""
    s = c.spec
    t, h, a = c.tokens, s.hidden_size, c.act_elem_bytes
    qw, kvw = s.q_width // c.tp, s.kv_width // c.tp
    q = linear(g, y, h, qw, c, bias=s.qkv_bias, name="q")
    k = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="k")
    v = linear(g, y, h, kvw, c, bias=s.qkv_bias, name="v")
    q_states, k_states = q, k
    if c.sliding:
        q, k = _rope_complex(g, q, t * qw, c, copy=a != 4), _rope_complex(g, k, t * kvw, c, copy=a != 4)
        if s.qk_l2_norm:
            q, k = _l2_norm(g, q, qw, c), _l2_norm(g, k, kvw, c)
    elif s.attn_temperature_tuning:
        scales = g.op(4 * c.seq, grad=False, name="attn_scales (log1p(floor(pos / floor_scale)) ...)")
        q = g.op(4 * t * qw, ins=(q, scales), saves=(scales,), grad_ins=(q,), name="q * attn_scales")
        q = q if a == 4 else g.op(a * t * qw, ins=(q,), name="q to its dtype")
    k, v, vb = kv_cache(g, k, v, t * kvw, a, a, c)
    o = attention_core(g, q, k, v, c, a, eager, s.num_heads // s.num_kv_heads, mask=eager or sdpa_needs_mask(c),
                       v_bytes=vb)
    out = linear(g, o, qw, h, c, bias=s.o_bias, name="o", x_bytes=a)
    g.keep(y, q_states, k_states, q, k, v)  # hidden_states and the q/k/v locals live until attention returns
    return out


def _l2_norm(g: Graph, x: int, width: int, c: Ctx) -> int:
    """Llama4TextL2Norm over each head: x.float() * rsqrt(mean(x^2) + eps), type_as(x); no weight. pow
    keeps the fp32 input, rsqrt its output, the product both."""
    t = c.tokens
    n, rows = t * width, t * width // c.spec.head_dim
    h = x if c.act_elem_bytes == 4 else g.op(4 * n, ins=(x,), name="l2 norm to fp32")
    sq = g.op(4 * n, ins=(h,), saves=(h,), name="l2 norm pow")
    mean = g.op(4 * rows, ins=(sq,), name="l2 norm mean")
    ve = g.op(4 * rows, ins=(mean,), name="l2 norm +eps")
    rs = g.op(4 * rows, ins=(ve,), saves=(OUT,), name="l2 norm rsqrt")
    y = g.op(4 * n, ins=(h, rs), saves=(h, rs), name="l2 norm scale")
    return y if c.act_elem_bytes == 4 else g.op(c.act_elem_bytes * n, ins=(y,), name="l2 norm type_as")


def mla_attention(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """DeepseekV3Attention (multi-head latent attention): q through q_proj or the q_a -> RMSNorm -> q_b
    bottleneck; kv_a_proj_with_mqa gives the compressed KV (kv_lora_rank, RMSNorm'd) and one shared
    rotary key (qk_rope_head_dim); interleaved RoPE on the rotary parts; the cache stores the two
    compressed tensors (so v is promoted to the rotary key's dtype there); q = cat(q_pass, q_rot);
    kv_b_proj expands the latent into k_nope and v, and k = a new tensor holding k_nope and the
    broadcast rotary key (modeling_deepseek_v3.py expand_kv). v stays a strided slice of kv_b's
    output. Heads are split by tensor parallelism; the latent is not."""
    s = c.spec
    t, h, a, e = c.tokens, s.hidden_size, c.act_elem_bytes, c.rope_elem_bytes
    nh = s.num_heads // c.tp
    r, kvl, vd = s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim
    qk = s.head_dim
    if s.q_lora_rank:
        qa = linear(g, y, h, s.q_lora_rank, c, bias=s.qkv_bias, name="q_a")
        qn, qb = rms_norm(g, qa, a, c, width=s.q_lora_rank)
        q = linear(g, qn, s.q_lora_rank, nh * qk, c, name="q_b", x_bytes=qb)
    else:
        q = linear(g, y, h, nh * qk, c, name="q")
    q_states = q
    ckv = linear(g, y, h, kvl + r, c, bias=s.qkv_bias, name="kv_a")
    kvn, kvb_bytes = rms_norm(g, ckv, a, c, width=kvl)
    rope_fn = _rope_complex if s.rope_complex else _rope_interleaved
    q_rot = rope_fn(g, q, t * nh * r, c)
    k_rot = rope_fn(g, ckv, t * r, c)
    e = a if s.rope_complex else e  # type_as(x): the complex RoPE returns the input dtype
    if c.use_cache:  # DynamicCache: cat copies of the latent and of the rotary key (promoted to its dtype)
        kvn = g.op(kvb_bytes * t * kvl, ins=(kvn,), name="cache latent copy")
        k_rot = g.op(max(kvb_bytes, e) * t * r, ins=(k_rot,), name="cache rotary key copy")
        g.cached += [kvn, k_rot]
    qb16 = max(a, e)
    q = g.op(qb16 * t * nh * qk, ins=(q, q_rot), name="cat(q_pass, q_rot)")
    kv = linear(g, kvn, kvl, nh * (qk - r + vd), c, name="kv_b", x_bytes=kvb_bytes)
    k = g.op(a * t * nh * qk, ins=(kv, k_rot), name="key_states (k_nope + rotary key)")
    o = attention_core(g, q, k, kv, c, qb16, eager, 1, mask=eager, q_bshd=False, v_bytes=a, v_width=nh * vd)
    out = linear(g, o, nh * vd, h, c, bias=s.qkv_bias, name="o", x_bytes=c.act_elem_bytes)
    g.keep(y, q_states, ckv, q_rot, k_rot, q, k, kv)  # forward's locals (q_states, compressed_kv, ...) live until it returns
    return out


def _rope_complex(g: Graph, x: int, elems: int, c: Ctx, copy: bool = True) -> int:
    """DeepSeek-V2's apply_rotary_emb: x.float() reshaped to pairs (a contiguous fp32 copy of the
    strided slice), view_as_complex, times freqs_cis (the mul keeps only the model-level freqs),
    view_as_real and type_as(x) (a copy back when x is 16-bit). copy=False: x is a contiguous fp32
    tensor (Llama 4 in fp32), which .float() and the reshape only view."""
    f32 = g.op(4 * elems, ins=(x,), name="rope x.float() pairs") if copy else x
    rot = g.op(4 * elems, ins=(f32,), name="rope * freqs_cis (complex)")
    return rot if c.act_elem_bytes == 4 else g.op(c.act_elem_bytes * elems, ins=(rot,), name="rope type_as(x)")


def _rope_interleaved(g: Graph, x: int, elems: int, c: Ctx) -> int:
    """apply_rotary_pos_emb_interleave on a rotary slice: even/odd halves times cos/sin (the muls
    keep only the model-level cos/sin), differences and sums, one cat."""
    e = c.rope_elem_bytes
    half = elems // 2
    parts = []
    for name in ("x1*cos - x2*sin", "x2*cos + x1*sin"):
        m1 = g.op(e * half, ins=(x,), name=f"rope {name} (1)")
        m2 = g.op(e * half, ins=(x,), name=f"rope {name} (2)")
        parts.append(g.op(e * half, ins=(m1, m2), name=f"rope {name}"))
    return g.op(e * elems, ins=tuple(parts), name="rope cat")


def kv_cache(g: Graph, k: int, v: int, elems: int, k_elem: int, v_elem: int, c: Ctx) -> tuple[int, int, int]:
    """With use_cache (config default, also in training without gradient checkpointing) the
    attention calls DynamicCache.update, whose first `torch.cat([empty, k])` makes fresh copies of
    k and v; the empty tensors have the key's dtype, so v is promoted to it (fp32 under amp, where
    RoPE promotes k). Attention then reads the copies, and the cache holds them until the model's
    forward returns (transformers/cache_utils.py, DynamicLayer). Returns (k, v, v element bytes)."""
    if not c.use_cache:
        return k, v, v_elem
    kc = g.op(elems * k_elem, ins=(k,), name="cache k copy")
    v_elem = max(k_elem, v_elem)
    vc = g.op(elems * v_elem, ins=(v,), name="cache v copy")
    g.cached += [kc, vc]
    return kc, vc, v_elem


def _head_norm(g: Graph, x: int, width: int, c: Ctx) -> int:
    """Qwen3's q_norm / k_norm: an RMSNorm over head_dim, same saved set as rms_norm. Gemma 3's
    multiplies by (1 + weight) in fp32 (Gemma3RMSNorm); the cast back follows in the caller."""
    t = c.tokens
    n = t * width
    h = x if c.act_elem_bytes == 4 else g.op(4 * n, ins=(x,))
    sq = g.op(4 * n, ins=(h,), saves=(h,))
    rs = g.op(4 * t * width // c.spec.head_dim, ins=(sq,), saves=(OUT,))
    n32 = g.op(4 * n, ins=(h, rs), saves=(h, rs))
    if c.spec.family in GEMMA_FAMILIES:
        pg = 0 if c.frozen_base else c.weight_elem_bytes * c.spec.head_dim
        return g.op(4 * n, ins=(n32,), saves=() if c.frozen_base else (n32,), pgrad=pg, ws_bwd=4 * n)
    normed = n32 if c.act_elem_bytes == 4 else g.op(c.act_elem_bytes * n, ins=(n32,))
    if c.frozen_base:  # the normalised tensor is kept only for the weight's gradient
        return g.op(max(c.act_elem_bytes, c.weight_elem_bytes) * n, ins=(normed,))
    return g.op(max(c.act_elem_bytes, c.weight_elem_bytes) * n, ins=(normed,), saves=(normed,), pgrad=c.weight_elem_bytes * c.spec.head_dim)


def sdpa_needs_mask(c: Ctx) -> bool:
    """SDPA runs with is_causal and no mask, except when a sliding window (Mistral, Mixtral, Qwen
    with use_sliding_window) is not longer than the sequence: transformers builds the mask once
    kv_length >= window (masking_utils._ignore_causal_mask_sdpa) and then passes repeat_kv'd keys
    and values (use_gqa_in_sdpa needs attention_mask is None)."""
    w = c.spec.sliding_window
    return w is not None and c.sliding and c.seq >= w


def gpt2_attention(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """GPT2Attention: fused c_attn, split into views, the KV cache copies k and v, attention,
    c_proj and the residual dropout (all inside the module, so selective checkpointing covers them)."""
    t, h = c.tokens, c.spec.hidden_size
    hh = h // c.tp
    qkv = linear(g, y, h, 3 * hh, c, bias=True, name="qkv")
    k, v, _ = kv_cache(g, qkv, qkv, t * hh, c.act_elem_bytes, c.act_elem_bytes, c)
    o = attention_core(g, qkv, k, v, c, c.act_elem_bytes, eager, 1, mask=eager)
    o = linear(g, o, hh, h, c, bias=True, name="o", x_bytes=c.act_elem_bytes)
    return dropout(g, o, t * h, c.act_elem_bytes * t * h, c.spec.hidden_dropout, c)


def neox_attention(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """GPTNeoXAttention: fused query_key_value, partial RoPE on q and k, cache, attention, dense."""
    t, h = c.tokens, c.spec.hidden_size
    hh = h // c.tp
    qkv = linear(g, y, h, 3 * hh, c, bias=True, name="qkv")
    qe = rope(g, qkv, hh, c)
    ke = rope(g, qkv, hh, c)
    ke, v, vb = kv_cache(g, ke, qkv, t * hh, c.rope_elem_bytes, c.act_elem_bytes, c)
    o = attention_core(g, qe, ke, v, c, c.rope_elem_bytes, eager, 1, mask=eager, q_bshd=False, v_bytes=vb)
    o = linear(g, o, hh, h, c, bias=True, name="o", x_bytes=c.act_elem_bytes)
    return dropout(g, o, t * h, c.act_elem_bytes * t * h, c.spec.hidden_dropout, c)


def attention_block(g: Graph, y: int, c: Ctx, eager: bool) -> int:
    """The family's attention module (what selective checkpointing wraps)."""
    if c.spec.family == "gpt2":
        return gpt2_attention(g, y, c, eager)
    if c.spec.family == "gpt_neox":
        return neox_attention(g, y, c, eager)
    return llama_attention(g, y, c, eager)

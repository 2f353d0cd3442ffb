"""The ops each transformers block runs, written for the autograd simulator (calc.sim.graph).

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves. Sizes are bytes for the tokens
this GPU processes (micro-batch x sequence, divided by tensor parallelism where the op is split).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from calc.contract.architectures import GEMMA_FAMILIES, ModelSpec
from calc.sim.graph import EXPERTS_ENTRY, OUT, Graph
from calc.sim.symbolic import fixed


@dataclass(frozen=True)
class Ctx:
    """Shapes and dtypes of one block as it runs on one GPU."""

    spec: ModelSpec
    batch: int
    seq: int
    weight_elem_bytes: int  # bytes per stored weight element (4 fp32/amp, 2 for 16-bit weights)
    act_elem_bytes: int  # bytes per activation element produced by matmuls (compute dtype)
    residual_elem_bytes: int  # bytes per residual-stream element (embedding output dtype: 4 under amp)
    amp: bool  # torch.autocast: casts matmul inputs and (cached) weights to 16-bit
    cuda: bool  # CUDA kernels (dropout masks are 1-byte bools) vs CPU (dtype-sized noise)
    tp: int = 1  # tensor-parallel degree: heads and MLP width are split
    sp: bool = False  # sequence parallel: norms/dropout/residual on S/tp tokens
    lora_rank: int = 0  # LoRA adapters on the listed projections
    lora_targets: frozenset[str] = frozenset()
    frozen_base: bool = False  # LoRA: base weights take no gradient
    adapter_bytes: int = 4  # LoRA adapter dtype: fp32 (peft's autocast_adapter_dtype) or 16-bit
    adapter_amp: bool = False  # LoRA under torch.autocast: fp32 adapters run their matmuls in 16-bit
    sliding: bool = True  # this layer attends through the spec's sliding window (Gemma 3's local layers)
    dense_mlp: bool = False  # a MoE model's dense layer (first_k_dense_replace)
    ep: int = 1  # expert parallelism: this rank runs num_experts / ep experts on tokens sent by all-to-all
    cast_expert_inputs: bool = False  # FSDP2 mixed precision on the experts' own group: float inputs cast to 16 bits
    use_cache: bool = True  # HF builds a DynamicCache in training unless gradient checkpointing is on
    train: bool = True  # model.train(): dropout active (eval/inference: every dropout is the identity)
    input_grad: bool = True  # the layer's input requires grad (not so for layer 0 on a frozen embedding)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @cached_property
    def shape_free(self) -> tuple:
        """Every field but batch and seq, the spec by identity (hashing a ModelSpec costs more than evaluating a
        block), as a key: whoever keeps it keeps the spec alive too, so that its id is not reused. Computed
        once per context (the cache is in the instance's __dict__, outside the dataclass fields)."""
        fields = self.__dict__.copy()
        del fields["batch"], fields["seq"]
        fields["spec"] = id(self.spec)
        return tuple(fields.values())

    def with_shape(self, batch: int, seq: int) -> Ctx:
        """This context for another batch shape: every other field as it is, and the shape-free key with them."""
        return self._copy(True, batch=batch, seq=seq)

    def with_kind(self, sliding: bool, dense_mlp: bool, input_grad: bool) -> Ctx:
        """This context for another kind of layer (calc.memory.engine.layer_ctxs); the shape-free key, which names these
        fields, is made again when asked."""
        return self._copy(False, sliding=sliding, dense_mlp=dense_mlp, input_grad=input_grad)

    def _copy(self, same_key: bool, **changed: object) -> Ctx:
        """This context with the `changed` fields, as dataclasses.replace makes it but without the frozen
        dataclass's __init__ (22 guarded assignments, and the key's copy again: a third of what a recorded block's
        evaluation costs); the shape-free key kept where `same_key` (no field of it changed)."""
        new = object.__new__(Ctx)
        fields = new.__dict__
        fields.update(self.__dict__)
        if not same_key:
            fields.pop("shape_free", None)
        fields.update(changed)
        return new

    @property
    def rope_elem_bytes(self) -> int:
        """RoPE output dtype: q/k (compute dtype) times cos/sin (residual dtype) promote."""
        return max(self.act_elem_bytes, self.residual_elem_bytes)


# ---- generic pieces ---------------------------------------------------------------------

def dropout(g: Graph, x: int, elems: int, nbytes: int, p: float, c: Ctx) -> int:
    """nn.functional.dropout in training. CUDA: fused native_dropout keeps a 1-byte bool mask;
    CPU: ATen's `_dropout` multiplies by a dtype-sized noise tensor, which the mul saves
    (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable)."""
    if p <= 0 or not c.train:
        return x
    if c.cuda:
        return g.op(nbytes, ins=(x,), saves=(g.op(elems, grad=False, name="dropout mask"),), name="dropout")
    noise = g.op(nbytes, grad=False, name="dropout noise")
    return g.op(nbytes, ins=(x, noise), saves=(noise,), grad_ins=(x,), name="dropout")


def linear(g: Graph, x: int, in_f: int, out_f: int, c: Ctx, bias: bool = False, name: str = "",
           tokens: int | None = None, x_bytes: int = 4) -> int:
    """nn.Linear: its node saves the input only when the weight needs a gradient (a frozen weight
    needs just itself for the input gradient). Under autocast the input is cast to 16-bit per call
    (not cached) and the fp32 weight once per forward (autocast's weight cache); the 16-bit copy
    is saved and its gradient converted back into the fp32 .grad. An input that is already 16-bit
    (x_bytes=2: an SDPA output, an MLP product) is used as it is."""
    t = c.tokens if tokens is None else tokens
    n_w = in_f * out_f + (out_f if bias else 0)
    if c.frozen_base:
        y = g.op(c.act_elem_bytes * t * out_f, ins=(x,), name=name)
    elif c.amp:
        xin = g.op(2 * t * in_f, ins=(x,), name=f"{name} autocast input") if x_bytes == 4 else x
        y = _autocast_matmul(g, xin, 2 * t * out_f, n_w, name)
    else:
        y = g.op(c.act_elem_bytes * t * out_f, ins=(x,), saves=(x,), pgrad=n_w * c.weight_elem_bytes, name=name)
    if c.lora_rank and name in c.lora_targets:
        y = lora_adapter(g, x, y, in_f, out_f, t, c, name)
    return y


def lora_adapter(g: Graph, x: int, y: int, in_f: int, out_f: int, t: int, c: Ctx, name: str) -> int:
    """peft LoRA Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, then cast back
    to the base result's dtype. x is first cast to the adapter dtype (`_cast_input_dtype`); under
    autocast the fp32 adapters' matmuls run in 16-bit on a further cast of x. A keeps its input,
    B keeps A's r-wide output (peft/tuners/lora/layer.py)."""
    r, ad = c.lora_rank, c.adapter_bytes
    xa = x if ad == c.act_elem_bytes else g.op(ad * t * in_f, ins=(x,), name=f"{name} lora input cast")
    if c.adapter_amp:
        xa = g.op(2 * t * in_f, ins=(xa,), name=f"{name} lora autocast input")
        la = _autocast_matmul(g, xa, 2 * t * r, r * in_f, f"{name} lora A")
        lb = _autocast_matmul(g, la, 2 * t * out_f, r * out_f, f"{name} lora B")
        mm = 2
    else:
        la = g.op(ad * t * r, ins=(xa,), saves=(xa,), pgrad=ad * r * in_f, name=f"{name} lora A")
        lb = g.op(ad * t * out_f, ins=(la,), saves=(la,), pgrad=ad * r * out_f, name=f"{name} lora B")
        mm = ad
    ls = g.op(mm * t * out_f, ins=(lb,), name=f"{name} lora scale")
    summed = g.op(max(mm, c.act_elem_bytes) * t * out_f, ins=(y, ls), name=f"{name} + lora")
    if max(mm, c.act_elem_bytes) != c.act_elem_bytes:
        summed = g.op(c.act_elem_bytes * t * out_f, ins=(summed,), name=f"{name} lora cast back")
    return summed


def _autocast_matmul(g: Graph, x: int, out_bytes: int, n_w: int, name: str) -> int:
    """An fp32 weight's matmul under autocast: the 16-bit weight copy (autocast's cache) and the
    16-bit input are saved; the copy's gradient is converted back into the fp32 .grad."""
    w16 = g.op(2 * n_w, pgrad=4 * n_w, name=f"{name} autocast weight copy")
    return g.op(out_bytes, ins=(x, w16), saves=(x, w16), name=name)


def rms_norm(g: Graph, x: int, x_bytes: int, c: Ctx, gemma: bool = False, tokens: int | None = None,
             width: int | None = None) -> tuple[int, int]:
    """LlamaRMSNorm: h = x.to(fp32); h * rsqrt(mean(h^2) + eps); weight * h.to(input dtype).
    Saves the fp32 input (the input itself when already fp32), the rsqrt and the normalised
    tensor; the weight-gradient reduction needs one full-size product in backward.
    Gemma2RMSNorm instead multiplies by (1 + weight) in fp32 and casts the result back.
    `width`: normalise another width than the hidden size (MLA's q / kv bottlenecks).
    Returns (output id, output bytes per element)."""
    t = c.tokens if tokens is None else tokens
    w = c.spec.hidden_size if width is None else width
    n = t * w
    h = x if x_bytes == 4 else g.op(4 * n, ins=(x,), name="norm to fp32")
    sq = g.op(4 * n, ins=(h,), saves=(h,), name="norm pow")
    var = g.op(4 * t, ins=(sq,), name="norm mean")
    ve = g.op(4 * t, ins=(var,), name="norm +eps")
    rs = g.op(4 * t, ins=(ve,), saves=(OUT,), name="norm rsqrt")
    n32 = g.op(4 * n, ins=(h, rs), saves=(h, rs), name="norm scale")
    if gemma:
        y32 = g.op(4 * n, ins=(n32,), saves=() if c.frozen_base else (n32,),
                   pgrad=0 if c.frozen_base else c.weight_elem_bytes * w, ws_bwd=4 * n, name="norm weight")
        if x_bytes == 4:
            return y32, 4
        return g.op(x_bytes * n, ins=(y32,), name="norm cast back"), x_bytes
    normed = n32 if x_bytes == 4 else g.op(x_bytes * n, ins=(n32,), name="norm cast back")
    wb = max(c.weight_elem_bytes, x_bytes)
    if c.frozen_base:  # weight * normed: the normed tensor is kept only for the weight's gradient
        y = g.op(wb * n, ins=(normed,), name="norm weight")
    else:
        y = g.op(wb * n, ins=(normed,), saves=(normed,), pgrad=c.weight_elem_bytes * w, ws_bwd=wb * n, name="norm weight")
    g.keep(n32)  # the local `hidden_states` (fp32 normalised) lives until forward returns
    return y, wb


def fp32_product_norm(c: Ctx) -> bool:
    """RMSNorms that multiply by their weight in fp32 and cast the product back (Gemma's (1 + w),
    gpt-oss's `(self.weight * hidden_states).to(input_dtype)`): the fp32 normalised tensor is kept."""
    return c.spec.family in GEMMA_FAMILIES or c.spec.family == "gpt_oss"


def layer_norm(g: Graph, x: int, x_bytes: int, c: Ctx, tokens: int | None = None) -> tuple[int, int]:
    """nn.LayerNorm (native_layer_norm): saves input, mean and rstd (one each per token: fp32
    on CUDA, the input dtype on CPU)."""
    t = c.tokens if tokens is None else tokens
    n = t * c.spec.hidden_size
    stats = g.op(2 * t * (4 if c.cuda else x_bytes), grad=False, name="layernorm mean+rstd")
    y = g.op(x_bytes * n, ins=(x,), saves=(x, stats), pgrad=0 if c.frozen_base else 2 * c.weight_elem_bytes * c.spec.hidden_size,
             name="layernorm")
    return y, x_bytes


def activation(g: Graph, x: int, elems: int, nbytes: int, act: str, c: Ctx) -> int:
    """The MLP non-linearity. silu / gelu (erf) / gelu_pytorch_tanh are single ATen ops that
    save their input. HF's `gelu_new` (NewGELUActivation) is written out in Python:
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), and autograd keeps x, x^3's input,
    the tanh output and the (1 + tanh) factor (transformers/activations.py)."""
    if act in ("gelu_new", "gelu_fast"):  # Python evaluates `0.5 * x` first and holds it
        hx = g.op(nbytes, ins=(x,), name="0.5 x")
        p3 = g.op(nbytes, ins=(x,), saves=(x,), name="x^3")
        m1 = g.op(nbytes, ins=(p3,), name="0.044715 x^3")
        s1 = g.op(nbytes, ins=(x, m1), name="x + ...")
        m2 = g.op(nbytes, ins=(s1,), name="* sqrt(2/pi)")
        th = g.op(nbytes, ins=(m2,), saves=(OUT,), name="tanh")
        one = g.op(nbytes, ins=(th,), name="1 + tanh")
        return g.op(nbytes, ins=(hx, one), saves=(hx, one), name="gelu_new")
    return g.op(nbytes, ins=(x,), saves=(x,), name=act)


# ---- attention ---------------------------------------------------------------------------

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
    per-row logsumexp (fp32, B x nh x S). HF passes enable_gqa=True when there is no mask
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
    scores = g.op(a * ss, ins=(q, k), saves=(q, k), name="q @ k^T")
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
    o = g.op(a * t * vw, ins=(probs, v), saves=(probs, v), name="probs @ v")
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
    scores = g.op(a * ss, ins=(q, k), saves=(q, k), name="q @ k^T")
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
    attention.cpp, convert_boolean_attn_mask / _cudnn. Measured on CPU; CUDA modelled from source
    (the memory-efficient path's pad of the last dim to a multiple of 8 when S is not one is not
    modelled)."""
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


# ---- MLPs --------------------------------------------------------------------------------

def gated_mlp(g: Graph, y: int, c: Ctx, tokens: int | None = None, width: int | None = None,
              prefix: str = "") -> int:
    """LlamaMLP: down(act(gate(x)) * up(x)); keeps gate, up, act(gate) and the product.
    `width`: another inner width (MoE shared experts, a MoE model's dense layers); `prefix`: the
    linears' names in ModelSpec.linear_layers ("shared_" for shared experts, which LoRA targets by name)."""
    s = c.spec
    t = c.tokens if tokens is None else tokens
    i = (s.intermediate_size if width is None else width) // c.tp
    h = s.hidden_size
    if s.family == "phi3":  # Phi3MLP: fused gate_up_proj, chunked into two views
        gate = up = linear(g, y, h, 2 * i, c, name=f"{prefix}gate_up", tokens=t)
        act = activation(g, gate, t * i, c.act_elem_bytes * t * i, s.hidden_act, c)
    else:  # Python order: gate_proj(x) -> act_fn -> up_proj(x) -> *
        gate = linear(g, y, h, i, c, bias=s.mlp_bias, name=f"{prefix}gate", tokens=t)
        act = activation(g, gate, t * i, c.act_elem_bytes * t * i, s.hidden_act, c)
        up = linear(g, y, h, i, c, bias=s.mlp_bias, name=f"{prefix}up", tokens=t)
    prod = g.op(c.act_elem_bytes * t * i, ins=(act, up), saves=(act, up), name="act * up")
    out = linear(g, prod, i, h, c, bias=s.mlp_bias, name=f"{prefix}down", tokens=t, x_bytes=c.act_elem_bytes)
    g.keep(y)  # forward(self, x): x stays referenced until the MLP returns
    return out


def plain_mlp(g: Graph, y: int, c: Ctx) -> int:
    """GPT-2 / GPT-NeoX MLP: fc_out(act(fc_in(x)))."""
    s = c.spec
    t = c.tokens
    i = s.intermediate_size // c.tp
    h = s.hidden_size
    up = linear(g, y, h, i, c, bias=True, name="up")
    act = activation(g, up, t * i, c.act_elem_bytes * t * i, s.hidden_act, c)
    out = linear(g, act, i, h, c, bias=True, name="down", x_bytes=c.act_elem_bytes)
    g.keep(y)  # the MLP's argument lives until it returns
    return out


def moe_mlp(g: Graph, y: int, c: Ctx) -> int:
    """MixtralSparseMoeBlock with transformers' default grouped_mm experts: router linear (H x E),
    fp32 softmax and top-k; the (token, expert) rows are sorted by expert and gathered
    (rows = tokens x top_k), run through one grouped gate_up matmul on the 3-D weight, act(gate) *
    up, a grouped down matmul, scaled by the routing weights, un-permuted and summed over top_k
    (transformers/integrations/moe.py, grouped_mm_experts_forward). The grouped matmuls produce the
    3-D weight gradients directly. The grouped matmul is not an autocast op, so under autocast the
    experts run in the (fp32) dtype of the normalised input. The block's argument and locals, the router logits
    (`_`) and the top-k indices, live until it returns."""
    s = c.spec
    t = c.tokens
    k = s.experts_per_token
    h, e = s.hidden_size, s.num_experts
    wb = 4
    logits = None
    if s.router_groups or s.router_fp32_softmax:
        weights, wb, logits = fp32_router(g, y, c)
    elif s.expert_bias:  # GptOssTopKRouter: linear + bias, top-k of the logits, softmax over the k
        logits = linear(g, y, h, e, c, bias=True, name="router")
        ti = g.op(8 * t * k, grad=False, name="router top-k indices")
        topv = g.op(c.act_elem_bytes * t * k, ins=(logits, ti), saves=(ti,), grad_ins=(logits,), name="router top-k")
        weights = g.op(c.act_elem_bytes * t * k, ins=(topv,), saves=(OUT,), name="router softmax over top-k")
        wb = c.act_elem_bytes
        g.held.append(weights)  # returned as router_scores: the layer's `_` holds them until it returns
    else:
        logits = linear(g, y, h, e, c, name="router")
        probs = g.op(4 * t * e, ins=(logits,), saves=(OUT,), name="router softmax")
        topw = g.op(4 * t * k, ins=(probs,), saves=(OUT,), name="router top-k")
        g.op(8 * t * k, grad=False, name="top-k indices")
        weights = g.op(4 * t * k, ins=(topw,), name="router renorm") if s.router_renorm else topw
    idx = g.op(8 * t * k, grad=False, name="top-k indices (kept)")
    if s.family == "qwen3_moe" and c.act_elem_bytes != 4:  # Qwen3MoeTopKRouter: .to(router_logits.dtype)
        weights, wb = g.op(c.act_elem_bytes * t * k, ins=(weights,), name="routing weights to compute dtype"), c.act_elem_bytes
    if c.ep > 1:
        out = _all_to_all_experts(g, y, weights, wb, idx, c)
    else:
        out = _grouped_experts(g, y, weights, wb, idx, c, tokens=t, top_k=k, experts=e, out_elem=c.residual_elem_bytes)
    if s.shared_experts:  # DeepSeek-V3 / GLM-4.5 MoE: experts(x) + shared_experts(x)
        shared = gated_mlp(g, y, c, width=s.shared_experts * s.intermediate_size, prefix="shared_")
        out = g.op(c.residual_elem_bytes * t * h, ins=(out, shared), name="+ shared experts")
    # the block's argument, and the router's outputs it unpacks (gpt-oss's indices are `ti` above)
    g.keep(y, *(() if s.expert_bias else (idx,) if logits is None else (logits, idx)))
    return out


def _grouped_experts(g: Graph, y: int, weights: int, wb: int, idx: int, c: Ctx, tokens: int, top_k: int,
                     experts: int, out_elem: int, expert_parallel: bool = False) -> int:
    """transformers' grouped_mm_experts_forward on `tokens` rows of `y` with `top_k` (expert id, weight) pairs
    each over `experts` experts (transformers/integrations/moe.py). Under expert parallelism
    (`_is_expert_parallel`) the experts run top-1 with unit weights that take no gradient, and the outputs of
    both grouped matmuls are copied by `masked_fill(sentinel_mask, 0.0)` (rows routed to no local expert)."""
    s = c.spec
    rows = tokens * top_k
    h, i, e = s.hidden_size, s.intermediate_size // c.tp, experts
    weights_grad = not expert_parallel
    perm = g.op(16 * rows, ins=(idx,), grad=False, name="sort expert ids")
    xa = 4 if c.amp else c.act_elem_bytes  # dtype the experts compute in
    token_of_row = g.op(8 * rows, ins=(perm,), grad=False, name="perm // top_k")
    # an index's backward scatters into zeros the size of its source, then index_put copies them (index_backward)
    gathered = g.op(xa * rows * h, ins=(y, token_of_row), saves=(token_of_row,), grad_ins=(y,),
                    ws_bwd=g.sizes[y], name="gather rows")
    wsorted = g.op(wb * rows, ins=(weights, perm), saves=(perm,), grad_ins=(weights,) if weights_grad else (),
                   grad=weights_grad, name="routing weights sorted")
    # histc's 4-byte copy of the sorted ids (float on the CPU, int32 on CUDA), the counts and the int32 offsets
    counts = g.op(4 * rows + 8 * e, ins=(perm,), grad=False, name="expert counts (histc, cumsum)")
    sentinel = g.op(rows, ins=(perm,), grad=False, name="sentinel mask") if expert_parallel else None
    pg = 0 if c.frozen_base else c.weight_elem_bytes
    keep_in = not c.frozen_base  # a grouped matmul keeps its input only for the weight's gradient
    gu_bias = _expert_bias_rows(g, perm, xa * rows * 2 * i, pg * 2 * i * e, "gate_up") if s.expert_bias else None
    gu = g.op(xa * rows * 2 * i, ins=(gathered,), saves=(gathered,) if keep_in else (), pgrad=pg * 2 * i * h * e,
              name="experts gate_up (grouped)")
    if sentinel is not None:
        gu = g.op(xa * rows * 2 * i, ins=(gu, sentinel), saves=(sentinel,), grad_ins=(gu,), name="mask sentinel rows")
    if gu_bias is not None:
        g.keep(gu_bias)  # out.add_(bias): in place on the grouped matmul's output
        prod = _clamped_swiglu(g, gu, xa * rows * i)
        down_bias = _expert_bias_rows(g, perm, xa * rows * h, pg * h * e, "down")
        g.keep(gu_bias)  # `selected_biases` is rebound to the down rows: the gate_up rows die here
        g.held.append(down_bias)  # a local of the experts forward until it returns
    else:
        act = activation(g, gu, rows * i, xa * rows * i, s.hidden_act, c)  # gate is a view of gu
        prod = g.op(xa * rows * i, ins=(act, gu), saves=(act, gu), name="act * up")
    g.keep(gu)  # `proj_out` holds the gate_up output until the gating returns and it is rebound
    down = g.op(xa * rows * h, ins=(prod,), saves=(prod,) if keep_in else (), pgrad=pg * i * h * e,
                name="experts down (grouped)")
    if sentinel is not None:
        down = g.op(xa * rows * h, ins=(down, sentinel), saves=(sentinel,), grad_ins=(down,),
                    name="mask sentinel rows")
    pb = max(xa, wb)  # tensor-tensor type promotion: fp32 routing weights make the weighted rows fp32
    scaled = g.op(pb * rows * h, ins=(down, wsorted), saves=(down, wsorted) if weights_grad else (wsorted,),
                  name="* routing weight")
    inv = g.op(8 * rows, ins=(perm,), grad=False, name="inverse permutation")
    unperm = g.op(pb * rows * h, ins=(scaled, inv), saves=(inv,), grad_ins=(scaled,), ws_bwd=g.sizes[scaled],
                  name="un-permute")
    # locals of the experts forward live until it returns (`proj_out` is the down projection's last rebinding)
    g.keep(y, gathered, wsorted, idx, perm, counts, down)
    summed = g.op(pb * tokens * h, ins=(unperm,), name="sum over top-k")
    # `.to(hidden_states.dtype)` copies only when the dtype differs
    return summed if pb == out_elem else g.op(out_elem * tokens * h, ins=(summed,), name="to the hidden dtype")


def _all_to_all_experts(g: Graph, y: int, weights: int, wb: int, idx: int, c: Ctx) -> int:
    """transformers' expert parallelism (DistributedConfig(ep_size=...), AllToAllEP in
    transformers/distributed/expert_parallel.py): the (token, expert) pairs are sorted by expert, sent to the
    experts' ranks with an all-to-all, run top-1 through this rank's num_experts / ep experts and sent back with a
    second all-to-all, restored to (token, slot) order, weighted and summed. Under FSDP2 mixed precision the
    experts module is an FSDP group of its own, whose pre-forward casts its float inputs, the routing weights
    among them, to the 16-bit param dtype (MixedPrecisionPolicy.cast_forward_inputs). Balanced routing: every rank
    receives as many rows as it sends, tokens x top_k (the actual split follows the trained router)."""
    s = c.spec
    t, k, h = c.tokens, s.experts_per_token, s.hidden_size
    rows = t * k
    xa = 4 if c.amp else c.act_elem_bytes
    if c.cast_expert_inputs and wb != c.act_elem_bytes:  # MixedPrecisionPolicy(cast_forward_inputs=True) on the experts module
        weights, wb = g.op(c.act_elem_bytes * t * k, ins=(weights,), name="FSDP casts the routing weights"), c.act_elem_bytes
    order = g.op(8 * rows, ins=(idx,), grad=False, name="argsort expert ids")
    token_of_row = g.op(8 * rows, ins=(order,), grad=False, name="order // top_k")
    send = g.op(xa * rows * h, ins=(y, token_of_row), saves=(token_of_row,), grad_ins=(y,), ws_bwd=g.sizes[y],
                name=EXPERTS_ENTRY)
    recv = g.op(xa * rows * h, ins=(send,), name="all-to-all dispatch")
    local_ids = g.op(8 * rows, grad=False, name="received rows' local expert ids")
    ones = g.op(xa * rows, grad=False, name="unit routing weights")
    g.keep(send)  # a local of _dispatch_tokens until it returns
    expert_out = _grouped_experts(g, recv, ones, xa, local_ids, c, tokens=rows, top_k=1, experts=s.num_experts // c.ep,
                                  out_elem=xa, expert_parallel=True)
    back = g.op(xa * rows * h, ins=(expert_out,), name="all-to-all combine")
    placed = g.op(xa * rows * h, ins=(back, order), saves=(order,), grad_ins=(back,), name="restore (token, slot) order")
    wbytes = max(xa, wb)  # tensor-tensor type promotion
    weighted = g.op(wbytes * rows * h, ins=(placed, weights), saves=(placed, weights), name="* routing weights")
    out = g.op(wbytes * t * h, ins=(weighted,), name="sum over top-k")
    g.keep(back)  # recv_out: a local of _combine_tokens until it returns
    g.keep(recv, local_ids, ones, expert_out, idx)  # locals and arguments of AllToAllEP.__call__ until it returns
    return out if wbytes == c.residual_elem_bytes else g.op(c.residual_elem_bytes * t * h, ins=(out,), name="to the hidden dtype")


def llama4_moe(g: Graph, y: int, c: Ctx) -> int:
    """Llama4TextMoe: no dispatch. The router (an nn.Linear) gives T x E logits; top-k of them is
    scattered into a -inf tensor, sigmoid in fp32 and cast back: the scores. Every token is repeated
    once per expert (E x T x H) and multiplied by its score (the mul keeps both), the experts run as two
    bmm on the 3-D weights over all E x T rows (gate_up and the product kept), the E outputs are summed
    and added in place to the shared expert's output (modeling_llama4.py). Under autocast the repeat and
    the scaling run in the fp32 input's dtype and bmm casts its input and the weights to 16-bit."""
    s = c.spec
    t, h, e, k = c.tokens, s.hidden_size, s.num_experts, s.experts_per_token
    i = s.intermediate_size // c.tp
    rows = e * t
    a = c.act_elem_bytes
    xb = 4 if c.amp else a  # the normalised input's dtype: fp32 residual stream under autocast
    logits = linear(g, y, h, e, c, name="router", x_bytes=xb)
    idx = g.op(8 * t * k, ins=(logits,), grad=False, name="router top-k indices")
    top = g.op(a * t * k, ins=(logits, idx), saves=(idx,), grad_ins=(logits,), name="router top-k values")
    full = g.op(a * t * e, ins=(top, idx), saves=(idx,), grad_ins=(top,), name="full(-inf).scatter_(top-k)")
    f32 = full if a == 4 else g.op(4 * t * e, ins=(full,), name="scores to fp32")
    sig = g.op(4 * t * e, ins=(f32,), saves=(OUT,), name="sigmoid")
    scores = sig if a == 4 else g.op(a * t * e, ins=(sig,), name="scores to dtype")
    g.held.append(logits)  # returned as router_logits: the layer's `_` holds them until it returns
    rep = g.op(xb * rows * h, ins=(y,), name="hidden_states.repeat(E, 1)")
    col = g.op(a * rows, ins=(scores,), name="scores.T.reshape(-1, 1)")
    routed = g.op(max(xb, a) * rows * h, ins=(rep, col), saves=(rep, col), name="routed_in * scores")
    pg = 0 if c.frozen_base else c.weight_elem_bytes
    if c.amp:  # bmm under autocast: a 16-bit copy of the input and of each (cached) expert weight
        gu = _autocast_bmm(g, g.op(2 * rows * h, ins=(routed,), name="autocast routed_in"), 2 * rows * 2 * i,
                           e * h * 2 * i, c, "experts gate_up")
    else:
        # bmm keeps its input only for the weight's gradient (a frozen base keeps just the weight)
        gu = g.op(a * rows * 2 * i, ins=(routed,), saves=() if c.frozen_base else (routed,), pgrad=pg * e * h * 2 * i,
                  name="experts gate_up (bmm)")
    mb = 2 if c.amp else a
    act = activation(g, gu, rows * i, mb * rows * i, s.hidden_act, c)  # gate is a view of gate_up
    prod = g.op(mb * rows * i, ins=(act, gu), saves=(act, gu), name="up * act(gate)")
    if c.amp:
        down = _autocast_bmm(g, prod, 2 * rows * h, e * i * h, c, "experts down")
    else:
        down = g.op(a * rows * h, ins=(prod,), saves=() if c.frozen_base else (prod,), pgrad=pg * e * i * h,
                    name="experts down (bmm)")
    shared = gated_mlp(g, y, c, width=s.shared_experts * s.intermediate_size, prefix="shared_")
    summed = g.op(mb * t * h, ins=(down,), name="sum over experts")
    g.keep(y, rep, routed, scores)  # the forward's locals live until it returns
    # out.add_(summed) writes into the shared expert's output; written as a new tensor that replaces it
    # (one T x H more for the moment both exist)
    return g.op(mb * t * h, ins=(shared, summed), name="shared + routed (add_)")


def _autocast_bmm(g: Graph, x16: int, out_bytes: int, n_w: int, c: Ctx, name: str) -> int:
    """torch.bmm under autocast on a 3-D fp32 parameter: the 16-bit weight copy (autocast's cache) and
    the 16-bit input are saved; the weight's gradient lands in the fp32 .grad."""
    w16 = g.op(2 * n_w, pgrad=0 if c.frozen_base else 4 * n_w, name=f"{name} autocast weight copy")
    return g.op(out_bytes, ins=(x16, w16), saves=(w16,) if c.frozen_base else (x16, w16), name=name)


def _expert_bias_rows(g: Graph, perm: int, nbytes: int, pgrad: int, name: str) -> int:
    """gpt-oss grouped experts: `selected_biases = bias[expert_ids_g]` gathers one bias row per
    routed row (the index is kept for the bias gradient) before the grouped matmul, which then adds
    it in place (`out.add_(bias)`, transformers/integrations/moe.py, _grouped_linear)."""
    return g.op(nbytes, ins=(perm,), saves=(perm,), grad_ins=(), pgrad=pgrad, name=f"{name} bias rows")


def _clamped_swiglu(g: Graph, gu: int, nbytes: int) -> int:
    """GptOssExperts._apply_gate on the interleaved gate/up columns: gate.clamp(max=limit),
    up.clamp(-limit, limit) (both keep their input, a view of gate_up), glu = gate * sigmoid(gate *
    alpha), (up + 1) * glu."""
    gate = g.op(nbytes, ins=(gu,), saves=(gu,), name="gate clamp")
    up = g.op(nbytes, ins=(gu,), saves=(gu,), name="up clamp")
    scaled = g.op(nbytes, ins=(gate,), name="gate * alpha")
    sig = g.op(nbytes, ins=(scaled,), saves=(OUT,), name="sigmoid")
    glu = g.op(nbytes, ins=(gate, sig), saves=(gate, sig), name="gate * sigmoid")
    up1 = g.op(nbytes, ins=(up,), name="up + 1")
    out = g.op(nbytes, ins=(up1, glu), saves=(up1, glu), name="(up + 1) * glu")
    g.keep(gate, up)  # the `gate` and `up` locals live until _apply_gate returns
    return out


def fp32_router(g: Graph, y: int, c: Ctx) -> tuple[int, int, int]:
    """DeepSeek-V3 / GLM-4.5 TopkRouter: an fp32 linear on fp32 copies of the input and the weight
    (F.linear keeps both), sigmoid scores (kept), + the correction bias, group-limited top-k on
    detached scores, gather the chosen scores (keeps the indices), renormalise and scale
    (modeling_glm4_moe.Glm4MoeTopkRouter). DeepSeek-V2's: the same fp32 linear, a softmax (kept),
    top-k of it and the scaling (modeling_deepseek_v2.DeepseekV2TopkRouter, greedy). Under autocast
    the linear runs in 16-bit. Returns the top-k weights, their element bytes and the router logits."""
    s = c.spec
    t, h, e, k, grp = c.tokens, s.hidden_size, s.num_experts, s.experts_per_token, s.router_groups
    pg = 0 if c.frozen_base else c.weight_elem_bytes * e * h
    if c.amp:  # autocast casts F.linear's fp32 operands back to 16-bit: the scores are 16-bit too
        sb = 2
        xin = g.op(2 * t * h, ins=(y,), name="router autocast input")
        win = g.op(2 * e * h, pgrad=pg, name="router autocast weight copy")
    else:  # .type(float32): copies unless already fp32 (a parameter needs no copy)
        sb = 4
        xin = y if c.act_elem_bytes == 4 else g.op(4 * t * h, ins=(y,), name="router input to fp32")
        win = g.op(4 * e * h, pgrad=pg, name="router weight to fp32") if c.weight_elem_bytes != 4 else g.op(0, pgrad=pg)
    # the input is kept only for the weight's gradient (a frozen base keeps the weight copy alone)
    logits = g.op(sb * t * e, ins=(xin, win), saves=(win,) if c.frozen_base else (xin, win), name="router linear")
    if s.router_fp32_softmax:  # softmax(dim=-1, dtype=float32) -> top-k -> * routed_scaling_factor
        probs = g.op(4 * t * e, ins=(logits,), saves=(OUT,), name="router softmax")
        topw = g.op(4 * t * k, ins=(probs,), name="router top-k")
        g.op(8 * t * k, ins=(probs,), grad=False, name="top-k indices")
        return g.op(4 * t * k, ins=(topw,), name="* routed_scaling_factor"), 4, logits
    scores = g.op(sb * t * e, ins=(logits,), saves=(OUT,), name="sigmoid")
    choice = g.op(4 * t * e, ins=(scores,), grad=False, name="+ correction bias")
    top2 = g.op(12 * t * grp * 2, ins=(choice,), grad=False, name="group top-2")
    gs = g.op(4 * t * grp, ins=(top2,), grad=False, name="group scores")
    gi = g.op(12 * t * grp, ins=(gs,), grad=False, name="group top-k")
    gm = g.op(4 * t * grp, ins=(gi,), grad=False, name="group mask")
    sm = g.op(4 * t * e, ins=(gm,), grad=False, name="score mask")
    nb = g.op(t * e, ins=(sm,), grad=False, name="~mask.bool()")
    masked = g.op(4 * t * e, ins=(choice, nb), grad=False, name="masked_fill -inf")
    idx = g.op(12 * t * k, ins=(masked,), grad=False, name="top-k")
    picked = g.op(sb * t * k, ins=(scores, idx), saves=(idx,), grad_ins=(scores,), name="gather scores")
    if s.router_renorm:
        den = g.op(sb * t, ins=(picked,), name="sum + eps")
        picked = g.op(sb * t * k, ins=(picked, den), saves=(den, OUT), name="/= denominator")
    return g.op(sb * t * k, ins=(picked,), name="* routed_scaling_factor"), sb, logits


# ---- whole blocks ------------------------------------------------------------------------

def decoder_layer(c: Ctx, eager: bool) -> Graph:
    """One decoder layer of the family, input = the residual stream. With Megatron-style
    sequence parallelism the norms, dropouts and residual adds run on S / tp tokens; an all-gather
    before attention and the MLP and a reduce-scatter after them connect to the tensor-parallel
    parts (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2)."""
    fam = c.spec.family
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
    mid = g.op(c.residual_elem_bytes * ts * h, ins=(0, att), name="residual add")
    y2, yb2 = rms_norm(g, mid, c.residual_elem_bytes, c, gemma=fp32_product_norm(c), tokens=ts)
    y2 = _sp_gather(g, y2, yb2, c)
    if c.dense_mlp:
        m = gated_mlp(g, y2, c, width=c.spec.dense_intermediate_size)
    elif fam == "llama4_text":
        m = llama4_moe(g, y2, c)
    else:
        m = moe_mlp(g, y2, c) if c.spec.num_experts > 1 else gated_mlp(g, y2, c)
    m = _sp_scatter(g, m, c)
    if gemma:
        m, _ = rms_norm(g, m, c.act_elem_bytes, c, gemma=True, tokens=ts)
    m = dropout(g, m, ts * h, c.act_elem_bytes * ts * h, drop, c)
    g.op(c.residual_elem_bytes * ts * h, ins=(mid, m, *g.held), grad_ins=(mid, m), name="residual add")
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
    mid = g.op(c.residual_elem_bytes * t * h, ins=(0, o), name="residual add")
    y2, _ = layer_norm(g, mid, c.residual_elem_bytes, c)
    m = plain_mlp(g, y2, c)
    m = dropout(g, m, t * h, c.act_elem_bytes * t * h, s.hidden_dropout, c)
    g.op(c.residual_elem_bytes * t * h, ins=(mid, m), name="residual add")
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
        s1 = g.op(c.residual_elem_bytes * t * h, ins=(m, o), name="mlp + attn")
        g.op(c.residual_elem_bytes * t * h, ins=(s1, 0), name="residual add")
        g.keep(0, *g.cached)
        return g
    mid = g.op(c.residual_elem_bytes * t * h, ins=(0, o), name="residual add")
    y2, _ = layer_norm(g, mid, c.residual_elem_bytes, c)
    m = plain_mlp(g, y2, c)
    g.op(c.residual_elem_bytes * t * h, ins=(mid, m), name="residual add")
    g.keep(0, *g.cached)
    return g


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


def embedding_block(c: Ctx) -> Graph:
    """Token embedding (+ GPT-2's learned positions, + Gemma's sqrt(H) scaling, + embedding
    dropout). nn.Embedding saves only the indices (the persistent input_ids); its backward
    (embedding_dense_backward) materialises a dense V x H gradient in the weight's dtype. A tied
    lm_head has already produced its V x H contribution, which waits in the autograd InputBuffer;
    the buffer sums the two out of place (aten.add, seen with a dispatch-mode trace), so three
    V x H tensors are briefly alive before the sum becomes .grad."""
    s = c.spec
    t, h = c.tokens, s.hidden_size
    g = Graph(input_bytes=0, input_requires_grad=False, round_to=512 if c.cuda else 1)
    emb_grad = 0 if c.frozen_base else s.vocab_size * h * (4 if c.amp else c.weight_elem_bytes)
    x = g.op(c.residual_elem_bytes * t * h, pgrad=0 if s.tie_word_embeddings else emb_grad,
             ws_bwd=2 * emb_grad if s.tie_word_embeddings else 0, name="embed_tokens")
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
    gw = 0 if c.frozen_base else (4 if c.amp else c.weight_elem_bytes) * v * h
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

"""The generic ops of a transformers block, written for the autograd simulator (calc.sim.graph): dropout, nn.Linear
(with autocast and LoRA adapters), RMSNorm, LayerNorm and the MLP activations.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves.
"""

from __future__ import annotations

from calc.contract.model_spec import GEMMA_FAMILIES
from calc.contract.quantized import torchao_nf4_dequant_bytes, torchtune_nf4
from calc.sim.context import Ctx
from calc.sim.graph import OUT, Graph


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


UNQUANTIZED_LINEARS = frozenset({"lm_head", "router"})  # left out by transformers' replace_with_bnb_linear


def product_saves(g: Graph, a: int, b: int) -> tuple[int, ...]:
    """What a product of two tensors (mul, matmul) saves: each factor only for the other's gradient
    (torch/csrc/autograd derivatives.yaml, mul / mm: `other` if self requires grad, `self` if other does). Under
    LoRA without checkpointing the first layer reads an input that requires no grad, so a product of a frozen
    path and an adapted one keeps one factor."""
    return tuple(x for x, other in ((b, a), (a, b)) if g.needs_grad[other])


def linear(g: Graph, x: int, in_f: int, out_f: int, c: Ctx, bias: bool = False, name: str = "",
           tokens: int | None = None, x_bytes: int = 4) -> int:
    """nn.Linear: its node saves the input only when the weight needs a gradient (a frozen weight
    needs just itself for the input gradient). Under autocast the input is cast to 16-bit per call
    (not cached) and the fp32 weight once per forward (autocast's weight cache); the 16-bit copy
    is saved and its gradient converted back into the fp32 .grad. An input that is already 16-bit
    (x_bytes=2: an SDPA output, an MLP product) is used as it is."""
    t = c.tokens if tokens is None else tokens
    n_w = in_f * out_f + (out_f if bias else 0)
    if not c.trains(name) and c.quantized_base and c.framework == "torchtune" and name not in UNQUANTIZED_LINEARS \
            and torchtune_nf4(c.spec.family, name, c.lora_targets):
        y = _torchao_nf4_linear(g, x, in_f, out_f, t, c, name, bias)
    elif not c.trains(name):
        y = _frozen_linear(g, x, in_f, out_f, t, c, name)
    elif c.amp:
        xin = g.op(2 * t * in_f, ins=(x,), name=f"{name} autocast input") if x_bytes == 4 else x
        y = _autocast_matmul(g, xin, 2 * t * out_f, n_w, name)
    else:
        y = g.op(c.act_elem_bytes * t * out_f, ins=(x,), saves=(x,), pgrad=n_w * c.weight_elem_bytes, name=name)
    if c.lora_rank and name in c.lora_targets:
        y = lora_adapter(g, x, y, in_f, out_f, t, c, name)
    return y


def _frozen_linear(g: Graph, x: int, in_f: int, out_f: int, t: int, c: Ctx, name: str) -> int:
    """A frozen base linear. A bitsandbytes one (every decoder linear; lm_head and routers stay nn.Linear /
    nn.Parameter, calc.contract.quantized) dequantizes its weight to the input dtype for each matmul that needs
    it: 4-bit in forward and backward (bitsandbytes/autograd/_functions.py MatMul4Bit: dequantize_4bit), int8 in
    backward (MatMul8bitLt.backward: CB.to(dtype_A, copy=True)); MatMul8bitLt also keeps its input for
    backward (ctx.tensors = (CAt, subA, A)), which a frozen nn.Linear does not."""
    # torchtune's QLoRA linears are torchao's (_torchao_nf4_linear); its others stay 16-bit nn.Linear (lora_qwen2)
    quant = c.quantized_base if name not in UNQUANTIZED_LINEARS and c.framework != "torchtune" else ""
    dequantized = dequantized_weight_bytes(c, in_f, out_f) if quant else 0
    return g.op(c.act_elem_bytes * t * out_f, ins=(x,), saves=(x,) if quant == "int8" else (),
                ws_fwd=dequantized if quant in ("nf4", "fp4") else 0, ws_bwd=dequantized, name=name)


def _torchao_nf4_linear(g: Graph, x: int, in_f: int, out_f: int, t: int, c: Ctx, name: str, bias: bool) -> int:
    """torchtune's QLoRA linear (LoRALinear with quantize_base, FrozenNF4Linear): torchao's linear_nf4, whose
    LinearNF4 saves only the NF4 weight. Forward F.linear(input, weight.to(input.dtype)) and backward
    grad_output @ weight.to(grad_output.dtype) each dequantize the whole weight: get_original_weight's peak before
    the matmul's result exists, then the 16-bit weight beside it. A bias is added after (`out + self.bias`)."""
    n = in_f * out_f
    peak, weight16 = torchao_nf4_dequant_bytes(n, c.act_elem_bytes), c.act_elem_bytes * n
    out_b, in_b = c.act_elem_bytes * t * out_f, c.act_elem_bytes * t * in_f
    y = g.op(out_b, ins=(x,), ws_fwd=max(peak - out_b, weight16), ws_bwd=max(peak - in_b, weight16), name=name,
             packs=True)  # LinearNF4 saves the weight: packed when its forward returns
    return g.op(out_b, ins=(y,), name=f"{name} + bias", passes="add") if bias else y


def dequantized_weight_bytes(c: Ctx, in_f: int, out_f: int) -> int:
    """The 16-bit weight a bitsandbytes layer dequantizes for one matmul (to the input's dtype), alive while it
    runs: every 4-bit matmul forward and backward, an int8 one in backward."""
    return c.act_elem_bytes * in_f * out_f


def lora_adapter(g: Graph, x: int, y: int, in_f: int, out_f: int, t: int, c: Ctx, name: str) -> int:
    """peft LoRA Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, then cast back
    to the base result's dtype. x is first cast to the adapter dtype (`_cast_input_dtype`); under
    autocast the fp32 adapters' matmuls run in 16-bit on a further cast of x. A keeps its input,
    B keeps A's r-wide output (peft/tuners/lora/layer.py). With lora_dropout > 0 each adapted module has its own
    nn.Dropout on the cast input: the dropped input is a new tensor, which A keeps, beside the dropout's mask
    (CUDA) or noise (CPU), as `dropout` models them."""
    r, ad = c.lora_rank, c.adapter_bytes
    xa = x if ad == c.act_elem_bytes else g.op(ad * t * in_f, ins=(x,), name=f"{name} lora input cast")
    xa = dropout(g, xa, t * in_f, ad * t * in_f, c.lora_dropout, c)
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
    summed = g.op(max(mm, c.act_elem_bytes) * t * out_f, ins=(y, ls), name=f"{name} + lora", passes="add")
    if max(mm, c.act_elem_bytes) != c.act_elem_bytes:
        summed = g.op(c.act_elem_bytes * t * out_f, ins=(summed,), name=f"{name} lora cast back")
    return summed


def _autocast_matmul(g: Graph, x: int, out_bytes: int, n_w: int, name: str) -> int:
    """An fp32 weight's matmul under autocast: the 16-bit weight copy (autocast's cache) and the
    16-bit input are saved; the copy's gradient is converted back into the fp32 .grad."""
    w16 = g.op(2 * n_w, pgrad=4 * n_w, name=f"{name} autocast weight copy")
    return g.op(out_bytes, ins=(x, w16), saves=(x, w16), name=name)


def rms_normalise(g: Graph, x: int, x_bytes: int, t: int, w: int) -> tuple[int, int, int]:
    """The fp32 core every RMSNorm here shares (transformers', LitGPT's): x in fp32 (the input itself when
    already fp32), its square's mean + eps, rsqrt (saved as its output), x * rsqrt (saves both). Returns the ids of
    the fp32 input, the rsqrt and the normalised tensor."""
    n = t * w
    h = x if x_bytes == 4 else g.op(4 * n, ins=(x,), name="norm to fp32")
    sq = g.op(4 * n, ins=(h,), saves=(h,), name="norm pow")
    var = g.op(4 * t, ins=(sq,), name="norm mean")
    ve = g.op(4 * t, ins=(var,), name="norm +eps")
    rs = g.op(4 * t, ins=(ve,), saves=(OUT,), name="norm rsqrt")
    return h, rs, g.op(4 * n, ins=(h, rs), saves=(h, rs), name="norm scale")


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
    h, rs, n32 = rms_normalise(g, x, x_bytes, t, w)
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

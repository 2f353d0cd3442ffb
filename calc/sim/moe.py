"""The mixture-of-experts MLPs of transformers' families, written for the autograd simulator (calc.sim.graph):
routers (softmax, sigmoid group-limited, gpt-oss's, fp32), the grouped experts, expert parallelism's all-to-all,
and Llama 4's dense-routed experts.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves.
"""

from __future__ import annotations

from calc.sim.context import Ctx
from calc.sim.graph import EXPERTS_ENTRY, OUT, Graph
from calc.sim.mlp import gated_mlp
from calc.sim.ops import activation, linear


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
        out = g.op(c.residual_elem_bytes * t * h, ins=(out, shared), name="+ shared experts", passes="add")
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
    summed = g.op(pb * tokens * h, ins=(unperm,), name="sum over top-k", passes="expand")
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
    out = g.op(wbytes * t * h, ins=(weighted,), name="sum over top-k", passes="expand")
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
    return g.op(mb * t * h, ins=(shared, summed), name="shared + routed (add_)", passes="add")


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

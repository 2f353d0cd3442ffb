"""The dense MLPs of transformers' families, written for the autograd simulator (calc.sim.graph): the gated
(Llama) MLP and the plain (GPT-2, GPT-NeoX) one.

Each builder mirrors the transformers 5.x source of its family op by op (file and class named in
the docstring) and states which tensors each autograd node saves.
"""

from __future__ import annotations

from calc.sim.context import Ctx
from calc.sim.graph import Graph
from calc.sim.ops import activation, linear, product_saves


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
    prod = g.op(c.act_elem_bytes * t * i, ins=(act, up), saves=product_saves(g, act, up), name="act * up")
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

"""A checkpointed block's recompute (calc.sim.graph): where non-reentrant checkpointing stops it, and which
gradients autograd has already made when it starts. Both measured with torchtune's checkpointed QLoRA on the CPU
(data/measured_torchtune.jsonl, tt-qlora-*-ckpt*), where the recompute's dequantized weights make it the peak."""

from __future__ import annotations

from calc.sim.graph import Graph


def _lora_tail(custom_function: bool) -> Graph:
    """x -> frozen base (an NF4 matmul with 1,000 B of scratch) + scale * B(A(x)), then a residual add."""
    g = Graph(input_bytes=100)
    base = g.op(100, ins=(0,), ws_fwd=1000, packs=custom_function, name="base")
    a = g.op(10, ins=(0,), saves=(0,), pgrad=8, name="lora A")
    b = g.op(100, ins=(a,), saves=(a,), pgrad=8, name="lora B")
    scaled = g.op(100, ins=(b,), name="lora scale")
    out = g.op(100, ins=(base, scaled), passes="add", name="+ lora")
    g.op(100, ins=(0, out), passes="add", name="residual add")
    return g


def test_a_custom_function_packs_after_its_forward_so_the_recompute_runs_it_whole():
    """LinearNF4 saves its weight in save_for_backward, packed once forward returns: when it is the block's last
    saving node the recompute has run its matmul and scratch before it stops."""
    g = Graph(input_bytes=100)
    g.op(100, ins=(0,), saves=(0,), name="norm")
    g.op(100, ins=(1,), ws_fwd=1000, packs=True, name="nf4 linear")
    assert g.profile().recompute_peak == 100 + 100 + 100 + 1000  # input, norm out, linear out, scratch
    plain = Graph(input_bytes=100)
    plain.op(100, ins=(0,), saves=(0,), name="norm")
    plain.op(100, ins=(1,), ws_fwd=1000, saves=(1,), name="saving linear")  # packs its input before it runs
    assert plain.profile().recompute_peak == 100 + 100


def test_the_scaling_gradient_made_before_the_first_unpack_lives_through_the_recompute():
    """The block's last nodes run until lora B's MmBackward unpacks A's output: the adds hand the gradient on,
    the scaling's MulBackward makes a new one (100 B), alive while the recompute runs."""
    forward_moment = 100 + 100 + 1000  # the base's: input, its output, its scratch (the recompute's largest)
    assert _lora_tail(True).profile().recompute_peak == forward_moment + 100


def test_an_add_hands_its_gradient_on_without_a_new_tensor():
    g = Graph(input_bytes=100)
    x = g.op(100, ins=(0,), saves=(0,), name="saving op")
    g.op(100, ins=(0, x), passes="add", name="residual add")
    assert g.profile().recompute_peak == 100  # the input alone: the saving op stops it, and no gradient was made

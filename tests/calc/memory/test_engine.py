"""Engine unit tests with hand-computed values."""

from __future__ import annotations

import pytest

from calc.contract import parallel, precision
from calc.contract.scenario import Optimizer, OptimizerImpl, Precision, Scenario
from calc.memory.activations import block_context, block_profiles
from calc.memory.estimate import estimate
from calc.memory.states import model_states
from calc.sim.graph import OUT, Graph

TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 320, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def scenario(model=None, **training) -> Scenario:
    return Scenario.model_validate({"model": model or TINY_LLAMA, "training": training})


# ---- the autograd simulator ---------------------------------------------------------------

def test_graph_chain_saved_and_peaks():
    # x(100) -> a = f(x) saves x -> b = g(a) saves b (its output) -> out = h(b), no save
    g = Graph(input_bytes=100)
    a = g.op(200, ins=(0,), saves=(0,), pgrad=10)
    b = g.op(300, ins=(a,), saves=(OUT,))
    g.op(50, ins=(b,))
    p = g.profile()
    assert p.saved == 100 + 300  # x and b are kept; a is freed after g reads it
    # forward peak: x + a + b alive while g runs = 600
    assert p.fwd_peak == 600
    assert p.fwd_peak_nosave == 500  # without saving, x is freed once f has read it
    # backward: at g's node, saved x + b (400), grad(b) (300) and the new grad(a) (200) = 900
    assert p.bwd_peak == 900
    assert p.param_grad_bytes == 10
    assert p.in_grad_bytes == 100
    assert p.input_saved


def test_graph_gradient_accumulation_is_transient():
    # x read by two ops: the second gradient for x is accumulated (briefly alive next to the first)
    g = Graph(input_bytes=100)
    a = g.op(100, ins=(0,), saves=(0,))
    b = g.op(100, ins=(0,), saves=(0,))
    g.op(100, ins=(a, b))
    p = g.profile()
    assert p.in_grad_bytes == 100
    # at b's backward: saved x (100) + grads of a and b (200) + new grad x (100) = 400;
    # at a's backward: x + grad a + grad x + transient grad x = 400
    assert p.bwd_peak == 400


def test_graph_records_no_node_when_nothing_needs_grad():
    # a frozen op on an input that requires no grad saves nothing; a trainable one downstream does
    g = Graph(input_bytes=100, input_requires_grad=False)
    a = g.op(200, ins=(0,), saves=(0,))
    g.op(50, ins=(a,), saves=(a,), pgrad=10)
    p = g.profile()
    assert p.saved == 200  # x is not kept: the first op recorded no autograd node
    assert not g.needs_grad[a]
    assert p.in_grad_bytes == 0 and p.param_grad_bytes == 10


def test_cuda_rounds_blocks_to_512_bytes():
    g = Graph(input_bytes=0, round_to=512)
    g.op(1, saves=(OUT,))
    assert g.profile().saved == 512  # the size is recorded as asked and rounded when the plan is evaluated


# ---- per-layer activations, hand-derived from transformers' LlamaDecoderLayer ---------------

def llama_layer_saved_bf16_sdpa(b, s, h, i, nh, nkv, hd) -> int:
    """What autograd keeps for one LlamaDecoderLayer in pure bf16 with SDPA (no GQA repeat):
    each RMSNorm: fp32 copy of its input (4), rsqrt (4 per token), normalised bf16 and the norm
    output (2 + 2); attention: RoPE'd q, cached k and v copies, SDPA output (all bf16) and the fp32
    logsumexp; MLP: gate, up, silu(gate), product (bf16, width I)."""
    t = b * s
    norms = 2 * (4 * t * h + 4 * t + 2 * t * h + 2 * t * h)
    attn = 2 * t * nh * hd * 2 + 2 * 2 * t * nkv * hd + 4 * b * nh * s
    mlp = 4 * 2 * t * i
    return norms + attn + mlp


@pytest.mark.parametrize("b,s", [(1, 16), (2, 48), (4, 128)])
def test_llama_layer_saved_matches_hand_count(b, s):
    sc = scenario(micro_batch_size=b, seq_len=s, precision="bf16", attention="sdpa")
    layer, _, _ = block_profiles(block_context(sc, "cpu"), False)
    assert layer.saved == llama_layer_saved_bf16_sdpa(b, s, 128, 320, 4, 2, 32)


def test_eager_keeps_fp32_and_16bit_probabilities():
    sdpa = block_profiles(block_context(scenario(precision="bf16", seq_len=64), "cpu"), False)[0].saved
    eager = block_profiles(block_context(scenario(precision="bf16", seq_len=64, attention="eager"), "cpu"), True)[0].saved
    b, nh, s, qw, kvw = 1, 4, 64, 128, 64
    # eager adds B x nh x S x S probabilities in fp32 (4) and bf16 (2), drops SDPA's logsumexp,
    # and saves repeat_kv's k and v (nh heads) instead of the cached nkv-head copies
    assert eager - sdpa == (4 + 2) * b * nh * s * s - 4 * b * nh * s + 2 * 2 * b * s * (qw - kvw)


def test_loss_backward_holds_three_fp32_vocab_tensors():
    sc = scenario(precision="bf16", micro_batch_size=4, seq_len=512)
    _, _, head = block_profiles(block_context(sc, "cpu"), False)
    t, v = 4 * 512, 1000
    # log_softmax output (saved) + nll grad + log_softmax grad, all fp32
    assert head.bwd_peak >= 3 * 4 * t * v


# ---- model states ----------------------------------------------------------------------------

def test_model_states_fp32_adamw_16_bytes_per_param():
    sc = scenario(precision="fp32", optimizer="adamw")
    st = model_states(sc, 2, True, True)
    p = sc.spec.total_params()
    assert (st.weights, st.grads, st.optimizer) == (4 * p, 4 * p, 8 * p)
    assert st.opt_temp == 4 * p  # foreach: one param-sized sqrt list


def test_model_states_bf16_mixed_master_in_optimizer():
    sc = scenario(precision="bf16-mixed")
    st = model_states(sc, 2, True, True)
    p = sc.spec.total_params()
    assert (st.weights, st.grads, st.optimizer, st.master) == (2 * p, 2 * p, 12 * p, 4 * p)


def test_pure_bf16_adam_states_are_bf16():
    sc = scenario(precision="bf16")
    st = model_states(sc, 2, True, True)
    assert st.optimizer == 4 * sc.spec.total_params()  # PEERS.md: 4 bytes/param, not 8


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figures(stage, expected_gb):
    """ZeRO paper, Fig. 1: 7.5B params, 64 GPUs, mixed-precision Adam (K = 12)."""
    got = parallel.zero_model_state_bytes(7_500_000_000, stage, 64) / 1e9
    assert got == pytest.approx(expected_gb, abs=0.05)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_engine_model_states_follow_zero_formula(stage):
    sc = Scenario.model_validate({"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 64},
                                  "training": {"precision": "bf16-mixed", "zero_stage": stage}})
    st = model_states(sc, 32, True, True)
    p = sc.spec.total_params()
    # DeepSpeed's ZeRO-1 with the exported overlap_comm keeps only the rank's gradient partition, as stage 2
    paper = parallel.zero_model_state_bytes(p, 2 if stage == 1 else stage, 64)
    assert st.weights + st.grads + st.optimizer == pytest.approx(paper, abs=64)
    torch_st = model_states(sc, 32, True, True, deepspeed=False)  # the ZeRO paper's stage 1 as written
    assert torch_st.weights + torch_st.grads + torch_st.optimizer == pytest.approx(
        parallel.zero_model_state_bytes(p, stage, 64), abs=64)


def test_seed_article_figures_recomputed():
    """seeds/README.md: 7B on 8 GPUs, mixed-precision Adam: 112 / 38.5 / 26.25 / 14 GB."""
    got = [parallel.zero_model_state_bytes(7_000_000_000, s, 8) / 1e9 for s in range(4)]
    assert got == pytest.approx([112.0, 38.5, 26.25, 14.0])


def test_optimizer_state_bytes_by_kind():
    shapes = [((10, 20), 3), ((20,), 1)]
    n = 620
    assert precision.optimizer_state_bytes(Optimizer.sgd, Precision.fp32, shapes) == 0
    assert precision.optimizer_state_bytes(Optimizer.sgd_momentum, Precision.fp32, shapes) == 4 * n
    assert precision.optimizer_state_bytes(Optimizer.adamw, Precision.fp32, shapes) == 8 * n
    # Adafactor: 2-D tensors keep row (10) + col (20) variances; vectors a full one
    assert precision.optimizer_state_bytes(Optimizer.adafactor, Precision.fp32, shapes) == 4 * (3 * 30 + 20)
    assert precision.optimizer_temp_bytes(Optimizer.adamw, OptimizerImpl.fused, Precision.fp32, shapes) == 0
    assert precision.optimizer_temp_bytes(Optimizer.adamw, OptimizerImpl.for_loop, Precision.fp32, shapes) == 2 * 4 * 200


# ---- the estimate ----------------------------------------------------------------------------

def test_breakdown_sums_to_peak_and_names_phase():
    est = estimate(scenario(precision="bf16", micro_batch_size=4, seq_len=256))
    assert est.breakdown.total() == est.peak_allocated_bytes
    tl = est.timeline
    assert tl.total(tl.peak_index) == est.peak_allocated_bytes
    assert est.peak_phase in ("forward", "loss", "backward", "optimizer")


def test_small_model_peaks_at_start_of_backward_large_adam_in_optimizer():
    small = estimate(scenario(precision="bf16", micro_batch_size=4, seq_len=512))
    assert small.peak_event == "loss backward"
    big = estimate(Scenario.model_validate({"model": "llama-2-7b", "training": {
        "precision": "amp-bf16", "micro_batch_size": 1, "seq_len": 512, "activation_checkpointing": "full"}}))
    assert big.peak_phase == "optimizer" and big.peak_step == 1


def test_device_total_range_and_fit():
    est = estimate(Scenario.model_validate({"model": "llama-2-7b", "hardware": {"gpu": "rtx-4090"},
                                            "training": {"precision": "amp-bf16"}}))
    dt = est.device_total_bytes
    assert est.peak_allocated_bytes < dt.low <= dt.expected <= dt.high
    assert est.fits is False and est.headroom_bytes < 0
    assert est.gpu_memory_bytes == 24564 * 2**20


def test_offload_moves_states_to_cpu_ram():
    base = {"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 8},
            "training": {"precision": "bf16-mixed", "zero_stage": 2}}
    on_gpu = estimate(Scenario.model_validate(base))
    base["training"]["offload_optimizer"] = "cpu"
    off = estimate(Scenario.model_validate(base))
    assert off.cpu_ram_bytes > 0 and on_gpu.cpu_ram_bytes == 0
    assert off.peak_allocated_bytes < on_gpu.peak_allocated_bytes


def test_inference_has_no_grads_or_states():
    est = estimate(Scenario.model_validate({"model": "llama-3.2-1b", "mode": "inference",
                                            "training": {"precision": "bf16", "seq_len": 1024}}))
    assert est.breakdown.gradients == 0 and est.breakdown.optimizer_states == 0
    assert est.peak_allocated_bytes > 2 * est.model.total_params


def test_tensor_parallel_splits_weights():
    one = estimate(Scenario.model_validate({"model": "llama-2-13b", "hardware": {"gpu": "a100-80gb", "num_gpus": 4},
                                            "training": {"precision": "bf16"}}))
    tp4 = estimate(Scenario.model_validate({"model": "llama-2-13b", "hardware": {"gpu": "a100-80gb", "num_gpus": 4},
                                            "training": {"precision": "bf16", "tensor_parallel": 4}}))
    assert tp4.breakdown.parameters < one.breakdown.parameters / 3


@pytest.mark.parametrize("bad,msg", [
    ({"training": {"offload_params": "cpu"}}, "zero_stage 3"),
    ({"training": {"tensor_parallel": 3}, "hardware": {"num_gpus": 3}}, "divide"),
    ({"training": {"unknown": 1}}, "Extra inputs"),
    ({"model": {"model_type": "bert"}}, "supported"),
    ({"model": dict(TINY_LLAMA, num_key_value_heads=3)}, "divisible"),
])
def test_validation_errors_are_clear(bad, msg):
    data = {"model": TINY_LLAMA, **bad}
    with pytest.raises(ValueError, match=msg):
        Scenario.model_validate(data)


@pytest.mark.parametrize("data", [
    {"model": "llama-2-7b", "training": {"precision": "bf16-mixed"}},
    {"model": "gpt2", "training": {"precision": "amp-bf16", "micro_batch_size": 8, "seq_len": 1024}},
    {"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 8},
     "training": {"precision": "bf16-mixed", "zero_stage": 2}},
])
def test_components_sum_to_peak_with_formulas(data):
    est = estimate(Scenario.model_validate(data))
    assert sum(c.bytes for c in est.components) == est.peak_allocated_bytes
    for cat in ("parameters", "gradients", "optimizer_states", "activations", "other"):
        assert sum(c.bytes for c in est.components if c.category == cat) == getattr(est.breakdown, cat)
    assert all(c.formula and c.source for c in est.components)


def test_fsdp2_shards_pad_dim0_and_keep_root_gathered():
    from calc.memory.fsdp2 import fsdp2_states

    sc = Scenario.model_validate({"model": TINY_LLAMA, "hardware": {"num_gpus": 3},
                                  "training": {"precision": "bf16-mixed", "zero_stage": 3}})
    st = fsdp2_states(sc)
    padded = sum(-(-s[0] // 3) * (s[1] if len(s) > 1 else 1) * c for s, c in sc.spec.param_shapes())
    assert st.weights == st.grads == 4 * padded  # fp32 shards are the masters; fp32 grads
    assert st.optimizer == 8 * padded and st.master == 0
    assert st.gathered_root == 2 * (2 * 1000 * 128 + 128)  # bf16 embedding + lm_head + final norm
    assert st.reshard_after_forward
    est = estimate(sc, target="cpu", sharding="fsdp2")
    assert est.breakdown.total() == est.peak_allocated_bytes


def test_fsdp2_is_a_scenario_choice():
    base = {"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 8},
            "training": {"precision": "bf16-mixed", "zero_stage": 3, "activation_checkpointing": "full"}}
    ds = estimate(Scenario.model_validate(base))
    fsdp_sc = Scenario.model_validate({**base, "training": {**base["training"], "sharding": "fsdp2"}})
    fsdp = estimate(fsdp_sc)
    assert fsdp.peak_allocated_bytes == estimate(Scenario.model_validate(base), sharding="fsdp2").peak_allocated_bytes
    assert fsdp.peak_allocated_bytes != ds.peak_allocated_bytes
    with pytest.raises(ValueError, match="fsdp2"):
        Scenario.model_validate({**base, "training": {**base["training"], "sharding": "fsdp2", "zero_stage": 1}})
    with pytest.raises(ValueError, match="offload"):
        Scenario.model_validate({**base, "training": {**base["training"], "sharding": "fsdp2",
                                                      "offload_optimizer": "cpu"}})


@pytest.mark.parametrize("gpus", [1, 8])
def test_zero3_param_offload_counts_the_gathered_layer_on_the_gpu(gpus):
    """offload_param keeps the weights in host RAM, but each module is fetched to the GPU before it
    runs (with prefetch): the peak holds at least one decoder layer's 16-bit weights, on one GPU too."""
    sc = Scenario(model="llama-2-7b", hardware={"gpu": "a100-80gb", "num_gpus": gpus},
                  training={"precision": "bf16-mixed", "zero_stage": 3, "offload_optimizer": "cpu",
                            "offload_params": "cpu", "activation_checkpointing": "full", "seq_len": 512})
    est = estimate(sc)
    layer_weights = 2 * sc.spec.layer_params()
    buffers = {c.key: c.bytes for c in est.components}.get("zero_buffers", 0)
    assert est.breakdown.parameters == 0  # the sharded weights themselves live on the host
    assert buffers >= 2 * layer_weights  # the running layer + the prefetched one
    assert est.peak_allocated_bytes > 2 * layer_weights
    assert est.cpu_ram_bytes > 0

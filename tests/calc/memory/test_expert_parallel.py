"""Expert parallelism (training.expert_parallel): transformers' DistributedConfig(ep_size=...) with AllToAllEP,
under FSDP2. The scenario's validation, the engine's per-rank expert shards and all-to-all buffers, and a run
over the fake process group (measure/sharded.py) against the estimate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate
from calc.memory.fsdp2 import fsdp2_states

MOE = {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
       "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
       "max_position_embeddings": 2048}


def _sc(ep: int = 1, gpus: int = 8, model: dict | str = MOE, **training) -> Scenario:
    tr = {"micro_batch_size": 1, "seq_len": 256, "precision": "fp32", "zero_stage": 3, "sharding": "fsdp2",
          "expert_parallel": ep, **training}
    return Scenario.model_validate({"model": model, "hardware": {"num_gpus": gpus}, "training": tr})


@pytest.mark.parametrize(("change", "message"), [
    ({"ep": 3}, "must divide the 8 experts"),
    ({"ep": 4, "gpus": 6}, "must divide num_gpus=6"),
    ({"ep": 2, "model": "llama-2-7b"}, "needs a mixture-of-experts model"),
    ({"ep": 2, "sharding": "deepspeed"}, "runs under FSDP2"),
    ({"ep": 2, "zero_stage": 0}, "runs under FSDP2"),
])
def test_invalid_expert_parallel_is_rejected_with_its_reason(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _sc(**change)


def test_expert_parallel_is_bounded() -> None:
    with pytest.raises(ValueError):
        _sc(ep=2048, gpus=2048)


@settings(max_examples=25, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8]), gpus=st.sampled_from([8, 16, 64]))
def test_shards_hold_every_expert_once_and_gathers_shrink_with_ep(ep: int, gpus: int) -> None:
    sc = _sc(ep=ep, gpus=gpus)
    st_ = fsdp2_states(sc)
    spec = sc.spec
    # summed over all ranks the shards hold the whole model; exactly when the 8 experts divide over the ranks
    assert st_.weights * gpus >= spec.total_params() * 4
    assert (st_.weights * gpus == spec.total_params() * 4) == (gpus == 8)
    experts = spec.routed_expert_params_per_layer()
    assert st_.gathered_experts == (experts // ep * 4 if ep > 1 else 0)
    assert st_.gathered_layer + st_.gathered_experts == (spec.layer_params() - experts + experts // ep) * 4 \
        if ep > 1 else st_.gathered_layer == spec.layer_params() * 4


def test_expert_parallel_lowers_the_peak_of_a_moe_bound_model() -> None:
    peaks = [estimate(_sc(ep=ep)).peak_allocated_bytes for ep in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]


def test_all_to_all_buffers_are_in_the_moe_block() -> None:
    from calc.memory.activations import block_context
    from calc.sim.graph import Graph
    from calc.sim.layers import moe_mlp

    def names(ep: int) -> list[str]:
        ctx = block_context(_sc(ep=ep), "cuda", fsdp=True)
        g = Graph(input_bytes=4 * ctx.tokens * ctx.spec.hidden_size)
        moe_mlp(g, 0, ctx)
        return [op.name for op in g.ops]

    assert "all-to-all dispatch" in names(2) and "all-to-all combine" in names(2)
    assert "all-to-all dispatch" not in names(1)


def test_measured_over_the_fake_process_group_matches_the_estimate() -> None:
    pytest.importorskip("torch")
    from measure.entry import measure

    sc = _sc(ep=4, gpus=4, seq_len=128)
    rec = measure(sc, "cpu", steps=2)
    assert rec.engine == "fsdp2" and rec.sharding.world_size == 4
    assert any("expert parallelism 4" in n for n in rec.notes)
    pred = estimate(sc, target="cpu").peak_allocated_bytes
    assert abs(pred - rec.peak_allocated_bytes) / rec.peak_allocated_bytes < 0.02
    with pytest.raises(Exception, match="--device cpu"):
        measure(sc, "fake", steps=1)


def test_experts_reduce_is_a_mid_layer_row_with_the_attention_still_saved() -> None:
    """The experts group's post-backward runs when the MoE block's backward ends: one row per MoE layer, with
    part of the layer's recomputed saved tensors (the attention's) still alive; none without expert parallelism
    or with a frozen base (no experts' gradients)."""
    from calc.memory.activations import block_context, layer_profile

    sc = _sc(ep=8, precision="bf16-mixed", activation_checkpointing="full")
    rows = estimate(sc, target="cpu", sharding="fsdp2").timeline.events
    assert [e for e in rows if e.endswith("experts")] == ["reduce-scatter layer 1 experts",
                                                          "reduce-scatter layer 0 experts"]
    prof = layer_profile(block_context(sc, "cpu", fsdp=True), eager=False)
    assert 0 < prof.experts_done_saved < prof.saved
    assert prof.experts_done_grads > 0
    assert not any(e.endswith("experts") for e in estimate(_sc(ep=1), target="cpu", sharding="fsdp2").timeline.events)
    lora = _sc(ep=8, lora={"rank": 8, "targets": "attention"})
    assert not any(e.endswith("experts") for e in estimate(lora, target="cpu", sharding="fsdp2").timeline.events)


def test_dense_layers_list_each_moment_once_under_expert_parallelism() -> None:
    """A MoE model's dense first layers have no experts' reduce: the timeline lists their backward once (the run
    keeps one width by repeating the row, which the listing drops), and the peak is unchanged by the listing."""
    dense_first = {**MOE, "model_type": "deepseek_v2", "first_k_dense_replace": 1, "n_routed_experts": 8,
                   "n_shared_experts": 1, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 32,
                   "qk_rope_head_dim": 16, "v_head_dim": 32, "moe_layer_freq": 1, "topk_method": "greedy",
                   "n_group": 1, "topk_group": 1}
    dense_first.pop("num_experts")
    dense_first.pop("norm_topk_prob")
    dense_first.pop("head_dim")
    dense_first["num_key_value_heads"] = dense_first["num_attention_heads"]  # MLA: a latent key per query head
    est = estimate(_sc(ep=8, model=dense_first), target="cpu", sharding="fsdp2")
    ev = est.timeline.events
    assert all(a != b for a, b in zip(ev, ev[1:], strict=False)), ev
    assert [e for e in ev if e.endswith("experts")] == ["reduce-scatter layer 1 experts"]
    assert est.timeline.total(est.timeline.peak_index) == est.peak_allocated_bytes

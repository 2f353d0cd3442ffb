"""The loop around the model, masks under checkpointing, the fused loss and the layer kinds of the
2026 families: engine-only checks (the committed measurements in data/ check the bytes)."""

from __future__ import annotations

import pytest

from calc.contract.presets import model_presets
from calc.contract.scenario import Scenario
from calc.memory.activations import block_context, embeddings_need_grad, layer_ctxs, layer_profile
from calc.memory.estimate import estimate
from calc.sim.layers import liger_chunk_tokens, sdpa_needs_mask

SMALL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 128, "intermediate_size": 344,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def _sc(model=None, **training) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "training": {"micro_batch_size": 1, "seq_len": 1024,
                                                                          **training}})


def _step_bytes(est) -> int:
    return est.timeline.total(len(est.timeline.events) - 1)  # the optimizer step row


@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp-bf16"])
def test_kept_outputs_hold_the_logits_through_the_step(precision):
    """With full checkpointing there is no cache: the kept output is exactly the compute-dtype logits."""
    base = _sc(precision=precision, activation_checkpointing="full")
    keep = _sc(precision=precision, activation_checkpointing="full", keep_outputs=True)
    logits = (4 if precision == "fp32" else 2) * 1024 * 32000
    assert _step_bytes(estimate(keep, "cpu")) - _step_bytes(estimate(base, "cpu")) == logits
    assert estimate(keep).peak_allocated_bytes > estimate(base).peak_allocated_bytes


def test_kept_outputs_also_hold_the_kv_cache_without_checkpointing():
    base, keep = _sc(precision="bf16"), _sc(precision="bf16", keep_outputs=True)
    cache = 2 * 2 * 1024 * 64 * 2  # layers x (k + v) x tokens x kv width x bf16
    assert _step_bytes(estimate(keep, "cpu")) - _step_bytes(estimate(base, "cpu")) == 2 * 1024 * 32000 + cache


def test_checkpointing_keeps_the_eager_mask_and_position_ids_into_backward():
    plain = estimate(_sc(precision="fp32", attention="eager", seq_len=512), "cpu")
    ckpt = estimate(_sc(precision="fp32", attention="eager", seq_len=512, activation_checkpointing="full"), "cpu")
    i = ckpt.timeline.events.index("loss backward")
    j = plain.timeline.events.index("loss backward")
    mask, pos = 512 * 512 * 4, 512 * 8
    assert ckpt.timeline.other[i] - plain.timeline.other[j] == mask + pos


@pytest.mark.parametrize(("seq", "needs"), [(63, False), (64, True), (65, True)])
def test_sliding_window_mask_from_the_window_length_on(seq, needs):
    model = {**SMALL, "model_type": "mistral", "sliding_window": 64}
    assert sdpa_needs_mask(block_context(_sc(model, seq_len=seq), "cpu")) is needs


def test_phi3_attends_through_its_sliding_window():
    phi3 = {**SMALL, "model_type": "phi3", "sliding_window": 64}
    assert sdpa_needs_mask(block_context(_sc(phi3, seq_len=64), "cpu"))
    assert model_presets()["phi-3-mini"].spec.sliding_window == 2047


def test_qwen_window_layers_from_max_window_layers():
    qwen = {**SMALL, "model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 64,
            "max_window_layers": 2}
    spec = _sc(qwen).spec
    assert [spec.is_sliding(i) for i in range(4)] == [False, False, True, True]
    assert _sc({**qwen, "max_window_layers": 4}).spec.sliding_window is None  # no sliding layer, no mask
    assert _sc({**qwen, "use_sliding_window": False}).spec.sliding_window is None


def test_frozen_embedding_output_makes_layer_0_save_less():
    lora = {"rank": 8, "alpha": 16.0, "targets": "attention", "base_weights": "bf16"}
    ctx = block_context(_sc(precision="bf16", lora=lora), "cpu")
    assert not embeddings_need_grad(ctx, _sc().training.activation_checkpointing)
    first, second = layer_ctxs(ctx, 2, first_input_grad=False)

    # layer 0's input norm records no node: its fp32 input (and rsqrt) are not saved
    assert layer_profile(second, False).saved - layer_profile(first, False).saved >= 4 * 1024 * 128


def test_liger_chunk_follows_the_kernel_heuristic():
    # BT = 4096 * 4, V = 32000, H = 4096 -> inc_factor 8, chunk 2048 (the kernel's own comment)
    assert liger_chunk_tokens(4 * 4096, 4096, 32000) == 2048
    assert liger_chunk_tokens(7, 4096, 128256) == 1


def test_liger_fused_loss_removes_the_vocabulary_sized_peak():
    std = estimate(_sc(model="llama-3.1-8b", precision="bf16", seq_len=8192, activation_checkpointing="full"))
    fused = estimate(_sc(model="llama-3.1-8b", precision="bf16", seq_len=8192, activation_checkpointing="full",
                         cross_entropy="liger-fused"))
    def at_loss(est) -> int:
        tl = est.timeline
        return tl.total(tl.events.index("loss backward"))

    # no fp32 logits, log-probs or their gradients; the lm_head gradient now exists from the forward on
    assert at_loss(fused) < at_loss(std) - 2 * 8192 * 128256 * 4


def test_layer_kinds_of_gemma3_and_deepseek():
    g3 = block_context(_sc(model="gemma-3-1b", seq_len=1024), "cpu")
    kinds = [c.sliding for c in layer_ctxs(g3, 12)]
    assert kinds == [True] * 5 + [False] + [True] * 5 + [False]
    ds = block_context(_sc(model="deepseek-v3", seq_len=256), "cpu")
    assert [c.dense_mlp for c in layer_ctxs(ds, 5)] == [True, True, True, False, False]


def test_new_family_presets_count_their_published_totals():
    presets = model_presets()
    for pid in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gemma-3-27b"):
        p = presets[pid]
        assert abs(p.spec.total_params() - p.published_params) <= 0.005 * p.published_params


def test_lora_on_latent_attention_targets_the_mla_projections():
    spec = model_presets()["deepseek-v3"].spec
    assert spec.lora_target_names("attention") == {"q_a", "q_b", "kv_a", "kv_b", "o"}
    est = estimate(_sc(model="deepseek-v3", seq_len=256, lora={"rank": 8, "targets": "attention"}))
    assert est.model.trainable_params == spec.lora_params(8, "attention")


@pytest.mark.parametrize("model", ["deepseek-v3", "glm-4.5-air", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_lora_all_linear_on_peft_converted_moe_is_refused(model):
    # peft 0.21 rewrites all-linear onto the routed experts' 3-D weights and the router there
    with pytest.raises(ValueError, match="routed experts"):
        _sc(model=model, lora={"rank": 8, "targets": "all-linear"})


def test_lora_all_linear_on_llama4_is_refused_clearly():
    with pytest.raises(ValueError, match="router"):
        _sc(model="llama-4-scout", lora={"rank": 8})


def test_trainer_export_switches_on_only_the_fused_loss():
    from calc.export.hf import trainer_arguments

    kw = trainer_arguments(_sc(model="llama-3.2-1b", cross_entropy="liger-fused"))
    assert kw["use_liger_kernel"] is True
    assert kw["liger_kernel_config"]["fused_linear_cross_entropy"] is True
    assert not any(v for k, v in kw["liger_kernel_config"].items() if k != "fused_linear_cross_entropy")
    assert "use_liger_kernel" not in trainer_arguments(_sc(model="llama-3.2-1b"))


@pytest.mark.parametrize(("config", "msg"), [
    ({"model_type": "deepseek_v3", "kv_lora_rank": "512"}, "kv_lora_rank must be an integer"),
    ({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "topk_method": "group_limited_greedy"},
     "group_limited_greedy"),
    ({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "local"]}, "layer_types"),
    ({"model_type": "glm4_moe", "n_shared_experts": -1}, "n_shared_experts must be >= 0"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [0]}, "every layer must be a MoE layer"),
])
def test_new_family_configs_are_read_strictly(config, msg):
    from calc.contract.architectures import spec_from_hf_config

    with pytest.raises(ValueError, match=msg):
        spec_from_hf_config(config)


def test_llama4_runs_every_token_through_every_expert():
    from calc.speed import shape_numbers

    spec = model_presets()["llama-4-scout"].spec
    touched, every, *_ = shape_numbers(spec)
    assert touched == every  # no dispatch: the step's matmul FLOPs count all 16 experts
    assert spec.active_params() < spec.total_params() // 5  # the model card's 17B active of 109B

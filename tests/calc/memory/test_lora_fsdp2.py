"""LoRA's model states under every sharding: the frozen base takes no gradient, optimizer state or master weight,
whichever of DeepSpeed ZeRO 0-3, FSDP2 or plain PyTorch holds it (FSDP2 once estimated a peft model as full
fine-tuning)."""

from __future__ import annotations

from math import prod

from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.precision import adapter_bytes
from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate
from calc.memory.fsdp2 import fsdp2_full_states, fsdp2_states
from calc.memory.states import lora_shapes, model_states

LLAMA_2_7B_LORA = {"model": "llama-2-7b", "hardware": {"num_gpus": 2},
                   "training": {"precision": "bf16", "zero_stage": 3, "sharding": "fsdp2", "lora": {"rank": 16}}}


def _padded_adapter_elements(sc: Scenario, ranks: int) -> int:
    """The adapters' elements with every tensor's dim 0 padded to a multiple of `ranks` (FSDP2's shards)."""
    lora = sc.training.lora
    shapes = lora_shapes(sc.spec, lora.rank, lora.targets, sc.spec.num_layers, 1)
    return sum(-(-s[0] // ranks) * ranks * prod(s[1:]) * c for s, c in shapes)


def test_fsdp2_lora_llama_2_7b_trains_the_adapters_only():
    sc = Scenario.model_validate(LLAMA_2_7B_LORA)
    st = fsdp2_states(sc)
    adapters = sc.spec.lora_params(16, "all-linear")
    assert st.trainable == adapters
    shard = _padded_adapter_elements(sc, 2) // 2
    assert st.grads == 2 * shard  # bf16 adapter gradients, reduce-scattered into this rank's shards
    assert st.optimizer == 2 * 2 * shard  # AdamW's two bf16 states on the adapter shards
    assert st.reduce_scatter_input == 2 * sc.spec.lora_params_per_layer(16, "all-linear")
    full = fsdp2_full_states(sc)
    assert full.grads > 100 * st.grads  # what the bug counted: a gradient for every frozen weight


def test_fsdp2_lora_llama_2_7b_is_close_to_deepspeed_zero3():
    fsdp = estimate(Scenario.model_validate(LLAMA_2_7B_LORA)).peak_allocated_bytes
    ds_training = {**LLAMA_2_7B_LORA["training"], "sharding": "deepspeed"}
    ds = estimate(Scenario.model_validate({**LLAMA_2_7B_LORA, "training": ds_training})).peak_allocated_bytes
    # both shard a 13.5 GB frozen base over two ranks; full fine-tuning's gradients and states would add ~27 GB
    assert abs(fsdp - ds) < 0.15 * ds


SHARDINGS = [("deepspeed", 0), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3), ("fsdp2", 2), ("fsdp2", 3),
             ("torch", 0)]


@settings(max_examples=40, deadline=None)
@given(sharding=st.sampled_from(SHARDINGS), gpus=st.sampled_from([1, 2, 4, 8]),
       model=st.sampled_from(["llama-3.2-1b", "qwen2.5-0.5b", "gpt2", "phi-3-mini", "pythia-160m"]),
       rank=st.sampled_from([1, 8, 64]), precision=st.sampled_from(["bf16", "amp-bf16", "bf16-mixed", "fp32"]),
       targets=st.sampled_from(["all-linear", "attention", "first", "first+lm_head"]),
       optimizer=st.sampled_from(["adamw", "sgd-momentum", "adafactor"]))
def test_no_sharding_counts_states_for_frozen_weights(sharding, gpus, model, rank, precision, targets, optimizer):
    name, stage = sharding
    base = Scenario.model_validate({"model": model})
    names = base.spec.linear_module_names()
    chosen = {"first": names[:1], "first+lm_head": (names[0], names[-1])}.get(targets, targets)
    sc = Scenario.model_validate({"model": model, "hardware": {"num_gpus": gpus}, "training": {
        "precision": precision, "zero_stage": stage, "sharding": name, "optimizer": optimizer,
        "lora": {"rank": rank, "targets": chosen}}})
    fsdp = name == "fsdp2" and gpus > 1
    states = fsdp2_states(sc) if fsdp else model_states(sc, sc.spec.num_layers, True, True, "cuda",
                                                        name == "deepspeed")
    adapters = sc.spec.lora_params(rank, chosen)
    assert states.trainable == adapters
    # every per-element byte count the engine knows, times the adapters (padded to the world size per tensor)
    bound = _padded_adapter_elements(sc, gpus) if fsdp else adapters
    grad_bytes = adapter_bytes(sc.training.precision)
    assert states.grads <= grad_bytes * bound
    assert states.master <= 4 * bound
    assert states.optimizer <= (8 + 4) * bound + 4 * 2 * 4096  # AdamW's two fp32 states + master (+ factors)
    assert states.grad_fp32_step <= 4 * bound
    if stage == 0 or not fsdp and name != "deepspeed":
        assert states.grads == grad_bytes * adapters  # nothing sharded: exactly the adapters' gradients


def test_fsdp2_modules_to_save_copies_are_sharded_and_gathered_with_the_root():
    training = {**LLAMA_2_7B_LORA["training"], "lora": {"rank": 16, "modules_to_save": ["lm_head"]}}
    sc = Scenario.model_validate({**LLAMA_2_7B_LORA, "training": training})
    plain = fsdp2_states(Scenario.model_validate(LLAMA_2_7B_LORA))
    saved = fsdp2_states(sc)
    copy = sc.spec.vocab_size * sc.spec.hidden_size
    assert saved.trainable - plain.trainable == copy
    assert saved.grads - plain.grads == 2 * copy // 2  # a bf16 shard of the copy on each of the two ranks
    assert saved.gathered_root - plain.gathered_root == 2 * copy

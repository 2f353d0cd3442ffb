"""The reference loop's LoRA as configured (peft's target list, lora_dropout, modules_to_save) against the engine,
on a tiny model: real CPU tensors, fake tensors (the copies peft makes for modules_to_save) and FSDP2 over the fake
process group."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate

TINY = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
LORA = {"rank": 4, "targets": ["q_proj", "v_proj", "lm_head"], "dropout": 0.1, "modules_to_save": ["embed_tokens"]}


def _scenario(**training) -> Scenario:
    return Scenario.model_validate({"model": TINY, "training": {"micro_batch_size": 2, "seq_len": 32,
                                                                "lora": LORA, **training}})


@pytest.mark.slow
def test_reference_loop_runs_the_configured_lora_and_the_engine_agrees():
    pytest.importorskip("peft")
    from measure.entry import measure

    sc = _scenario(precision="bf16")
    cpu, fake = measure(sc, "cpu", steps=2), measure(sc, "fake", steps=2)
    assert fake.peak_allocated_bytes == cpu.peak_allocated_bytes
    est = estimate(sc, target="cpu")
    assert cpu.trainable_params == est.model.trainable_params
    assert est.peak_allocated_bytes == pytest.approx(cpu.peak_allocated_bytes, rel=0.005)


@pytest.mark.slow
def test_fsdp2_lora_measured_on_the_fake_process_group():
    pytest.importorskip("peft")
    from measure.entry import measure

    sc = Scenario.model_validate({"model": TINY, "hardware": {"num_gpus": 2}, "training": {
        "micro_batch_size": 2, "seq_len": 32, "precision": "amp-bf16", "zero_stage": 3, "sharding": "fsdp2",
        "lora": {"rank": 4, "targets": ["q_proj", "v_proj"], "dropout": 0.05}}})
    rec = measure(sc, "cpu", steps=2)
    assert rec.engine == "fsdp2"
    est = estimate(sc, target="cpu")
    assert est.peak_allocated_bytes == pytest.approx(rec.peak_allocated_bytes, rel=0.005)

"""activation_offload: the reference loop's emulation of torchtune's OffloadActivations (measure/workload.py), on the
CPU with the host copies out of MemTracker's sight, and the engine's model of it (calc.memory.offload): the forward
stash, the host copies, what the scenario refuses."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from calc.contract.record import load_records
from calc.contract.scenario import Scenario, unmodelled_values
from calc.memory.activations import block_context, residual_stream_bytes
from calc.memory.estimate import estimate
from calc.memory.offload import FWD_STASH_PACKS, Pack, forward_stash, offload_plan

TINY = {"model_type": "llama", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
TOKENS = 2 * 64


ONE_GPU = {"gpu": "a100-80gb", "num_gpus": 1}


def _offload(**training) -> Scenario:
    return Scenario.model_validate({"model": TINY, "hardware": ONE_GPU, "training": {
        "micro_batch_size": 2, "seq_len": 64, "precision": "fp32", "activation_checkpointing": "full",
        "activation_offload": True, **training}})


def test_the_calculator_models_it_where_torchtune_runs_it():
    assert "activation_offload" not in unmodelled_values()
    _offload()
    _offload(framework="torchtune", precision="bf16")
    # torchtune's recipes refuse enable_activation_offloading without enable_activation_checkpointing
    for refused in ({"activation_checkpointing": "none"}, {"checkpoint_every": 2}, {"framework": "litgpt"},
                    {"precision": "bf16-mixed", "zero_stage": 2}):
        with pytest.raises(ValueError, match="activation_offload"):
            _offload(**refused)
    with pytest.raises(ValueError, match="activation_offload"):
        Scenario.model_validate({"model": TINY, "hardware": {"gpu": "a100-80gb", "num_gpus": 2}, "training": {
            "activation_checkpointing": "full", "activation_offload": True}})


def test_the_forward_stash_keeps_the_last_offloaded_packs():
    small, big = Pack("s", 1023), Pack("b", 1024)
    assert not small.offloaded and big.offloaded and not Pack("w", 4096, param=True).offloaded
    packs = [Pack(str(i), 4096) for i in range(8)]
    stash = forward_stash(packs)
    # at the pack with id k the ids <= k - 5 leave: the new one and the 4 before it stay
    assert stash[-1] == {str(i) for i in range(8 - FWD_STASH_PACKS, 8)}
    # a pack under the minimum takes an id but evicts nothing
    assert forward_stash([big, small, small, small, small])[-1] == {"b"}


def test_the_engine_offloads_the_layers_inputs():
    plain, off = _offload(activation_offload=False), _offload()
    h = TOKENS * TINY["hidden_size"] * 4
    ctx = block_context(off, "cpu", False)
    assert residual_stream_bytes(ctx) == h
    plan = offload_plan(ctx, TINY["num_hidden_layers"], h)
    # the input ids, one input per layer, the final norm's fp32 input (twice) and its output (fp32: the last
    # layer's output is its input): the rsqrt (B x S x 4 bytes) is under the minimum
    assert sum(plan.host_tensors) == 8 * TOKENS + TINY["num_hidden_layers"] * h + 3 * h
    assert plan.inputs_at_loss == 0 and plan.norm_on_device
    e_plain, e_off = estimate(plain, target="cpu"), estimate(off, target="cpu")
    part, = e_off.host_memory.parts
    assert part.key == "activation_offload" and part.requested_bytes == sum(plan.host_tensors)
    assert "torchtune" in part.source and "measure/activation_offload.py" in part.source
    assert not e_plain.host_memory.parts
    at = {ev: a for ev, a in zip(e_off.timeline.events, e_off.timeline.activations, strict=True)}
    at_plain = {ev: a for ev, a in zip(e_plain.timeline.events, e_plain.timeline.activations, strict=True)}
    assert at_plain["lm_head + loss"] - at["lm_head + loss"] == TINY["num_hidden_layers"] * h


def _run(offload: bool):
    import torch

    from measure.trackers import PhaseMemTracker
    from measure.workload import build_workload, offload_decoder_activations, prepare_optimizer, run_steps

    sc = Scenario.model_validate({"model": TINY, "training": {
        "micro_batch_size": 2, "seq_len": 64, "precision": "fp32", "activation_checkpointing": "full"}})
    w = build_workload(sc, torch.device("cpu"))
    hooks = offload_decoder_activations(w.model, w.device) if offload else None
    mt = PhaseMemTracker()
    mt.track_external(w.model, w.input_ids)
    with mt:
        prepare_optimizer(w, mt)
        run_steps(w, mt, 2)
    return w, hooks, mt


@pytest.mark.slow
def test_offload_moves_the_decoders_saved_tensors_to_the_host_and_back():
    import torch

    from measure.activation_offload import ActivationOffload

    plain_w, _, plain = _run(False)
    w, hooks, mt = _run(True)
    # the same training: every weight ends equal
    for a, b in zip(plain_w.model.parameters(), w.model.parameters(), strict=True):
        assert torch.equal(a, b)
    h = TOKENS * TINY["hidden_size"] * 4
    # packed: input_ids (the embedding's indices), each checkpointed layer's input, and the final RMSNorm's fp32
    # input (twice: pow and mul each save it) and its output; its rsqrt (B x S x 4 bytes) is under torchtune's
    # 1024-byte minimum here and its weight is a Parameter: both stay as they are
    assert 4 * TOKENS < ActivationOffload.MIN_BYTES <= 8 * TOKENS
    assert hooks.peak_host_bytes == 8 * TOKENS + TINY["num_hidden_layers"] * h + 3 * h
    assert (hooks.host, hooks.fwd_stash, hooks.bwd_stash) == ({}, {}, {})  # nothing left after the step
    # at the logits (the forward's peak) the layers' inputs are on the host: the five-tensor stash holds only
    # the final norm's own tensors by then
    assert plain.phase_peak["forward"] - mt.phase_peak["forward"] == TINY["num_hidden_layers"] * h
    assert mt.phase_peak["optimizer"] == plain.phase_peak["optimizer"]
    # the engine's host part is the emulation's peak of host copies
    assert estimate(_offload(), target="cpu").host_memory.parts[0].requested_bytes == hooks.peak_host_bytes


DATA = Path(__file__).parents[3] / "data"
RECORDS = load_records(DATA / "measured_activation_offload.jsonl")
HELD_OUT = load_records(DATA / "measured_activation_offload_heldout.jsonl")  # measured after the model was done


def _error_pct(sc: Scenario, measured: int) -> float:
    return (estimate(sc, target="cpu").peak_allocated_bytes - measured) / measured * 100


@pytest.mark.parametrize("records", [RECORDS, HELD_OUT], ids=["modelled on", "held out"])
def test_the_engine_reproduces_the_offloaded_runs(records):
    """The reference loop's and torchtune's recipe step with the emulation (python -m measure, CPU): with and
    without LoRA, bf16 and fp32, 256 to 2048 tokens a sequence. Without the offload the same scenarios are off
    by more than the bound: the records measure the mechanism."""
    assert {r.scenario.training.framework for r in records} == {"transformers", "torchtune"}
    assert all(r.scenario.training.activation_offload for r in records)
    errors = [abs(_error_pct(r.run_scenario(), r.peak_allocated_bytes)) for r in records]
    assert statistics.median(errors) <= 0.5 and max(errors) <= 2.0, errors
    plain = [abs(_error_pct(r.run_scenario().with_training(activation_offload=False), r.peak_allocated_bytes))
             for r in records]
    assert max(plain) > 2.0, plain


def test_the_torchtune_export_turns_it_on_with_checkpointing():
    from calc.export.torchtune import torchtune_config

    cfg = torchtune_config(_offload(framework="torchtune", precision="bf16"))
    assert cfg["enable_activation_offloading"] is True and cfg["enable_activation_checkpointing"] is True
    assert torchtune_config(_offload(framework="torchtune", precision="bf16", activation_offload=False))[
        "enable_activation_offloading"] is False


"""activation_offload: the reference loop's emulation of torchtune's OffloadActivations (measure/workload.py), on the
CPU with the host copies out of MemTracker's sight. The calculator refuses the field until its engine models it;
these tests pin down what the measurements will rest on."""

from __future__ import annotations

import pytest

from calc.contract.scenario import Scenario, unmodelled_values

TINY = {"model_type": "llama", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
TOKENS = 2 * 64


def test_the_calculator_still_refuses_it():
    assert True in unmodelled_values()["activation_offload"]
    with pytest.raises(ValueError, match="activation_offload"):
        Scenario.model_validate({"model": TINY, "training": {"activation_offload": True}})


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

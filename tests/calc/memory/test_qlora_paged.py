"""bitsandbytes' optimizers: blockwise 8-bit states exactly as bitsandbytes allocates them, and the paged
optimizers' large states in CUDA managed memory (in the device total, not in peak allocated; on CPU ordinary
tensors, as the committed CPU records measure)."""

from __future__ import annotations

from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.precision import BNB_PAGED_MIN_ELEMENTS, bnb_state_bytes, paged_state_bytes
from calc.contract.scenario import Optimizer, Scenario
from calc.memory.estimate import estimate

MODEL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4}


def _est(optimizer: str, target: str = "cuda", **training):
    sc = Scenario.model_validate({"model": MODEL, "hardware": {"gpu": "a100-80gb"}, "training": {
        "micro_batch_size": 1, "seq_len": 256, "precision": "bf16", "optimizer": optimizer, **training}})
    return estimate(sc, target)


@pytest.mark.parametrize(("paged", "plain"), [("paged-adamw-8bit", "adamw-8bit")])
def test_paged_states_leave_peak_allocated_for_the_device_total(paged, plain):
    p, q = _est(paged), _est(plain)
    managed = p.device_total_bytes.managed_bytes
    assert managed > 0
    assert q.peak_allocated_bytes - p.peak_allocated_bytes == managed  # the states are alive at either peak
    reserve_change = q.device_total_bytes.reserve_expected_bytes - p.device_total_bytes.reserve_expected_bytes
    assert q.device_total_bytes.expected - p.device_total_bytes.expected == reserve_change  # managed is not cached


def test_on_cpu_paged_states_are_ordinary_tensors():
    assert _est("paged-adamw-8bit", "cpu").peak_allocated_bytes == _est("adamw-8bit", "cpu").peak_allocated_bytes
    assert _est("paged-adamw", "cpu").device_total_bytes.managed_bytes == 0


def test_small_lora_tensors_stay_in_device_memory():
    """get_state_buffer pages only tensors of 1e5 elements or more: rank-8 adapters on a 512-wide model are smaller."""
    est = _est("paged-adamw", lora={"rank": 8, "base_weights": "nf4"})
    assert est.device_total_bytes.managed_bytes == 0
    states = next(c for c in est.components if c.key == "optimizer_states")
    assert states.bytes > 0 and "CUDA" in states.source


def test_paged_states_are_shown_as_modelled_from_source():
    est = _est("paged-adamw")
    states = next(c for c in est.components if c.key == "optimizer_states")
    assert "modelled from bitsandbytes' source, CUDA only" in states.source


shapes_st = st.lists(st.tuples(st.lists(st.integers(1, 700), min_size=1, max_size=2).map(tuple),
                               st.integers(1, 3)), min_size=1, max_size=6)


@given(shapes=shapes_st)
@settings(max_examples=100, deadline=None)
def test_paged_bytes_are_the_large_tensors_states(shapes):
    for opt in (Optimizer.paged_adamw, Optimizer.paged_adamw_8bit):
        paged = paged_state_bytes(opt, shapes)
        assert 0 <= paged <= bnb_state_bytes(opt, shapes)
        large = [(s, c) for s, c in shapes if prod(s) >= BNB_PAGED_MIN_ELEMENTS]
        assert paged == paged_state_bytes(opt, large)
        assert (paged > 0) == bool(large)
    assert paged_state_bytes(Optimizer.adamw_8bit, shapes) == 0


def _real_state_bytes(cls, shapes) -> int:
    torch = pytest.importorskip("torch")
    from measure.runner import unique_storage_bytes

    params = [torch.nn.Parameter(torch.randn(*s)) for s, c in shapes for _ in range(c)]
    opt = cls(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return unique_storage_bytes([v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
def test_bnb_state_bytes_is_what_bitsandbytes_allocates():
    bnb = pytest.importorskip("bitsandbytes")
    shapes = [((300, 400), 1), ((100,), 2), ((4096,), 1), ((4095,), 1), ((3, 5000), 2)]
    for opt, cls in ((Optimizer.adamw_8bit, bnb.optim.AdamW8bit), (Optimizer.paged_adamw, bnb.optim.PagedAdamW),
                     (Optimizer.paged_adamw_8bit, bnb.optim.PagedAdamW8bit)):
        assert _real_state_bytes(cls, shapes) == bnb_state_bytes(opt, shapes), opt


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw", "paged-adamw-8bit"])
def test_exports_name_the_bitsandbytes_optimizer(optimizer):
    pytest.importorskip("torch")
    import bitsandbytes  # noqa: F401  (the class the export names must exist)
    from transformers.training_args import OptimizerNames

    from calc.contract.precision import BNB_OPTIMIZER_CLASSES
    from calc.export.deepspeed import ds_optimizer_name
    from calc.export.hf import trainer_arguments

    sc = Scenario.model_validate({"model": MODEL, "training": {"precision": "amp-bf16", "optimizer": optimizer}})
    assert trainer_arguments(sc)["optim"] in {o.value for o in OptimizerNames}
    assert hasattr(bitsandbytes.optim, BNB_OPTIMIZER_CLASSES[sc.training.optimizer])
    assert BNB_OPTIMIZER_CLASSES[sc.training.optimizer] in ds_optimizer_name(sc).render("en")

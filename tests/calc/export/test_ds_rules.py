"""calc.export.ds_rules against DeepSpeed itself: over a corpus of valid and invalid ds_configs, our verdict (accept or
refuse) equals `deepspeed.runtime.config.DeepSpeedConfig`'s at the same data-parallel world size, and the models
restating DeepSpeed's pydantic blocks have DeepSpeed's fields and aliases. A refused config is also refused by the
import (calc.export.ds_import), with one line."""

from __future__ import annotations

import copy
import math
import os
import types

import pytest

from calc.export import ds_rules
from calc.export.ds_import import scenario_from_ds_config

os.environ.setdefault("DS_ACCELERATOR", "cpu")

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}


def _with(**top):
    return {**BASE, **top}


def _zero(**z):
    return _with(zero_optimization={"stage": 2, **z})


# (config, data-parallel world size)
CORPUS: list[tuple[dict, int]] = [
    (BASE, 1),
    ({"train_batch_size": 8}, 1),
    ({"train_batch_size": 8}, 4),
    ({"train_batch_size": 8, "gradient_accumulation_steps": 2}, 2),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}, 2),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3}, 2),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 1),
    ({"train_batch_size": 6}, 4),
    ({"train_batch_size": 2}, 4),
    ({"gradient_accumulation_steps": 4}, 1),
    ({}, 1),
    ({"train_micro_batch_size_per_gpu": 0}, 1),
    ({"train_micro_batch_size_per_gpu": -1}, 1),
    ({"train_micro_batch_size_per_gpu": 2.0}, 1),
    ({"train_micro_batch_size_per_gpu": 2.5, "train_batch_size": 8}, 1),
    ({"train_micro_batch_size_per_gpu": "2"}, 1),
    ({"train_micro_batch_size_per_gpu": True}, 1),
    ({"train_micro_batch_size_per_gpu": [1]}, 1),
    ({"train_micro_batch_size_per_gpu": "auto"}, 1),
    (_zero(), 1),
    (_with(zero_optimization={"stage": 3}), 8),
    (_with(zero_optimization={"stage": 4}), 1),
    (_with(zero_optimization={"stage": -1}), 1),
    (_with(zero_optimization={"stage": "2"}), 1),
    (_with(zero_optimization={"stage": 2.0}), 1),
    (_with(zero_optimization={"stage": "auto"}), 1),
    (_with(zero_optimization={"stage": None}), 1),
    (_with(zero_optimization=True), 1),
    (_with(zero_optimization=False), 1),
    (_with(zero_optimization=None), 1),
    (_with(zero_optimization=[2]), 1),
    (_with(zero_optimization="2"), 1),
    (_zero(foo=1), 1),
    (_zero(stage3_prefetch_bucket_sizes=1), 1),
    (_zero(reduce_bucket_size=1e20), 1),
    (_zero(reduce_bucket_size=2**70), 1),
    (_zero(reduce_bucket_size=5e8), 1),
    (_zero(reduce_bucket_size="5e8"), 1),
    (_zero(reduce_bucket_size="500"), 1),
    (_zero(reduce_bucket_size=5.5), 1),
    (_zero(reduce_bucket_size=0), 1),
    (_zero(reduce_bucket_size=-5), 1),
    (_zero(reduce_bucket_size=float("nan")), 1),
    (_zero(reduce_bucket_size="auto"), 1),
    (_zero(reduce_bucket_size=None), 1),
    (_zero(allgather_bucket_size=0), 1),
    (_zero(allgather_bucket_size=-1), 1),
    (_zero(stage3_prefetch_bucket_size=-1), 1),
    (_zero(stage3_param_persistence_threshold=1e5), 1),
    (_zero(prefetch_bucket_size=5), 1),
    (_zero(stage3_max_live_parameters=1e9, stage3_max_reuse_distance=1e9), 1),
    (_zero(sub_group_size=-1), 1),
    (_zero(overlap_comm="yes"), 1),
    (_zero(overlap_comm="maybe"), 1),
    (_zero(overlap_comm=1), 1),
    (_zero(overlap_comm=2), 1),
    (_zero(contiguous_gradients=None), 1),
    (_zero(compute_grad_norm=False), 1),
    (_with(zero_optimization={"stage": 3, "compute_grad_norm": False}), 1),
    (_zero(offload_optimizer={"device": "cpu", "pin_memory": True}), 1),
    (_zero(offload_optimizer={"device": "gpu"}), 1),
    (_zero(offload_optimizer={"device": "auto"}), 1),
    (_zero(offload_optimizer={"device": "cpu", "bogus": 1}), 1),
    (_zero(offload_optimizer={"device": "cpu", "ratio": 0.5}), 1),
    (_with(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), 1),
    (_zero(offload_optimizer={"device": "cpu", "ratio": 1.5}), 1),
    (_zero(offload_optimizer={"device": "nvme", "nvme_path": "/local_nvme"}), 1),
    (_zero(offload_optimizer={"device": "nvme", "nvme_path": 5}), 1),
    (_zero(offload_optimizer="cpu"), 1),
    (_zero(offload_optimizer=None), 1),
    (_with(zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "buffer_count": -1}}), 1),
    (_with(zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "max_in_cpu": 1e9}}), 1),
    (_zero(cpu_offload=True), 1),
    (_zero(cpu_offload=True, offload_optimizer={"device": "cpu"}), 1),
    (_zero(cpu_offload_use_pin_memory=True, offload_optimizer={"device": "cpu"}), 1),
    (_zero(stage3_gather_fp16_weights_on_model_save=True, stage3_gather_16bit_weights_on_model_save=True), 1),
    (_zero(mics_shard_size=8), 1),
    (_zero(leaf_module={"classes": "x.Y"}), 1),
    (_zero(leaf_module={"classes": ["x.Y"], "other": 1}), 1),
    (_zero(leaf_module=[1]), 1),
    (_zero(zenflow={"topk_ratio": 0.2, "update_interval": 4}), 1),
    (_zero(zenflow={"topk_ratio": 1.2}), 1),
    (_zero(zenflow={"select_strategy": "sometimes"}), 1),
    (_zero(zenflow={"update_interval": 0}), 1),
    (_with(bf16={"enabled": True}), 1),
    (_with(bf16={"enabled": "auto"}), 1),
    (_with(bf16={"enabled": "true"}), 1),
    (_with(bf16={"enabled": "sometimes"}), 1),
    (_with(bf16={"enabled": True, "extra": 1}), 1),
    (_with(bf16=None, bfloat16={"enabled": True}), 1),
    (_with(bfloat16={"enabled": True, "x": 1}), 1),
    (_with(bf16=[True]), 1),
    (_with(bf16={"enabled": True}, fp16={"enabled": True}), 1),
    (_with(bf16={"enabled": True, "bf16_master_weights_and_grads": True}), 1),
    (_with(bf16={"enabled": True, "bf16_master_weights_and_grads": True}, zero_optimization={"stage": 1}), 1),
    (_with(bf16={"enabled": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 2}), 1),
    (_with(bf16={"enabled": True, "bf16_optimizer_states": True, "bf16_master_weights_and_grads": True},
           zero_optimization={"stage": 2}), 1),
    (_with(fp16={"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1}), 1),
    (_with(fp16={"enabled": True, "loss_scale": -1}), 1),
    (_with(fp16={"enabled": True, "loss_scale": True}), 1),
    (_with(fp16={"enabled": True, "loss_scale": "128"}), 1),
    (_with(fp16={"enabled": True, "loss_scale_window": 0}), 1),
    (_with(fp16={"enabled": False, "loss_scale_window": 0}), 1),
    (_with(fp16={"enabled": True, "min_loss_scale": 0.5}), 1),
    (_with(fp16={"enabled": True, "min_loss_scale": True}), 1),
    (_with(fp16={"enabled": True, "fp16_master_weights_and_grads": True}), 1),
    (_with(fp16=None), 1),
    (_with(fp16={"enabled": True, "initial_scale_power": "16"}), 1),
    (_with(fp16={"enabled": True, "hysteresis": 2.5}), 1),
    (_with(tensor_parallel={"autotp_size": 2}), 1),
    (_with(tensor_parallel={"autotp_size": "two"}), 1),
    (_with(tensor_parallel={"autotp_size": 2, "tp": {"tp_size": 2}}), 1),
    (_with(tensor_parallel={"autotp_size": 2, "tp": {"tp_sizes": 2}}), 1),
    (_with(tensor_parallel={"autotp_size": 2, "dtype": "bfloat16"}), 1),
    (_with(tensor_parallel={"autotp_size": 2, "dtype": "auto"}), 1),
    (_with(tensor_parallel={"autotp_size": 2, "vocab_parallel_ce_backend": "triton"}), 1),
    (_with(tensor_parallel={"autotp": 2}), 1),
    (_with(tensor_parallel=2), 1),
    (_with(optimizer={"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999]}}), 1),
    (_with(optimizer={"type": 5}), 1),
    (_with(optimizer={"type": "AdamW", "params": [1]}), 1),
    (_with(optimizer={"type": "AdamW", "params": {"max_grad_norm": "x"}}), 1),
    (_with(optimizer=["AdamW"]), 1),
    (_with(optimizer=None), 1),
    (_with(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}}), 1),
    (_with(scheduler="WarmupLR"), 1),
    (_with(communication_data_type="bf16"), 1),
    (_with(communication_data_type="int8"), 1),
    (_with(communication_data_type=16), 1),
    (_with(gradient_allreduce_op="SUM"), 1),
    (_with(gradient_allreduce_op="max"), 1),
    (_with(gradient_allreduce_op="sum", zero_optimization={"stage": 3}), 1),
    (_with(torch_autocast={"enabled": True, "dtype": "torch.bfloat16"}), 1),
    (_with(torch_autocast={"enabled": True, "dtype": "bf17"}), 1),
    (_with(torch_autocast={"enabled": True, "lower_precision_safe_modules": [1]}), 1),
    (_with(torch_autocast={"enabled": True, "lower_precision_safe_modules": 5}), 1),
    (_with(torch_autocast=True), 1),
    (_with(amp={"enabled": True}), 1),
    (_with(vocabulary_size=50257), 1),
    (_with(vocabulary_size=[1]), 1),
    (_with(wall_clock_breakdown=False, steps_per_print=2000, unknown_top_level=1), 1),
]


def _deepspeed_accepts(cfg: dict, world: int, monkeypatch: pytest.MonkeyPatch) -> bool:
    import deepspeed.runtime.config as ds_config

    fake = types.SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda *a, **k: world)
    monkeypatch.setattr(ds_config, "dist", fake)
    try:
        ds_config.DeepSpeedConfig(copy.deepcopy(cfg))
    except Exception:  # noqa: BLE001 - any refusal (ValidationError, AssertionError, TypeError, ...) is a refusal
        return False
    return True


def _name(case: tuple[dict, int]) -> str:
    return repr(case)[:90]


@pytest.mark.slow
def test_our_verdict_is_deepspeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    disagree = []
    for cfg, world in CORPUS:
        ours = ds_rules.deepspeed_problem(copy.deepcopy(cfg), world)
        theirs = _deepspeed_accepts(cfg, world, monkeypatch)
        if (ours is None) != theirs:
            disagree.append(f"{_name((cfg, world))}: DeepSpeed {'accepts' if theirs else 'refuses'}, ours: {ours}")
    assert not disagree, "\n".join(disagree)
    accepted = sum(ds_rules.deepspeed_problem(copy.deepcopy(c), w) is None for c, w in CORPUS)
    assert 20 < accepted < len(CORPUS) - 40  # the corpus holds both kinds


MIRRORS = {"deepspeed.runtime.zero.config:DeepSpeedZeroConfig": ds_rules.Zero,
           "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadParamConfig": ds_rules.OffloadParam,
           "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadOptimizerConfig": ds_rules.OffloadOptimizer,
           "deepspeed.runtime.zenflow.zenflow_config:ZenFlowConfig": ds_rules.ZenFlow,
           "deepspeed.runtime.zero.leaf_module_config:DeepSpeedZeroLeafModuleConfig": ds_rules.LeafModule,
           "deepspeed.runtime.precision_config:DeepSpeedBF16Config": ds_rules.BF16,
           "deepspeed.runtime.precision_config:DeepSpeedFP16Config": ds_rules.FP16,
           "deepspeed.runtime.tensor_parallel.config:TPTrainingConfig": ds_rules.TensorParallel,
           "deepspeed.runtime.tensor_parallel.config:TPConfig": ds_rules.TPConfig}


def _fields(model) -> dict[str, tuple]:
    return {name: (f.alias, repr(f.metadata)) for name, f in model.model_fields.items()}


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted(MIRRORS))
def test_models_have_deepspeeds_fields(where: str) -> None:
    """Same field names, aliases and bounds (ge/gt/le/lt): a DeepSpeed upgrade that adds a key fails here."""
    import importlib

    pytest.importorskip("deepspeed")
    module, name = where.split(":")
    theirs = getattr(importlib.import_module(module), name)
    assert _fields(MIRRORS[where]) == _fields(theirs)


@pytest.mark.slow
def test_removed_keys_are_deepspeeds() -> None:
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config

    assert set(ds_rules.REMOVED_KEYS) == set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(ds_rules.REMOVED_ZERO_KEYS) == set(ds_config._REMOVED_ZERO_CONFIG_KEYS)


def test_refused_configs_are_refused_by_the_import_in_one_line() -> None:
    """Every config the rules refuse (at one GPU) is refused by the import with a one-line message (an "auto" batch
    size is filled first, as the Trainer fills it: test_ds_auto)."""
    for cfg, world in CORPUS:
        if world != 1 or ds_rules.deepspeed_problem(copy.deepcopy(cfg), 1) is None or "auto" in repr(cfg):
            continue
        with pytest.raises(ValueError) as err:
            scenario_from_ds_config(copy.deepcopy(cfg), "gpt2", "rtx-4090")
        assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_nan_and_huge_buckets_are_named() -> None:
    problem = ds_rules.deepspeed_problem(_zero(reduce_bucket_size=1e20))
    assert problem is not None and "reduce_bucket_size" in problem
    problem = ds_rules.deepspeed_problem(_zero(foo=1))
    assert problem is not None and "zero_optimization.foo" in problem
    assert ds_rules.deepspeed_problem(_zero(reduce_bucket_size=math.inf)) is not None

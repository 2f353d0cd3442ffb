"""The "auto" values of an imported ds_config are filled as the Hugging Face Trainer fills them: transformers' own
HfTrainerDeepSpeedConfig (trainer_config_process + trainer_config_finalize) with the TrainingArguments the export writes
for the same scenario and a model of the same hidden size gives the same dict as calc.export.ds_auto.fill_auto. The
ds_configs of the Hugging Face DeepSpeed guide (ZeRO-2 and ZeRO-3, "auto" everywhere) import in one go."""

from __future__ import annotations

import copy
import types

import pytest

from calc.contract.scenario import Scenario
from calc.export import ExportOptions, import_ds_config, trainer_arguments
from calc.export.ds_auto import fill_auto

# https://huggingface.co/docs/transformers/deepspeed (ZeRO-2 and ZeRO-3 example configs)
_FP16 = {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
         "min_loss_scale": 1}
_OPTIMIZER = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
_SCHEDULER = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                             "warmup_num_steps": "auto"}}
_TOP = {"gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
HF_ZERO2 = {"fp16": _FP16, "bf16": {"enabled": "auto"}, "optimizer": _OPTIMIZER, "scheduler": _SCHEDULER,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                  "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                                  "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
            **_TOP}
HF_ZERO3 = {"fp16": _FP16, "bf16": {"enabled": "auto"}, "optimizer": _OPTIMIZER,
            "scheduler": {"type": "WarmupDecayLR", "params": {**_SCHEDULER["params"], "total_num_steps": "auto"}},
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                  "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                                  "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                                  "stage3_prefetch_bucket_size": "auto",
                                  "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                                  "stage3_max_reuse_distance": 1e9,
                                  "stage3_gather_16bit_weights_on_model_save": True},
            **_TOP}


def _scenario(gpus: str = "8x-a100-80gb", **training) -> Scenario:
    t = {"micro_batch_size": 4, "gradient_accumulation_steps": 8, "seq_len": 2048, "precision": "bf16-mixed",
         **training}
    return Scenario(model="llama-3.1-8b", hardware={"cluster": gpus}, training=t)


def _hf_resolution(cfg: dict, sc: Scenario, options: ExportOptions, world: int, steps: int) -> dict:
    """transformers' own filling, with a TrainingArguments built from the export's keywords."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    kw = {k: v for k, v in trainer_arguments(sc, options).items() if k != "deepspeed"}
    args = TrainingArguments(**{**kw, "bf16": False, "fp16": False, "use_cpu": True})  # flags set below: CPU-safe
    proxy = types.SimpleNamespace(**{name: getattr(args, name) for name in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm", "learning_rate", "adam_beta1",
        "adam_beta2", "adam_epsilon", "weight_decay", "save_on_each_node", "fp16_full_eval", "bf16_full_eval")},
        fp16=kw["fp16"], bf16=kw["bf16"], world_size=world, get_warmup_steps=args.get_warmup_steps)
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(cfg))
    try:
        hf.trainer_config_process(proxy)
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=sc.spec.hidden_size))
        hf.trainer_config_finalize(proxy, model, steps)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero2", "zero3"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed", "fp32"])
def test_filled_as_transformers_fills(name: str, precision: str) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("deepspeed")
    sc = _scenario(precision=precision, zero_stage=3 if name == "zero3" else 2)
    options = ExportOptions(learning_rate=2e-4, weight_decay=0.1, warmup_steps=30, total_num_steps=1000,
                            gradient_clipping=0.5, betas=(0.9, 0.95), eps=1e-6)
    cfg = HF_ZERO2 if name == "zero2" else HF_ZERO3
    ours, filled = fill_auto(cfg, trainer_arguments(sc, options), 8, sc.spec.hidden_size, 1000)
    theirs = _hf_resolution(cfg, sc, options, 8, 1000)
    assert ours == theirs
    assert {f.key for f in filled} >= {"train_batch_size", "bf16.enabled", "optimizer.params.lr"}


@pytest.mark.parametrize("cfg", [HF_ZERO2, HF_ZERO3], ids=["zero2", "zero3"])
def test_the_hugging_face_configs_import_in_one_go(cfg: dict) -> None:
    sc = _scenario()
    result = import_ds_config(cfg, sc)
    t = result.scenario.training
    assert (t.micro_batch_size, t.gradient_accumulation_steps, t.precision.value) == (4, 8, "bf16-mixed")
    assert t.zero_stage == cfg["zero_optimization"]["stage"] and t.offload_optimizer.value == "cpu"
    filled = {f.key: f.value for f in result.filled}
    assert filled["train_batch_size"] == 4 * 8 * 8 and filled["bf16.enabled"] is True
    assert filled["fp16.enabled"] is False and filled["gradient_clipping"] == 1.0
    hidden = sc.spec.hidden_size
    if cfg is HF_ZERO3:
        assert t.reduce_bucket_size == hidden**2 == filled["zero_optimization.reduce_bucket_size"]
        assert filled["zero_optimization.stage3_param_persistence_threshold"] == 10 * hidden
        assert any("total_num_steps" in str(n) for n in result.notes)  # left "auto": the run knows its steps
    else:
        assert t.reduce_bucket_size == 200_000_000 and "zero_optimization.reduce_bucket_size" not in filled
        assert any("allgather_bucket_size" in str(n) for n in result.notes)
    assert "auto" not in repr(result.config["zero_optimization"])


def test_written_values_are_kept_and_batch_follows_them() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
           "zero_optimization": {"stage": 1}}
    result = import_ds_config(cfg, _scenario("8x-a100-80gb"))
    assert (result.scenario.training.micro_batch_size, result.scenario.training.gradient_accumulation_steps) == (2, 8)
    assert result.config["train_batch_size"] == 2 * 8 * 8


def test_auto_in_a_deepspeed_block_falls_back_to_its_default() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": "auto", "overlap_comm": "auto"}}
    result = import_ds_config(cfg, _scenario("8x-a100-80gb"))
    assert result.scenario.training.zero_stage == 0  # DeepSpeed drops the "auto" and uses its default
    assert any("zero_optimization.stage" in str(n) for n in result.notes)

"""The "auto" values of a Hugging Face ds_config, filled the way the Trainer fills them, from the scenario.

The usual ds_config of the Hugging Face docs says "auto" for the batch sizes, gradient clipping, the optimizer's and
the scheduler's hyper-parameters, bf16/fp16 and the ZeRO buckets; the Trainer replaces each "auto" before DeepSpeed
reads the config: transformers 5.23, integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process
(from TrainingArguments) and trainer_config_finalize (from the model's hidden size and the number of training steps),
with accelerate's HfDeepSpeedConfig.find_config_node (a key whose block is absent is not filled). `fill_auto` does
the same with the TrainingArguments the export writes for the scenario (calc.export.hf.trainer_arguments), so a
config imported on the Export page and the train.py exported there agree. Only "auto" is replaced: a value the user
wrote is kept (where it differs from TrainingArguments the Trainer refuses to start; the import estimates the config
as written). train_batch_size is micro-batch x accumulation x the data-parallel ranks, the size DeepSpeed checks it
against (the Trainer multiplies by all ranks, the same without tensor or pipeline parallelism).
tests/calc/export/test_ds_auto.py compares the result with HfTrainerDeepSpeedConfig's own.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from calc.contract.i18n import T_, Text

AUTO = "auto"


class Filled(BaseModel):
    """One "auto" replaced: the dotted key, the value written there and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    value: Any
    source: Text


def _node(cfg: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    """accelerate's find_config_node: the block holding the last key, None where a block on the way is absent."""
    *path, key = dotted.split(".")
    node: Any = cfg
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, key
    return (node if isinstance(node, dict) else None), key


def is_auto(cfg: dict[str, Any], dotted: str) -> bool:
    node, key = _node(cfg, dotted)
    return node is not None and node.get(key) == AUTO


def _arg(name: str) -> Text:
    return T_("TrainingArguments.{arg} of this scenario", arg=name)


def fill_auto(ds_config: dict[str, Any], args: dict[str, Any], data_parallel: int, hidden_size: int,
              num_training_steps: int | None = None) -> tuple[dict[str, Any], list[Filled]]:
    """(a copy of the config with its "auto" values filled, what was filled). `args` are TrainingArguments keywords
    (per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm, learning_rate, adam_beta1/2,
    adam_epsilon, weight_decay, warmup_steps, bf16, fp16); `num_training_steps` None leaves
    scheduler.params.total_num_steps as it is (the Trainer knows it from max_steps or the data set)."""
    cfg = copy.deepcopy(ds_config)
    filled: list[Filled] = []

    def fill(dotted: str, value: Any, source: Text) -> Any:
        node, key = _node(cfg, dotted)
        if node is not None and node.get(key) == AUTO:
            node[key] = value
            filled.append(Filled(key=dotted, value=value, source=source))
        return node.get(key) if node is not None else None

    micro = fill("train_micro_batch_size_per_gpu", args["per_device_train_batch_size"],
                 _arg("per_device_train_batch_size"))
    accum = fill("gradient_accumulation_steps", args["gradient_accumulation_steps"], _arg("gradient_accumulation_steps"))
    micro = args["per_device_train_batch_size"] if micro is None else micro
    accum = args["gradient_accumulation_steps"] if accum is None else accum
    if isinstance(micro, int) and isinstance(accum, int):  # a wrong type is the validation's to name
        fill("train_batch_size", data_parallel * micro * accum,
             T_("micro-batch x accumulation x {dp} data-parallel ranks", dp=data_parallel))
    fill("gradient_clipping", args["max_grad_norm"], _arg("max_grad_norm"))
    fill("optimizer.params.lr", args["learning_rate"], _arg("learning_rate"))
    fill("optimizer.params.betas", [args["adam_beta1"], args["adam_beta2"]], _arg("adam_beta1, adam_beta2"))
    fill("optimizer.params.eps", args["adam_epsilon"], _arg("adam_epsilon"))
    fill("optimizer.params.weight_decay", args["weight_decay"], _arg("weight_decay"))
    fill("scheduler.params.warmup_min_lr", 0, T_("0, as the Trainer writes it"))
    fill("scheduler.params.warmup_max_lr", args["learning_rate"], _arg("learning_rate"))
    fill("fp16.enabled", bool(args.get("fp16")), _arg("fp16"))
    fill("bf16.enabled", bool(args.get("bf16")), _arg("bf16"))
    _fill_buckets(cfg, fill, hidden_size)
    if num_training_steps is not None:
        fill("scheduler.params.total_num_steps", num_training_steps, _arg("max_steps"))
    fill("scheduler.params.warmup_num_steps", max(1, _warmup_steps(args["warmup_steps"], num_training_steps)),
         _arg("warmup_steps"))
    return cfg, filled


def _fill_buckets(cfg: dict[str, Any], fill: Any, hidden: int) -> None:
    """trainer_config_finalize: reduce_bucket_size = hidden^2; at ZeRO-3 stage3_prefetch_bucket_size =
    int(0.9 hidden^2) and stage3_param_persistence_threshold = 10 hidden."""
    fill("zero_optimization.reduce_bucket_size", hidden * hidden, T_("hidden size {hidden} squared", hidden=hidden))
    node, _ = _node(cfg, "zero_optimization.stage")
    if node is not None and node.get("stage") == 3:
        fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden),
             T_("0.9 x hidden size {hidden} squared", hidden=hidden))
        fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden,
             T_("10 x hidden size {hidden}", hidden=hidden))


def _warmup_steps(warmup: int | float, num_training_steps: int | None) -> int:
    """TrainingArguments.get_warmup_steps: an integer count, or a ratio of the training steps (0 without them)."""
    if warmup >= 1:
        return int(warmup)
    return math.ceil((num_training_steps or 0) * warmup)


def auto_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys still "auto" (DeepSpeed drops them and uses its defaults)."""
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in auto_keys(v, f"{prefix}{key}.")] + \
            [f"{prefix}{key}" for key, v in value.items() if v == AUTO]
    return []


def drop_auto(cfg: dict[str, Any], blocks: tuple[str, ...]) -> dict[str, Any]:
    """The config as DeepSpeed reads it: an "auto" left in a block DeepSpeed parses with its pydantic models is
    dropped there, so DeepSpeed's default applies (DeepSpeedConfigModel.__init__, non-strict mode)."""
    def drop(value: Any) -> Any:
        return {k: drop(v) for k, v in value.items() if v != AUTO} if isinstance(value, dict) else value

    return {k: drop(v) if k in blocks else v for k, v in cfg.items()}

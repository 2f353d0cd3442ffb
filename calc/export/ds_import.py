"""The other way round: an existing ds_config.json -> Scenario, so a user can ask "will my config fit?".

Three steps, each one function: the "auto" values are filled from the scenario as the Hugging Face Trainer fills them
(calc.export.ds_auto); the config must pass DeepSpeed's own config validation (calc.export.ds_rules: unknown keys,
types, bounds, the batch arithmetic); then what the estimate models is read: precision (bf16 / fp16 / torch_autocast
blocks), train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps (DeepSpeed's rule: train =
micro x accumulation x data-parallel size; any two give the third), zero_optimization.stage, reduce_bucket_size and
its offload_optimizer / offload_param devices (offload_param only at stage 3: below it DeepSpeed ignores it),
activation_checkpointing (number_checkpoints -> 1 in k layers), optimizer.type, tensor_parallel.autotp_size and
pipeline.stages. Everything else a ds_config may hold (schedulers, logging) does not change what the estimate models;
other ZeRO bucket sizes that differ from calc.contract.parallel's are notes in the result, which the Export page and
`python -m calc import-deepspeed` show beside what was filled. A bad value raises ValueError naming the key.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.boundary import excerpt, require
from calc.contract.i18n import T_, Text
from calc.contract.parallel import (
    ALLGATHER_BUCKET_ELEMENTS,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_ELEMENTS,
)
from calc.contract.presets import cluster_presets, gpu_presets
from calc.contract.scenario import (
    Checkpointing,
    HardwareConfig,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Scenario,
)
from calc.export.deepspeed import ExportOptions
from calc.export.ds_auto import Filled, auto_keys, drop_auto, fill_auto
from calc.export.ds_rules import PYDANTIC_BLOCKS, deepspeed_problem
from calc.export.hf import trainer_arguments

_ASSUMED = {
    "allgather_bucket_size": ALLGATHER_BUCKET_ELEMENTS,
    "stage3_prefetch_bucket_size": STAGE3_PREFETCH_ELEMENTS,
    "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
    "stage3_param_persistence_threshold": STAGE3_PARAM_PERSISTENCE_THRESHOLD,
}


def _int(cfg: dict[str, Any], key: str, where: str, lo: int = 1) -> int | None:
    if key not in cfg or cfg[key] is None:
        return None
    v = cfg[key]
    if v == "auto":
        raise ValueError(f"{where}{key} is 'auto' (filled in by the Hugging Face Trainer integration); "
                         "give a number to estimate this config")
    integral = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not integral or v < lo:
        raise ValueError(f"{where}{key} must be an integer >= {lo}, got {excerpt(v)}")
    return int(v)


def _block(cfg: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    v = cfg.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{where}{key} must be an object, got {type(v).__name__}")
    return v


def _flag(block: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    """A boolean setting; "false" (a string) is an error, not true."""
    value = block.get(key)
    return default if value is None else require(value, bool, f"{where}{key}")


def _enabled(block: dict[str, Any], where: str) -> bool:
    v = block.get("enabled", False)
    if v == "auto":
        raise ValueError(f"{where}.enabled is 'auto'; set true or false")
    if not isinstance(v, bool):
        raise ValueError(f"{where}.enabled must be true or false, got {excerpt(v)}")
    return v


def _precision(cfg: dict[str, Any]) -> Precision:
    bf16 = _block(cfg, "bf16") or _block(cfg, "bfloat16")
    fp16 = _block(cfg, "fp16")
    auto = _block(cfg, "torch_autocast")
    on = {k: _enabled(b, k) for k, b in (("bf16", bf16), ("fp16", fp16), ("torch_autocast", auto)) if b}
    enabled = [k for k, v in on.items() if v]
    if len(enabled) > 1:
        raise ValueError(f"{' and '.join(enabled)} are both enabled; DeepSpeed allows one precision mode")
    if not enabled:
        return Precision.fp32
    if enabled[0] == "bf16":
        pure = _flag(bf16, "bf16_master_weights_and_grads", "bf16.") and _flag(bf16, "bf16_optimizer_states", "bf16.")
        return Precision.bf16 if pure else Precision.bf16_mixed
    if enabled[0] == "fp16":
        return Precision.fp16_mixed
    dtype = auto.get("dtype", "bfloat16")
    dtype = dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype
    if dtype in ("bfloat16", "bf16"):
        return Precision.amp_bf16
    if dtype in ("float16", "fp16", "half"):
        return Precision.amp_fp16
    raise ValueError(f"torch_autocast.dtype must be bfloat16 or float16, got {excerpt(auto.get('dtype'))}")


def _offload(z: dict[str, Any], key: str) -> Offload:
    b = _block(z, key, "zero_optimization.")
    dev = b.get("device", "none")
    if dev is None:
        dev = "none"
    if not isinstance(dev, str) or dev not in ("none", "cpu", "nvme"):
        raise ValueError(f"zero_optimization.{key}.device must be none, cpu or nvme, got {excerpt(dev)}")
    if dev == "nvme" and not b.get("nvme_path"):
        raise ValueError(f"zero_optimization.{key}.nvme_path is required with device nvme")
    return Offload(dev)


def _optimizer(cfg: dict[str, Any]) -> Optimizer | None:
    o = _block(cfg, "optimizer")
    if not o:
        return None
    typ = o.get("type")
    if not isinstance(typ, str):
        raise ValueError(f"optimizer.type must be a string, got {excerpt(typ)}")
    params = _block(o, "params", "optimizer.")
    name = typ.lower()
    if name == "adamw":
        return Optimizer.adamw
    if name == "adam":
        return Optimizer.adamw if _flag(params, "adam_w_mode", "optimizer.params.", default=True) else Optimizer.adam
    if name == "sgd":
        momentum = require(params.get("momentum", 0), (int, float), "optimizer.params.momentum")
        return Optimizer.sgd_momentum if momentum else Optimizer.sgd
    if name == "adafactor":
        return Optimizer.adafactor
    raise ValueError(f"optimizer.type {excerpt(typ)} is not modelled (supported: AdamW, Adam, SGD, Adafactor; "
                     "for bitsandbytes AdamW8bit pass optimizer='adamw-8bit')")


def _optimizer_impl(cfg: dict[str, Any], offload: Offload) -> OptimizerImpl | None:
    """Adam/AdamW: torch_adam runs torch.optim's (foreach unless foreach is false); otherwise DeepSpeed's
    FusedAdam, which has no temporaries like torch's fused. Offloaded: DeepSpeedCPUAdam (impl unused)."""
    o = _block(cfg, "optimizer")
    if str(o.get("type", "")).lower() not in ("adam", "adamw") or offload != Offload.none:
        return None
    params = o.get("params") or {}
    if params.get("torch_adam"):
        return OptimizerImpl.for_loop if params.get("foreach") is False else OptimizerImpl.foreach
    return OptimizerImpl.fused


def _every_from_checkpoints(n: int, layers: int) -> int:
    """Smallest k with ceil(L / k) == n (the exporter writes n = ceil(L / k))."""
    for k in range(1, layers + 1):
        if -(-layers // k) == n:
            return k
    return max(1, round(layers / n))


def _hardware(hardware: HardwareConfig | dict[str, Any] | str) -> HardwareConfig:
    if isinstance(hardware, HardwareConfig):
        return hardware
    if isinstance(hardware, str):
        if hardware in cluster_presets():
            return HardwareConfig(cluster=hardware)
        if hardware in gpu_presets():
            return HardwareConfig(gpu=hardware)
        raise ValueError(f"unknown hardware {excerpt(hardware)}: give a cluster or GPU preset id, or a hardware object")
    return HardwareConfig.model_validate(hardware)


class DsImport(BaseModel):
    """A ds_config read back: the scenario it describes, the config as DeepSpeed will read it ("auto" filled as the
    Trainer fills it), what was filled, and the notes a page or the CLI shows beside the estimate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: Scenario
    config: dict[str, Any]
    filled: list[Filled] = Field(default_factory=list)
    notes: list[Text] = Field(default_factory=list)


def import_ds_config(ds_config: dict[str, Any], base: Scenario, options: ExportOptions | None = None,
                     **training: Any) -> DsImport:
    """Read `ds_config` for `base`'s model, hardware and sequence length. "auto" values are filled from `base` and
    `options` as the Hugging Face Trainer fills them (calc.export.ds_auto); the result must pass DeepSpeed's own
    config validation (calc.export.ds_rules) and the estimate's. `training` overrides or adds TrainingConfig fields
    the config cannot carry (attention, lora, optimizer='adamw-8bit', activation_checkpointing='selective', ...).
    ValueError (one line, naming the key) otherwise."""
    if not isinstance(ds_config, dict):
        raise ValueError(f"ds_config must be a JSON object, got {type(ds_config).__name__}")
    hw = base.hardware
    tp, pp = _parallel_sizes(ds_config)
    gpus = _resolved_gpus(hw)
    if gpus % (tp * pp):
        raise ValueError(f"tensor_parallel.autotp_size x pipeline.stages = {tp * pp} does not divide the "
                         f"{gpus} GPUs")
    dp = gpus // (tp * pp)
    train_base = base if base.mode == Mode.train else base.variant(mode=Mode.train)
    cfg, filled = fill_auto(ds_config, trainer_arguments(train_base, options), dp, base.spec.hidden_size,
                            (options or ExportOptions()).total_num_steps)
    left = auto_keys(cfg)
    read = drop_auto(cfg, PYDANTIC_BLOCKS)
    fields = _training_fields(read, dp, base.spec.num_layers)
    problem = deepspeed_problem(cfg, dp)
    if problem is not None:
        raise ValueError(f"DeepSpeed refuses this config: {problem}")
    fields.update(seq_len=base.training.seq_len, tensor_parallel=tp, pipeline_parallel=pp)
    fields.update(training)
    sc = Scenario.model_validate({"model": base.model, "hardware": hw.model_dump(exclude_none=True),
                                  "training": fields})
    notes = _bucket_notes(_block(read, "zero_optimization"))
    if left:
        notes.append(T_("Left \"auto\" (not filled by the Trainer; DeepSpeed uses its defaults): {keys}",
                        keys=", ".join(k if k.isprintable() and len(k) < 80 else excerpt(k, 80) for k in left)))
    return DsImport(scenario=sc, config=cfg, filled=filled, notes=notes)


def base_scenario(model: str | dict[str, Any], hardware: HardwareConfig | dict[str, Any] | str,
                  seq_len: int | None = None) -> Scenario:
    """The default training scenario of `model` on `hardware` (what fills "auto" when no scenario is given); no
    seq_len: the scenario's default for that model (2048, or a shorter learned position table)."""
    training = {} if seq_len is None else {"seq_len": seq_len}
    return Scenario.model_validate({"model": model, "hardware": _hardware(hardware).model_dump(exclude_none=True),
                                    "training": training})


def scenario_from_ds_config(ds_config: dict[str, Any], model: str | dict[str, Any],
                            hardware: HardwareConfig | dict[str, Any] | str, *, seq_len: int | None = None,
                            **training: Any) -> Scenario:
    """The Scenario a ds_config describes on `hardware` for `model` (import_ds_config over base_scenario)."""
    return import_ds_config(ds_config, base_scenario(model, hardware, seq_len), **training).scenario


def _parallel_sizes(cfg: dict[str, Any]) -> tuple[int, int]:
    """(autotp_size or 1, pipeline.stages or 1): "auto" is DeepSpeed's default (no tensor parallelism; the stages of a
    PipelineModule)."""
    tp_block = {k: v for k, v in _block(cfg, "tensor_parallel").items() if v != "auto"}
    tp = _int(tp_block, "autotp_size", "tensor_parallel.", lo=0) or 1
    pp_raw = _block(cfg, "pipeline").get("stages", "auto")
    pp = 1 if pp_raw == "auto" else _int({"stages": pp_raw}, "stages", "pipeline.")
    return tp, pp or 1


def _training_fields(cfg: dict[str, Any], dp: int, num_layers: int) -> dict[str, Any]:
    """TrainingConfig fields from the config as DeepSpeed reads it (its remaining "auto" values dropped)."""
    z = _block(cfg, "zero_optimization")
    stage = _int(z, "stage", "zero_optimization.", lo=0)
    stage = 0 if stage is None else stage
    if stage > 3:
        raise ValueError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
    off_opt = _offload(z, "offload_optimizer")
    if z.get("cpu_offload") is True and off_opt == Offload.none:
        off_opt = Offload.cpu  # the pre-0.3.15 spelling
    off_par = _offload(z, "offload_param")
    if off_par != Offload.none and stage != 3:
        raise ValueError(f"zero_optimization.offload_param needs stage 3 (got stage {stage}): DeepSpeed's stage "
                         f"{stage} ignores it")
    if off_opt != Offload.none and stage == 0:
        raise ValueError("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (got stage 0)")
    mb, ga = _batch(cfg, dp)
    fields: dict[str, Any] = dict(micro_batch_size=mb, gradient_accumulation_steps=ga, precision=_precision(cfg),
                                  zero_stage=stage, offload_optimizer=off_opt, offload_params=off_par)
    if "reduce_bucket_size" in z:
        fields["reduce_bucket_size"] = _int(z, "reduce_bucket_size", "zero_optimization.")
    opt = _optimizer(cfg)
    if opt is not None:
        fields["optimizer"] = opt
        impl = _optimizer_impl(cfg, off_opt)
        if impl is not None:
            fields["optimizer_impl"] = impl
    ac = _block(cfg, "activation_checkpointing")
    if ac:
        fields["activation_checkpointing"] = Checkpointing.full
        n = _int(ac, "number_checkpoints", "activation_checkpointing.")
        if n is not None:
            fields["checkpoint_every"] = _every_from_checkpoints(n, num_layers)
    return fields


def _bucket_notes(z: dict[str, Any]) -> list[Text]:
    """The other ZeRO buffer sizes the estimate assumes at DeepSpeed's defaults: one note each that differs."""
    return [T_("zero_optimization.{key} = {value}; the estimate assumes DeepSpeed's default {assumed}", key=key,
               value=excerpt(z[key]), assumed=f"{assumed:,}")
            for key, assumed in _ASSUMED.items() if key in z and z[key] != assumed]


def _resolved_gpus(hw: HardwareConfig) -> int:
    from calc.contract.presets import resolve_hardware

    return resolve_hardware(hw).num_gpus


def _batch(cfg: dict[str, Any], dp: int) -> tuple[int, int]:
    """DeepSpeed's _set_batch_related_parameters + _batch_assertion, with errors naming the key."""
    tb = _int(cfg, "train_batch_size", "")
    mb = _int(cfg, "train_micro_batch_size_per_gpu", "")
    ga = _int(cfg, "gradient_accumulation_steps", "")
    if tb is None and mb is None:
        raise ValueError("train_batch_size or train_micro_batch_size_per_gpu is required")
    if mb is None:
        assert tb is not None
        ga = ga or 1
        if tb % (ga * dp):
            raise ValueError(f"train_batch_size {tb} is not divisible by gradient_accumulation_steps {ga} x "
                             f"data-parallel size {dp}")
        mb = tb // (ga * dp)
    elif ga is None:
        if tb is None:
            ga = 1
        elif tb % (mb * dp):
            raise ValueError(f"train_batch_size {tb} is not divisible by train_micro_batch_size_per_gpu {mb} x "
                             f"data-parallel size {dp}")
        else:
            ga = tb // (mb * dp)
    if tb is not None and tb != mb * ga * dp:
        raise ValueError(f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
                         f"gradient_accumulation_steps {ga} x data-parallel size {dp}")
    if mb < 1 or ga < 1:
        raise ValueError(f"train_batch_size {tb} is smaller than the {dp} data-parallel ranks")
    return mb, ga

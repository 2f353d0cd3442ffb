"""DeepSpeed's own config validation, written out for a ds_config that is read back (calc.export.ds_import): a
config is imported only if `deepspeed.runtime.config.DeepSpeedConfig` (DeepSpeed 0.19.8) would accept it. The hosted
app has no DeepSpeed, so the rules are restated here from its source:

- zero_optimization, fp16, bf16 and tensor_parallel are pydantic models in DeepSpeed (runtime/zero/config.py
  DeepSpeedZeroConfig with runtime/zero/offload_config.py, leaf_module_config.py and runtime/zenflow/zenflow_config.py;
  runtime/precision_config.py DeepSpeedFP16Config / DeepSpeedBF16Config; runtime/tensor_parallel/config.py
  TPTrainingConfig). They forbid unknown keys (runtime/config_utils.py DeepSpeedConfigModel, extra="forbid") and
  validate in pydantic's lax mode ("500" is an integer, 5e8 is, 5.5 and 1e20 are not; "yes" is true). The models below
  have the same fields, aliases, types, bounds and validators; DeepSpeedConfigModel.__init__ drops "auto" values
  (DeepSpeed then uses its default), and so do they.
- DeepSpeedConfig.__init__ / _initialize_params / _configure_train_batch_size / _do_error_check (runtime/config.py):
  removed keys (nebula, amp, ... and zero_optimization.mics_*), the batch arithmetic at the data-parallel world size,
  fp16 and bf16 not both enabled, communication_data_type, gradient_allreduce_op, torch_autocast.dtype, an optimizer
  or scheduler block that is an object, and the bf16/fp16 master-weight options only with ZeRO 1-3.

The other sections (monitor, comms_logger, compile, aio, checkpoint, data_types, expert_parallel, ...) do not change the
estimate and are not checked here: DeepSpeed checks them when it starts. tests/calc/export/test_ds_rules.py runs
DeepSpeed's DeepSpeedConfig over a corpus of valid and invalid configs and asserts this module's verdict equals it for
every one, and that the models' fields are DeepSpeed's.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from calc.contract.boundary import excerpt, one_line, short

INT64_MAX = 2**63 - 1  # pydantic refuses a float integer past this ("exceeded maximum size"), as DeepSpeed sees it


class _Model(BaseModel):
    """DeepSpeedConfigModel's settings (runtime/config_utils.py). Its __init__ drops the block's "auto" values first
    (non-strict mode); pydantic calls that __init__ for the nested blocks too, so every level drops them."""

    model_config = ConfigDict(validate_default=True, validate_assignment=True, use_enum_values=True,
                              populate_by_name=True, extra="forbid", arbitrary_types_allowed=True,
                              protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _drop_auto(cls, values: Any) -> Any:
        return {k: v for k, v in values.items() if v != "auto"} if isinstance(values, dict) else values


# ---- zero_optimization (runtime/zero/*.py) -----------------------------------------------------

class ZeroStage(int, Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


class OffloadDevice(str, Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadParam(_Model):
    device: OffloadDevice = OffloadDevice.none
    nvme_path: Path | None = None
    buffer_count: int = Field(5, ge=0)
    buffer_size: int = Field(10**8, ge=0)
    max_in_cpu: int = Field(10**9, ge=0)
    pin_memory: bool = True


class OffloadOptimizer(_Model):
    device: OffloadDevice = OffloadDevice.none
    nvme_path: Path | None = None
    buffer_count: int = Field(4, ge=0)
    pin_memory: bool = True
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    ratio: float = Field(1.0, ge=0.0, le=1.0)
    super_offload: bool = False
    cpuadam_cores_perc: float = Field(0.8, ge=0.0, le=1.0)


class ZenFlow(_Model):
    topk_ratio: float = Field(0.1, gt=0.0, lt=1.0)
    select_strategy: str = "auto"
    select_interval: str | int = "auto"
    update_interval: str | int = "auto"
    overlap_step: bool = False
    offload: bool = False
    auto_ratio: float = Field(0.99, ge=0.0, le=1.0)
    full_warm_up_rounds: int = 0
    pt_reserved_cores_perc: float = Field(0.5, ge=0.0, le=1.0)
    steps_per_epoch: int | None = None

    @model_validator(mode="after")
    def _fields(self) -> ZenFlow:
        if self.select_strategy not in ("auto", "step", "epoch"):
            raise ValueError('select_strategy must be one of "auto", "step", or "epoch"')
        for name in ("select_interval", "update_interval"):
            if isinstance(getattr(self, name), str) and getattr(self, name) != "auto":
                raise ValueError(f'If {name} is a string, it must be "auto"')
        if isinstance(self.update_interval, int) and self.update_interval < 1:
            raise ValueError("If update_interval is a number, it must be at least 1")
        return self


class LeafModule(_Model):
    classes: list[str] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    name_suffixes: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _containers(cls, values: Any) -> Any:
        if values is None:
            return {}
        if not isinstance(values, dict):
            raise ValueError("leaf_module configuration must be a mapping of fields to values")
        return {k: [v] if k in ("classes", "names", "name_suffixes") and isinstance(v, str) else v
                for k, v in values.items()}


# deprecated key -> the field it sets (DeepSpeedConfigModel._process_deprecated_field: giving both is an error)
ZERO_DEPRECATED = {"cpu_offload_param": "offload_param", "cpu_offload": "offload_optimizer",
                   "stage3_gather_fp16_weights_on_model_save": "gather_16bit_weights_on_model_save"}


class Zero(_Model):
    """DeepSpeedZeroConfig: the same fields, defaults and checks."""

    stage: ZeroStage = ZeroStage.disabled
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = Field(5 * 10**8, gt=0)
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: int = Field(5 * 10**8, ge=0)
    overlap_comm: bool | None = None
    compute_grad_norm: bool = True
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False
    offload_param: OffloadParam | None = None
    offload_optimizer: OffloadOptimizer | None = None
    zenflow: ZenFlow | None = None
    sub_group_size: int = Field(10**9, ge=0)
    cpu_offload_param: bool | None = None
    cpu_offload_use_pin_memory: bool | None = None
    cpu_offload: bool | None = None
    prefetch_bucket_size: int = Field(5 * 10**7, ge=0, alias="stage3_prefetch_bucket_size")
    param_persistence_threshold: int = Field(10**5, ge=0, alias="stage3_param_persistence_threshold")
    model_persistence_threshold: int = Field(INT64_MAX, ge=0, alias="stage3_model_persistence_threshold")
    max_live_parameters: int = Field(10**9, ge=0, alias="stage3_max_live_parameters")
    max_reuse_distance: int = Field(10**9, ge=0, alias="stage3_max_reuse_distance")
    gather_16bit_weights_on_model_save: bool = Field(False, alias="stage3_gather_16bit_weights_on_model_save")
    module_granularity_threshold: int = Field(0, alias="stage3_module_granularity_threshold")
    use_all_reduce_for_fetch_params: bool = Field(False, alias="stage3_use_all_reduce_for_fetch_params")
    allgather_sequential: bool = Field(False, alias="stage3_allgather_sequential")
    stage3_gather_fp16_weights_on_model_save: bool = False
    ignore_unused_parameters: bool = True
    legacy_stage1: bool = False
    round_robin_gradients: bool = False
    parameter_alignment: bool = False
    zero_hpz_partition_size: int = Field(1, ge=0)
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    memory_efficient_linear: bool = True
    pipeline_loading_checkpoint: bool = False
    override_module_apply: bool = True
    log_trace_cache_warnings: bool = False
    enable_sanity_checks: bool = False
    save_muon_momentum_buffer_in_memory: bool = False
    leaf_module: LeafModule = Field(default_factory=LeafModule)

    @model_validator(mode="after")
    def _stage_rules(self) -> Zero:
        if not self.compute_grad_norm and self.stage not in (1, 2):
            raise ValueError("compute_grad_norm=false is supported only with ZeRO Stage 1 or 2")
        if self.offload_optimizer is not None and self.offload_optimizer.ratio < 1.0 and self.stage != 3:
            raise ValueError("Partial offloading only supported for ZeRO Stage 3.")
        for old, new in ZERO_DEPRECATED.items():
            if old in self.model_fields_set and new in self.model_fields_set:
                raise ValueError(f"Cannot provide deprecated parameter '{old}' and replacing parameter '{new}' together")
        return self


# ---- fp16 / bf16 (runtime/precision_config.py) ----------------------------------------------------

class BF16(_Model):
    enabled: bool = False
    immediate_grad_update: bool = False
    check_grad_overflow: bool = True
    bf16_master_weights_and_grads: bool = False
    bf16_optimizer_states: bool = False


class FP16(_Model):
    enabled: bool = False
    auto_cast: bool = False
    loss_scale: float = 0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: int = 1
    fp16_master_weights_and_grads: bool = False

    @field_validator("loss_scale", mode="before")
    @classmethod
    def _loss_scale(cls, v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError("fp16.loss_scale must be a number, not bool")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError("fp16.loss_scale must be a number") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError("fp16.loss_scale must be a finite number >= 0 (0 enables dynamic loss scaling)")
        return v

    @field_validator("loss_scale_window", "min_loss_scale", mode="before")
    @classmethod
    def _integer(cls, v: Any, info: Any) -> Any:
        field = f"fp16.{info.field_name}"
        if isinstance(v, bool) or (isinstance(v, float) and not math.isfinite(v)):
            raise ValueError(f"{field} must be an integer")
        try:
            int(v)
        except (TypeError, ValueError):
            raise ValueError(f"{field} must be an integer") from None
        return v

    @model_validator(mode="after")
    def _dynamic_scale(self) -> FP16:
        if self.enabled and self.loss_scale == 0 and (self.loss_scale_window <= 0 or self.min_loss_scale <= 0):
            raise ValueError("fp16.loss_scale_window and fp16.min_loss_scale must be > 0 with dynamic loss scaling")
        return self


# ---- tensor_parallel (runtime/tensor_parallel/config.py) -------------------------------------------

class _TorchDtype:
    """TPTrainingConfig.dtype is a torch.dtype: no JSON value is one, so DeepSpeed refuses any dtype but "auto"."""


class TPConfig(_Model):
    tp_size: int = 1
    tp_grain_size: int = 1
    mpu: object = None
    tp_group: object = None


class TensorParallel(_Model):
    dtype: _TorchDtype | None = Field(None, validate_default=False)
    autotp_size: int = 0
    tp_overlap_comm: bool = False
    vocab_parallel_lm_head: bool | None = None
    vocab_parallel_ce_backend: Literal["torch", "liger"] = "torch"
    tensor_parallel: TPConfig = Field(default_factory=TPConfig, alias="tp")
    injection_policy_tuple: tuple | None = None
    partition_config: dict[str, Any] | None = None
    preset_model: str | None = None
    keep_module_on_host: bool = False
    replace_with_kernel_inject: bool = Field(False, alias="kernel_inject")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> Any:
        raise ValueError(f"dtype must be a torch.dtype, which a JSON file cannot give (got {excerpt(v)})")


# ---- the whole config (runtime/config.py) -------------------------------------------------------

REMOVED_KEYS = ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
                "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop")
REMOVED_ZERO_KEYS = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")
AUTOCAST_DTYPES = ("torch.float16", "fp16", "float16", "half", "torch.float32", "fp32", "float32", "float",
                   "torch.int8", "int8", "torch.bfloat16", "bf16", "bfloat16")
COMM_DTYPES = ("fp32", "fp16", "bf16")
SECTIONS = {"zero_optimization": Zero, "fp16": FP16, "bf16": BF16, "tensor_parallel": TensorParallel}
PYDANTIC_BLOCKS = (*SECTIONS, "bfloat16")  # the blocks whose "auto" values DeepSpeed drops


def deepspeed_problem(cfg: dict[str, Any], world_size: int = 1) -> str | None:
    """None if DeepSpeedConfig(cfg) accepts the config at this data-parallel world size (in the sections listed in
    the module docstring), else the reason in one line."""
    try:
        _check(cfg, world_size)
    except ValidationError as exc:
        return short(one_line(exc, "block"))
    except (ValueError, TypeError, ArithmeticError, AttributeError) as exc:
        return short(str(exc)) or type(exc).__name__
    return None


def _check(cfg: dict[str, Any], world_size: int) -> None:
    if not isinstance(cfg, dict):
        raise ValueError(f"a ds_config is a JSON object, got {type(cfg).__name__}")
    for key in REMOVED_KEYS:
        if key in cfg:
            raise ValueError(f"{key}: DeepSpeed removed this feature and refuses the key")
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        for key in REMOVED_ZERO_KEYS:
            if key in zero:
                raise ValueError(f"zero_optimization.{key}: DeepSpeed removed this feature and refuses the key")
    _batch(cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu"),
           cfg.get("gradient_accumulation_steps"), world_size)
    _scalars(cfg)
    blocks = {name: _section(cfg, name) for name in SECTIONS}
    _precision_rules(blocks["fp16"], blocks["bf16"], blocks["zero_optimization"], cfg.get("gradient_allreduce_op"))


def _section(cfg: dict[str, Any], name: str) -> BaseModel:
    """Model(**cfg[name]) as DeepSpeed builds it; zero_optimization true/false is the deprecated spelling, and a
    bf16 block that is absent or null is looked up as `bfloat16`."""
    value = cfg.get(name) if name in cfg else {}
    if name == "zero_optimization" and isinstance(value, bool):
        value = {"stage": 1 if value else 0, **({"allgather_bucket_size": cfg.get("allgather_size", 5 * 10**8)}
                                               if value else {})}
    if name == "bf16" and cfg.get("bf16") is None:
        value = cfg.get("bfloat16", {})
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object, got {excerpt(value)}")
    try:
        return SECTIONS[name].model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"{name}.{one_line(exc, 'block')}") from None


def _batch(train: Any, micro: Any, accum: Any, world: int) -> None:
    """DeepSpeedConfig._set_batch_related_parameters, _batch_assertion and the first lines of _do_error_check, with
    DeepSpeed's own arithmetic (it reads the three keys as they are: 8.0 counts as 8)."""
    if train is not None and micro is not None and accum is not None:
        pass
    elif train is not None and micro is not None:
        accum = train // micro // world
    elif train is not None and accum is not None:
        micro = train // world // accum
    elif micro is not None and accum is not None:
        train = micro * accum * world
    elif train is not None:
        accum, micro = 1, train // world
    elif micro is not None:
        train, accum = micro * world, 1
    else:
        raise ValueError("train_batch_size or train_micro_batch_size_per_gpu is required")
    if not train > 0 or not micro > 0 or not accum > 0:
        raise ValueError(f"train_batch_size {excerpt(train)}, train_micro_batch_size_per_gpu {excerpt(micro)} and "
                         f"gradient_accumulation_steps {excerpt(accum)} must be greater than 0")
    if train != micro * accum * world:
        raise ValueError(f"train_batch_size {excerpt(train)} != train_micro_batch_size_per_gpu {excerpt(micro)} x "
                         f"gradient_accumulation_steps {excerpt(accum)} x data-parallel size {world}")


def _scalars(cfg: dict[str, Any]) -> None:
    """The top-level keys DeepSpeedConfig reads one by one, with the operations it applies to them
    (get_communication_data_type, get_gradient_allreduce_op, get_optimizer_name / _params, get_scheduler_name,
    get_torch_autocast_*, _do_warning_check): a value those operations fail on is refused as DeepSpeed refuses it."""
    for key, default in (("communication_data_type", None), ("seq_parallel_communication_data_type", "fp32")):
        value = cfg.get(key, default)
        if value is not None and (not isinstance(value, str) or value.lower() not in COMM_DTYPES):
            raise ValueError(f"{key} must be one of fp32, fp16, bf16, got {excerpt(value)}")
    op = cfg.get("gradient_allreduce_op", "mean")
    if (op.lower() if isinstance(op, str) else op) not in ("mean", "sum"):
        raise ValueError(f"gradient_allreduce_op must be mean or sum, got {excerpt(op)}")
    _optimizer_block(cfg)
    if "scheduler" in cfg and not isinstance(cfg["scheduler"], dict):
        raise ValueError(f"scheduler must be an object, got {excerpt(cfg['scheduler'])}")
    if "torch_autocast" in cfg:
        _autocast(cfg["torch_autocast"])
    vocabulary = cfg.get("vocabulary_size")
    if vocabulary:
        vocabulary % 8  # noqa: B018 - DeepSpeed's tensor-core alignment check, which a list or "abc" fails


def _optimizer_block(cfg: dict[str, Any]) -> None:
    if "optimizer" not in cfg:
        return
    block = cfg["optimizer"]
    if not isinstance(block, dict):
        raise ValueError(f"optimizer must be an object, got {excerpt(block)}")
    name = block.get("type")
    if name is not None and not isinstance(name, str):  # DeepSpeed lower-cases it
        raise ValueError(f"optimizer.type must be a string, got {excerpt(name)}")
    params = block.get("params") if name is not None else None
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError(f"optimizer.params must be an object, got {excerpt(params)}")
    if "max_grad_norm" in params:
        params["max_grad_norm"] > 0  # noqa: B015 - DeepSpeed's comparison, which a non-number fails


def _autocast(block: Any) -> None:
    if not isinstance(block, dict):
        raise ValueError(f"torch_autocast must be an object, got {excerpt(block)}")
    if "dtype" in block and (not isinstance(block["dtype"], str) or block["dtype"] not in AUTOCAST_DTYPES):
        raise ValueError(f"torch_autocast.dtype: invalid dtype {excerpt(block['dtype'])}")
    if "lower_precision_safe_modules" in block:
        modules = block["lower_precision_safe_modules"]
        if not all(isinstance(m, str) for m in modules):  # a non-list fails as in DeepSpeed (TypeError)
            raise ValueError("torch_autocast.lower_precision_safe_modules must be a list of strings")


def _precision_rules(fp16: BaseModel, bf16: BaseModel, zero: BaseModel, allreduce_op: Any) -> None:
    """DeepSpeedConfig._do_error_check: fp16 and bf16 not both on; the master-weight options need ZeRO 1, 2 or 3;
    gradient_allreduce_op sum not with ZeRO 3."""
    if isinstance(allreduce_op, str) and allreduce_op.lower() == "sum" and zero.stage == 3:
        raise ValueError("gradient_allreduce_op='sum' is not supported with ZeRO stage 3")
    if fp16.enabled and bf16.enabled:
        raise ValueError("bfloat16 and fp16 modes cannot be simultaneously enabled")
    zero_on = zero.stage > 0
    if fp16.fp16_master_weights_and_grads and not zero_on:
        raise ValueError("fp16.fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3")
    if bf16.bf16_master_weights_and_grads and not zero_on:
        raise ValueError("bf16.bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3")
    if bf16.bf16_optimizer_states and not (zero_on and bf16.bf16_master_weights_and_grads):
        raise ValueError("bf16.bf16_optimizer_states needs ZeRO 1, 2 or 3 and bf16_master_weights_and_grads")

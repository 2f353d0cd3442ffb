"""A complete DeepSpeed config (ds_config.json) for a training scenario.

The ZeRO buffer sizes written here are the scenario's reduce_bucket_size and the constants of calc.contract.parallel
that the memory estimate assumes (allgather bucket, stage-3 prefetch bucket, live parameters, persistence
threshold),
and overlap_comm is the speed model's assumption (calc.speed.SpeedAssumptions.overlap_comm), so the
estimate, the speed and the exported config describe the same run.

Precision mapping (DeepSpeed 0.19 runtime/config.py, runtime/precision_config.py):
  fp32       -> no bf16/fp16/torch_autocast block
  amp-bf16   -> "torch_autocast": {"enabled": true, "dtype": "bfloat16"} (fp32 weights, autocast compute)
  amp-fp16   -> "torch_autocast" with "float16"
  bf16-mixed -> "bf16": {"enabled": true} (bf16 weights/grads, fp32 master + states in the optimizer)
  fp16-mixed -> "fp16" with dynamic loss scaling (loss_scale 0)
  bf16       -> "bf16" with bf16_master_weights_and_grads + bf16_optimizer_states (ZeRO 1-3 only)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.i18n import T_, Text
from calc.contract.parallel import (
    ALLGATHER_BUCKET_ELEMENTS,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_ELEMENTS,
)
from calc.contract.precision import BNB_OPTIMIZER_CLASSES
from calc.contract.scenario import Checkpointing, Mode, Offload, Optimizer, OptimizerImpl, Precision, Scenario
from calc.speed import SpeedAssumptions

# DeepSpeed's fp16 dynamic loss-scaling defaults (runtime/precision_config.py, DeepSpeedFP16Config).
FP16_INITIAL_SCALE_POWER = 16
FP16_LOSS_SCALE_WINDOW = 1000
FP16_HYSTERESIS = 2
FP16_MIN_LOSS_SCALE = 1
DEFAULT_NVME_PATH = "/local_nvme"
# Optimizers DeepSpeed builds itself; any other type is looked up in torch.optim and needs
# zero_allow_untested_optimizer with ZeRO (runtime/engine.py, _configure_basic_optimizer).
DS_OPTIMIZER_TYPES = {Optimizer.adamw: "AdamW", Optimizer.adam: "Adam", Optimizer.sgd: "SGD",
                      Optimizer.sgd_momentum: "SGD", Optimizer.adafactor: "Adafactor"}


class ExportOptions(BaseModel):
    """Training hyper-parameters the scenario does not carry (defaults: Hugging Face TrainingArguments')."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # they are written into JSON

    learning_rate: float = Field(5e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.9, ge=0, description="for sgd-momentum")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up from 0 (the Trainer's schedule)")
    total_num_steps: int | None = Field(None, ge=1, description="given: linear decay to 0 at this step (max_steps)")
    gradient_clipping: float = Field(1.0, ge=0)
    nvme_path: str = Field(DEFAULT_NVME_PATH, description="local NVMe mount for ZeRO-Infinity offload")

    @model_validator(mode="after")
    def _decay_after_warmup(self) -> ExportOptions:
        if self.total_num_steps is not None and self.total_num_steps < self.warmup_steps:
            raise ValueError(f"total_num_steps {self.total_num_steps} is shorter than warmup_steps {self.warmup_steps}")
        return self


class DeepSpeedExport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any]
    notes: list[str] = Field(default_factory=list, description="what the config cannot say; printed on stderr")
    note_texts: list[Text] = Field(default_factory=list, exclude=True,
                                   description="the same notes, translatable (the Export page's language)")


def export_deepspeed(sc: Scenario, options: ExportOptions | None = None,
                     assumptions: SpeedAssumptions | None = None) -> DeepSpeedExport:
    """The ds_config dict for `sc`, plus notes on what must be set in code. ValueError when DeepSpeed
    cannot express the scenario."""
    o = options or ExportOptions()
    a = assumptions or SpeedAssumptions()
    t = sc.training
    check_expressible(sc)
    # No train_batch_size: DeepSpeed derives it as micro x accumulation x data-parallel ranks, so the
    # config runs at any world size, and zero.Init (which parses it before deepspeed.comm is up when
    # accelerate initialised torch.distributed itself, partition_parameters.py) sees no mismatch.
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "gradient_clipping": o.gradient_clipping,
    }
    cfg.update(_precision_block(t.precision))
    cfg["zero_optimization"] = _zero_block(sc, o, a)
    notes = _add_checkpointing(cfg, sc) + _add_optimizer(cfg, sc, o)
    notes = _summary_notes(sc, o) + notes + _add_parallelism(cfg, sc) + _adapter_notes(sc)
    return DeepSpeedExport(config=cfg, notes=[str(n) for n in notes], note_texts=notes)


def check_expressible(sc: Scenario) -> None:
    """ValueError naming the field when DeepSpeed cannot run `sc` as it is."""
    t = sc.training
    if sc.mode != Mode.train:
        raise ValueError("mode: DeepSpeed config export is for training scenarios (mode=train)")
    if t.sharding == "torch":
        raise ValueError("training.sharding: this scenario runs plain PyTorch (no DeepSpeed); "
                         "set sharding to deepspeed to export a ds_config")
    if t.sharding == "fsdp2" and t.zero_stage >= 2:
        raise ValueError("training.sharding: this scenario shards with PyTorch FSDP2, not DeepSpeed; "
                         "set sharding to deepspeed to export a ds_config")
    if t.precision == Precision.bf16 and t.zero_stage == 0:
        raise ValueError("training.precision: pure bf16 (bf16 optimizer states) needs zero_stage 1-3 in DeepSpeed "
                         "(bf16_optimizer_states); use zero_stage 1 or precision bf16-mixed")
    if t.offload_optimizer == Offload.nvme and t.zero_stage < 3:
        raise ValueError("training.offload_optimizer: NVMe optimizer offload needs zero_stage 3 (ZeRO-Infinity); "
                         "DeepSpeed's ZeRO-1/2 would keep the states in CPU RAM")
    if t.pipeline_parallel > 1 and t.zero_stage > 1:
        raise ValueError("training.zero_stage: DeepSpeed's pipeline engine supports ZeRO-1 at most")


def _summary_notes(sc: Scenario, o: ExportOptions) -> list[Text]:
    """The optimizer, the learning-rate schedule and the global batch: the notes every export starts with."""
    t, dp = sc.training, sc.data_parallel
    return [T_("optimizer: {name}", name=ds_optimizer_name(sc)),
            T_("learning-rate schedule: {schedule}", schedule=schedule_description(o)),
            T_("global batch: {micro} x {accum} accumulation x {dp} data-parallel ranks = {total} sequences "
               "(train_batch_size is left to DeepSpeed)", micro=t.micro_batch_size,
               accum=t.gradient_accumulation_steps, dp=dp,
               total=t.micro_batch_size * t.gradient_accumulation_steps * dp)]


def _add_checkpointing(cfg: dict[str, Any], sc: Scenario) -> list[Text]:
    """The activation_checkpointing block into `cfg`, and what it cannot say."""
    t = sc.training
    if t.activation_checkpointing == Checkpointing.none:
        return []
    cfg["activation_checkpointing"] = _checkpointing_block(sc)
    notes = [T_("Hugging Face models: call model.gradient_checkpointing_enable("
                "gradient_checkpointing_kwargs={'use_reentrant': False}) (or TrainingArguments("
                "activation_checkpointing=True)); the activation_checkpointing block configures "
                "deepspeed.checkpointing for Megatron-style models")]
    if t.activation_checkpointing == Checkpointing.selective:
        notes.append(T_("selective (attention-only) recomputation has no DeepSpeed switch: the exported train.py "
                        "wraps each layer's attention in torch.utils.checkpoint itself (checkpoint_attention)"))
    elif t.checkpoint_every > 1:
        notes.append(T_("checkpointing 1 in {every} layers: the Trainer's activation_checkpointing_kwargs "
                        "every_n_layers={every}; number_checkpoints = {n} for deepspeed.checkpointing",
                        every=t.checkpoint_every, n=cfg["activation_checkpointing"]["number_checkpoints"]))
    return notes


def _add_optimizer(cfg: dict[str, Any], sc: Scenario, o: ExportOptions) -> list[Text]:
    """The optimizer block (and the switches a torch.optim optimizer needs under ZeRO) into `cfg`."""
    t = sc.training
    opt = _optimizer_block(sc, o)
    if opt is None:
        if t.zero_stage > 0:
            cfg["zero_allow_untested_optimizer"] = True
        return [T_("{optimizer}: no DeepSpeed optimizer block; pass bitsandbytes.optim.{cls}(...) to "
                   "deepspeed.initialize(optimizer=...)", optimizer=t.optimizer.value,
                   cls=BNB_OPTIMIZER_CLASSES[t.optimizer])]
    cfg["optimizer"] = opt
    if opt["type"] not in ("AdamW", "Adam") and t.zero_stage > 0:
        cfg["zero_allow_untested_optimizer"] = True
    if opt["type"] not in ("AdamW", "Adam") and t.offload_optimizer != Offload.none:
        cfg["zero_force_ds_cpu_optimizer"] = False
        return [T_("{name} with optimizer offload runs torch.optim on the CPU (no DeepSpeed CPU kernel)",
                   name=opt["type"])]
    return []


def _add_parallelism(cfg: dict[str, Any], sc: Scenario) -> list[Text]:
    """Tensor and pipeline parallelism into `cfg`, and what must be done in code for them."""
    t = sc.training
    notes = []
    if t.tensor_parallel > 1:
        cfg["tensor_parallel"] = {"autotp_size": t.tensor_parallel}
        notes.append(T_("tensor_parallel.autotp_size = {tp}: DeepSpeed AutoTP training; "
                        "train_batch_size counts data-parallel ranks only", tp=t.tensor_parallel))
    if t.pipeline_parallel > 1:
        cfg["pipeline"] = {"stages": t.pipeline_parallel, "partition": "parameters"}
        notes.append(T_("pipeline parallelism needs the model wrapped in deepspeed.pipe.PipelineModule("
                        "num_stages={pp}); 'stages' here documents it", pp=t.pipeline_parallel))
    if t.sequence_parallel:
        notes.append(T_("Megatron-style sequence parallelism is a Megatron-LM option, not a DeepSpeed config key"))
    return notes


def _adapter_notes(sc: Scenario) -> list[Text]:
    """LoRA / QLoRA: what wraps the model before deepspeed.initialize."""
    lora = sc.training.lora
    if lora is None:
        return []
    base = lora.base_weights
    return [T_("LoRA r={rank} on {targets}: wrap the model with peft.get_peft_model before "
               "deepspeed.initialize", rank=lora.rank, targets=lora.targets) if not lora.quantized else
            T_("LoRA r={rank} on {targets}: wrap the model with peft.get_peft_model before "
               "deepspeed.initialize; base weights {base} via bitsandbytes", rank=lora.rank,
               targets=lora.targets, base=base)]


def deepspeed_config(sc: Scenario, options: ExportOptions | None = None) -> dict[str, Any]:
    """Just the ds_config dict."""
    return export_deepspeed(sc, options).config


def _precision_block(p: Precision) -> dict[str, Any]:
    if p == Precision.bf16_mixed:
        return {"bf16": {"enabled": True}}
    if p == Precision.bf16:
        return {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
    if p == Precision.fp16_mixed:
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": FP16_INITIAL_SCALE_POWER,
                         "loss_scale_window": FP16_LOSS_SCALE_WINDOW, "hysteresis": FP16_HYSTERESIS,
                         "min_loss_scale": FP16_MIN_LOSS_SCALE}}
    if p == Precision.amp_bf16:
        return {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}
    if p == Precision.amp_fp16:
        return {"torch_autocast": {"enabled": True, "dtype": "float16"}}
    return {}


def _zero_block(sc: Scenario, o: ExportOptions, a: SpeedAssumptions) -> dict[str, Any]:
    t = sc.training
    z: dict[str, Any] = {"stage": t.zero_stage}
    if t.zero_stage == 0:
        return z
    z.update({
        "overlap_comm": a.overlap_comm,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": t.reduce_bucket_size,
        "allgather_partitions": True,
        "allgather_bucket_size": ALLGATHER_BUCKET_ELEMENTS,
    })
    if t.zero_stage == 3:
        z.update({
            "stage3_prefetch_bucket_size": STAGE3_PREFETCH_ELEMENTS,
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_param_persistence_threshold": STAGE3_PARAM_PERSISTENCE_THRESHOLD,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
    if t.offload_optimizer != Offload.none:
        z["offload_optimizer"] = _offload(t.offload_optimizer, o)
    if t.offload_params != Offload.none:
        z["offload_param"] = _offload(t.offload_params, o)
    return z


def _offload(device: Offload, o: ExportOptions) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device.value, "pin_memory": True}
    if device == Offload.nvme:
        block["nvme_path"] = o.nvme_path
    return block


def _checkpointing_block(sc: Scenario) -> dict[str, Any]:
    """number_checkpoints = layers that keep a checkpoint (1 in k: ceil(L / k)); the importer reads k back."""
    t = sc.training
    every = t.checkpoint_every if t.activation_checkpointing == Checkpointing.full else 1
    return {"partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
            "number_checkpoints": -(-sc.spec.num_layers // every), "synchronize_checkpoint_boundary": False,
            "profile": False}


def _optimizer_block(sc: Scenario, o: ExportOptions) -> dict[str, Any] | None:
    """DeepSpeed's optimizer block. Adam/AdamW follow the scenario's optimizer_impl, so the optimizer that
    runs is the one the estimate counts: fused -> DeepSpeed's FusedAdam (no temporaries); foreach /
    for-loop -> torch.optim's Adam/AdamW through DeepSpeed's torch_adam switch with that foreach setting
    (runtime/engine.py, get_optimizer_configuration). Offloaded, DeepSpeed always runs DeepSpeedCPUAdam."""
    t = sc.training
    opt = t.optimizer
    if opt.bitsandbytes:
        return None
    params: dict[str, Any] = {"lr": o.learning_rate, "weight_decay": o.weight_decay}
    if opt in (Optimizer.adamw, Optimizer.adam):
        params.update(betas=list(o.betas), eps=o.eps)
        if opt == Optimizer.adam:
            params["adam_w_mode"] = False  # DeepSpeed's "Adam" is AdamW unless told otherwise
        if t.offload_optimizer == Offload.none and t.optimizer_impl != OptimizerImpl.fused:
            params.update(torch_adam=True, foreach=t.optimizer_impl == OptimizerImpl.foreach)
    elif opt == Optimizer.sgd:
        params["momentum"] = 0.0
    elif opt == Optimizer.sgd_momentum:
        params["momentum"] = o.momentum
    return {"type": DS_OPTIMIZER_TYPES[opt], "params": params}


def schedule_description(o: ExportOptions) -> Text:
    """The learning-rate schedule of the exported run, in words. The Trainer owns it (train.py's
    lr_scheduler_type / warmup_steps / max_steps) and the ds_config has no scheduler block: DeepSpeed's
    WarmupLR cannot follow the Trainer's schedule (it refuses warmup_num_steps 0, stretches any warm-up to
    at least 2 steps, and starts at warmup_min_lr and steps after the optimizer, so it lags the Trainer by
    one step; runtime/lr_schedules.py), while the Trainer drives DeepSpeed's optimizer with its own
    scheduler under every launcher (transformers.integrations.deepspeed, deepspeed_optim_sched)."""
    lr, warm, total = f"{o.learning_rate:g}", o.warmup_steps, o.total_num_steps
    if warm == 0 and total is None:
        shape = T_("constant {lr}", lr=lr)
    elif warm and total:
        shape = T_("linear warm-up from 0 to {lr} over {warm} steps, then linear decay to 0 at step {total}",
                   lr=lr, warm=warm, total=total)
    elif warm:
        shape = T_("linear warm-up from 0 to {lr} over {warm} steps, then constant", lr=lr, warm=warm)
    else:
        shape = T_("{lr}, then linear decay to 0 at step {total}", lr=lr, total=total)
    return T_("{shape}, applied by the Trainer (no scheduler block in ds_config.json; deepspeed.initialize on its "
              "own runs at the constant optimizer lr)", shape=shape)


def ds_optimizer_name(sc: Scenario) -> Text:
    """Which optimizer class deepspeed.initialize builds from the exported block (runtime/engine.py,
    _configure_basic_optimizer / get_optimizer_configuration): Adam/AdamW are DeepSpeedCPUAdam when the
    optimizer is offloaded and FusedAdam otherwise (multi-tensor kernels, no torch foreach temporaries);
    SGD and Adafactor are torch.optim's; adamw-8bit is the user's bitsandbytes optimizer."""
    t = sc.training
    if t.optimizer.bitsandbytes:
        return T_("bitsandbytes {cls}, passed to deepspeed.initialize(optimizer=...)",
                  cls=BNB_OPTIMIZER_CLASSES[t.optimizer])
    if t.optimizer in (Optimizer.adamw, Optimizer.adam):
        mode = "AdamW" if t.optimizer == Optimizer.adamw else "Adam (adam_w_mode false)"
        if t.offload_optimizer != Offload.none:
            states = "bf16" if t.precision == Precision.bf16 else "fp32"
            return T_("DeepSpeedCPUAdam ({mode}) on the host, {states} states", mode=mode, states=states)
        if t.optimizer_impl == OptimizerImpl.fused:
            return T_("DeepSpeed FusedAdam ({mode}) on the accelerator, no temporaries", mode=mode)
        torch_name = "AdamW" if t.optimizer == Optimizer.adamw else "Adam"
        return T_("torch.optim.{name} (torch_adam, foreach={foreach}), as the scenario's optimizer_impl; set "
                  "optimizer_impl fused for DeepSpeed's FusedAdam", name=torch_name,
                  foreach=t.optimizer_impl == OptimizerImpl.foreach)
    if t.offload_optimizer != Offload.none:
        return T_("torch.optim {kind} on the host", kind=_TORCH_OPTIMIZERS[t.optimizer])
    return T_("torch.optim {kind}", kind=_TORCH_OPTIMIZERS[t.optimizer])


_TORCH_OPTIMIZERS = {Optimizer.sgd: "SGD", Optimizer.sgd_momentum: "SGD with momentum", Optimizer.adafactor: "Adafactor"}

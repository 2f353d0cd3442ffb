"""The same setup for the Hugging Face Trainer (TrainingArguments kwargs + a runnable snippet) and an
accelerate config (YAML).

DeepSpeed is used (TrainingArguments(deepspeed=...), accelerate distributed_type DEEPSPEED) whenever
the scenario needs it: a ZeRO stage, or DeepSpeed's own 16-bit weights (bf16-mixed / fp16-mixed /
pure bf16). AMP at ZeRO 0 is the Trainer's own autocast (bf16=True / fp16=True) over plain DDP.
The ds_config the kwargs point to is calc.export.deepspeed's, with the same hyper-parameters, so the
Trainer's consistency checks (batch sizes, lr, betas, clipping) pass.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from calc.export.deepspeed import ExportOptions
from calc.presets import model_presets, resolve_hardware
from calc.scenario import Checkpointing, Mode, Optimizer, OptimizerImpl, Precision, Scenario

DS_CONFIG_FILE = "ds_config.json"


def uses_deepspeed(sc: Scenario) -> bool:
    t = sc.training
    return t.zero_stage > 0 or t.precision.is_mixed or t.precision == Precision.bf16


def _optim(t: Any) -> tuple[str, str | None, list[str]]:
    """(TrainingArguments.optim, optim_args, notes)."""
    notes: list[str] = []
    if t.optimizer == Optimizer.adamw:
        return ("adamw_torch_fused" if t.optimizer_impl == OptimizerImpl.fused else "adamw_torch"), \
            ("foreach=False" if t.optimizer_impl == OptimizerImpl.for_loop else None), notes
    if t.optimizer == Optimizer.adam:
        notes.append("the Trainer has no plain Adam: adamw_torch with weight_decay=0 is the same update")
        return "adamw_torch", None, notes
    if t.optimizer == Optimizer.adamw_8bit:
        return "adamw_bnb_8bit", None, notes
    if t.optimizer == Optimizer.sgd:
        return "sgd", None, notes
    if t.optimizer == Optimizer.sgd_momentum:
        return "sgd", "momentum=0.9", notes
    notes.append("optim='adafactor' is transformers' Adafactor (factored second moment, like torch.optim.Adafactor)")
    return "adafactor", None, notes


def trainer_arguments(sc: Scenario, options: ExportOptions | None = None,
                      deepspeed_config_path: str = DS_CONFIG_FILE, output_dir: str = "out") -> dict[str, Any]:
    """TrainingArguments(**kwargs) for the scenario (JSON-serialisable)."""
    if sc.mode != Mode.train:
        raise ValueError("mode: TrainingArguments are for training scenarios (mode=train)")
    o = options or ExportOptions()
    t = sc.training
    optim, optim_args, _ = _optim(t)
    kw: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": o.learning_rate,
        "weight_decay": o.weight_decay,
        "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1],
        "adam_epsilon": o.eps,
        "max_grad_norm": o.gradient_clipping,
        "warmup_steps": o.warmup_steps,
        "lr_scheduler_type": "linear" if o.total_num_steps else "constant_with_warmup",
        "optim": optim,
        "bf16": t.precision in (Precision.amp_bf16, Precision.bf16_mixed, Precision.bf16),
        "fp16": t.precision in (Precision.amp_fp16, Precision.fp16_mixed),
        # transformers 5.x name (gradient_checkpointing is its deprecated alias)
        "activation_checkpointing": t.activation_checkpointing != Checkpointing.none,
    }
    if o.total_num_steps:
        kw["max_steps"] = o.total_num_steps
    if optim_args:
        kw["optim_args"] = optim_args
    if kw["activation_checkpointing"]:
        kw["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if t.cross_entropy == "liger-fused":  # only the fused loss, as the calculator models it
        kw["use_liger_kernel"] = True
        kw["liger_kernel_config"] = {"fused_linear_cross_entropy": True, "cross_entropy": False, "rope": False,
                                     "rms_norm": False, "swiglu": False}
    if uses_deepspeed(sc):
        kw["deepspeed"] = deepspeed_config_path
    return kw


def _model_source(sc: Scenario) -> tuple[str, str]:
    """(how to build the model in code, a short name)."""
    if isinstance(sc.model, str):
        src = model_presets()[sc.model].source
        m = re.match(r"https://huggingface\.co/([^/]+/[^/]+)/", src)
        repo = m.group(1) if m else sc.model
        return repr(repo), repo
    return "config", sc.spec.name or sc.spec.family


def trainer_snippet(sc: Scenario, options: ExportOptions | None = None,
                    deepspeed_config_path: str = DS_CONFIG_FILE) -> str:
    """A Python script that builds the model and a Trainer with these arguments."""
    t = sc.training
    kw = trainer_arguments(sc, options, deepspeed_config_path)
    _, _, opt_notes = _optim(t)
    src, _ = _model_source(sc)
    dtype = {Precision.fp32: "torch.float32", Precision.amp_bf16: "torch.float32", Precision.amp_fp16: "torch.float32",
             Precision.bf16_mixed: "torch.bfloat16", Precision.bf16: "torch.bfloat16",
             Precision.fp16_mixed: "torch.float16"}[t.precision]
    lines = ["# Generated by vramcalc (calc.export.hf) for this scenario.", "import torch",
             "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments"]
    quant = t.lora is not None and t.lora.base_weights != "bf16"
    if isinstance(sc.model, dict):
        lines.append("from transformers import AutoConfig")
    if quant:
        lines.append("from transformers import BitsAndBytesConfig")
    if t.lora is not None:
        lines.append("from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training" if quant
                                                                        else ""))
    lines.append("")
    if isinstance(sc.model, dict):
        lines.append(f"config = AutoConfig.for_model(**{json.dumps(sc.model)})")
    args = [f"attn_implementation={t.attention.value!r}",
            f"dtype={'torch.bfloat16' if t.lora is not None and t.precision != Precision.fp32 else dtype}"]
    if quant:
        if t.lora.base_weights == "nf4":
            lines.append("bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                         "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)")
        else:
            lines.append("bnb = BitsAndBytesConfig(load_in_8bit=True)")
        args.append("quantization_config=bnb")
    if isinstance(sc.model, dict):
        lines.append(f"model = AutoModelForCausalLM.from_config(config, {', '.join(args)})")
    else:
        lines.append(f"model = AutoModelForCausalLM.from_pretrained({src}, {', '.join(args)})")
    if t.lora is not None:
        if quant:
            lines.append("model = prepare_model_for_kbit_training(model, use_gradient_checkpointing="
                         f"{t.activation_checkpointing != Checkpointing.none})")
        targets = '"all-linear"' if t.lora.targets == "all-linear" else '["q_proj", "k_proj", "v_proj", "o_proj"]'
        lines.append(f"model = get_peft_model(model, LoraConfig(r={t.lora.rank}, lora_alpha={t.lora.alpha:g}, "
                     f"target_modules={targets}, task_type='CAUSAL_LM'))")
    lines.append("args = TrainingArguments(\n" + "".join(f"    {k}={v!r},\n" for k, v in kw.items()) + ")")
    lines.append("trainer = Trainer(model=model, args=args, train_dataset=train_dataset)  # your dataset")
    lines.append("trainer.train()")
    notes = list(opt_notes)
    if uses_deepspeed(sc):
        notes.append(f"launch with: accelerate launch --config_file accelerate.yaml train.py  ({kw['deepspeed']} from "
                     "`python -m calc export-deepspeed`)")
    if t.tensor_parallel > 1 or t.pipeline_parallel > 1:
        notes.append(f"TP {t.tensor_parallel} x PP {t.pipeline_parallel}: the Trainer does not pipeline; use "
                     "DeepSpeed AutoTP (tensor_parallel.autotp_size in the ds_config) or Megatron-DeepSpeed")
    if t.activation_checkpointing == Checkpointing.selective:
        notes.append("selective checkpointing is a Megatron-LM option; activation_checkpointing=True checkpoints "
                     "whole layers")
    elif t.activation_checkpointing == Checkpointing.full and t.checkpoint_every > 1:
        notes.append(f"activation_checkpointing=True checkpoints every layer, not 1 in {t.checkpoint_every}")
    return "\n".join(lines + [f"# note: {n}" for n in notes]) + "\n"


def accelerate_config(sc: Scenario, deepspeed_config_path: str = DS_CONFIG_FILE) -> str:
    """accelerate's config.yaml (ClusterConfig fields) for the same number of machines and processes."""
    t = sc.training
    hw = resolve_hardware(sc.hardware)
    per_node = min(hw.gpus_per_node or min(hw.num_gpus, 8), hw.num_gpus)
    machines = hw.num_gpus // per_node
    mp = "bf16" if t.precision in (Precision.amp_bf16, Precision.bf16_mixed, Precision.bf16) else \
        "fp16" if t.precision.uses_fp16 else "no"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "DEEPSPEED" if uses_deepspeed(sc) else ("MULTI_GPU" if hw.num_gpus > 1 else "NO"),
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mp,
        "num_machines": machines,
        "num_processes": hw.num_gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }
    if uses_deepspeed(sc):
        cfg["deepspeed_config"] = {"deepspeed_config_file": deepspeed_config_path,
                                   "zero3_init_flag": t.zero_stage == 3}
    if machines > 1:
        cfg["main_process_ip"] = "MAIN_NODE_IP"
        cfg["main_process_port"] = 29500
    head = (f"# accelerate config for {sc.spec.name or sc.spec.family}: {hw.num_gpus} GPUs on {machines} machine(s).\n"
            "# Set machine_rank per node" + (" and main_process_ip" if machines > 1 else "") + ".\n")
    return head + yaml.safe_dump(cfg, sort_keys=True)

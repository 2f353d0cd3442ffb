"""A torchtune 0.6.1 recipe config for a framework-torchtune scenario: `tune run full_finetune_single_device
--config torchtune.yaml` (lora_finetune_single_device with LoRA), with the keys those recipes read
(recipes/full_finetune_single_device.py and lora_finetune_single_device.py, `setup` and `__init__`) laid out as
the recipe configs do (recipes/configs/llama3_2/1B_full_single_device.yaml, 1B_lora_single_device.yaml).

Every memory-relevant key states what the estimate assumed: the model builder (`torchtune_model`, the one place a
scenario's model is mapped to torchtune; measure/frameworks/torchtune_run.py builds its measured models with it),
dtype, batch_size, gradient_accumulation_steps, enable_activation_checkpointing / offloading, the optimizer and its
kernels, optimizer_in_bwd, the loss and its output chunks, the LoRA arguments. The checkpointer, tokenizer and
dataset blocks carry placeholder paths the user fills in.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, translate
from calc.contract.precision import BNB_OPTIMIZER_CLASSES
from calc.contract.scenario import Checkpointing, Optimizer, OptimizerImpl, Precision, Scenario
from calc.export.deepspeed import ExportOptions

TORCHTUNE_FILE = "torchtune.yaml"
CHUNKED_LOSS_DEFAULT_CHUNKS = 8  # CEWithChunkedOutputLoss(num_output_chunks=8), torchtune/modules/loss/ce_chunked_output_loss.py
CHECKPOINT_DIR = "/path/to/checkpoint"  # the placeholder the user replaces (the comment at the top says so)

# presets whose dimensions one of torchtune's model builders has (tests/calc/export/test_export_frameworks.py
# checks each builder's parameter and buffer shapes against the component builder with the preset's dims)
PRESET_BUILDERS = {
    "llama-3.2-1b": "torchtune.models.llama3_2.llama3_2_1b", "llama-3.2-3b": "torchtune.models.llama3_2.llama3_2_3b",
    "llama-3.1-8b": "torchtune.models.llama3_1.llama3_1_8b", "llama-3.1-70b": "torchtune.models.llama3_1.llama3_1_70b",
    "llama-3-8b": "torchtune.models.llama3.llama3_8b", "llama-3-70b": "torchtune.models.llama3.llama3_70b",
    "qwen2.5-0.5b": "torchtune.models.qwen2_5.qwen2_5_0_5b", "qwen2.5-3b": "torchtune.models.qwen2_5.qwen2_5_3b",
    "qwen2.5-7b": "torchtune.models.qwen2_5.qwen2_5_7b_instruct",
    "qwen2.5-14b": "torchtune.models.qwen2_5.qwen2_5_14b_instruct",
}
# torchtune.models.<package> -> (the checkpointer's model_type, the tokenizer builder, its file arguments)
_PACKAGES: dict[str, tuple[str, str, dict[str, str]]] = {
    "llama3_2": ("LLAMA3_2", "torchtune.models.llama3.llama3_tokenizer", {"path": "original/tokenizer.model"}),
    "llama3_1": ("LLAMA3", "torchtune.models.llama3.llama3_tokenizer", {"path": "original/tokenizer.model"}),
    "llama3": ("LLAMA3", "torchtune.models.llama3.llama3_tokenizer", {"path": "original/tokenizer.model"}),
    "qwen2_5": ("QWEN2", "torchtune.models.qwen2_5.qwen2_5_tokenizer",
                {"path": "vocab.json", "merges_file": "merges.txt"}),
    "qwen2": ("QWEN2", "torchtune.models.qwen2.qwen2_tokenizer", {"path": "vocab.json", "merges_file": "merges.txt"}),
    "mistral": ("MISTRAL", "torchtune.models.mistral.mistral_tokenizer", {"path": "tokenizer.model"}),
}
# Hugging Face module names -> torchtune's (torchtune/modules/peft/_utils.py LORA_ATTN_MODULES)
_ATTENTION_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
_MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj"})


def model_config_dict(sc: Scenario) -> dict[str, Any]:
    """The Hugging Face config dict of the scenario's model (a preset's `config`, or the dict itself)."""
    if isinstance(sc.model, str):
        from calc.contract.presets import model_presets

        return copy.deepcopy(model_presets()[sc.model].config)
    return copy.deepcopy(sc.model)


def torchtune_builder_args(sc: Scenario, num_layers: int | None = None) -> tuple[str, dict[str, Any]]:
    """The torchtune component builder of the scenario's model and its arguments: llama with tied embeddings ->
    torchtune.models.llama3_2, untied -> llama3_1 (with rope_scaling) or llama3; qwen2 -> torchtune.models.qwen2;
    mistral -> torchtune.models.mistral. ValueError for a model no builder makes."""
    s = sc.spec
    if s.hidden_size != s.num_heads * s.head_dim:
        raise UserError(T_("torchtune's builders take head_dim = embed_dim / num_heads"))
    cfg = model_config_dict(sc)
    args = dict(vocab_size=s.vocab_size, num_layers=num_layers or s.num_layers, num_heads=s.num_heads,
                num_kv_heads=s.num_kv_heads, embed_dim=s.hidden_size, max_seq_len=s.max_position_embeddings,
                intermediate_dim=s.intermediate_size, norm_eps=cfg.get("rms_norm_eps", 1e-5))
    if "rope_theta" in cfg:  # the memory does not depend on it; the builders' own default otherwise
        args["rope_base"] = cfg["rope_theta"]
    if s.family == "llama":
        # the scaled and the plain RoPE keep the same tensors: the scale factor only changes the cache's values
        scaling = (cfg.get("rope_scaling") or {}).get("factor")
        scale = {} if scaling is None else {"scale_factor": scaling}
        if s.tie_word_embeddings:
            return "torchtune.models.llama3_2._component_builders.llama3_2", {**args, **scale,
                                                                              "tie_word_embeddings": True}
        if scaling is None:
            return "torchtune.models.llama3._component_builders.llama3", args
        return "torchtune.models.llama3_1._component_builders.llama3_1", {**args, **scale}
    if s.family == "qwen2":
        return "torchtune.models.qwen2._component_builders.qwen2", {**args, "tie_word_embeddings": s.tie_word_embeddings}
    if s.family == "mistral" and not s.tie_word_embeddings:
        return "torchtune.models.mistral._component_builders.mistral", args
    raise UserError(T_("framework torchtune: no torchtune builder for the {family} family here", family=s.family))


def torchtune_lora_args(lora: Any) -> dict[str, Any]:
    """The LoRA builders' arguments (torchtune/models/*/_component_builders.py lora_*): attention = q / k / v /
    output_proj, all-linear adds the MLP (apply_lora_to_mlp) but not the output projection, as peft's
    all-linear; a list of Hugging Face names maps one to one (the MLP only as a whole: torchtune adapts all three)."""
    if lora.modules_to_save:
        raise UserError(T_("torchtune's LoRA recipe trains no modules in full beside the adapters: leave "
                           "modules_to_save empty"))
    if lora.targets in ("attention", "all-linear"):
        attn, mlp, output = list(_ATTENTION_NAMES.values()), lora.targets == "all-linear", False
    else:
        names = set(lora.targets)
        unknown = names - set(_ATTENTION_NAMES) - _MLP_NAMES - {"lm_head"}
        if unknown or (names & _MLP_NAMES and not names >= _MLP_NAMES):
            raise UserError(T_("torchtune's LoRA builders cannot adapt exactly {targets} (the MLP only as a whole)",
                               targets=", ".join(sorted(lora.targets))))
        attn = [tt for hf, tt in _ATTENTION_NAMES.items() if hf in names]
        mlp, output = names >= _MLP_NAMES, "lm_head" in names
    quantize = {"quantize_base": True} if lora.quantized else {}  # QLoRA: the frozen linears as NF4 tensors
    return {"lora_attn_modules": attn, "apply_lora_to_mlp": mlp, "apply_lora_to_output": output,
            "lora_rank": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, **quantize}


def torchtune_model(sc: Scenario) -> dict[str, Any]:
    """The config's `model` block: the preset's own builder (torchtune.models.llama3_2.llama3_2_1b, ...) where one
    has its dimensions, else the component builder with the config's; the lora_ builder with the LoRA arguments."""
    t = sc.training
    preset = PRESET_BUILDERS.get(sc.model) if isinstance(sc.model, str) else None
    path, args = (preset, {}) if preset else torchtune_builder_args(sc)
    if t.lora is None:
        return {"_component_": path, **args}
    module, name = path.rsplit(".", 1)
    return {"_component_": f"{module}.lora_{name}", **args, **torchtune_lora_args(t.lora)}


def optimizer_class(sc: Scenario, options: ExportOptions) -> tuple[str, dict[str, Any]]:
    """The optimizer's class path and keyword arguments: torch.optim with the kernels optimizer_impl names
    (fused=True, foreach=True, or foreach=False for one parameter at a time), or bitsandbytes' class. The same
    for torchtune's `optimizer` block and LitGPT's --optimizer."""
    t = sc.training
    kwargs: dict[str, Any] = {"lr": options.learning_rate, "weight_decay": options.weight_decay}
    if t.optimizer in BNB_OPTIMIZER_CLASSES:
        return f"bitsandbytes.optim.{BNB_OPTIMIZER_CLASSES[t.optimizer]}", kwargs
    torch_class = {Optimizer.adamw: "AdamW", Optimizer.adam: "Adam", Optimizer.sgd: "SGD",
                   Optimizer.sgd_momentum: "SGD"}.get(t.optimizer)
    if torch_class is None:
        raise UserError(T_("no torch.optim or bitsandbytes class for the {optimizer} optimizer",
                           optimizer=t.optimizer.value))
    if t.optimizer == Optimizer.sgd_momentum:
        kwargs["momentum"] = options.momentum
    if t.optimizer_impl == OptimizerImpl.fused:
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = t.optimizer_impl == OptimizerImpl.foreach
    return f"torch.optim.{torch_class}", kwargs


def _loss(sc: Scenario) -> dict[str, Any]:
    t = sc.training
    if t.cross_entropy == "chunked":  # the recipe calls model.set_num_output_chunks(loss_fn.num_output_chunks)
        return {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss",
                "num_output_chunks": t.cross_entropy_chunks or CHUNKED_LOSS_DEFAULT_CHUNKS}
    return {"_component_": "torch.nn.CrossEntropyLoss"}


def _check(sc: Scenario) -> None:
    t = sc.training
    if t.framework != "torchtune":
        raise ValueError("the torchtune export is for framework torchtune")
    if t.lora is not None and t.optimizer_in_backward:
        raise UserError(T_("torchtune's LoRA recipe (lora_finetune_single_device) has no optimizer_in_bwd: turn "
                           "optimizer_in_backward off"))


def recipe_name(sc: Scenario) -> str:
    return "full_finetune_single_device" if sc.training.lora is None else "lora_finetune_single_device"


def torchtune_config(sc: Scenario, options: ExportOptions | None = None) -> dict[str, Any]:
    """The recipe config as a dict (the YAML's content). ValueError where the recipe cannot say the scenario."""
    _check(sc)
    options = options or ExportOptions()
    t = sc.training
    package = torchtune_model(sc)["_component_"].split(".")[2]
    model_type, tokenizer, files = _PACKAGES[package]
    out = f"/path/to/output/{recipe_name(sc)}"
    optimizer_path, optimizer_kwargs = optimizer_class(sc, options)
    cfg: dict[str, Any] = {
        "output_dir": out,
        "model": torchtune_model(sc),
        "tokenizer": {"_component_": tokenizer, **{k: f"{CHECKPOINT_DIR}/{v}" for k, v in files.items()},
                      "max_seq_len": t.seq_len},
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer",
                         "checkpoint_dir": CHECKPOINT_DIR, "checkpoint_files": ["model.safetensors"],
                         "recipe_checkpoint": None, "output_dir": "${output_dir}", "model_type": model_type},
        "resume_from_checkpoint": False,
        "dataset": {"_component_": "torchtune.datasets.alpaca_cleaned_dataset", "packed": False},
        "seed": None, "shuffle": True,
        "batch_size": t.micro_batch_size,
        "epochs": 1,
        "max_steps_per_epoch": options.total_num_steps,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "optimizer": {"_component_": optimizer_path, **optimizer_kwargs},
        # the recipe configs' schedule (the only one torchtune 0.6.1 ships); the schedule holds no tensors
        "lr_scheduler": {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                         "num_warmup_steps": options.warmup_steps},
        "loss": _loss(sc),
        "clip_grad_norm": None if t.optimizer_in_backward or not options.gradient_clipping
        else options.gradient_clipping,
        "compile": t.compile,
        "device": "cuda",
        "dtype": "bf16" if t.precision == Precision.bf16 else "fp32",
        "enable_activation_checkpointing": t.activation_checkpointing == Checkpointing.full,
        "enable_activation_offloading": t.activation_offload,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger",
                          "log_dir": "${output_dir}/logs"},
        "log_every_n_steps": 1, "log_peak_memory_stats": True,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False,
                     "output_dir": "${output_dir}/profiling_outputs", "cpu": True, "cuda": True,
                     "profile_memory": False, "with_stack": False, "record_shapes": True, "with_flops": False,
                     "wait_steps": 5, "warmup_steps": 3, "active_steps": 2, "num_cycles": 1},
    }
    if t.lora is None:
        cfg["optimizer_in_bwd"] = t.optimizer_in_backward
    else:
        cfg["save_adapter_weights_only"] = False
    return cfg


def torchtune_yaml(sc: Scenario, options: ExportOptions | None = None, lang: Lang = DEFAULT_LANG) -> str:
    """torchtune.yaml: the comment at the top (what to fill in, how it was checked), then the config."""
    cfg = torchtune_config(sc, options)
    head = translate(N_(
        "# torchtune recipe config for {recipe}, written by vramcalc with the values the memory estimate assumed.\n"
        "# Replace {placeholder} (checkpoint and tokenizer files, e.g. from `tune download`) and\n"
        "# output_dir before running; choose your dataset. The tokenizer's max_seq_len is the estimate's\n"
        "# sequence length: shorter batches use less memory.\n"
        "# Checked: torchtune's recipe ran configs like this one for two steps (a small model on the CPU,\n"
        "# the bundle's torchtune and torchao) and loaded a Hugging Face checkpoint through its checkpointer.\n"
        "# Run: tune run {recipe} --config {file}\n"), lang, recipe=recipe_name(sc), placeholder=CHECKPOINT_DIR,
        file=TORCHTUNE_FILE)
    return head + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)


def torchtune_launch_lines(sc: Scenario) -> str:
    return f"tune run {recipe_name(sc)} --config {TORCHTUNE_FILE}"


def torchtune_launch_script(sc: Scenario, lang: Lang = DEFAULT_LANG) -> str:
    """launch.sh: `tune run`, with the script's arguments as config overrides (key=value)."""
    return ("#!/usr/bin/env bash\n"
            + translate(N_("# Generated by vramcalc (calc.export). Usage: bash launch.sh [config overrides, e.g. "
                           "max_steps_per_epoch=10]"), lang) + "\n"
            "set -euo pipefail\n"
            'cd "$(dirname "$0")"\n'
            + torchtune_launch_lines(sc) + ' "$@"\n')

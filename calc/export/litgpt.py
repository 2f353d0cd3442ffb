"""LitGPT 0.5.13's fine-tuning command line for a framework-litgpt scenario: `litgpt finetune_full CHECKPOINT_DIR
...` or `litgpt finetune_lora ...` (litgpt/__main__.py's jsonargparse CLI over litgpt/finetune/full.py's and
lora.py's `setup`), with the arguments that state what the estimate assumed: --precision (bf16-true for bf16,
bf16-mixed for amp-bf16), --devices 1, --train.micro_batch_size, --train.global_batch_size (micro x devices: no
accumulation), --train.max_seq_length, the optimizer and its kernels, the LoRA flags (`lora_flags`, the one place
lora.targets is mapped to LitGPT; measure/frameworks/litgpt_run.py builds its measured models with it).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, translate
from calc.contract.scenario import Precision, Scenario
from calc.export.deepspeed import ExportOptions
from calc.export.hf import hub_id
from calc.export.torchtune import optimizer_class

# Lightning Fabric's precision for each scenario precision (lightning/fabric/plugins/precision: HalfPrecision
# converts the module to bf16, MixedPrecision runs the forward under torch.autocast with fp32 weights)
FABRIC_PRECISION = {Precision.bf16: "bf16-true", Precision.amp_bf16: "bf16-mixed", Precision.fp32: "32-true"}
LITGPT_LOSS_CHUNK = 128  # finetune/*.py call chunked_cross_entropy (chunk_size=128) and lm_head_chunk_size=128
CHECKPOINT_PLACEHOLDER = "checkpoints/YOUR_MODEL"
# Hugging Face module names -> finetune/lora.py's flags
_LORA_NAMES = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value", "o_proj": "lora_projection",
               "lm_head": "lora_head"}
_MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj"})


def lora_flags(lora: Any) -> dict[str, Any]:
    """finetune/lora.py's LoRA arguments for the scenario's lora block: attention = lora_query / key / value (the
    fused qkv's LoRAQKVLinear) and lora_projection; all-linear adds lora_mlp (lm_head stays without, as peft's
    all-linear leaves it); a list of Hugging Face names maps one to one (the MLP only as a whole)."""
    if lora.modules_to_save:
        raise UserError(T_("LitGPT's LoRA fine-tuning trains no modules in full beside the adapters: leave "
                           "modules_to_save empty"))
    flags = dict(lora_r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout)
    if lora.targets in ("attention", "all-linear"):
        return {**flags, "lora_query": True, "lora_key": True, "lora_value": True, "lora_projection": True,
                "lora_mlp": lora.targets == "all-linear", "lora_head": False}
    names = set(lora.targets)
    if names - set(_LORA_NAMES) - _MLP_NAMES or (names & _MLP_NAMES and not names >= _MLP_NAMES):
        raise UserError(T_("LitGPT's LoRA flags cannot adapt exactly {targets} (the MLP only as a whole)",
                           targets=", ".join(sorted(lora.targets))))
    return {**flags, **{flag: hf in names for hf, flag in _LORA_NAMES.items()}, "lora_mlp": names >= _MLP_NAMES}


def _check(sc: Scenario) -> None:
    t = sc.training
    if t.framework != "litgpt":
        raise ValueError("the LitGPT export is for framework litgpt")
    if t.cross_entropy_chunks not in (None, LITGPT_LOSS_CHUNK):
        raise UserError(T_("LitGPT's fine-tuning scripts take the loss in {chunk}-token chunks; their command "
                           "line cannot change it: leave cross_entropy_chunks empty", chunk=LITGPT_LOSS_CHUNK))
    if t.lora is not None and float(t.lora.alpha) != int(t.lora.alpha):
        raise UserError(T_("LitGPT's lora_alpha is an integer: choose a whole-number alpha"))


def litgpt_command(sc: Scenario, options: ExportOptions | None = None) -> str:
    """`litgpt finetune_full|finetune_lora CHECKPOINT ...` as one shell line, arguments in setup()'s names."""
    return shlex.join(litgpt_argv(sc, options))


def litgpt_argv(sc: Scenario, options: ExportOptions | None = None) -> list[str]:
    """The command's words: the subcommand, the checkpoint directory, then --name value pairs."""
    _check(sc)
    options = options or ExportOptions()
    t = sc.training
    path, kwargs = optimizer_class(sc, options)
    args: dict[str, Any] = {
        "precision": FABRIC_PRECISION[t.precision], "devices": 1,
        "train.micro_batch_size": t.micro_batch_size,
        "train.global_batch_size": t.micro_batch_size * t.gradient_accumulation_steps,
        "train.max_seq_length": t.seq_len,
        "train.lr_warmup_steps": options.warmup_steps,
        "optimizer": json.dumps({"class_path": path, "init_args": kwargs}),
    }
    if options.total_num_steps is not None:
        args["train.max_steps"] = options.total_num_steps
    if options.gradient_clipping:
        args["train.max_norm"] = options.gradient_clipping
    if t.lora is not None:
        flags = lora_flags(t.lora)
        args.update({**flags, "lora_alpha": int(flags["lora_alpha"])})
    command = "finetune_full" if t.lora is None else "finetune_lora"
    checkpoint = f"checkpoints/{hub_id(sc)}" if isinstance(sc.model, str) else CHECKPOINT_PLACEHOLDER
    words = ["litgpt", command, checkpoint]
    for name, value in args.items():
        words += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return words


def litgpt_launch_script(sc: Scenario, options: ExportOptions | None = None, lang: Lang = DEFAULT_LANG) -> str:
    """launch.sh: the finetune command, with the script's arguments appended (e.g. --data JSON --data.json_path
    ...), and a comment on what to fill in and how the line was checked."""
    argv = litgpt_argv(sc, options)
    head = translate(N_(
        "# Generated by vramcalc (calc.export): LitGPT fine-tuning with the values the memory estimate assumed.\n"
        "# First put the model's LitGPT checkpoint in {checkpoint} (e.g. `litgpt download <repo>`).\n"
        "# The default data set is Alpaca; pass --data ... to choose yours. Usage: bash launch.sh [more arguments]\n"
        "# This command line was checked with LitGPT's own parser, not run end to end.\n"), lang,
        checkpoint=argv[2])
    lines = " \\\n  ".join(shlex.join(argv[i:i + 2]) for i in range(3, len(argv), 2))
    return ("#!/usr/bin/env bash\n" + head + "set -euo pipefail\n" + 'cd "$(dirname "$0")"\n'
            + f"{shlex.join(argv[:3])} \\\n  {lines} \\\n  \"$@\"\n")

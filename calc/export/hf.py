"""The same setup for the Hugging Face Trainer (TrainingArguments kwargs + a runnable train.py) and an
accelerate config (YAML).

DeepSpeed is used (TrainingArguments(deepspeed=...), accelerate distributed_type DEEPSPEED) whenever
the scenario needs it: a ZeRO stage, or DeepSpeed's own 16-bit weights (bf16-mixed / fp16-mixed /
pure bf16). AMP at ZeRO 0 is the Trainer's own autocast (bf16=True / fp16=True) over plain DDP.
The ds_config the kwargs point to is calc.export.deepspeed's, with the same hyper-parameters, so the
Trainer's consistency checks (batch sizes, lr, betas, clipping) pass; the optimizer is the ds_config's
(its "optimizer" block wins over `optim`) and the learning-rate schedule is the Trainer's own.

train.py builds TrainingArguments before the model: with ZeRO-3 in the ds_config, TrainingArguments
registers it (transformers.integrations.HfDeepSpeedConfig), so from_config / from_pretrained run
under deepspeed.zero.Init and every rank only ever holds its partition of the weights.
"""

from __future__ import annotations

import json
import pprint
import re
from typing import Any

import yaml

from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, Text, translate
from calc.contract.presets import model_presets, resolve_hardware
from calc.contract.scenario import Checkpointing, Mode, Optimizer, OptimizerImpl, Precision, Scenario, TrainingConfig
from calc.contract.stacks import trainer_uses_deepspeed
from calc.export.deepspeed import ExportOptions, ds_optimizer_name, schedule_description

DS_CONFIG_FILE = "ds_config.json"
# Config keys that describe a checkpoint, not the architecture (the dtype comes from the precision).
_CHECKPOINT_KEYS = ("torch_dtype", "dtype", "architectures", "transformers_version", "_name_or_path")


def uses_deepspeed(sc: Scenario) -> bool:
    return trainer_uses_deepspeed(sc.training.zero_stage, sc.training.precision)


# TrainingArguments.optim of each bitsandbytes optimizer (transformers' OptimizerNames)
TRAINER_BNB_OPTIM = {Optimizer.adamw_8bit: "adamw_bnb_8bit", Optimizer.paged_adamw: "paged_adamw_32bit",
                     Optimizer.paged_adamw_8bit: "paged_adamw_8bit"}


def _optim(t: TrainingConfig) -> tuple[str, str | None, list[Text]]:
    """(TrainingArguments.optim, optim_args, notes)."""
    notes: list[Text] = []
    if t.optimizer == Optimizer.adamw:
        return ("adamw_torch_fused" if t.optimizer_impl == OptimizerImpl.fused else "adamw_torch"), \
            ("foreach=False" if t.optimizer_impl == OptimizerImpl.for_loop else None), notes
    if t.optimizer == Optimizer.adam:
        notes.append(T_("the Trainer has no plain Adam: adamw_torch with weight_decay=0 is the same update"))
        return "adamw_torch", None, notes
    if t.optimizer.bitsandbytes:
        return TRAINER_BNB_OPTIM[t.optimizer], None, notes
    if t.optimizer == Optimizer.sgd:
        return "sgd", None, notes
    if t.optimizer == Optimizer.sgd_momentum:
        return "sgd", "momentum=0.9", notes
    notes.append(T_("optim='adafactor' is transformers' Adafactor (factored second moment, like torch.optim.Adafactor)"))
    return "adafactor", None, notes


def _lr_scheduler_type(o: ExportOptions) -> str:
    """The Trainer's name for calc.export.deepspeed's schedule (schedule_description)."""
    if o.total_num_steps:
        return "linear"
    return "constant_with_warmup" if o.warmup_steps else "constant"


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
        "lr_scheduler_type": _lr_scheduler_type(o),
        "optim": optim,
        "bf16": t.precision in (Precision.amp_bf16, Precision.bf16_mixed, Precision.bf16),
        "fp16": t.precision in (Precision.amp_fp16, Precision.fp16_mixed),
        # transformers 5.x name (gradient_checkpointing is its deprecated alias). Selective checkpointing is
        # train.py's own (checkpoint_attention): the Trainer checkpoints whole layers only.
        "activation_checkpointing": t.activation_checkpointing == Checkpointing.full,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    if o.total_num_steps:
        kw["max_steps"] = o.total_num_steps
    if optim_args:
        kw["optim_args"] = optim_args
    if kw["activation_checkpointing"]:
        kw["activation_checkpointing_kwargs"] = {"use_reentrant": False}
        if t.checkpoint_every > 1:  # transformers 5.2x: layers with index % every_n_layers == 0, as the estimate
            kw["activation_checkpointing_kwargs"]["every_n_layers"] = t.checkpoint_every
    if t.cross_entropy == "liger-fused":  # only the fused loss, as the calculator models it
        kw["use_liger_kernel"] = True
        kw["liger_kernel_config"] = {"fused_linear_cross_entropy": True, "cross_entropy": False, "rope": False,
                                     "rms_norm": False, "swiglu": False}
    if uses_deepspeed(sc):
        kw["deepspeed"] = deepspeed_config_path
    return kw


def hub_id(sc: Scenario) -> str | None:
    """The Hugging Face repository of a preset model (its source URL), None for a config dict."""
    if not isinstance(sc.model, str):
        return None
    src = model_presets()[sc.model].source
    m = re.match(r"https://huggingface\.co/([^/]+/[^/]+)/", src)
    return m.group(1) if m else sc.model


def architecture_config(sc: Scenario) -> dict[str, Any] | None:
    if not isinstance(sc.model, dict):
        return None
    return {k: v for k, v in sc.model.items() if k not in _CHECKPOINT_KEYS}


def python_literal(value: Any) -> str:
    """A Python literal for JSON-like data (True/False/None, never JSON's true/false/null)."""
    return pprint.pformat(value, indent=1, width=110, sort_dicts=False)


_DTYPES = {Precision.fp32: "float32", Precision.amp_bf16: "float32", Precision.amp_fp16: "float32",
           Precision.bf16_mixed: "bfloat16", Precision.bf16: "bfloat16", Precision.fp16_mixed: "float16"}

# The words of train.py (docstrings, comments, --help and messages) follow the export's language; its
# code does not. Each is one message id; {name}-style fields are filled before the script is formatted.
_SCRIPT_WORDS: dict[str, str] = {
    "t_title": N_("Train {name} with the Hugging Face Trainer, as vramcalc estimated it."),
    "t_runs": N_("Generated by vramcalc (calc.export). Runs as written:"),
    "t_one_process": N_("one process"),
    "t_ds_launcher": N_("DeepSpeed's launcher"),
    "t_usage": N_("Every TrainingArguments flag works (--max_steps, --output_dir, --save_strategy, ...). With no\n"
                  "--dataset it trains on generated random tokens; --dataset FILE.jsonl reads {{\"input_ids\": "
                  "[...]}} lines.\n--model_config config.json builds that architecture with random weights "
                  "instead of {source}."),
    "t_selective_flag": N_("checkpoint each decoder layer's attention (selective checkpointing)"),
    "t_selective": N_("Selective checkpointing: each decoder layer's attention call (projections, RoPE and the\n"
                      "    attention itself) is recomputed in the backward pass (torch.utils.checkpoint, use_reentrant="
                      "False);\n    the MLP and the norms keep their activations. The recomputed call gets no KV "
                      "cache."),
    "t_quant": N_("bitsandbytes BitsAndBytesConfig kwargs for a QLoRA base"),
    "t_quantize": N_("A QLoRA base built from a config: from_config takes no quantization_config, so every nn.Linear\n"
                     "    and Conv1D but the modules transformers keeps in full (lm_head, tied weights) becomes the\n"
                     "    bitsandbytes layer from_pretrained's BitsAndBytesConfig makes (transformers'\n"
                     "    replace_with_bnb_linear), its weight quantized from the random one."),
    "t_steps": N_("optimizer steps the generated dataset covers when --max_steps is not given"),
    "t_help_dataset": N_("JSON lines of {'input_ids': [...]}"),
    "t_help_config": N_("config.json: random weights"),
    "t_help_seq": N_("tokens per sample"),
    "t_random": N_("Reproducible random token ids (sample i is seeded with i), labels = inputs."),
    "t_file": N_("Fixed-length chunks of the token ids in a JSON-lines file."),
    "t_too_short": N_("{path}: fewer than {seq_len} tokens"),  # an f-string in train.py: no fields here
    "t_single": N_("`python train.py` alone: the rendezvous variables a launcher would set (one rank)."),
    "t_build": N_("After TrainingArguments: under ZeRO-3 this runs inside deepspeed.zero.Init (partitioned)."),
    "t_report": N_("One line per rank: under ZeRO-3 every parameter is a partitioned DeepSpeed parameter (ds_numel\n"
                   "    elements in all, ds_tensor this rank's share, ds_status NOT_AVAILABLE until gathered)."),
    "t_one_write": N_("one write per line, so that ranks sharing an unbuffered stream (`python -u`) do not split it"),
    "t_note": N_("Note: {note}."),
    "t_embedded": N_("the embedded config"),
    "t_shutdown": N_("end the process group before exiting: its communication threads left running abort the "
                     "process at exit (SIGABRT after a finished run)"),
}

_SCRIPT = '''\
"""{t_title}

{t_runs}
    python train.py [--max_steps N]                                    # {t_one_process}
    deepspeed --num_gpus G train.py [--max_steps N]                    # {t_ds_launcher}
    accelerate launch --config_file accelerate.yaml train.py [--max_steps N]
{t_usage}
{notes}"""

import json
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments

MODEL_ID = {model_id!r}
MODEL_CONFIG = {model_config}
TRAINING_ARGUMENTS = {training_arguments}
SEQ_LEN = {seq_len}
DTYPE = torch.{dtype}
ATTENTION = {attention!r}
LORA = {lora}
QUANTIZATION = {quant}  # {t_quant}
CHECKPOINT_KEYS = {checkpoint_keys!r}
SELECTIVE_CHECKPOINTING = {selective!r}  # {t_selective_flag}
ATTENTION_MODULES = ("self_attn", "attn", "attention")
DEFAULT_STEPS = 100  # {t_steps}


@dataclass
class ScriptArguments:
    dataset: str | None = field(default=None, metadata={{"help": {t_help_dataset}}})
    model_config: str | None = field(default=None, metadata={{"help": {t_help_config}}})
    seq_len: int = field(default=SEQ_LEN, metadata={{"help": {t_help_seq}}})


class RandomTokens(torch.utils.data.Dataset):
    """{t_random}"""

    def __init__(self, samples, seq_len, vocab_size):
        self.samples, self.seq_len, self.vocab_size = samples, seq_len, vocab_size

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        ids = torch.randint(self.vocab_size, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {{"input_ids": ids, "labels": ids}}


class TokenFile(torch.utils.data.Dataset):
    """{t_file}"""

    def __init__(self, path, seq_len):
        ids = []
        with open(path) as fh:
            for line in fh:
                if line.strip():
                    ids.extend(json.loads(line)["input_ids"])
        self.chunks = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
        if not self.chunks:
            raise SystemExit(f{t_too_short})

    def __len__(self):
        return len(self.chunks)

    def __getitem__(self, i):
        ids = torch.tensor(self.chunks[i])
        return {{"input_ids": ids, "labels": ids}}


def single_process_defaults():
    """{t_single}"""
    if "LOCAL_RANK" not in os.environ:
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("RANK", "0"),
                           ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)


def build_model(script):
    """{t_build}"""
    cfg = MODEL_CONFIG
    if script.model_config:
        with open(script.model_config) as fh:
            cfg = json.load(fh)
    kwargs = {{"attn_implementation": ATTENTION, "dtype": DTYPE}}
    if cfg is None:
        if QUANTIZATION is not None:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(**QUANTIZATION)
        return AutoModelForCausalLM.from_pretrained(MODEL_ID, **kwargs)
    cfg = {{k: v for k, v in cfg.items() if k not in CHECKPOINT_KEYS}}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model if QUANTIZATION is None else quantize_linear_layers(model)


def quantize_linear_layers(model):
    """{t_quantize}"""
    import bitsandbytes as bnb
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    device = f"cuda:{{int(os.environ.get('LOCAL_RANK', '0'))}}" if torch.cuda.is_available() else "cpu"
    skip = get_keys_to_not_convert(model) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
    q = QUANTIZATION
    for name, module in list(model.named_modules()):
        if not should_convert_module(name, skip) or not (isinstance(module, Conv1D) or type(module) is torch.nn.Linear):
            continue
        weight = module.weight.data.T if isinstance(module, Conv1D) else module.weight.data  # Conv1D: in x out
        out_features, in_features = weight.shape
        bias = module.bias is not None
        if q.get("load_in_8bit"):
            new = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False, threshold=6.0)
            new.weight = bnb.nn.Int8Params(weight.contiguous(), requires_grad=False, has_fp16_weights=False)
        else:
            kind, double = q["bnb_4bit_quant_type"], q["bnb_4bit_use_double_quant"]
            new = bnb.nn.Linear4bit(in_features, out_features, bias=bias, quant_type=kind, compress_statistics=double,
                                    compute_dtype=getattr(torch, q["bnb_4bit_compute_dtype"]))
            new.weight = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, quant_type=kind,
                                           compress_statistics=double)
        if bias:
            new.bias = torch.nn.Parameter(module.bias.data, requires_grad=False)
        new.source_cls = type(module)  # as transformers marks it (peft reads the original class)
        model.set_submodule(name, new.to(device))  # bitsandbytes quantizes the weight as it moves
    model.is_loaded_in_8bit, model.is_loaded_in_4bit = bool(q.get("load_in_8bit")), bool(q.get("load_in_4bit"))
    return model


def report_parameters(model):
    """{t_report}"""
    params = list(model.parameters())
    total = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
    zero3 = [p for p in params if hasattr(p, "ds_status")]
    status = sorted({{p.ds_status.name for p in zero3}})
    # {t_one_write}
    sys.stdout.write(f"[rank {{os.environ.get('RANK', '0')}}] parameters: {{total:,}}, held by this rank: "
                     f"{{held:,}}, partitioned by ZeRO-3: {{len(zero3)}} of {{len(params)}} tensors {{status}}\\n")
    sys.stdout.flush()


def checkpoint_attention(model):
    """{t_selective}"""
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_layers import GradientCheckpointingLayer

    for layer in [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]:
        attn = next(getattr(layer, a) for a in ATTENTION_MODULES if hasattr(layer, a))
        original = attn.forward

        def forward(*args, _original=original, _module=attn, **kwargs):
            if not (torch.is_grad_enabled() and _module.training):
                return _original(*args, **kwargs)
            kwargs = {{k: None if k in ("past_key_values", "past_key_value") else v for k, v in kwargs.items()}}
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        attn.forward = forward
    return model


def with_lora(model):
    if LORA is None:
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if QUANTIZATION is not None:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))


def main():
    single_process_defaults()
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    parser.set_defaults(**TRAINING_ARGUMENTS)
    script, args = parser.parse_args_into_dataclasses()
    model = build_model(script)
    report_parameters(model)
    model = with_lora(model)
    if SELECTIVE_CHECKPOINTING:
        checkpoint_attention(model)
    if script.dataset:
        data = TokenFile(script.dataset, script.seq_len)
    else:
        steps = args.max_steps if args.max_steps > 0 else DEFAULT_STEPS
        samples = steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        data = RandomTokens(samples, script.seq_len, model.config.get_text_config().vocab_size)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    if torch.distributed.is_initialized():
        # {t_shutdown}
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def _script_words(sc: Scenario, notes: list[Text], lang: Lang) -> dict[str, str]:
    """The words of train.py in `lang`: docstrings and comments as text, --help and messages as literals."""
    words = {key: translate(msgid, lang) for key, msgid in _SCRIPT_WORDS.items()}
    words["t_title"] = translate(_SCRIPT_WORDS["t_title"], lang, name=sc.spec.name or sc.spec.family)
    words["t_usage"] = translate(_SCRIPT_WORDS["t_usage"], lang, source=hub_id(sc) or words["t_embedded"])
    for key in ("t_help_dataset", "t_help_config", "t_help_seq", "t_too_short"):  # Python string literals
        words[key] = json.dumps(words[key], ensure_ascii=False)
    words["notes"] = "".join("\n" + translate(_SCRIPT_WORDS["t_note"], lang, note=n.render(lang)) for n in notes)
    words["notes"] += "\n" if notes else ""
    return words


def trainer_snippet(sc: Scenario, options: ExportOptions | None = None,
                    deepspeed_config_path: str = DS_CONFIG_FILE, lang: Lang = DEFAULT_LANG) -> str:
    """train.py: a script that runs as written (see its docstring) and trains the scenario. Its comments,
    docstrings and --help follow `lang`; its code is the same in every language."""
    t = sc.training
    o = options or ExportOptions()
    kw = trainer_arguments(sc, o, deepspeed_config_path)
    dtype = "bfloat16" if t.lora is not None and t.precision != Precision.fp32 else _DTYPES[t.precision]
    if t.lora is not None and t.lora.base_weights == "fp16":
        dtype = "float16"
    lora = peft_lora_kwargs(t)
    quant = None
    if t.lora is not None and t.lora.base_weights in ("nf4", "fp4"):
        quant = {"load_in_4bit": True, "bnb_4bit_quant_type": t.lora.base_weights,
                 "bnb_4bit_use_double_quant": t.lora.double_quant, "bnb_4bit_compute_dtype": "bfloat16"}
    elif t.lora is not None and t.lora.base_weights == "int8":
        quant = {"load_in_8bit": True}
    return _SCRIPT.format(
        **_script_words(sc, script_notes(sc, o), lang),
        model_id=hub_id(sc), model_config=python_literal(architecture_config(sc)), training_arguments=python_literal(kw),
        seq_len=t.seq_len, dtype=dtype, attention=t.attention.value, lora=python_literal(lora), quant=python_literal(quant),
        checkpoint_keys=_CHECKPOINT_KEYS, selective=t.activation_checkpointing == Checkpointing.selective)


def peft_lora_kwargs(t: TrainingConfig) -> dict[str, Any] | None:
    """peft.LoraConfig kwargs of the scenario's LoRA (None without): rank, alpha, the target modules ("attention"
    is the four attention projections), dropout and modules_to_save where set."""
    if t.lora is None:
        return None
    names = t.lora.targets
    targets = list(names) if isinstance(names, tuple) else \
        "all-linear" if names == "all-linear" else ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora: dict[str, Any] = {"r": t.lora.rank, "lora_alpha": t.lora.alpha, "target_modules": targets}
    if t.lora.dropout:
        lora["lora_dropout"] = t.lora.dropout
    if t.lora.modules_to_save:
        lora["modules_to_save"] = list(t.lora.modules_to_save)
    return lora


def script_notes(sc: Scenario, o: ExportOptions) -> list[Text]:
    """What the run will use, and what the script cannot express."""
    t = sc.training
    _, _, notes = _optim(t)
    if uses_deepspeed(sc):
        notes = [T_("optimizer: {name} (the ds_config's optimizer block; `optim` is not used)",
                    name=ds_optimizer_name(sc))]
    notes.append(T_("learning rate: lr_scheduler_type {kind}: {schedule}", kind=repr(_lr_scheduler_type(o)),
                    schedule=schedule_description(o)))
    if t.tensor_parallel > 1:
        notes.append(T_("tensor parallelism {tp}: DeepSpeed AutoTP (tensor_parallel.autotp_size in the ds_config) "
                        "splits the linear layers as the model loads", tp=t.tensor_parallel))
    if t.activation_checkpointing == Checkpointing.selective:
        notes.append(T_("selective checkpointing: checkpoint_attention() recomputes each layer's attention in the "
                        "backward pass; the MLP and norms keep their activations"))
    elif t.activation_checkpointing == Checkpointing.full and t.checkpoint_every > 1:
        notes.append(T_("checkpointing 1 in {every} layers (the first, then every {every}th): "
                        "activation_checkpointing_kwargs every_n_layers={every}", every=t.checkpoint_every))
    return notes


def node_layout_problem(sc: Scenario) -> Text | None:
    """Why no launch line can start the scenario's GPUs, or None. accelerate (num_processes / num_machines per
    machine), torchrun (--nproc_per_node) and DeepSpeed's launcher (--num_gpus per node) each start the same number
    of processes on every node, so the GPUs must fill whole nodes: 12 GPUs at 8 per node (8 + 4) cannot be said,
    and are not quietly exported as 2 x 6 either, since the estimate's speed (what stays inside a node) assumed 8."""
    hw = resolve_hardware(sc.hardware)
    per_node = hw.gpus_in_node()
    if hw.num_gpus % per_node == 0:
        return None
    even = max(d for d in range(1, per_node + 1) if hw.num_gpus % d == 0)
    return T_("{gpus} GPUs at {per_node} per node leave a node with {rest}: accelerate, torchrun and DeepSpeed's "
              "launcher start the same number of processes on every node. Set GPUs per node to {even} "
              "({nodes} nodes of {even}), or use a multiple of {per_node} GPUs", gpus=hw.num_gpus, per_node=per_node,
              rest=hw.num_gpus % per_node, even=even, nodes=hw.num_gpus // even)


def node_shape(sc: Scenario) -> tuple[int, int]:
    """(processes per node, nodes): the cluster's node size, else up to 8 GPUs per node; UserError when the GPUs do
    not fill whole nodes (node_layout_problem)."""
    problem = node_layout_problem(sc)
    if problem is not None:
        raise UserError(problem)
    hw = resolve_hardware(sc.hardware)
    per_node = hw.gpus_in_node()
    return per_node, hw.num_gpus // per_node


def accelerate_config(sc: Scenario, deepspeed_config_path: str = DS_CONFIG_FILE, lang: Lang = DEFAULT_LANG) -> str:
    """accelerate's config.yaml (ClusterConfig fields) for the same number of machines and processes: num_processes
    is accelerate's total over all machines (it starts num_processes / num_machines on each), so it equals the GPUs.
    With DeepSpeed the precision lives in the ds_config alone: accelerate refuses mixed_precision beside
    deepspeed_config_file (accelerate/utils/dataclasses.py, DeepSpeedPlugin)."""
    t = sc.training
    hw = resolve_hardware(sc.hardware)
    _, machines = node_shape(sc)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "DEEPSPEED" if uses_deepspeed(sc) else ("MULTI_GPU" if hw.num_gpus > 1 else "NO"),
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
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
    else:
        cfg["mixed_precision"] = "bf16" if t.precision == Precision.amp_bf16 else \
            "fp16" if t.precision == Precision.amp_fp16 else "no"
    if machines > 1:
        cfg["main_process_ip"] = "MAIN_NODE_IP"
        cfg["main_process_port"] = 29500
    name = sc.spec.name or sc.spec.family
    msgid = N_("# accelerate config for {name}: {gpus} GPUs on {machines} machine(s).\n"
               "# Set machine_rank per node.\n") if machines == 1 else \
        N_("# accelerate config for {name}: {gpus} GPUs on {machines} machine(s).\n"
           "# Set machine_rank per node and main_process_ip.\n")
    head = translate(msgid, lang, name=name, gpus=hw.num_gpus, machines=machines)
    return head + yaml.safe_dump(cfg, sort_keys=True)

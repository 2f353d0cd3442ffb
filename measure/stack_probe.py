"""Which configurations the Hugging Face Trainer + DeepSpeed stack actually trains, found by running it.

    python -m measure.stack_probe [--only z3-tp2-full-llama ...] [-o data/stack_support.yaml]

For every cell of the matrix (ZeRO stage x AutoTP size x full / LoRA / QLoRA x dense / MoE family, parameter
offload at ZeRO-3, pipeline parallelism) a tiny random-weight model of the family (64 wide, 2 layers) is saved
with save_pretrained, and two ranks (torchrun, gloo, DeepSpeed's CPU accelerator) do what the exported train.py
does: TrainingArguments(deepspeed=ds_config) first (ZeRO-3 then loads under zero.Init), from_pretrained of the
saved folder (with a BitsAndBytesConfig for QLoRA), PEFT's LoRA, Trainer.train() for two steps. A cell works when
both ranks finish with finite losses and something left to train; otherwise the table keeps the first line of
the error. The result, with the versions it was run with, is data/stack_support.yaml, which
calc.contract.stacks reads (the recommender and the exporter ask it).

Cost: one launch per cell (a failing rank must not leave the other waiting in a collective), about 25-40 s each
on 2 cores; the whole matrix takes about half an hour. tests/measure/test_stack_probe.py re-runs a few cells.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from measure.deepspeed_run import free_port
from measure.shm_buffers import remove_segments

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "data" / "stack_support.yaml"
STACK = "transformers-deepspeed"
CELL_TIMEOUT_S = 300
WORLD = 2  # ranks per cell
NUMEL_FILE = "numel.txt"  # the saved model's element count, beside its weights
MODELS = ("llama", "mixtral", "qwen3_moe")
METHODS = ("full", "lora", "qlora")


def tiny_config(model_type: str) -> dict[str, Any]:
    """A 64-wide, 2-layer config of the family: GQA (4 query heads, 2 key/value heads), 4 experts of which 2 are
    routed per token for the MoE families, so every tensor the real model has is there."""
    cfg: dict[str, Any] = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "vocab_size": 512, "max_position_embeddings": 64}
    if model_type == "mixtral":
        cfg.update(num_local_experts=4, num_experts_per_tok=2)
    if model_type == "qwen3_moe":
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16,
                   decoder_sparse_step=1, mlp_only_layers=[])
    return cfg


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix."""

    zero: int
    tp: int
    method: str  # full | lora | qlora
    model: str  # a model_type
    offload_param: bool = False
    pp: int = 1

    @property
    def name(self) -> str:
        extra = ("-offload" if self.offload_param else "") + (f"-pp{self.pp}" if self.pp > 1 else "")
        return f"z{self.zero}-tp{self.tp}-{self.method}-{self.model}{extra}"

    def ds_config(self) -> dict[str, Any]:
        """The ds_config the exporter writes for such a scenario (its batch sizes and precision, no optimizer block:
        the Trainer's AdamW, so no cell waits for DeepSpeed's CPU Adam build)."""
        zero: dict[str, Any] = {"stage": self.zero}
        if self.offload_param:
            zero["offload_param"] = {"device": "cpu"}
        # as the exporter: no train_batch_size, DeepSpeed derives it over the data-parallel ranks (world / TP)
        cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "gradient_clipping": 1.0, "bf16": {"enabled": True},
                               "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False}
        if self.tp > 1:
            cfg["tensor_parallel"] = {"autotp_size": self.tp}
        if self.pp > 1:
            cfg["pipeline"] = {"stages": self.pp}
        return cfg


def matrix() -> list[Cell]:
    """ZeRO 0-3 x AutoTP 1/2 x full / LoRA / QLoRA x the three families; parameter offload at ZeRO-3 (the only stage
    that has it); pipeline parallelism at ZeRO 0 and 1 (DeepSpeed's pipeline engine has no ZeRO-2/3)."""
    cells = [Cell(z, tp, m, fam) for fam in MODELS for m in METHODS for tp in (1, 2) for z in range(4)
             if not (m == "qlora" and z == 3)]  # quantized weights are not partitioned: the calculator never asks
    cells += [Cell(3, tp, m, "llama", offload_param=True) for tp in (1, 2) for m in ("full", "lora")]
    cells += [Cell(z, 1, "full", "llama", pp=2) for z in (0, 1)]
    return cells


# ---- one rank ------------------------------------------------------------------------------------------------

def _load(cell: Cell, folder: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16}
    if cell.method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if cell.method == "full":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cell.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


class _Tokens:
    def __init__(self, n: int, vocab: int) -> None:
        self.n, self.vocab = n, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        ids = torch.randint(self.vocab, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def run_rank(cell: Cell, folder: str, out: str) -> dict[str, Any]:
    """What the exported train.py does, for this cell: TrainingArguments first, the pretrained load, two steps."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=1, max_steps=2, logging_steps=1,
                             learning_rate=1e-4, bf16=True, use_cpu=True, deepspeed=cell.ds_config(),
                             save_strategy="no", report_to="none")
    model = _load(cell, folder)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(64, 512), callbacks=[Losses()])
    trainer.train()
    engine = trainer.model_wrapped
    trainable_after = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if trainable_after == 0:
        raise RuntimeError(f"no trainable parameter left after DeepSpeed's setup ({trainable:,} before)")
    if not losses or not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"losses not finite: {losses}")
    whole = int((Path(folder) / NUMEL_FILE).read_text())
    held = sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters())  # this rank's TP slice
    if cell.tp > 1 and held >= whole:
        raise RuntimeError(f"tensor parallelism split nothing: each rank holds all {whole:,} elements")
    if cell.pp > 1 and type(engine).__name__ != "PipelineEngine":
        raise RuntimeError(f"the Trainer's model is not a pipeline (DeepSpeed built {type(engine).__name__}): "
                           f"PP {cell.pp} runs as data parallelism")
    return {"losses": losses, "trainable": trainable_after}


def rank_main(cell_json: str, folder: str, result: str) -> int:
    import traceback

    cell = Cell(**json.loads(cell_json))
    rank = os.environ.get("RANK", "0")
    try:
        with tempfile.TemporaryDirectory() as out:
            record: dict[str, Any] = {"works": True, **run_rank(cell, folder, out)}
    except Exception as exc:  # the table keeps the error; the launch's exit code tells the other rank
        first = (str(exc).strip().splitlines() or [""])[0]
        where = traceback.extract_tb(exc.__traceback__)[-1]  # a KeyError's message alone can be a tensor's repr
        record = {"works": False, "error": f"{type(exc).__name__} (in {where.name}): {first}"[:300],
                  "traceback": traceback.format_exc()[-2000:]}
    Path(f"{result}.rank{rank}").write_text(json.dumps(record))
    return 0 if record["works"] else 1


# ---- the driver ----------------------------------------------------------------------------------------------

def save_tiny(model_type: str, folder: Path) -> None:
    """save_pretrained of a random-weight tiny model: the folder from_pretrained reads in each run."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_config(model_type)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    (folder / NUMEL_FILE).write_text(str(sum(p.numel() for p in model.parameters())))


def env() -> dict[str, str]:
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
             PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    e.pop("LOCAL_RANK", None)
    return e


def run_cell(cell: Cell, folder: Path, tmp: Path) -> dict[str, Any]:
    """Launch two ranks for the cell; {"works": bool, "error": first line} (rank 0's error, else rank 1's)."""
    result = tmp / cell.name
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "--master_port", str(port),
           "-m", "measure.stack_probe", "--rank", json.dumps(cell.__dict__), str(folder), str(result)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=CELL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"works": False, "error": f"no result within {CELL_TIMEOUT_S} s (a rank waited for the other)"}
    finally:
        remove_segments(port)  # DeepSpeed's CPU all-reduce segments outlive the ranks (measure/shm_buffers.py)
    records = [json.loads(p.read_text()) for k in (0, 1) if (p := Path(f"{result}.rank{k}")).exists()]
    failed = [rec for rec in records if not rec["works"]]
    if r.returncode == 0 and len(records) == 2 and not failed:
        return {"works": True}
    if failed:
        return {"works": False, "error": failed[0]["error"]}
    tail = [line for line in (r.stderr or r.stdout).splitlines() if "Error" in line][-1:] or ["no output"]
    return {"works": False, "error": tail[0].strip()[:300]}


def versions() -> dict[str, str]:
    import deepspeed
    import peft
    import torch
    import transformers

    return {"transformers": transformers.__version__, "deepspeed": deepspeed.__version__,
            "torch": torch.__version__.split("+")[0], "peft": peft.__version__}


def probe(cells: list[Cell], log: Any = sys.stderr) -> list[dict[str, Any]]:
    """Run the cells, each with its family's saved tiny model; one row per cell."""
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for model_type in sorted({c.model for c in cells}):
            save_tiny(model_type, tmp / model_type)
        for cell in cells:
            row = {"zero": cell.zero, "tp": cell.tp, "method": cell.method, "model": cell.model,
                   "offload_param": cell.offload_param, "pp": cell.pp, **run_cell(cell, tmp / cell.model, tmp)}
            print(cell.name, "works" if row["works"] else row["error"], file=log, flush=True)
            rows.append(row)
    return rows


def write_table(rows: list[dict[str, Any]], path: Path) -> None:
    doc = {"stack": STACK, "versions": versions(), "cells": rows}
    head = "# Written by `python -m measure.stack_probe` (2 CPU ranks, gloo, tiny random-weight models).\n"
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=200))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--rank":
        return rank_main(*argv[1:4])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="cell names (z3-tp2-full-llama, ...); the others keep their rows")
    ap.add_argument("-o", "--output", default=str(TABLE))
    a = ap.parse_args(argv)
    cells = [c for c in matrix() if not a.only or c.name in a.only]
    rows = probe(cells)
    out = Path(a.output)
    if a.only and out.exists():  # a partial run updates its rows in the committed table
        names = {c.name for c in cells}
        old = [r for r in yaml.safe_load(out.read_text())["cells"] if Cell(**{k: r[k] for k in (
            "zero", "tp", "method", "model", "offload_param", "pp")}).name not in names]
        rows = old + rows
    write_table(rows, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

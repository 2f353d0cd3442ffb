"""What the Hugging Face Trainer + DeepSpeed stack trains, as measured by running it (data/stack_support.yaml,
written by `python -m measure.stack_probe`): the one answer the recommender (calc.recommend.combos) and the
exporter (calc.export.bundle) both ask, so nothing is ranked that the exported files cannot start.

A cell is (ZeRO stage, AutoTP size, full / LoRA / QLoRA, model family, parameter offload, pipeline stages). The
probe ran AutoTP size 2 and 2 pipeline stages: a larger size takes the size-2 cell (AutoTP shards the same layers at
every size; the Trainer builds no pipeline at any depth). A model
family the probe did not run takes the verdict of the families of its kind (dense or mixture-of-experts): a
configuration that fails for any probed family of the kind is not offered for the others either. Cells the probe
did not run (QLoRA at ZeRO-3, which the calculator refuses anyway) are not judged here.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from calc.contract.i18n import N_, T_, Text
from calc.contract.scenario import Checkpointing, LoraConfig, Mode, Offload, Optimizer, Precision, Scenario

TABLE_PATH = Path(__file__).resolve().parents[2] / "data" / "stack_support.yaml"
PROBED_TP = PROBED_PP = 2  # the AutoTP size and pipeline depth the probe ran beside 1
DENSE_PROBE, MOE_PROBE = ("llama",), ("mixtral", "qwen3_moe")  # the families that stand for their kind
Method = Literal["full", "lora", "qlora"]
METHOD_WORDS: dict[str, str] = {"full": N_("full fine-tuning"), "lora": N_("LoRA"), "qlora": N_("QLoRA")}


class SupportCell(BaseModel):
    """One run of the probe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zero: int = Field(ge=0, le=3, description="ZeRO stage")
    tp: int = Field(ge=1, description="DeepSpeed AutoTP size (tensor_parallel.autotp_size); 1 = none")
    method: Method
    model: str = Field(description="transformers model_type of the tiny model")
    offload_param: bool = Field(description="zero_optimization.offload_param to the CPU (ZeRO-3 only)")
    pp: int = Field(ge=1, description="pipeline stages asked of DeepSpeed")
    works: bool = Field(description="two ranks trained two steps with finite losses and trainable parameters")
    error: str | None = Field(None, description="the first line of the error where it did not")

    def key(self) -> tuple:
        return self.zero, self.tp, self.method, self.model, self.offload_param, self.pp


class SupportTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    versions: dict[str, str] = Field(description="transformers, deepspeed, torch and peft the cells ran with")
    cells: list[SupportCell]


@cache
def support_table() -> SupportTable:
    """data/stack_support.yaml, read and validated once."""
    return SupportTable.model_validate(yaml.safe_load(TABLE_PATH.read_text(encoding="utf-8")))


@cache
def _cells() -> dict[tuple, SupportCell]:
    return {c.key(): c for c in support_table().cells}


def method_of(lora: LoraConfig | None) -> Method:
    if lora is None:
        return "full"
    return "qlora" if lora.quantized else "lora"


def failing_cell(family: str, moe: bool, zero: int, tp: int, pp: int, method: Method,
                 offload_param: bool) -> SupportCell | None:
    """The probed cell that says this configuration does not train, or None (it trained, or was not probed)."""
    cells = _cells()
    families = (family,) if any(k[3] == family for k in cells) else (MOE_PROBE if moe else DENSE_PROBE)
    tp, pp = min(tp, PROBED_TP), min(pp, PROBED_PP)
    if pp > 1:  # the probe asked for pipelines of full fine-tuning with the dense family only
        families, method, tp, offload_param = DENSE_PROBE, "full", 1, False
    for fam in families:
        cell = cells.get((zero, tp, method, fam, offload_param, pp))
        if cell is not None and not cell.works:
            return cell
    return None


@cache
def stack_problem(family: str, moe: bool, zero: int, tp: int, pp: int, method: Method, offload_param: bool,
                  deepspeed: bool) -> Text | None:
    """Why the Trainer (with DeepSpeed where `deepspeed`) cannot train this configuration, or None. Without DeepSpeed
    the Trainer is plain DDP: tensor and pipeline parallelism reach nothing there."""
    if not deepspeed and (tp > 1 or pp > 1):
        return T_("tensor parallelism {tp} x pipeline {pp} needs DeepSpeed: without a ZeRO stage or DeepSpeed's "
                  "mixed precision the Trainer runs plain DDP, which splits no layer", tp=tp, pp=pp)
    cell = failing_cell(family, moe, zero, tp, pp, method, offload_param)
    if cell is None:
        return None
    v = support_table().versions
    shape = T_("{method} at ZeRO-{zero}, tensor parallelism {tp}, pipeline {pp}{offload}",
               method=Text(msgid=METHOD_WORDS[method]), zero=zero, tp=tp, pp=pp, offload=T_(", parameters offloaded") if offload_param else "")
    return T_("the Hugging Face Trainer with DeepSpeed does not train {shape} for {family} (with transformers "
              "{transformers} and DeepSpeed {deepspeed} a run stopped with: {error})", shape=shape, family=family,
              transformers=v.get("transformers", "?"), deepspeed=v.get("deepspeed", "?"), error=cell.error or "")


FSDP2_PRECISIONS = (Precision.fp32, Precision.amp_bf16, Precision.bf16_mixed, Precision.bf16)
FSDP2_OPTIMIZERS = (Optimizer.adamw, Optimizer.adam, Optimizer.sgd, Optimizer.sgd_momentum)


def uses_fsdp2(sc: Scenario) -> bool:
    """A Hugging Face model trained with FSDP2's sharding (sharding fsdp2 at stage 2 or 3): the export writes the
    PyTorch FSDP2 loop (calc.export.fsdp2), not the Trainer + DeepSpeed files."""
    t = sc.training
    return sc.mode == Mode.train and t.framework == "transformers" and t.sharding == "fsdp2" \
        and t.zero_stage in (2, 3)


def fsdp2_problem(sc: Scenario) -> Text | None:
    """What the exported FSDP2 loop (calc.export.fsdp2, run on two CPU ranks in its tests) does not do for this
    scenario, or None."""
    t = sc.training
    return fsdp2_setting_problem(t.precision, t.activation_checkpointing, t.optimizer, t.expert_parallel,
                                 t.cross_entropy, t.offload_optimizer != Offload.none or t.offload_params != Offload.none)


def fsdp2_setting_problem(precision: Precision, checkpointing: Checkpointing, optimizer: Optimizer,
                          expert_parallel: int, cross_entropy: str, offloaded: bool) -> Text | None:
    """fsdp2_problem of the settings the recommender varies (calc.recommend.combos asks it per combination)."""
    if precision not in FSDP2_PRECISIONS:
        return T_("the FSDP2 export trains in fp32, bf16, bf16-mixed or amp-bf16, not {precision} (fp16 needs a "
                  "sharded gradient scaler)", precision=precision.value)
    if checkpointing == Checkpointing.selective:
        return T_("the FSDP2 export checkpoints whole decoder layers (or 1 in k): use full checkpointing or none")
    if optimizer not in FSDP2_OPTIMIZERS:
        return T_("the FSDP2 export uses torch.optim (AdamW, Adam, SGD); {optimizer} does not update DTensor "
                  "shards", optimizer=optimizer.value)
    if expert_parallel > 1:
        return T_("the FSDP2 export shards every parameter over all ranks: use expert_parallel 1")
    if cross_entropy != "standard" or offloaded:
        return T_("the FSDP2 export computes the standard loss and offloads nothing")
    return None


def launch_problem(sc: Scenario) -> Text | None:
    """Why the exported files cannot train `sc`, or None (launchable, or not a Trainer training run: torchtune's
    and LitGPT's recipes and inference are judged by their own exporters). FSDP2 scenarios are judged by the
    exported FSDP2 loop, the rest by the measured Trainer + DeepSpeed table."""
    t = sc.training
    if sc.mode != Mode.train or t.framework != "transformers":
        return None
    if uses_fsdp2(sc):
        return fsdp2_problem(sc)
    return stack_problem(sc.spec.family, sc.spec.moe, t.zero_stage, t.tensor_parallel, t.pipeline_parallel,
                         method_of(t.lora), t.offload_params != Offload.none,
                         trainer_uses_deepspeed(t.zero_stage, t.precision))


def trainer_uses_deepspeed(zero: int, precision: Precision) -> bool:
    """The exported Trainer runs DeepSpeed for a ZeRO stage or DeepSpeed's own 16-bit weights (bf16-mixed,
    fp16-mixed, pure bf16); AMP at ZeRO-0 is the Trainer's autocast over plain DDP."""
    return zero > 0 or precision.is_mixed or precision == Precision.bf16

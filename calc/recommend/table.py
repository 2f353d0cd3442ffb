"""The model x hardware table: every cell is a `recommend` search, none is typed in."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.hardware import preset_hardware
from calc.contract.i18n import DEFAULT_LANG, N_, Lang, translate
from calc.contract.scenario import HardwareConfig, Scenario, TrainingConfig
from calc.recommend.combos import combo_of
from calc.recommend.models import (
    DEFAULT_SAFETY_MARGIN,
    Candidate,
    RecommendRequest,
)
from calc.recommend.phrase import T_, Phrase, render
from calc.recommend.search import recommend_groups
from calc.recommend.words import short_label
from calc.recommend.workload import TABLE_GLOBAL_BATCH_TOKENS, TABLE_HARDWARE, TABLE_MODELS, TABLE_SEQ_LEN


class TableCell(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    hardware: str
    status: Literal["fits", "method-change", "nothing-fits"]
    label: Phrase = Field(description="the fastest configuration, or why nothing fits")
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s: float | None = None
    device_total_expected_bytes: int | None = None
    usable_bytes: int
    scenario: Scenario | None = None
    note: Phrase = Field("", description="full fine-tuning does not fit / not even QLoRA")


class Table(BaseModel):
    """Rows = models, columns = hardware; every cell comes from `recommend`, none is typed in."""

    model_config = ConfigDict(extra="forbid")

    models: list[str]
    hardware: list[str]
    cells: list[list[TableCell]]
    assumptions: Phrase

    def to_markdown(self, lang: Lang = DEFAULT_LANG) -> str:
        head = f"| {translate(N_('model'), lang)} | " + " | ".join(self.hardware) + " |"
        sep = "|---" * (len(self.hardware) + 1) + "|"
        rows = [f"| {m} | " + " | ".join(render(_markdown_cell(c), lang) for c in row) + " |"
                for m, row in zip(self.models, self.cells, strict=True)]
        return "\n".join([head, sep, *rows, "", render(self.assumptions, lang)])


def _markdown_cell(c: TableCell) -> Phrase:
    if c.status == "nothing-fits":
        return T_("does not fit ({note})", note=c.note) if c.note else T_("does not fit")
    tps = f"{c.tokens_per_s_per_gpu:,.0f}"
    if c.status == "method-change":
        return T_("{config}; {tps} tok/s/GPU (method change)", config=c.label, tps=tps)
    return T_("{config}; {tps} tok/s/GPU", config=c.label, tps=tps)


def hardware_config(hw_id: str) -> HardwareConfig:
    """A cluster or GPU preset id as the scenario's hardware (calc.contract.hardware.preset_hardware)."""
    return preset_hardware(hw_id)


def recommendation_table(models: list[str] | tuple[str, ...] = TABLE_MODELS,
                         hardware: list[str] | tuple[str, ...] = TABLE_HARDWARE, *,
                         seq_len: int = TABLE_SEQ_LEN, global_batch_tokens: int = TABLE_GLOBAL_BATCH_TOKENS,
                         safety_margin: float = DEFAULT_SAFETY_MARGIN) -> Table:
    """Fastest full fine-tuning configuration (AdamW) per model x hardware; where none fits, whether LoRA
    or QLoRA would (and how fast)."""
    cells = [[table_cell(m, h, seq_len=seq_len, global_batch_tokens=global_batch_tokens, safety_margin=safety_margin)
              for h in hardware] for m in models]
    return Table(models=list(models), hardware=list(hardware), cells=cells,
                 assumptions=table_assumptions(seq_len, global_batch_tokens, safety_margin))


def table_cell(model: str, hardware: str, *, seq_len: int = TABLE_SEQ_LEN,
               global_batch_tokens: int = TABLE_GLOBAL_BATCH_TOKENS,
               safety_margin: float = DEFAULT_SAFETY_MARGIN) -> TableCell:
    """One cell of the table (one `recommend` search): the app fills the table cell by cell."""
    sc = Scenario(model=model, hardware=hardware_config(hardware),
                  training=TrainingConfig(seq_len=seq_len, global_batch_tokens=global_batch_tokens))
    req = RecommendRequest(scenario=sc, global_batch_tokens=global_batch_tokens, safety_margin=safety_margin,
                           max_candidates=1, allow_method_change=True)
    # Full fine-tuning with the scenario's own method first: where it fits, that is the cell, and the
    # adapters' search (a third of the table's time) is not needed.
    rec = recommend_groups(req, until_own_method_fits=True)
    m, h = model, hardware  # as the cell names them
    own = [c for c in rec.candidates if c.group == "full" and not c.method_change]
    if own:
        c = own[0]
        return TableCell(model=m, hardware=h, status="fits", label=_cell_label(c), usable_bytes=rec.usable_bytes,
                         tokens_per_s_per_gpu=c.tokens_per_s_per_gpu, tokens_per_s=c.tokens_per_s,
                         device_total_expected_bytes=c.device_total_expected_bytes, scenario=c.scenario)
    if rec.candidates:
        c = max(rec.candidates, key=lambda x: x.tokens_per_s_per_gpu)
        return TableCell(model=m, hardware=h, status="method-change", label=_cell_label(c),
                         usable_bytes=rec.usable_bytes, tokens_per_s_per_gpu=c.tokens_per_s_per_gpu,
                         tokens_per_s=c.tokens_per_s, device_total_expected_bytes=c.device_total_expected_bytes,
                         scenario=c.scenario, note=T_("full fine-tuning does not fit"))
    return TableCell(model=m, hardware=h, status="nothing-fits", label=rec.explanation,
                     usable_bytes=rec.usable_bytes, note=T_("not even QLoRA"))


def table_assumptions(seq_len: int, global_batch_tokens: int, safety_margin: float = DEFAULT_SAFETY_MARGIN) -> Phrase:
    """What every cell of the table assumes, in words."""
    return T_("Each cell: the fastest configuration found by calc.recommend for full fine-tuning with AdamW, "
              "{seq_len}-token sequences and a {batch}-token global batch, fitting in (1 - {margin}) x GPU memory; "
              "where none fits, LoRA/QLoRA/8-bit AdamW are tried. Speeds come from calc.speed (MFU 0.40 assumed).",
              seq_len=seq_len, batch=f"{global_batch_tokens:,}", margin=f"{safety_margin:g}")


def _cell_label(c: Candidate) -> Phrase:
    t = c.scenario.training
    return T_("{config}, {precision}, mb {mb} x {ga}", config=short_label(combo_of(t, c.scenario.data_parallel)),
              precision=t.precision.value,
              mb=t.micro_batch_size, ga=t.gradient_accumulation_steps)

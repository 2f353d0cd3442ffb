"""The committed support table still holds: a few representative cells of `python -m measure.stack_probe` run again
(two CPU ranks each, about 15-30 s a cell) and give the table's verdict, and the same kind of error where it fails.
The cells: dense full fine-tuning at ZeRO-2 with AutoTP 2 (works), ZeRO-3 with AutoTP (the pretrained load stops),
Mixtral with AutoTP (DeepSpeed's plan refuses MoE styles), LoRA with AutoTP at ZeRO-0, pipeline parallelism under
the Trainer, and ZeRO-3 with parameter offload."""

from __future__ import annotations

import pytest

from calc.contract.stacks import support_table

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

CELLS = ["z2-tp2-full-llama", "z3-tp2-full-llama", "z1-tp2-full-mixtral", "z0-tp2-lora-llama", "z1-tp1-full-llama-pp2",
         "z3-tp1-full-llama-offload"]


def test_representative_cells_give_the_committed_verdicts():
    from measure.stack_probe import Cell, matrix, probe

    cells = [c for c in matrix() if c.name in CELLS]
    assert len(cells) == len(CELLS)
    table = {Cell(**{k: v for k, v in c.model_dump().items() if k not in ("works", "error")}).name: c
             for c in support_table().cells}
    for row in probe(cells):
        name = Cell(**{k: row[k] for k in ("zero", "tp", "method", "model", "offload_param", "pp")}).name
        committed = table[name]
        assert row["works"] == committed.works, (name, row.get("error"), committed.error)
        if not committed.works:  # the exception type and where it was raised, not the exact words
            assert row["error"].split(":")[0] == committed.error.split(":")[0], (name, row["error"], committed.error)

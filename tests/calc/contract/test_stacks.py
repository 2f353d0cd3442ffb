"""calc.contract.stacks: the measured support table (data/stack_support.yaml) is complete and was run with the
pinned versions, and the recommender and the exporter both follow it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from calc.contract.errors import UserError
from calc.contract.scenario import Scenario
from calc.contract.stacks import launch_problem, support_table
from calc.export import export_bundle
from calc.export.requirements import pins
from calc.recommend import enumerate_combos, methods_for
from calc.recommend.combos import combo_launch_problem


def sc(model: str = "llama-3.1-8b", gpus: int = 8, **training) -> Scenario:
    return Scenario(model=model, hardware={"gpu": "h100-sxm", "num_gpus": gpus},
                    training={"precision": "bf16-mixed", **training})


def test_table_covers_the_probe_matrix_at_the_pinned_versions():
    from measure.stack_probe import matrix

    table = support_table()
    assert {c.key() for c in table.cells} == {(c.zero, c.tp, c.method, c.model, c.offload_param, c.pp)
                                              for c in matrix()}
    assert all(c.works == (c.error is None) for c in table.cells)
    for package in ("transformers", "deepspeed", "torch", "peft"):
        assert table.versions[package] == pins()[package], package


def cell(zero: int, tp: int, method: str, model: str, offload: bool = False, pp: int = 1):
    return next(c for c in support_table().cells if c.key() == (zero, tp, method, model, offload, pp))


def test_what_runs_is_launchable_and_what_fails_is_refused():
    assert cell(1, 1, "full", "llama").works and launch_problem(sc(zero_stage=1)) is None
    for zero in range(4):
        for tp in (1, 2):
            c = cell(zero, tp, "full", "llama")
            problem = launch_problem(sc(zero_stage=zero, tensor_parallel=tp))
            assert (problem is None) == c.works, (zero, tp, problem)
            if problem is not None:
                assert f"ZeRO-{zero}" in str(problem) and c.error in str(problem)


def test_larger_tp_and_unprobed_families_take_the_probed_cells():
    # TP 4 reads the TP 2 cell; qwen2 (dense, not probed) reads llama's; deepseek_v3 (MoE) the MoE families'
    assert (launch_problem(sc(zero_stage=3, tensor_parallel=4)) is None) == cell(3, 2, "full", "llama").works
    assert (launch_problem(sc("qwen2.5-7b", zero_stage=3, tensor_parallel=2)) is None) == \
        cell(3, 2, "full", "llama").works
    moe_tp = cell(1, 2, "full", "mixtral").works and cell(1, 2, "full", "qwen3_moe").works
    assert (launch_problem(sc("mixtral-8x7b", zero_stage=1, tensor_parallel=2)) is None) == moe_tp


def test_pipeline_and_tensor_parallelism_without_deepspeed_are_refused():
    assert not cell(1, 1, "full", "llama", pp=2).works
    assert "pipeline 2" in str(launch_problem(sc(zero_stage=1, pipeline_parallel=2)))
    problem = launch_problem(sc(precision="amp-bf16", tensor_parallel=2))
    assert problem is not None and "plain DDP" in str(problem)
    assert "（" in problem.render("zh") or "：" in problem.render("zh")  # full-width punctuation in Chinese


def test_export_refuses_what_the_table_refuses():
    bad = sc(zero_stage=3, tensor_parallel=2)
    if launch_problem(bad) is None:
        pytest.skip("ZeRO-3 with AutoTP trains at these versions")
    with pytest.raises(UserError, match="ZeRO-3"):
        export_bundle(bad)
    files, _ = export_bundle(sc(zero_stage=1))
    assert "ds_config.json" in files


@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_recommender_enumerates_only_launchable_combos(model):
    s = sc(model)
    combos = [c for g in ("full", "adapters") for c in enumerate_combos(s, methods_for(s, g, widen=False))]
    assert combos and all(combo_launch_problem(s, c) is None for c in combos)
    assert all(c.pp == 1 for c in combos)  # no pipeline: the Trainer has none


def test_the_contract_imports_no_torch():
    code = "import sys, calc.contract.stacks, calc.recommend; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"

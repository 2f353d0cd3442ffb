"""python -m calc import-deepspeed: the Export page's import on the command line: the scenario JSON on stdout,
every value filled for "auto" and every note on stderr, a refused config in one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

from calc.cli.main import main
from calc.contract.scenario import Scenario
from calc.export import import_ds_config
from calc.export.ds_import import base_scenario
from tests.calc.export.test_ds_auto import HF_ZERO3


def _write(tmp_path: Path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_the_hugging_face_config_gives_the_scenario_and_says_what_it_filled(tmp_path, capsys):
    cfg = _write(tmp_path, "ds.json", HF_ZERO3)
    assert main(["import-deepspeed", cfg, "--model", "llama-3.1-8b", "--hardware", "8x-a100-80gb"]) == 0
    out, err = capsys.readouterr()
    want = import_ds_config(HF_ZERO3, base_scenario("llama-3.1-8b", "8x-a100-80gb"))
    assert Scenario.model_validate_json(out) == want.scenario
    lines = err.splitlines()
    assert [x for x in lines if x.startswith('filled "auto": ')] == [
        f'filled "auto": {f.key} = {json.dumps(f.value)} ({f.source})' for f in want.filled]
    assert "filled \"auto\": zero_optimization.reduce_bucket_size = 16777216 (hidden size 4096 squared)" in lines
    assert any(x.startswith("note: ") and "total_num_steps" in x for x in lines)


def test_a_scenario_file_fills_auto_from_its_training(tmp_path, capsys):
    sc = {"model": "gpt2", "hardware": {"gpu": "rtx-4090"},
          "training": {"micro_batch_size": 3, "gradient_accumulation_steps": 5, "precision": "fp16-mixed"}}
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    out_file = tmp_path / "back.json"
    assert main(["import-deepspeed", _write(tmp_path, "ds.json", cfg), "--scenario", _write(tmp_path, "s.json", sc),
                 "-o", str(out_file)]) == 0
    t = Scenario.model_validate_json(out_file.read_text()).training
    assert (t.micro_batch_size, t.gradient_accumulation_steps, t.precision.value) == (3, 5, "fp16-mixed")


def test_refused_configs_are_one_line_exit_2(tmp_path, capsys):
    for cfg, needle in (({"train_batch_size": 8, "zero_optimization": {"stage": 2, "buckets": 1}},
                         "DeepSpeed refuses this config: zero_optimization.buckets"),
                        ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e20}},
                         "zero_optimization.reduce_bucket_size")):
        assert main(["import-deepspeed", _write(tmp_path, "bad.json", cfg), "--model", "gpt2",
                     "--hardware", "rtx-4090"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert main(["import-deepspeed", "-", "--scenario", "-"]) == 2
    assert main(["import-deepspeed", "x.json", "--model", "gpt2"]) == 2
    assert "--model and --hardware" in capsys.readouterr().err


def test_the_output_file_is_written_by_the_safe_writer(tmp_path, capsys):
    """-o never writes through a symlink and replaces a file only with --force (calc.contract.files)."""
    cfg = _write(tmp_path, "ds.json", HF_ZERO3)
    args = ["import-deepspeed", cfg, "--model", "llama-3.1-8b", "--hardware", "8x-a100-80gb"]
    target = tmp_path / "elsewhere.json"
    (tmp_path / "link.json").symlink_to(target)
    assert main([*args, "-o", str(tmp_path / "link.json")]) == 2
    assert not target.exists()
    out = tmp_path / "scenario.json"
    assert main([*args, "-o", str(out)]) == 0
    assert main([*args, "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*args, "-o", str(out), "--force"]) == 0
    Scenario.model_validate_json(out.read_text())

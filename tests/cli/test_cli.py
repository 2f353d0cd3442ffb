"""The command line: JSON contract, table output, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calc.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data) -> str:
    p = tmp_path / "s.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_estimate_json_contract(tmp_path, capsys):
    path = write(tmp_path, {"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 8},
                            "training": {"precision": "bf16-mixed", "zero_stage": 3}})
    assert main(["estimate", path]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["peak_allocated_bytes"] > 0
    assert set(out["breakdown"]) == {"parameters", "gradients", "optimizer_states", "activations", "other"}
    assert sum(out["breakdown"].values()) == out["peak_allocated_bytes"]
    dt = out["device_total_bytes"]
    assert dt["low"] <= dt["expected"] <= dt["high"]
    assert out["peak_phase"] in ("forward", "loss", "backward", "optimizer")


def test_a_refusal_speaks_the_language_asked_for(tmp_path, capsys):
    path = write(tmp_path, {"model": "llama-3.2-1b", "training": {"framework": "torchtune", "attention": "eager"}})
    assert main(["estimate", path, "--lang", "zh"]) == 2
    assert "通过 SDPA 计算注意力" in capsys.readouterr().err
    assert main(["estimate", path]) == 2
    assert "runs attention through SDPA" in capsys.readouterr().err


def test_estimate_table_shows_gib(tmp_path, capsys):
    path = write(tmp_path, {"model": "gpt2", "hardware": {"cluster": "1x-rtx-4090"}})
    assert main(["estimate", path, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "GiB" in out and "fits" in out


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ({"model": "no-such-model"}, "unknown model preset"),
    ({"model": "gpt2", "training": {"micro_batch_size": 0}}, "training.micro_batch_size"),
    ({"model": "gpt2", "training": {"zero_stage": 0, "offload_optimizer": "cpu"}}, "zero_stage"),
    ({"model": {"model_type": "t5"}}, "supported"),
])
def test_bad_input_one_line_exit_2(tmp_path, content, needle):
    path = write(tmp_path, content)
    r = subprocess.run([sys.executable, "-m", "calc", "estimate", path], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_missing_file_exit_2(capsys):
    assert main(["estimate", "/nonexistent/s.json"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_presets_lists_models_and_gpus(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "llama-2-7b" in out and "a100-80gb" in out and "8x-a100-80gb" in out


def test_fit_finds_the_boundary(tmp_path, capsys):
    from calc.contract.scenario import Scenario
    from calc.memory.engine import estimate
    from calc.memory.fit import largest_fitting

    data = {"model": "llama-3.2-1b", "hardware": {"gpu": "rtx-4090"}, "training": {"precision": "bf16"}}
    sc = Scenario.model_validate(data)
    best = largest_fitting(sc, "micro_batch_size")
    assert best and best >= 1
    at = Scenario.model_validate({**data, "training": {**data["training"], "micro_batch_size": best}})
    over = Scenario.model_validate({**data, "training": {**data["training"], "micro_batch_size": best + 1}})
    assert estimate(at).fits and not estimate(over).fits
    assert main(["fit", write(tmp_path, data)]) == 0
    assert f"micro-batch that fits at seq_len 2048: {best}" in capsys.readouterr().out
    assert main(["fit", write(tmp_path, {"model": "gpt2"})]) == 2


def test_cluster_id_fills_gpu_and_count():
    from calc.contract.scenario import Scenario

    for hw in ({"cluster": "8x-a100-80gb"}, {"gpu": "8x-a100-80gb"}):
        sc = Scenario.model_validate({"model": "gpt2", "hardware": hw})
        r = sc.resolved_hardware()
        assert (r.gpu, r.num_gpus, r.gpus_per_node) == ("a100-80gb", 8, 8)


def test_table_is_the_recommend_pages_table(capsys):
    from calc.recommend import TABLE_HARDWARE, TABLE_MODELS, Table, recommendation_table

    assert main(["table", "--seq-len", "512", "--global-batch-tokens", "131072", "--format", "json"]) == 0
    table = Table.model_validate_json(capsys.readouterr().out)
    assert table == recommendation_table(seq_len=512, global_batch_tokens=2**17)
    assert (table.models, table.hardware) == (list(TABLE_MODELS), list(TABLE_HARDWARE))
    assert main(["table", "--seq-len", "512", "--global-batch-tokens", "131072", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| 模型 | " + " | ".join(TABLE_HARDWARE)) and "512-token" not in out


@pytest.mark.parametrize("args", [["--seq-len", "3"], ["--global-batch-tokens", "1e6"], ["--format", "csv"]])
def test_table_refuses_what_the_page_does_not_offer(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["table", *args])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage, then the one line that says why
    assert exc.value.code == 2 and last.startswith("python -m calc table: error: argument " + args[0])

"""The FSDP2 export (sharding fsdp2 at stage 2 or 3): train.py and a torchrun launch.sh, started as written under
torchrun on two CPU ranks (gloo): every parameter is a DTensor shard of half the model, the losses are finite, and
the settings the loop does not do are refused in one line by the exporter, the Export page's check and the
recommender alike (about 40 s for the three runs)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.errors import UserError
from calc.contract.scenario import Scenario
from calc.contract.stacks import launch_problem, uses_fsdp2
from calc.export import export_bundle
from calc.export.fsdp2 import fsdp2_launch_lines
from measure.deepspeed_run import free_port

ROOT = Path(__file__).resolve().parents[3]
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64}


def _scenario(gpus: int = 2, **training) -> Scenario:
    return Scenario(model=TINY, hardware={"gpu": "a100-80gb", "num_gpus": gpus},
                    training={"sharding": "fsdp2", "zero_stage": 3, "micro_batch_size": 2, "seq_len": 16,
                              "precision": "bf16-mixed", **training})


def test_an_fsdp2_scenario_exports_its_loop_and_torchrun():
    sc = _scenario()
    assert uses_fsdp2(sc) and launch_problem(sc) is None
    files, _ = export_bundle(sc)
    assert set(files) == {"train.py", "launch.sh", "requirements.txt"}
    assert "RESHARD_AFTER_FORWARD = True" in files["train.py"] and "PARAM_DTYPE = torch.bfloat16" in files["train.py"]
    assert "torchrun --nnodes 1 --nproc_per_node 2 train.py" in files["launch.sh"]
    reqs = files["requirements.txt"]
    assert "torch==" in reqs and "transformers==" in reqs and "deepspeed" not in reqs and "peft" not in reqs
    stage2 = export_bundle(_scenario(zero_stage=2, lora={"rank": 8}))[0]
    assert "RESHARD_AFTER_FORWARD = False" in stage2["train.py"] and "peft==" in stage2["requirements.txt"]
    cluster = Scenario(model=TINY, hardware={"cluster": "64x-h100-sxm"},
                       training={"sharding": "fsdp2", "zero_stage": 3, "seq_len": 16})
    assert 'torchrun --nnodes 8 --nproc_per_node 8 --node_rank "$NODE_RANK"' in fsdp2_launch_lines(cluster)


@pytest.mark.parametrize(("training", "words"), [
    ({"precision": "fp16-mixed"}, "fp16 needs a sharded gradient scaler"),
    ({"activation_checkpointing": "selective"}, "whole decoder layers"),
    ({"optimizer": "adamw-8bit"}, "does not update DTensor shards"),
])
def test_what_the_loop_does_not_do_is_refused_in_one_line(training, words):
    sc = _scenario(**training)
    assert words in str(launch_problem(sc).render("en"))
    with pytest.raises(UserError, match=words) as exc:
        export_bundle(sc)
    assert "\n" not in str(exc.value)


def test_the_recommender_ranks_only_fsdp2_configurations_the_loop_runs():
    from calc.recommend import RecommendRequest, recommend

    base = Scenario(model="llama-3.1-8b", hardware={"cluster": "8x-a100-80gb"},
                    training={"sharding": "fsdp2", "zero_stage": 3, "seq_len": 2048})
    rec = recommend(RecommendRequest(scenario=base, max_candidates=8))
    fsdp = [c for c in rec.candidates if uses_fsdp2(c.scenario)]
    assert fsdp, "no FSDP2 candidate for 8B on 8 A100s"
    for c in fsdp:
        assert launch_problem(c.scenario) is None
        assert "train.py" in export_bundle(c.scenario)[0]


def _run(tmp_path: Path, sc: Scenario, *args: str) -> str:
    files, _ = export_bundle(sc)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), "train.py", "--steps", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("training", [
    pytest.param({"activation_checkpointing": "full"}, id="stage3-bf16-mixed-checkpointed"),
    pytest.param({"zero_stage": 2, "precision": "bf16", "lora": {"rank": 4}, "activation_checkpointing": "full",
                  "checkpoint_every": 2}, id="stage2-lora-bf16-1-in-2"),
    pytest.param({"precision": "amp-bf16", "optimizer_impl": "fused", "gradient_accumulation_steps": 2},
                 id="stage3-amp-fused-accumulated"),
])
def test_the_exported_loop_shards_and_trains_on_two_ranks(tmp_path, training):
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text("".join(json.dumps({"input_ids": list(range(i, i + 64))}) + "\n" for i in range(8)))
    out = _run(tmp_path, _scenario(**training), "--dataset", str(tokens))
    reports = re.findall(r"\[rank (\d)\] parameters: ([\d,]+), held by this rank: ([\d,]+), sharded: (\d+) of (\d+)",
                         out)
    assert sorted(r[0] for r in reports) == ["0", "1"], out
    for _, total, held, sharded, tensors in reports:
        assert sharded == tensors and int(held.replace(",", "")) <= int(total.replace(",", "")) // 2 + 64 * 2
    losses = [float(x) for x in re.findall(r"step \d loss ([\d.]+)", out)]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), out

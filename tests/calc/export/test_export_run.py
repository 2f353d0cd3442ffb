"""The exports run as written: DeepSpeed itself trains every ZeRO stage x offload x precision that its
CPU accelerator supports, at world size 1 and 2 (torchrun, gloo), from the exported ds_config and the
generated train.py's own model builder and dataset; and the generated train.py trains under `python`,
`deepspeed` and `accelerate launch`, each at ZeRO 0, 2 and 3. The models are tiny versions (64 wide, 2 layers, 2048 tokens) of
preset families with their config shape (GQA, tied embeddings, biases, GPT-2's Conv1D), random weights.

What the CPU cannot cover: fp16 (DeepSpeed's CPU accelerator reports no fp16 support on this CPU),
NVMe offload (needs libaio's async_io op), FusedAdam's CUDA kernel (its CPU builder is the same class).

Cost: the deepspeed.initialize runs about 2-3 minutes on 2 cores; the nine Trainer runs (every launcher
at ZeRO 0, 2 and 3) took 10.8 minutes on the shared, heavily loaded 2-core development machine, 3.3 of
them the diagonal (DeepSpeed's CPU Adam is compiled once into ~/.cache/torch_extensions, about a minute
on a fresh machine). The Trainer runs pass `--use_cpu true`,
the Trainer's own flag for a machine without a GPU.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.presets import model_presets
from calc.contract.scenario import Scenario
from calc.export import ExportOptions, export_bundle

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RUNNER = ROOT / "tests" / "calc" / "export" / "export_runner.py"
FAMILIES = ("llama-3.2-1b", "qwen2.5-0.5b", "gpt2", "mistral-7b")
# DeepSpeed on its CPU accelerator: bf16 and fp32 (fp16 is refused), CPU offload (NVMe needs async_io)
PRECISIONS = ("fp32", "amp-bf16", "bf16-mixed", "bf16")
OFFLOADS = {0: [("none", "none")], 1: [("none", "none"), ("cpu", "none")], 2: [("none", "none"), ("cpu", "none")],
            3: [("none", "none"), ("cpu", "none"), ("cpu", "cpu")]}
STEPS = 3
# 2048 x 64 embedding: above stage3_param_persistence_threshold (100,000), so ZeRO-3 keeps it partitioned
# after deepspeed.initialize while the small tensors persist, as in a real model
VOCAB = 2048
REPORT = re.compile(r"parameters: (?P<total>[\d,]+), held by this rank: (?P<held>[\d,]+), partitioned by ZeRO-3: "
                    r"(?P<zero3>\d+) of (?P<tensors>\d+) tensors (?P<status>\[.*\])")


def tiny_config(preset: str) -> dict:
    """The preset's config with the same keys and shape ratios (GQA, tying, biases), 64 wide, 2 layers."""
    cfg = copy.deepcopy(model_presets()[preset].config)
    if cfg["model_type"] == "gpt2":
        cfg.update(n_embd=64, n_head=4, n_layer=2, n_positions=64, n_inner=128, vocab_size=VOCAB)
        return cfg
    kv = 2 if cfg.get("num_key_value_heads", cfg["num_attention_heads"]) < cfg["num_attention_heads"] else 4
    cfg.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=kv, intermediate_size=128,
               num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64)
    if "head_dim" in cfg:
        cfg["head_dim"] = 16
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:2]
    return cfg


def scenario(preset: str, gpus: int, **training) -> Scenario:
    t = {"micro_batch_size": 2, "seq_len": 16, **training}
    return Scenario(model=tiny_config(preset), hardware={"gpu": "a100-80gb", "num_gpus": gpus}, training=t)


def deepspeed_cases(gpus: int) -> list[dict]:
    cases, i = [], 0
    for stage, offloads in OFFLOADS.items():
        for oo, op in offloads:
            for p in PRECISIONS:
                if p == "bf16" and stage == 0:
                    continue  # bf16 optimizer states need ZeRO 1-3 (the exporter refuses it)
                preset = FAMILIES[i % len(FAMILIES)]
                i += 1
                training = dict(zero_stage=stage, offload_optimizer=oo, offload_params=op, precision=p,
                                gradient_accumulation_steps=2 if i % 5 == 0 else 1,
                                optimizer_impl=("fused", "foreach", "for-loop")[i % 3])
                cases.append({"name": f"z{stage}-{oo}-{op}-{p}-{preset}",
                              "scenario": json.loads(scenario(preset, gpus, **training).model_dump_json()),
                              "steps": STEPS})
    return cases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    # a free MASTER_PORT for runs under plain `python` too: accelerate's CPU state would take 29500, which another
    # job on the machine (a second test run, a measurement) may hold
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
             PYTHONPATH=str(ROOT), MASTER_PORT=str(free_port()))
    e.pop("LOCAL_RANK", None)
    return e


def expected_optimizer(sc: Scenario) -> tuple[str, bool | None]:
    """(class, foreach): what the estimate assumes for the scenario's optimizer_impl."""
    t = sc.training
    if t.offload_optimizer.value != "none":
        return "DeepSpeedCPUAdam", None
    if t.optimizer_impl.value == "fused":
        return "FusedAdam", None
    return "AdamW", t.optimizer_impl.value == "foreach"


@pytest.fixture(scope="module", params=[1, 2], ids=["world1", "world2"])
def deepspeed_runs(request, tmp_path_factory):
    world = request.param
    d = tmp_path_factory.mktemp(f"ds{world}")
    cases = deepspeed_cases(world)
    (d / "cases.json").write_text(json.dumps(cases))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port",
           str(free_port()), str(RUNNER), str(d / "cases.json"), str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    per_rank = [[json.loads(line) for line in (d / f"rank{k}.jsonl").read_text().splitlines()] for k in range(world)]
    return world, cases, per_rank


def test_deepspeed_trains_every_exported_config(deepspeed_runs):
    world, cases, per_rank = deepspeed_runs
    assert len(cases) == 31
    for rank, results in enumerate(per_rank):
        assert [r["name"] for r in results] == [c["name"] for c in cases]
        for case, r in zip(cases, results, strict=True):
            assert "error" not in r, f"{r['name']} on rank {rank}: {r.get('error')}\n{r.get('traceback')}"
            sc = Scenario.model_validate(case["scenario"])
            assert r["world"] == world
            assert r["finite"] and len(r["losses"]) == STEPS * sc.training.gradient_accumulation_steps, r
            assert (r["optimizer"], r["foreach"]) == expected_optimizer(sc), r["name"]
            assert r["scheduler"] is None  # constant learning rate: no scheduler block
            assert set(r["lrs"]) == {5e-5}


def test_zero3_partitions_the_parameters(deepspeed_runs):
    world, cases, per_rank = deepspeed_runs
    for results in per_rank:
        for r in results:
            init, trained = r["partition_at_init"], r["partition"]
            if not r["name"].startswith("z3"):
                assert init["zero3_tensors"] == trained["zero3_tensors"] == 0, r["name"]
                continue
            # zero.Init partitions every tensor as it is created: nothing is ever materialised whole
            assert init["zero3_tensors"] == init["not_available"] == init["tensors"], (r["name"], init)
            assert init["total"] / world <= init["held"] < init["total"] / world + init["tensors"] * world, init
            # after 3 steps, tensors below stage3_param_persistence_threshold persist (gathered for good);
            # the embedding / lm_head (2048 x 64) stay partitioned, 1/world on each rank
            assert trained["zero3_tensors"] == trained["tensors"] and trained["large"] >= 1, (r["name"], trained)
            assert trained["large_partitioned"] == trained["large"], (r["name"], trained)


# ---- the Trainer script under the three launchers ------------------------------------------------

# ZeRO 0, ZeRO 2 + optimizer offload and ZeRO 3 + optimizer and parameter offload (zero3_init_flag under
# accelerate), each under every launcher: the full matrix the issue asks for. The diagonal runs two ranks
# (and the DeepSpeed one accumulates, checkpoints and warms up over 3 of its 4 steps: the Trainer's schedule
# drives DeepSpeed's optimizer); the other six run one rank, which is what bounds their cost on 2 cores.
STAGES = {
    0: dict(zero_stage=0, precision="bf16-mixed"),
    2: dict(zero_stage=2, precision="bf16-mixed", offload_optimizer="cpu"),
    3: dict(zero_stage=3, precision="bf16-mixed", offload_optimizer="cpu", offload_params="cpu"),
}
DIAGONAL = {"python": 0, "deepspeed": 2, "accelerate": 3}
DIAGONAL_EXTRA = {"deepspeed": dict(gradient_accumulation_steps=2, activation_checkpointing="full")}
# One case runs the Chinese bundle (comments, docstrings, --help and accelerate.yaml's header in Chinese; the
# same code, tests/calc/export/test_export_language.py), so the Chinese files are run too, at no extra cost.
CHINESE = ("accelerate", 0)


def launch_cases() -> list:
    """(launcher, world, training, warm-up steps, language) for each launcher x stage (the module is marked slow)."""
    out = []
    for launcher, diag in DIAGONAL.items():
        for stage, training in STAGES.items():
            on = stage == diag
            world = 2 if on and launcher != "python" else 1
            extra = DIAGONAL_EXTRA.get(launcher, {}) if on else {}
            warmup = 3 if on and launcher == "deepspeed" else 0
            lang = "zh" if (launcher, stage) == CHINESE else "en"
            out.append(pytest.param(launcher, world, {**training, **extra}, warmup, lang,
                                    id=f"{launcher}-zero{stage}" + ("-zh" if lang == "zh" else "")))
    return out


LAUNCHES = launch_cases()


def launch_command(launcher: str, world: int, port: int) -> list[str]:
    if launcher == "python":
        return [sys.executable, "train.py"]
    if launcher == "deepspeed":
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(world), "--master_port", str(port),
                "train.py"]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate.yaml",
            "--main_process_port", str(port), "train.py"]


def trainer_learning_rates(o: ExportOptions, steps: int) -> list[float]:
    """What the Trainer logs after each step: its scheduler's lr (transformers.get_scheduler)."""
    import torch
    from transformers import get_scheduler

    from calc.export import trainer_arguments

    kw = trainer_arguments(scenario("llama-3.2-1b", 1, zero_stage=1, precision="bf16-mixed"), o)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=o.learning_rate)
    sched = get_scheduler(kw["lr_scheduler_type"], opt, num_warmup_steps=kw["warmup_steps"], num_training_steps=steps)
    out = []
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


@pytest.mark.parametrize(("launcher", "world", "training", "warmup", "lang"), LAUNCHES)
def test_trainer_script_runs_under_each_launcher(tmp_path, launcher, world, training, warmup, lang):
    sc = scenario("llama-3.2-1b" if launcher != "deepspeed" else "qwen2.5-0.5b", world, **training)
    options = ExportOptions(warmup_steps=warmup)
    files, _ = export_bundle(sc, options, lang=lang)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    steps = 4 if warmup else 2
    cmd = launch_command(launcher, world, free_port()) + ["--max_steps", str(steps), "--use_cpu", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "'train_loss'" in out, out[-2000:]
    losses = [float(x) for x in re.findall(r"'loss': '([^']+)'", out)]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses), out[-2000:]
    lrs = [float(x) for x in re.findall(r"'learning_rate': '([^']+)'", out)]
    assert lrs == pytest.approx(trainer_learning_rates(options, steps), rel=1e-3), lrs
    # the ranks share one stream: with `python -u` two reports can land on one line, so search the text
    reports = list(REPORT.finditer(out))
    assert len(reports) == world, out[-2000:]
    for m in reports:
        total, held, zero3, tensors = (int(m.group(k).replace(",", "")) for k in ("total", "held", "zero3", "tensors"))
        if sc.training.zero_stage == 3:  # TrainingArguments came first, so from_config ran under zero.Init
            assert zero3 == tensors and m.group("status") == "['NOT_AVAILABLE']", m.group(0)
            assert total / world <= held < total / world + tensors * world, m.group(0)
        else:
            assert zero3 == 0 and held == total, m.group(0)


# ---- DeepSpeed measured with DeepSpeed (python -m measure --engine deepspeed) ------------------------

def test_measure_engine_deepspeed_records_the_exported_run(tmp_path):
    """The measurement engine runs the exported config on DeepSpeed's CPU accelerator (2 ranks, gloo) and
    the estimate of that run (target cpu: offloaded buffers share the host) is within the accuracy bar."""
    from calc.contract.record import load_records
    from calc.evidence.validate import compare

    sc = scenario("llama-3.2-1b", 2, zero_stage=2, precision="bf16-mixed", offload_optimizer="cpu")
    (tmp_path / "s.json").write_text(sc.model_dump_json())
    out = tmp_path / "ds.jsonl"
    r = subprocess.run([sys.executable, "-m", "measure", str(tmp_path / "s.json"), "--device", "cpu", "--engine",
                        "deepspeed", "-o", str(out), "--name", "tiny-z2-offload"], capture_output=True, text=True,
                       env=env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (rec,) = load_records(out)
    assert rec.engine == "deepspeed" and rec.device == "cpu" and rec.sharding.world_size == 2
    assert rec.sharding.zero_stage == 2 and rec.steps == 3
    assert any("DeepSpeedCPUAdam" in n for n in rec.notes)
    case = compare(rec)
    assert abs(case.error_pct) <= 3.0, case
    r = subprocess.run([sys.executable, "-m", "measure", str(tmp_path / "s.json"), "--device", "fake", "--engine",
                        "deepspeed"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--engine deepspeed runs with --device cpu" in r.stderr


# ---- QLoRA from a config (random weights) --------------------------------------------------------

QLORA = [pytest.param("llama-3.2-1b", dict(base_weights="nf4", double_quant=True), id="llama-nf4-double-quant"),
         pytest.param("gpt2", dict(base_weights="int8"), id="gpt2-conv1d-int8")]


@pytest.mark.parametrize(("preset", "lora"), QLORA)
def test_qlora_script_runs_from_a_config(tmp_path, preset, lora):
    """transformers' from_config takes no quantization_config: the exported train.py quantizes the built model's
    linear layers with bitsandbytes itself (bitsandbytes 0.50's 4-bit and 8-bit layers run on the CPU) and trains
    the adapters for two steps."""
    import importlib.util

    import bitsandbytes as bnb

    sc = scenario(preset, 1, precision="amp-bf16", lora={"rank": 8, **lora})
    files, _ = export_bundle(sc)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("exported_train", tmp_path / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    model = train.build_model(train.ScriptArguments())
    layer = bnb.nn.Linear4bit if lora["base_weights"] == "nf4" else bnb.nn.Linear8bitLt
    quantized = [n for n, m in model.named_modules() if isinstance(m, layer)]
    per_layer = 7 if preset != "gpt2" else 4  # q k v o gate up down; GPT-2's c_attn c_proj c_fc mlp.c_proj
    assert len(quantized) == per_layer * 2 and not any("lm_head" in n for n in quantized), quantized
    cmd = [sys.executable, "train.py", "--max_steps", "2", "--use_cpu", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    losses = [float(x) for x in re.findall(r"'loss': '([^']+)'", out)]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), out[-2000:]

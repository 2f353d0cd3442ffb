"""calc.export: every exported ds_config passes DeepSpeed's own parser (DeepSpeedConfig, CPU-only) with
the scenario's data-parallel world size; bucket sizes are calc.contract.parallel's; golden files pin a few
presets; export -> import round-trips; bad configs name the key; the HF TrainingArguments and the
accelerate YAML load in transformers / accelerate; CLI exit codes.

Regenerate the golden files with VRAMCALC_UPDATE_GOLDEN=1 pytest tests/calc/export/test_export.py."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from calc.contract.parallel import (
    ALLGATHER_BUCKET_ELEMENTS,
    REDUCE_BUCKET_ELEMENTS,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_ELEMENTS,
)
from calc.contract.scenario import Scenario
from calc.export import (
    ExportOptions,
    accelerate_config,
    deepspeed_config,
    export_bundle,
    export_deepspeed,
    import_ds_config,
    launch_lines,
    launch_script,
    scenario_from_ds_config,
    trainer_arguments,
    trainer_snippet,
)
from calc.memory.engine import model_states

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
MODEL, HW = "llama-3.2-1b", "8x-a100-80gb"


def scen(**training) -> Scenario:
    t = {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 1024, **training}
    return Scenario(model=MODEL, hardware={"cluster": HW}, training=t)


PRECISIONS = ["fp32", "amp-bf16", "amp-fp16", "bf16-mixed", "fp16-mixed", "bf16"]
OFFLOADS = {0: [("none", "none")], 1: [("none", "none"), ("cpu", "none")], 2: [("none", "none"), ("cpu", "none")],
            3: [("none", "none"), ("cpu", "none"), ("nvme", "none"), ("cpu", "cpu"), ("nvme", "cpu"),
                ("cpu", "nvme"), ("nvme", "nvme")]}


def matrix() -> list[tuple[str, dict]]:
    out = []
    for stage, offs in OFFLOADS.items():
        for oo, op in offs:
            for p in PRECISIONS:
                if p == "bf16" and stage == 0:
                    continue
                out.append((f"z{stage}-{oo}-{op}-{p}", dict(zero_stage=stage, offload_optimizer=oo, offload_params=op,
                                                            precision=p)))
    for opt in ["adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit"]:
        out.append((f"opt-{opt}", dict(zero_stage=2, precision="bf16-mixed", optimizer=opt)))
    out.append(("opt-sgd-offload", dict(zero_stage=2, precision="bf16-mixed", optimizer="sgd", offload_optimizer="cpu")))
    out.append(("ckpt-full-2", dict(zero_stage=1, precision="bf16-mixed", activation_checkpointing="full",
                                    checkpoint_every=2)))
    out.append(("tp2", dict(zero_stage=3, precision="bf16-mixed", tensor_parallel=2)))
    out.append(("tp2-pp2", dict(zero_stage=1, precision="bf16-mixed", tensor_parallel=2, pipeline_parallel=2,
                                activation_checkpointing="full")))
    out.append(("lora", dict(zero_stage=2, precision="bf16-mixed", lora={"rank": 8})))
    out.append(("qlora", dict(zero_stage=0, precision="amp-bf16", lora={"base_weights": "nf4"})))
    return out


CASES = matrix()


# ---- DeepSpeed's own parser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def ds_parser():
    try:
        import deepspeed.runtime.config as dsc
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"deepspeed cannot be imported on this machine ({type(exc).__name__}: {exc}); install it with "
                    "`DS_BUILD_OPS=0 pip install deepspeed==0.19.8` to validate exports with DeepSpeedConfig")
    return dsc


class StubMPU:
    """DeepSpeedConfig takes the world size from mpu.get_data_parallel_world_size() (runtime/config.py)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def parse(dsc, cfg: dict, dp: int, monkeypatch):
    # DeepSpeedConfig calls dist.get_rank() first and falls back to world size 1 when torch.distributed is
    # not initialised; pretend to be rank 0 so the stub mpu's data-parallel size is used.
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dsc.DeepSpeedConfig(json.loads(json.dumps(cfg)), mpu=StubMPU(dp))


@pytest.mark.parametrize(("name", "training"), CASES, ids=[c[0] for c in CASES])
def test_deepspeed_parses_every_export(ds_parser, monkeypatch, name, training):
    sc = scen(**training)
    cfg = deepspeed_config(sc)
    c = parse(ds_parser, cfg, sc.data_parallel, monkeypatch)
    t = sc.training
    assert c.world_size == sc.data_parallel
    assert c.train_batch_size == t.micro_batch_size * t.gradient_accumulation_steps * sc.data_parallel
    assert c.train_micro_batch_size_per_gpu == t.micro_batch_size
    assert c.gradient_accumulation_steps == t.gradient_accumulation_steps
    assert c.zero_optimization_stage == t.zero_stage
    z = c.zero_config
    if t.zero_stage:
        assert z.reduce_bucket_size == REDUCE_BUCKET_ELEMENTS and z.allgather_bucket_size == ALLGATHER_BUCKET_ELEMENTS
        assert z.overlap_comm is True and z.contiguous_gradients is True
    if t.zero_stage == 3:
        assert z.prefetch_bucket_size == STAGE3_PREFETCH_ELEMENTS
        assert z.max_live_parameters == STAGE3_MAX_LIVE_PARAMETERS
        assert z.param_persistence_threshold == STAGE3_PARAM_PERSISTENCE_THRESHOLD
    off_opt = z.offload_optimizer.device if z.offload_optimizer else "none"
    off_par = z.offload_param.device if z.offload_param else "none"
    assert str(getattr(off_opt, "value", off_opt)) == t.offload_optimizer.value
    assert str(getattr(off_par, "value", off_par)) == t.offload_params.value
    p = t.precision.value
    assert c.bfloat16_config.enabled == (p in ("bf16-mixed", "bf16"))
    assert c.bfloat16_config.bf16_optimizer_states == (p == "bf16")
    assert c.float16_config.enabled == (p == "fp16-mixed")
    if p == "fp16-mixed":
        assert c.float16_config.loss_scale == 0 and c.float16_config.initial_scale_power == 16
    assert c.torch_autocast_enabled == p.startswith("amp-")
    assert c.gradient_clipping == 1.0
    if t.optimizer.value == "adamw-8bit":
        assert c.optimizer_name is None
    else:
        assert c.optimizer_name in ("adamw", "adam", "SGD", "Adafactor")
    assert c.scheduler_name is None  # constant learning rate: no scheduler block (the Trainer's "constant")
    assert "train_batch_size" not in cfg  # derived by DeepSpeed for any world size


def test_deepspeed_parser_catches_a_wrong_batch(ds_parser, monkeypatch):
    sc = scen(zero_stage=2, precision="bf16-mixed")
    cfg = deepspeed_config(sc)
    cfg["train_batch_size"] = sc.training.micro_batch_size * sc.training.gradient_accumulation_steps * sc.data_parallel + 1
    with pytest.raises(AssertionError, match="train_batch_size"):
        parse(ds_parser, cfg, sc.data_parallel, monkeypatch)


@pytest.mark.parametrize(("warmup", "total", "kind"), [(0, None, "constant"), (10, None, "constant_with_warmup"),
                                                   (0, 500, "linear"), (50, 1000, "linear")])
def test_the_trainer_owns_the_schedule(warmup, total, kind):
    """DeepSpeed's WarmupLR lags the Trainer's schedule by a step and cannot warm up for 0 or 1 steps, so
    the ds_config has no scheduler block and the Trainer's arguments carry the schedule."""
    o = ExportOptions(total_num_steps=total, warmup_steps=warmup, learning_rate=1e-4)
    sc = scen(zero_stage=1, precision="bf16-mixed")
    cfg, kw = deepspeed_config(sc, o), trainer_arguments(sc, o)
    assert "scheduler" not in cfg and cfg["optimizer"]["params"]["lr"] == 1e-4
    assert (kw["lr_scheduler_type"], kw["warmup_steps"], kw.get("max_steps")) == (kind, warmup, total)


def test_options_refuse_a_decay_shorter_than_the_warmup():
    with pytest.raises(ValueError, match="shorter than warmup_steps"):
        ExportOptions(total_num_steps=10, warmup_steps=20)


def test_export_says_which_optimizer_and_schedule_run():
    notes = export_deepspeed(scen(zero_stage=3, precision="bf16-mixed", offload_optimizer="cpu")).notes
    assert notes[0] == "optimizer: DeepSpeedCPUAdam (AdamW) on the host, fp32 states"
    assert notes[1].startswith("learning-rate schedule: constant 5e-05, applied by the Trainer")
    fused = scen(zero_stage=2, precision="bf16-mixed", optimizer_impl="fused")
    assert export_deepspeed(fused).notes[0] == "optimizer: DeepSpeed FusedAdam (AdamW) on the accelerator, no temporaries"
    assert "torch_adam" not in deepspeed_config(fused)["optimizer"]["params"]
    foreach = scen(zero_stage=2, precision="bf16-mixed")  # the scenario's default: torch's foreach AdamW
    assert export_deepspeed(foreach).notes[0].startswith("optimizer: torch.optim.AdamW (torch_adam, foreach=True)")
    assert deepspeed_config(foreach)["optimizer"]["params"] | {"torch_adam": True, "foreach": True} == \
        deepspeed_config(foreach)["optimizer"]["params"]
    loop = deepspeed_config(scen(zero_stage=1, precision="bf16-mixed", optimizer_impl="for-loop"))
    assert loop["optimizer"]["params"]["foreach"] is False
    assert export_deepspeed(scen(zero_stage=2, precision="bf16-mixed", optimizer="sgd")).notes[0] == \
        "optimizer: torch.optim SGD"
    warm = export_deepspeed(scen(zero_stage=1, precision="bf16-mixed"), ExportOptions(warmup_steps=10)).notes[1]
    assert "linear warm-up from 0 to 5e-05 over 10 steps, then constant" in warm


# ---- constants, errors, golden files -------------------------------------------------------------

def test_bucket_constants_are_calc_parallels():
    z = deepspeed_config(scen(zero_stage=3, precision="bf16-mixed"))["zero_optimization"]
    assert z["reduce_bucket_size"] == REDUCE_BUCKET_ELEMENTS
    assert z["allgather_bucket_size"] == ALLGATHER_BUCKET_ELEMENTS
    assert z["stage3_prefetch_bucket_size"] == STAGE3_PREFETCH_ELEMENTS
    assert z["stage3_max_live_parameters"] == STAGE3_MAX_LIVE_PARAMETERS
    assert z["stage3_param_persistence_threshold"] == STAGE3_PARAM_PERSISTENCE_THRESHOLD
    assert deepspeed_config(scen())["zero_optimization"] == {"stage": 0}


@pytest.mark.parametrize(("training", "mode", "match"), [
    ({"precision": "bf16", "zero_stage": 0}, "train", "zero_stage 1-3"),
    ({"precision": "bf16-mixed", "zero_stage": 2, "offload_optimizer": "nvme"}, "train", "(?i)nvme"),
    ({"precision": "bf16-mixed", "zero_stage": 2, "pipeline_parallel": 2}, "train", "pipeline"),
    ({}, "inference", "mode"),
])
def test_export_refuses_what_deepspeed_cannot_do(training, mode, match):
    # NVMe optimizer offload below ZeRO-3 and pipelines with ZeRO-2/3 are already refused by the
    # scenario's own validation; the rest by the exporter
    with pytest.raises(ValueError, match=match):
        export_deepspeed(Scenario(model=MODEL, hardware={"cluster": HW}, mode=mode, training=training))


GOLDEN_CASES = {
    "llama-3.1-8b_8x-a100_zero2_ckpt": ("llama-3.1-8b", "8x-a100-80gb",
                                        dict(precision="bf16-mixed", zero_stage=2, micro_batch_size=4,
                                             gradient_accumulation_steps=8, activation_checkpointing="full")),
    "llama-3.1-70b_64x-h100_zero3_offload": ("llama-3.1-70b", "64x-h100-sxm",
                                             dict(precision="bf16-mixed", zero_stage=3, offload_optimizer="cpu",
                                                  micro_batch_size=1, gradient_accumulation_steps=16,
                                                  activation_checkpointing="full", seq_len=4096)),
    "qwen2.5-7b_1x-rtx-4090_infinity": ("qwen2.5-7b", "1x-rtx-4090",
                                        dict(precision="bf16-mixed", zero_stage=3, offload_optimizer="nvme",
                                             offload_params="nvme", gradient_accumulation_steps=32,
                                             activation_checkpointing="full", checkpoint_every=2)),
    "mistral-7b_4x-rtx-4090_fp16_zero1_tp2": ("mistral-7b", "4x-rtx-4090",
                                             dict(precision="fp16-mixed", zero_stage=1, tensor_parallel=2,
                                                  micro_batch_size=2, gradient_accumulation_steps=4)),
    "llama-3.2-1b_1x-a100_amp": ("llama-3.2-1b", "1x-a100-80gb",
                                 dict(precision="amp-bf16", micro_batch_size=8, optimizer="adamw")),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_files(name):
    model, hw, training = GOLDEN_CASES[name]
    sc = Scenario(model=model, hardware={"cluster": hw}, training=training)
    got = json.dumps(deepspeed_config(sc), indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"ds_{name}.json"
    if os.environ.get("VRAMCALC_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"missing {path}; run with VRAMCALC_UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"{path} changed; if intended, regenerate with VRAMCALC_UPDATE_GOLDEN=1"


# ---- import ---------------------------------------------------------------------------------------

ROUND_TRIP_FIELDS = ("precision", "zero_stage", "offload_optimizer", "offload_params", "micro_batch_size",
                     "gradient_accumulation_steps", "activation_checkpointing", "checkpoint_every", "tensor_parallel",
                     "pipeline_parallel", "optimizer", "optimizer_impl")


@pytest.mark.parametrize(("name", "training"), CASES, ids=[c[0] for c in CASES])
def test_export_import_round_trip(name, training):
    sc = scen(**training)
    extra = {}
    if sc.training.optimizer.value == "adamw-8bit":
        extra["optimizer"] = "adamw-8bit"  # bitsandbytes is passed in code, not in the ds_config
    if sc.training.lora is not None:
        extra["lora"] = sc.training.lora.model_dump()
    back = scenario_from_ds_config(deepspeed_config(sc), MODEL, HW, seq_len=1024, **extra)
    for f in ROUND_TRIP_FIELDS:
        assert getattr(back.training, f) == getattr(sc.training, f), f
    assert back.hardware.cluster == HW


def test_import_checkpointing_granularity_from_number_checkpoints():
    for every in (1, 2, 3, 4):
        sc = scen(precision="bf16-mixed", activation_checkpointing="full", checkpoint_every=every)
        back = scenario_from_ds_config(deepspeed_config(sc), MODEL, HW, seq_len=1024)
        assert back.training.checkpoint_every == every
    sel = scen(precision="bf16-mixed", activation_checkpointing="selective")
    back = scenario_from_ds_config(deepspeed_config(sel), MODEL, HW, activation_checkpointing="selective")
    assert back.training.activation_checkpointing.value == "selective"  # not expressible: given as override


def test_import_a_hand_written_config():
    cfg = {"train_batch_size": 64, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}
    sc = scenario_from_ds_config(cfg, "llama-3.1-8b", "8x-a100-80gb", seq_len=4096)
    t = sc.training
    assert (t.micro_batch_size, t.gradient_accumulation_steps, t.seq_len) == (4, 2, 4096)
    assert t.precision.value == "bf16-mixed" and t.zero_stage == 3 and t.offload_optimizer.value == "cpu"
    assert t.optimizer.value == "adamw"  # DeepSpeed's "Adam" runs in AdamW mode unless adam_w_mode is false
    from calc.memory.engine import estimate

    assert estimate(sc).fits is not None  # "will my config fit?" answered


@pytest.mark.parametrize(("cfg", "key"), [
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 5}}, "zero_optimization.stage"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "overlap_comms": True}},
     "zero_optimization.overlap_comms"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e20}},
     "zero_optimization.reduce_bucket_size"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1},
     "train_batch_size"),
    ({"gradient_accumulation_steps": 2}, "train_batch_size or train_micro_batch_size_per_gpu"),
    ({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, "bf16 and fp16"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
     "zero_optimization.offload_optimizer.device"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
     "nvme_path"),
    ({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "OneBitLamb"}}, "optimizer.type"),
    ({"train_micro_batch_size_per_gpu": 1.5}, "train_micro_batch_size_per_gpu"),
    ({"train_micro_batch_size_per_gpu": 1, "zero_optimization": []}, "zero_optimization"),
    ({"train_micro_batch_size_per_gpu": 1, "torch_autocast": {"enabled": True, "dtype": "int8"}},
     "torch_autocast.dtype"),
    ({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 3}}, "autotp_size"),
])
def test_import_bad_configs_name_the_key(cfg, key):
    with pytest.raises(ValueError) as ei:
        scenario_from_ds_config(cfg, MODEL, HW)
    assert key in str(ei.value)


def test_import_rejects_non_dicts_and_notes_other_buckets():
    with pytest.raises(ValueError, match="JSON object"):
        scenario_from_ds_config([1, 2], MODEL, HW)  # type: ignore[arg-type]
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "allgather_bucket_size": 2e8}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a note in the result, not a warning nobody shows
        result = import_ds_config(cfg, scen())
    assert [str(n) for n in result.notes] == ["zero_optimization.allgather_bucket_size = 200000000.0; the estimate "
                                              "assumes DeepSpeed's default 500,000,000"]


def test_reduce_bucket_size_is_read_and_written():
    """reduce_bucket_size is a scenario field: imported from a ds_config, exported as written, and the
    estimate's ZeRO-2 buckets follow it (two of it in the gradients' dtype)."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8}}
    sc = scenario_from_ds_config(cfg, MODEL, HW)
    assert sc.training.reduce_bucket_size == 200_000_000
    assert deepspeed_config(sc)["zero_optimization"]["reduce_bucket_size"] == 200_000_000
    st = model_states(sc, sc.spec.num_layers, True, True)
    assert st.reduce_buckets == 2 * 2 * 200_000_000


# ---- Hugging Face and accelerate ------------------------------------------------------------------

HF_CASES = [c for c in CASES if c[0] in ("z0-none-none-amp-bf16", "z2-cpu-none-bf16-mixed", "z3-nvme-nvme-fp16-mixed",
                                           "z0-none-none-fp32", "opt-adamw-8bit", "opt-sgd-momentum", "lora", "qlora",
                                           "ckpt-full-2")]


@pytest.mark.parametrize(("name", "training"), HF_CASES, ids=[c[0] for c in HF_CASES])
def test_trainer_arguments_are_accepted_by_transformers(tmp_path, name, training):
    transformers = pytest.importorskip("transformers")
    sc = scen(**training)
    kw = trainer_arguments(sc, output_dir=str(tmp_path))
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert set(kw) <= fields
    uses_ds = "deepspeed" in kw
    assert uses_ds == (sc.training.zero_stage > 0 or sc.training.precision.value in ("bf16-mixed", "fp16-mixed", "bf16"))
    kw.pop("deepspeed", None)  # needs a distributed launch; the ds_config itself is checked above
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(**kw, use_cpu=True)  # this CPU box has no bf16 GPU
    assert args.per_device_train_batch_size == sc.training.micro_batch_size
    assert args.gradient_accumulation_steps == sc.training.gradient_accumulation_steps
    snippet = trainer_snippet(sc)
    constants = script_constants(snippet)
    assert constants["TRAINING_ARGUMENTS"] == trainer_arguments(sc)
    assert constants["MODEL_ID"] == "meta-llama/Llama-3.2-1B" and constants["MODEL_CONFIG"] is None
    if sc.training.lora is not None:
        assert constants["LORA"]["r"] == sc.training.lora.rank and "get_peft_model" in snippet
    if name == "qlora":
        assert constants["QUANTIZATION"]["bnb_4bit_quant_type"] == "nf4"


def script_constants(snippet: str) -> dict:
    """The module-level literals of a generated train.py (it must parse as Python)."""
    tree = ast.parse(snippet)
    return {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
            and n.targets[0].id != "DTYPE"}


def test_train_script_embeds_a_config_dict_as_python():
    """json.dumps inside Python source gave NameError: name 'false' is not defined; the script's
    literals are Python's (True/False/None), and the config comes back equal."""
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": False,
           "rope_scaling": None, "attention_bias": True, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
    sc = Scenario(model=cfg, hardware={"gpu": "a100-80gb", "num_gpus": 2},
                  training={"zero_stage": 3, "precision": "bf16-mixed"})
    snippet = trainer_snippet(sc)
    constants = script_constants(snippet)
    assert constants["MODEL_ID"] is None
    assert constants["MODEL_CONFIG"] == {k: v for k, v in cfg.items() if k != "torch_dtype"}
    assert "false" not in snippet and "null" not in snippet
    # TrainingArguments before the model, so ZeRO-3's zero.Init partitions it as it is built
    main = snippet[snippet.index("def main():"):]
    assert main.index("parse_args_into_dataclasses") < main.index("build_model(")


def test_hf_arguments_match_the_ds_config():
    sc = scen(zero_stage=2, precision="bf16-mixed", activation_checkpointing="full")
    o = ExportOptions(learning_rate=2e-5, weight_decay=0.1, gradient_clipping=0.5)
    kw, cfg = trainer_arguments(sc, o), deepspeed_config(sc, o)
    assert kw["per_device_train_batch_size"] == cfg["train_micro_batch_size_per_gpu"]
    assert kw["gradient_accumulation_steps"] == cfg["gradient_accumulation_steps"]
    assert kw["max_grad_norm"] == cfg["gradient_clipping"]
    assert kw["learning_rate"] == cfg["optimizer"]["params"]["lr"]
    assert [kw["adam_beta1"], kw["adam_beta2"]] == cfg["optimizer"]["params"]["betas"]
    assert kw["bf16"] is cfg["bf16"]["enabled"] and kw["activation_checkpointing"] is True


@pytest.mark.parametrize(("cluster", "training", "dist", "machines"), [
    ("8x-a100-80gb", dict(zero_stage=3, precision="bf16-mixed"), "DEEPSPEED", 1),
    ("64x-h100-sxm", dict(zero_stage=1, precision="bf16-mixed"), "DEEPSPEED", 8),
    ("4x-rtx-4090", dict(precision="amp-bf16"), "MULTI_GPU", 1),
    ("1x-rtx-4090", dict(precision="amp-fp16"), "NO", 1),
])
def test_accelerate_config_loads(tmp_path, cluster, training, dist, machines):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    sc = Scenario(model=MODEL, hardware={"cluster": cluster}, training=training)
    path = tmp_path / "accelerate.yaml"
    path.write_text(accelerate_config(sc))
    c = ClusterConfig.from_yaml_file(str(path))
    assert str(c.distributed_type).endswith(dist)
    assert c.num_processes == sc.resolved_hardware().num_gpus and c.num_machines == machines
    if dist == "DEEPSPEED":  # the precision is the ds_config's: accelerate refuses mixed_precision beside it
        assert "mixed_precision" not in path.read_text() and c.mixed_precision is None
        assert c.deepspeed_config["zero3_init_flag"] == (training["zero_stage"] == 3)
        assert c.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
    else:
        assert c.mixed_precision == ("fp16" if "fp16" in training["precision"] else "bf16")


# ---- CLI ------------------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calc", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_export_stdout_and_file(tmp_path):
    sc = scen(zero_stage=3, precision="bf16-mixed", offload_optimizer="cpu", activation_checkpointing="full")
    f = tmp_path / "s.json"
    f.write_text(sc.model_dump_json())
    r = run_cli("export-deepspeed", str(f))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == deepspeed_config(sc)
    assert "note:" in r.stderr  # what the config cannot say goes to stderr, not into the JSON
    out = tmp_path / "ds.json"
    r = run_cli("export-deepspeed", str(f), "-o", str(out))
    assert r.returncode == 0 and r.stdout == ""
    assert json.loads(out.read_text()) == deepspeed_config(sc)


@pytest.mark.parametrize(("content", "msg"), [
    ("[", "not valid JSON"),
    (json.dumps({"model": MODEL, "training": {"zero_stage": 9}}), "zero_stage"),
    (json.dumps({"model": MODEL, "training": {"precision": "bf16"}}), "zero_stage 1-3"),
])
def test_cli_export_bad_input_exits_2(tmp_path, content, msg):
    f = tmp_path / "bad.json"
    f.write_text(content)
    r = run_cli("export-deepspeed", str(f))
    assert r.returncode == 2 and msg in r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_cli_export_writes_the_whole_bundle(tmp_path):
    sc = scen(zero_stage=3, precision="bf16-mixed", offload_optimizer="cpu")
    f = tmp_path / "s.json"
    f.write_text(sc.model_dump_json())
    out = tmp_path / "bundle"
    r = run_cli("export", str(f), "-o", str(out), "--warmup-steps", "10")
    assert r.returncode == 0, r.stderr
    files, notes = export_bundle(sc, ExportOptions(warmup_steps=10))
    assert sorted(p.name for p in out.iterdir()) == sorted(files) == ["accelerate.yaml", "ds_config.json",
                                                                      "launch.sh", "requirements.txt", "train.py"]
    for name, text in files.items():
        assert (out / name).read_text() == text
    assert r.stdout.split() == [str(out / name) for name in files]
    assert [line.removeprefix("note: ") for line in r.stderr.splitlines()] == notes
    assert script_constants(files["train.py"])["TRAINING_ARGUMENTS"]["warmup_steps"] == 10
    assert os.access(out / "launch.sh", os.X_OK)
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")]).returncode == 0
    assert 'accelerate launch --config_file accelerate.yaml train.py "$@"' in files["launch.sh"]
    assert "deepspeed --num_gpus 8 train.py" in files["launch.sh"]
    r = run_cli("export", str(f), "-o", str(out), "--warmup-steps", "10", "--total-steps", "5")
    assert r.returncode == 2 and "shorter than warmup_steps" in r.stderr and r.stderr.count("\n") == 1


def test_launch_lines_for_several_nodes():
    sc = Scenario(model=MODEL, hardware={"cluster": "64x-h100-sxm"}, training={"zero_stage": 3, "precision": "bf16-mixed"})
    lines = launch_lines(sc)
    assert 'accelerate launch --config_file accelerate.yaml --machine_rank "$NODE_RANK" train.py' in lines
    assert "deepspeed --hostfile hostfile --num_nodes 8 --num_gpus 8 train.py" in lines
    script = launch_script(sc)
    assert "NODE_RANK:?" in script and subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    plain = launch_lines(Scenario(model=MODEL, hardware={"cluster": "4x-rtx-4090"}, training={"precision": "amp-bf16"}))
    assert "torchrun --nnodes 1 --nproc_per_node 4 train.py" in plain


def test_cli_export_unwritable_output_exits_2(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(scen().model_dump_json())
    r = run_cli("export-deepspeed", str(f), "-o", str(tmp_path / "no" / "such" / "dir.json"))
    assert r.returncode == 2 and "cannot write" in r.stderr

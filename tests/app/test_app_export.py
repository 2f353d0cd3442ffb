"""Export page: the DeepSpeed JSON, Trainer script and accelerate config are calc.export's for the
current or recommended scenario; the hyper-parameter widgets reach the config; importing a ds_config
estimates it (and bad input names the key)."""

from __future__ import annotations

import json

from calc.contract.scenario import Optimizer, Scenario
from calc.export import (
    ExportOptions,
    accelerate_config,
    bundle_files,
    export_deepspeed,
    import_ds_config,
    trainer_snippet,
)
from calc.memory.engine import estimate
from calc.memory.verdict import headline
from calc.recommend import fastest_fitting
from calc.speed import estimate_speed
from tests.app.test_app_helpers import all_text, assert_clean, open_app, scenario
from ui import fmt, state

ZERO3 = Scenario(model="llama-2-7b", hardware={"cluster": "8x-a100-80gb"},
                 training={"precision": "bf16-mixed", "zero_stage": 3, "activation_checkpointing": "full",
                           "offload_optimizer": "cpu"})


def _codes(at, language: str) -> list[str]:
    return [c.value.strip() for c in at.code if c.language == language]


def check_export(at, target: Scenario, opts: ExportOptions | None = None) -> None:
    assert_clean(at)
    ds = export_deepspeed(target, opts)
    assert json.dumps(ds.config, indent=2) in _codes(at, "json")
    assert trainer_snippet(target, opts).strip() in _codes(at, "python")
    assert accelerate_config(target).strip() in _codes(at, "yaml")
    assert any("accelerate launch --config_file accelerate.yaml" in c for c in _codes(at, "bash"))
    labels = [b.label for b in at.get("download_button")]
    assert "Download ds_config.json" in labels and "Download all files (.zip)" in labels
    files, _ = bundle_files(target, opts)
    assert "The same files as `python -m calc export SCENARIO -o DIR`: " + ", ".join(f"`{n}`" for n in files) \
        in all_text(at)
    est = estimate(target)
    assert f"device total {fmt.gib(est.device_total_bytes.expected)} expected per GPU" in all_text(at)
    for note in ds.notes:
        assert f"Note: {note}" in all_text(at)


def test_default_scenario_exports():
    at = open_app("export")
    check_export(at, state.DEFAULT_SCENARIO)


def test_zero3_offload_scenario_exports_its_buckets():
    at = open_app("export", state.scenario_to_params(ZERO3))
    check_export(at, ZERO3)
    cfg = json.loads(_codes(at, "json")[0])
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert any("deepspeed --num_gpus 8 train.py" in c for c in _codes(at, "bash"))


def test_recommended_source_and_hyper_parameters():
    at = open_app("export", state.scenario_to_params(ZERO3))
    [r for r in at.radio if r.key == "exp_source"][0].set_value("recommended")
    at.run()
    best = fastest_fitting(ZERO3)
    check_export(at, best.scenario)
    assert best.label in all_text(at)
    # the exported configuration's verdict and speed, beside the files
    est, speed = estimate(best.scenario), estimate_speed(best.scenario)
    assert any(f"**{headline(est.verdict)}**" in b.value and f"{speed.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
               in b.value for b in at.success)
    values = {"exp_lr": 3e-4, "exp_wd": 0.1, "exp_clip": 0.5, "exp_warmup": 100, "exp_steps": 1000}
    for key, v in values.items():
        [w for w in at.number_input if w.key == key][0].set_value(v)
    [w for w in at.text_input if w.key == "exp_nvme"][0].set_value("/mnt/nvme0")
    at.run()
    opts = ExportOptions(learning_rate=3e-4, weight_decay=0.1, gradient_clipping=0.5, warmup_steps=100,
                         total_num_steps=1000, nvme_path="/mnt/nvme0")
    check_export(at, best.scenario, opts)
    cfg = json.loads(_codes(at, "json")[0])
    assert "scheduler" not in cfg  # the Trainer owns the schedule (train.py's arguments)
    assert "'lr_scheduler_type': 'linear'" in _codes(at, "python")[0] and "'max_steps': 1000" in _codes(at, "python")[0]
    assert cfg["gradient_clipping"] == 0.5


def test_inference_cannot_be_exported():
    sc = Scenario(model="llama-3.1-8b", mode="inference", hardware={"gpu": "a100-80gb"})
    at = open_app("export", state.scenario_to_params(sc))
    assert_clean(at)
    assert any("DeepSpeed cannot express this scenario" in e.value for e in at.error)


def test_import_a_ds_config():
    at = open_app("export")
    base = scenario(at)
    one_gpu = Scenario.model_validate({**ZERO3.model_dump(mode="json"), "hardware": {"gpu": "rtx-4090"}})
    cfg = export_deepspeed(one_gpu).config
    box = [t for t in at.text_area if t.key == "exp_import_text"][0]
    box.set_value(json.dumps(cfg))
    at.run()
    assert_clean(at)
    imported = import_ds_config(cfg, base, ExportOptions(), attention=base.training.attention.value).scenario
    est = estimate(imported)
    assert f"This config: **{headline(est.verdict)}**" in all_text(at)
    [b for b in at.button if b.key == "exp_import_use"][0].click()
    at.run()
    assert_clean(at)
    assert scenario(at) == imported
    assert [s for s in at.selectbox if s.key == "sc_zero"][0].value == 3


def test_the_hugging_face_config_imports_and_says_what_it_filled():
    """The ZeRO-3 config of the Hugging Face DeepSpeed guide ("auto" everywhere) is read in one go; the page lists
    each filled value with its source and the notes (left "auto", other bucket sizes)."""
    from tests.calc.export.test_ds_auto import HF_ZERO2

    at = open_app("export")
    [t for t in at.text_area if t.key == "exp_import_text"][0].set_value(json.dumps(HF_ZERO2))
    at.run()
    assert_clean(at)
    assert not [e.value for e in at.error if "pasted config" in e.value]  # (the verdict boxes may be errors)
    text = all_text(at)
    base = scenario(at)
    assert "Filled in for \"auto\"" in text and f"`train_micro_batch_size_per_gpu` = `{base.training.micro_batch_size}`" \
        in text and "TrainingArguments.per_device_train_batch_size of this scenario" in text
    assert "allgather_bucket_size = 200000000.0" in text  # the note a warning used to hide
    assert "This config: **" in text


def test_import_errors_name_the_key():
    at = open_app("export")
    for text, message in (('{"zero_optimization": {"stage": 7}, "train_batch_size": 8}', "zero_optimization.stage"),
                          ('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comms": true}}',
                           "DeepSpeed refuses this config: zero_optimization.overlap_comms: Extra inputs"),
                          ('{"zero_optimization": ', "not valid JSON"),
                          (json.dumps({**export_deepspeed(ZERO3).config, "train_batch_size": 8}),
                           "train_batch_size 8 != ")):
        [t for t in at.text_area if t.key == "exp_import_text"][0].set_value(text)
        at.run()
        assert_clean(at)
        assert any(message in e.value for e in at.error), (message, [e.value for e in at.error])
    [t for t in at.text_area if t.key == "exp_import_text"][0].set_value("")
    up = [w for w in at.get("file_uploader") if w.key == "exp_import_file"][0]
    up.set_value(("ds_config.json", b" " * (3 * 2**20), "application/json"))
    at.run()
    assert_clean(at)
    assert any("the limit is 1 MiB" in e.value for e in at.error)


TORCHTUNE_LORA = Scenario.model_validate({"model": "llama-3.2-1b", "training": {
    "framework": "torchtune", "activation_checkpointing": "full", "lora": {"rank": 8, "alpha": 16}}})
LITGPT_FULL = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"}, "training": {
    "framework": "litgpt", "precision": "bf16", "micro_batch_size": 2, "seq_len": 1024}})


def test_torchtune_scenario_exports_its_recipe_config_not_deepspeed():
    from calc.export.torchtune import torchtune_launch_script, torchtune_yaml

    at = open_app("export", state.scenario_to_params(TORCHTUNE_LORA))
    assert_clean(at)
    assert torchtune_yaml(TORCHTUNE_LORA, ExportOptions()).strip() in _codes(at, "yaml")
    assert torchtune_launch_script(TORCHTUNE_LORA).strip() in _codes(at, "bash")
    assert not _codes(at, "json") and not _codes(at, "python")
    labels = [b.label for b in at.get("download_button")]
    assert {"Download torchtune.yaml", "Download launch.sh"} <= set(labels)
    assert "Download ds_config.json" not in labels
    est = estimate(TORCHTUNE_LORA)
    assert f"device total {fmt.gib(est.device_total_bytes.expected)} expected per GPU" in all_text(at)


def test_litgpt_scenario_exports_its_command_line():
    from calc.export.litgpt import litgpt_launch_script

    at = open_app("export", state.scenario_to_params(LITGPT_FULL))
    assert_clean(at)
    assert litgpt_launch_script(LITGPT_FULL, ExportOptions()).strip() in _codes(at, "bash")
    assert "litgpt finetune_full" in _codes(at, "bash")[0]
    assert [b.label for b in at.get("download_button")] == ["Download launch.sh", "Download all files (.zip)"]


def test_what_torchtune_cannot_say_is_named_on_the_page():
    sc = TORCHTUNE_LORA.model_copy(update={"training": TORCHTUNE_LORA.training.model_copy(
        update={"checkpoint_every": 2})})
    at = open_app("export", state.scenario_to_params(sc))  # the scenario contract refuses it: the link is not used
    assert any("not valid" in w.value and "checkpoint every layer: use checkpoint_every 1" in w.value
               for w in at.warning)
    assert not any("_component_: torchtune." in code for code in _codes(at, "yaml"))  # no torchtune recipe config


def test_torchtune_export_speaks_chinese():
    from calc.contract.i18n import translate
    from calc.export.torchtune import torchtune_yaml

    at = open_app("export", {**state.scenario_to_params(TORCHTUNE_LORA), "lang": "zh"})
    assert_clean(at)
    assert translate("torchtune recipe config (torchtune.yaml)", "zh") in [s.value for s in at.subheader]
    zh_yaml = torchtune_yaml(TORCHTUNE_LORA, ExportOptions(), lang="zh").strip()
    assert zh_yaml in _codes(at, "yaml") and zh_yaml != torchtune_yaml(TORCHTUNE_LORA).strip()


def test_what_torchtune_cannot_say_is_named_in_chinese():
    from calc.contract.i18n import translate

    sc = TORCHTUNE_LORA.model_copy(update={"training": TORCHTUNE_LORA.training.model_copy(
        update={"checkpoint_every": 2})})
    at = open_app("export", {**state.scenario_to_params(sc), "lang": "zh"})
    reason = translate("torchtune's single-device recipes checkpoint every layer: use checkpoint_every 1", "zh")
    assert reason != "torchtune's single-device recipes checkpoint every layer: use checkpoint_every 1"
    assert any(reason in w.value for w in at.warning)


FSDP2 = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {"cluster": "8x-a100-80gb"}, "training": {
    "sharding": "fsdp2", "zero_stage": 3, "precision": "bf16-mixed", "activation_checkpointing": "full"}})


def test_an_fsdp2_scenario_exports_its_pytorch_loop_not_deepspeed():
    from calc.export.fsdp2 import fsdp2_launch_script, fsdp2_train_script

    at = open_app("export", state.scenario_to_params(FSDP2))
    assert_clean(at)
    assert "PyTorch FSDP2 training script (train.py) and torchrun (launch.sh)" in [s.value for s in at.subheader]
    assert fsdp2_train_script(FSDP2, ExportOptions()).strip() in _codes(at, "python")
    assert fsdp2_launch_script(FSDP2).strip() in _codes(at, "bash")
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download train.py", "Download launch.sh", "Download all files (.zip)"]
    assert not _codes(at, "json")


def test_what_the_fsdp2_loop_does_not_do_is_named_on_the_page():
    sc = FSDP2.model_copy(update={"training": FSDP2.training.model_copy(update={"optimizer": Optimizer.adamw_8bit})})
    at = open_app("export", state.scenario_to_params(sc))
    assert any("PyTorch FSDP2 cannot express this scenario" in e.value and "DTensor" in e.value for e in at.error)
    assert not _codes(at, "python")

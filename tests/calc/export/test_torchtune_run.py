"""The exported torchtune recipe config, run end to end: `tune run <recipe> --config torchtune.yaml` for two
steps on the CPU with the pinned torchtune and the bundle's torchao, on a tiny random model of the scenario's family. What the
config's header asks a user to set is set on the command line, as a user would: the checkpoint (a Hugging Face
checkpoint written here), the output folder, the dataset (a local text file) and, since the model's own
tokenizer needs its files, a byte tokenizer (tests/calc/export/tune_tokenizer.py); and device=cpu."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from calc.export.torchtune import TORCHTUNE_FILE, recipe_name, torchtune_config, torchtune_yaml
from tests.calc.export.test_export_frameworks import TORCHTUNE_CHECKED

ROOT = Path(__file__).resolve().parents[3]
# the torchao the bundle pins, installed apart by scripts/test.sh (peft refuses it in the shared environment)
BUNDLE_SITE = ROOT / "build" / "torchtune-bundle"
# the configs whose model is a small config (the presets' builders would build 0.5B-1B models)
RUNNABLE = [sc for sc in TORCHTUNE_CHECKED if isinstance(sc.model, dict)]
KEPT_TOKENIZER_KEYS = ("_component_", "max_seq_len")  # the model tokenizer's files go, its length stays
TUNE = "import sys; from torchtune._cli.tune import main; sys.argv[0] = 'tune'; sys.exit(main())"


def _label(sc) -> str:
    t = sc.training
    parts = [sc.spec.family, recipe_name(sc)]
    if t.lora is not None:
        parts.append(f"lora-{t.lora.base_weights}")
    if t.optimizer_in_backward:
        parts.append("optim-in-bwd")
    parts += [t.optimizer.value, t.activation_checkpointing.value]
    return "-".join(parts)


def _checkpoint(sc, folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**sc.model)).save_pretrained(
        folder, safe_serialization=True)


def test_some_exported_configs_are_small_enough_to_run():
    assert len(RUNNABLE) >= 6
    assert {recipe_name(sc) for sc in RUNNABLE} == {"full_finetune_single_device", "lora_finetune_single_device"}


@pytest.mark.slow
@pytest.mark.parametrize("sc", RUNNABLE, ids=_label)
def test_tune_run_trains_two_steps_with_the_exported_config(sc, tmp_path):
    if not BUNDLE_SITE.is_dir():
        pytest.skip("the torchtune bundle's torchao is not installed: run scripts/test.sh (build/torchtune-bundle)")
    _checkpoint(sc, tmp_path / "hf")
    (tmp_path / TORCHTUNE_FILE).write_text(torchtune_yaml(sc))
    (tmp_path / "data.txt").write_text("\n".join(f"{i}: the quick brown fox jumps over the lazy dog" for i in
                                                 range(32)))
    overrides = [f"output_dir={tmp_path / 'out'}", f"checkpointer.checkpoint_dir={tmp_path / 'hf'}",
                 "tokenizer._component_=tests.calc.export.tune_tokenizer.byte_tokenizer",
                 *(f"~tokenizer.{key}" for key in torchtune_config(sc)["tokenizer"] if key not in KEPT_TOKENIZER_KEYS),
                 f"tokenizer.vocab_size={sc.spec.vocab_size}",
                 "dataset._component_=torchtune.datasets.text_completion_dataset", "dataset.source=text",
                 f"dataset.data_files={tmp_path / 'data.txt'}", "device=cpu", "max_steps_per_epoch=2",
                 "log_peak_memory_stats=False"]
    cmd = [sys.executable, "-c", TUNE, "run", recipe_name(sc), "--config", TORCHTUNE_FILE, *overrides]
    path = os.pathsep.join(filter(None, (str(BUNDLE_SITE), str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    losses = [float(x) for x in re.findall(r"\|\d+\|Loss: ([0-9.naif]+)", out)]
    assert len(set(re.findall(r"\|(\d+)\|Loss", out))) == 2 and all(0 < x < 100 for x in losses), out[-2000:]
    assert list((tmp_path / "out").glob("epoch_0/*.safetensors")), "no checkpoint saved"

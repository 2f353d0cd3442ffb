"""The exported LitGPT command, run end to end: `bash launch.sh` (litgpt finetune_full / finetune_lora with the
estimate's flags) for two steps on the CPU with the pinned LitGPT, on a tiny random model of the scenario's shape.
What the script's header asks a user to provide is provided as a user would: the checkpoint folder it names
(lit_model.pth and model_config.yaml from LitGPT's GPT, a tokenizer trained here with `tokenizers`) and, as extra
arguments, a local JSON data set, two steps and no validation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from calc.export.litgpt import litgpt_argv, litgpt_launch_script
from tests.calc.export.test_export_frameworks import LITGPT_CHECKED

ROOT = Path(__file__).resolve().parents[3]
# a preset would mean an 8B model; QLoRA's --quantize goes through Lightning's BitsandbytesPrecision, which refuses
# a CPU ("only supported on CUDA GPUs"): those command lines are parsed (test_export_frameworks), not run
RUNNABLE = [sc for sc in LITGPT_CHECKED if isinstance(sc.model, dict)
            and not (sc.training.lora is not None and sc.training.lora.quantized)]
TEXT = [f"{i}: the quick brown fox jumps over the lazy dog" for i in range(32)]
RUN_ARGS = ["--data", "JSON", "--data.json_path", "data.json", "--data.val_split_fraction", "0.25",
            "--train.max_steps", "2", "--out_dir", "out", "--eval.initial_validation", "false",
            "--eval.final_validation", "false", "--eval.interval", "100", "--logger_name", "csv"]


def _label(sc) -> str:
    t = sc.training
    lora = "full" if t.lora is None else f"lora-{t.lora.base_weights}"
    return f"{t.precision.value}-{lora}-{t.optimizer.value}-{t.optimizer_impl.value}"


def _checkpoint(sc, folder: Path) -> None:
    """What `litgpt download` leaves: weights, the model config and the tokenizer files LitGPT's Tokenizer reads."""
    import torch
    from litgpt import GPT
    from litgpt.utils import save_config
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from measure.frameworks.litgpt_run import litgpt_config

    folder.mkdir(parents=True)
    config = litgpt_config(dict(sc.model))
    torch.manual_seed(0)
    torch.save(GPT(config).state_dict(), folder / "lit_model.pth")
    save_config(config, folder)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}))


def test_some_exported_commands_are_small_enough_to_run():
    assert len(RUNNABLE) >= 4
    assert {litgpt_argv(sc)[1] for sc in RUNNABLE} == {"finetune_full", "finetune_lora"}


@pytest.mark.slow
@pytest.mark.parametrize("sc", RUNNABLE, ids=_label)
def test_launch_sh_trains_two_steps(sc, tmp_path):
    (tmp_path / "launch.sh").write_text(litgpt_launch_script(sc))
    _checkpoint(sc, tmp_path / litgpt_argv(sc)[2])
    (tmp_path / "data.json").write_text(json.dumps([{"instruction": t, "input": "", "output": t[::-1]} for t in TEXT]))
    env = {"PATH": os.pathsep.join((str(Path(sys.executable).parent), "/usr/bin", "/bin")), "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", "launch.sh", *RUN_ARGS], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    losses = [float(x) for x in re.findall(r"step \d+ \| loss train: ([0-9.]+)", out)]
    assert len(losses) == 2 and all(0 < x < 100 for x in losses), out[-2000:]
    assert (tmp_path / "out" / "final" / "lit_model.pth").is_file()

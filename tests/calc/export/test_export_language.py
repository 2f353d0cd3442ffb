"""The exported files in Chinese: the same code as the English ones, only the words differ.

ds_config.json is identical in every language; train.py's docstrings, comments, --help and messages,
launch.sh's and accelerate.yaml's comments, and the notes follow the language. The English bundle runs
under DeepSpeed in tests/calc/export/test_export_run.py; here the Chinese one must compile to the same program.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calc.contract.scenario import Scenario
from calc.export import export_bundle
from calc.export.bundle import ACCELERATE_FILE, LAUNCH_SCRIPT, TRAIN_SCRIPT
from calc.export.hf import DS_CONFIG_FILE

ROOT = Path(__file__).resolve().parents[3]

SCENARIOS = {
    "zero3-offload-ckpt2": {"model": "llama-2-7b", "hardware": {"cluster": "8x-a100-80gb"},
                            "training": {"zero_stage": 3, "precision": "bf16-mixed", "offload_optimizer": "cpu",
                                         "activation_checkpointing": "full", "checkpoint_every": 2}},
    "amp-ddp-lora": {"model": "llama-3.2-1b", "training": {"precision": "amp-bf16", "lora": {"rank": 8}}},
}


def _bundles(name: str) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
    sc = Scenario.model_validate(SCENARIOS[name])
    en, en_notes = export_bundle(sc)
    zh, zh_notes = export_bundle(sc, lang="zh")
    return en, zh, en_notes, zh_notes


def _code_only(source: str) -> str:
    """The program without its words: every string constant blanked, comments gone (ast drops them)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def _has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_chinese_bundle_is_the_same_program(name):
    en, zh, en_notes, zh_notes = _bundles(name)
    assert en[DS_CONFIG_FILE] == zh[DS_CONFIG_FILE]
    assert _code_only(en[TRAIN_SCRIPT]) == _code_only(zh[TRAIN_SCRIPT])
    assert yaml.safe_load(en[ACCELERATE_FILE]) == yaml.safe_load(zh[ACCELERATE_FILE])
    code = [[ln for ln in f.splitlines() if not ln.lstrip().startswith("#")] for f in (en[LAUNCH_SCRIPT], zh[LAUNCH_SCRIPT])]
    assert code[0] == code[1] or name == "zero3-offload-ckpt2"  # one node here: no NODE_RANK message
    for text in (zh[TRAIN_SCRIPT], zh[ACCELERATE_FILE], zh[LAUNCH_SCRIPT], *zh_notes):
        assert _has_chinese(text), text[:80]
    assert len(en_notes) == len(zh_notes) and not any(_has_chinese(n) for n in en_notes)
    json.loads(zh[DS_CONFIG_FILE])


def test_chinese_launch_script_is_valid_bash(tmp_path):
    sc = Scenario.model_validate({"model": "llama-2-7b", "hardware": {"cluster": "64x-a100-80gb"},
                                  "training": {"zero_stage": 3, "precision": "bf16-mixed"}})
    files, _ = export_bundle(sc, lang="zh")
    assert "NODE_RANK" in files[LAUNCH_SCRIPT] and _has_chinese(files[LAUNCH_SCRIPT])
    path = tmp_path / LAUNCH_SCRIPT
    path.write_text(files[LAUNCH_SCRIPT], encoding="utf-8")
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_chinese_train_script_prints_chinese_help(tmp_path):
    """Compiles, imports (torch, transformers) and answers --help in Chinese: the words are real Python."""
    _, zh, _, _ = _bundles("amp-ddp-lora")
    path = tmp_path / TRAIN_SCRIPT
    path.write_text(zh[TRAIN_SCRIPT], encoding="utf-8")
    out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8",
                                            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "每个样本的 token 数" in out.stdout


def test_cli_export_lang_zh(tmp_path):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(SCENARIOS["amp-ddp-lora"]))
    out = subprocess.run([sys.executable, "-m", "calc", "export", str(scenario), "-o", str(tmp_path / "zh"),
                          "--lang", "zh"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert _has_chinese((tmp_path / "zh" / TRAIN_SCRIPT).read_text(encoding="utf-8"))
    assert _has_chinese(out.stderr)  # the notes
    default = subprocess.run([sys.executable, "-m", "calc", "export", str(scenario), "-o", str(tmp_path / "en")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert default.returncode == 0 and not _has_chinese(default.stderr)
    assert not _has_chinese((tmp_path / "en" / TRAIN_SCRIPT).read_text(encoding="utf-8"))

"""One file set: the Export page's .zip and `python -m calc export -o DIR` hold the same files, byte for byte
(calc.export.bundle.bundle_files), with a requirements.txt whose pins are the repository's own (and the installed
versions the exported files are run with in test_export_run.py)."""

from __future__ import annotations

import importlib.metadata
import io
import json
import stat
import zipfile
from pathlib import Path

import pytest

from calc.cli.main import main
from calc.contract.scenario import Scenario
from calc.export import bundle_files, bundle_zip
from calc.export.requirements import PIN_FILES, ROOT, packages, pins

SCENARIOS = {
    "zero3-lora": {"model": "llama-3.2-1b", "hardware": {"cluster": "8x-a100-80gb"},
                   "training": {"zero_stage": 3, "precision": "bf16-mixed", "lora": {"rank": 8}}},
    "qlora": {"model": "llama-3.2-1b", "hardware": {"gpu": "rtx-4090"},
              "training": {"precision": "amp-bf16", "lora": {"rank": 8, "base_weights": "nf4"}}},
    "ddp": {"model": "gpt2", "hardware": {"gpu": "rtx-4090"}, "training": {"precision": "fp32"}},
    "torchtune": {"model": "llama-3.2-1b", "hardware": {"gpu": "rtx-4090"},
                  "training": {"framework": "torchtune", "precision": "bf16", "lora": {"rank": 8}}},
}


def _zip_members(data: bytes) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: (zf.read(i), i.external_attr >> 16) for i in zf.infolist()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_zip_and_folder_hold_the_same_files(name: str, tmp_path: Path, capsys) -> None:
    sc = Scenario.model_validate(SCENARIOS[name])
    files, _ = bundle_files(sc)
    assert "requirements.txt" in files
    members = _zip_members(bundle_zip(files))
    assert {m.removeprefix("vramcalc-export/"): data for m, (data, _) in members.items()} == files
    assert bundle_zip(files) == bundle_zip(bundle_files(sc)[0])  # the same scenario, the same .zip
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCENARIOS[name]))
    out = tmp_path / "run"
    assert main(["export", str(path), "-o", str(out)]) == 0
    capsys.readouterr()
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    assert written == files
    launch_mode = members["vramcalc-export/launch.sh"][1]
    assert launch_mode & stat.S_IXUSR and stat.S_IMODE((out / "launch.sh").stat().st_mode) & stat.S_IXUSR


def test_requirements_are_the_repositorys_pins_for_the_stack() -> None:
    qlora = Scenario.model_validate(SCENARIOS["qlora"])
    text = bundle_files(qlora)[0]["requirements.txt"].decode()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == [f"{p}=={pins()[p]}" for p in packages(qlora)]
    assert {"torch", "transformers", "accelerate", "peft", "bitsandbytes"} <= set(packages(qlora))
    assert "deepspeed" in packages(Scenario.model_validate(SCENARIOS["zero3-lora"]))
    assert packages(Scenario.model_validate(SCENARIOS["ddp"])) == ["torch", "transformers", "accelerate"]
    assert packages(Scenario.model_validate(SCENARIOS["torchtune"]))[:2] == ["torch", "torchtune"]
    for name in PIN_FILES:  # every pin file exists and holds pins
        assert "==" in (ROOT / name).read_text()


@pytest.mark.parametrize("package", ["torch", "transformers", "accelerate", "deepspeed", "peft", "bitsandbytes",
                                     "torchtune", "torchao", "litgpt", "lightning", "jsonargparse"])
def test_the_pins_are_what_the_exports_were_run_with(package: str) -> None:
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed here")
    assert installed.split("+")[0] == pins()[package]


def test_the_torchtune_bundle_pins_the_torchao_its_recipes_run_with() -> None:
    """torchtune 0.6.1's recipes import a name later torchao releases dropped: its bundle pins the torchao of
    measure/requirements-torchtune-bundle.txt, which scripts/test.sh installs apart for the `tune run` test."""
    from calc.export.requirements import STACK_PIN_FILES

    tt = Scenario.model_validate(SCENARIOS["torchtune"])
    text = bundle_files(tt)[0]["requirements.txt"].decode()
    version = pins("torchtune")["torchao"]
    assert f"torchao=={version}" in text.splitlines()
    assert pins("torchtune")["torchtune"] == pins()["torchtune"]  # the rest as the shared environment's
    site = ROOT / "build" / "torchtune-bundle"
    if site.is_dir():
        assert [p.name for p in site.glob("torchao-*.dist-info")] == [f"torchao-{version}.dist-info"]
    assert (ROOT / STACK_PIN_FILES["torchtune"]).is_file()

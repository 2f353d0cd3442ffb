"""requirements.txt of an exported bundle: the packages its files import, pinned to the versions vramcalc checked
them with. The pins are read from the repository's own requirement files (PIN_FILES), the ones its tests install
to run the exported files (tests/calc/export/test_export_run.py), so a version is written down once."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from calc.contract.i18n import DEFAULT_LANG, N_, Lang, translate
from calc.contract.scenario import Scenario

REQUIREMENTS_FILE = "requirements.txt"
ROOT = Path(__file__).resolve().parents[2]
PIN_FILES = ("requirements-dev.txt", "measure/requirements.txt", "measure/requirements-frameworks.txt",
             "measure/requirements-litgpt.txt")
# A stack whose files were run with other versions than the shared environment's (scripts/test.sh installs them
# apart): torchtune's recipes need a torchao that peft, in the shared environment, refuses.
STACK_PIN_FILES = {"torchtune": "measure/requirements-torchtune-bundle.txt"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


@functools.cache
def pins(stack: str | None = None) -> dict[str, str]:
    """{package name (lower case): version} over PIN_FILES, then the stack's own file over them (STACK_PIN_FILES);
    ValueError if two of PIN_FILES pin one package differently."""
    found: dict[str, str] = {}
    for name in PIN_FILES:
        for package, version in _read_pins(name):
            if found.setdefault(package, version) != version:
                raise ValueError(f"{package} is pinned to {found[package]} and {version} in {PIN_FILES}")
    if stack in STACK_PIN_FILES:
        found.update(_read_pins(STACK_PIN_FILES[stack]))
    return found


def _read_pins(name: str) -> list[tuple[str, str]]:
    out = []
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        m = _PIN.match(line.strip())
        if m:
            out.append((m.group(1).lower(), m.group(2)))
    return out


def packages(sc: Scenario) -> list[str]:
    """The packages the bundle's files import or launch with, by the scenario's stack."""
    from calc.contract.stacks import uses_fsdp2
    from calc.export.hf import uses_deepspeed

    t = sc.training
    if t.framework == "torchtune":
        return ["torch", "torchtune", "torchao"]
    if t.framework == "litgpt":
        return ["torch", "litgpt", "lightning", "jsonargparse"]
    if uses_fsdp2(sc):  # train.py's own loop under torchrun
        return ["torch", "transformers"] + (["peft"] if t.lora is not None else [])
    names = ["torch", "transformers", "accelerate"]
    if uses_deepspeed(sc):
        names.append("deepspeed")
    if t.lora is not None:
        names.append("peft")
    if (t.lora is not None and t.lora.base_weights in ("int8", "nf4", "fp4")) or t.optimizer.bitsandbytes:
        names.append("bitsandbytes")
    return names


def requirements_text(sc: Scenario, lang: Lang = DEFAULT_LANG) -> str:
    """The bundle's requirements.txt (`pip install -r requirements.txt`)."""
    lines = [translate(N_("# The versions these files were checked with (vramcalc's pins)."), lang),
             translate(N_("# torch: install the build for your CUDA version first (https://pytorch.org)."), lang)]
    versions = pins(sc.training.framework)
    lines += [f"{name}=={versions[name]}" for name in packages(sc)]
    if sc.training.cross_entropy == "liger-fused":
        lines.append(translate(N_("# liger-kernel: not pinned (these files were not run with it)"), lang))
        lines.append("liger-kernel")
    return "\n".join(lines) + "\n"

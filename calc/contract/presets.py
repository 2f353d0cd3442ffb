"""Model, GPU and cluster presets: one YAML file per item under presets/, id = file name.

Every file is validated by pydantic when loaded; a bad file raises PresetError naming its path.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from calc.contract.architectures import ModelSpec, spec_from_hf_config
from calc.contract.boundary import excerpt
from calc.contract.enums import InferenceWeights
from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.limits import MAX_PRESET_ID_CHARS

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"


ID_PATTERN = r"^[a-z0-9][a-z0-9.\-]*$"  # a preset's id, also its file name: no path separators


class PresetError(ValueError):
    """A preset file is missing, malformed or inconsistent."""


class ModelPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=ID_PATTERN)
    name: str
    source: str = Field(description="URL of the config.json the shapes come from")
    published_params: int = Field(gt=0, description="parameter count published by the authors / HF")
    params_source: str | None = Field(None, description="where published_params comes from, if not `source`")
    published_tolerance: float = Field(
        0.005, gt=0, le=0.02, description="how far the exact count may be from published_params: 0.5 %, or up to "
        "2 % where the only published figure is rounded or counts modules the CausalLM does not build (the notes "
        "say which)")
    config: dict[str, Any] = Field(description="Hugging Face config.json fields that define the shapes")
    checkpoint_weights: InferenceWeights | None = Field(
        None, description="how the hub checkpoint stores its weights where it is not 16-bit (its config.json's "
        "quantization_config): what a serving engine loads when the scenario names no inference.weights")
    notes: str | None = None

    @property
    def spec(self) -> ModelSpec:
        return spec_from_hf_config(self.config, name=self.name)


# A closed set: code branches on these values (calc.memory.overhead), so a free-text name cannot silently miss.
Architecture = Literal["volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell", "cdna3"]


class GpuPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=ID_PATTERN)
    name: str
    vendor: Literal["nvidia", "amd"]
    memory_bytes: int = Field(gt=0, description="total device memory as nvidia-smi / rocm-smi reports it")
    memory_label: str = Field(description="the marketing size, e.g. '80 GB' (a label, not a byte count)")
    bf16: bool = Field(description="native bf16 tensor-core support")
    bf16_tflops: float = Field(ge=0, description="dense bf16 tensor TFLOPS (0 when unsupported)")
    fp16_tflops: float = Field(gt=0, description="dense fp16 tensor TFLOPS")
    fp32_tflops: float = Field(gt=0, description="fp32 (non-tensor) TFLOPS")
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    pcie_gen: int = Field(ge=3, le=6)
    nvlink_bandwidth_bytes_per_s: float = Field(ge=0, description="per-GPU bidirectional; 0 = none")
    architecture: Architecture = Field(description="GPU generation: decides e.g. the cuBLAS workspace size")
    chip: str | None = Field(None, description="the die, e.g. GH100 (a label)")
    source: str = Field(description="URL of the datasheet")
    notes: str | None = None

    @property
    def pcie_bandwidth_bytes_per_s(self) -> float:
        """Per-direction x16 bandwidth: 16 GB/s for gen3, doubling per generation (PCI-SIG)."""
        return 16e9 * 2 ** (self.pcie_gen - 3)


class ClusterPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=ID_PATTERN)
    name: str
    gpu: str
    num_gpus: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    inter_node_bandwidth_bytes_per_s: float = Field(
        0, ge=0, description="network bandwidth per GPU between nodes (0 for a single node)"
    )
    cpu_ram_bytes_per_node: int = Field(gt=0)
    nvme_bandwidth_bytes_per_s: float = Field(3.5e9, gt=0)
    nvme_bytes_per_node: int | None = Field(None, gt=0, description="NVMe capacity for ZeRO-Infinity offload")
    notes: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> ClusterPreset:
        if self.num_gpus % self.gpus_per_node:
            raise ValueError("num_gpus must be a multiple of gpus_per_node")
        return self


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: ~10x faster, same safe types


def load_yaml(text: str) -> Any:
    """yaml.safe_load for the repository's own YAML (presets, claims), through libyaml when PyYAML has it:
    the same safe constructors and resolver, a C parser (loading the presets is most of a cold start)."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


def _load_file(path: Path, cls: type[BaseModel]) -> Any:
    try:
        data = load_yaml(path.read_text())
        item = cls.model_validate(data)
    except (yaml.YAMLError, ValidationError, ValueError) as exc:
        raise PresetError(f"{path}: {exc}") from None
    if item.id != path.stem:
        raise PresetError(f"{path}: id {item.id!r} must equal the file name {path.stem!r}")
    return item


def _load_dir(kind: str, cls: type[BaseModel]) -> dict[str, Any]:
    items = (_load_file(path, cls) for path in sorted((PRESETS_DIR / kind).glob("*.yaml")))
    return {item.id: item for item in items}


def _spec_of(item: ModelPreset) -> ModelSpec:
    try:
        return item.spec
    except ValueError as exc:
        raise PresetError(f"{PRESETS_DIR / 'models' / (item.id + '.yaml')}: {exc}") from None


@lru_cache(maxsize=1)
def model_presets() -> dict[str, ModelPreset]:
    items = _load_dir("models", ModelPreset)
    for item in items.values():
        _spec_of(item)
    return items


@lru_cache(maxsize=1)
def gpu_presets() -> dict[str, GpuPreset]:
    return _load_dir("gpus", GpuPreset)


@lru_cache(maxsize=1)
def cluster_presets() -> dict[str, ClusterPreset]:
    clusters = _load_dir("clusters", ClusterPreset)
    gpus = gpu_presets()
    for c in clusters.values():
        if c.gpu not in gpus:
            raise PresetError(f"{PRESETS_DIR / 'clusters' / (c.id + '.yaml')}: unknown gpu {c.gpu!r}")
    return clusters


def is_preset_id(text: str) -> bool:
    """Whether `text` could name a preset file: the id pattern and a bounded length, checked before any file is
    looked up (a 300-character name is an OSError from the file system, not a missing preset)."""
    return len(text) <= MAX_PRESET_ID_CHARS and re.fullmatch(ID_PATTERN, text) is not None


@lru_cache(maxsize=256)
def _spec_for_preset(preset_id: str) -> ModelSpec:
    if not model_presets.cache_info().currsize and is_preset_id(preset_id):
        path = PRESETS_DIR / "models" / f"{preset_id}.yaml"
        if path.is_file():
            return _spec_of(_load_file(path, ModelPreset))  # one file, not all of them: a command about one model
    presets = model_presets()
    if preset_id not in presets:
        raise UserError(T_("unknown model preset {preset}; run `python -m calc presets` to list them",
                           preset=excerpt(preset_id)))
    return presets[preset_id].spec


def resolve_model(model: str | dict[str, Any]) -> ModelSpec:
    """A preset id or a config.json dict -> ModelSpec (ValueError with a clear message otherwise)."""
    if isinstance(model, str):
        return _spec_for_preset(model)
    return spec_from_hf_config(model)


def resolve_hardware(hw: Any) -> Any:
    """Expand a cluster preset and check the GPU id; returns a HardwareConfig."""
    update: dict[str, Any] = {}
    if hw.cluster is None and hw.gpu is not None and hw.gpu not in gpu_presets() and hw.gpu in cluster_presets():
        hw = hw.model_copy(update={"cluster": hw.gpu, "gpu": None})  # a cluster id given as the GPU
    if hw.cluster is not None:
        clusters = cluster_presets()
        if hw.cluster not in clusters:
            raise UserError(T_("unknown cluster preset {preset}; known: {known}", preset=excerpt(hw.cluster),
                               known=", ".join(sorted(clusters))))
        c = clusters[hw.cluster]
        if "num_gpus" in hw.model_fields_set and hw.num_gpus != c.num_gpus:  # e.g. gpu="8x-..." + num_gpus=3
            raise UserError(T_("num_gpus={num_gpus} contradicts cluster {cluster}, which has {count} GPUs; give one "
                               "of them", num_gpus=hw.num_gpus, cluster=excerpt(hw.cluster), count=c.num_gpus))
        if hw.gpu is not None and hw.gpu != c.gpu:  # the cluster's GPU is part of what it is: neither silently wins
            raise UserError(T_("gpu {gpu} contradicts cluster {cluster}, whose GPUs are {cluster_gpu}; give one of "
                               "them", gpu=excerpt(hw.gpu), cluster=excerpt(hw.cluster), cluster_gpu=c.gpu))
        update = {"gpu": c.gpu, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node,
                  "cpu_ram_bytes": hw.cpu_ram_bytes or c.cpu_ram_bytes_per_node,
                  "nvme_bytes": hw.nvme_bytes or c.nvme_bytes_per_node}
    gpu = update.get("gpu", hw.gpu)
    if gpu is not None and gpu not in gpu_presets():
        raise UserError(T_("unknown GPU preset {preset}; run `python -m calc presets` to list them",
                           preset=excerpt(gpu)))
    return hw.model_copy(update=update) if update else hw

"""The presets' old import path, kept for scripts and notebooks: they live in calc.contract.presets."""

from calc.contract.presets import (
    ID_PATTERN,
    PRESETS_DIR,
    Architecture,
    ClusterPreset,
    GpuPreset,
    ModelPreset,
    PresetError,
    cluster_presets,
    gpu_presets,
    load_yaml,
    model_presets,
    resolve_hardware,
    resolve_model,
)

__all__ = ["ID_PATTERN", "PRESETS_DIR", "Architecture", "ClusterPreset", "GpuPreset", "ModelPreset", "PresetError",
           "cluster_presets", "gpu_presets", "load_yaml", "model_presets", "resolve_hardware", "resolve_model"]

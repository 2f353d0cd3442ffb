"""The hardware block of a scenario: which GPUs, how many per node, and the host's RAM and NVMe."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.limits import MAX_GPU_MEMORY_BYTES, MAX_HOST_BYTES


class HardwareConfig(BaseModel):
    """Which GPUs. `gpu` is a preset id; `cluster` is a cluster preset that fills gpu and count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str | None = Field(None, description="GPU preset id, e.g. a100-80gb")
    num_gpus: int = Field(1, ge=1, le=65536, description="GPUs in the job")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="default: min(num_gpus, 8)")
    cluster: str | None = Field(None, description="cluster preset id, e.g. 8x-a100-80gb")
    memory_bytes: int | None = Field(None, gt=0, le=MAX_GPU_MEMORY_BYTES,
                                     description="custom GPU: usable device memory in bytes")
    cpu_ram_bytes: int | None = Field(None, gt=0, le=MAX_HOST_BYTES, description="host RAM per node, for offload checks")
    nvme_bytes: int | None = Field(None, gt=0, le=MAX_HOST_BYTES, description="NVMe capacity per node, for offload checks")

    @model_validator(mode="before")
    @classmethod
    def _cluster_count(cls, data: Any) -> Any:
        """A cluster fixes the GPU count: fill num_gpus from it, so the count is stated once and a
        dumped scenario validates again; a different num_gpus is an error (not silently replaced)."""
        if isinstance(data, dict) and isinstance(data.get("cluster"), str) and "num_gpus" not in data:
            count = _cluster_gpus(data["cluster"])
            if count is not None:
                data = {**data, "num_gpus": count}
        return data

    @model_validator(mode="after")
    def _cluster_agrees(self) -> HardwareConfig:
        count = _cluster_gpus(self.cluster) if self.cluster else None
        if count is not None and self.num_gpus != count:
            raise UserError(T_("num_gpus={num_gpus} contradicts cluster {cluster}, which has {count} GPUs; give one "
                               "of them", num_gpus=self.num_gpus, cluster=repr(self.cluster), count=count))
        return self

    def gpus_in_node(self) -> int:
        """GPUs per node: `gpus_per_node`, by default min(num_gpus, 8) (the one place this default lives)."""
        return min(self.gpus_per_node or min(self.num_gpus, 8), self.num_gpus)


def _cluster_gpus(cluster_id: str) -> int | None:
    """The GPU count of a cluster preset; None for an unknown id (resolve_hardware names it)."""
    from calc.contract.presets import cluster_presets

    c = cluster_presets().get(cluster_id)
    return None if c is None else c.num_gpus


def preset_hardware(hw_id: str) -> HardwareConfig:
    """A cluster preset or a GPU preset id as the scenario's hardware (the model x hardware tables name both)."""
    from calc.contract.presets import cluster_presets, gpu_presets

    if hw_id in cluster_presets():
        return HardwareConfig(cluster=hw_id)
    if hw_id in gpu_presets():
        return HardwareConfig(gpu=hw_id)
    raise ValueError(f"unknown hardware {hw_id!r}: give a cluster preset (e.g. 8x-a100-80gb) or a GPU preset")

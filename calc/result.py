"""What the engine returns. All sizes are bytes (int); convert at the edge (calc.units)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from calc.verdict import Verdict

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_states", "activations", "other")
CATEGORY_LABELS: dict[str, str] = {
    "parameters": "Parameters (weights on this GPU)",
    "gradients": "Gradients",
    "optimizer_states": "Optimizer states (and fp32 master weights)",
    "activations": "Activations saved for backward",
    "other": "Transients (logits/loss, optimizer temporaries, autocast copies, buffers, workspaces)",
}


class Component(BaseModel):
    """One term of the breakdown at the peak, with how it was computed."""

    model_config = ConfigDict(extra="forbid")

    key: str
    category: str = Field(description="one of CATEGORIES")
    label: str = Field(description="plain-language name")
    bytes: int
    formula: str = Field(description="the formula with this scenario's numbers")
    source: str = Field(description="paper, PyTorch/DeepSpeed behaviour or measurement it rests on")


class Breakdown(BaseModel):
    """Live bytes per category at the peak; the five numbers sum to peak_allocated_bytes."""

    model_config = ConfigDict(extra="forbid")

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int

    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.other


class Timeline(BaseModel):
    """Live bytes per category at each event of a training step (columns of equal length)."""

    model_config = ConfigDict(extra="forbid")

    events: list[str] = Field(description="e.g. 'forward layer 3', 'loss', 'backward layer 3', 'optimizer step'")
    phases: list[str] = Field(description="forward | loss | backward | optimizer | inference")
    parameters: list[int]
    gradients: list[int]
    optimizer_states: list[int]
    activations: list[int]
    other: list[int]
    peak_index: int

    def total(self, i: int) -> int:
        return (self.parameters[i] + self.gradients[i] + self.optimizer_states[i]
                + self.activations[i] + self.other[i])


class DeviceTotal(BaseModel):
    """What nvidia-smi would show: peak allocated + context + workspaces + allocator reserve."""

    model_config = ConfigDict(extra="forbid")

    low: int
    expected: int
    high: int
    cuda_context_bytes: int
    workspace_bytes: int = Field(description="NCCL communicator buffers (outside the caching allocator; "
                                 "cuBLAS workspaces are inside peak allocated)")
    reserve_low_bytes: int
    reserve_expected_bytes: int
    reserve_high_bytes: int


class ModelSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    total_params: int
    trainable_params: int
    params_on_this_gpu: int
    num_layers: int
    layers_on_this_gpu: int


class Estimate(BaseModel):
    """The engine's answer for one scenario, per GPU (the worst rank)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSummary
    peak_allocated_bytes: int = Field(description="predicted torch.cuda.max_memory_allocated() over 3 steps")
    peak_phase: str
    peak_event: str
    peak_step: int = Field(description="training step (1-3) in which the peak falls")
    breakdown: Breakdown
    components: list[Component]
    timeline: Timeline
    device_total_bytes: DeviceTotal
    gpu_memory_bytes: int | None = Field(None, description="the GPU's total memory, if a GPU is chosen")
    fits: bool | None = Field(None, description="verdict.fits: every limit (GPU, host RAM, NVMe) met; None when "
                              "one is unknown")
    headroom_bytes: int | None = Field(None, description="GPU memory - expected device total")
    cpu_ram_bytes: int = Field(0, description="host RAM per node needed for offloaded states/params")
    nvme_bytes: int = Field(0, description="NVMe space per node for offloaded states/params")
    verdict: Verdict = Field(description="does it fit: GPU memory per GPU, host RAM and NVMe per node "
                             "(calc.verdict); every page and the recommender read this")
    notes: list[str] = Field(default_factory=list)

"""One measured run: the JSON record `python -m measure` prints and data/*.jsonl stores, one per line.

No torch here, so the app and the calculator's tests can read the committed data without it.
All sizes are bytes (int). Field names carry their unit.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from calc.scenario import Scenario

SCHEMA_VERSION = 1

Device = Literal["cuda", "cpu", "fake"]
Engine = Literal["torch-single", "fsdp2"]
Phase = Literal["forward", "backward", "optimizer"]


class RecordError(ValueError):
    """A record file or line is malformed; the message names the line and the field."""


class PhasePeaks(BaseModel):
    """Peak live bytes inside each phase of the step (null where the phase does not run, e.g. inference).

    forward: the model call including the loss; backward: loss.backward();
    optimizer: everything after backward (fp32 master-grad copies, step, copy-back, zero_grad).
    Each phase's peak includes what was already live when the phase began.
    """

    model_config = ConfigDict(extra="forbid")

    forward: int | None = Field(None, ge=0)
    backward: int | None = Field(None, ge=0)
    optimizer: int | None = Field(None, ge=0)


class Categories(BaseModel):
    """Live bytes per kind at the peak, from torch's MemTracker (cpu / fake only).

    MemTracker's names: PARAM, BUFFER, GRAD, ACT, TEMP (created during backward: activation gradients,
    recomputation outside a module), OPT (optimizer states and the fp32 master weights, and everything
    allocated inside optimizer.step(), its foreach temporaries included), OTH (tensors given to
    `track_external`: here the input_ids).
    """

    model_config = ConfigDict(extra="forbid")

    parameters: int = Field(ge=0)
    gradients: int = Field(ge=0)
    optimizer_states: int = Field(ge=0)
    activations: int = Field(ge=0)
    temporaries: int = Field(ge=0)
    inputs: int = Field(ge=0)
    buffers: int = Field(ge=0)

    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer_states + self.activations
                + self.temporaries + self.inputs + self.buffers)


class Env(BaseModel):
    """Software and device the run used."""

    model_config = ConfigDict(extra="forbid")

    python: str
    torch: str
    transformers: str
    peft: str | None = Field(None, description="None when peft is not installed")
    device_name: str = Field(description="GPU name, or the CPU model for cpu / fake runs")
    driver: str | None = Field(None, description="NVIDIA driver version (cuda only)")
    cuda: str | None = Field(None, description="CUDA runtime torch was built with (cuda only)")


class Sharding(BaseModel):
    """Multi-rank runs (engine fsdp2): FSDP2 fully_shard per decoder layer and on the root."""

    model_config = ConfigDict(extra="forbid")

    world_size: int = Field(ge=2)
    zero_stage: Literal[2, 3] = Field(description="the ZeRO stage this run is the analogue of")
    reshard_after_forward: bool = Field(description="True ~ ZeRO-3; False keeps params gathered until backward")
    process_group: Literal["fake", "gloo", "nccl"]
    rank: int = Field(0, ge=0, description="the rank whose memory this record reports")


class MeasurementRecord(BaseModel):
    """What one run of the reference workload kept alive, and when."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str | None = Field(None, description="suite entry name (measure/suite.py), if any")
    scenario: Scenario = Field(description="the validated scenario that was run")
    device: Device
    engine: Engine = "torch-single"
    sharding: Sharding | None = None
    env: Env
    peak_allocated_bytes: int = Field(
        ge=0, description="cuda: torch.cuda.max_memory_allocated(); cpu/fake: MemTracker's peak of live tensor bytes"
    )
    peak_reserved_bytes: int | None = Field(None, ge=0, description="cuda: max_memory_reserved()")
    device_used_bytes: int | None = Field(None, ge=0, description="cuda: mem_get_info() total - free at the end")
    num_alloc_retries: int | None = Field(None, ge=0, description="cuda: memory_stats()['num_alloc_retries']")
    peak_phase: Phase = Field(description="the phase whose peak is peak_allocated_bytes")
    phase_peaks_bytes: PhasePeaks
    step_phase_peaks_bytes: list[PhasePeaks] = Field(description="per optimizer step, in order")
    categories_at_peak_bytes: Categories | None = Field(None, description="cpu / fake only")
    raw_categories_at_peak_bytes: dict[str, int] | None = Field(
        None, description="cpu / fake: the same bytes under MemTracker's (or FSDPMemTracker's) own names"
    )
    weights_bytes: int = Field(ge=0, description="model parameters and buffers on the device before step 1")
    initial_allocated_bytes: int = Field(
        ge=0, description="everything live before step 1: weights, input_ids, fp32 master copies"
    )
    optimizer_state_bytes: int | None = Field(None, ge=0, description="optimizer.state tensors after the last step")
    num_params: int = Field(ge=0, description="sum(p.numel()) of the model (the full model for sharded runs)")
    trainable_params: int = Field(ge=0)
    steps: int = Field(ge=1, description="optimizer steps (or inference forwards) measured")
    extrapolated_from_layers: list[int] | None = Field(
        None, description="fake runs: the layer counts measured; the record is their linear extrapolation"
    )
    notes: list[str] = Field(default_factory=list)
    measured_at: AwareDatetime
    wall_seconds: float = Field(ge=0)

    def to_json_line(self) -> str:
        return self.model_dump_json(exclude_none=False)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(record)"
        parts.append(f"field {loc}: {err['msg']}")
    return "; ".join(parts)


def parse_record(text: str, where: str = "record") -> MeasurementRecord:
    """One JSON record -> MeasurementRecord, or RecordError naming `where` and the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    try:
        return MeasurementRecord.model_validate(data)
    except ValidationError as exc:
        raise RecordError(f"{where}: {_describe(exc)}") from None


def load_records(path: str | Path) -> list[MeasurementRecord]:
    """All records of a JSON-lines file (blank lines skipped); RecordError names the line and field."""
    path = Path(path)
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            records.append(parse_record(line, where=f"{path}:{lineno}"))
    return records


def utc_now() -> datetime:
    from datetime import timezone

    return datetime.now(timezone.utc)

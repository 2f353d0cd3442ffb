"""One measured run: the JSON record `python -m measure` prints and data/*.jsonl stores, one per line.

The schema lives with its main reader (calc.evidence.validate and the app's Validation page); the measurement
scripts in measure/ import it from here. No torch here, so the app and the calculator's tests can read the committed data without it.
All sizes are bytes (int). Field names carry their unit.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from calc.contract.boundary import JsonSyntaxError, parse_json, read_text, validate
from calc.contract.errors import UserError
from calc.contract.limits import (
    MAX_JSON_BYTES,
    MAX_RECORD_BYTES,
    MAX_RECORD_PARAMS,
    MAX_RECORD_SECONDS,
    MAX_RECORD_STEPS,
    MAX_RECORDS_FILE_BYTES,
)
from calc.contract.scenario import Scenario

SCHEMA_VERSION = 1

Device = Literal["cuda", "cpu", "fake"]
Engine = Literal["torch-single", "fsdp2", "deepspeed"]
Phase = Literal["forward", "backward", "optimizer"]


class RecordError(UserError):
    """A record file or line is malformed; the message names the line and the field."""


class PhasePeaks(BaseModel):
    """Peak live bytes inside each phase of the step (null where the phase does not run, e.g. inference).

    forward: the model call including the loss; backward: loss.backward();
    optimizer: everything after backward (fp32 master-grad copies, step, copy-back, zero_grad).
    Each phase's peak includes what was already live when the phase began.
    """

    model_config = ConfigDict(extra="forbid")

    forward: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES)
    backward: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES)
    optimizer: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES)


class Categories(BaseModel):
    """Live bytes per kind at the peak, from torch's MemTracker (cpu / fake only).

    MemTracker's names: PARAM, BUFFER, GRAD, ACT, TEMP (created during backward: activation gradients,
    recomputation outside a module), OPT (optimizer states and the fp32 master weights, and everything
    allocated inside optimizer.step(), its foreach temporaries included), OTH (tensors given to
    `track_external`: here the input_ids).
    """

    model_config = ConfigDict(extra="forbid")

    parameters: int = Field(ge=0, le=MAX_RECORD_BYTES)
    gradients: int = Field(ge=0, le=MAX_RECORD_BYTES)
    optimizer_states: int = Field(ge=0, le=MAX_RECORD_BYTES)
    activations: int = Field(ge=0, le=MAX_RECORD_BYTES)
    temporaries: int = Field(ge=0, le=MAX_RECORD_BYTES)
    inputs: int = Field(ge=0, le=MAX_RECORD_BYTES)
    buffers: int = Field(ge=0, le=MAX_RECORD_BYTES)

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
    """Multi-rank runs: engine fsdp2 (FSDP2 fully_shard per decoder layer and on the root, world size >= 2,
    the ZeRO-2/3 analogues) or engine deepspeed (DeepSpeed ZeRO 0-3 itself, world size >= 1)."""

    model_config = ConfigDict(extra="forbid")

    world_size: int = Field(ge=1, le=2**20)
    zero_stage: Literal[0, 1, 2, 3] = Field(description="the ZeRO stage (fsdp2: the one this run is the analogue of)")
    reshard_after_forward: bool | None = Field(
        None, description="fsdp2: True ~ ZeRO-3; False keeps params gathered until backward")
    process_group: Literal["fake", "gloo", "nccl"]
    rank: int = Field(0, ge=0, le=2**20, description="the rank whose memory this record reports")


class MeasurementRecord(BaseModel):
    """What one run of the reference workload kept alive, and when."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str | None = Field(None, max_length=200, description="suite entry name (measure/suite.py), if any")
    scenario: Scenario = Field(description="the validated scenario that was run")
    device: Device
    engine: Engine = "torch-single"
    sharding: Sharding | None = None
    env: Env
    peak_allocated_bytes: int = Field(  # > 0: every error is relative to it
        gt=0, le=MAX_RECORD_BYTES, description="cuda: torch.cuda.max_memory_allocated(); cpu/fake: MemTracker's peak of live tensor bytes"
    )
    peak_reserved_bytes: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES, description="cuda: max_memory_reserved()")
    device_used_bytes: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES, description="cuda: mem_get_info() total - free at the end")
    num_alloc_retries: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES, description="cuda: memory_stats()['num_alloc_retries']")
    peak_phase: Phase = Field(description="the phase whose peak is peak_allocated_bytes")
    phase_peaks_bytes: PhasePeaks
    step_phase_peaks_bytes: list[PhasePeaks] = Field(description="per optimizer step, in order")
    categories_at_peak_bytes: Categories | None = Field(None, description="cpu / fake only")
    raw_categories_at_peak_bytes: dict[str, Annotated[int, Field(ge=0, le=MAX_RECORD_BYTES)]] | None = Field(
        None, description="cpu / fake: the same bytes under MemTracker's (or FSDPMemTracker's) own names"
    )
    weights_bytes: int = Field(ge=0, le=MAX_RECORD_BYTES, description="model parameters and buffers on the device before step 1")
    initial_allocated_bytes: int = Field(
        ge=0, le=MAX_RECORD_BYTES, description="everything live before step 1: weights, input_ids, fp32 master copies"
    )
    optimizer_state_bytes: int | None = Field(None, ge=0, le=MAX_RECORD_BYTES, description="optimizer.state tensors after the last step")
    baseline_allocated_bytes: int | None = Field(
        None, ge=0, le=MAX_RECORD_BYTES,
        description="cuda: allocated before the model was built (the warm-up GEMMs' cuBLAS workspaces); inside every "
                    "other figure of the record",
    )
    num_params: int = Field(ge=0, le=MAX_RECORD_PARAMS, description="sum(p.numel()) of the model (the full model for sharded runs)")
    trainable_params: int = Field(ge=0, le=MAX_RECORD_PARAMS)
    steps: int = Field(ge=1, le=MAX_RECORD_STEPS, description="optimizer steps (or inference forwards) measured")
    extrapolated_from_layers: list[Annotated[int, Field(ge=1, le=2**20)]] | None = Field(
        None, description="fake runs: the layer counts measured; the record is their linear extrapolation"
    )
    notes: list[str] = Field(default_factory=list)
    measured_at: AwareDatetime
    wall_seconds: float = Field(ge=0, le=MAX_RECORD_SECONDS)

    def to_json_line(self) -> str:
        return self.model_dump_json(exclude_none=False)

    def run_scenario(self) -> Scenario:
        """The scenario as it ran: the reference loop (engine torch-single) is plain PyTorch, whatever the
        record's sharding field says (it keeps the default, which names DeepSpeed); calc.evidence.validate and
        calc.evidence.calibrate estimate this."""
        sc = self.scenario
        if self.engine != "torch-single" or sc.training.zero_stage != 0 or sc.training.sharding == "torch":
            return sc
        return sc.model_copy(update={"training": sc.training.model_copy(update={"sharding": "torch"})})


def parse_record(text: str, where: str = "record") -> MeasurementRecord:
    """One JSON record -> MeasurementRecord, or RecordError naming `where` and the field. Parsed by
    calc.contract.boundary (bounded size and depth, finite numbers) and validated strictly."""
    try:
        return validate(MeasurementRecord, parse_json(text, where), where)
    except UserError as exc:
        raise RecordError(str(exc)) from None


def parse_records(text: str, where: str = "records") -> list[MeasurementRecord]:
    """One record (pretty-printed or not), a JSON list of records, or JSON lines; RecordError names
    the line (or list item) and the field. What the app's uploader and `calc calibrate` read."""
    try:
        whole = parse_json(text, where, max_bytes=MAX_RECORDS_FILE_BYTES)
    except JsonSyntaxError:  # JSON lines (or broken JSON: the line that breaks is named)
        return _parse_lines(text, where)
    except UserError as exc:
        raise RecordError(str(exc)) from None
    items = whole if isinstance(whole, list) else [whole]
    if not items:
        raise RecordError(f"{where}: an empty list (expected a record or a list of records)")
    many = len(items) > 1
    out = []
    for i, item in enumerate(items, start=1):
        at = f"{where}, item {i}" if many else where
        try:
            out.append(validate(MeasurementRecord, item, at))
        except UserError as exc:
            raise RecordError(str(exc)) from None
    return out


def _parse_lines(text: str, where: str) -> list[MeasurementRecord]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [parse_record(line, where=f"{where}:{n}") for n, line in lines]


def load_records(path: str | Path) -> list[MeasurementRecord]:
    """All records of a JSON-lines file (blank lines skipped); RecordError names the line and field
    (and the file when it cannot be read or is not UTF-8)."""
    try:
        text = read_text(path, MAX_RECORDS_FILE_BYTES)
    except UserError as exc:
        raise RecordError(str(exc)) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [parse_record(line[: MAX_JSON_BYTES + 1], where=f"{path}:{n}") for n, line in lines]


def utc_now() -> datetime:
    from datetime import timezone

    return datetime.now(timezone.utc)

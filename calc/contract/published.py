"""Published GPU peak-memory figures (data/published_gpu.yaml): what torchtune, LitGPT, torchtitan and Qwen report
for real CUDA runs, each with the configuration its source states and the calc scenario of that configuration.

The scenario is kept as raw JSON: a configuration whose mechanisms this version does not model yet (torchtune's
recipes, compile, paged optimizers, generation, ...) is still stored whole, and `scenario_or_reason` tells a valid
Scenario from the reason it is not yet estimable. The schema is strict and bounded like calc.contract.record:
the file is size-bounded, YAML aliases are refused (no expansion bombs), every value must be a JSON value (no
dates, no NaN or infinities, integers within int64), and unknown keys are errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from calc.contract.boundary import parse_json, read_text, validate
from calc.contract.errors import UserError
from calc.contract.limits import MAX_JSON_BYTES
from calc.contract.scenario import Framework, Scenario
from calc.contract.units import GB, GiB, MiB

PUBLISHED_PATH = Path(__file__).resolve().parents[2] / "data" / "published_gpu.yaml"
MAX_PUBLISHED_FILE_BYTES = 2**20  # ~120 entries of ~1.5 KiB; 5x that
MAX_PUBLISHED_ENTRIES = 1000  # the sources hold about a hundred figures
MAX_FIGURE = 1e7  # no GPU holds 10^7 of any unit used here (GiB: 10 PiB)
COMMIT = r"^[0-9a-f]{7,40}$"
ENTRY_ID = r"^[a-z0-9][a-z0-9.+-]{0,119}$"

Text = Annotated[str, StringConstraints(min_length=1, max_length=500)]
Unit = Literal["GB", "GiB", "MB", "MiB"]
UNIT_BYTES: dict[str, int] = {"GB": GB, "GiB": GiB, "MB": GB // 1000, "MiB": MiB}
Split = Literal["development", "held-out"]
# What the source's figure is, and which of the engine's answers predicts it (calc.evidence.published):
#   peak_allocated  torch.cuda.max_memory_allocated()               -> Estimate.peak_allocated_bytes
#   peak_active     memory_stats()["active_bytes.all.peak"]          -> Estimate.peak_allocated_bytes (a block is
#                   active from malloc to free, so active and allocated peak together)
#   peak_reserved   torch.cuda.max_memory_reserved()                 -> peak allocated + the allocator's reserve
#   sum_peak_allocated  max_memory_allocated summed over the GPUs    -> peak_allocated_bytes x num_gpus
#   device_used     nvidia-smi's used memory (or mem_get_info)         -> Estimate.device_total_bytes.expected
Metric = Literal["peak_allocated", "peak_active", "peak_reserved", "sum_peak_allocated", "device_used"]
Method = Literal["full", "lora", "qlora", "adapter", "adapter-v2", "inference"]


class PublishedError(UserError):
    """The published-figures file is malformed; the message names the entry and the field."""


class Source(BaseModel):
    """Where the figure is printed: a page, or a file of a repository at a commit."""

    model_config = ConfigDict(extra="forbid")

    url: Annotated[str, StringConstraints(pattern=r"^https://[^\s]{1,490}$")]
    repo: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")] | None = None
    file: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]{1,300}$")] | None = None
    commit: Annotated[str, StringConstraints(pattern=COMMIT)] | None = Field(
        None, description="the repository commit whose file holds the figure")
    where: Text = Field(description="the table or passage, as the source titles it")
    row: Text = Field(description="the figure's row or sentence, as printed")


class Setup(BaseModel):
    """The configuration in the source's own words (None: the source does not say)."""

    model_config = ConfigDict(extra="forbid")

    model: Text
    gpu: Text
    num_gpus: int = Field(ge=1, le=65536)
    framework: Framework
    version: Text = Field(description="the framework's version or commit, and the libraries the source names")
    method: Method
    lora: Text | None = Field(None, description="rank, alpha, dropout and the modules with adapters")
    quantization: Text | None = None
    precision: Text
    micro_batch_size: int | None = Field(None, ge=1, le=65536)
    seq_len: int | None = Field(None, ge=1, le=4_194_304, description="tokens per sequence (the longest one)")
    new_tokens: int | None = Field(None, ge=0, le=4_194_304, description="inference: tokens generated")
    activation_checkpointing: Text | None = None
    compile: bool | None = None
    optimizer: Text | None = None
    loss: Text | None = None
    parallelism: Text | None = None
    trainable_params: int | None = Field(None, ge=0, le=2**50, description="as the source prints it")


class PublishedEntry(BaseModel):
    """One published figure, the configuration it was measured in, and the scenario of that configuration."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, StringConstraints(pattern=ENTRY_ID)]
    split: Split = Field(description="development: torchtune's README and docs; held-out: every other source")
    source: Source
    setup: Setup
    metric: Metric
    metric_stated: bool = Field(description="false: the source does not name the metric; `metric` is the "
                                "framework's own logged figure (see notes)")
    figure: float = Field(gt=0, le=MAX_FIGURE, allow_inf_nan=False)
    unit: Unit
    complete: bool = Field(description="false: the source leaves part of the configuration unstated; kept, "
                           "and left out of the accuracy figures")
    incomplete_because: Text | None = None
    not_in_contract: tuple[Text, ...] = Field(
        (), max_length=16, description="what the configuration does that no scenario field can say (float8, "
        "context parallelism, FSDP CPU offload, ...): such an entry is not estimable")
    scenario: dict[str, Any] = Field(description="the calc scenario of the configuration, as raw JSON (validated "
                                     "by scenario_or_reason)")
    notes: tuple[Text, ...] = Field((), max_length=16)

    @model_validator(mode="after")
    def _reason_when_incomplete(self) -> PublishedEntry:
        if self.complete == (self.incomplete_because is not None):
            raise ValueError("incomplete_because is given exactly when complete is false")
        return self

    @property
    def figure_bytes(self) -> int:
        return round(self.figure * UNIT_BYTES[self.unit])


class PublishedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    entries: list[PublishedEntry] = Field(min_length=1, max_length=MAX_PUBLISHED_ENTRIES)

    @model_validator(mode="after")
    def _unique_ids(self) -> PublishedFile:
        seen: set[str] = set()
        for e in self.entries:
            if e.id in seen:
                raise ValueError(f"entry id {e.id!r} appears twice")
            seen.add(e.id)
        return self


def scenario_or_reason(entry: PublishedEntry) -> Scenario | str:
    """The entry's Scenario, or why it is not yet estimable: what no field can express, or the contract's own
    refusal (a value `_UNMODELLED` lists, an unsupported model)."""
    if entry.not_in_contract:
        return "not expressible as a scenario: " + "; ".join(entry.not_in_contract)
    if len(json.dumps(entry.scenario)) > MAX_JSON_BYTES:
        return "scenario larger than a scenario may be"
    try:
        return validate(Scenario, entry.scenario, f"{entry.id}: scenario")
    except UserError as exc:
        return str(exc).removeprefix(f"{entry.id}: scenario: ")


def parse_published(text: str, where: str = "published") -> PublishedFile:
    """The YAML text -> PublishedFile, or PublishedError naming `where`, the entry and the field."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PUBLISHED_FILE_BYTES:
        raise PublishedError(f"{where}: larger than {MAX_PUBLISHED_FILE_BYTES // 2**10} KiB")
    data = _yaml_values(text, where)
    try:
        as_json = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a YAML date, a set, .nan, .inf
        raise PublishedError(f"{where}: not a JSON value ({_first_line(exc)})") from None
    try:
        return validate(PublishedFile, parse_json(as_json, where, max_bytes=4 * MAX_PUBLISHED_FILE_BYTES),
                        _entry_where(where, data))
    except UserError as exc:
        raise PublishedError(str(exc)) from None


def load_published(path: str | Path = PUBLISHED_PATH) -> PublishedFile:
    try:
        text = read_text(path, MAX_PUBLISHED_FILE_BYTES)
    except UserError as exc:
        raise PublishedError(str(exc)) from None
    return parse_published(text, str(path))


def _yaml_values(text: str, where: str) -> Any:
    """yaml.safe_load, refusing aliases first: an alias is a reference, and turning a few of them into JSON
    expands them exponentially."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise PublishedError(f"{where}: YAML aliases (*name) are not accepted")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PublishedError(f"{where}: not valid YAML ({_first_line(exc)})") from None
    except RecursionError:
        raise PublishedError(f"{where}: nested too deeply") from None


def _entry_where(where: str, data: Any) -> str:
    return where if isinstance(data, dict) else f"{where} (expected a mapping with schema_version and entries)"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


"""Predicted vs published: the engine against the peak-memory figures torchtune, LitGPT, torchtitan and Qwen
print for real CUDA runs (data/published_gpu.yaml, calc.contract.published), behind
`python -m calc validate --published` and docs/published_gpu.md.

Each entry is predicted in the metric its source reports: torch.cuda.max_memory_allocated() (and the caching
allocator's active bytes, which peak with it) by the estimate's peak allocated bytes; max_memory_reserved() by
that peak plus the allocator's expected reserve (calc.memory.overhead.device_total); nvidia-smi's used memory by
the expected device total (context, NCCL buffers and reserve added); a sum over GPUs by the peak times the GPU
count. An entry whose scenario this version refuses is reported as not yet estimable, with the
contract's reason; an entry whose configuration the source leaves unstated is predicted when it can be but
stays out of the accuracy figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from calc.contract.published import PublishedEntry, PublishedFile, scenario_or_reason
from calc.contract.scenario import FRAMEWORKS, Scenario
from calc.memory.engine import estimate
from calc.memory.result import Estimate

WITHIN_PCT = 10.0  # the report counts the entries predicted within this |error|
SPLITS = ("development", "held-out")


class PublishedCase(BaseModel):
    """One published figure and the engine's prediction of it (None: not yet estimable)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    split: str
    framework: str
    model: str
    gpu: str
    method: str
    metric: str
    complete: bool
    published_bytes: int
    predicted_bytes: int | None
    stated_trainable_params: int | None = None  # where the source prints it: a check of the adapters' count
    predicted_trainable_params: int | None = None
    error_pct: float | None
    not_estimable: str | None

    @property
    def counted(self) -> bool:
        """In the accuracy figures: the configuration is fully stated and the engine estimates it."""
        return self.complete and self.error_pct is not None


class FrameworkStats(BaseModel):
    """Per framework and split (or "all"): how many figures, how many are counted, and their errors."""

    model_config = ConfigDict(extra="forbid")

    framework: str
    split: str
    entries: int
    incomplete: int
    not_estimable: int
    counted: int
    median_abs_error_pct: float | None
    worst_abs_error_pct: float | None
    within_10_pct: int


class PublishedReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cases: list[PublishedCase]
    frameworks: list[FrameworkStats]


def predicted_bytes(entry: PublishedEntry, sc: Scenario, est: Estimate) -> int:
    """The estimate in the entry's metric (calc.contract.published.Metric says what each one is)."""
    peak = est.peak_allocated_bytes
    if entry.metric == "peak_reserved":
        return peak + est.device_total_bytes.reserve_expected_bytes
    if entry.metric == "sum_peak_allocated":
        return peak * sc.resolved_hardware().num_gpus
    if entry.metric == "device_used":
        return est.device_total_bytes.expected
    return peak  # peak_allocated, peak_active


def compare(entry: PublishedEntry) -> PublishedCase:
    got = scenario_or_reason(entry)
    published = entry.figure_bytes
    predicted = error = reason = trainable = None
    if isinstance(got, str):
        reason = got
    else:
        est = estimate(got, target="cuda")
        predicted = predicted_bytes(entry, got, est)
        error = round(100.0 * (predicted - published) / published, 3)
        trainable = est.model.trainable_params
    s = entry.setup
    return PublishedCase(id=entry.id, split=entry.split, framework=s.framework, model=s.model, gpu=s.gpu,
                         method=s.method, metric=entry.metric, complete=entry.complete, published_bytes=published,
                         predicted_bytes=predicted, error_pct=error, not_estimable=reason,
                         stated_trainable_params=s.trainable_params, predicted_trainable_params=trainable)


def stats(framework: str, split: str, cases: Iterable[PublishedCase]) -> FrameworkStats:
    cases = list(cases)
    errs = [abs(c.error_pct) for c in cases if c.counted and c.error_pct is not None]
    return FrameworkStats(
        framework=framework, split=split, entries=len(cases), incomplete=sum(not c.complete for c in cases),
        not_estimable=sum(c.not_estimable is not None for c in cases), counted=len(errs),
        median_abs_error_pct=statistics.median(errs) if errs else None,
        worst_abs_error_pct=max(errs) if errs else None, within_10_pct=sum(e <= WITHIN_PCT for e in errs))


def report(published: PublishedFile) -> PublishedReport:
    """Every entry compared, then per framework (in FRAMEWORKS' order) its splits and the whole."""
    cases = [compare(e) for e in published.entries]
    rows = []
    for fw in FRAMEWORKS:
        mine = [c for c in cases if c.framework == fw]
        if not mine:
            continue
        for split in SPLITS:
            part = [c for c in mine if c.split == split]
            if part and len(part) < len(mine):
                rows.append(stats(fw, split, part))
        rows.append(stats(fw, "all", mine))
    for split in SPLITS:
        rows.append(stats("all", split, (c for c in cases if c.split == split)))
    rows.append(stats("all", "all", cases))
    return PublishedReport(cases=cases, frameworks=rows)

"""Calibration from the user's own run: measure one configuration on a machine, then predict every
other configuration on the same machine with what that run revealed.

What a calculator cannot know in advance, and a CUDA record (`python -m measure ... --device cuda`)
measures, are three named corrections:

- `reserve_ratio` = peak_reserved / peak_allocated: the caching allocator's reserve on this job
  (segment rounding, fragmentation). Applied as device reserved = peak allocated x ratio.
- `outside_bytes` = device_used - peak_reserved: bytes the allocator does not own (the CUDA context
  and loaded kernels, NCCL buffers, other processes on the GPU). Applied as a constant.
- `residual`: measured - predicted peak allocated (tensors the user's framework keeps beyond the
  reference loop, custom kernels' workspaces), fitted as bytes per token or bytes per parameter,
  whichever leaves the smaller residual; only when at least two records vary tokens and parameters
  differently, since one record (or records that scale both alike) cannot tell which it is.

Each correction carries a one-sigma uncertainty; a calibrated device total is expected ± COVERAGE_K
sigma. The corrections never hide a modelling error: a record whose peak allocated the engine misses
by more than its stated accuracy is listed (with the error) wherever the calibration is applied.

Pure Python + pydantic; bytes (int) inside. Measurement records are read through `_read_record` only
(the one place that knows the record schema's module).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from calc.contract.boundary import JsonSyntaxError, parse_json, read_text, validate
from calc.contract.errors import UserError
from calc.contract.i18n import T_, Text
from calc.contract.scenario import Scenario
from calc.contract.units import MiB
from calc.memory.overhead import NCCL_BYTES
from calc.memory.result import Estimate
from calc.memory.verdict import Verdict, make_verdict

SCHEMA_VERSION = 1

# The engine's stated accuracy on peak allocated (README, "Accuracy": worst |error| 2.4 % over the
# committed CPU/fake runs), with a margin for the CUDA-only terms no GPU run has confirmed yet
# (workspaces, block rounding). A record further off than this is a modelling error to report.
ENGINE_ACCURACY_PCT = 4.0

# Input bounds: no GPU has 4 TiB of memory; a record is a few KiB; a calibration is a few records.
MAX_DEVICE_BYTES = 2**42
MAX_RECORD_FILE_BYTES = 2**20
MAX_RECORDS = 64
MAX_NAME_CHARS = 200

# Uncertainties where the records cannot measure a spread (assumptions, said so in the output):
# the allocator's reserve moves by a few percent of the peak between jobs with different tensor
# sizes, and the context grows by the kernels a different job lazily loads (tens of MiB).
SINGLE_RECORD_RATIO_SIGMA = 0.02
SINGLE_RECORD_OUTSIDE_SIGMA_BYTES = 64 * MiB
MIN_RATIO_SIGMA = 0.005
MIN_OUTSIDE_SIGMA_BYTES = 16 * MiB
COVERAGE_K = 2.0  # the calibrated range is expected ± 2 sigma

# Records tell "per token" from "per parameter" only if their tokens/parameters ratios differ.
MIN_FEATURE_SPREAD = 1.05

Bytes = Annotated[StrictInt, Field(gt=0, le=MAX_DEVICE_BYTES)]
Finite = Annotated[StrictFloat | StrictInt, Field(allow_inf_nan=False)]
Name = Annotated[StrictStr, Field(max_length=MAX_NAME_CHARS)]


class CalibrationError(UserError):
    """A record or calibration that cannot be used: one line naming where and why."""


class _CalibrationSyntaxError(CalibrationError):
    """Not one JSON document (observations_from_text then reads JSON lines)."""


# ---- what one run measured ------------------------------------------------------------------

class Observation(BaseModel):
    """One run's three numbers and its scenario: from a record, or typed in for the current scenario."""

    model_config = ConfigDict(extra="forbid")

    name: Name = "your run"
    scenario: Scenario
    device: Literal["cuda", "cpu", "fake"] = "cuda"
    engine: Literal["torch-single", "fsdp2"] = "torch-single"
    device_name: Name | None = Field(None, description="torch.cuda.get_device_name(), when the record has it")
    peak_allocated_bytes: Bytes = Field(description="torch.cuda.max_memory_allocated()")
    peak_reserved_bytes: Bytes = Field(description="torch.cuda.max_memory_reserved()")
    device_used_bytes: Bytes = Field(description="nvidia-smi 'used' (or mem_get_info total - free)")

    @model_validator(mode="after")
    def _ordered(self) -> Observation:
        if self.peak_reserved_bytes < self.peak_allocated_bytes:
            raise CalibrationError(T_("reserved ({reserved} B) is below allocated ({allocated} B): the allocator "
                                      "reserves at least what it hands out", reserved=f"{self.peak_reserved_bytes:,}",
                                      allocated=f"{self.peak_allocated_bytes:,}"))
        if self.device_used_bytes < self.peak_reserved_bytes:
            raise CalibrationError(T_("device used ({used} B) is below reserved ({reserved} B): take nvidia-smi's "
                                      "reading while the job runs", used=f"{self.device_used_bytes:,}",
                                      reserved=f"{self.peak_reserved_bytes:,}"))
        return self

    @property
    def gpu(self) -> str | None:
        return self.scenario.resolved_hardware().gpu


class Point(BaseModel):
    """One observation next to the engine's prediction for its scenario."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    predicted_allocated_bytes: Annotated[StrictInt, Field(ge=1, le=2**62)]
    measured_allocated_bytes: Bytes
    error_pct: Finite = Field(description="(predicted - measured) / measured, %")
    reserve_ratio: Finite
    outside_bytes: Annotated[StrictInt, Field(ge=0, le=MAX_DEVICE_BYTES)]
    tokens: Annotated[StrictInt, Field(gt=0)]
    params: Annotated[StrictInt, Field(gt=0)]
    num_gpus: Annotated[StrictInt, Field(ge=1, le=65536)]


# ---- the calibration file -------------------------------------------------------------------

class Correction(BaseModel):
    """A fitted number and its one-sigma uncertainty."""

    model_config = ConfigDict(extra="forbid")

    value: Finite
    sigma: Annotated[Finite, Field(ge=0)]
    measured_spread: StrictBool = Field(description="sigma from the records' spread (else an assumption)")


class Residual(BaseModel):
    """Measured - predicted peak allocated, in bytes per token (micro-batch x sequence) or per
    parameter on this GPU."""

    model_config = ConfigDict(extra="forbid")

    scales_with: Literal["tokens", "parameters"]
    bytes_per_unit: Annotated[Finite, Field(ge=-1e6, le=1e6)]
    sigma: Annotated[Finite, Field(ge=0, le=1e6)]
    rms_tokens_bytes: Annotated[Finite, Field(ge=0)] = Field(description="what per-token leaves unexplained")
    rms_parameters_bytes: Annotated[Finite, Field(ge=0)] = Field(description="what per-parameter leaves")

    def bytes_for(self, tokens: int, params: int) -> tuple[float, float]:
        x = tokens if self.scales_with == "tokens" else params
        return self.bytes_per_unit * x, self.sigma * x


class Disagreement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    error_pct: Finite


class Calibration(BaseModel):
    """What `python -m calc calibrate` writes and `estimate --calibration` reads."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    gpu: Annotated[StrictStr, Field(max_length=64, pattern=r"^[a-z0-9][a-z0-9.-]*$")] | None = Field(
        None, description="GPU preset id of the records")
    device_name: Name | None = Field(None, description="the GPU's name as torch reports it")
    records: Annotated[StrictInt, Field(ge=1, le=MAX_RECORDS)]
    reserve_ratio: Correction
    outside_bytes: Correction
    outside_includes_nccl: StrictBool = Field(description="a multi-GPU record: NCCL's buffers are inside")
    residual: Residual | None = None
    residual_spread_pct: Annotated[Finite, Field(ge=0, le=1000)] = Field(
        0.0, description="without a fitted residual: the records' largest |error|, kept as an uncertainty")
    disagreements: Annotated[list[Disagreement], Field(max_length=MAX_RECORDS)] = Field(default_factory=list)
    points: Annotated[list[Point], Field(max_length=MAX_RECORDS)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _bounded(self) -> Calibration:
        if not 1.0 <= self.reserve_ratio.value <= 4.0 or self.reserve_ratio.sigma > 1.0:
            raise ValueError("reserve_ratio: reserved / allocated must be within 1 to 4 (sigma at most 1)")
        if not 0 <= self.outside_bytes.value <= MAX_DEVICE_BYTES or self.outside_bytes.sigma > MAX_DEVICE_BYTES:
            raise ValueError(f"outside_bytes: must be within 0 to {MAX_DEVICE_BYTES:,} bytes")
        return self

    def machine(self) -> str:
        """'a100-80gb (NVIDIA A100-SXM4-80GB)' / 'an unnamed GPU'."""
        if self.gpu and self.device_name:
            return f"{self.gpu} ({self.device_name})"
        return self.gpu or self.device_name or "an unnamed GPU"

    def findings(self) -> list[str]:
        """What the records determined and what they could not, in plain words."""
        return [str(t) for t in self.finding_texts()]

    def finding_texts(self) -> list[Text]:
        """`findings` as translatable sentences (calc.contract.i18n)."""
        n = self.records
        machine = self.machine()
        out = [T_("{n} records from {machine}.", n=n, machine=machine) if n > 1 else
               T_("{n} record from {machine}.", n=n, machine=machine)]
        if n == 1:
            out.append(T_("One record fixes the reserve ratio and the bytes outside the allocator, but not their "
                          "spread between jobs: their uncertainties are assumptions (±{ratio} of the peak, "
                          "±{outside} MiB).", ratio=f"{SINGLE_RECORD_RATIO_SIGMA:.0%}",
                          outside=SINGLE_RECORD_OUTSIDE_SIGMA_BYTES // MiB))
        spread = f"{self.residual_spread_pct:.2f}"
        if self.residual is None and n == 1:
            out.append(T_("Peak allocated is not corrected: one record cannot tell whether it scales with tokens or "
                          "with parameters. The engine's largest miss on these records ({spread} %) is kept as an "
                          "uncertainty instead.", spread=spread))
        elif self.residual is None:
            out.append(T_("Peak allocated is not corrected: these records change tokens and parameters in the same "
                          "proportion, so they cannot tell which it scales with (vary micro-batch or sequence length "
                          "between records). The engine's largest miss on these records ({spread} %) is kept as an "
                          "uncertainty instead.", spread=spread))
        else:
            r = self.residual
            fields = dict(value=f"{r.bytes_per_unit:+,.4g}", sigma=f"{r.sigma:,.2g}",
                          rms_tokens=f"{r.rms_tokens_bytes / MiB:,.2f}", rms_params=f"{r.rms_parameters_bytes / MiB:,.2f}")
            out.append(T_("Peak allocated residual: {value} B per token (±{sigma}); per token leaves {rms_tokens} MiB "
                          "rms unexplained, per parameter {rms_params} MiB.", **fields)
                       if r.scales_with == "tokens" else
                       T_("Peak allocated residual: {value} B per parameter (±{sigma}); per token leaves {rms_tokens} "
                          "MiB rms unexplained, per parameter {rms_params} MiB.", **fields))
        return out


# ---- reading records ------------------------------------------------------------------------

def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "record"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {str(err['msg']).removeprefix('Value error, ')}{more}"


def _loads(text: str, where: str) -> Any:
    """calc.contract.boundary.parse_json (bounded size and depth, finite numbers) with CalibrationError."""
    try:
        return parse_json(text, where, MAX_RECORD_FILE_BYTES)
    except UserError as exc:
        raise (exc if isinstance(exc, CalibrationError) else _syntax_error(exc)) from None


def _syntax_error(exc: UserError) -> CalibrationError:
    return _CalibrationSyntaxError(str(exc)) if isinstance(exc, JsonSyntaxError) else CalibrationError(str(exc))


def _read_record(data: Any, where: str) -> Observation:
    """A measurement record (the schema `python -m measure` writes) -> Observation."""
    from calc.contract.record import MeasurementRecord

    try:  # strict types, like every input (calc.contract.boundary)
        rec = validate(MeasurementRecord, data, where)
    except UserError as exc:
        raise CalibrationError(str(exc)) from None
    if rec.peak_reserved_bytes is None or rec.device_used_bytes is None:
        raise CalibrationError(T_("{where}: no peak_reserved_bytes / device_used_bytes (a {device} record): "
                                  "calibration needs a record from `python -m measure SCENARIO --device cuda`",
                                  where=where, device=rec.device))
    # the three numbers as written (strict: the record schema would turn true into 1 and "7" into 7)
    raw = {k: data[k] for k in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")}
    try:
        return Observation(name=(rec.name or where)[:MAX_NAME_CHARS], scenario=rec.run_scenario(), device=rec.device,
                           engine=rec.engine, device_name=rec.env.device_name[:MAX_NAME_CHARS], **raw)
    except ValidationError as exc:
        raise CalibrationError(f"{where}: {_first_error(exc)}") from None


def observations_from_text(text: str, where: str) -> list[Observation]:
    """One JSON record, or JSON lines (one record per line), as observations."""
    if len(text.encode("utf-8", errors="replace")) > MAX_RECORD_FILE_BYTES:
        raise CalibrationError(T_("{where}: larger than {n} MiB (a record is a few KiB)", where=where,
                                  n=MAX_RECORD_FILE_BYTES // MiB))
    if not text.strip():
        raise CalibrationError(T_("{where}: empty", where=where))
    try:
        docs = [(where, _loads(text, where))]
    except _CalibrationSyntaxError:  # JSON lines, or broken: each line says which
        docs = [(f"{where}:{i}", _loads(line, f"{where}:{i}"))
                for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if len(docs) > MAX_RECORDS:
        raise CalibrationError(T_("{where}: {n} records; at most {most}", where=where, n=len(docs), most=MAX_RECORDS))
    return [_read_record(data, w) for w, data in docs]


def read_observations(paths: list[str]) -> list[Observation]:
    out: list[Observation] = []
    for p in paths:
        path = Path(p)
        try:
            if path.stat().st_size > MAX_RECORD_FILE_BYTES:
                raise CalibrationError(f"{p}: larger than {MAX_RECORD_FILE_BYTES // MiB} MiB (a record is a few KiB)")
            text = read_text(path, MAX_RECORD_FILE_BYTES)  # names the file when it is not UTF-8
        except OSError as exc:
            raise CalibrationError(f"cannot read {p}: {exc.strerror}") from None
        except UserError as exc:
            raise CalibrationError(str(exc)) from None
        out.extend(observations_from_text(text, p))
    if len(out) > MAX_RECORDS:
        raise CalibrationError(f"{len(out)} records; at most {MAX_RECORDS}")
    return out


def load_calibration(text: str, where: str = "calibration") -> Calibration:
    """A calibration file's text -> Calibration; CalibrationError names the field."""
    if len(text) > MAX_RECORD_FILE_BYTES:
        raise CalibrationError(f"{where}: larger than {MAX_RECORD_FILE_BYTES // MiB} MiB")
    data = _loads(text, where)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise CalibrationError(f"{where}: {_first_error(exc)}") from None


# ---- fitting --------------------------------------------------------------------------------

def _predict(obs: Observation) -> Estimate:
    from calc.memory.engine import estimate

    target = "cuda" if obs.device == "cuda" else "cpu"  # cpu / fake runs ran the CPU kernels
    try:
        return estimate(obs.scenario, target=target, sharding="fsdp2" if obs.engine == "fsdp2" else None)
    except ValueError as exc:
        raise CalibrationError(f"{obs.name}: the engine cannot estimate its scenario ({exc})") from None


def tokens_of(sc: Scenario) -> int:
    """Tokens in one micro-batch on one GPU: what activations scale with."""
    return sc.training.micro_batch_size * sc.training.seq_len


def point(obs: Observation) -> Point:
    est = _predict(obs)
    pred, meas = est.peak_allocated_bytes, obs.peak_allocated_bytes
    return Point(name=obs.name, predicted_allocated_bytes=max(pred, 1), measured_allocated_bytes=meas,
                 error_pct=round(100.0 * (pred - meas) / meas, 4),
                 reserve_ratio=obs.peak_reserved_bytes / obs.peak_allocated_bytes,
                 outside_bytes=obs.device_used_bytes - obs.peak_reserved_bytes, tokens=tokens_of(obs.scenario),
                 params=max(est.model.params_on_this_gpu, 1), num_gpus=obs.scenario.resolved_hardware().num_gpus)


def _spread_fit(values: list[float], single_sigma: float, min_sigma: float) -> Correction:
    """Mean and the spread a new job would see (sample stdev x sqrt(1 + 1/n)), or the assumption."""
    n = len(values)
    if n == 1:
        return Correction(value=values[0], sigma=single_sigma, measured_spread=False)
    sigma = statistics.stdev(values) * math.sqrt(1 + 1 / n)
    return Correction(value=statistics.fmean(values), sigma=max(sigma, min_sigma), measured_spread=True)


def _fit_through_origin(x: list[int], d: list[int]) -> tuple[float, float, float]:
    """d = a x by least squares: (a, standard error of a, rms of what is left)."""
    sxx = float(sum(v * v for v in x))
    a = sum(v * r for v, r in zip(x, d, strict=True)) / sxx
    rss = sum((r - a * v) ** 2 for v, r in zip(x, d, strict=True))
    n = len(x)
    return a, math.sqrt(rss / (n - 1) / sxx), math.sqrt(rss / n)


def _distinguishable(points: list[Point]) -> bool:
    ratios = [p.tokens / p.params for p in points]
    return len(points) >= 2 and max(ratios) > MIN_FEATURE_SPREAD * min(ratios)


def fit_residual(points: list[Point]) -> Residual | None:
    """Per token or per parameter, whichever leaves less unexplained; None when the points cannot tell."""
    if not _distinguishable(points):
        return None
    d = [p.measured_allocated_bytes - p.predicted_allocated_bytes for p in points]
    tok = _fit_through_origin([p.tokens for p in points], d)
    par = _fit_through_origin([p.params for p in points], d)
    best, kind = (tok, "tokens") if tok[2] <= par[2] else (par, "parameters")
    return Residual(scales_with=kind, bytes_per_unit=best[0], sigma=best[1], rms_tokens_bytes=tok[2],
                    rms_parameters_bytes=par[2])


def _same_machine(observations: list[Observation]) -> tuple[str | None, str | None]:
    gpus = sorted({o.gpu for o in observations if o.gpu})
    names = sorted({o.device_name for o in observations if o.device_name})
    if len(gpus) > 1 or len(names) > 1:
        raise CalibrationError(T_("the records come from different GPUs ({gpus}): calibrate one machine at a time",
                                  gpus=", ".join(gpus + names)))
    return (gpus[0] if gpus else None), (names[0] if names else None)


def fit(observations: list[Observation]) -> Calibration:
    """The corrections these observations determine (see the module docstring)."""
    if not observations:
        raise CalibrationError(T_("no records to calibrate from"))
    if len(observations) > MAX_RECORDS:
        raise CalibrationError(T_("{n} records; at most {most}", n=len(observations), most=MAX_RECORDS))
    gpu, device_name = _same_machine(observations)
    points = [point(o) for o in observations]
    residual = fit_residual(points)
    return Calibration(
        gpu=gpu, device_name=device_name, records=len(points),
        reserve_ratio=_spread_fit([p.reserve_ratio for p in points], SINGLE_RECORD_RATIO_SIGMA, MIN_RATIO_SIGMA),
        outside_bytes=_spread_fit([float(p.outside_bytes) for p in points], SINGLE_RECORD_OUTSIDE_SIGMA_BYTES,
                                  MIN_OUTSIDE_SIGMA_BYTES),
        outside_includes_nccl=any(p.num_gpus > 1 for p in points), residual=residual,
        residual_spread_pct=0.0 if residual else min(max(abs(p.error_pct) for p in points), 1000.0),
        disagreements=[Disagreement(name=p.name, error_pct=p.error_pct) for p in points
                       if abs(p.error_pct) > ENGINE_ACCURACY_PCT],
        points=points,
    )


# ---- applying -------------------------------------------------------------------------------

class DeviceRange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    low: int
    expected: int
    high: int


class CalibratedEstimate(BaseModel):
    """The engine's prediction for a scenario with a calibration's corrections applied."""

    model_config = ConfigDict(extra="forbid")

    machine: str = Field(description="where the calibration was measured")
    peak_allocated_bytes: int = Field(description="engine prediction + fitted residual (if any)")
    peak_allocated_sigma_bytes: int
    reserved_bytes: int = Field(description="peak allocated x reserve ratio")
    outside_allocator_bytes: int = Field(description="context, NCCL, other processes (measured, + NCCL if added)")
    device_total_bytes: DeviceRange = Field(description=f"expected ± {COVERAGE_K:g} sigma")
    uncalibrated_device_total_bytes: DeviceRange
    gpu_memory_bytes: int | None = None
    fits: bool | None = Field(None, description="verdict.fits")
    headroom_bytes: int | None = Field(None, description="GPU memory - calibrated expected device total")
    verdict: Verdict = Field(description="calc.memory.verdict's verdict with the calibrated device total (host RAM and "
                                         "NVMe limits as the engine's)")
    applied: list[str] = Field(description="each correction applied, with its value and uncertainty")
    not_applied: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="modelling errors the records revealed")
    # the three lists above as translatable sentences (calc.contract.i18n); the JSON keeps the English
    applied_texts: list[Text] = Field(default_factory=list, exclude=True, repr=False)
    not_applied_texts: list[Text] = Field(default_factory=list, exclude=True, repr=False)
    warning_texts: list[Text] = Field(default_factory=list, exclude=True, repr=False)


def check_machine(cal: Calibration, sc: Scenario) -> Text | None:
    """CalibrationError when `sc` runs on a different GPU; a caveat when either names none."""
    gpu = sc.resolved_hardware().gpu
    if cal.gpu and gpu and gpu != cal.gpu:
        raise CalibrationError(T_("this calibration was measured on {machine}, but the scenario runs on {gpu}: a "
                                  "calibration applies only to the machine it was measured on", machine=cal.machine(),
                                  gpu=gpu))
    if not (cal.gpu and gpu):
        return T_("Applied on trust: the calibration ({machine}) or the scenario names no GPU preset, so it cannot "
                  "be checked that both are the same machine.", machine=cal.machine())
    return None


def disagreement_warnings(cal: Calibration) -> list[str]:
    return [str(t) for t in disagreement_texts(cal)]


def disagreement_texts(cal: Calibration) -> list[Text]:
    return [T_("{name}: the engine's peak allocated is off by {error} % (its stated accuracy is ±{accuracy} %). That "
               "is a modelling error or a workload unlike the reference loop, not an overhead: compare the record on "
               "the Validation page (`python -m calc validate RECORD`).", name=d.name, error=f"{d.error_pct:+.2f}",
               accuracy=f"{ENGINE_ACCURACY_PCT:g}")
            for d in cal.disagreements]


def apply(cal: Calibration, est: Estimate, sc: Scenario) -> CalibratedEstimate:
    """`est` (the engine's estimate of `sc`) with `cal`'s corrections; CalibrationError on another GPU."""
    caveat = check_machine(cal, sc)
    ratio, out = cal.reserve_ratio, cal.outside_bytes
    pred = est.peak_allocated_bytes
    applied, not_applied = [], []
    if cal.residual is not None:
        corr, sigma_peak = cal.residual.bytes_for(tokens_of(sc), max(est.model.params_on_this_gpu, 1))
        fields = dict(corr=f"{corr / MiB:+,.1f}", value=f"{cal.residual.bytes_per_unit:+,.4g}",
                      sigma=f"{cal.residual.sigma:,.2g}")
        applied.append(T_("peak allocated residual {corr} MiB ({value} B per token ± {sigma})", **fields)
                       if cal.residual.scales_with == "tokens" else
                       T_("peak allocated residual {corr} MiB ({value} B per parameter ± {sigma})", **fields))
    else:
        corr, sigma_peak = 0.0, pred * cal.residual_spread_pct / 100
        fields = dict(n=cal.records, spread=f"{cal.residual_spread_pct:.2f}")
        not_applied.append(T_("peak allocated residual: not determined by {n} records; kept as ±{spread} %", **fields)
                           if cal.records > 1 else
                           T_("peak allocated residual: not determined by {n} record; kept as ±{spread} %", **fields))
    peak = max(round(pred + corr), 0)
    reserved = peak * ratio.value
    fields = dict(value=f"{ratio.value:.4f}", sigma=f"{ratio.sigma:.4f}")
    applied.append(T_("allocator reserve ratio ×{value} (±{sigma})", **fields) if ratio.measured_spread else
                   T_("allocator reserve ratio ×{value} (±{sigma}, assumed)", **fields))
    fields = dict(value=f"{out.value / MiB:,.0f}", sigma=f"{out.sigma / MiB:,.0f}")
    applied.append(T_("outside the allocator {value} MiB (±{sigma} MiB): CUDA context, NCCL, other processes", **fields)
                   if out.measured_spread else
                   T_("outside the allocator {value} MiB (±{sigma} MiB, assumed): CUDA context, NCCL, other processes",
                      **fields))
    nccl = {"low": 0, "expected": 0, "high": 0}
    if sc.resolved_hardware().num_gpus > 1 and not cal.outside_includes_nccl:
        nccl = dict(NCCL_BYTES)
        not_applied.append(T_("NCCL buffers: the records are single-GPU, so the engine's uncalibrated NCCL range "
                              "({low}-{high} MiB) is added", low=NCCL_BYTES["low"] // MiB,
                              high=NCCL_BYTES["high"] // MiB))
    elif sc.resolved_hardware().num_gpus == 1 and cal.outside_includes_nccl:
        not_applied.append(T_("NCCL buffers: the records are multi-GPU, so their outside bytes include NCCL buffers "
                              "this single-GPU scenario does not have (kept: an overestimate)"))
    sigma = math.sqrt((peak * ratio.sigma) ** 2 + out.sigma ** 2 + (ratio.value * sigma_peak) ** 2)
    expected = round(reserved + out.value + nccl["expected"])
    spread = COVERAGE_K * sigma
    # never below what the allocator must hold (peak allocated at its own low end)
    low = max(round(expected - spread - (nccl["expected"] - nccl["low"])), round(peak - COVERAGE_K * sigma_peak))
    high = round(expected + spread + (nccl["high"] - nccl["expected"]))
    not_applied += [caveat] if caveat else []
    warnings = disagreement_texts(cal)
    udt = est.device_total_bytes
    mem = est.gpu_memory_bytes
    ram, nvme = est.verdict.limit("host_ram"), est.verdict.limit("nvme")
    verdict = make_verdict(expected, mem, ram.needed_bytes if ram else 0, ram.available_bytes if ram else None,
                           nvme.needed_bytes if nvme else 0, nvme.available_bytes if nvme else None)
    return CalibratedEstimate(
        machine=cal.machine(), peak_allocated_bytes=peak, peak_allocated_sigma_bytes=round(sigma_peak),
        reserved_bytes=round(reserved), outside_allocator_bytes=round(out.value + nccl["expected"]),
        device_total_bytes=DeviceRange(low=low, expected=expected, high=high),
        uncalibrated_device_total_bytes=DeviceRange(low=udt.low, expected=udt.expected, high=udt.high),
        gpu_memory_bytes=mem, fits=verdict.fits, headroom_bytes=verdict.gpu_headroom_bytes, verdict=verdict,
        applied=[str(t) for t in applied], not_applied=[str(t) for t in not_applied], applied_texts=applied,
        not_applied_texts=not_applied, warnings=[str(t) for t in warnings], warning_texts=warnings,
    )

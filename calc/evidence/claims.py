"""The source articles' quantitative claims (data/claims.yaml), each checked against the engine.

A claim names the article and section it comes from, quotes the original Chinese, gives the
English gist, the figure claimed, and how to compute the engine's figure for the same setting: a
scenario, a metric read from the engine's answer, and optionally a what-if of that scenario to
compare with (a saving, a ratio). `check` returns the engine's figure in the claim's unit and the
verdict the numbers give; the data file records the verdict it expects, and a test holds the two
equal, so a change in the engine that flips a verdict is seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.i18n import DEFAULT_LANG, N_, Lang, translate
from calc.contract.presets import gpu_presets, load_yaml
from calc.contract.scenario import Scenario
from calc.contract.units import GB, GiB, MiB
from calc.contract.variant import variant
from calc.memo import memoized
from calc.memory.engine import estimate
from calc.memory.per_param import BytesPerParam, bytes_per_param
from calc.recommend.models import usable_bytes
from calc.speed import estimate_speed, hardware_of

CLAIMS_PATH = Path(__file__).resolve().parents[2] / "data" / "claims.yaml"
ARTICLES = {
    "000": N_("“为什么GPU显存成了DNN训练的硬瓶颈” (“Why GPU memory is the hard bottleneck of DNN training”), an "
              "unsigned Chinese blog post on where training memory goes and how to cut it"),
    "001": N_("an untitled, unsigned Chinese blog post on the memory of large language models that opens with "
              "“大模型显存需求的核心矛盾” (“The core conflict of LLM memory needs”), with RTX 4090 and 8 x A100 cases"),
}
Verdict = Literal["holds", "partly holds", "does not hold", "not modelled"]
VERDICT_WORDS: dict[str, str] = {"holds": N_("holds"), "partly holds": N_("partly holds"),
                                 "does not hold": N_("does not hold"), "not modelled": N_("not modelled")}
# data/claims.yaml's `shown` texts that have words in them (the catalogue needs their ids;
# tests/calc/evidence/test_claims.py checks that none is missing)
SHOWN_WORDS = (N_("O(S): 2x per doubling"),)
# the claimed and computed figures' units as they read in each language (the rest read the same)
_UNIT_WORDS = {"B/param": N_("B/param"), "x": N_("x")}
_FITS_WORDS = {True: N_("fits"), False: N_("does not fit")}
Unit = Literal["GB", "GiB", "MiB", "B/param", "GB/s", "%", "x", "fits"]
Metric = Literal[
    "peak", "device_total", "activations", "parameters", "gradients", "optimizer_states", "optimizer_share",
    "cuda_context", "runtime_overhead", "fits", "step_time", "dp_comm_time", "pcie_bandwidth", "nvme_bandwidth",
    "eager_scores_per_head_layer", "states_per_trainable", "per_param",
]
PER_PARAM_FIELDS = tuple(f for f in BytesPerParam.model_fields if f not in
                         ("precision", "optimizer", "optimizer_impl", "zero_stage", "data_parallel", "params"))
_BYTES_UNITS = {"GB": GB, "GiB": GiB, "MiB": MiB}


class Claimed(BaseModel):
    """What the article says: a value or a range, in `unit`, and how to compare it."""

    model_config = ConfigDict(extra="forbid")

    low: float | bool | None = Field(None, description="the claimed value (or the low end of a range; true/false "
                                                        "for fits); None only for a claim that is not a number")
    high: float | None = Field(None, description="the high end of a claimed range")
    unit: Unit
    test: Literal["approx", "at_least", "at_most"] = Field(
        "approx", description="approx: within tolerance of the range; at_least / at_most: a bound the article states")
    tolerance: float = Field(0.10, ge=0, le=1, description="relative slack on the claimed range")
    shown: str | None = Field(None, description="how the claim reads when it is not a plain number, e.g. O(sqrt L)")

    @model_validator(mode="after")
    def _has_a_value(self) -> Claimed:
        if self.low is None and not self.shown:
            raise ValueError("a claimed value (low) or how the claim reads (shown) is needed")
        return self

    @property
    def text(self) -> str:
        return self.render()

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        """The claimed figure as the page shows it, in `lang` (English: the id words)."""
        if self.shown:
            return translate(self.shown, lang)
        if self.unit == "fits":
            return translate(_FITS_WORDS[bool(self.low)], lang)
        rng = f"{_num(self.low)}" + (f"-{_num(self.high)}" if self.high is not None else "")
        bound = {"approx": "", "at_least": "> ", "at_most": "< "}[self.test]
        return f"{bound}{rng}{_unit(self.unit, lang)}"


class Check(BaseModel):
    """How the engine answers the same question."""

    model_config = ConfigDict(extra="forbid")

    scenario: dict[str, Any] = Field(description="Scenario JSON: the setting the claim is about")
    metric: Metric
    fields: list[str] = Field(default_factory=list, description="per_param: BytesPerParam fields summed")
    params: float | None = Field(None, gt=0, description="per_param: parameter count to multiply by")
    compare: dict[str, Any] | None = Field(None, description="training fields of the what-if to compare with")
    form: Literal["value", "saving", "ratio", "reduction", "increase"] = Field(
        "value", description="saving 1 - what-if/base; ratio what-if/base; reduction base/what-if; "
                             "increase what-if/base - 1")

    @model_validator(mode="after")
    def _consistent(self) -> Check:
        if self.metric == "per_param":
            bad = [f for f in self.fields if f not in PER_PARAM_FIELDS]
            if not self.fields or bad:
                raise ValueError(f"per_param needs fields from {PER_PARAM_FIELDS}; got {self.fields}")
        if (self.compare is None) != (self.form == "value"):
            raise ValueError("a compare what-if goes with a saving / ratio / reduction / increase form")
        Scenario.model_validate(self.scenario)
        return self


class Claim(BaseModel):
    """One quantitative claim of one article."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9-]+$")
    article: Literal["000", "001"]
    section: str = Field(description="the article's section heading, as written")
    quote: str = Field(min_length=4, description="the claim in the original Chinese, verbatim")
    gist: str = Field(description="the claim in English")
    claimed: Claimed
    check: Check | None = Field(None, description="None: the engine does not model this (verdict 'not modelled')")
    partly: bool = Field(False, description="the figure holds but the reasoning behind it does not")
    verdict: Verdict = Field(description="what the engine's numbers say (the test recomputes it)")
    reason: str = Field(description="the verdict's reason, one line")

    @model_validator(mode="after")
    def _not_modelled(self) -> Claim:
        if (self.check is None) != (self.verdict == "not modelled"):
            raise ValueError(f"{self.id}: 'not modelled' is the verdict exactly when there is no check")
        return self


class ClaimResult(BaseModel):
    """A claim with the engine's figure and the verdict computed now."""

    model_config = ConfigDict(extra="forbid")

    claim: Claim
    engine_value: float | bool | None
    engine_raw: float | bool | None = Field(None, description="the engine's figure before the unit conversion")
    engine_text: str
    setup: str
    verdict: Verdict

    def engine_in(self, lang: Lang = DEFAULT_LANG) -> str:
        """The engine's figure in `lang` (engine_text is the English)."""
        if self.engine_value is None:
            return translate(N_("not modelled by the engine") if self.claim.check is None or self.claim.claimed.low is None
                             else N_("no GPU to fit on"), lang)
        return _engine_text(self.engine_raw, self.engine_value, self.claim.claimed.unit, lang)

    def setup_in(self, lang: Lang = DEFAULT_LANG) -> str:
        """The setting in `lang` (setup is the English)."""
        if not self.setup or self.claim.check is None:
            return ""
        return describe(Scenario.model_validate(self.claim.check.scenario), self.claim.check, lang)

    def verdict_in(self, lang: Lang = DEFAULT_LANG) -> str:
        return translate(VERDICT_WORDS[self.verdict], lang)


def _unit(unit: str, lang: Lang) -> str:
    """' GB', '%', 'x' after a number: a space before a unit word, none before a sign."""
    word = translate(_UNIT_WORDS[unit], lang) if unit in _UNIT_WORDS else unit
    return word if unit in ("%", "x") and word == unit else f" {word}"


def _num(x: float | bool | None) -> str:
    if x is None or isinstance(x, bool):
        return str(x)
    return f"{x:,.0f}" if x == int(x) or abs(x) >= 100 else f"{x:,.3g}"


@memoized("claims files", 4)
def load_claims(path: str = str(CLAIMS_PATH)) -> tuple[Claim, ...]:
    """All claims, validated; ids unique."""
    raw = load_yaml(Path(path).read_text(encoding="utf-8"))
    claims = tuple(Claim.model_validate(c) for c in raw)
    ids = [c.id for c in claims]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate claim ids: {sorted(dup)}")
    return claims


def metric_value(sc: Scenario, chk: Check) -> float | bool | None:
    """The engine's figure for one scenario: bytes, seconds, bytes/s, a fraction or a fit."""
    m = chk.metric
    if m == "per_param":
        b = bytes_per_param(sc)
        per = sum(getattr(b, f) for f in chk.fields)
        return per * chk.params if chk.params else per
    if m == "step_time":
        return estimate_speed(sc).step_s
    if m == "dp_comm_time":
        return sum(t.total_seconds for t in estimate_speed(sc).terms if t.key == "dp_comm")
    if m == "pcie_bandwidth":
        return gpu_presets()[sc.resolved_hardware().gpu].pcie_bandwidth_bytes_per_s
    if m == "nvme_bandwidth":
        return hardware_of(sc).nvme_bytes_per_s
    if m == "eager_scores_per_head_layer":
        eager = estimate(variant(sc, attention="eager"))
        flash = estimate(variant(sc, attention="sdpa"))
        per = sc.spec.num_layers * sc.spec.num_heads * sc.training.micro_batch_size
        return (max(eager.timeline.activations) - max(flash.timeline.activations)) / per
    est = estimate(sc)
    tl = est.timeline
    if m == "peak":
        return est.peak_allocated_bytes
    if m == "device_total":
        return est.device_total_bytes.expected
    if m == "cuda_context":
        return est.device_total_bytes.cuda_context_bytes
    if m == "runtime_overhead":  # outside the tensors: CUDA context + NCCL buffers + cuBLAS workspaces
        ws = next((c.bytes for c in est.components if c.key == "cublas_workspace"), 0)
        return est.device_total_bytes.cuda_context_bytes + est.device_total_bytes.workspace_bytes + ws
    if m == "states_per_trainable":
        return max(tl.optimizer_states) / est.model.trainable_params
    if m == "fits":
        return est.verdict.fits  # the one verdict (calc.memory.verdict)
    if m == "optimizer_share":
        return est.breakdown.optimizer_states / est.peak_allocated_bytes
    return max(getattr(tl, m))  # a category at its largest during the step


def engine_value(chk: Check) -> float | bool | None:
    """The metric for the check's scenario, or its comparison with the what-if."""
    sc = Scenario.model_validate(chk.scenario)
    base = metric_value(sc, chk)
    if chk.compare is None:
        return base
    alt_sc = variant(sc, **chk.compare)
    if alt_sc is None:
        raise ValueError(f"the what-if {chk.compare} is not a valid scenario")
    alt = metric_value(alt_sc, chk)
    return {"saving": lambda: 1 - alt / base, "ratio": lambda: alt / base, "reduction": lambda: base / alt,
            "increase": lambda: alt / base - 1}[chk.form]()


def in_unit(value: float | bool, unit: str) -> float | bool:
    if unit in _BYTES_UNITS:
        return value / _BYTES_UNITS[unit]
    if unit == "GB/s":
        return value / GB
    if unit == "%":
        return 100 * value
    return value


def judge(claimed: Claimed, value: float | bool) -> bool:
    """Does the engine's figure (in the claim's unit) bear the claim out?"""
    if claimed.unit == "fits":
        return value is claimed.low
    lo = float(claimed.low)
    hi = claimed.high if claimed.high is not None else lo
    tol = claimed.tolerance
    if claimed.test == "at_least":
        return value >= lo * (1 - tol)
    if claimed.test == "at_most":
        return value <= hi * (1 + tol)
    return lo * (1 - tol) <= value <= hi * (1 + tol)


def check(claim: Claim) -> ClaimResult:
    """The engine's figure for the claim's setting and the verdict it gives."""
    if claim.check is None or claim.claimed.low is None:
        return ClaimResult(claim=claim, engine_value=None, engine_text="not modelled by the engine", setup="",
                           verdict="not modelled")
    raw = engine_value(claim.check)
    unit = claim.claimed.unit
    if raw is None:
        return ClaimResult(claim=claim, engine_value=None, engine_text="no GPU to fit on", setup="",
                           verdict="not modelled")
    value = in_unit(raw, unit)
    ok = judge(claim.claimed, value)
    verdict: Verdict = ("partly holds" if claim.partly else "holds") if ok else "does not hold"
    return ClaimResult(claim=claim, engine_value=value, engine_raw=raw, engine_text=_engine_text(raw, value, unit),
                       setup=describe(Scenario.model_validate(claim.check.scenario), claim.check), verdict=verdict)


def _engine_text(raw: float | bool, value: float | bool, unit: str, lang: Lang = DEFAULT_LANG) -> str:
    if unit == "fits":
        return translate(_FITS_WORDS[bool(value)], lang)
    if unit in ("%", "x"):
        return f"{value:,.1f}{unit}" if unit == "%" else f"{value:,.2f}{_unit(unit, lang)}"
    if unit in ("GB", "MiB", "GB/s"):
        text = f"{value:,.1f} {unit}"
        return text + (f" ({raw / GiB:,.1f} GiB)" if unit == "GB" else "")
    return f"{value:,.2f}{_unit(unit, lang)}"


_MODE_WORDS = {"train": N_("train"), "inference": N_("inference")}
_LIST_SEP = {"en": ", ", "zh": "，"}


def describe(sc: Scenario, chk: Check, lang: Lang = DEFAULT_LANG) -> str:
    """The setting in words: model, hardware, precision, optimizer and what differs in the what-if."""
    t, hw = sc.training, sc.resolved_hardware()

    def say(msgid: str, **fields: object) -> str:
        return translate(msgid, lang, **fields)

    gpus = f"{hw.num_gpus} x {gpu_presets()[hw.gpu].name}" if hw.gpu else say(N_("no GPU"))
    parts = [sc.spec.name or sc.spec.family, gpus, say(_MODE_WORDS[sc.mode.value])]
    if chk.metric == "per_param":
        parts = [say(N_("{n} parameters"), n=_num(chk.params)) if chk.params else say(N_("per parameter"))]
    parts += [t.precision.value, f"{t.optimizer.value} ({t.optimizer_impl.value})"]
    if chk.metric != "per_param":
        parts += [f"{t.micro_batch_size} x {t.seq_len:,} tokens", say(N_("{kind} attention"), kind=t.attention.value),
                  say(N_("checkpointing {mode}"), mode=t.activation_checkpointing.value)]
    if t.zero_stage:
        parts.append(f"ZeRO-{t.zero_stage}")
    if t.offload_optimizer.value != "none" or t.offload_params.value != "none":
        parts.append(say(N_("offload optimizer {optimizer} / params {params}"), optimizer=t.offload_optimizer.value,
                         params=t.offload_params.value))
    if t.lora is not None and sc.mode.value == "inference":
        parts.append(say(N_("{dtype} weights"), dtype=t.lora.base_weights))
    elif t.lora is not None:
        parts.append(say(N_("LoRA r={rank} ({dtype} base)"), rank=t.lora.rank, dtype=t.lora.base_weights))
    sep = _LIST_SEP.get(lang, ", ")
    text = sep.join(parts)
    if chk.compare:
        text += say(N_("; what-if: {changes}"), changes=sep.join(f"{k}={v}" for k, v in chk.compare.items()))
    return text


def check_all(path: str = str(CLAIMS_PATH)) -> list[ClaimResult]:
    return [check(c) for c in load_claims(path)]


# ---- the articles' formulas ----------------------------------------------------------------

class BatchFormula(BaseModel):
    """Article 001's "max_batch_size = (total memory - static overhead) / (per-sample memory x
    parallel degree)" with its 10 % safety margin, fed with the engine's own terms."""

    model_config = ConfigDict(extra="forbid")

    gpu_bytes: int
    usable_bytes: int = Field(description="GPU memory minus the safety margin")
    static_bytes: int = Field(description="each model-state category at its largest + CUDA context + NCCL buffers")
    per_sample_bytes: int = Field(description="activations saved for backward for one sequence, at their largest")
    formula_batch: int = Field(description="floor((usable - static) / per-sample), 0 when static alone is too big")


def article_batch_formula(sc: Scenario, margin: float = 0.10) -> BatchFormula | None:
    """The article's micro-batch formula per GPU (parallel degree 1: the batch is per GPU); None
    without a GPU size. Static = what does not grow with the batch; per-sample = what does."""
    one = variant(sc, micro_batch_size=1)
    est = estimate(one if one is not None else sc)
    if est.gpu_memory_bytes is None:
        return None
    tl, dt = est.timeline, est.device_total_bytes
    static = max(tl.parameters) + max(tl.gradients) + max(tl.optimizer_states)
    static += dt.cuda_context_bytes + dt.workspace_bytes
    per_sample = max(1, max(tl.activations))
    usable = usable_bytes(est.gpu_memory_bytes, margin)
    return BatchFormula(gpu_bytes=est.gpu_memory_bytes, usable_bytes=usable, static_bytes=static,
                        per_sample_bytes=per_sample, formula_batch=max(0, (usable - static) // per_sample))

"""One optimizer step's time: calc.speed.terms' numbers added up into StepTime, each term with its words
(calc.speed.formulas) when asked to explain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import calc.speed.formulas as words
from calc.contract.architectures import ModelSpec
from calc.contract.scenario import Attention, LoraConfig, Mode, Offload
from calc.speed.assumptions import SpeedAssumptions
from calc.speed.hardware import NO_BF16_DTYPE, SpeedHardware
from calc.speed.terms import (
    Flops,
    StepConfig,
    StepShape,
    bubble_seconds,
    compute_seconds,
    data_parallel_comm,
    dequantization,
    eager_traffic,
    flops,
    offload_numbers,
    pipeline_comm,
    step_shape,
    tensor_parallel_comm,
    zero3_fetch_latency,
)

TermGroup = Literal["compute", "communication", "offload"]


@dataclass
class StepTerm:
    """One term of the step: the seconds it adds (its exposed part) and those of its whole work."""

    key: str
    group: TermGroup
    label: str
    seconds: float
    total_seconds: float
    formula: str  # empty unless the step time was asked to explain
    source: str


@dataclass
class StepTime:
    """The step's terms and their sums by group, with the FLOPs and tokens they came from."""

    terms: list[StepTerm]
    compute_s: float
    communication_s: float  # exposed, after overlap
    communication_total_s: float
    offload_s: float
    step_s: float
    tokens_per_step: int
    model_flops_per_token: float
    executed_flops_per_token: float
    peak_flops_per_s: float
    interconnect: str  # the data-parallel link's name (calc.speed.formulas.link_name), "none" without DP
    notes: list[str]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0


def step_time(spec: ModelSpec, t: StepConfig, hw: SpeedHardware, mode: Mode, a: SpeedAssumptions,
              explain: bool = True) -> StepTime:
    """The whole model. `t` is a TrainingConfig or any object with the same attribute names (the
    recommender passes light stand-ins to avoid re-validating thousands of candidates). explain=False
    leaves every term's formula empty: the same seconds, without formatting a dozen strings (a search
    ranks thousands of candidates by their numbers and explains only the few it shows)."""
    x = step_shape(spec, t, hw, mode, a)
    f = flops(x)
    compute = compute_terms(x, f, hw, a, explain)
    communication, interconnect = communication_terms(x, f, compute[0].seconds, hw, a, explain)
    offload, offload_s = offload_terms(x, hw, a, explain) if x.training else ([], 0.0)
    compute_s = sum(term.seconds for term in compute)
    communication_s = sum(term.seconds for term in communication)
    communication_total_s = sum(term.total_seconds for term in communication)
    notes = [words.no_bf16_note(hw.gpu)] if x.dtype == NO_BF16_DTYPE else []
    return StepTime(compute + communication + offload, compute_s, communication_s, communication_total_s, offload_s,
                    compute_s + communication_s + offload_s, x.tokens_per_step, f.model_per_token,
                    f.executed_per_token, x.peak_flops_per_s, interconnect, notes)


def compute_terms(x: StepShape, f: Flops, hw: SpeedHardware, a: SpeedAssumptions, explain: bool) -> list[StepTerm]:
    """The matmul compute, the pipeline's bubble, eager attention's S x S traffic and QLoRA's dequantisation."""
    compute_s = compute_seconds(x, f, a)
    out = [StepTerm("compute", "compute", words.compute_label(f), compute_s, compute_s,
                    words.compute_formula(x, f, a) if explain else "", words.compute_source(x, f))]
    if x.pp > 1:
        bubble = bubble_seconds(x, compute_s)
        label, formula, source = words.bubble_words(x, compute_s, explain)
        out.append(StepTerm("pipeline_bubble", "compute", label, bubble, bubble, formula, source))
    if x.config.attention == Attention.eager:
        e = eager_traffic(x, hw)
        out.append(StepTerm("eager_attention", "compute", words.EAGER_LABEL, e.seconds, e.seconds,
                            words.eager_formula(x, e, hw) if explain else "", words.EAGER_SOURCE))
    lora: LoraConfig | None = x.config.lora
    if lora is not None and lora.quantized:
        d = dequantization(x, f, hw, lora)
        out.append(StepTerm("dequantize", "compute", words.dequantization_label(lora.base_weights), d.seconds,
                            d.seconds, words.dequantization_formula(x, d, hw) if explain else "",
                            words.DEQUANTIZATION_SOURCE))
    return out


def communication_terms(x: StepShape, f: Flops, compute_s: float, hw: SpeedHardware, a: SpeedAssumptions,
                        explain: bool) -> tuple[list[StepTerm], str]:
    """The data-parallel collectives (and ZeRO-3's fetch latency), the tensor-parallel all-reduces and the
    pipeline's sends; and the name of the data-parallel link."""
    out: list[StepTerm] = []
    interconnect = "none"
    if x.training and x.dp > 1:
        c = data_parallel_comm(x, f, compute_s, hw, a)
        interconnect = words.link_name(c.link.kind)
        out.append(StepTerm("dp_comm", "communication", words.DP_LABELS[c.zero_stage], c.exposed_seconds,
                            c.total_seconds, words.dp_formula(x, c, a) if explain else "", words.DP_SOURCE))
        if c.zero_stage == 3:
            lat = zero3_fetch_latency(x)
            out.append(StepTerm("zero3_fetch_latency", "communication", words.FETCH_LABEL, lat.seconds, lat.seconds,
                                words.fetch_formula(x, lat) if explain else "", words.FETCH_SOURCE))
    if x.tp > 1:
        tp = tensor_parallel_comm(x, f, hw, a)
        out.append(StepTerm("tp_comm", "communication", words.TP_LABEL, tp.seconds, tp.seconds,
                            words.tp_formula(x, tp) if explain else "", words.TP_SOURCE))
    if x.pp > 1:
        pp = pipeline_comm(x, hw, a)
        out.append(StepTerm("pp_comm", "communication", words.PP_LABEL, pp.seconds, pp.seconds,
                            words.pp_formula(pp) if explain else "", words.PP_SOURCE))
    return out, interconnect


def offload_terms(x: StepShape, hw: SpeedHardware, a: SpeedAssumptions,
                  explain: bool) -> tuple[list[StepTerm], float]:
    """ZeRO-Offload's PCIe copies and CPU Adam step, ZeRO-Infinity's NVMe traffic, and their sum."""
    t = x.config
    if t.offload_optimizer == Offload.none and t.offload_params == Offload.none:
        return [], 0.0
    o = offload_numbers(x, hw, a)
    out: list[StepTerm] = []
    offload_s = 0.0

    def add(key: str, seconds: float) -> None:
        out.append(StepTerm(key, "offload", words.OFFLOAD_LABELS[key], seconds, seconds,
                            words.offload_formula(key, x, o, hw, a) if explain else "", words.OFFLOAD_SOURCES[key]))

    if t.offload_optimizer != Offload.none:
        add("offload_pcie", o.pcie_seconds)
        add("cpu_adam", o.cpu_adam_seconds)
        offload_s += o.pcie_seconds + o.cpu_adam_seconds
        if t.offload_optimizer == Offload.nvme:
            add("nvme_optimizer", o.nvme_optimizer_seconds)
            offload_s += o.nvme_optimizer_seconds
    if t.offload_params != Offload.none:
        add("offload_params_pcie", o.param_pcie_seconds)
        offload_s += o.param_pcie_seconds
        if t.offload_params == Offload.nvme:
            add("nvme_params", o.nvme_params_seconds)
            offload_s += o.nvme_params_seconds
    return out, offload_s

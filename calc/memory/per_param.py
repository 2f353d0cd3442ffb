"""Bytes per parameter: the model states of a scenario divided by its parameter count, read from
the same code that builds the breakdown (calc.memory.states.model_states, calc.memory.fsdp2.fsdp2_states and
step_gradient_bytes), so every page that quotes "N bytes per parameter" agrees with the peak.

Two totals: `held` is what the ZeRO paper counts as model states (weights + gradients + fp32
master weights + optimizer states), and `at_step` is what is alive during optimizer.step():
the gradients as the step sees them (fp32 copies under *-mixed) plus the step's scratch
(foreach AdamW's sqrt list). Figures are per GPU: ZeRO shards divide them by the data-parallel size.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.parallel import layers_on_stage
from calc.contract.precision import step_gradients_why
from calc.contract.scenario import Mode, Scenario
from calc.contract.variant import variant
from calc.memory.fsdp2 import fsdp2_states
from calc.memory.states import model_states, step_gradient_bytes


class BytesPerParam(BaseModel):
    """Model-state bytes on one GPU divided by the parameters it trains (before ZeRO sharding)."""

    model_config = ConfigDict(extra="forbid")

    precision: str
    optimizer: str
    optimizer_impl: str
    zero_stage: int
    data_parallel: int
    params: int = Field(description="parameters on this GPU before ZeRO sharding (the divisor)")
    weights: float = Field(description="weights kept on the GPU (16-bit copies under *-mixed)")
    gradients: float = Field(description=".grad through backward, in the parameter dtype")
    master_weights: float = Field(description="fp32 master weights (*-mixed only)")
    optimizer_states: float = Field(description="optimizer states alone (e.g. AdamW's m and v)")
    held: float = Field(description="weights + gradients + master weights + optimizer states")
    step_gradients: float = Field(description="gradients alive during the step (fp32 copies under *-mixed)")
    optimizer_temporaries: float = Field(description="optimizer.step() scratch (foreach AdamW's sqrt list)")
    at_step: float = Field(description="weights + step gradients + master + states + temporaries")
    step_gradients_why: str = Field(description="why the step's gradients take what they do (calc.contract.precision)")


def bytes_per_param(sc: Scenario) -> BytesPerParam:
    """Per-parameter model states of `sc` on its first pipeline stage, as the engine counts them."""
    t = sc.training
    if sc.mode != Mode.train:
        sc = variant(sc, mode=Mode.train.value) or sc
    fsdp = t.sharding == "fsdp2" and sc.data_parallel > 1 and t.zero_stage in (2, 3)
    layers = layers_on_stage(sc.spec.num_layers, t.pipeline_parallel)
    st = fsdp2_states(sc) if fsdp else model_states(sc, layers, True, t.pipeline_parallel == 1,
                                                    deepspeed=t.sharding == "deepspeed")
    n = st.params_local
    states = st.optimizer - st.master
    step_grads = step_gradient_bytes(sc, st)
    return BytesPerParam(
        precision=t.precision.value, optimizer=t.optimizer.value, optimizer_impl=t.optimizer_impl.value,
        zero_stage=t.zero_stage, data_parallel=sc.data_parallel, params=n,
        weights=st.weights / n, gradients=st.grads / n, master_weights=st.master / n, optimizer_states=states / n,
        held=(st.weights + st.grads + st.optimizer) / n, step_gradients=step_grads / n,
        optimizer_temporaries=st.opt_temp / n, at_step=(st.weights + step_grads + st.optimizer + st.opt_temp) / n,
        step_gradients_why=step_gradients_why(st.keeps_16bit_step_grads))


def bytes_per_param_table(sc: Scenario, changes: list[dict]) -> list[BytesPerParam | None]:
    """bytes_per_param for each what-if of `sc` (training fields to change); None where the
    combination is not valid."""
    out: list[BytesPerParam | None] = []
    for ch in changes:
        v = variant(sc, **ch)
        out.append(bytes_per_param(v) if v is not None else None)
    return out

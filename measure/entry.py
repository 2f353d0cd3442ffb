"""measure(): the one entry point. One-GPU scenarios run in measure.runner, multi-GPU ones in
measure.sharded (which builds on the runner's helpers); neither imports the other back."""

from __future__ import annotations

from calc.contract.record import MeasurementRecord
from calc.contract.scenario import Scenario


def measure(scenario: Scenario, device: str, steps: int = 3, name: str | None = None,
            num_layers: int | None = None, extrapolate_layers: bool = False) -> MeasurementRecord:
    """Measure `scenario` on `device` ("cuda" | "cpu" | "fake").

    extrapolate_layers: measure two short depths (extrapolation_layers) and extrapolate linearly to the
    scenario's layer count; only for layer counts beyond them.
    """
    from measure.workload import UnsupportedError

    if device not in ("cuda", "cpu", "fake"):
        raise UnsupportedError(f"unknown device {device!r}; use cuda, cpu or fake")
    if scenario.training.framework == "litgpt":
        from measure.frameworks.litgpt_run import measure_litgpt

        return measure_litgpt(scenario, device, steps=steps, name=name, num_layers=num_layers)
    if scenario.training.framework == "torchtune":
        from measure.frameworks.torchtune_run import measure_torchtune

        return measure_torchtune(scenario, device, steps=steps, name=name, num_layers=num_layers,
                                 extrapolate_layers=extrapolate_layers)
    if scenario.resolved_hardware().num_gpus > 1:
        from measure.sharded import measure_sharded

        return measure_sharded(scenario, device, steps=steps, name=name, num_layers=num_layers,
                               extrapolate_layers=extrapolate_layers)
    from measure.runner import measure_single

    return measure_single(scenario, device, steps=steps, name=name, num_layers=num_layers,
                          extrapolate_layers=extrapolate_layers)

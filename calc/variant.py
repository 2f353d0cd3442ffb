"""One way to make a what-if variant of a scenario: the same scenario with some fields replaced,
validated again. (When Scenario.with_training lands, this becomes a call to it.)"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from calc.scenario import Scenario


def variant(sc: Scenario, *, hardware: dict[str, Any] | None = None, mode: str | None = None,
            **training: Any) -> Scenario | None:
    """`sc` with the given hardware, mode and training fields replaced (every other field kept);
    None when that combination is not a valid scenario."""
    data = sc.model_dump(mode="json")
    if hardware is not None:
        data["hardware"] = hardware
    if mode is not None:
        data["mode"] = mode
    for k, v in training.items():
        data["training"][k] = v.value if hasattr(v, "value") else v
    try:
        return Scenario.model_validate(data)
    except (ValidationError, ValueError):
        return None

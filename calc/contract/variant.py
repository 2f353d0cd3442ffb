"""One way to make a what-if variant of a scenario: the same scenario with some fields replaced,
validated again (Scenario.variant / Scenario.with_training), or None when it is not valid."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from calc.contract.scenario import Scenario


def variant(sc: Scenario, *, hardware: dict[str, Any] | None = None, mode: str | None = None,
            **training: Any) -> Scenario | None:
    """`sc` with the given hardware, mode and training fields replaced (every other field kept);
    None when that combination is not a valid scenario."""
    top: dict[str, Any] = {}
    if hardware is not None:
        top["hardware"] = hardware
    if mode is not None:
        top["mode"] = mode
    try:
        return sc.variant(**top).with_training(**training)
    except (ValidationError, ValueError):
        return None

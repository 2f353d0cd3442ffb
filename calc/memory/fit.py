"""What fits: the largest micro-batch or the longest sequence that fits the chosen GPU.

Peak memory never decreases with batch or sequence length (a property test checks it), so the
answer is found by doubling, then bisecting, with the engine.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from calc.contract.scenario import Scenario, TrainingConfig
from calc.memory.engine import estimate

Field = Literal["micro_batch_size", "seq_len"]


def _limit(field: Field) -> int:
    for m in TrainingConfig.model_fields[field].metadata:
        if hasattr(m, "le"):
            return int(m.le)
    raise KeyError(field)


def _fits(base: Scenario, field: Field, value: int) -> bool:
    """The verdict's GPU limit for `base` with `field` = value (the batch and sequence length do not
    change what offload needs from the host, so host RAM / NVMe are the verdict's business, not this
    search's)."""
    try:
        est = estimate(base.with_training(**{field: value}))
    except (ValidationError, ValueError):
        return False
    return bool(est.verdict.limit("gpu").fits)


def largest_fitting(sc: Scenario, field: Field) -> int | None:
    """The largest value of `field` (everything else as in `sc`) whose expected device total fits
    the GPU; 0 when even 1 does not fit; None when the scenario names no GPU memory."""
    if estimate(sc).gpu_memory_bytes is None:
        return None
    base = sc
    top = _limit(field)
    if not _fits(base, field, 1):
        return 0
    lo, hi = 1, 2
    while hi <= top and _fits(base, field, hi):
        lo, hi = hi, hi * 2
    if hi > top:
        if _fits(base, field, top):
            return top
        hi = top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(base, field, mid):
            lo = mid
        else:
            hi = mid
    return lo

"""Does it fit? The one verdict: GPU memory per GPU, host RAM and NVMe per node, computed once here.

Every page, the CLI and the recommender read `Estimate.verdict`; none re-derives it. A limit whose
capacity is unknown (no GPU size, no host RAM / NVMe figure for the node) is `fits=None`, and the
verdict is then `None` unless another limit is exceeded: we ask for the number instead of saying
"fits".
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from calc.units import GiB

Resource = Literal["gpu", "host_ram", "nvme"]


class Limit(BaseModel):
    """One resource the configuration needs, against what the hardware has."""

    model_config = ConfigDict(extra="forbid")

    resource: Resource
    needed_bytes: int = Field(description="gpu: expected device total per GPU; host_ram / nvme: per node")
    available_bytes: int | None = Field(description="capacity (None: unknown)")
    fits: bool | None = Field(description="needed <= available (None: capacity unknown)")


class Verdict(BaseModel):
    """`fits` is False when any known limit is exceeded, None when none is exceeded but one is
    unknown, True when every limit is known and met. `reasons`: one sentence per limit that is
    exceeded or unknown (empty when it fits)."""

    model_config = ConfigDict(extra="forbid")

    fits: bool | None
    limits: list[Limit]
    reasons: list[str] = Field(default_factory=list)

    def limit(self, resource: Resource) -> Limit | None:
        return next((lim for lim in self.limits if lim.resource == resource), None)

    @property
    def gpu_headroom_bytes(self) -> int | None:
        gpu = self.limit("gpu")
        return None if gpu is None or gpu.available_bytes is None else gpu.available_bytes - gpu.needed_bytes


def gib_short(n_bytes: int) -> str:
    """'100.41 GiB', '64 GiB': two decimals like every size on screen, none for a whole number
    (1 GiB = 2^30 bytes)."""
    text = f"{n_bytes / GiB:,.2f}"
    return (text[:-3] if text.endswith(".00") else text) + " GiB"


def _reason(lim: Limit) -> str:
    need = gib_short(lim.needed_bytes)
    if lim.resource == "gpu":
        if lim.available_bytes is None:
            return f"needs {need} per GPU; no GPU memory size is chosen"
        return (f"needs {need} per GPU; the GPU has {gib_short(lim.available_bytes)} "
                f"(short by {gib_short(lim.needed_bytes - lim.available_bytes)})")
    what = "host RAM" if lim.resource == "host_ram" else "NVMe space"
    if lim.available_bytes is None:
        return f"offload needs {need} of {what} per node; this node's {what} is unknown (set it under Hardware)"
    return f"offload needs {need} of {what} per node; this node has {gib_short(lim.available_bytes)}"


def make_verdict(gpu_needed: int, gpu_available: int | None, host_ram_needed: int, host_ram_available: int | None,
                 nvme_needed: int, nvme_available: int | None) -> Verdict:
    """The verdict from what is needed and what is there. Host RAM / NVMe limits appear only when
    offload needs them."""
    wanted: list[tuple[Resource, int, int | None]] = [("gpu", gpu_needed, gpu_available)]
    if host_ram_needed:
        wanted.append(("host_ram", host_ram_needed, host_ram_available))
    if nvme_needed:
        wanted.append(("nvme", nvme_needed, nvme_available))
    limits = [Limit(resource=r, needed_bytes=need, available_bytes=have, fits=None if have is None else need <= have)
              for r, need, have in wanted]
    states = [lim.fits for lim in limits]
    fits = False if False in states else (None if None in states else True)
    return Verdict(fits=fits, limits=limits, reasons=[_reason(lim) for lim in limits if lim.fits is not True])


def headline(v: Verdict) -> str:
    """The verdict in one sentence: 'fits with 6.93 GiB headroom per GPU', 'does not fit: offload
    needs 100.4 GiB of host RAM per node; this node has 64 GiB', 'fits on the GPU with 6.93 GiB
    headroom; not known for the rest: ...'."""
    head = v.gpu_headroom_bytes
    if v.fits:
        return f"fits with {gib_short(head)} headroom per GPU" if head is not None else "fits"
    if v.fits is False:
        return "does not fit: " + "; and ".join(v.reasons)
    gpu = v.limit("gpu")
    if gpu is not None and gpu.fits and head is not None:
        return f"fits on the GPU with {gib_short(head)} headroom, but " + "; and ".join(v.reasons)
    return "not known: " + "; and ".join(v.reasons)


def short(v: Verdict) -> str:
    """A table cell: 'fits', 'does not fit (host RAM)', 'unknown (host RAM)'."""
    if v.fits:
        return "fits"
    bad = [lim for lim in v.limits if lim.fits is (False if v.fits is False else None)]
    names = {"gpu": "GPU memory", "host_ram": "host RAM", "nvme": "NVMe"}
    what = ", ".join(names[lim.resource] for lim in bad)
    return f"does not fit ({what})" if v.fits is False else f"unknown ({what})"


__all__ = ["Limit", "Resource", "Verdict", "gib_short", "headline", "make_verdict", "short"]

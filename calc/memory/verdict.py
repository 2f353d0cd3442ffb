"""Does it fit? The one verdict: GPU memory per GPU, host RAM and NVMe per node, computed once here.

Every page, the CLI and the recommender read `Estimate.verdict`; none re-derives it. A limit whose
capacity is unknown (no GPU size, no host RAM / NVMe figure for the node) is `fits=None`, and the
verdict is then `None` unless another limit is exceeded: we ask for the number instead of saying
"fits".
"""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, Text, translate
from calc.contract.units import GiB

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
        return None if gpu is None else _headroom(gpu.needed_bytes, gpu.available_bytes)


class LimitFields(TypedDict):
    """A Limit's fields, as verdict_data gives them (the engine validates them inside its Estimate)."""

    resource: Resource
    needed_bytes: int
    available_bytes: int | None
    fits: bool | None


class VerdictFields(TypedDict):
    """A Verdict's fields, as verdict_data gives them."""

    fits: bool | None
    limits: list[LimitFields]
    reasons: list[str]


def gib_short(n_bytes: int) -> str:
    """'130.46 GiB', '64 GiB': two decimals like every size on screen, none for a whole number
    (1 GiB = 2^30 bytes)."""
    text = f"{n_bytes / GiB:,.2f}"
    return (text[:-3] if text.endswith(".00") else text) + " GiB"


RESOURCE_NAMES: dict[Resource, str] = {"gpu": N_("GPU memory"), "host_ram": N_("host RAM"), "nvme": N_("NVMe")}


def _reason_words(resource: Resource, needed: int, available: int | None) -> tuple[str, dict[str, str]]:
    """The reason a limit is not met, as a message id and its fields (calc.contract.i18n): one sentence per
    resource and state, so that each translates whole."""
    need = gib_short(needed)
    have = None if available is None else gib_short(available)
    if resource == "gpu":
        if have is None:
            return N_("needs {need} per GPU; no GPU memory size is chosen"), {"need": need}
        short_by = gib_short(needed - available)
        return N_("needs {need} per GPU; the GPU has {have} (short by {short})"), {"need": need, "have": have,
                                                                                   "short": short_by}
    if resource == "host_ram":
        if have is None:
            return (N_("offload needs {need} of host RAM per node; this node's host RAM is unknown (set it under "
                       "Hardware)"), {"need": need})
        return N_("offload needs {need} of host RAM per node; this node has {have}"), {"need": need, "have": have}
    if have is None:
        return (N_("offload needs {need} of NVMe space per node; this node's NVMe space is unknown (set it under "
                   "Hardware)"), {"need": need})
    return N_("offload needs {need} of NVMe space per node; this node has {have}"), {"need": need, "have": have}


def reason_texts(v: Verdict) -> list[Text]:
    """`v.reasons` as translatable sentences (built on demand: the engine stores only the English)."""
    return [Text.model_construct(msgid=msgid, fields=fields)
            for msgid, fields in (_reason_words(lim.resource, lim.needed_bytes, lim.available_bytes)
                                  for lim in v.limits if lim.fits is not True)]


def verdict_data(gpu_needed: int, gpu_available: int | None, host_ram_needed: int, host_ram_available: int | None,
                 nvme_needed: int, nvme_available: int | None) -> VerdictFields:
    """The verdict's fields from what is needed and what is there, as Verdict validates them (the engine
    validates them inside its Estimate, in one pass with the other result models). Host RAM / NVMe limits
    appear only when offload needs them."""
    wanted: list[tuple[Resource, int, int | None]] = [("gpu", gpu_needed, gpu_available)]
    if host_ram_needed:
        wanted.append(("host_ram", host_ram_needed, host_ram_available))
    if nvme_needed:
        wanted.append(("nvme", nvme_needed, nvme_available))
    limits: list[LimitFields] = []
    reasons: list[str] = []
    fits: bool | None = True
    for r, need, have in wanted:
        ok = None if have is None else need <= have
        limits.append({"resource": r, "needed_bytes": need, "available_bytes": have, "fits": ok})
        if ok is not True:
            msgid, fields = _reason_words(r, need, have)
            reasons.append(msgid.format(**fields))
            fits = False if ok is False or fits is False else None  # one limit exceeded decides it
    return {"fits": fits, "limits": limits, "reasons": reasons}


def make_verdict(gpu_needed: int, gpu_available: int | None, host_ram_needed: int, host_ram_available: int | None,
                 nvme_needed: int, nvme_available: int | None) -> Verdict:
    """The verdict from what is needed and what is there (verdict_data)."""
    return Verdict.model_validate(verdict_data(gpu_needed, gpu_available, host_ram_needed, host_ram_available,
                                               nvme_needed, nvme_available))


def gpu_headroom(data: VerdictFields) -> int | None:
    """Verdict.gpu_headroom_bytes of verdict_data's fields."""
    gpu = data["limits"][0]
    return _headroom(gpu["needed_bytes"], gpu["available_bytes"])


def _headroom(needed: int, available: int | None) -> int | None:
    return None if available is None else available - needed


def _reasons(v: Verdict, lang: Lang) -> str:
    if lang == DEFAULT_LANG:
        return "; and ".join(v.reasons)  # the stored English, as the CLI prints it
    return translate(N_("; and "), lang).join(t.render(lang) for t in reason_texts(v))


def headline(v: Verdict, lang: Lang = DEFAULT_LANG) -> str:
    """The verdict in one sentence: 'fits with 6.93 GiB headroom per GPU', 'does not fit: offload
    needs 130.46 GiB of host RAM per node; this node has 64 GiB', 'fits on the GPU with 6.93 GiB
    headroom; not known for the rest: ...' (in `lang`; English by default)."""
    head = v.gpu_headroom_bytes
    if v.fits:
        return (translate(N_("fits with {headroom} headroom per GPU"), lang, headroom=gib_short(head))
                if head is not None else translate(N_("fits"), lang))
    if v.fits is False:
        return translate(N_("does not fit: {reasons}"), lang, reasons=_reasons(v, lang))
    gpu = v.limit("gpu")
    if gpu is not None and gpu.fits and head is not None:
        return translate(N_("fits on the GPU with {headroom} headroom, but {reasons}"), lang,
                         headroom=gib_short(head), reasons=_reasons(v, lang))
    return translate(N_("not known: {reasons}"), lang, reasons=_reasons(v, lang))


def condition_text(v: Verdict) -> Text | None:
    """What a verdict with an unknown capacity (fits None) depends on, as a condition: 'fits if the node has
    >= 130.46 GiB of host RAM' (and the NVMe, or the GPU's size, alike); None when nothing is unknown or a known
    limit is exceeded. Never the word 'fits' on its own: the page asks for the capacity instead."""
    unknown = [lim for lim in v.limits if lim.fits is None]
    if not unknown or v.fits is False:
        return None
    parts = [Text(msgid=_CONDITIONS[lim.resource], fields={"need": gib_short(lim.needed_bytes)}) for lim in unknown]
    joined = parts[-1]
    for part in reversed(parts[:-1]):
        joined = T_("{first} and {rest}", first=part, rest=joined)
    return T_("fits if {conditions}", conditions=joined)


def condition(v: Verdict, lang: Lang = DEFAULT_LANG) -> str:
    """condition_text in `lang` ('' when nothing is unknown)."""
    text = condition_text(v)
    return "" if text is None else text.render(lang)


_CONDITIONS: dict[Resource, str] = {
    "gpu": N_("the GPU has >= {need}"), "host_ram": N_("the node has >= {need} of host RAM"),
    "nvme": N_("the node has >= {need} of NVMe space"),
}


def short(v: Verdict, lang: Lang = DEFAULT_LANG) -> str:
    """A table cell: 'fits', 'does not fit (host RAM)', 'fits if the node has >= 130.46 GiB of host RAM' (in
    `lang`)."""
    if v.fits:
        return translate(N_("fits"), lang)
    if v.fits is None:
        return condition(v, lang)
    bad = [lim for lim in v.limits if lim.fits is False]
    what = translate(N_(", "), lang).join(translate(RESOURCE_NAMES[lim.resource], lang) for lim in bad)
    return translate(N_("does not fit ({what})"), lang, what=what)


__all__ = ["RESOURCE_NAMES", "Limit", "LimitFields", "Resource", "Verdict", "VerdictFields", "condition", "condition_text", "gib_short", "gpu_headroom", "headline",
           "make_verdict", "reason_texts", "short", "verdict_data"]

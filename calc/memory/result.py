"""What the engine returns. All sizes are bytes (int); convert at the edge (calc.contract.units)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache, cached_property
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, computed_field

from calc.contract.i18n import DEFAULT_LANG, N_, Lang, Text, translate
from calc.memory.host import HostMemory
from calc.memory.verdict import Verdict

T = TypeVar("T")

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_states", "activations", "other")
CATEGORY_LABELS: dict[str, str] = {
    "parameters": N_("Parameters (weights on this GPU)"),
    "gradients": N_("Gradients"),
    "optimizer_states": N_("Optimizer states (and fp32 master weights)"),
    "activations": N_("Activations saved for backward"),
    "other": N_("Transients (logits/loss, optimizer temporaries, autocast copies, buffers, workspaces)"),
}
PHASES: dict[str, str] = {"forward": N_("forward"), "loss": N_("loss"), "backward": N_("backward"),
                          "optimizer": N_("optimizer"), "inference": N_("inference")}

# The names of a timeline's events (Timeline.events): the engine writes them from these, and
# event_text reads them back into translatable words (layer numbers are fields).
EVENTS: tuple[str, ...] = (
    N_("embedding"), N_("lm_head + loss"), N_("loss backward"), N_("receive output grad"), N_("embedding backward"),
    N_("optimizer step"), N_("final norm + lm_head"),
    # DeepSpeed ZeRO-0/1/2 (calc.memory.engine)
    N_("first gradient hook (buckets allocated)"), N_("gradient reduction (epilogue)"),
    N_("gradient norm (fp64 copy)"), N_("gradient partition flattened"), N_("gradients cast to fp32 and flattened"),
    # optimizer_in_backward (calc.memory.train_timeline)
    N_("lm_head's optimizer step (gradient hook)"), N_("embedding's optimizer step (gradient hook)"))
HOOK_STEP_HEAD, HOOK_STEP_EMBEDDING = EVENTS[-2:]
FORWARD_LAYER = N_("forward layer {layer}")
BACKWARD_LAYER = N_("backward layer {layer}")
RECOMPUTED_LAYER = N_("backward layer {layer} (recomputed)")
INFERENCE_LAYER = N_("layer {layer}")
REDUCE_SCATTER_LAYER = N_("reduce-scatter layer {layer}")  # FSDP2
ALL_GATHER_LAYER = N_("all-gather layer {layer}")  # FSDP2
EXPERTS_REDUCE_LAYER = N_("reduce-scatter layer {layer} experts")  # FSDP2 + expert parallelism
HOOK_STEP_LAYER = N_("optimizer step in layer {layer}'s gradient hook")  # optimizer_in_backward


@cache
def _layer_pattern(template: str) -> re.Pattern[str]:
    """An event template as a pattern: each {name} field a number (layer, token)."""
    return re.compile(re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", re.escape(template)) + "$")


# generation (calc.memory.generate)
PREFILL_HEAD = N_("prefill: final norm + lm_head (last position)")
DECODE_CACHE_UPDATE = N_("decode token {token}: cache update of layer {layer}")
DECODE_LOGITS = N_("decode token {token}: next-token logits")


@cache
def _event_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((_layer_pattern(t), t)
                 for t in (FORWARD_LAYER, BACKWARD_LAYER, RECOMPUTED_LAYER, INFERENCE_LAYER, REDUCE_SCATTER_LAYER,
                           ALL_GATHER_LAYER, EXPERTS_REDUCE_LAYER, HOOK_STEP_LAYER, DECODE_CACHE_UPDATE, DECODE_LOGITS))


def is_hook_step_layer(event: str) -> bool:
    """Whether `event` is a decoder layer's optimizer step in its gradient hook (HOOK_STEP_LAYER)."""
    return _layer_pattern(HOOK_STEP_LAYER).match(event) is not None


def event_text(event: str) -> Text:
    """A timeline event's name as translatable words ('backward layer 3' -> id 'backward layer {layer}').
    A name the engine did not write from EVENTS / the layer templates stays as it is (its own id)."""
    for pattern, msgid in _event_patterns():
        m = pattern.match(event)
        if m:
            return Text.model_construct(msgid=msgid, fields=m.groupdict())
    return Text.model_construct(msgid=event, fields={})


def phase_name(phase: str, lang: Lang = DEFAULT_LANG) -> str:
    """'backward' in `lang`."""
    return translate(PHASES.get(phase, phase), lang)


Words = tuple[str, dict[str, str]]  # a message id and its formatted fields (calc.contract.i18n), English until rendered


def words(key: str, msgid: str, **fields: object) -> dict[str, Any]:
    """Component(**words("formula", N_("{n} params x {b} B"), n=..., b=...)): the English text in `key`
    and the id with its fields beside it, kept for a translation without building a Text per estimate."""
    strs = {k: str(v) for k, v in fields.items()}
    return {key: msgid.format(**strs), f"{key}_words": (msgid, strs)}


class Component(BaseModel):
    """One term of the breakdown at the peak, with how it was computed."""

    model_config = ConfigDict(extra="forbid")

    key: str
    category: str = Field(description="one of CATEGORIES")
    label: str = Field(description="plain-language name")
    bytes: int
    formula: str = Field(description="the formula with this scenario's numbers")
    source: str = Field(description="paper, PyTorch/DeepSpeed behaviour or measurement it rests on")
    # message id + fields of a label / formula that has numbers in it (calc.memory.result.words); without
    # them the English text is its own id. Not part of the JSON (the English fields are).
    label_words: Any = Field(None, exclude=True, repr=False)
    formula_words: Any = Field(None, exclude=True, repr=False)

    def _render(self, text: str, held: Words | None, lang: Lang) -> str:
        if lang == DEFAULT_LANG:
            return text
        msgid, fields = held if held else (text, {})
        if "event" in fields:  # a timeline event's name is words too
            fields = {**fields, "event": event_text(fields["event"]).render(lang)}
        return translate(msgid, lang, **fields)

    def label_in(self, lang: Lang) -> str:
        """The label in `lang` (calc.contract.i18n)."""
        return self._render(self.label, self.label_words, lang)

    def formula_in(self, lang: Lang) -> str:
        """The formula in `lang`: its words translated, its numbers as they are."""
        return self._render(self.formula, self.formula_words, lang)

    def source_in(self, lang: Lang) -> str:
        return self._render(self.source, None, lang)


class Breakdown(BaseModel):
    """Live bytes per category at the peak; the five numbers sum to peak_allocated_bytes."""

    model_config = ConfigDict(extra="forbid")

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int

    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.other


class Timeline(BaseModel):
    """Live bytes per category at each event of a training step (columns of equal length)."""

    model_config = ConfigDict(extra="forbid")

    events: list[str] = Field(description="e.g. 'forward layer 3', 'loss', 'backward layer 3', 'optimizer step'")
    phases: list[str] = Field(description="forward | loss | backward | optimizer | inference")
    parameters: list[int]
    gradients: list[int]
    optimizer_states: list[int]
    activations: list[int]
    other: list[int]
    peak_index: int

    def total(self, i: int) -> int:
        return (self.parameters[i] + self.gradients[i] + self.optimizer_states[i]
                + self.activations[i] + self.other[i])


class DeviceTotal(BaseModel):
    """What nvidia-smi would show: peak allocated + context + workspaces + allocator reserve."""

    model_config = ConfigDict(extra="forbid")

    low: int
    expected: int
    high: int
    cuda_context_bytes: int
    workspace_bytes: int = Field(description="NCCL communicator buffers (outside the caching allocator; "
                                 "cuBLAS workspaces are inside peak allocated)")
    reserve_low_bytes: int
    reserve_expected_bytes: int
    reserve_high_bytes: int
    managed_bytes: int = Field(0, description="CUDA managed memory: bitsandbytes' paged optimizer states, outside "
                               "peak allocated, on the device until the driver pages them to host RAM")


class ModelSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    total_params: int
    trainable_params: int
    params_on_this_gpu: int
    num_layers: int
    layers_on_this_gpu: int


class Estimate(BaseModel):
    """The engine's answer for one scenario, per GPU (the worst rank)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSummary
    peak_allocated_bytes: int = Field(description="predicted torch.cuda.max_memory_allocated() over 3 steps")
    peak_phase: str
    peak_event: str
    peak_step: int = Field(description="training step (1-3) in which the peak falls")
    breakdown: Breakdown
    device_total_bytes: DeviceTotal
    gpu_memory_bytes: int | None = Field(None, description="the GPU's total memory, if a GPU is chosen")
    fits: bool | None = Field(None, description="verdict.fits: every limit (GPU, host RAM, NVMe) met; None when "
                              "one is unknown")
    headroom_bytes: int | None = Field(None, description="GPU memory - expected device total")
    cpu_ram_bytes: int = Field(0, description="host RAM per node needed for offloaded states/params")
    nvme_bytes: int = Field(0, description="NVMe space per node for offloaded states/params")
    host_memory: HostMemory = Field(default_factory=HostMemory, description="host RAM and NVMe part by part, per "
                                    "rank and per node (calc.memory.host): cpu_ram_bytes and nvme_bytes are its "
                                    "per-node totals")
    verdict: Verdict = Field(description="does it fit: GPU memory per GPU, host RAM and NVMe per node "
                             "(calc.memory.verdict); every page and the recommender read this")
    notes: list[str] = Field(default_factory=list)
    # The engine finds the peak without listing every moment or naming every term: the components and the
    # timeline are built from the same numbers when first read (cached properties; the JSON still has them,
    # after the other fields).
    _build_components: Callable[[], list[Component]] | None = PrivateAttr(None)
    _build_timeline: Callable[[], Timeline] | None = PrivateAttr(None)

    @computed_field(description="the breakdown at the peak as named terms, each with its formula and source; "
                    "they sum to peak_allocated_bytes")
    @cached_property
    def components(self) -> list[Component]:
        return _built(self._build_components)

    @computed_field(description="live bytes per category at each event")
    @cached_property
    def timeline(self) -> Timeline:
        return _built(self._build_timeline)

    def __eq__(self, other: object) -> bool:
        # the fields, the components and the timeline, not the builders (closures, new in every estimate)
        return (type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in type(self).model_fields)
                and self.components == other.components and self.timeline == other.timeline)

    def __getstate__(self) -> dict[str, Any]:
        # pickled (st.cache_data): the components and the timeline are built first (cached properties, in the
        # instance's __dict__), and the state is a copy's without the builders (closures, which do not pickle)
        self.components, self.timeline  # noqa: B018 - fills the cached properties
        bare = self.model_copy()
        bare._build_components = bare._build_timeline = None
        return BaseModel.__getstate__(bare)


def make_estimate(data: dict[str, Any], build_components: Callable[[], list[Component]],
                  build_timeline: Callable[[], Timeline], validate: bool = True) -> Estimate:
    """The Estimate of the engine's fields (`data`, every field given, as Estimate.model_validate reads them), its
    components and timeline built from the two functions when first read. Every estimate is validated
    (pydantic's own validation: about 7 us a new shape, against 19 us for model_construct's loop over the
    fields); `validate` is accepted for the engine's call and changes nothing."""
    est = Estimate.model_validate(data)
    est._build_components, est._build_timeline = build_components, build_timeline
    return est


def _built(build: Callable[[], T] | None) -> T:
    if build is None:
        raise ValueError("this estimate was not made by calc.memory.engine")
    return build()

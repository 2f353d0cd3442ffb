"""The recommender's request, its results and the search's fixed choices (pydantic in, pydantic out)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.architectures import default_lora_targets
from calc.contract.i18n import N_
from calc.contract.scenario import Checkpointing, LoraConfig, Offload, Scenario
from calc.memory.verdict import Verdict
from calc.recommend.phrase import Phrase
from calc.speed import SpeedAssumptions, SpeedEstimate

DEFAULT_SAFETY_MARGIN = 0.10  # keep 10% of the GPU free (the "10% safety margin" of the source articles)
MAX_MICRO_BATCH = 1024
CHECKPOINTING: tuple[tuple[Checkpointing, int], ...] = (
    (Checkpointing.none, 1), (Checkpointing.selective, 1), (Checkpointing.full, 4), (Checkpointing.full, 2),
    (Checkpointing.full, 1),
)
# (offload_optimizer, offload_params) pairs tried per ZeRO stage; parameters are offloaded only together
# with (or beyond) the optimizer states, which free 12 of the 16 bytes per parameter first.
# NVMe optimizer offload is ZeRO-3 only: DeepSpeed 0.19's ZeRO-1/2 optimizer treats any offload device as
# CPU ("ZeRO-1 and NVMe offload use the same CPU gradient path", runtime/zero/stage_1_and_2.py).
OFFLOADS_STAGE12 = ((Offload.none, Offload.none), (Offload.cpu, Offload.none))
OFFLOADS_STAGE3 = OFFLOADS_STAGE12 + ((Offload.nvme, Offload.none), (Offload.cpu, Offload.cpu),
                                      (Offload.nvme, Offload.cpu), (Offload.cpu, Offload.nvme),
                                      (Offload.nvme, Offload.nvme))
DEFAULT_LORA = LoraConfig(rank=16, alpha=32, targets="all-linear", base_weights="bf16")
DEFAULT_QLORA = LoraConfig(rank=16, alpha=32, targets="all-linear", base_weights="nf4")


def usable_bytes(gpu_memory_bytes: int, safety_margin: float = DEFAULT_SAFETY_MARGIN) -> int:
    """What a configuration may use of a GPU: its memory less the safety margin, in whole bytes (rounded down:
    a configuration fits when its expected device total is at most this)."""
    return int(gpu_memory_bytes * (1 - safety_margin))


def default_lora(family: str, base_weights: str = "bf16") -> LoraConfig:
    """DEFAULT_LORA / DEFAULT_QLORA for a model family (attention-only where all-linear is refused)."""
    base = DEFAULT_LORA if base_weights == "bf16" else DEFAULT_QLORA
    return base.model_copy(update={"targets": default_lora_targets(family), "base_weights": base_weights})


# ---- request and results ------------------------------------------------------------------------

class RecommendRequest(BaseModel):
    """What to search for: a scenario (model, hardware, sequence length, the user's method) and a
    target global batch."""

    model_config = ConfigDict(extra="forbid")

    scenario: Scenario
    # Bounds (calc.contract.limits' spirit): the largest published steps hold ~63M tokens (DeepSeek-V3, 15,360 x 4K);
    # 2^40 tokens and 2^32 sequences are 10,000x that.
    global_batch_tokens: int | None = Field(None, ge=1, le=2**40, description="tokens per optimizer step (all GPUs)")
    global_batch_size: int | None = Field(None, ge=1, le=2**32, description="sequences per optimizer step (all GPUs)")
    allow_method_change: bool = Field(
        False, description="full fine-tuning may fall back to 8-bit AdamW or pure bf16 states, and a LoRA scenario "
                           "to QLoRA, when the user's own method fits in no configuration (adapters are searched "
                           "beside full fine-tuning regardless)")
    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=0, lt=1,
                                 description="fraction of GPU memory kept free: fits when expected device total "
                                             "<= (1 - margin) x GPU memory")
    max_candidates: int = Field(10, ge=1, le=1000, description="per group")
    assumptions: SpeedAssumptions = Field(default_factory=SpeedAssumptions)

    @model_validator(mode="after")
    def _one_batch(self) -> RecommendRequest:
        if self.global_batch_tokens is not None and self.global_batch_size is not None:
            raise ValueError("give global_batch_tokens or global_batch_size, not both")
        return self


Group = Literal["full", "adapters"]
GROUP_LABELS: dict[str, str] = {
    "full": N_("Full fine-tuning (every weight trained)"),
    "adapters": N_("Adapters: LoRA / QLoRA (frozen base weights, small trainable adapters)"),
}
SLOW_FRACTION = 0.10  # slower than this fraction of the compute-bound rate: say so, and what would help


class Candidate(BaseModel):
    """One configuration that fits, with its memory, speed and verdict."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(description="1 = fastest within its group")
    group: Group = Field(description="full fine-tuning, or adapters (LoRA / QLoRA)")
    label: Phrase = Field(description="e.g. 'bf16-mixed, ZeRO-2, full checkpointing, micro-batch 4 x 8 accumulation'")
    scenario: Scenario
    method_change: bool = Field(description="uses 8-bit AdamW, pure bf16 states, LoRA or QLoRA instead of the "
                                            "requested method")
    global_batch_tokens: int
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    step_s: float
    peak_allocated_bytes: int
    device_total_expected_bytes: int
    device_total_high_bytes: int
    usable_bytes: int = Field(description="GPU memory x (1 - safety margin)")
    cpu_ram_bytes: int = Field(description="host RAM per node needed by offload")
    verdict: Verdict = Field(description="the engine's verdict for this scenario (calc.memory.verdict)")
    compute_bound_tokens_per_s_per_gpu: float = Field(
        description="the rate with communication and offload fully hidden behind compute")
    slow: Phrase | None = Field(None, description="why it runs far below the compute-bound rate, in words (None: it "
                                                "does not)")
    speed: SpeedEstimate


class SearchStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    combinations: int = Field(description="configurations enumerated (before micro-batch sizes)")
    pruned_dominated: int
    pruned_infeasible_group: int = Field(description="skipped: the group's most frugal member does not fit")
    pruned_bound: int = Field(description="never estimated: speed bound below the last kept candidate")
    memory_estimates: int = Field(description="calls to calc.memory.engine.estimate")
    speed_evaluations: int
    elapsed_s: float


class GroupResult(BaseModel):
    """One labelled group's answer: its best configurations are the candidates with this group."""

    model_config = ConfigDict(extra="forbid")

    group: Group
    label: Phrase
    explanation: Phrase = Field(description="why the group's winner wins, or why nothing in the group fits")
    best_tokens_per_s_per_gpu: float | None = None
    advice: list[Phrase] = Field(default_factory=list, description="when the winner is far below the hardware's "
                              "rate: what would make it practical (more GPUs, more host RAM, adapters)")


class Recommendation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidates: list[Candidate] = Field(description="each group's best configurations, fastest first per group")
    groups: list[GroupResult] = Field(description="the groups searched, full fine-tuning first")
    explanation: Phrase = Field(description="one sentence on the overall winner (and how the groups compare)")
    gpu_memory_bytes: int
    usable_bytes: int
    target_global_batch_sequences: int
    method_change: bool = Field(description="no configuration with the requested training method fits; the "
                                            "candidates change it")
    stats: SearchStats
    notes: list[Phrase] = Field(default_factory=list)


"""Host RAM and NVMe, part by part: what DeepSpeed's offload keeps in a node's memory for one rank, each part
with its source, and the node's total (the verdict's host RAM / NVMe need, calc.memory.verdict).

A pinned part is allocated through PyTorch's CUDA caching host allocator, which rounds every block up to a
power of two (ATen/core/CachingHostAllocator.h in torch 2.13: `c10::llvm::PowerOf2Ceil(size)` while the size is
under `pinned_max_round_threshold`, unbounded by default); DeepSpeed pins a buffer with
`get_accelerator().pin_memory(t)` = `t.pin_memory()`. The rounding is per tensor, so a buffer DeepSpeed allocates
per sub-group (ZeRO-3's fp32 gradients) is rounded per sub-group, a flat buffer once.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from calc.contract import parallel
from calc.contract.i18n import N_, T_, Text
from calc.contract.units import GiB

Where = Literal["host_ram", "nvme"]
# DeepSpeed's zero_optimization.sub_group_size default (runtime/zero/config.py: pp_int(1e9)); the exported
# ds_config leaves it there. ZeRO-3 cuts each rank's optimizer partition into sub-groups of at least this many
# elements (stage3.py _create_fp16_sub_groups: a sub-group closes once it reaches the size).
ZERO3_SUB_GROUP_ELEMENTS = 10**9
ZERO3 = "deepspeed/runtime/zero/stage3.py"
ZERO12 = "deepspeed/runtime/zero/stage_1_and_2.py"
CPU_ADAM = "deepspeed/ops/adam/cpu_adam.py"


class HostPart(NamedTuple):
    """One buffer (or one kind of buffer) that one rank keeps outside the GPU."""

    key: str
    label: str  # a message id (N_)
    requested_bytes: int  # what DeepSpeed asks for
    pinned_tensors: tuple[int, ...]  # the requested bytes of each pinned tensor (empty: pageable memory)
    where: Where
    source: str

    def allocated_bytes(self, target: str) -> int:
        """What the host gives: each pinned tensor rounded up by the caching host allocator (on CUDA)."""
        if not self.pinned_tensors:
            return self.requested_bytes
        return sum(parallel.pinned_bytes(n, target) for n in self.pinned_tensors)


class HostPartOut(BaseModel):
    """A HostPart as the estimate reports it (bytes per rank)."""

    model_config = ConfigDict(extra="forbid")

    key: str
    label: str
    where: Where
    requested_bytes: int = Field(description="per rank, as DeepSpeed asks for it")
    allocated_bytes: int = Field(description="per rank, as the host gives it (pinned: rounded up to powers of two)")
    pinned_tensors: int = Field(description="how many pinned tensors the part is made of (0: pageable memory)")
    source: str


class HostMemory(BaseModel):
    """Host RAM and NVMe per rank and per node, with their parts (all bytes)."""

    model_config = ConfigDict(extra="forbid")

    parts: list[HostPartOut] = Field(default_factory=list, description="what offload keeps, per rank")
    offload_ram_per_rank_bytes: int = Field(0, description="host RAM of the offload parts, per rank")
    model_load_per_rank_bytes: int = Field(0, description="host RAM one rank needs while it loads the model "
                                           "(from_pretrained, before DeepSpeed moves it)")
    ranks_per_node: int = 1
    ram_per_node_bytes: int = Field(0, description="ranks per node x the larger of the two (the model is loaded "
                                    "before the offload buffers exist); 0 without offload")
    nvme_per_rank_bytes: int = 0
    nvme_per_node_bytes: int = 0
    decided_by: Literal["offload", "model_load", "none"] = "none"


def zero3_sub_groups(partition_numels: list[int], sub_group: int = ZERO3_SUB_GROUP_ELEMENTS) -> list[int]:
    """Elements of each ZeRO-3 sub-group of one rank, from its parameters' partitions in order
    (stage3.py _create_fp16_sub_groups: add parameters until the sub-group holds `sub_group` elements)."""
    if sum(partition_numels) <= sub_group:
        return [sum(partition_numels)] if partition_numels else []
    out, held = [], 0
    for n in partition_numels:
        held += n
        if held >= sub_group:
            out.append(held)
            held = 0
    return out + [held] if held else out


def even_sub_groups(elements: int, sub_group: int = ZERO3_SUB_GROUP_ELEMENTS) -> list[int]:
    """Sub-groups of a partition whose parameter order is not modelled (adapters, tensor or pipeline parallel):
    full sub-groups and the rest."""
    full, rest = divmod(elements, sub_group)
    return [sub_group] * full + ([rest] if rest else [])


def zero12_parts(states_bytes: int, master_bytes: int, part: int, largest: int, weight_bytes: int,
                 on_cpu: bool) -> list[HostPart]:
    """ZeRO-1/2 CPU offload (stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__ with offload_optimizer
    pin_memory true, as the export writes it)."""
    return [
        HostPart("optimizer_states", N_("Adam states (m and v, fp32)"), states_bytes, (), "host_ram",
                 f"{CPU_ADAM}: state['exp_avg'] = torch.zeros_like(p.data, device=device): pageable"),
        HostPart("master", N_("fp32 master weights"), master_bytes,
                 (master_bytes,) if on_cpu else (), "host_ram" if on_cpu else "nvme",
                 f"{ZERO12}: single_partition_of_fp32_groups, pinned when pin_memory"),
        HostPart("fp32_grads", N_("fp32 gradients"), part * 4, (part * 4,), "host_ram",
                 f"{ZERO12}: single_grad_partition, pinned when pin_memory"),
        HostPart("bit16_weights", N_("16-bit copy of the updated weights"), part * weight_bytes,
                 (part * weight_bytes,), "host_ram", f"{ZERO12}: param_buffer_of_bit16_for_cpu_offload, pinned"),
        HostPart("grad_staging", N_("gradient staging buffer (largest parameter)"), largest * weight_bytes,
                 (largest * weight_bytes,), "host_ram", f"{ZERO12}: temp_grad_buffer_for_cpu_offload, pinned"),
    ]


def zero3_parts(states_bytes: int, master_bytes: int, sub_groups: list[int], master_element_bytes: int,
                grad_partition_bytes: int, on_cpu: bool) -> list[HostPart]:
    """ZeRO-3 optimizer offload (stage3.py with offload_optimizer pin_memory true): the fp32 master partitions
    are plain CPU copies (`converted.clone().detach()`), not pinned; each sub-group's fp32 gradient is pinned;
    the gradient partitions are one flat pinned buffer."""
    grads = [n * master_element_bytes for n in sub_groups]
    return [
        HostPart("optimizer_states", N_("Adam states (m and v, fp32)"), states_bytes, (),
                 "host_ram" if on_cpu else "nvme",
                 f"{CPU_ADAM}: state['exp_avg'] = torch.zeros_like(p.data, device=device): pageable"),
        HostPart("master", N_("fp32 master weights"), master_bytes, (),
                 "host_ram" if on_cpu else "nvme",
                 f"{ZERO3}: _create_fp32_partitions, converted.clone().detach(): pageable"),
        HostPart("fp32_grads", N_("fp32 gradients (a buffer per 1e9-element sub-group)"), sum(grads),
                 tuple(grads), "host_ram", f"{ZERO3}: initialize_optimizer_states, subgroup_gradient_buffer pinned"),
        HostPart("grad_partitions", N_("gradient partitions (one flat buffer)"),
                 grad_partition_bytes, (grad_partition_bytes,), "host_ram",
                 f"{ZERO3}: grad_partitions_flat_buffer, pinned when pin_memory"),
    ]


def param_offload_part(weight_bytes: int, on_cpu: bool) -> HostPart:
    """ZeRO-3 offload_param: the 16-bit partitions in a flat host buffer (stage3.py
    _create_param_groups_fp16_flat_cpu_memory, always pinned), or on NVMe."""
    return HostPart("params", N_("16-bit weight partitions (offload_param)"), weight_bytes,
                    (weight_bytes,) if on_cpu else (), "host_ram" if on_cpu else "nvme",
                    f"{ZERO3}: param_groups_fp16_flat_cpu_memory, pinned" if on_cpu else
                    "deepspeed/runtime/swap_tensor/partitioned_param_swapper.py")


def host_memory(parts: list[HostPart], load_per_rank: int, ranks_per_node: int, target: str) -> HostMemory:
    """The parts per rank and the node's totals: host RAM is needed only when something is offloaded, and is
    then the larger of the offload parts and the model's loading, times the ranks on the node."""
    out = [HostPartOut(key=p.key, label=p.label, where=p.where, requested_bytes=p.requested_bytes,
                       allocated_bytes=p.allocated_bytes(target), pinned_tensors=len(p.pinned_tensors),
                       source=p.source) for p in parts if p.requested_bytes]
    ram = sum(p.allocated_bytes for p in out if p.where == "host_ram")
    nvme = sum(p.allocated_bytes for p in out if p.where == "nvme")
    decided_by = "none" if not ram else "offload" if ram >= load_per_rank else "model_load"
    return HostMemory(parts=out, offload_ram_per_rank_bytes=ram, model_load_per_rank_bytes=load_per_rank,
                      ranks_per_node=ranks_per_node,
                      ram_per_node_bytes=max(ram, load_per_rank) * ranks_per_node if ram else 0,
                      nvme_per_rank_bytes=nvme, nvme_per_node_bytes=nvme * ranks_per_node, decided_by=decided_by)


def _gib(n_bytes: int) -> str:
    """Like calc.memory.verdict.gib_short (which this module sits below): '36 GiB', '32.85 GiB'."""
    text = f"{n_bytes / GiB:,.2f}"
    return (text[:-3] if text.endswith(".00") else text) + " GiB"


def part_words(p: HostPartOut) -> Text:
    """'34 GiB fp32 gradients (...) (32.12 GiB in 9 pinned buffers, each rounded up to a power of two)'."""
    label = Text(msgid=p.label)  # marked where the part is made (N_)
    if p.allocated_bytes == p.requested_bytes:
        return T_("{size} {what}", size=_gib(p.allocated_bytes), what=label)
    if p.pinned_tensors == 1:
        return T_("{size} {what} ({asked} pinned, rounded up to a power of two)", size=_gib(p.allocated_bytes),
                  what=label, asked=_gib(p.requested_bytes))
    return T_("{size} {what} ({asked} in {n} pinned buffers, each rounded up to a power of two)",
              size=_gib(p.allocated_bytes), what=label, asked=_gib(p.requested_bytes), n=str(p.pinned_tensors))


def host_ram_words(h: HostMemory) -> Text | None:
    """The node's host RAM need and its parts in one sentence (None without offload to host RAM):
    'the node needs 1,314 GiB of host RAM: 8 ranks x 164.3 GiB (64.24 GiB optimizer states ... + ...)'."""
    if not h.ram_per_node_bytes:
        return None
    ram = [p for p in h.parts if p.where == "host_ram"]
    parts = part_words(ram[-1])
    for p in reversed(ram[:-1]):
        parts = T_("{first} + {rest}", first=part_words(p), rest=parts)
    if h.decided_by == "model_load":
        return T_("the node needs {total} of host RAM: {ranks} x {load} while each loads the model (more than "
                  "its {offload} of offload buffers: {parts})", total=_gib(h.ram_per_node_bytes),
                  ranks=str(h.ranks_per_node), load=_gib(h.model_load_per_rank_bytes),
                  offload=_gib(h.offload_ram_per_rank_bytes), parts=parts)
    return T_("the node needs {total} of host RAM: {ranks} x {per_rank} ({parts})",
              total=_gib(h.ram_per_node_bytes), ranks=str(h.ranks_per_node), per_rank=_gib(h.offload_ram_per_rank_bytes),
              parts=parts)


__all__ = ["ZERO3_SUB_GROUP_ELEMENTS", "HostMemory", "HostPart", "HostPartOut", "even_sub_groups", "host_memory", "host_ram_words", "part_words",
           "param_offload_part", "zero12_parts", "zero3_parts", "zero3_sub_groups"]

"""Reasons for the figures a reader does not expect, worded once: the Calculator, the Recommend page's
waterfall and the Explain page all say them with these texts (a page translates them with ui.language.say).

- 16-bit mixed precision (bf16-mixed, fp16-mixed) needing more GPU memory than fp32 or PyTorch AMP: its fp32
  master weights sit beside the 16-bit ones, and DeepSpeed's optimizer casts each 16-bit gradient to an fp32
  copy for the step (calc.memory.per_param's `at_step` bytes).
- Offload needing more host RAM than the 16 bytes per parameter of fp32 master weights, gradients and Adam's two
  moments: PyTorch's pinned host allocator rounds each buffer up to a power of two
  (calc.contract.parallel.pinned_bytes), and DeepSpeed keeps 16-bit staging buffers on the host too.
"""

from __future__ import annotations

from calc.contract.i18n import N_, T_, Text
from calc.contract.scenario import Mode, Precision, Scenario
from calc.contract.variant import variant
from calc.memory.per_param import bytes_per_param
from calc.memory.result import Estimate

MIXED_ABOVE_AMP = N_("mixed precision keeps fp32 master weights beside the 16-bit ones, and DeepSpeed casts each "
                     "16-bit gradient to an fp32 copy for the optimizer step; fp32 and PyTorch AMP keep fp32 weights "
                     "and gradients only")
OFFLOAD_ABOVE_16_BYTES = N_("besides the 16 B per parameter of fp32 master weights, gradients and Adam's two moments, "
                            "PyTorch rounds each pinned host buffer up to a power of two and DeepSpeed keeps 16-bit "
                            "staging buffers on the host")
PLAIN_OFFLOAD_BYTES_PER_PARAM = 16  # fp32 master 4 + fp32 gradient 4 + Adam m 4 + Adam v 4

_AMP_OF = {Precision.bf16_mixed: Precision.amp_bf16, Precision.fp16_mixed: Precision.amp_fp16}


def mixed_above_amp(sc: Scenario, est: Estimate) -> Text | None:
    """When the scenario trains in 16-bit mixed precision and PyTorch AMP would need less GPU memory (the
    expected device total of the same scenario under AMP): the two figures and MIXED_ABOVE_AMP."""
    amp = _AMP_OF.get(sc.training.precision)
    if amp is None or sc.mode != Mode.train:
        return None
    from calc.memory.engine import estimate  # the engine imports this package's modules

    amp_sc = variant(sc, precision=amp)
    if amp_sc is None:  # AMP is not valid for this scenario: nothing to compare
        return None
    amp_est = estimate(amp_sc)
    if amp_est.device_total_bytes.expected >= est.device_total_bytes.expected:
        return None
    mine, theirs = bytes_per_param(sc), bytes_per_param(amp_sc)
    return T_("{precision} needs more than {amp} here ({mine} against {theirs} B per parameter at the optimizer "
              "step): {why}.", precision=sc.training.precision.value, amp=amp.value, mine=_bpp(mine.at_step),
              theirs=_bpp(theirs.at_step), why=Text(msgid=MIXED_ABOVE_AMP))


def offload_above_16_bytes(sc: Scenario, est: Estimate) -> Text | None:
    """When the host RAM that offload needs per node is above 16 B per trainable parameter that the node's
    ranks hold: the figure and OFFLOAD_ABOVE_16_BYTES."""
    if not est.cpu_ram_bytes:
        return None
    m = est.model
    here = m.trainable_params * m.params_on_this_gpu // max(m.total_params, 1)  # tensor / pipeline split
    ranks = sc.resolved_hardware().gpus_in_node()
    plain = PLAIN_OFFLOAD_BYTES_PER_PARAM * here * ranks // max(sc.data_parallel, 1)
    if est.cpu_ram_bytes <= plain:
        return None
    per_param = est.cpu_ram_bytes * max(sc.data_parallel, 1) / max(here * ranks, 1)
    return T_("{per_param} B per parameter of host RAM: {why}.", per_param=f"{per_param:.1f}",
              why=Text(msgid=OFFLOAD_ABOVE_16_BYTES))


def _bpp(x: float) -> str:
    return f"{x:g}"

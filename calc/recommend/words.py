"""The recommender's words: configuration labels, why the winner wins, speed comparisons as times
("about 30x faster"), and what would make a far-too-slow configuration practical."""

from __future__ import annotations

from calc.contract.scenario import Attention, Checkpointing, HardwareConfig, Mode, Offload, Optimizer
from calc.memory.engine import estimate
from calc.memory.verdict import condition_text, gib_short
from calc.recommend.combos import Combo
from calc.recommend.models import GROUP_LABELS, SLOW_FRACTION, Candidate, Group, GroupResult
from calc.recommend.phrase import T_, Phrase, joined, lower_first
from calc.recommend.state import Fit, Found, SearchState
from calc.speed import StepTime, estimate_speed


def _ckpt_words(c: Combo) -> Phrase:
    if c.ckpt == Checkpointing.none:
        return T_("no checkpointing")
    if c.ckpt == Checkpointing.selective:
        return T_("selective checkpointing")
    return T_("full checkpointing (1 in {every} layers)", every=c.every) if c.every > 1 else T_("full checkpointing")


def _device(o: Offload) -> str:
    return o.value.upper() if o == Offload.cpu else "NVMe"


def _off_words(c: Combo) -> Phrase:
    parts = []
    if c.off_opt != Offload.none:
        parts.append(T_("optimizer offload to {device}", device=_device(c.off_opt)))
    if c.off_par != Offload.none:
        parts.append(T_("parameter offload to {device}", device=_device(c.off_par)))
    return joined(" + ", parts)


def _method_words(c: Combo) -> str:
    if c.lora is not None:
        return ("QLoRA" if c.lora.base_weights in ("nf4", "fp4") else "int8 LoRA" if c.lora.quantized
                else "LoRA") + f" r{c.lora.rank}"
    if c.optimizer == Optimizer.adamw_8bit:
        return "8-bit AdamW"
    if c.optimizer.paged:
        return "paged 8-bit AdamW" if c.optimizer == Optimizer.paged_adamw_8bit else "paged AdamW"
    return ""


def short_label(c: Combo) -> Phrase:
    """'ZeRO-2 + full checkpointing' style name of a combination."""
    no_zero = T_("no ZeRO (DDP)") if c.dp > 1 else T_("no ZeRO")  # one data-parallel rank: nothing to replicate
    parts: list[object] = [f"ZeRO-{c.zero}" if c.zero else no_zero, _ckpt_words(c)]
    if c.off_opt != Offload.none or c.off_par != Offload.none:
        parts.append(_off_words(c))
    if c.tp > 1 or c.pp > 1:
        parts.append(f"TP {c.tp} x PP {c.pp}")
    m = _method_words(c)
    if m:
        parts.insert(0, m)
    return joined(" + ", parts)


def label(c: Combo, mb: int, ga: int, mode: Mode = Mode.train) -> Phrase:
    batch = T_("micro-batch {mb} x {ga} accumulation", mb=mb, ga=ga) if mode == Mode.train else T_("batch {mb}", mb=mb)
    if c.attention == Attention.sdpa:
        return T_("{precision}, {config}, {batch}", precision=c.precision.value, config=short_label(c), batch=batch)
    return T_("{precision}, {config}, eager attention, {batch}", precision=c.precision.value, config=short_label(c),
              batch=batch)


def _diff(a: Combo, b: Combo) -> Phrase:
    """How b differs from a, in words ('ZeRO-3', 'without checkpointing', ...)."""
    out: list[object] = []
    if a.zero != b.zero:
        out.append(f"ZeRO-{b.zero}" if b.zero else T_("without ZeRO"))
    if (a.ckpt, a.every) != (b.ckpt, b.every):
        out.append(T_("without checkpointing") if b.ckpt == Checkpointing.none else _ckpt_words(b))
    if (a.off_opt, a.off_par) != (b.off_opt, b.off_par):
        out.append(T_("with {offload}", offload=_off_words(b)) if _off_words(b) else T_("without offload"))
    if (a.tp, a.pp) != (b.tp, b.pp):
        out.append(f"TP {b.tp} x PP {b.pp}")
    if a.precision != b.precision:
        out.append(b.precision.value)
    if (a.optimizer, a.lora_key) != (b.optimizer, b.lora_key):
        out.append(_method_words(b) or T_("full fine-tuning"))
    return joined(" + ", out) if out else T_("the same")


def link_words(interconnect: str) -> Phrase:
    """calc.speed's name of a link ('NVLink', 'inter-node network'), translatable; 'none' is 'the links'."""
    return T_("the links") if interconnect == "none" else Phrase(interconnect)  # marked in calc.speed


def _why_slower(w: StepTime, o: StepTime, interconnect: Phrase) -> Phrase:
    d_comp, d_comm, d_off = o.compute_s - w.compute_s, o.communication_s - w.communication_s, o.offload_s - w.offload_s
    biggest = max((d_comp, "compute"), (d_comm, "comm"), (d_off, "offload"))[1]
    if biggest == "comm":
        return T_("more exposed communication over {link}", link=interconnect)
    if biggest == "offload":
        return T_("offload traffic and CPU Adam")
    return T_("recomputation") if o.executed_flops_per_token > w.executed_flops_per_token else T_("pipeline bubbles and smaller micro-batches")


def speed_ratio_words(ratio: float) -> Phrase:
    """A speed comparison a person can use: '12 % faster', 'about 2.5x faster', 'about 36x slower'."""
    if ratio <= 0:
        return T_("not comparable")
    faster = ratio >= 1
    r = ratio if faster else 1 / ratio
    if r < 1.005:
        return T_("about as fast")
    if r < 1.5:
        pct = f"{(r - 1) * 100:.0f}"
        return T_("{percent} % faster", percent=pct) if faster else T_("{percent} % slower", percent=pct)
    times = f"{r:.1f}" if r < 10 else f"{r:.0f}"
    return T_("about {times}x faster", times=times) if faster else T_("about {times}x slower", times=times)


def per_step_words(tokens: int) -> Phrase:
    """The batch a speed is quoted at, in the sentence that quotes it: 'at 262,144 tokens per step'."""
    return T_("at {tokens} tokens per step", tokens=f"{tokens:,}")


def per_gpu_at(tokens: int) -> Phrase:
    """A speed column's heading with its batch: 'tokens/s per GPU at 262,144 tokens per step'."""
    return T_("tokens/s per GPU {batch}", batch=per_step_words(tokens))


def _explain(s: SearchState, found: list[Found]) -> Phrase:
    w = found[0]
    tps = w.raw.tokens_per_s / s.hw.num_gpus
    est = w.fit.est
    need = est.device_total_bytes.expected if est else 0
    fields = dict(config=short_label(w.combo), tps=f"{tps:,.0f}", batch=per_step_words(w.raw.tokens_per_step),
                  need=gib_short(need), usable=gib_short(s.usable))
    cond = condition_text(est.verdict) if est is not None else None
    if cond is not None:  # a capacity is unknown: the condition, never "fits" (calc.memory.verdict)
        head = T_("{config}: the fastest configuration; it {condition} (set the node's figures under Hardware) "
                  "({tps} tokens/s per GPU {batch}, {need} of {usable} usable per GPU)", condition=cond, **fields)
    else:
        head = T_("{config}: the fastest configuration that fits ({tps} tokens/s per GPU {batch}, {need} of "
                  "{usable} usable per GPU)", **fields)
    clauses = []
    faster = [(ub, c, f) for ub, c, f in s.infeasible if ub > w.raw.tokens_per_s and f.estimable]
    if faster:
        def closeness(e):
            return (_ndiff(w.combo, e[1]), -e[0])
        ub, c, f = min(faster, key=closeness)
        clauses.append(T_("{change}: up to {ratio}, but {reason}", change=_diff(w.combo, c),
                          ratio=speed_ratio_words(ub / w.raw.tokens_per_s), reason=f.reason))
    alt = _slower_alternative(s, w)
    if alt is not None:
        o, oraw = alt
        ratio = oraw.tokens_per_s / w.raw.tokens_per_s
        if ratio > 0.999:
            clauses.append(T_("{change} would fit too and is as fast; the simpler setup is listed first",
                              change=_diff(w.combo, o)))
        else:
            clauses.append(T_("{change} would fit too but is {ratio} ({why})", change=_diff(w.combo, o),
                              ratio=speed_ratio_words(ratio),
                              why=_why_slower(w.raw, oraw, link_words(oraw.interconnect))))
    if clauses:
        return T_("{head}; {clauses}.", head=head, clauses=joined("; ", clauses))
    return T_("{head}.", head=head)


def _ndiff(a: Combo, b: Combo) -> int:
    return sum(getattr(a, k) != getattr(b, k) for k in ("precision", "ckpt", "every", "zero", "off_opt", "off_par",
                                                        "tp", "pp", "optimizer", "lora_key"))


def _slower_alternative(s: SearchState, w: Found) -> tuple[Combo, StepTime] | None:
    """The fastest other ZeRO stage (same everything else, same micro-batch) that fits."""
    best = None
    per = w.mb * w.ga if s.base.mode == Mode.train else w.mb
    for z in (0, 1, 2, 3):
        if z == w.combo.zero or (w.combo.pp > 1 and z > 1) or (w.combo.precision.is_amp and z > 0):
            continue
        oo = w.combo.off_opt if z >= 1 else Offload.none
        op = w.combo.off_par if z == 3 else Offload.none
        c = w.combo.with_(zero=z, off_opt=oo, off_par=op)
        if s.hw.num_gpus // (c.tp * c.pp) == 1 and z > 0 and oo == Offload.none and op == Offload.none:
            continue
        f = s.fit(c, w.mb, w.ga)
        if not f.ok:
            continue
        raw = s.speed(c, w.mb, per)
        if raw.tokens_per_s <= w.raw.tokens_per_s and (best is None or raw.tokens_per_s > best[1].tokens_per_s):
            best = (c, raw)
    return best


def _explain_none(s: SearchState) -> Phrase:
    tried = [(c, f) for _, c, f in s.infeasible] + s.frugal_failures
    tried = [(c, f) for c, f in tried if f.estimable]
    also = T_(" (8-bit AdamW, pure bf16 and QLoRA included)") if s.tried_method_change else ""
    if not tried:
        return T_("nothing fits{also}: no valid configuration for this model and hardware.", also=also)
    c, f = _least_need(tried)
    return T_("nothing fits{also}: the smallest configuration tried ({config}, micro-batch 1) {reason}.", also=also,
              config=short_label(c), reason=f.reason)


# ---- far below the hardware's rate, and what would help ------------------------------------------

def compute_bound_per_gpu(raw: StepTime, num_gpus: int) -> float:
    """Tokens/s per GPU if communication and offload were fully hidden behind compute."""
    return raw.tokens_per_step / raw.compute_s / num_gpus if raw.compute_s > 0 else 0.0


def slow_words(raw: StepTime, tokens_per_s_per_gpu: float, bound: float) -> Phrase | None:
    """None, or why the configuration runs under SLOW_FRACTION of its compute-bound rate."""
    if bound <= 0 or tokens_per_s_per_gpu >= SLOW_FRACTION * bound:
        return None
    waits = (T_("offload traffic (PCIe / NVMe transfers and the CPU optimizer step)") if raw.offload_s >= raw.communication_s
             else T_("communication over {link}", link=Phrase(raw.interconnect)))
    return T_("{tps} tokens/s per GPU is {share} of the {bound} tokens/s the GPUs' compute allows: most of each "
              "{step} s step waits on {waits}", tps=f"{tokens_per_s_per_gpu:,.0f}",
              share=f"{tokens_per_s_per_gpu / bound:.0%}", bound=f"{bound:,.0f}", step=f"{raw.step_s:,.0f}",
              waits=waits)


def _gpus_without_offload(s: SearchState, w: Found) -> tuple[int, float | None] | None:
    """The fewest GPUs of this kind (whole nodes, doubling) on which the winner's method fits with ZeRO-3
    and no offload, micro-batch 1 and full checkpointing, and the speed there; None if over 4,096."""
    hw = s.base.resolved_hardware()
    per_node = hw.gpus_in_node()
    n = max(per_node, hw.num_gpus * 2)
    while n <= 4096:
        dp = n
        ga = max(1, round(s.target_seqs / dp)) if s.base.mode == Mode.train else 1
        try:
            sc = s.base.variant(hardware=HardwareConfig(
                gpu=hw.gpu, num_gpus=n, gpus_per_node=per_node, cpu_ram_bytes=hw.cpu_ram_bytes,
                nvme_bytes=hw.nvme_bytes)).with_training(
                zero_stage=3, offload_optimizer=Offload.none, offload_params=Offload.none, tensor_parallel=1,
                pipeline_parallel=1, sequence_parallel=False, activation_checkpointing=Checkpointing.full,
                checkpoint_every=1, micro_batch_size=1, gradient_accumulation_steps=ga)
        except ValueError:
            return None
        est = estimate(sc)
        if est.device_total_bytes.expected <= s.usable and est.verdict.fits is not False:
            try:
                return n, estimate_speed(sc, s.assumptions).tokens_per_s_per_gpu
            except ValueError:
                return n, None
        n *= 2
    return None


def _advice(s: SearchState, found: list[Found], others: list[tuple[Group, float]]) -> list[Phrase]:
    """For a winner far below its compute-bound rate: what would make it practical, with numbers."""
    w = found[0]
    tps = w.raw.tokens_per_s / s.hw.num_gpus
    bound = compute_bound_per_gpu(w.raw, s.hw.num_gpus)
    why = slow_words(w.raw, tps, bound)
    if why is None:
        return []
    out = [T_("Far slower than this hardware allows: {why}.", why=why)]
    more = _gpus_without_offload(s, w) if (w.combo.off_opt != Offload.none or w.combo.off_par != Offload.none) \
        else None
    gpu_name = s.hw.gpu.name.removeprefix("NVIDIA ")
    if more is not None:
        n, speed = more
        fields = dict(n=n, gpu=gpu_name, times=n // s.hw.num_gpus)
        out.append(T_("More GPUs: {n} x {gpu} ({times}x this hardware) hold everything on the GPUs with ZeRO-3 and "
                      "no offload, at about {tps} tokens/s per GPU.", tps=f"{speed:,.0f}", **fields) if speed else
                   T_("More GPUs: {n} x {gpu} ({times}x this hardware) hold everything on the GPUs with ZeRO-3 and "
                      "no offload.", **fields))
    ram = [(ub, c, f) for ub, c, f in s.infeasible if f.host_only and f.est is not None
           and ub > w.raw.tokens_per_s]
    if ram:
        ub, c, f = max(ram, key=lambda e: e[0])
        out.append(T_("More host RAM: {config} could run at up to {tps} tokens/s per GPU but {reason}.",
                      config=short_label(c), tps=f"{ub / s.hw.num_gpus:,.0f}", reason=f.reason))
    for group, best in others:  # only the full fine-tuning group gets advice; its other group is adapters
        if best > tps * 1.5 and group == "adapters":
            out.append(T_("Adapters: LoRA / QLoRA train {ratio} here ({tps} tokens/s per GPU; see the adapters "
                          "group).", ratio=speed_ratio_words(best / tps), tps=f"{best:,.0f}"))
    return out


def group_result(group: Group, s: SearchState, found: list[Found],
                 searched: list[tuple[Group, SearchState, list[Found]]]) -> GroupResult:
    """The group's explanation, best speed and (when it is far below the hardware's rate) advice."""
    if not found:
        return GroupResult(group=group, label=Phrase(GROUP_LABELS[group]), explanation=_explain_none(s))
    others = [(g, f[0].raw.tokens_per_s / o.hw.num_gpus) for g, o, f in searched if g != group and f]
    return GroupResult(group=group, label=Phrase(GROUP_LABELS[group]), explanation=_explain(s, found),
                       best_tokens_per_s_per_gpu=found[0].raw.tokens_per_s / s.hw.num_gpus,
                       advice=_advice(s, found, others if group == "full" else []))


def overall_explanation(groups: list[GroupResult], cands: list[Candidate]) -> Phrase:
    """The overall winner in a sentence, and how the groups compare."""
    fitting = [g for g in groups if g.best_tokens_per_s_per_gpu]
    if not fitting:
        return joined(" ", [g.explanation for g in groups])
    best = max(fitting, key=lambda g: g.best_tokens_per_s_per_gpu or 0)
    text = best.explanation
    if len(groups) == 2:
        full, adapters = groups
        if full.best_tokens_per_s_per_gpu and adapters.best_tokens_per_s_per_gpu:
            ratio = adapters.best_tokens_per_s_per_gpu / full.best_tokens_per_s_per_gpu
            text = T_("{explanation} Adapters (LoRA / QLoRA) train {ratio} than full fine-tuning here ({adapters} vs "
                      "{full} tokens/s per GPU).", explanation=text, ratio=speed_ratio_words(ratio),
                      adapters=f"{adapters.best_tokens_per_s_per_gpu:,.0f}",
                      full=f"{full.best_tokens_per_s_per_gpu:,.0f}")
        elif adapters.best_tokens_per_s_per_gpu:
            text = T_("Full fine-tuning does not fit this hardware; {explanation}", explanation=lower_first(text))
    return text


def _least_need(tried: list[tuple[Combo, Fit]]) -> tuple[Combo, Fit]:
    """The first of `tried` that needs the least memory, estimating only the fits whose states floor is not
    above the least need known: the others need more (the floor is a lower bound) and cannot be it."""
    least = 1 << 62
    for _, f in sorted(tried, key=lambda e: e[1].need_floor):
        if f.need_floor > least:
            break
        f.est  # noqa: B018 - settles a floor into the exact need
        least = min(least, f.need_floor)
    return min(tried, key=lambda e: e[1].need_floor)


"""The search: which configurations fit every limit (GPU memory with a safety margin, host RAM, NVMe),
fastest first, in two groups: full fine-tuning and adapters (LoRA / QLoRA).

The search enumerates precision, checkpointing granularity, attention kernel, ZeRO stage, offload
targets, tensor/pipeline sizes and the micro-batch / gradient-accumulation split of a requested global
batch (plus 8-bit AdamW, LoRA and QLoRA when the request allows changing the training method), keeps
what fits on the GPU with a safety margin, and ranks by the speed model (calc.speed).

It stays fast by never estimating what cannot win (branch and bound):
1. Speed needs no memory estimate (~10 us), so every combination gets an upper bound first: its best
   tokens/s over all micro-batch sizes. Combinations are visited best bound first, and the search stops
   once `max_candidates` fitting results are at least as fast as the next bound. A combination's splits
   are evaluated only when it could be next (`_Ranking`): until then a rate from one split that bounds them
   all stands in for their best (calc.speed.split_rate_bound: in training, the terms that take the same
   seconds at every split, such as the compute, the tensor-parallel all-reduces and the CPU Adam step).
2. Memory is monotone in the micro-batch, so the largest micro-batch that fits is found by bisection
   over the divisors of the per-replica batch (log2 of their count estimates, not all of them).
3. Dominated combinations are skipped without an estimate: eager attention (more memory and slower than
   SDPA/FlashAttention in every case), NVMe offload where CPU offload fits (same GPU memory, slower),
   ZeRO stages on one data-parallel rank without offload (nothing to shard), and whole groups whose most
   frugal member (full checkpointing, everything offloaded, micro-batch 1) does not fit.
4. Every memory estimate is cached by its exact configuration.
5. A configuration whose weights and optimizer states alone (calc.memory.states.model_states, a few tens of
   microseconds) exceed the usable memory is known not to fit without an estimate: every moment of a training
   step keeps them on the GPU, the optimizer step among them, so the estimate's peak is at least their sum.
   Its estimate, and with it the exact need an explanation quotes, is computed only if an explanation
   reads it (calc.recommend.state's `Fit.est`, `Fit.reason`). So is one whose states fit but not with the
   activations its first pipeline stage holds at the end of its forward
   (calc.memory.activations.forward_activations_floor, a row of every training timeline; a fit of it asks the
   same block profiles the estimate would). A group whose most frugal member is such a configuration is not
   ranked at all (`search_combos`).
"""


from __future__ import annotations

import heapq
import time
from typing import Any

from calc.contract.scenario import Attention, Mode, Offload, Scenario
from calc.recommend.combos import (
    Combo,
    complexity,
    enumerate_combos,
    groups_for,
    is_method_change,
    methods_for,
    scenario_for,
)
from calc.recommend.models import Candidate, Group, Recommendation, RecommendRequest, SearchStats, usable_bytes
from calc.recommend.phrase import T_, Phrase
from calc.recommend.state import Found, SearchState
from calc.recommend.words import compute_bound_per_gpu, group_result, label, overall_explanation, slow_words
from calc.speed import StepTime, hardware_of, split_rate_bound, to_estimate


def search_combos(s: SearchState, combos: list[Combo], k: int) -> list[Found]:
    """`combos`' fastest fitting configurations (up to 4k, fastest first). A group whose most frugal member
    does not fit on its model states alone is skipped unranked (no speed evaluations: `_rank`); where then
    nothing fits, the explanation quotes the smallest configuration tried in the order they were tried
    (calc.recommend.words), so the search visits again, skipped groups included, from the fits
    already made (no estimate is repeated), exactly as it would have without skipping."""
    mark = s.mark()
    ranking, skipped = _rank(s, combos, skip_doomed=True)
    found = _visit(s, ranking, k)
    if not found and skipped:
        s.rewind(mark)
        found = _visit(s, _rank(s, combos, skip_doomed=False)[0], k)
    return found


_Entry = tuple[float, Combo, int, list[int], dict[int, StepTime]]  # (best tokens/s, combo, per, micro-batches, speeds)


class _Ranking:
    """Combinations fastest first: by their best tokens/s over the micro-batch splits, then the simpler setup,
    then the order enumerated. A combination's splits are evaluated only when it could be next: until then it
    is ranked by a bound from its first split (calc.speed.split_rate_bound), an upper bound of
    its best, so the order in which combinations come out is the order of their exact best speeds."""

    def __init__(self, s: SearchState) -> None:
        self.s = s
        self.heap: list[tuple] = []

    def __len__(self) -> int:
        return len(self.heap)

    def add(self, c: Combo, per: int, mbs: list[int]) -> None:
        first = self.s.speed(c, mbs[0], per)
        if len(mbs) == 1:
            value, raws = first.tokens_per_s, {mbs[0]: first}
        else:
            value, raws = split_rate_bound(first, self.s.hw.num_gpus // (c.tp * c.pp) * c.tp * c.pp,
                                           self.s.assumptions, self.s.base.mode == Mode.train), None
        heapq.heappush(self.heap, (-value, complexity(c), len(self.heap), c, per, mbs, raws))

    def next(self, floor: float | None = None) -> _Entry | None:
        """The next combination, or None when none is left or none can be faster than `floor`."""
        while self.heap and (floor is None or -self.heap[0][0] > floor):
            neg, cx, i, c, per, mbs, raws = heapq.heappop(self.heap)
            if raws is not None:
                return -neg, c, per, mbs, raws
            raws = {mb: self.s.speed(c, mb, per) for mb in mbs}
            heapq.heappush(self.heap, (-max(r.tokens_per_s for r in raws.values()), cx, i, c, per, mbs, raws))
        return None


def _rank(s: SearchState, combos: list[Combo], skip_doomed: bool) -> tuple[_Ranking, int]:
    """Every combination worth visiting, ranked; and how many were skipped because their group is doomed
    (`SearchState.doomed`)."""
    ranking = _Ranking(s)
    skipped = 0
    for c in combos:
        s.stats["combinations"] += 1
        if c.attention == Attention.eager and s.base.spec.sdpa_supported:
            s.stats["pruned_dominated"] += 1  # SDPA: same FLOPs, no S x S tensors in HBM
            continue
        per, mbs = s.split(c)
        if skip_doomed and s.doomed(s.frugal(c), mbs[0], per // mbs[0] if s.base.mode == Mode.train else 1):
            s.stats["pruned_infeasible_group"] += 1
            skipped += 1
            continue
        ranking.add(c, per, mbs)
    return ranking, skipped


def _visit(s: SearchState, ranking: _Ranking, k: int) -> list[Found]:
    """Branch and bound over the ranked combinations (see the module's docstring)."""
    found: list[Found] = []
    group_ok: dict[Combo, bool] = {}
    ram_only: set[Combo] = set()
    while (entry := ranking.next(found[k - 1].raw.tokens_per_s if len(found) >= k else None)) is not None:
        ub, c, per, mbs, raws = entry
        ga0 = per // mbs[0] if s.base.mode == Mode.train else 1
        if c.off_opt == Offload.nvme or c.off_par == Offload.nvme:
            cpu_twin = c.with_(off_opt=Offload.cpu if c.off_opt != Offload.none else Offload.none,
                               off_par=Offload.cpu if c.off_par != Offload.none else Offload.none)
            if (cpu_twin, mbs[0], ga0) in s.tried and cpu_twin not in ram_only:
                s.stats["pruned_dominated"] += 1  # same GPU memory as the CPU twin, slower: only for lack of RAM
                continue
        fr = s.frugal(c)
        if fr not in group_ok:
            f_fr = s.fit(fr, mbs[0], ga0)
            # an invalid frugal member (LitGPT's path has no checkpointing) leaves each member to be judged
            group_ok[fr] = f_fr.ok or f_fr.host_only or f_fr.invalid
            if not group_ok[fr]:
                s.frugal_failures.append((fr, f_fr))
        if not group_ok[fr]:
            s.stats["pruned_infeasible_group"] += 1
            continue
        f0 = s.fit(c, mbs[0], ga0)
        if not f0.ok:
            if f0.host_only:
                ram_only.add(c)
            s.infeasible.append((ub, c, f0))
            continue
        found.append(_largest_fitting(s, c, per, mbs, raws))
        found.sort(key=lambda x: (-x.raw.tokens_per_s, complexity(x.combo)))
        del found[max(k, 1) * 4:]  # keep a few spares for the explanation
    s.stats["pruned_bound"] += len(ranking)
    return found


def _largest_fitting(s: SearchState, c: Combo, per: int, mbs: list[int], raws: dict[int, StepTime]) -> Found:
    """c at its fastest micro-batch among those up to the largest that fits (bisection: memory grows with
    the micro-batch), given that the smallest fits."""
    lo, hi = 0, len(mbs) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ga = per // mbs[mid] if s.base.mode == Mode.train else 1
        if s.fit(c, mbs[mid], ga).ok:
            lo = mid
        else:
            hi = mid - 1
    best = max(mbs[: lo + 1], key=lambda m: (raws[m].tokens_per_s, m))
    ga = per // best if s.base.mode == Mode.train else 1
    f = s.fit(c, best, ga)
    if not f.ok:  # memory not monotone here (e.g. accumulation on/off): fall back to the largest that fit
        best = mbs[lo]
        ga = per // best if s.base.mode == Mode.train else 1
        f = s.fit(c, best, ga)
    return Found(c, best, ga, raws[best], f)


def _target_sequences(req: RecommendRequest) -> int:
    t = req.scenario.training
    if req.global_batch_size is not None:
        return req.global_batch_size
    if req.global_batch_tokens is not None:
        return max(1, round(req.global_batch_tokens / t.seq_len))
    if req.scenario.mode == Mode.inference:
        return t.micro_batch_size
    return req.scenario.global_batch_sequences  # the scenario's global batch: one source for every page


def new_search(req: RecommendRequest) -> SearchState:
    sc = req.scenario
    hw = hardware_of(sc)
    rhw = sc.resolved_hardware()
    mem = rhw.memory_bytes or hw.gpu.memory_bytes
    usable = usable_bytes(mem, req.safety_margin)
    return SearchState(sc, hw, req.assumptions, usable, mem, rhw.cpu_ram_bytes, rhw.nvme_bytes, _target_sequences(req))


def recommend(req: RecommendRequest | Scenario, **kw: Any) -> Recommendation:
    """Each group's fastest configurations that fit every limit (see calc.recommend's docstring)."""
    if isinstance(req, Scenario):
        req = RecommendRequest(scenario=req, **kw)
    return recommend_groups(req)


def recommend_groups(req: RecommendRequest, until_own_method_fits: bool = False) -> Recommendation:
    """`recommend`, each group a search of its own in groups_for's order. until_own_method_fits: stop after the
    first group that finds a configuration with the scenario's own method (no method change), whose answer is
    the same as in the whole search; the model x hardware table's cells search the adapters only where full
    fine-tuning does not fit."""
    t0 = time.perf_counter()
    sc, k = req.scenario, req.max_candidates
    searched: list[tuple[Group, SearchState, list[Found]]] = []
    notes: list[Phrase] = []
    for group in groups_for(sc):
        s = new_search(req)
        found = search_combos(s, enumerate_combos(sc, methods_for(sc, group, widen=False)), k)
        wider = methods_for(sc, group, widen=True)
        if not found and wider and req.allow_method_change:
            s.tried_method_change = True
            found = search_combos(s, enumerate_combos(sc, wider), k)
        elif not found and wider:
            notes.append(T_("full: nothing fits; set allow_method_change to consider 8-bit AdamW or pure bf16 "
                            "states") if group == "full" else
                         T_("adapters: nothing fits; set allow_method_change to consider QLoRA"))
        searched.append((group, s, found))
        if until_own_method_fits and found and not s.tried_method_change:
            break
    cands = [_candidate(i + 1, f, s, group) for group, s, found in searched for i, f in enumerate(found[:k])]
    groups = [group_result(group, s, found, searched) for group, s, found in searched]
    stats = {key: sum(s.stats[key] for _, s, _ in searched) for key in searched[0][1].stats}
    first = searched[0][1]
    rec = Recommendation(
        candidates=cands, groups=groups, explanation=overall_explanation(groups, cands),
        gpu_memory_bytes=first.gpu_memory, usable_bytes=first.usable, target_global_batch_sequences=first.target_seqs,
        method_change=bool(cands) and all(c.method_change for c in cands),
        stats=SearchStats(**stats, elapsed_s=time.perf_counter() - t0), notes=notes)
    for _, s, _ in searched:
        s.release()
    return rec


def _candidate(rank: int, f: Found, s: SearchState, group: Group) -> Candidate:
    sc = scenario_for(s.base, f.combo, f.mb, f.ga)
    est = f.fit.est
    assert est is not None
    sp = to_estimate(s.explained(f), s.hw, s.assumptions)
    bound = compute_bound_per_gpu(f.raw, s.hw.num_gpus)
    return Candidate(
        rank=rank, group=group, label=label(f.combo, f.mb, f.ga, s.base.mode), scenario=sc,
        method_change=is_method_change(f.combo, s.base.training), global_batch_tokens=sp.tokens_per_step,
        tokens_per_s_per_gpu=sp.tokens_per_s_per_gpu, tokens_per_s=sp.tokens_per_s, step_s=sp.step_s,
        peak_allocated_bytes=est.peak_allocated_bytes, device_total_expected_bytes=est.device_total_bytes.expected,
        device_total_high_bytes=est.device_total_bytes.high, usable_bytes=s.usable, cpu_ram_bytes=est.cpu_ram_bytes,
        verdict=est.verdict, compute_bound_tokens_per_s_per_gpu=bound,
        slow=slow_words(f.raw, sp.tokens_per_s_per_gpu, bound), speed=sp)


def fastest_fitting(sc: Scenario) -> Candidate | None:
    """The configuration to show for `sc`'s hardware: the fastest with `sc`'s own training method when
    one fits at a practical speed (not `slow`), else the fastest of all (adapters when full fine-tuning
    fits only offload-bound, or not at all); None when nothing fits. The batch target is `sc`'s global batch."""
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=1))
    if not rec.candidates:
        return None
    own = [c for c in rec.candidates if not c.method_change and c.slow is None]
    return max(own or rec.candidates, key=lambda c: c.tokens_per_s_per_gpu)

"""The search's state: what it has tried, what fits and why not (`Fit`), the step times it evaluated and the
lower bounds of memory it took (the states floor), so that no estimate or step time is made twice in a search.
calc.recommend.search drives it; calc.recommend.words reads it to explain the answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from calc.contract import parallel
from calc.contract.scenario import Attention, Checkpointing, Mode, Offload, Scenario
from calc.memory.activations import forward_activations_floor
from calc.memory.engine import estimate
from calc.memory.result import Estimate
from calc.memory.states import model_states
from calc.memory.verdict import gib_short, reason_texts
from calc.recommend.combos import Combo, light_config, scenario_for, small_divisors
from calc.recommend.models import MAX_MICRO_BATCH
from calc.recommend.phrase import T_, Phrase, joined
from calc.speed import SpeedAssumptions, SpeedHardware, StepTime, step_time

Key = tuple[Combo, int, int]  # a combination, its micro-batch and its accumulation steps (or sequences per replica)


class Fit:
    """Whether a configuration fits, its estimate (None for an invalid scenario) and, when it does not fit,
    why (a Phrase). A fit decided by the states floor (`SearchState.fit`) does not fit for GPU memory; its
    estimate and reason are computed when first read, by `settle`."""

    __slots__ = ("_est", "_reason", "floor", "invalid", "ok", "settle")

    def __init__(self, est: Estimate | None, ok: bool, reason: Phrase | str = "", floor: int = 0,
                 settle: Callable[[], Fit] | None = None, invalid: bool = False) -> None:
        self._est, self.ok, self._reason, self.floor, self.settle = est, ok, reason, floor, settle
        self.invalid = invalid  # no valid scenario: says nothing about its group's other members

    def _settled(self) -> None:
        if self.settle is not None:
            exact, self.settle = self.settle(), None
            assert not exact.ok, "the states floor said it does not fit"
            self._est, self._reason = exact._est, exact._reason

    @property
    def est(self) -> Estimate | None:
        self._settled()
        return self._est

    @property
    def reason(self) -> Phrase | str:
        self._settled()
        return self._reason

    @property
    def estimable(self) -> bool:
        """There is an estimate (the scenario is valid), computed or not yet."""
        return self.settle is not None or self._est is not None

    @property
    def host_only(self) -> bool:
        """Fits the GPU, not the host RAM or NVMe (the verdict's "offload needs ..." sentence)."""
        return self.settle is None and self._reason.startswith("offload")

    @property
    def need_floor(self) -> int:
        """The device total it needs (expected), or while unsettled a lower bound of it (the states floor)."""
        if self.settle is not None:
            return self.floor
        return self._est.device_total_bytes.expected if self._est is not None else 1 << 62


@dataclass
class Found:
    """A fitting configuration: the combination at its fastest micro-batch that fits, its step time and fit."""

    combo: Combo
    mb: int
    ga: int
    raw: StepTime
    fit: Fit


@dataclass
class SearchState:
    """One group's search: the request's base scenario and limits, and everything asked so far."""

    base: Scenario
    hw: SpeedHardware
    assumptions: SpeedAssumptions
    usable: int
    gpu_memory: int
    cpu_ram: int | None
    nvme: int | None
    target_seqs: int
    stats: dict[str, int] = field(default_factory=lambda: dict(
        combinations=0, pruned_dominated=0, pruned_infeasible_group=0, pruned_bound=0, memory_estimates=0,
        speed_evaluations=0))
    cache: dict[Key, Fit] = field(default_factory=dict)
    floors: dict[tuple, int] = field(default_factory=dict)  # states_floor by Combo.states_key
    speeds: dict[Key, StepTime] = field(default_factory=dict)
    infeasible: list[tuple[float, Combo, Fit]] = field(default_factory=list)
    frugal_failures: list[tuple[Combo, Fit]] = field(default_factory=list)
    tried: set[Key] = field(default_factory=set)  # what fit() was asked, in this visit's order
    tried_method_change: bool = False
    frugals: dict[Combo, Combo] = field(default_factory=dict)  # frugal_member by combination (asked when ranking and
    # visiting)

    def release(self) -> None:
        """Drop what refers back to the search (a deferred Fit's settle closure holds it): a finished search is
        then freed at once by reference counting. Left in that cycle, its ~11,000 objects (fits, step times and
        their terms) waited for the cyclic collector, which in the app scanned them with everything else."""
        self.cache.clear()
        self.infeasible.clear()
        self.frugal_failures.clear()

    def mark(self) -> tuple:
        """Where the search stands, for `rewind` (the fits made stay cached)."""
        return dict(self.stats), len(self.infeasible), len(self.frugal_failures), set(self.tried)

    def rewind(self, mark: tuple) -> None:
        stats, n_infeasible, n_frugal, tried = mark
        self.stats = {**stats, "memory_estimates": self.stats["memory_estimates"],
                      "speed_evaluations": self.stats["speed_evaluations"]}
        del self.infeasible[n_infeasible:], self.frugal_failures[n_frugal:]
        self.tried = set(tried)

    def frugal(self, c: Combo) -> Combo:
        fr = self.frugals.get(c)
        if fr is None:
            fr = self.frugals[c] = frugal_member(c, self.base.training.sharding != "fsdp2",
                                                 self.base.spec.sdpa_supported)
        return fr

    def doomed(self, fr: Combo, mb: int, ga: int) -> bool:
        """The group of its most frugal member `fr` cannot fit: its model states alone exceed the usable memory (so
        `fit` would say so without an estimate). A frugal member that is no valid scenario (LitGPT's path has no
        checkpointing) dooms nothing: each member is then judged on its own."""
        floor = self.floors.get(fr.states_key())
        if floor is None:
            try:
                sc = scenario_for(self.base, fr, mb, ga)
            except (ValidationError, ValueError):
                return False
            floor = self.floors[fr.states_key()] = states_floor(sc)
        return floor > self.usable

    def split(self, c: Combo) -> tuple[int, list[int]]:
        """(sequences per data-parallel replica, the micro-batches that divide them; powers of 2 in inference)."""
        dp = self.hw.num_gpus // (c.tp * c.pp)
        if self.base.mode == Mode.inference:
            per = max(self.target_seqs, 1)
            return per, [m for m in (1 << i for i in range(11)) if m <= per] or [1]
        per = max(1, round(self.target_seqs / dp))
        return per, list(small_divisors(per, MAX_MICRO_BATCH))

    def speed(self, c: Combo, mb: int, per: int) -> StepTime:
        """Step time for ranking: numbers only (no formulas: thousands per search); remembered, for a visit
        again (calc.recommend.search.search_combos)."""
        key = (c, mb, per)
        raw = self.speeds.get(key)
        if raw is None:
            self.stats["speed_evaluations"] += 1
            ga = per // mb if self.base.mode == Mode.train else 1
            raw = self.speeds[key] = step_time(self.base.spec, light_config(c, mb, ga, self.base.training.seq_len, self.base.training.framework),
                                               self.hw, self.base.mode, self.assumptions, explain=False)
        return raw

    def explained(self, f: Found) -> StepTime:
        """The same step time with every term's formula, for a candidate that is shown."""
        return step_time(self.base.spec, light_config(f.combo, f.mb, f.ga, self.base.training.seq_len,
                                                         self.base.training.framework), self.hw,
                         self.base.mode, self.assumptions)

    def fit(self, c: Combo, mb: int, ga: int) -> Fit:
        """Whether c fits at this split: remembered; decided by the states floor (and the forward's activations on
        top of it) without an estimate where that floor is already over the usable memory."""
        key = (c, mb, ga)
        self.tried.add(key)
        if key in self.cache:
            return self.cache[key]
        try:
            sc = scenario_for(self.base, c, mb, ga)
        except (ValidationError, ValueError) as exc:
            f = Fit(None, False, T_("invalid: {error}", error=str(exc)), invalid=True)
            self.cache[key] = f
            return f
        floor = self.floors.get(c.states_key())
        if floor is None:
            floor = self.floors[c.states_key()] = states_floor(sc)
        if floor <= self.usable and floor:  # the states fit: add what the forward pass holds on top of them
            floor += forward_activations_floor(sc)
        f = Fit(None, False, floor=floor, settle=lambda: self._judge(sc)) if floor > self.usable else self._judge(sc)
        self.cache[key] = f
        return f

    def _judge(self, sc: Scenario) -> Fit:
        """The estimate and the verdict against the usable memory and the host's limits."""
        self.stats["memory_estimates"] += 1
        est = estimate(sc)
        need = est.device_total_bytes.expected
        if need > self.usable:
            f = Fit(est, False, T_("needs {need} per GPU, over the usable {usable} (GPU memory less the safety "
                                   "margin)", need=gib_short(need), usable=gib_short(self.usable)))
        elif est.verdict.fits is False:  # host RAM or NVMe: the verdict's own sentence ("offload needs ...")
            f = Fit(est, False, joined("; ", reason_texts(est.verdict)))
        else:
            f = Fit(est, True)
        return f


def states_floor(sc: Scenario) -> int:
    """A lower bound of estimate(sc).peak_allocated_bytes in training: the first pipeline stage's weights and
    optimizer states (with the master weights) on one GPU, which every moment of calc.memory.train_timeline's training
    timeline holds (the optimizer step's among them). 0 where no bound is taken (inference, FSDP2, whose
    states calc.memory.fsdp2.fsdp2_states builds). tests/calc/recommend/test_recommend_shortcuts.py checks it against
    the engine."""
    t = sc.training
    if sc.mode != Mode.train or t.sharding == "fsdp2":
        return 0
    layers = parallel.layers_on_stage(sc.spec.num_layers, t.pipeline_parallel)
    st = model_states(sc, layers, True, t.pipeline_parallel == 1, "cuda", t.sharding == "deepspeed")
    return st.weights + st.optimizer


def frugal_member(c: Combo, offload_ok: bool, sdpa: bool = True) -> Combo:
    """The member of c's group (same precision, stage, TP/PP, method) that needs the least GPU memory
    (offload_ok=False under FSDP2, whose offload is not modelled; sdpa=False for eager-only models)."""
    can = offload_ok and c.zero >= 1
    oo = Offload.cpu if can and not c.optimizer.bitsandbytes and c.lora is None else c.off_opt
    op = Offload.cpu if can and c.zero == 3 else c.off_par
    if c.off_opt == Offload.nvme:
        oo = Offload.nvme
    if c.off_par == Offload.nvme:
        op = Offload.nvme
    return c.with_(ckpt=Checkpointing.full, every=1, attention=Attention.sdpa if sdpa else Attention.eager,
                   off_opt=oo, off_par=op)

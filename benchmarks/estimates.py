"""Benchmark: estimates per second for an 80-layer model with the full timeline.

    PYTHONPATH=. python benchmarks/estimates.py [--seconds 3]

Prints numbers; it is not a timed test. Times are CPU time of this process (time.process_time),
so other work on a shared machine does not inflate them (a loaded machine still slows it: compare
with another branch in the same minute). The engine memoizes estimates, keeps block profiles per
shape, and records each block once per shape-free context (model, precision, options: calc.sim.profiles)
with the model states of a scenario without its batch shape. So a repeated scenario ("warm") costs
least; "cold (new shapes)" clears the memo and the per-shape profiles before each round of 96 new
(batch, sequence, precision, checkpointing) shapes, keeping what does not depend on the shape; "new
layout" is a search over parallel layouts (a new ZeRO stage, GPU count and optimizer for a shape
whose block profiles are kept); "new contexts" clears everything, so each of the 6 contexts of the
96 shapes is replayed for its first six shapes and recorded at its seventh.
"""

from __future__ import annotations

import argparse
import itertools
import time

from calc.contract.scenario import Scenario
from calc.memory.engine import clear_memo, estimate


def _scenario(batch: int = 1, seq: int = 4096, precision: str = "bf16-mixed", ckpt: str = "full", zero: int = 3,
              gpus: int = 64, optimizer: str = "adamw") -> Scenario:
    return Scenario.model_validate({
        "model": "llama-2-70b", "hardware": {"gpu": "a100-80gb", "num_gpus": gpus},
        "training": {"micro_batch_size": batch, "seq_len": seq, "precision": precision, "zero_stage": zero,
                     "activation_checkpointing": ckpt, "optimizer": optimizer}})


def _rate(fn, seconds: float) -> tuple[int, float]:
    n, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        fn()
        n += 1
    return n, time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per measurement")
    args = ap.parse_args()
    sc = _scenario()
    est = estimate(sc)
    print(f"model: {est.model.name}, {est.model.num_layers} layers, timeline of {len(est.timeline.events)} events")
    n, dt = _rate(lambda: estimate(sc), args.seconds)
    print(f"warm (same scenario):         {n / dt:8.0f} estimates/s  ({dt / n * 1e6:6.1f} us each)")
    variants = [_scenario(b, s, p, c) for b, s, p, c in itertools.product(
        [1, 2, 4, 8], [1024, 2048, 4096, 8192], ["bf16-mixed", "bf16", "amp-bf16"], ["none", "full"])]
    _per_estimate("cold (new shapes):", variants, clear_memo, args.seconds)
    layouts = [_scenario(zero=z, gpus=g, optimizer=o) for z, g, o in itertools.product(
        [0, 1, 2, 3], [8, 16, 32, 64, 128, 256], ["adamw", "sgd", "adafactor", "adamw-8bit"])]
    _per_estimate("new layout (profiles cached):", layouts, lambda: clear_memo(profiles=False), args.seconds)
    _per_estimate("new contexts (nothing kept):", variants, lambda: clear_memo(shape_free=True), args.seconds)


def _per_estimate(label: str, scenarios: list[Scenario], clear, seconds: float) -> None:
    """Rounds of `clear()` then one estimate of each scenario, timed together; prints the rate per estimate."""

    def one_round() -> None:
        clear()
        for v in scenarios:
            estimate(v)

    n, dt = _rate(one_round, seconds)
    per = dt / (n * len(scenarios))
    print(f"{label:<30}{1 / per:8.0f} estimates/s  ({per * 1e6:6.1f} us each)")

if __name__ == "__main__":
    main()

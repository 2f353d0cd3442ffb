"""Time the recommender's sweeps (prints timings; not a test).

    PYTHONPATH=. python benchmarks/recommend_sweep.py [--repeat 3] [--table]

The target from the issue: a whole sweep for a 70B model on 64 GPUs in under 2 seconds. Each line shows
the best of --repeat runs (first run includes the engine's per-shape caches warming up), the number of
combinations enumerated, how many were pruned and how many memory estimates the engine computed.
"""

from __future__ import annotations

import argparse
import time

from calc.contract.scenario import Scenario
from calc.recommend import RecommendRequest, recommend, recommendation_table

SWEEPS = [
    # (model, cluster, seq_len, global batch tokens)
    ("llama-3.1-70b", "64x-a100-80gb", 4096, 4 * 2**20),
    ("llama-3.1-70b", "64x-h100-sxm", 4096, 4 * 2**20),
    ("llama-3.1-70b", "8x-a100-80gb", 4096, 2**20),
    ("llama-3.1-405b", "64x-h100-sxm", 4096, 4 * 2**20),
    ("llama-3.1-8b", "8x-a100-80gb", 2048, 2**20),
    ("llama-3.1-8b", "1x-rtx-4090", 2048, 2**20),
    ("qwen2.5-32b", "4x-rtx-4090", 2048, 2**20),
]


def one(model: str, cluster: str, seq: int, tokens: int, repeat: int, allow: bool) -> None:
    req = RecommendRequest(scenario=Scenario(model=model, hardware={"cluster": cluster}, training={"seq_len": seq}),
                           global_batch_tokens=tokens, max_candidates=10, allow_method_change=allow)
    times = []
    rec = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        rec = recommend(req)
        times.append(time.perf_counter() - t0)
    assert rec is not None
    st = rec.stats
    top = rec.candidates[0] if rec.candidates else None
    print(f"{model:15s} {cluster:14s} seq {seq:5d}  best {min(times):6.3f} s  first {times[0]:6.3f} s  "
          f"combos {st.combinations:5d}  dominated {st.pruned_dominated:5d}  group {st.pruned_infeasible_group:4d}  "
          f"bound {st.pruned_bound:5d}  estimates {st.memory_estimates:4d}  "
          + (f"winner {top.tokens_per_s_per_gpu:8,.0f} tok/s/GPU: {top.label}" if top else "nothing fits"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--table", action="store_true", help="also time the 6 x 6 model x hardware table")
    ap.add_argument("--allow-method-change", action="store_true")
    a = ap.parse_args()
    for m, c, s, t in SWEEPS:
        one(m, c, s, t, a.repeat, a.allow_method_change)
    if a.table:
        t0 = time.perf_counter()
        table = recommendation_table()
        print(f"\n6 x 6 recommendation table: {time.perf_counter() - t0:.2f} s "
              f"({len(table.models) * len(table.hardware)} cells)")


if __name__ == "__main__":
    main()

"""python -m calc presets [all|models|gpus|clusters]: the presets, one a line."""

from __future__ import annotations

import argparse

from calc.contract.presets import cluster_presets, gpu_presets, model_presets
from calc.contract.units import fmt_gib


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", choices=["all", "models", "gpus", "clusters"], default="all")


def run(args: argparse.Namespace) -> int:
    if args.kind in ("all", "models"):
        print("# models (id, params, source)")
        for p in model_presets().values():
            print(f"{p.id:22s} {p.spec.total_params():>17,}  {p.name}")
    if args.kind in ("all", "gpus"):
        print("# gpus (id, memory, bf16 TFLOPS)")
        for g in gpu_presets().values():
            print(f"{g.id:22s} {fmt_gib(g.memory_bytes):>12s}  {g.bf16_tflops:7.1f}  {g.name}")
    if args.kind in ("all", "clusters"):
        print("# clusters (id, gpus)")
        for c in cluster_presets().values():
            print(f"{c.id:22s} {c.num_gpus:>4d} x {c.gpu}  {c.name}")
    return 0

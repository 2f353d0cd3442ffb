"""python -m calc serve SCENARIO [--format table|json] [--concurrency N]: a serving engine's memory on one GPU of
a replica (calc.serve.plan), the verdict, the longest context that starts and the gpu_memory_utilization a target
concurrency needs."""

from __future__ import annotations

import argparse
import json
import math

from calc.contract.scenario import load_scenario
from calc.contract.units import fmt_gib
from calc.serve.plan import ServePlan, launch_command, plan, serving_of, utilization_for

MAX_CONCURRENCY = 1_000_000.0  # requests at once: far above what any GPU's KV cache holds


def concurrency(text: str) -> float:
    """argparse type: a finite number of requests above 0 and at most MAX_CONCURRENCY."""
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not (math.isfinite(n) and 0 < n <= MAX_CONCURRENCY):
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_CONCURRENCY:,.0f}, got {text[:40]!r}")
    return n


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario JSON file with \"mode\": \"serve\" ('-' for stdin)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--concurrency", type=concurrency,
                   help="target requests of max_model_len at once: prints the gpu_memory_utilization it needs")


def run(args: argparse.Namespace) -> int:
    sc = load_scenario(args.scenario)
    result = plan(sc)
    needed = utilization_for(sc, args.concurrency) if args.concurrency is not None else None
    if args.format == "json":
        data = result.model_dump(mode="json")
        data["launch_command"] = launch_command(sc)
        if args.concurrency is not None:
            data["target_concurrency"] = args.concurrency
            data["gpu_memory_utilization_needed"] = needed
        print(json.dumps(data, indent=2))
        return 0
    print(format_table(result))
    print(f"launch: {launch_command(sc)}")
    if args.concurrency is not None:
        print(concurrency_line(args.concurrency, needed, serving_of(sc).engine))
    return 0


def verdict_line(p: ServePlan) -> str:
    """The verdict in words: it starts, or what stops it and by how much."""
    short = fmt_gib(p.shortfall_bytes)
    if p.reason == "starts":
        return (f"starts: about {p.max_concurrency:,.2f} requests of {p.max_model_len:,} tokens at once; "
                f"{p.kv_cache_tokens:,} tokens of KV cache")
    if p.reason == "free_memory" and p.engine == "sglang":
        return f"does not start: the activations and CUDA graphs exceed what 1 - mem_fraction_static leaves by {short}"
    if p.reason == "free_memory":
        return (f"does not start: gpu_memory_utilization asks {short} more than the GPU has free after the CUDA "
                "context; lower it")
    if p.reason == "no_kv_memory":
        return (f"does not start: weights + activation peak + non-torch memory exceed the budget by {short}; use "
                "more GPUs (tensor_parallel), smaller weights or a higher gpu_memory_utilization")
    return (f"does not start: one request of max_model_len {p.max_model_len:,} needs {short} more KV cache than "
            f"the budget leaves; the longest that starts is {p.largest_max_model_len:,}")


def format_table(p: ServePlan) -> str:
    rows = [
        ("engine", p.engine),
        ("GPU memory (total)", fmt_gib(p.gpu_memory_bytes)),
        ("gpu_memory_utilization", f"{p.gpu_memory_utilization:g} -> budget {fmt_gib(p.requested_bytes)}"),
        ("weights_bytes", fmt_gib(p.weights_bytes)),
        ("activation_peak_bytes", f"{fmt_gib(p.activation_peak_bytes)} at max_num_batched_tokens "
                                  f"{p.max_num_batched_tokens:,} (modelled from source)"),
        ("non_torch_bytes", f"{fmt_gib(p.non_torch_bytes)} (estimate)"),
        ("cuda_graph_bytes", f"{fmt_gib(p.cuda_graph_bytes)} (estimate, outside the budget)"),
        ("kv_cache_bytes", fmt_gib(p.kv_cache_bytes)),
        ("kv_bytes_per_token", f"{p.kv_bytes_per_token:,} B"
                               + (f" ({p.kv_pool_bytes_per_token:,} B of pool per token over {p.kv_groups} groups)"
                                  if p.kv_groups > 1 else "")),
        ("kv_cache_tokens", f"{p.kv_cache_tokens:,} ({p.num_blocks:,} blocks)"),
        ("max_concurrency", f"{p.max_concurrency:,.2f} requests of {p.max_model_len:,} tokens"),
        ("largest max_model_len", f"{p.largest_max_model_len:,} tokens (starts with one request)"),
        ("headroom outside", fmt_gib(p.headroom_bytes)),
        ("verdict", verdict_line(p)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def concurrency_line(target: float, needed: float | None, engine: str) -> str:
    knob = "mem_fraction_static" if engine == "sglang" else "gpu_memory_utilization"
    if needed is None:
        return f"{target:g} requests of max_model_len do not fit on this GPU at any {knob}"
    return f"{target:g} requests of max_model_len need {knob} >= {needed:.3f}"

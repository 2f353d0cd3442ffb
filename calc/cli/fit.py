"""python -m calc fit SCENARIO: the largest micro-batch and the longest sequence that fit the GPU
(calc.memory.fit)."""

from __future__ import annotations

import argparse

from calc.contract.errors import UserError
from calc.contract.scenario import load_scenario
from calc.memory.fit import largest_fitting


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario")


def run(args: argparse.Namespace) -> int:
    sc = load_scenario(args.scenario)
    micro_batch = largest_fitting(sc, "micro_batch_size")
    if micro_batch is None:
        raise UserError("the scenario names no GPU (hardware.gpu, hardware.cluster or hardware.memory_bytes)")
    seq_tokens = largest_fitting(sc, "seq_len")
    print(f"largest micro-batch that fits at seq_len {sc.training.seq_len}: {micro_batch}")
    print(f"longest sequence that fits at micro-batch {sc.training.micro_batch_size}: {seq_tokens} tokens")
    return 0

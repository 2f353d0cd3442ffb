"""The measured data set: named scenarios and the devices each one runs on.

    python -m measure.suite --device cpu|fake|cuda [--only NAME ...] [-o data/measured_cpu.jsonl]

runs every entry meant for that device and appends one record per entry (JSON lines). `--list` prints
the names. The small entries (measure.suite_small: hidden 64-256, 2-6 layers) run in seconds on two CPU cores
and on any GPU; the preset entries (measure.suite_large: 1B-70B and beyond) run under FakeTensorMode (nothing
allocated), and some of them on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

from calc.contract.files import append_line
from measure.suite_large import preset_entries, sharded_entries
from measure.suite_models import Entry
from measure.suite_qlora import qlora_entries
from measure.suite_small import small_entries

__all__ = ["Entry", "entries", "main"]


def entries() -> list[Entry]:
    """Every entry, in the order the suite runs them."""
    return small_entries() + qlora_entries() + preset_entries() + sharded_entries()


def _clean_up(device: str) -> None:
    """After a failed run: free what its traceback held, and a process group it left behind."""
    import gc

    import torch

    gc.collect()
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.suite", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "fake", "cuda"), required=True)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these entries")
    ap.add_argument("-o", "--output", help="append records to this JSON-lines file")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--list", action="store_true", help="print the entries for this device and exit")
    args = ap.parse_args(argv)

    chosen = [e for e in entries() if args.device in e.devices]
    if args.only:
        known = {e.name for e in entries()}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print(f"error: unknown suite entries: {', '.join(unknown)}", file=sys.stderr)
            return 2
        chosen = [e for e in chosen if e.name in args.only]
    if args.list:
        for e in chosen:
            print(e.name)
        return 0

    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import torch

    from calc.contract.scenario import Scenario
    from measure.entry import measure
    from measure.workload import UnsupportedError

    failed, skipped, started = [], [], time.perf_counter()
    for i, e in enumerate(chosen, 1):
        t0 = time.perf_counter()
        try:
            sc = Scenario.model_validate(e.scenario())
            rec = measure(sc, args.device, steps=args.steps, name=e.name, extrapolate_layers=e.extrapolate)
        except (UnsupportedError, torch.OutOfMemoryError) as exc:
            skipped.append(e.name)
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"[{i}/{len(chosen)}] {e.name}: skipped: {why}", file=sys.stderr, flush=True)
            _clean_up(args.device)
            continue
        except Exception as exc:  # noqa: BLE001 - report and go on with the rest of the suite
            failed.append(e.name)
            print(f"[{i}/{len(chosen)}] {e.name}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            _clean_up(args.device)
            continue
        line = rec.to_json_line()
        if args.output:
            append_line(args.output, line)
        else:
            print(line, flush=True)
        print(f"[{i}/{len(chosen)}] {e.name}: peak {rec.peak_allocated_bytes / 2**20:.2f} MiB in {rec.peak_phase}"
              f" ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    total = time.perf_counter() - started
    print(f"{len(chosen) - len(failed) - len(skipped)} measured, {len(skipped)} skipped, {len(failed)} failed "
          f"in {total:.0f} s", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

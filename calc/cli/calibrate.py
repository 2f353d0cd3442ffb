"""python -m calc calibrate RECORD ... [-o FILE]: corrections for this machine from measured CUDA records
(calc.evidence.calibrate): the calibration JSON on stdout, or written to FILE with a summary."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from calc.cli.options import force_option
from calc.contract.files import write_file
from calc.contract.units import GiB, MiB

if TYPE_CHECKING:
    from calc.evidence.calibrate import Calibration


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("records", nargs="+", help="records from `python -m measure ... --device cuda` (JSON or JSON lines)")
    p.add_argument("-o", "--output", help="write the calibration JSON here (default: print it)")
    force_option(p)


def run(args: argparse.Namespace) -> int:
    # the evidence wing: imported by this command only
    from calc.evidence.calibrate import disagreement_warnings, fit, read_observations

    cal = fit(read_observations(args.records))
    text = cal.model_dump_json(indent=2)
    if args.output:
        write_file(args.output, text + "\n", force=args.force)
        print(format_summary(cal))
        print(f"wrote {args.output}")
    else:  # JSON on stdout for a pipe; what a reader must not miss on stderr
        print(text)
        for w in disagreement_warnings(cal):
            print(f"WARNING: {w}", file=sys.stderr)
    return 0


def format_summary(cal: Calibration) -> str:
    """The per-record comparison and the fitted corrections, for the terminal (GiB = 2^30 B)."""
    from calc.evidence.calibrate import disagreement_warnings

    lines = [f"{'record':32s} {'predicted GiB':>13s} {'measured GiB':>12s} {'error %':>8s} "
             f"{'reserved/alloc':>14s} {'outside MiB':>11s}"]
    for p in cal.points:
        lines.append(f"{p.name[:32]:32s} {p.predicted_allocated_bytes / GiB:13.3f} "
                     f"{p.measured_allocated_bytes / GiB:12.3f} {p.error_pct:+8.2f} {p.reserve_ratio:14.4f} "
                     f"{p.outside_bytes / MiB:11,.0f}")
    lines.append("")
    r, o = cal.reserve_ratio, cal.outside_bytes
    lines.append(f"reserve ratio (reserved / allocated): {r.value:.4f} ± {r.sigma:.4f}"
                 f"{'' if r.measured_spread else ' (assumed spread)'}")
    lines.append(f"outside the allocator (used - reserved): {o.value / MiB:,.0f} ± {o.sigma / MiB:,.0f} MiB"
                 f"{'' if o.measured_spread else ' (assumed spread)'}")
    lines.extend(cal.findings())
    lines.extend(f"WARNING: {w}" for w in disagreement_warnings(cal))
    return "\n".join(lines)

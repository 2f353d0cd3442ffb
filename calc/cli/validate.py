"""python -m calc validate [DATA ...] [--max-median PCT] [--max-worst PCT]: predicted vs measured peaks
(calc.evidence.validate), exit code 1 when a threshold is exceeded."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from calc.cli.options import percent
from calc.contract.errors import UserError
from calc.contract.units import GiB

if TYPE_CHECKING:
    from calc.evidence.validate import Report


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="*", help="JSON-lines measurement files (default: data/*.jsonl)")
    p.add_argument("--max-median", type=percent, default=None, help="fail if median |error| %% exceeds this")
    p.add_argument("--max-worst", type=percent, default=None, help="fail if worst |error| %% exceeds this")


def run(args: argparse.Namespace) -> int:
    from calc.contract.record import RecordError
    from calc.evidence.validate import load_all, report  # the evidence wing: imported by this command only

    try:
        records = load_all(args.data or None)
    except (RecordError, OSError) as exc:
        raise UserError(str(exc)) from None
    if not records:
        raise UserError("no measurement records found")
    rep = report(records)
    print(format_report(rep))
    failed = []
    if args.max_median is not None and rep.median_abs_error_pct > args.max_median:
        failed.append(f"median {rep.median_abs_error_pct:.2f} % > {args.max_median} %")
    if args.max_worst is not None and rep.worst_abs_error_pct > args.max_worst:
        failed.append(f"worst {rep.worst_abs_error_pct:.2f} % > {args.max_worst} %")
    if failed:
        print("FAIL: " + "; ".join(failed))
        return 1
    return 0


def format_report(rep: Report) -> str:
    """Every case, then every group's median and worst |error|, then the whole (GiB = 2^30 bytes)."""
    lines = [f"{'case':40s} {'device':6s} {'measured GiB':>13s} {'predicted GiB':>14s} {'error %':>8s}"]
    for c in rep.cases:
        lines.append(f"{c.name[:40]:40s} {c.device:6s} {c.measured_bytes / GiB:13.4f} "
                     f"{c.predicted_bytes / GiB:14.4f} {c.error_pct:+8.2f}")
    lines.append("")
    lines.append(f"{'group':14s} {'value':26s} {'n':>4s} {'median |err| %':>15s} {'worst |err| %':>14s}")
    for g in rep.groups:
        lines.append(f"{g.group:14s} {g.value[:26]:26s} {g.count:4d} {g.median_abs_error_pct:15.2f} "
                     f"{g.worst_abs_error_pct:14.2f}")
    lines.append("")
    lines.append(f"all: {len(rep.cases)} cases, median |error| {rep.median_abs_error_pct:.2f} %, "
                 f"worst {rep.worst_abs_error_pct:.2f} % (GiB = 2^30 bytes)")
    return "\n".join(lines)

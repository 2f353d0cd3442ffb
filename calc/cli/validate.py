"""python -m calc validate [DATA ...] [--max-median PCT] [--max-worst PCT]: predicted vs measured peaks
(calc.evidence.validate), grouped per framework, family, precision, ...; exit code 1 when a threshold is exceeded.

python -m calc validate --published [FILE]: predicted vs the peak memory that torchtune, LitGPT, torchtitan and
Qwen publish for real CUDA runs (calc.evidence.published; default data/published_gpu.yaml), per entry and per
framework; the thresholds then apply to the entries counted in the accuracy figures."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from calc.cli.options import percent
from calc.contract.errors import UserError
from calc.contract.units import GiB, MiB

if TYPE_CHECKING:
    from calc.evidence.published import PublishedReport
    from calc.evidence.validate import Report


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="*", help="JSON-lines measurement files (default: data/*.jsonl)")
    p.add_argument("--published", nargs="?", const="", default=None, metavar="FILE",
                   help="compare with published GPU figures instead (default file: data/published_gpu.yaml)")
    p.add_argument("--max-median", type=percent, default=None, help="fail if median |error| %% exceeds this")
    p.add_argument("--max-worst", type=percent, default=None, help="fail if worst |error| %% exceeds this")


def run(args: argparse.Namespace) -> int:
    if args.published is not None:
        return run_published(args)
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
    return _thresholds(args, rep.median_abs_error_pct, rep.worst_abs_error_pct)


def run_published(args: argparse.Namespace) -> int:
    from calc.contract.published import PUBLISHED_PATH, PublishedError, load_published
    from calc.evidence.published import report  # the evidence wing: imported by this command only

    if args.data:
        raise UserError("--published reads one file: give it as --published FILE, without measurement files")
    try:
        published = load_published(args.published or PUBLISHED_PATH)
    except PublishedError as exc:
        raise UserError(str(exc)) from None
    rep = report(published)
    print(format_published(rep))
    whole = rep.frameworks[-1]
    if whole.counted == 0:
        return 0 if args.max_median is None and args.max_worst is None else _no_counted()
    return _thresholds(args, whole.median_abs_error_pct or 0.0, whole.worst_abs_error_pct or 0.0)


def _no_counted() -> int:
    print("FAIL: no entry is both fully stated and estimable, so no threshold can be checked")
    return 1


def _thresholds(args: argparse.Namespace, median: float, worst: float) -> int:
    failed = []
    if args.max_median is not None and median > args.max_median:
        failed.append(f"median {median:.2f} % > {args.max_median} %")
    if args.max_worst is not None and worst > args.max_worst:
        failed.append(f"worst {worst:.2f} % > {args.max_worst} %")
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
    for w in rep.workspaces:
        lines.append("")
        lines.append(f"cuBLAS workspaces on {w.device_name} ({w.records} records): modelled "
                     f"{w.modelled_bytes / MiB:.2f} MiB, measured before each model {w.min_baseline_bytes / MiB:.2f}"
                     f"-{w.max_baseline_bytes / MiB:.2f} MiB (GPU errors above compare the rest of the peak)")
    lines.append("")
    lines.append(f"all: {len(rep.cases)} cases, median |error| {rep.median_abs_error_pct:.2f} %, "
                 f"worst {rep.worst_abs_error_pct:.2f} % (GiB = 2^30 bytes)")
    return "\n".join(lines)


def format_published(rep: PublishedReport) -> str:
    """Every entry (published, predicted in the source's metric, error, or why it is not yet estimable), then per
    framework and split: entries, unstated configurations, not yet estimable, counted, median / worst |error|,
    within 10 %. GiB = 2^30 bytes."""
    lines = [f"{'entry':52s} {'split':11s} {'metric':18s} {'published GiB':>13s} {'predicted GiB':>13s} "
             f"{'error %':>8s}"]
    for c in rep.cases:
        mark = "" if c.complete else " (configuration not fully stated)"
        if c.predicted_bytes is None:
            tail = f"{'-':>13s} {'-':>8s}  not yet estimable: {c.not_estimable}"
        else:
            tail = f"{c.predicted_bytes / GiB:13.2f} {c.error_pct:+8.1f}"
        lines.append(f"{c.id[:52]:52s} {c.split:11s} {c.metric:18s} {c.published_bytes / GiB:13.2f} {tail}{mark}")
    lines += ["", f"{'framework':12s} {'split':11s} {'entries':>7s} {'unstated':>8s} {'not yet':>7s} {'counted':>7s} "
              f"{'median |err| %':>14s} {'worst |err| %':>13s} {'within 10 %':>11s}"]
    for s in rep.frameworks:
        med = "-" if s.median_abs_error_pct is None else f"{s.median_abs_error_pct:.1f}"
        worst = "-" if s.worst_abs_error_pct is None else f"{s.worst_abs_error_pct:.1f}"
        lines.append(f"{s.framework:12s} {s.split:11s} {s.entries:7d} {s.incomplete:8d} {s.not_estimable:7d} "
                     f"{s.counted:7d} {med:>14s} {worst:>13s} {s.within_10_pct:11d}")
    lines += ["", "counted = fully stated and estimable; unstated = the source leaves part of the configuration "
              "out; not yet = a mechanism this version does not model (GiB = 2^30 bytes)"]
    return "\n".join(lines)

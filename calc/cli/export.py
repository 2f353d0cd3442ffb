"""python -m calc export SCENARIO -o DIR and python -m calc export-deepspeed SCENARIO [-o FILE]: the files that
run a scenario (calc.export), written where the options say; the export's notes on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from calc.cli.options import finite_positive, force_option
from calc.contract.files import write_file, write_files
from calc.contract.output import strict_json
from calc.contract.scenario import load_scenario

if TYPE_CHECKING:
    from calc.export.deepspeed import ExportOptions


def add_schedule_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--learning-rate", type=finite_positive, help="peak learning rate (default 5e-5)")
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default 0)")
    p.add_argument("--total-steps", type=int, help="linear decay to 0 at this step (at least the warm-up)")


def add_bundle_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario")
    p.add_argument("-o", "--output", required=True, help="folder to write (created if missing)")
    force_option(p)
    p.add_argument("--lang", choices=["en", "zh"], default="en",
                   help="language of the comments in the written files, and of the notes")
    add_schedule_options(p)


def add_deepspeed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario")
    p.add_argument("-o", "--output", help="file to write (default: print the JSON)")
    force_option(p)
    add_schedule_options(p)


def export_options(args: argparse.Namespace) -> ExportOptions:
    """The learning-rate schedule the options give (ExportOptions' defaults for the others)."""
    from calc.export.deepspeed import ExportOptions

    given = {k: getattr(args, a) for k, a in (("learning_rate", "learning_rate"), ("warmup_steps", "warmup_steps"),
                                              ("total_num_steps", "total_steps")) if getattr(args, a, None) is not None}
    return ExportOptions(**given)


def run_bundle(args: argparse.Namespace) -> int:
    """python -m calc export: ds_config.json, train.py, accelerate.yaml, launch.sh and requirements.txt in the folder
    (torchtune.yaml and launch.sh for framework torchtune, launch.sh for litgpt), each path printed: the files of the
    Export page's .zip (calc.export.bundle.bundle_files)."""
    from calc.export.bundle import EXECUTABLE, bundle_files  # the export wing: imported by its commands only

    sc = load_scenario(args.scenario)
    files, notes = bundle_files(sc, export_options(args), lang=args.lang)
    for path in write_files(args.output, files, executable=frozenset(EXECUTABLE), force=args.force):
        print(path)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return 0


def run_deepspeed(args: argparse.Namespace) -> int:
    """python -m calc export-deepspeed: the ds_config JSON to the file, or to stdout."""
    from calc.export.deepspeed import export_deepspeed

    sc = load_scenario(args.scenario)
    exp = export_deepspeed(sc, export_options(args))
    text = strict_json(exp.config)
    if args.output:
        write_file(args.output, text, force=args.force)
    else:
        sys.stdout.write(text)
    for n in exp.notes:
        print(f"note: {n}", file=sys.stderr)
    return 0

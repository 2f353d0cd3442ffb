"""python -m calc import-deepspeed DS_CONFIG (--scenario FILE | --model M --hardware H): an existing ds_config.json
read back into a scenario (calc.export.ds_import), the same import as the Export page's "Will my DeepSpeed config
fit?": the "auto" values filled as the Hugging Face Trainer fills them from the scenario, DeepSpeed's own config
check, then the scenario JSON on stdout (or -o FILE; `python -m calc estimate -` reads it) and, on stderr, each value
filled for "auto" with its source and the notes."""

from __future__ import annotations

import argparse
import sys

from calc.cli.options import force_option
from calc.contract.boundary import read_json, short
from calc.contract.errors import UserError
from calc.contract.files import write_file
from calc.contract.output import strict_json
from calc.contract.scenario import Scenario, load_scenario


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("ds_config", help="ds_config.json ('-' for stdin)")
    p.add_argument("--scenario", help="scenario JSON: its model, hardware, sequence length and the values that fill "
                                      "\"auto\" (micro-batch, accumulation, precision)")
    p.add_argument("--model", help="model preset id (instead of --scenario)")
    p.add_argument("--hardware", help="GPU or cluster preset id (instead of --scenario)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length with --model (default 2048, or the model's n_positions when shorter)")
    p.add_argument("-o", "--output", help="write the scenario JSON here instead of stdout")
    force_option(p)


def _base(args: argparse.Namespace) -> Scenario:
    if args.scenario:
        if args.model or args.hardware:
            raise UserError("give --scenario, or --model and --hardware, not both")
        return load_scenario(args.scenario)
    if not (args.model and args.hardware):
        raise UserError("give --scenario FILE, or --model and --hardware (preset ids)")
    from calc.export.ds_import import base_scenario

    return base_scenario(args.model, args.hardware, args.seq_len)


def run(args: argparse.Namespace) -> int:
    from calc.export.ds_import import import_ds_config  # the export wing: imported by its commands only

    if args.ds_config == "-" and args.scenario == "-":
        raise UserError("the ds_config and the scenario cannot both be read from stdin")
    base = _base(args)
    result = import_ds_config(read_json(args.ds_config), base)
    text = result.scenario.model_dump_json(indent=2, exclude_defaults=True) + "\n"
    if args.output:
        write_file(args.output, text, force=args.force)
    else:
        sys.stdout.write(text)
    for f in result.filled:
        print(short(f"filled \"auto\": {f.key} = {strict_json(f.value, indent=None)} ({f.source})"), file=sys.stderr)
    for n in result.notes:
        print(short(f"note: {n}"), file=sys.stderr)
    return 0

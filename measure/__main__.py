"""CLI: python -m measure SCENARIO.json --device cuda|cpu|fake [-o FILE] [--steps 3] [--engine deepspeed].

Prints one MeasurementRecord as JSON (and appends it as one line to FILE with -o). Bad input
(unreadable or invalid scenario, a combination the device cannot run) prints one line on stderr and
exits with 2; running out of device memory exits with 3.
"""

from __future__ import annotations

import argparse
import sys


def _fail(msg: str, code: int = 2) -> int:
    from calc.contract.output import for_terminal  # what the terminal would obey in a file name, made visible

    print(f"error: {for_terminal(' '.join(msg.split()), limit=300)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure", description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="scenario JSON file (calc.contract.scenario.Scenario), or - for stdin")
    ap.add_argument("--device", choices=("cuda", "cpu", "fake"), required=True)
    ap.add_argument("-o", "--output", help="append the record as one JSON line to this file")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps (or inference forwards); default 3")
    ap.add_argument("--name", help="a name stored in the record")
    ap.add_argument("--layers", type=int, help="build the model with this many layers instead")
    ap.add_argument("--extrapolate", action="store_true",
                    help="measure two short depths and extrapolate linearly to the full layer count")
    ap.add_argument("--engine", choices=("torch", "deepspeed"), default="torch",
                    help="deepspeed: the exported ds_config on DeepSpeed's CPU accelerator, hardware.num_gpus "
                         "ranks over gloo (--device cpu)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        return _fail("--steps must be at least 1")

    from calc.contract.errors import UserError
    from calc.contract.scenario import load_scenario  # bounded, finite, strictly typed JSON

    try:
        scenario = load_scenario(args.scenario)
    except UserError as exc:
        return _fail(str(exc))

    try:
        import torch
    except ImportError:
        return _fail("measuring needs torch: pip install -r measure/requirements.txt")
    from measure.entry import measure
    from measure.workload import UnsupportedError

    if args.engine == "deepspeed" and (args.device != "cpu" or args.layers or args.extrapolate):
        return _fail("--engine deepspeed runs with --device cpu, without --layers / --extrapolate")
    try:
        if args.engine == "deepspeed":
            from measure.deepspeed_run import measure_deepspeed_record

            record = measure_deepspeed_record(scenario, steps=args.steps, name=args.name)
        else:
            record = measure(scenario, args.device, steps=args.steps, name=args.name, num_layers=args.layers,
                             extrapolate_layers=args.extrapolate)
    except UnsupportedError as exc:
        return _fail(str(exc))
    except torch.OutOfMemoryError as exc:
        return _fail(f"out of device memory: {str(exc).splitlines()[0]}", code=3)
    from calc.contract.output import for_terminal

    line = record.to_json_line()
    print(for_terminal(line))  # one JSON line: its strings' control characters as JSON escapes
    if args.output:
        from calc.contract.errors import UserError
        from calc.contract.files import append_line

        try:
            append_line(args.output, line)
        except UserError as exc:
            return _fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

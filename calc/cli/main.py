"""Command line: python -m calc {estimate,presets,fit,recommend,export,export-deepspeed,import-deepspeed,validate,
calibrate,serve} ...

The parser lists the commands; each command's options and work live in its module (calc.cli.estimate, ...).
Bad input gives a one-line error on stderr and exit code 2, never a traceback. The table formats
speak English unless `--lang zh` is given (JSON is English keys and values in every language).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, TextIO, cast

from pydantic import ValidationError

from calc.cli import calibrate, ds_import, estimate, export, fit, presets, recommend, serve, table, validate
from calc.contract.boundary import error_message, short
from calc.contract.i18n import DEFAULT_LANG
from calc.contract.output import for_terminal

__all__ = ["COMMANDS", "Command", "build_parser", "main", "run_as_program"]

_PROGRAM = False  # True when run as `python -m calc`: the process ends with the command


class Command(NamedTuple):
    """One subcommand: its name and help line, what adds its options, what runs it (the exit code)."""

    name: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: tuple[Command, ...] = (
    Command("estimate", "per-GPU memory of one scenario", estimate.add_options, estimate.run),
    Command("calibrate", "fit corrections for this machine from measured cuda records", calibrate.add_options,
            calibrate.run),
    Command("presets", "list model, GPU and cluster presets", presets.add_options, presets.run),
    Command("fit", "largest micro-batch and longest sequence that fit the GPU", fit.add_options, fit.run),
    Command("recommend", "ranked configurations that fit", recommend.add_options, recommend.run),
    Command("table", "the model x hardware table: the fastest configuration that fits each", table.add_options,
            table.run),
    Command("export", "ds_config.json, train.py, accelerate.yaml, launch.sh and requirements.txt in a folder (torchtune.yaml and "
            "launch.sh for framework torchtune, launch.sh for litgpt)",
            export.add_bundle_options, export.run_bundle),
    Command("export-deepspeed", "DeepSpeed config for a scenario", export.add_deepspeed_options, export.run_deepspeed),
    Command("import-deepspeed", "an existing ds_config.json read back into a scenario (\"auto\" filled as the "
            "Hugging Face Trainer fills it)", ds_import.add_options, ds_import.run),
    Command("validate", "predicted vs measured peaks for a data set", validate.add_options, validate.run),
    Command("serve", "a serving engine's memory per GPU: KV cache, concurrency, the longest context that starts",
            serve.add_options, serve.run),
)


class Parser(argparse.ArgumentParser):
    """argparse, with its error line cut to one short line: it quotes the bad argument, which may be a megabyte."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {short(message)}\n")


class TerminalText:
    """stdout or stderr with every character a terminal would obey made visible (calc.contract.output.for_terminal):
    what a command prints quotes names, keys and fields of the user's files. JSON stays JSON (the escapes are
    \\u001b-style inside its strings, and its serializers already escape line breaks there)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(for_terminal(text, lines=True))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m calc", description="GPU memory calculator (vramcalc)")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help)
        command.add_options(p)
        p.set_defaults(func=command.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = cast(TextIO, TerminalText(out)), cast(TextIO, TerminalText(err))
    try:
        return run_command(build_parser().parse_args(argv))
    finally:
        sys.stdout, sys.stderr = out, err


def run_command(args: argparse.Namespace) -> int:
    """The parsed command, its bad input as one line on stderr (exit code 2)."""
    if _PROGRAM:
        gc.freeze()  # pydantic and the engine, imported with the package: alive until the process exits
        # A command is one bounded piece of work and the process ends with it: what reference cycles it leaves is
        # freed at exit, while the cyclic collector's passes over what a search makes (block profiles, memoized
        # estimates) cost `python -m calc recommend` about 0.01 s.
        gc.disable()
    try:
        return args.func(args)
    except (ValueError, ValidationError) as exc:  # UserError included: one short line, exit 2
        print(f"error: {error_message(exc, getattr(args, 'lang', None) or DEFAULT_LANG)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m calc presets | head`: the reader left; stop quietly
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (captured in a test)
        pass


def _leave(code: int) -> None:
    """End the process with `code` once what the command printed is flushed, without the interpreter's teardown:
    the command is over and its files are closed, and freeing every object it made, one at a time, took about
    0.03 s of `python -m calc recommend`'s CPU time (a search keeps its block profiles and estimates)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left: as main() does, stop quietly
        pass
    os._exit(code)


def run_as_program() -> None:
    """`python -m calc`: the command's exit code ends the process (see _leave)."""
    global _PROGRAM
    _PROGRAM = True
    _leave(main())

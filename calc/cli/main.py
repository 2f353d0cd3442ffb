"""Command line: python -m calc {estimate,presets,fit,recommend,export,export-deepspeed,validate,calibrate} ...

Bad input gives a one-line error on stderr and exit code 2, never a traceback. The table formats
speak English unless `--lang zh` is given (JSON is English keys and values in every language).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, LANGS, N_, Lang, translate
from calc.contract.units import fmt_gib

__all__ = ["UserError", "load_scenario", "main", "one_line", "read_json"]

_PROGRAM = False  # True when run as `python -m calc`: the process ends with the command


def read_json(path: str) -> Any:
    """Parse a JSON file (or '-' for stdin) through calc.contract.boundary (bounded size and depth, finite
    numbers); UserError with a one-line reason otherwise."""
    from calc.contract.boundary import read_json as bounded_read_json

    return bounded_read_json(path)


def load_scenario(path: str, data: Any = None) -> Any:
    """Read and validate a scenario JSON file (or '-' for stdin), or validate already-read `data`
    (strict JSON types: no true for 1, no 4096.7 for 4096)."""
    from calc.contract.boundary import validate
    from calc.contract.scenario import Scenario

    if data is None:
        data = read_json(path)
    return validate(Scenario, data, "stdin" if path == "-" else path)


def one_line(exc: ValidationError) -> str:
    """The first validation problem as 'field.path: message' (calc.contract.boundary.one_line)."""
    from calc.contract.boundary import one_line as first_problem

    return first_problem(exc)


def cmd_estimate(args: argparse.Namespace) -> int:
    from calc.memory.engine import estimate

    sc = load_scenario(args.scenario)
    est = estimate(sc)
    calibrated = _calibrated(args.calibration, est, sc) if args.calibration else None
    if args.format == "json":
        data = est.model_dump(mode="json", exclude={"timeline"} if not args.timeline else None)
        if calibrated is not None:
            data["calibrated"] = calibrated.model_dump(mode="json")
        print(json.dumps(data, indent=2))
    else:
        print(format_table(est, args.lang))
        if calibrated is not None:
            print(format_calibrated(calibrated, args.lang))
    return 0


def _calibrated(path: str, est: Any, sc: Any) -> Any:
    """The estimate with a calibration file's corrections (calc.evidence.calibrate); UserError on another GPU."""
    from calc.contract.boundary import read_text
    from calc.evidence.calibrate import MAX_RECORD_FILE_BYTES, CalibrationError, apply, load_calibration

    text = read_text(path, MAX_RECORD_FILE_BYTES)  # UserError naming the file (unreadable, too big, not UTF-8)
    try:
        return apply(load_calibration(text, path), est, sc)
    except CalibrationError as exc:
        raise UserError(f"--calibration {exc}") from None


def _rows_text(rows: list[tuple[str, str]], lang: Lang) -> str:
    """`key  value` lines, keys (message ids, an indent kept in front) translated and aligned."""
    if lang == DEFAULT_LANG:
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    from calc.recommend.phrase import pad
    from calc.recommend.phrase import width as columns

    keys = [k[: len(k) - len(k.lstrip())] + translate(k.lstrip(), lang) for k, _ in rows]
    cols = max(map(columns, keys))
    return "\n".join(f"{pad(k, cols)}  {v}" for k, (_, v) in zip(keys, rows, strict=True))


def format_calibrated(ce: Any, lang: Lang = DEFAULT_LANG) -> str:
    """The calibrated prediction under the table, beside the uncalibrated range."""
    dt, udt = ce.device_total_bytes, ce.uncalibrated_device_total_bytes
    rows = [
        (N_("calibrated on"), ce.machine),
        (N_("peak allocated, calibrated"), f"{fmt_gib(ce.peak_allocated_bytes)} (± {fmt_gib(ce.peak_allocated_sigma_bytes)})"),
        (N_("device total, calibrated"), f"{fmt_gib(dt.low)} / {fmt_gib(dt.expected)} / {fmt_gib(dt.high)}"),
        (N_("device total, uncalibrated"), f"{fmt_gib(udt.low)} / {fmt_gib(udt.expected)} / {fmt_gib(udt.high)}"),
    ]
    if ce.headroom_bytes is not None:
        rows.append((N_("headroom, calibrated"), fmt_gib(ce.headroom_bytes)))
    rows += [(N_("applied"), a) for a in ce.applied] + [(N_("not applied"), a) for a in ce.not_applied]
    rows += [(N_("WARNING"), w) for w in ce.warnings]
    return "\n" + _rows_text(rows, lang) + "\n" + translate(N_("(low / expected / high; 1 GiB = 2^30 bytes)"), lang)


def _peak_at(est: Any, lang: Lang) -> str:
    """'backward layer 3 (backward, step 1)' in `lang` (calc.memory.result's event and phase words where it has them)."""
    if lang == DEFAULT_LANG:
        return f"{est.peak_event} ({est.peak_phase}, step {est.peak_step})"
    from calc.memory import result

    event_text = getattr(result, "event_text", None)
    event = event_text(est.peak_event).render(lang) if event_text else translate(est.peak_event, lang)
    return translate(N_("{event} ({phase}, step {step})"), lang, event=event, phase=translate(est.peak_phase, lang),
                     step=est.peak_step)


def format_table(est: Any, lang: Lang = DEFAULT_LANG) -> str:
    from calc.memory.verdict import headline

    b = est.breakdown
    dt = est.device_total_bytes
    rows = [
        (N_("model"), translate(N_("{name} ({params} params)"), lang, name=est.model.name,
                                params=f"{est.model.total_params:,}")),
        (N_("peak allocated"), fmt_gib(est.peak_allocated_bytes)),
        ("  " + N_("peak at"), _peak_at(est, lang)),
        ("  " + N_("parameters"), fmt_gib(b.parameters)),
        ("  " + N_("gradients"), fmt_gib(b.gradients)),
        ("  " + N_("optimizer states"), fmt_gib(b.optimizer_states)),
        ("  " + N_("activations"), fmt_gib(b.activations)),
        ("  " + N_("other (transients)"), fmt_gib(b.other)),
        (N_("device total (low/exp/high)"), f"{fmt_gib(dt.low)} / {fmt_gib(dt.expected)} / {fmt_gib(dt.high)}"),
    ]
    if est.gpu_memory_bytes:
        rows.append((N_("GPU memory"), translate(N_("{memory}, headroom {headroom}"), lang,
                                                 memory=fmt_gib(est.gpu_memory_bytes),
                                                 headroom=fmt_gib(est.headroom_bytes))))
    if est.cpu_ram_bytes or est.nvme_bytes:
        rows.append((N_("offload (per node)"), translate(N_("CPU RAM {ram}, NVMe {nvme}"), lang,
                                                         ram=fmt_gib(est.cpu_ram_bytes), nvme=fmt_gib(est.nvme_bytes))))
    rows.append((N_("verdict"), headline(est.verdict, lang)))
    return _rows_text(rows, lang) + "\n" + translate(N_("(1 GiB = 2^30 bytes)"), lang)


def cmd_presets(args: argparse.Namespace) -> int:
    from calc.contract.presets import cluster_presets, gpu_presets, model_presets

    if args.kind in ("all", "models"):
        print("# models (id, params, source)")
        for p in model_presets().values():
            print(f"{p.id:22s} {p.spec.total_params():>17,}  {p.name}")
    if args.kind in ("all", "gpus"):
        print("# gpus (id, memory, bf16 TFLOPS)")
        for g in gpu_presets().values():
            print(f"{g.id:22s} {fmt_gib(g.memory_bytes):>12s}  {g.bf16_tflops:7.1f}  {g.name}")
    if args.kind in ("all", "clusters"):
        print("# clusters (id, gpus)")
        for c in cluster_presets().values():
            print(f"{c.id:22s} {c.num_gpus:>4d} x {c.gpu}  {c.name}")
    return 0


def _lazy(module: str, func: str = "cli_main"):
    def run(args: argparse.Namespace) -> int:
        return _import_command(module).__getattribute__(func)(args)

    return run


def _import_command(module: str) -> Any:
    """Import a command's module without the cyclic collector (calc.collector_paused); run as a program, then
    freeze what is imported (gc.freeze): it lives until the process exits, so no collection looks at it again."""
    import importlib

    with collector_paused():
        mod = importlib.import_module(module)
    if _PROGRAM:
        gc.freeze()
    return mod


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (as it was, after): a command's import builds pydantic's
    validators and the model tables, thousands of objects that live as long as the process, few of them garbage,
    which the collector would scan over and over while they are made. Only the command line does this: it owns
    its process, while the app's server and the tests do not."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _count(text: str) -> int:
    """argparse type: an integer from 1 to 1000 (`--top 0` is a mistake, not "the default")."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 1000, got {n}")
    return n


def _percent(text: str) -> float:
    """argparse type: a finite percentage >= 0 (`nan` would disable the check it sets)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text[:40]!r}")
    return x


def _lang_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", choices=LANGS, default=DEFAULT_LANG,
                   help="language of the table format (default en; JSON is always English)")


def _export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--learning-rate", type=float, help="peak learning rate (default 5e-5)")
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default 0)")
    p.add_argument("--total-steps", type=int, help="linear decay to 0 at this step (at least the warm-up)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m calc", description="GPU memory calculator (vramcalc)")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("estimate", help="per-GPU memory of one scenario")
    p.add_argument("scenario", help="scenario JSON file ('-' for stdin)")
    p.add_argument("--format", choices=["json", "table"], default="json")
    p.add_argument("--timeline", action="store_true", help="include the step timeline in the JSON")
    p.add_argument("--calibration", help="calibration JSON from `calibrate`: adds the calibrated prediction")
    _lang_option(p)
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser("calibrate", help="fit corrections for this machine from measured cuda records")
    p.add_argument("records", nargs="+", help="records from `python -m measure ... --device cuda` (JSON or JSON lines)")
    p.add_argument("-o", "--output", help="write the calibration JSON here (default: print it)")
    p.set_defaults(func=_lazy("calc.evidence.calibrate"))
    p = sub.add_parser("presets", help="list model, GPU and cluster presets")
    p.add_argument("kind", nargs="?", choices=["all", "models", "gpus", "clusters"], default="all")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("fit", help="largest micro-batch and longest sequence that fit the GPU")
    p.add_argument("scenario")
    p.set_defaults(func=_lazy("calc.memory.fit"))
    p = sub.add_parser("recommend", help="ranked configurations that fit")
    p.add_argument("scenario")
    p.add_argument("--top", type=_count, default=10, help="how many configurations to list (1-1000)")
    p.add_argument("--format", choices=["json", "table"], default="table")
    _lang_option(p)
    p.set_defaults(func=_lazy("calc.cli.recommend"))
    from calc.recommend.workload import TABLE_BATCH_TOKENS, TABLE_GLOBAL_BATCH_TOKENS, TABLE_SEQ_LEN, TABLE_SEQ_LENS

    p = sub.add_parser("table", help="the model x hardware table: the fastest configuration that fits each")
    p.add_argument("--seq-len", type=int, choices=TABLE_SEQ_LENS, default=TABLE_SEQ_LEN, help="tokens per sequence")
    p.add_argument("--global-batch-tokens", type=int, choices=TABLE_BATCH_TOKENS, default=TABLE_GLOBAL_BATCH_TOKENS,
                   help="tokens per optimizer step")
    p.add_argument("--format", choices=["table", "json"], default="table", help="table: Markdown")
    _lang_option(p)
    p.set_defaults(func=_lazy("calc.recommend.table"))
    p = sub.add_parser("export", help="ds_config.json, train.py, accelerate.yaml and launch.sh in a folder")
    p.add_argument("scenario")
    p.add_argument("-o", "--output", required=True, help="folder to write (created if missing)")
    p.add_argument("--lang", choices=["en", "zh"], default="en",
                   help="language of the comments in train.py, launch.sh and accelerate.yaml, and of the notes")
    _export_options(p)
    p.set_defaults(func=_lazy("calc.export.bundle"))
    p = sub.add_parser("export-deepspeed", help="DeepSpeed config for a scenario")
    p.add_argument("scenario")
    p.add_argument("-o", "--output")
    _export_options(p)
    p.set_defaults(func=_lazy("calc.export.deepspeed"))
    p = sub.add_parser("validate", help="predicted vs measured peaks for a data set")
    p.add_argument("data", nargs="*", help="JSON-lines measurement files (default: data/*.jsonl)")
    p.add_argument("--max-median", type=_percent, default=None, help="fail if median |error| %% exceeds this")
    p.add_argument("--max-worst", type=_percent, default=None, help="fail if worst |error| %% exceeds this")
    p.set_defaults(func=_lazy("calc.evidence.validate"))
    return ap


def main(argv: list[str] | None = None) -> int:
    from calc.contract.boundary import error_message

    args = build_parser().parse_args(argv)
    if _PROGRAM:
        gc.freeze()  # pydantic and the engine, imported with the package: alive until the process exits
        # A command is one bounded piece of work and the process ends with it: what reference cycles it leaves is
        # freed at exit, while the cyclic collector's passes over what a search makes (block profiles, memoized
        # estimates) cost `python -m calc recommend` about 0.01 s.
        gc.disable()
    try:
        return args.func(args)
    except (ValueError, ValidationError) as exc:  # UserError included: one short line, exit 2
        print(f"error: {error_message(exc)}", file=sys.stderr)
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

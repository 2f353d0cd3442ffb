"""python -m calc estimate SCENARIO [--format json|table] [--timeline] [--calibration FILE] [--lang en|zh]."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from calc.cli.options import lang_option
from calc.contract.boundary import read_text
from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, Lang, translate
from calc.contract.output import strict_json
from calc.contract.scenario import Scenario, load_scenario
from calc.contract.units import fmt_gib
from calc.memory.engine import estimate
from calc.memory.result import Estimate, event_text
from calc.memory.verdict import headline
from calc.recommend.phrase import pad, width

if TYPE_CHECKING:
    from calc.evidence.calibrate import CalibratedEstimate


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario JSON file ('-' for stdin)")
    p.add_argument("--format", choices=["json", "table"], default="json")
    p.add_argument("--timeline", action="store_true", help="include the step timeline in the JSON")
    p.add_argument("--calibration", help="calibration JSON from `calibrate`: adds the calibrated prediction")
    lang_option(p)


def run(args: argparse.Namespace) -> int:
    sc = load_scenario(args.scenario)
    est = estimate(sc)
    calibrated = calibrated_estimate(args.calibration, est, sc) if args.calibration else None
    if args.format == "json":
        data = est.model_dump(mode="json", exclude={"timeline"} if not args.timeline else None)
        if calibrated is not None:
            data["calibrated"] = calibrated.model_dump(mode="json")
        print(strict_json(data), end="")
    else:
        print(format_table(est, args.lang))
        if calibrated is not None:
            print(format_calibrated(calibrated, args.lang))
    return 0


def calibrated_estimate(path: str, est: Estimate, sc: Scenario) -> CalibratedEstimate:
    """The estimate with a calibration file's corrections (calc.evidence.calibrate, imported only when a file is
    given); UserError on another GPU."""
    from calc.evidence.calibrate import MAX_RECORD_FILE_BYTES, CalibrationError, apply, load_calibration

    text = read_text(path, MAX_RECORD_FILE_BYTES)  # UserError naming the file (unreadable, too big, not UTF-8)
    try:
        return apply(load_calibration(text, path), est, sc)
    except CalibrationError as exc:
        raise UserError(f"--calibration {exc}") from None


def rows_text(rows: list[tuple[str, str]], lang: Lang) -> str:
    """`key  value` lines, keys (message ids, an indent kept in front) translated and aligned."""
    if lang == DEFAULT_LANG:
        key_chars = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{key_chars}}  {v}" for k, v in rows)
    keys = [k[: len(k) - len(k.lstrip())] + translate(k.lstrip(), lang) for k, _ in rows]
    columns = max(map(width, keys))
    return "\n".join(f"{pad(k, columns)}  {v}" for k, (_, v) in zip(keys, rows, strict=True))


def format_calibrated(ce: CalibratedEstimate, lang: Lang = DEFAULT_LANG) -> str:
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
    return "\n" + rows_text(rows, lang) + "\n" + translate(N_("(low / expected / high; 1 GiB = 2^30 bytes)"), lang)


def peak_at(est: Estimate, lang: Lang) -> str:
    """'backward layer 3 (backward, step 1)' in `lang` (calc.memory.result's event words)."""
    if lang == DEFAULT_LANG:
        return f"{est.peak_event} ({est.peak_phase}, step {est.peak_step})"
    event = event_text(est.peak_event).render(lang)
    return translate(N_("{event} ({phase}, step {step})"), lang, event=event, phase=translate(est.peak_phase, lang),
                     step=est.peak_step)


def format_table(est: Estimate, lang: Lang = DEFAULT_LANG) -> str:
    """The estimate as aligned `key  value` lines in `lang` (1 GiB = 2^30 bytes)."""
    b = est.breakdown
    dt = est.device_total_bytes
    rows = [
        (N_("model"), translate(N_("{name} ({params} params)"), lang, name=est.model.name,
                                params=f"{est.model.total_params:,}")),
        (N_("peak allocated"), fmt_gib(est.peak_allocated_bytes)),
        ("  " + N_("peak at"), peak_at(est, lang)),
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
        h = est.host_memory
        for part in h.parts:  # per rank, as the host gives it (JSON: host_memory)
            rows.append(("  " + translate(part.label, lang), translate(
                N_("{size} per rank ({where})"), lang, size=fmt_gib(part.allocated_bytes),
                where=translate(N_("host RAM") if part.where == "host_ram" else N_("NVMe"), lang))))
        if h.ram_per_node_bytes:
            rows.append(("  " + N_("host RAM per node"), translate(
                N_("{ranks} ranks x {per_rank} (the larger of the offload buffers and the model's loading)"), lang,
                ranks=str(h.ranks_per_node), per_rank=fmt_gib(h.ram_per_node_bytes // h.ranks_per_node))))
    rows.append((N_("verdict"), headline(est.verdict, lang)))
    rows += [(N_("note"), note) for note in est.notes]  # e.g. a multimodal wrapper read as its language model
    return rows_text(rows, lang) + "\n" + translate(N_("(1 GiB = 2^30 bytes)"), lang)

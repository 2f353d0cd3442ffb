"""python -m calc recommend FILE [--top N] [--format table|json]."""

from __future__ import annotations

from typing import Any

from calc.recommend.models import Recommendation, RecommendRequest
from calc.recommend.search import recommend
from calc.units import GiB, fmt_gib
from calc.verdict import short


def load_request(path: str, top: int | None = None) -> RecommendRequest:
    """A scenario file, or a RecommendRequest file (a JSON object with a "scenario" key)."""
    from calc.__main__ import load_scenario, read_json
    from calc.boundary import validate

    data = read_json(path)
    if isinstance(data, dict) and "scenario" in data:
        if top is not None:
            data = {**data, "max_candidates": top}
        return validate(RecommendRequest, data, "stdin" if path == "-" else path)
    sc = load_scenario(path, data)
    return RecommendRequest(scenario=sc, max_candidates=top or 10)


def format_recommendation(rec: Recommendation) -> str:
    """The CLI table: one block per group (full fine-tuning, adapters), each with its explanation and advice."""
    lines = []
    for g in rec.groups:
        lines.append(f"== {g.label} ==")
        lines.append(f"{'#':>2}  {'tok/s/GPU':>10}  {'step s':>8}  {'device total':>13}  verdict  configuration")
        cands = [c for c in rec.candidates if c.group == g.group]
        for c in cands:
            lines.append(f"{c.rank:>2}  {c.tokens_per_s_per_gpu:>10,.0f}  {c.step_s:>8.3g}  "
                         f"{c.device_total_expected_bytes / GiB:>9.2f} GiB  {short(c.verdict):<7}  {c.label}"
                         + ("  [method change]" if c.method_change else ""))
        if not cands:
            lines.append("    (nothing fits)")
        lines.append(g.explanation)
        lines += [f"  - {a}" for a in g.advice]
        lines.append("")
    if len(rec.groups) > 1:
        lines.append(rec.explanation)
    for n in rec.notes:
        lines.append(f"note: {n}")
    st = rec.stats
    lines.append(f"(usable {fmt_gib(rec.usable_bytes)} of {fmt_gib(rec.gpu_memory_bytes)} per GPU; "
                 f"global batch {rec.target_global_batch_sequences} sequences; searched {st.combinations} "
                 f"combinations with {st.memory_estimates} memory estimates in {st.elapsed_s:.2f} s; "
                 "1 GiB = 2^30 bytes)")
    return "\n".join(lines)


def cli_main(args: Any) -> int:
    """python -m calc recommend FILE [--top N] [--format table|json]. Errors leave as ValueError: under
    `python -m calc` the running module is __main__, so calc.__main__.UserError raised here would be a
    different class from the one main() catches; main() maps ValueError to one line and exit code 2."""
    from calc.errors import UserError

    try:
        req = load_request(args.scenario, getattr(args, "top", None))
        rec = recommend(req)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    if getattr(args, "format", "table") == "json":
        print(rec.model_dump_json(indent=2))
    else:
        print(format_recommendation(rec))
    return 0

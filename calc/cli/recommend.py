"""python -m calc recommend FILE [--top N] [--format table|json] [--lang en|zh]."""

from __future__ import annotations

import argparse

from calc.cli.options import count, lang_option
from calc.contract.boundary import read_json, validate
from calc.contract.i18n import DEFAULT_LANG, N_, Lang, translate
from calc.contract.scenario import load_scenario
from calc.contract.units import GiB, fmt_gib
from calc.memory.verdict import short
from calc.recommend.models import Recommendation, RecommendRequest
from calc.recommend.phrase import pad, render
from calc.recommend.search import recommend
from calc.recommend.words import per_gpu_at


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario")
    p.add_argument("--top", type=count, help="how many configurations to list (1-1000; default: a request file's "
                   "max_candidates, else 10)")
    p.add_argument("--format", choices=["json", "table"], default="table")
    lang_option(p)


def load_request(path: str, top: int | None = None) -> RecommendRequest:
    """A scenario file, or a RecommendRequest file (a JSON object with a "scenario" key)."""
    data = read_json(path)
    if isinstance(data, dict) and "scenario" in data:
        if top is not None:
            data = {**data, "max_candidates": top}
        return validate(RecommendRequest, data, "stdin" if path == "-" else path)
    sc = load_scenario(path, data)
    return RecommendRequest(scenario=sc) if top is None else RecommendRequest(scenario=sc, max_candidates=top)


def format_recommendation(rec: Recommendation, lang: Lang = DEFAULT_LANG) -> str:
    """The CLI table: one block per group (full fine-tuning, adapters), each with its explanation and advice
    (in `lang`; the numbers and units are the same in every language)."""
    def t(msgid: str, **fields: object) -> str:
        return translate(msgid, lang, **fields)

    lines = []
    for g in rec.groups:
        lines.append(f"== {render(g.label, lang)} ==")
        lines.append(f"{pad('#', 2, '>')}  {pad(t(N_('tok/s/GPU')), 10, '>')}  {pad(t(N_('step s')), 8, '>')}  "
                     f"{pad(t(N_('device total')), 13, '>')}  {pad(t(N_('verdict')), 7)}  {t(N_('configuration'))}")
        cands = [c for c in rec.candidates if c.group == g.group]
        if cands:  # the batch every speed below is at (the scenario's global batch, reached in whole sequences)
            lines.append(render(per_gpu_at(cands[0].global_batch_tokens), lang) + ":")
        for c in cands:
            lines.append(f"{c.rank:>2}  {c.tokens_per_s_per_gpu:>10,.0f}  {c.step_s:>8.3g}  "
                         f"{c.device_total_expected_bytes / GiB:>9.2f} GiB  {pad(short(c.verdict, lang), 7)}  "
                         f"{render(c.label, lang)}" + ("  " + t(N_("[method change]")) if c.method_change else ""))
        if not cands:
            lines.append("    " + t(N_("(nothing fits)")))
        lines.append(render(g.explanation, lang))
        lines += [f"  - {render(a, lang)}" for a in g.advice]
        lines.append("")
    if len(rec.groups) > 1:
        lines.append(render(rec.explanation, lang))
    for n in rec.notes:
        lines.append(t(N_("note: {note}"), note=render(n, lang)))
    st = rec.stats
    lines.append(t(N_("(usable {usable} of {memory} per GPU; global batch {sequences} sequences; searched "
                      "{combinations} combinations with {estimates} memory estimates in {seconds} s; "
                      "1 GiB = 2^30 bytes)"),
                   usable=fmt_gib(rec.usable_bytes), memory=fmt_gib(rec.gpu_memory_bytes),
                   sequences=rec.target_global_batch_sequences, combinations=st.combinations,
                   estimates=st.memory_estimates, seconds=f"{st.elapsed_s:.2f}"))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rec = recommend(load_request(args.scenario, args.top))
    if args.format == "json":
        print(rec.model_dump_json(indent=2))
    else:
        print(format_recommendation(rec, args.lang))
    return 0

"""Write docs/published_gpu.md: the engine against the peak GPU memory that torchtune, LitGPT, torchtitan and Qwen
publish for real CUDA runs (data/published_gpu.yaml), as `python -m calc validate --published` computes it.

    python scripts/published_doc.py           # rewrite docs/published_gpu.md
    python scripts/published_doc.py --check   # write nothing; exit 1 when docs/published_gpu.md is out of date

The whole file is generated (edit this script, not the page): every figure comes from calc.evidence.published.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calc.contract.published import PublishedFile, load_published  # noqa: E402
from calc.contract.units import GiB  # noqa: E402
from calc.evidence.published import WITHIN_PCT, PublishedReport, report  # noqa: E402

PAGE = ROOT / "docs" / "published_gpu.md"
SOURCES = (  # id prefix -> how the section is titled
    ("torchtune-", "torchtune: README and docs (development set)"),
    ("litgpt-", "LitGPT: tutorials/resource-tables.md (held out)"),
    ("torchtitan-", "torchtitan: benchmarks/ (held out)"),
    ("qwen3-", "Qwen3: speed benchmark with Hugging Face transformers (held out)"),
)
INTRO = """# Published GPU figures

Peak GPU memory that torchtune, LitGPT, torchtitan and Qwen publish for real CUDA runs, each beside the
calculator's prediction of the same figure. The data, with every entry's source (repository, file, commit and the
row as printed), the configuration the source states and the scenario built from it, is
`data/published_gpu.yaml`; `python -m calc validate --published` prints the same comparison.

How to read it:

- **metric**: what the source's figure is. `peak_allocated` is `torch.cuda.max_memory_allocated()`, `peak_active`
  the caching allocator's peak active bytes (they peak together; both are compared with the predicted peak
  allocated), `peak_reserved` is `torch.cuda.max_memory_reserved()` (compared with the peak plus the allocator's
  expected reserve), `sum_peak_allocated` the allocated peaks summed over the GPUs, `device_used` what nvidia-smi
  shows (compared with the expected device total: the peak, the CUDA context, NCCL buffers and the reserve). A metric in *italics* is not
  named by the source: it is the figure the framework itself logs.
- **stated**: *no* where the source leaves part of the configuration out (an unpacked dataset whose longest
  batch is not given, a GPU row whose settings differ from the recipe's). Such entries are kept, and left out of
  the accuracy figures.
- **not yet estimable**: the configuration uses something this version of the calculator does not model yet
  (a framework's own model code, compile, paged optimizers, generation with a KV cache, ...) or that no scenario
  field can express (float8 training, context parallelism, FSDP CPU offload, LLaMA-Adapter). The reason is the
  calculator's own.
- **development / held out**: torchtune's README and docs are what the frameworks' mechanisms are built against;
  every other source is held out and judges them.

Sizes are GiB (2^30 bytes), whatever unit the source printed (the data keeps the source's figure and unit).
"""


def summary(rep: PublishedReport) -> list[str]:
    lines = ["## Accuracy per framework", "",
             f"| framework | split | entries | not fully stated | not yet estimable | counted | median abs error "
             f"| worst abs error | within {WITHIN_PCT:g} % |", "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for s in rep.frameworks:
        med = "-" if s.median_abs_error_pct is None else f"{s.median_abs_error_pct:.1f} %"
        worst = "-" if s.worst_abs_error_pct is None else f"{s.worst_abs_error_pct:.1f} %"
        lines.append(f"| {s.framework} | {s.split} | {s.entries} | {s.incomplete} | {s.not_estimable} | {s.counted} "
                     f"| {med} | {worst} | {s.within_10_pct} |")
    return [*lines, "", "counted: fully stated and estimable.", ""]


def reasons(rep: PublishedReport) -> list[str]:
    """Why entries are not yet estimable, most frequent first: what has to land before they count."""
    counts = Counter(c.not_estimable for c in rep.cases if c.not_estimable)
    lines = ["## Why entries are not yet estimable", "", "| entries | reason |", "|--:|---|"]
    lines += [f"| {n} | {_cell(why)} |" for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return [*lines, ""]


def entries(rep: PublishedReport, published: PublishedFile) -> list[str]:
    by_id = {e.id: e for e in published.entries}
    lines: list[str] = []
    for prefix, title in SOURCES:
        cases = [c for c in rep.cases if c.id.startswith(prefix)]
        if not cases:
            continue
        lines += [f"## {title}", "", "| entry | model | GPU | method | metric | stated | published | predicted "
                  "| error |", "|---|---|---|---|---|---|--:|--:|---|"]
        for c in cases:
            e = by_id[c.id]
            metric = c.metric if e.metric_stated else f"*{c.metric}*"
            src = f"[{c.id}]({e.source.url})"
            pred = "-" if c.predicted_bytes is None else f"{c.predicted_bytes / GiB:.2f}"
            err = f"not yet estimable: {_cell(c.not_estimable)}" if c.error_pct is None else f"{c.error_pct:+.1f} %"
            lines.append(f"| {src} | {_cell(c.model)} | {_cell(c.gpu)} | {c.method} | {metric} | "
                         f"{'yes' if c.complete else 'no'} | {c.published_bytes / GiB:.2f} | {pred} | {err} |")
        lines.append("")
    return lines


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "/").replace("\n", " ")


def render() -> str:
    published = load_published()
    rep = report(published)
    return "\n".join([INTRO, *summary(rep), *reasons(rep), *entries(rep, published)]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"out of date: {PAGE.relative_to(ROOT)} (run: python scripts/published_doc.py)")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate the generated parts of the documentation from the committed measurements.

    python scripts/docs.py           # rewrite every generated block in README.md and docs/accuracy.md
    python scripts/docs.py --check   # write nothing; exit 1 and name the files whose blocks are out of date

A generated block lies between two marker comments, `<!-- NAME:start -->` and `<!-- NAME:end -->`; the
text around the markers is written by hand and left alone. Every accuracy figure comes from
calc.evidence.validate (the library behind `python -m calc validate` and the Validation page): each record
of data/*.jsonl predicted with the kernels it ran on and compared with its measured peak allocated bytes.
The verdict example is the engine's own (calc.memory.engine.estimate).

Blocks:
    README.md          accuracy   one summary table (all records, per device, per engine, held out, ...)
                       verdict    the estimate's verdict in JSON for one offload scenario (calc.memory.engine)
    docs/accuracy.md   sets       one row per record file: what it holds, how it was measured, its error
                       engines    engine x device, records the engine was built against vs held out
                       groups     every group `python -m calc validate` prints
                       evidence   what is measured and what is modelled from a library's source only
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calc.contract.record import MeasurementRecord  # noqa: E402
from calc.evidence import validate  # noqa: E402
from calc.memory import overhead  # noqa: E402

README = ROOT / "README.md"
ACCURACY = ROOT / "docs" / "accuracy.md"
GIB = 2**30  # 1 GiB = 2^30 bytes

# How each committed record set was made (the figures beside it are generated from the records).
SET_METHODS: dict[str, str] = {
    "measured_cpu.jsonl": (
        "Small models of every supported family on the CPU with real tensors, counted by PyTorch's MemTracker "
        "(`python -m measure.suite --device cpu`). The sharded runs are PyTorch FSDP2 (`fully_shard` per decoder "
        "layer) over a fake process group, rank 0 measured; the expert-parallel ones run transformers' own "
        "expert parallelism (`measure/sharded.py`)."),
    "measured_fake.jsonl": (
        "Full-size presets under FakeTensorMode (`python -m measure ... --device fake`): the same "
        "step as on the CPU with nothing allocated, so the count equals a CPU run's; also sharded runs of the presets "
        "and of the small configs (equal to their CPU records). Deep models are measured at "
        "three depths a period apart and extrapolated only where the third depth is reproduced exactly "
        "(`--extrapolate`)."),
    "measured_fake_heldout.jsonl": (
        "Full-size presets under FakeTensorMode, in configurations the engine was not built against (eager "
        "Gemma 2, fp32 for-loop Adam, selective checkpointing at 4k tokens, LoRA, inference, ...)."),
    "measured_ep_heldout.jsonl": (
        "Mixture-of-experts models (Qwen3-MoE, Mixtral, DeepSeek-V3, GLM-4.5 shapes) under FSDP2 on 2-8 ranks "
        "of a fake process group, with and without transformers' expert parallelism, rank 0 measured; each "
        "batch measured as a check on the engine as it then stood."),
    "measured_litgpt.jsonl": (
        "LitGPT itself: `litgpt.GPT` built from the scenario's config and `finetune/full.py`'s step (the model's "
        "fp32 logits kept by the loop, `chunked_cross_entropy`) under Lightning Fabric's bf16-true / bf16-mixed on "
        "the CPU with real tensors, counted by MemTracker (`python -m measure SCENARIO.json --device cpu` with "
        "`training.framework` litgpt); the `heldout-` runs were predicted before they were measured."),
    "measured_torchtune.jsonl": (
        "torchtune 0.6.1 itself: small Llama 3 / 3.1 / 3.2, Qwen2 and Mistral decoders from torchtune's component builders "
        "on the CPU with real tensors, and Llama 3.2 1B / 3B and Qwen2.5 0.5B under FakeTensorMode; three steps of "
        "its single-device full fine-tuning and LoRA recipes' loop (chunked or whole cross-entropy, with and "
        "without activation checkpointing, bf16 and fp32), counted by MemTracker without its module gradient hooks "
        "(`python -m measure.frameworks.torchtune_run`)."),
    "measured_deepspeed.jsonl": (
        "DeepSpeed itself: the scenario's exported `ds_config.json` and model builder run by "
        "`deepspeed.initialize` on DeepSpeed's CPU accelerator, 1-4 ranks started by torchrun over gloo, rank 0 "
        "counted by MemTracker from before the model is built (`python -m measure SCENARIO.json --device cpu "
        "--engine deepspeed`; the whole set: `python -m measure.deepspeed_run --suite FILE`)."),
    "measured_deepspeed_heldout.jsonl": (
        "DeepSpeed itself, as above, in configurations measured after the engine's DeepSpeed model was "
        "written (other widths and depths, world size 3, pure bf16 and amp, small reduce buckets, "
        "offload at ZeRO-1; `python -m measure.deepspeed_run --heldout-suite FILE`)."),
    "measured_cuda.jsonl": (
        "A real GPU: the small-model suite and 0.5B-8B presets, the same step as on the CPU, "
        "`torch.cuda.max_memory_allocated()` per phase with the allocator's reserve and the driver's used bytes "
        "(`bash measure/run_gpu.sh`). A warm-up GEMM forward and backward allocates both threads' cuBLAS workspaces "
        "before the model is built; each record keeps that baseline, and the error compares the peak above it with "
        "the estimate less its workspaces (`python -m calc validate` checks the workspaces against the baselines). "
        "None of these runs was seen before it was measured; the engine was not changed after."),
}

# The README's verdict example: the GPU has room, the host RAM that the optimizer offload needs does not.
VERDICT_EXAMPLE = {"model": "llama-2-7b", "hardware": {"cluster": "1x-rtx-4090"},
                   "training": {"precision": "bf16-mixed", "activation_checkpointing": "full", "zero_stage": 2,
                                "offload_optimizer": "cpu"}}

DEVICE_LABELS = {"cpu": "CPU, real tensors", "fake": "FakeTensorMode", "cuda": "CUDA GPU"}
ENGINE_LABELS = {"torch-single": "PyTorch, one process", "fsdp2": "PyTorch FSDP2", "deepspeed": "DeepSpeed"}


@dataclass(frozen=True)
class Run:
    """One committed record, the file it is in, and its comparison with the engine's prediction."""

    file: str
    record: MeasurementRecord
    case: validate.Case

    @property
    def held_out(self) -> bool:
        """Measured as a check, after the engine change it checks: a `*_heldout.jsonl` file or a `heldout-` name."""
        return self.file.endswith("_heldout.jsonl") or (self.case.name or "").startswith("heldout")

    @property
    def ranks(self) -> int:
        return self.record.sharding.world_size if self.record.sharding else 1


def runs(files: Iterable[Path] | None = None) -> list[Run]:
    """Every record of `files` (default: data/*.jsonl) compared with its prediction (calc.evidence.validate)."""
    out: list[Run] = []
    for path in (files if files is not None else validate.default_data_files()):
        for record in validate.load_all([path]):
            out.append(Run(path.name, record, validate.compare(record, len(out))))
    return out


# ---- formatting ------------------------------------------------------------------------------------------

def _pct(value: float) -> str:
    return f"{value:.2f} %"


def _errors(selected: list[Run]) -> tuple[str, str, str]:
    """(runs, median |error|, worst |error|) of the selection; dashes when it is empty."""
    errs = [abs(r.case.error_pct) for r in selected]
    if not errs:
        return "0", "-", "-"
    return str(len(errs)), _pct(statistics.median(errs)), _pct(max(errs))


def _span(values: Iterable[int], fmt: Callable[[int], str] = str) -> str:
    vs = sorted(set(values))
    if not vs:
        return "-"
    return fmt(vs[0]) if len(vs) == 1 else f"{fmt(vs[0])}-{fmt(vs[-1])}"


def _params(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _gib(n_bytes: int) -> str:
    x = n_bytes / GIB
    return f"{x:.4f}" if x < 0.01 else f"{x:.2f}" if x < 10 else f"{x:,.0f}"


def _labels(values: Iterable[str], labels: dict[str, str]) -> str:
    """The labels of `values` in the order of `labels` (unknown values last, as they are)."""
    present = set(values)
    order = [labels[k] for k in labels if k in present] + sorted(present - set(labels))
    return "; ".join(order)


def _table(header: list[str], rows: list[list[str]]) -> str:
    cells = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells)


def _deepspeed_version() -> str:
    text = (ROOT / "requirements-dev.txt").read_text(encoding="utf-8")
    found = re.search(r"^deepspeed==(\S+)", text, re.M)
    return found.group(1) if found else "(unpinned)"


# ---- the blocks ------------------------------------------------------------------------------------------

def readme_accuracy(all_runs: list[Run]) -> str:
    """The README's one table: how far the predicted peak is from the measured one, by kind of run."""
    def where(pred: Callable[[Run], bool]) -> list[Run]:
        return [r for r in all_runs if pred(r)]

    fsdp = where(lambda r: r.record.engine == "fsdp2")
    ds = where(lambda r: r.record.engine == "deepspeed")
    fake = where(lambda r: r.record.device == "fake")
    stages = sorted({r.record.sharding.zero_stage for r in ds if r.record.sharding})
    rows = [
        ("every committed run", all_runs),
        ("small models on the CPU, real tensors", where(lambda r: r.record.device == "cpu")),
        (f"models up to {_params(max((r.record.num_params for r in fake), default=0))} parameters under "
         "FakeTensorMode (nothing allocated)", fake),
        ("a real CUDA GPU", where(lambda r: r.record.device == "cuda")),
        ("a real CUDA GPU, full-size presets (1 GiB and more)", where(lambda r: validate.is_full_size_gpu(r.case))),
        ("plain PyTorch, one process", where(lambda r: r.record.engine == "torch-single")),
        (f"PyTorch FSDP2, rank 0 of {_span(r.ranks for r in fsdp)}", fsdp),
        (f"DeepSpeed {_deepspeed_version()} itself, ZeRO {_span(stages)}, rank 0 of {_span(r.ranks for r in ds)}",
         ds),
        ("expert parallelism (MoE)", where(lambda r: "expert parallel" in r.case.workload)),
        ("training", where(lambda r: r.case.mode == "train")),
        ("inference", where(lambda r: r.case.mode == "inference")),
        ("held out: measured as a check on the engine as it then stood", where(lambda r: r.held_out)),
    ]
    table = _table(["runs measured on", "runs", "median error", "worst error"],
                   [[label, *_errors(sel)] for label, sel in rows])
    return (table + "\n\nError: |predicted - measured| / measured, of the peak allocated bytes of one GPU (rank 0 "
            "in a sharded run), over the records in `data/*.jsonl`. Regenerated by `python scripts/docs.py`.")


def readme_verdict() -> str:
    """The README's verdict example: the scenario, and the verdict `python -m calc estimate` gives it."""
    from calc.contract.scenario import Scenario
    from calc.memory.engine import estimate
    from calc.memory.host import host_ram_words

    est = estimate(Scenario.model_validate(VERDICT_EXAMPLE))
    verdict = est.verdict.model_dump(mode="json")
    limits = ",\n                       ".join(json.dumps(limit) for limit in verdict["limits"])
    host = est.host_memory
    parts = ",\n                      ".join(json.dumps({k: getattr(p, k) for k in (
        "key", "requested_bytes", "allocated_bytes", "pinned_tensors")}) for p in host.parts)
    return (f"For `{json.dumps(VERDICT_EXAMPLE)}`:\n\n```json\n"
            f'"verdict": {{"fits": {json.dumps(verdict["fits"])},\n'
            f'            "limits": [{limits}],\n'
            f'            "reasons": {json.dumps(verdict["reasons"], ensure_ascii=False)}}},\n'
            f'"host_memory": {{"parts": [{parts}],\n'
            f'                "ranks_per_node": {host.ranks_per_node}, '
            f'"ram_per_node_bytes": {host.ram_per_node_bytes}, "decided_by": "{host.decided_by}"}}\n```\n\n'
            f"({host_ram_words(host)}; each part's `source` names the DeepSpeed code that allocates it.)")


def accuracy_sets(all_runs: list[Run]) -> str:
    """docs/accuracy.md: one row per record file, and how each was measured."""
    files = sorted({r.file for r in all_runs})
    rows, methods = [], []
    for name in files:
        sel = [r for r in all_runs if r.file == name]
        devices = _labels((r.record.device for r in sel), DEVICE_LABELS)
        engines = _labels((r.record.engine for r in sel), ENGINE_LABELS)
        held = sum(r.held_out for r in sel)
        extrapolated = sum(bool(r.record.extrapolated_from_layers) for r in sel)
        measured = _span((r.record.peak_allocated_bytes for r in sel), _gib)
        dates = sorted(r.record.measured_at.date().isoformat() for r in sel)
        date = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        rows.append([f"`data/{name}`", *_errors(sel)[:1], str(held), devices, engines, _span(r.ranks for r in sel),
                     _span((r.record.num_params for r in sel), _params), str(extrapolated), measured, date,
                     *_errors(sel)[1:]])
        envs = sorted({(r.record.env.torch, r.record.env.transformers, r.record.env.peft or "-",
                        r.record.env.device_name) for r in sel})
        stack = "; ".join(f"torch {t}, transformers {tf}, peft {p}, on {d}" for t, tf, p, d in envs)
        methods.append(f"- `data/{name}`: {SET_METHODS.get(name, 'measured with `python -m measure`.')} "
                       f"Software: {stack}.")
    for name, text in SET_METHODS.items():
        if name not in files:
            methods.append(f"- `data/{name}` (none committed yet): {text}")
    table = _table(["file", "runs", "held out", "device", "engine", "ranks", "parameters", "extrapolated",
                    "measured peak, GiB", "measured", "median error", "worst error"], rows)
    return table + "\n\nGiB = 2^30 bytes. How each set was measured:\n\n" + "\n".join(methods)


def accuracy_engines(all_runs: list[Run]) -> str:
    """docs/accuracy.md: engine x device, split into the records the engine was built against and held-out ones."""
    order = {**{k: i for i, k in enumerate(ENGINE_LABELS)}, **{k: i for i, k in enumerate(DEVICE_LABELS)}}
    keys = sorted({(r.record.engine, r.record.device) for r in all_runs},
                  key=lambda k: (order.get(k[0], len(order)), k[0], order.get(k[1], len(order)), k[1]))
    rows = []
    for engine, device in keys:
        sel = [r for r in all_runs if (r.record.engine, r.record.device) == (engine, device)]
        built = [r for r in sel if not r.held_out]
        held = [r for r in sel if r.held_out]
        rows.append([ENGINE_LABELS.get(engine, engine), DEVICE_LABELS.get(device, device), *_errors(sel),
                     *_errors(built), *_errors(held)])
    rows.append(["all", "all", *_errors(all_runs), *_errors([r for r in all_runs if not r.held_out]),
                 *_errors([r for r in all_runs if r.held_out])])
    return _table(["engine", "device", "runs", "median", "worst", "built against: runs", "median", "worst",
                   "held out: runs", "median", "worst"], rows)


def accuracy_groups(all_runs: list[Run]) -> str:
    """docs/accuracy.md: every group `python -m calc validate` prints (calc.evidence.validate.report)."""
    rep = validate.report([r.record for r in all_runs])
    rows = [[g.group, g.value, str(g.count), _pct(g.median_abs_error_pct), _pct(g.worst_abs_error_pct)]
            for g in rep.groups]
    return (_table(["group", "value", "runs", "median error", "worst error"], rows)
            + f"\n\nAll: {len(rep.cases)} runs, median error {_pct(rep.median_abs_error_pct)}, worst "
            f"{_pct(rep.worst_abs_error_pct)}.")


def gpu_device_terms(all_runs: list[Run]) -> str:
    """docs/accuracy.md: what the GPU records read beyond peak allocated (the device total's terms), beside the
    figures calc.memory.overhead assumes; empty without GPU records."""
    runs = [r for r in all_runs if r.record.device == "cuda" and r.record.device_used_bytes
            and r.record.peak_reserved_bytes]
    if not runs:
        return ""
    gpu = [r.record for r in runs]
    context = sorted(r.device_used_bytes - r.peak_reserved_bytes for r in gpu)
    big = [r.record for r in runs if validate.is_full_size_gpu(r.case)]
    reserve = sorted(100 * (r.peak_reserved_bytes - r.peak_allocated_bytes) / r.peak_allocated_bytes for r in big)
    names = ", ".join(sorted({f"{r.env.device_name} (torch {r.env.torch})" for r in gpu}))
    mib = 2**20

    def levels(d: dict[str, float], scale: float, unit: str) -> str:
        return " / ".join(f"{d[k] * scale:,.0f}{unit}" for k in ("low", "expected", "high"))

    return (f"The device total's terms, read on the GPU records but not compared by the error figures above "
            f"({len(gpu)} runs on {names}): the CUDA context and libraries outside the caching allocator "
            f"(`mem_get_info`'s used bytes less max reserved, at each run's end) {context[0] / mib:,.0f}-"
            f"{context[-1] / mib:,.0f} MiB, median {statistics.median(context) / mib:,.0f} MiB, where the engine "
            f"assumes {levels(overhead.CUDA_CONTEXT_BYTES, 1 / mib, ' MiB')} (low / expected / high); the "
            f"allocator's reserve at the peak (max reserved less max allocated) on the {len(big)} runs of 1 GiB and "
            f"more {reserve[0]:.1f}-{reserve[-1]:.1f} %, median {statistics.median(reserve):.1f} %, where it "
            f"assumes {levels(overhead.RESERVE_FRACTION, 100, ' %')} plus a floor. These runs had memory to "
            f"spare, so the allocator kept what it cached; a job near the limit frees cached blocks and retries "
            f"before it fails, and keeps less. The engine's expected figures are still the documented ones.\n\n")


def accuracy_evidence() -> str:
    """docs/accuracy.md: what the records measure and what rests on a library's source alone."""
    families = _table(["family", "measured", "modelled from source, or refused"],
                      [list(row) for row in validate.FAMILY_EVIDENCE])
    source = "\n".join(f"- **{what}**: {why}" for what, why in validate.MODELLED_FROM_SOURCE)
    deepspeed = _table(["DeepSpeed behaviour", "evidence"], [list(row) for row in validate.DEEPSPEED_BEHAVIOURS])
    gaps = "\n".join(f"- **{what}**: {known}" for what, known in validate.GPU_GAPS)
    return (f"Per model family:\n\n{families}\n\nModelled from source, not measured:\n\n{source}\n\n"
            f"What the GPU runs show that the estimate does not model yet:\n\n{gaps}\n\n"
            f"DeepSpeed:\n\n{deepspeed}")


# ---- markers ---------------------------------------------------------------------------------------------

def fill(text: str, name: str, body: str) -> str:
    """`text` with the block `name` (between its two marker comments) replaced by `body`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise SystemExit(f"docs: expected one {start} ... {end} pair")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def rendered(all_runs: list[Run] | None = None) -> dict[Path, str]:
    """Each generated file as it should read now."""
    all_runs = runs() if all_runs is None else all_runs
    readme = fill(README.read_text(encoding="utf-8"), "accuracy", readme_accuracy(all_runs))
    readme = fill(readme, "verdict", readme_verdict())
    acc = ACCURACY.read_text(encoding="utf-8")
    for name, body in (("sets", accuracy_sets(all_runs)), ("engines", accuracy_engines(all_runs)),
                       ("groups", accuracy_groups(all_runs)),
                       ("evidence", gpu_device_terms(all_runs) + accuracy_evidence())):
        acc = fill(acc, name, body)
    return {README: readme, ACCURACY: acc}


def outdated(files: dict[Path, str] | None = None) -> list[Path]:
    """The files whose generated blocks differ from what the records give now."""
    files = rendered() if files is None else files
    return [path for path, text in files.items() if path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/docs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated block is out of date")
    args = ap.parse_args(argv)
    files = rendered()
    stale = outdated(files)
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run: python scripts/docs.py)")
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

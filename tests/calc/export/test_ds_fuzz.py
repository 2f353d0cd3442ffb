"""Fuzz over ds_config input (hypothesis): mutations of valid ds_configs (the Hugging Face guide's ZeRO-2/3 configs
and an exported one) with values of the wrong type, unknown keys, removed keys, huge numbers, NaN and Infinity, fed
through the import as a library call (dict and JSON text), `python -m calc import-deepspeed` and the Export page's
paste box. Every input ends in a result or one line of error, never a traceback, in at most 2 s, and the whole run
grows the process by less than 500 MB. The run is bounded: about 20 s on the 2-core development machine."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import resource
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calc.cli.main import main
from calc.contract.boundary import error_message, parse_json
from calc.contract.scenario import Scenario
from calc.export import export_deepspeed, import_ds_config
from calc.memory.engine import estimate
from tests.calc.export.test_ds_auto import HF_ZERO2, HF_ZERO3

BASE = Scenario(model="llama-3.2-1b", hardware={"cluster": "8x-a100-80gb"},
                training={"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 1024})
VALID = [HF_ZERO2, HF_ZERO3, export_deepspeed(BASE.with_training(zero_stage=3, precision="bf16-mixed")).config,
         {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}}]
SECONDS = 2.0
MAX_GROWTH_BYTES = 500 * 2**20
KEYS = ["stage", "reduce_bucket_size", "allgather_bucket_size", "offload_optimizer", "offload_param", "device",
        "enabled", "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "autotp_size",
        "stage3_prefetch_bucket_size", "number_checkpoints", "type", "params", "mics_shard_size", "amp", "dtype",
        "cpu_offload", "zero_optimization", "bf16", "fp16", "torch_autocast", "pipeline", "stages", "ratio"]

leaves = st.one_of(st.none(), st.booleans(), st.just("auto"), st.integers(-2**70, 2**70),
                   st.sampled_from([0, 1, 3, 7, 1e20, 2**63, -1, 5e8, 2.5]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                   st.sampled_from(["cpu", "nvme", "none", "gpu", "bf16", "AdamW", "Lamb", "\x1b[31m", "[x](y)"]),
                   st.lists(st.integers(0, 9), max_size=3), st.dictionaries(st.sampled_from(KEYS), st.integers(), max_size=2))


def _blocks(cfg: dict, path: tuple = ()) -> list[tuple]:
    """The paths of every object in the config (the root included)."""
    out = [path]
    for key, value in cfg.items():
        if isinstance(value, dict):
            out += _blocks(value, (*path, key))
    return out


def _at(cfg: dict, path: tuple) -> dict:
    for key in path:
        cfg = cfg[key]
    return cfg


@st.composite
def ds_configs(draw) -> dict:
    cfg = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        block = _at(cfg, draw(st.sampled_from(_blocks(cfg))))
        op = draw(st.sampled_from(["set", "drop", "add"]))
        if op == "drop" and block:
            block.pop(draw(st.sampled_from(sorted(block))))
        elif op == "set" and block:
            block[draw(st.sampled_from(sorted(block)))] = draw(leaves)
        else:
            block[draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=10)))] = draw(leaves)
    return cfg


def _one_line(message: str) -> None:
    assert message and "\n" not in message and len(message) <= 500 and "Traceback" not in message, message


def _import(cfg, as_text: bool) -> None:
    """The library boundary: a result (the import and its estimate) or a ValueError that error_message makes one
    line of. Anything else (TypeError, KeyError, RecursionError, ...) escapes and fails the test."""
    start = time.perf_counter()
    try:
        if as_text:
            cfg = parse_json(json.dumps(cfg, allow_nan=True), "ds_config.json")
        result = import_ds_config(cfg, BASE)
        estimate(result.scenario)
        json.dumps(result.config, allow_nan=False)  # what it reports is strict JSON
    except ValueError as exc:
        _one_line(error_message(exc))
    assert time.perf_counter() - start <= SECONDS


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=ds_configs(), as_text=st.booleans())
def test_the_import_gives_a_result_or_one_line(cfg, as_text) -> None:
    _import(cfg, as_text)


_DIR = Path(tempfile.mkdtemp(prefix="ds_fuzz_"))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=ds_configs())
def test_the_cli_gives_a_result_or_one_line(cfg) -> None:
    path = _DIR / "ds.json"
    path.write_text(json.dumps(cfg, allow_nan=True))
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["import-deepspeed", str(path), "--model", "llama-3.2-1b", "--hardware", "8x-a100-80gb"])
    assert time.perf_counter() - start <= SECONDS
    if code == 0:
        Scenario.model_validate_json(out.getvalue())
    else:
        assert code == 2 and not out.getvalue()
        _one_line(err.getvalue().rstrip("\n").removeprefix("error: "))


_PAGE: list = []


def _page():
    if not _PAGE:
        from tests.app.test_app_helpers import open_app

        _PAGE.append(open_app("export"))
    return _PAGE[0]


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=ds_configs())
def test_the_export_page_gives_a_result_or_one_line(cfg) -> None:
    from tests.app.test_app_helpers import assert_clean

    at = _page()
    [t for t in at.text_area if t.key == "exp_import_text"][0].set_value(json.dumps(cfg, allow_nan=True))
    start = time.perf_counter()
    at.run()
    assert time.perf_counter() - start <= SECONDS
    assert_clean(at)
    errors = [e.value for e in at.error if e.value.startswith("pasted config")]
    for message in errors:
        _one_line(message)
    assert errors or any(b.key == "exp_import_use" for b in at.button)


def test_memory_and_nan_bounds() -> None:
    """A run of the worst inputs (deep NaN, 2^70, a 10,000-key block) grows the process by less than 500 MB."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    wide = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {f"k{i}": i for i in range(10_000)}}
    for cfg in (wide, {"train_micro_batch_size_per_gpu": math.nan}, {"train_batch_size": 2**70},
                {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "reduce_bucket_size": 2**62}},
                {"train_micro_batch_size_per_gpu": 10**6}):
        for as_text in (False, True):
            _import(cfg, as_text)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < MAX_GROWTH_BYTES

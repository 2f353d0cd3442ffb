"""Fuzzing config.json and the scenario around it (hypothesis): every family's small config and the multimodal
wrappers' published-shape configs, mutated (valid-ish edits of the keys transformers reads, wrong types, huge
numbers, deep nesting, unicode), go through the CLI in-process (calc.cli.main.main), a few through
`python -m calc` as a subprocess, and a few through the Calculator's config box (AppTest). Whatever the input:
no traceback, exit 0 with a result or exit 2 with one line; each call within 2 s and 500 MB (tracemalloc's peak
in-process, the child's maxrss for the subprocess). About 30 s in all.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from calc.cli.main import main
from calc.contract import limits
from tests.app.test_app_helpers import ROOT, TRACEBACK, assert_clean
from tests.calc.contract.test_fuzz_inputs import _config_source, _session, _set_text, scenario
from tests.calc.contract.test_hf_rules import FAMILIES
from tests.calc.contract.test_multimodal import CONFIGS as WRAPPERS

LIMIT_S = 2.0  # the bound on one call
LIMIT_BYTES = 500 * 2**20  # and on its memory
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASES: list[dict[str, Any]] = [*FAMILIES.values(), *WRAPPERS.values()]
KEYS = sorted({k for cfg in BASES for k in cfg} | {"text_config", "vision_config", "rope_scaling", "layer_types",
                                                   "head_dim", "hidden_act", "num_key_value_heads"})


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"x": value}
    return value


ODD = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 7, 15, 16, 63, 64, 65, 2**31, 2**62, 10**18, -(2**62), 0.5, 1e300, True, False,
                     None, "", "auto", "silu", "swishy", "mrope", "linear", "\u202e\u0000", "\U0001f600" * 30,
                     "x" * 5000, [], {}, ["full_attention"], ["sliding_attention"] * 3, {"rope_type": "yarn"},
                     {"type": "mrope", "mrope_section": [16, 24, 24]}, {"rope_type": "llama3", "factor": 8.0},
                     {"hidden_size": 0}, {"model_type": "gemma3"}, {"model_type": "bert"}]),
    st.integers(-(2**70), 2**70), st.text(max_size=12), st.integers(1, 30).map(_nested),
)


@st.composite
def configs(draw) -> dict[str, Any]:
    cfg = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        target = cfg
        if isinstance(cfg.get("text_config"), dict) and draw(st.booleans()):
            target = cfg["text_config"]
        key = draw(st.sampled_from(KEYS))
        if draw(st.integers(0, 5)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(ODD)
    return cfg


@st.composite
def scenarios(draw) -> dict[str, Any]:
    training = draw(st.fixed_dictionaries({}, optional={
        "seq_len": st.sampled_from([1, 64, 65, 2048, 4_194_304, 0, "64"]),
        "tensor_parallel": st.sampled_from([1, 2, 3, 16]),
        "lora": st.sampled_from([{"rank": 8}, {"rank": 0}, None]),
        "attention": st.sampled_from(["eager", "sdpa"])}))
    return {"model": draw(configs()), "hardware": {"gpu": "h100-sxm", "num_gpus": draw(st.sampled_from([1, 2, 16]))},
            "mode": draw(st.sampled_from(["train", "inference"])), "training": training}


def _check_call(path: Path, args: list[str]) -> int:
    out, err = io.StringIO(), io.StringIO()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([args[0], str(path), *args[1:]])
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < LIMIT_BYTES, (args, peak)
    if elapsed >= LIMIT_S:  # measured under the tracer, which slows allocation: time it again untraced
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main([args[0], str(path), *args[1:]])
        assert time.perf_counter() - t0 < LIMIT_S, (args, path.read_text()[:300])
    assert rc in (0, 2), (args, rc)
    if rc == 2:
        msg = err.getvalue()
        assert msg.startswith("error: ") and msg.count("\n") == 1, msg[:400]
        assert len(msg) <= limits.MAX_MESSAGE_CHARS + 10 and not TRACEBACK.search(msg), msg[:400]
    else:
        assert out.getvalue().strip() and not TRACEBACK.search(err.getvalue())
    return rc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_configs")


@settings(SETTINGS, max_examples=120)
@given(scenario=scenarios())
def test_cli_on_mutated_configs(workdir, scenario):
    path = workdir / "s.json"
    path.write_text(json.dumps(scenario))
    codes = {_check_call(path, ["estimate"]), _check_call(path, ["estimate", "--format", "table"])}
    assert len(codes) == 1  # the JSON and the table accept and refuse the same inputs


def test_every_base_config_is_estimated(workdir):
    """The fuzz starts from inputs that work: each family's small config and each wrapper give a result."""
    for cfg in BASES:
        path = workdir / "base.json"
        attention = "eager" if cfg["model_type"] == "gpt_oss" else "sdpa"  # its sinks have no SDPA path
        path.write_text(json.dumps({"model": cfg, "hardware": {"gpu": "h100-sxm"},
                                    "training": {"seq_len": 64, "attention": attention}}))
        assert _check_call(path, ["estimate"]) == 0, cfg.get("model_type")


@pytest.mark.slow
@settings(SETTINGS, max_examples=2, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: slow
@given(scenario=scenarios())
def test_cli_subprocess_on_mutated_configs(workdir, scenario):
    """The real command line: a line on stderr or a result on stdout, exit 0 or 2, within 500 MB of RSS; the
    time is the bound plus the interpreter's start (imports: about a second)."""
    path, rss_file = workdir / "sub.json", workdir / "maxrss"
    path.write_text(json.dumps(scenario))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, str(path), str(rss_file)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=30)
    elapsed = time.perf_counter() - t0
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    assert not TRACEBACK.search(proc.stderr), proc.stderr[-2000:]
    if proc.returncode == 2:
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr[:400]
    assert int(rss_file.read_text()) * 1024 < LIMIT_BYTES  # VmHWM is in KiB
    assert elapsed < LIMIT_S + 8.0, elapsed


# the command line's main() in a fresh interpreter, then the process's own peak RSS written to a file (stdout and
# stderr untouched; `python -m calc` ends in os._exit, which would skip the measurement). The peak is VmHWM, the
# high-water mark of this program's own address space: getrusage's ru_maxrss would not do, because the kernel
# carries the forking parent's peak into it at exec (a long pytest run's 780 MB, read as the command's).
_MEASURED_CLI = """
import re, sys
from calc.cli.main import main
rc = main(["estimate", sys.argv[1]])
sys.stdout.flush()
status = open("/proc/self/status").read()
open(sys.argv[2], "w").write(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
sys.exit(rc)
"""


@pytest.mark.slow
@settings(SETTINGS, max_examples=6)
@given(cfg=st.one_of(configs(), st.sampled_from(list(WRAPPERS.values()))))
def test_app_config_box_on_mutated_configs(cfg):
    at = _session("config", _config_source)
    before = scenario(at)
    t0 = time.perf_counter()
    _set_text(at, "sc_config_text", json.dumps(cfg))
    assert time.perf_counter() - t0 < 10  # an AppTest run draws the whole page; the engine's part is bounded above
    assert_clean(at)
    if at.sidebar.error:
        assert scenario(at) == before
    else:
        assert scenario(at).model == cfg


@pytest.mark.slow
def test_calculator_says_a_wrapper_was_read_as_its_language_model():
    at = _session("config", _config_source)
    _set_text(at, "sc_config_text", json.dumps(WRAPPERS["gemma-3-4b-it"]))
    assert not at.sidebar.error
    captions = [c.value for c in at.caption]
    assert any("gemma3 is read as its language model (gemma3_text)" in c for c in captions), captions

"""Fuzzing every input boundary (issue 10): hypothesis-generated and mutated JSON for each CLI command
(in-process through calc.cli.main.main), the link's query parameters, and the app's text boxes and
uploads (Streamlit AppTest). Whatever the input: no exception, no traceback, no hang; either a
result or the one-line error (exit 2 / a message on the page).

Sized for CI (2 cores): about a minute in all. Examples are capped per test, and AppTest sessions
are reused across examples where a widget (not the URL) carries the input.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import time
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calc.cli.main import main
from calc.contract import limits
from calc.contract.scenario import Scenario
from tests.app.test_app_helpers import ROOT, TRACEBACK, assert_clean, open_app, scenario
from ui import state

# VRAMCALC_FUZZ_SCALE=20 runs 20x the examples with fresh randomness (a longer hunt, by hand);
# the default is the CI budget, derandomized so a run is reproducible.
SCALE = int(os.environ.get("VRAMCALC_FUZZ_SCALE", "1"))
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=SCALE == 1)
SLOW_CALL_S = 10.0  # "no hang": the slowest valid call at the bounds takes ~2 s (benchmarks/bounds.py)
REJECT_S = 2.0  # a rejected input is answered well within this (the issue asks for a second, unloaded)

# ---- JSON generators ----------------------------------------------------------------------------------

KEYS = ["model", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size", "head_dim", "rope_parameters", "tie_word_embeddings", "hardware",
        "training", "gpu", "num_gpus", "cluster", "memory_bytes", "micro_batch_size", "seq_len", "lora", "alpha",
        "rank", "zero_optimization", "stage", "train_batch_size", "optimizer", "params", "bf16", "enabled",
        "peak_allocated_bytes", "scenario", "num_local_experts", "n_embd", "n_layer"]
INTERESTING = [0, -1, 1, 2, 3, 7, 1024, 1025, 65537, 2**31, 2**63 - 1, 2**63, 10**400, 4096.7, 1e300, float("inf"),
               float("-inf"), float("nan"), True, False, None, "", "false", "1", "auto", "nan", "llama", "gpt2",
               "mixtral", "a100-80gb", "8x-a100-80gb", "[x](https://e.x)", [], {}, [1], {"a": 1}, "\ud800",
               "x" * 3000]
PLAUSIBLE = [1, 2, 4, 8, 16, 64, 128, 256, 3, "bf16-mixed", "amp-bf16", "fp32", "bf16", "full", "selective", "sdpa",
             "eager", "cpu", "none", "train", "inference", "rtx-4090", "h100-sxm", {"rank": 4}, None, 0.5]
values = st.one_of(st.sampled_from(PLAUSIBLE), st.sampled_from(INTERESTING))  # half of them valid somewhere
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(INTERESTING))
json_values = st.recursive(
    scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), kids,
                                                    max_size=4)),
    max_leaves=12)


def _mutate_text(text: str, data: st.DataObject) -> str:
    """A few byte-level edits: what a truncated paste or a bad editor leaves behind."""
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(text)))
        text = data.draw(st.sampled_from([text[:i] + text[i + 1:], text[:i] + data.draw(st.sampled_from(
            list('{}[]",:0-eE.\\ntfn') + ["\x00", "\ufeff", "\ud800"])) + text[i:], text[:i]]))
    return text


hostile_texts = st.one_of(
    json_values.map(json.dumps),
    st.text(max_size=80),
    st.integers(1, 200_000).map(lambda d: "[" * d + "]" * d),
    st.integers(1, 50_000).map(lambda d: '{"model":' * d + "1" + "}" * d),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
)


def _set(node: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 256}
BASE_SCENARIOS = [
    {"model": "gpt2", "hardware": {"gpu": "a100-80gb"}},
    {"model": TINY, "hardware": {"cluster": "8x-a100-80gb"}, "training": {"precision": "bf16-mixed", "zero_stage": 3}},
    {"model": {**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
     "hardware": {"memory_bytes": 2**34, "num_gpus": 2}, "mode": "inference"},
    {"model": {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
               "intermediate_size": 256, "vocab_size": 512, "rope_parameters": {"partial_rotary_factor": 0.5}},
     "hardware": {"gpu": "rtx-4090"}, "training": {"lora": {"rank": 8, "alpha": 16}}},
]
PATHS = [("model",), ("model", "model_type"), ("model", "hidden_size"), ("model", "num_hidden_layers"),
         ("model", "num_attention_heads"), ("model", "intermediate_size"), ("model", "vocab_size"),
         ("model", "rope_parameters"), ("model", "tie_word_embeddings"), ("model", "num_local_experts"),
         ("model", "head_dim"), ("hardware",), ("hardware", "num_gpus"), ("hardware", "cluster"),
         ("hardware", "gpu"), ("hardware", "memory_bytes"), ("mode",), ("training",),
         ("training", "micro_batch_size"), ("training", "seq_len"), ("training", "precision"),
         ("training", "zero_stage"), ("training", "tensor_parallel"), ("training", "lora"),
         ("training", "lora", "alpha"), ("training", "lora", "rank"), ("training", "checkpoint_every")]


@st.composite
def mutated_scenarios(draw, bases: list[dict] = BASE_SCENARIOS) -> str:
    data = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        _set(data, draw(st.sampled_from(PATHS)), copy.deepcopy(draw(st.one_of(values, values, json_values))))
    return json.dumps(data)


# ---- the CLI ----------------------------------------------------------------------------------------------

COMMANDS = (["estimate"], ["estimate", "--format", "table", "--timeline"], ["fit"], ["recommend"],
            ["export-deepspeed"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def run_all_commands(workdir, text: str, commands=COMMANDS) -> list[int]:
    import io

    path = workdir / "input.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    codes = []
    for args in commands:
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([args[0], str(path), *args[1:]])
        elapsed = time.perf_counter() - t0
        assert elapsed < SLOW_CALL_S, (args, elapsed, text[:200])
        assert rc in (0, 2), (args, rc)
        if rc == 2:
            msg = err.getvalue()
            assert msg.startswith("error: ") and msg.count("\n") == 1, msg[:400]
            assert len(msg) <= limits.MAX_MESSAGE_CHARS + 10 and not TRACEBACK.search(msg), msg[:400]
            assert elapsed < REJECT_S, (args, elapsed, text[:200])
        else:
            assert out.getvalue().strip()
            if args == ["estimate"]:
                assert json.loads(out.getvalue())["peak_allocated_bytes"] > 0
        codes.append(rc)
    return codes


@settings(FUZZ, max_examples=100 * SCALE)
@given(text=hostile_texts)
def test_cli_generated_json(workdir, text):
    codes = run_all_commands(workdir, text)
    try:
        is_object = isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        is_object = False
    if not is_object:
        assert set(codes) == {2}


@settings(FUZZ, max_examples=150 * SCALE)
@given(text=mutated_scenarios(), data=st.data())
def test_cli_mutated_scenarios(workdir, text, data):
    run_all_commands(workdir, _mutate_text(text, data) if data.draw(st.booleans()) else text)


@settings(FUZZ, max_examples=40 * SCALE)
@given(scenario=mutated_scenarios(), extra=st.dictionaries(
    st.sampled_from(["global_batch_tokens", "global_batch_size", "allow_method_change", "safety_margin",
                     "max_candidates", "assumptions"]),
    st.one_of(values, json_values, st.fixed_dictionaries({}, optional={
        "mfu": st.floats(1e-300, 1), "comm_efficiency": st.floats(1e-300, 1),
        "cpu_adam_params_per_s_per_node": st.floats(1e-300, 1e300), "overlap_comm": st.booleans()})),
    max_size=3))
def test_cli_recommend_requests(workdir, scenario, extra):
    run_all_commands(workdir, json.dumps({"scenario": json.loads(scenario), **extra}), commands=(["recommend"],))


def _records() -> list[dict]:
    """Two committed cpu records, and the first as a cuda record would read (what calibrate needs)."""
    lines = (ROOT / "data" / "measured_cpu.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in sorted(lines, key=len)[:2]]
    peak = recs[0]["peak_allocated_bytes"]
    cuda = {**copy.deepcopy(recs[0]), "device": "cuda", "peak_reserved_bytes": peak * 2,
            "device_used_bytes": peak * 2 + 2**29}
    cuda["scenario"]["hardware"] = {"gpu": "a100-80gb"}
    return [*recs, cuda]


RECORD_PATHS = [("peak_allocated_bytes",), ("peak_phase",), ("device",), ("engine",), ("scenario",),
                ("scenario", "model"), ("scenario", "training", "seq_len"), ("phase_peaks_bytes",),
                ("step_phase_peaks_bytes",), ("categories_at_peak_bytes",), ("measured_at",), ("wall_seconds",),
                ("sharding",), ("raw_categories_at_peak_bytes",), ("num_params",)]


@st.composite
def mutated_records(draw) -> str:
    rec = copy.deepcopy(draw(st.sampled_from(_records())))
    for _ in range(draw(st.integers(1, 2))):
        _set(rec, draw(st.sampled_from(RECORD_PATHS)), copy.deepcopy(draw(st.one_of(values, json_values))))
    return json.dumps(rec)


@settings(FUZZ, max_examples=60 * SCALE)
@given(lines=st.lists(st.one_of(mutated_records(), hostile_texts), min_size=1, max_size=3))
def test_cli_validate_and_calibrate_mutated_records(workdir, lines):
    import io

    path = workdir / "records.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    for command in ("validate", "calibrate"):
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main([command, str(path)])
        assert time.perf_counter() - t0 < SLOW_CALL_S
        assert rc in (0, 2), (command, rc)
        if rc == 2:
            assert err.getvalue().count("\n") == 1 and not TRACEBACK.search(err.getvalue()), err.getvalue()[:300]


# ---- the link (query parameters) --------------------------------------------------------------------------

PARAM_VALUES = st.one_of(st.text(max_size=12), st.sampled_from(["nan", "inf", "-1", "0", "1e400", "9" * 400, "true",
                                                                "1.5", "bf16-mixed", "3", "a100-80gb", "gpt2",
                                                                "8x-a100-80gb", "[x](https://e.x)", "c.1x-rtx-4090",
                                                                "c.1x-rtx-4090_g.a100-80gb.2~z.3~oo.cpu",
                                                                "v1~g_a100-80gb~n_2~r_1.06_0.005~o_629145600_16777216",
                                                                "v1~n_1~r_nan_0~o_1e400_1", "v1~n_" + "9" * 5000]))


def _config_param(data: st.DataObject) -> str:
    raw = data.draw(st.one_of(hostile_texts, mutated_scenarios([{"model": TINY}]).map(
        lambda t: json.dumps(json.loads(t)["model"]))))
    packed = zlib.compress(raw.encode("utf-8", "surrogatepass"), 9)
    text = base64.urlsafe_b64encode(packed).decode().rstrip("=")
    return data.draw(st.sampled_from([text, text[: len(text) // 2], text + "A", "%%%"]))


@st.composite
def link_params(draw) -> dict[str, str]:
    names = draw(st.lists(st.sampled_from([*state.URL_FIELDS, state.LORA_FLAG, state.CONFIG_PARAM,
                                           state.COMPARE_PARAM, state.CALIBRATION_PARAM]),
                          min_size=1, max_size=5, unique=True))
    data = draw(st.data())
    return {n: _config_param(data) if n == state.CONFIG_PARAM else draw(PARAM_VALUES) for n in names}


@settings(FUZZ, max_examples=300 * SCALE)
@given(params=link_params())
def test_links_give_a_scenario_or_a_url_error(params):
    """The URL decoder alone (cheap, so many examples): a Scenario, None or UrlError, nothing else."""
    t0 = time.perf_counter()
    try:
        sc = state.params_to_scenario(params)
    except state.UrlError as exc:
        assert str(exc) and "\n" not in str(exc) and len(str(exc)) <= limits.MAX_MESSAGE_CHARS + 40
    else:
        assert sc is None or isinstance(sc, Scenario)
    if state.COMPARE_PARAM in params:
        with contextlib.suppress(state.UrlError):
            state.compare_from_param(params[state.COMPARE_PARAM])
    if state.CALIBRATION_PARAM in params:
        with contextlib.suppress(state.UrlError):
            state.calibration_from_param(params[state.CALIBRATION_PARAM])
    assert time.perf_counter() - t0 < REJECT_S


@settings(FUZZ, max_examples=12 * SCALE)
@given(params=link_params(), page=st.sampled_from(["calculator", "compare", "export"]))
def test_app_opens_any_link(params, page):
    """A fresh session from the link: the page is clean, and shows either the link's scenario or the
    default with the link's problem."""
    try:
        want = state.params_to_scenario(params)
    except state.UrlError:
        want = None
    at = open_app(page, params=params)  # asserts no exception and no traceback
    if want is None:
        assert scenario(at) == state.DEFAULT_SCENARIO
    else:
        assert scenario(at) == want or at.sidebar.error  # valid link; the widgets may not express it
    if want is None and params.keys() & (set(state.URL_FIELDS) | {state.CONFIG_PARAM, state.LORA_FLAG}):
        assert at.warning or scenario(at) == state.DEFAULT_SCENARIO


# ---- the app's text boxes and uploads (one session per test, reused) ---------------------------------------

_SESSIONS: dict[str, Any] = {}


def _session(page: str, prepare=None):
    if page not in _SESSIONS:
        at = open_app(page if page != "config" else "calculator")
        if prepare:
            prepare(at)
        _SESSIONS[page] = at
    return _SESSIONS[page]


def _config_source(at) -> None:
    [w for w in at.radio if w.key == "sc_model_source"][0].set_value("config")
    at.run()


def _set_text(at, key: str, text: str) -> None:
    [t for t in at.text_area if t.key == key][0].set_value(text)
    t0 = time.perf_counter()
    at.run()
    assert time.perf_counter() - t0 < SLOW_CALL_S
    assert_clean(at)


@settings(FUZZ, max_examples=25 * SCALE)
@given(text=st.one_of(hostile_texts, mutated_scenarios([{"model": TINY}]).map(lambda t: json.dumps(json.loads(t)["model"]))))
def test_app_config_box(text):
    at = _session("config", _config_source)
    before = scenario(at)
    _set_text(at, "sc_config_text", text)
    if at.sidebar.error:
        assert scenario(at) == before  # a bad box leaves the current scenario as it was
    else:
        assert scenario(at).model == json.loads(text)


@settings(FUZZ, max_examples=15 * SCALE)
@given(content=st.one_of(hostile_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=80)))
def test_app_config_upload(content):
    at = _session("config", _config_source)
    before = scenario(at)
    up = [w for w in at.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("c.json", content, "application/json"))
    at.run()
    assert_clean(at)
    if at.sidebar.error:
        assert scenario(at) == before or not isinstance(before.model, dict)


@settings(FUZZ, max_examples=20 * SCALE)
@given(text=st.one_of(hostile_texts, json_values.map(lambda v: json.dumps({"train_batch_size": 8, "optimizer": v})),
                      json_values.map(lambda v: json.dumps({"train_batch_size": 8, "zero_optimization": v}))))
def test_app_ds_config_box(text):
    at = _session("export")
    before = scenario(at)
    _set_text(at, "exp_import_text", text)
    assert scenario(at) == before  # reading a ds_config never changes the scenario by itself


@settings(FUZZ, max_examples=20 * SCALE)
@given(text=st.one_of(hostile_texts, mutated_records()))
def test_app_record_box(text):
    at = _session("validation")
    _set_text(at, "val_paste", text)
    assert at.error or at.success or not text.strip()  # a blank box is no input

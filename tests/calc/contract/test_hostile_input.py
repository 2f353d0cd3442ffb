"""Regression tests for issue 10 (hostile and malformed input): every reproducer of the issue, on the
CLI (in-process through calc.cli.main.main, so each costs milliseconds), in calc.contract.boundary, and on the
app (AppTest). Each must end in the one-line error (exit 2 / a message beside the widget), quickly,
with no traceback, and quote at most a short excerpt of the input."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from calc.cli.main import main
from calc.contract import limits
from calc.contract.boundary import check_depth, decompress, excerpt, parse_json
from calc.contract.errors import UserError
from calc.contract.scenario import HardwareConfig, LoraConfig, Scenario
from calc.export import scenario_from_ds_config
from tests.app.test_app_helpers import ROOT, assert_clean, markdown_tables, open_app, scenario
from ui import fmt, state

# an unescaped Markdown link / image / HTML tag / emphasis / directive / autolink
ACTIVE_MARKDOWN = re.compile(r"(?<!\\)(\[|<[a-z]|\*\*|:[a-z]+\[)|https?(?<!\\):|(?<!\\)www\.")
DEEP = "[" * 100_000 + "]" * 100_000
COMMANDS = (["estimate"], ["estimate", "--format", "table"], ["fit"], ["recommend"], ["export-deepspeed"])
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_hidden_layers": 2, "vocab_size": 1000}


def _record_line() -> dict:
    """A real committed record (the smallest model), to mutate."""
    lines = (ROOT / "data" / "measured_cpu.jsonl").read_text().splitlines()
    return json.loads(min(lines, key=len))


def run_cli(tmp_path: Path, capsys, args: list[str], content: str | bytes | None = None) -> tuple[int, str, str]:
    """main(args) with the file argument written from `content`; (exit code, stdout, stderr), and the
    checks every rejected input must pass: one line, no traceback, short, fast."""
    if content is not None:
        path = tmp_path / "input.json"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        args = [args[0], str(path), *args[1:]]
    t0 = time.perf_counter()
    rc = main(args)
    elapsed = time.perf_counter() - t0
    out, err = capsys.readouterr()
    if rc == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err[:500]
        assert "Traceback" not in err and len(err) <= limits.MAX_MESSAGE_CHARS + 10, err[:500]
        assert elapsed < 1.0, (args, elapsed)
    return rc, out, err


def reject(tmp_path, capsys, args, content, needle: str) -> str:
    rc, _, err = run_cli(tmp_path, capsys, args, content)
    assert rc == 2 and needle in err, (rc, err[:300])
    return err


# ---- deep nesting, non-finite and huge numbers: every command -----------------------------------------

@pytest.mark.parametrize("args", COMMANDS)
@pytest.mark.parametrize("content, needle", [
    (DEEP, "nested too deeply"),
    ("[" * 3000 + "]" * 3000, "nested too deeply"),
    ('{"model":{"model_type":"llama","hidden_size":Infinity}}', "Infinity is not a number"),
    ('{"model":{"model_type":"llama","hidden_size":NaN}}', "NaN is not a number"),
    ('{"model":{"model_type":"llama","hidden_size":1e400}}', "out of range"),
    ('{"model":{"model_type":"llama","hidden_size":1' + "0" * 200 + "}}", "too large"),
    ('{"model":"llama-2-7b","hardware":{"memory_bytes":1' + "0" * 400 + "}}", "too large"),
], ids=["deep", "3000", "inf", "nan", "1e400", "10**200", "mem10**400"])
def test_hostile_numbers_and_nesting_on_every_command(tmp_path, capsys, args, content, needle):
    reject(tmp_path, capsys, args, content, needle)


@pytest.mark.parametrize("mutation, needle", [
    ({"peak_allocated_bytes": 0}, "peak_allocated_bytes: Input should be greater than 0"),
    ({"peak_allocated_bytes": 2**61}, "peak_allocated_bytes: Input should be less than or equal"),
    ({"scenario": {"model": {"model_type": "llama", "num_hidden_layers": 10**8}}}, "num_hidden_layers"),
])
def test_validate_rejects_bad_records(tmp_path, capsys, mutation, needle):
    rec = {**_record_line(), **mutation}
    reject(tmp_path, capsys, ["validate"], json.dumps(rec) + "\n", needle)


@pytest.mark.parametrize("literal, needle", [("1" + "0" * 400, "too large"), ("Infinity", "Infinity"),
                                             ("1e400", "out of range")])
def test_validate_rejects_hostile_numbers_in_records(tmp_path, capsys, literal, needle):
    text = json.dumps({**_record_line(), "peak_allocated_bytes": 7}).replace('"peak_allocated_bytes": 7',
                                                                             f'"peak_allocated_bytes": {literal}')
    reject(tmp_path, capsys, ["validate"], text + "\n", needle)
    reject(tmp_path, capsys, ["validate"], DEEP + "\n", "nested too deeply")


# ---- wrong container types, silently accepted nonsense ------------------------------------------------

@pytest.mark.parametrize("model, needle", [
    ({"model_type": "gpt_neox", "rope_parameters": [1]}, "rope_parameters must be a JSON object"),
    ({"model_type": "gpt_neox", "rope_parameters": "x"}, "rope_parameters must be a JSON object"),
    ({"model_type": ["llama"]}, "unsupported model_type ['llama']"),
    ({"model_type": {"a": 1}}, "unsupported model_type"),
    ({"model_type": "llama", "hidden_size": 4096.7}, "hidden_size must be an integer, got 4096.7"),
    ({"model_type": "llama", "hidden_size": True}, "hidden_size must be an integer, got True"),
    ({"model_type": "llama", "intermediate_size": 0}, "intermediate_size must be >= 1, got 0"),
    ({"model_type": "llama", "tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"model_type": "llama", "num_attention_heads": 0}, "num_attention_heads must be >= 1"),
    ({"model_type": "llama", "attention_dropout": "0.1"}, "attention_dropout must be an integer or a finite number, got '0.1'"),
    ({"model_type": "gemma2", "final_logit_softcapping": -1}, "final_logit_softcapping"),
    ({"model_type": "mixtral", "num_local_experts": 10**6}, "num_local_experts"),
])
def test_config_json_types_are_strict(tmp_path, capsys, model, needle):
    reject(tmp_path, capsys, ["estimate"], json.dumps({"model": model}), needle)


@pytest.mark.parametrize("training, needle", [
    ({"micro_batch_size": True}, "training.micro_batch_size: Input should be a valid integer"),
    ({"micro_batch_size": 2.0}, "training.micro_batch_size: Input should be a valid integer"),
    ({"micro_batch_size": "2"}, "training.micro_batch_size: Input should be a valid integer"),
    ({"sequence_parallel": "false"}, "training.sequence_parallel: Input should be a valid boolean"),
    ({"lora": {"alpha": "inf"}}, "training.lora.alpha"),
    ({"lora": {"alpha": 1e300}}, "training.lora.alpha"),
])
def test_scenario_types_are_strict(tmp_path, capsys, training, needle):
    reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "gpt2", "training": training}), needle)


def test_lora_alpha_must_be_finite():
    for alpha in (math.inf, math.nan, 1e300):
        with pytest.raises(ValidationError):
            LoraConfig(alpha=alpha)


DIMENSION_LIMITS = {"num_hidden_layers": limits.MAX_LAYERS, "hidden_size": limits.MAX_HIDDEN,
                    "num_attention_heads": limits.MAX_HEADS, "vocab_size": limits.MAX_VOCAB,
                    "intermediate_size": limits.MAX_INTERMEDIATE, "max_position_embeddings": limits.MAX_POSITIONS,
                    "head_dim": limits.MAX_HEAD_DIM}


@pytest.mark.parametrize("dimension", sorted(DIMENSION_LIMITS))
def test_every_dimension_is_bounded(tmp_path, capsys, dimension):
    """The issue's 1e4..1e8 layers (7 s, 30 s, 18 s + 1.1 GB, MemoryError, a hang) and the same for every
    other dimension: rejected in milliseconds, by `recommend`, the most expensive command."""
    for value in sorted({DIMENSION_LIMITS[dimension] + 1, 10**4, 10**5, 10**6, 10**7, 10**8}):
        if value > DIMENSION_LIMITS[dimension]:
            reject(tmp_path, capsys, ["recommend"], json.dumps({"model": {"model_type": "llama", dimension: value},
                                                                "hardware": {"gpu": "h100-sxm"}}), dimension)


def test_cluster_and_a_different_num_gpus_is_an_error(tmp_path, capsys):
    reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "gpt2", "hardware": {"cluster": "8x-a100-80gb",
                                                                                    "num_gpus": 3}}),
           "num_gpus=3 contradicts cluster '8x-a100-80gb'")
    hw = HardwareConfig(cluster="8x-a100-80gb")
    assert hw.num_gpus == 8  # filled from the cluster, so a dumped scenario validates again
    sc = Scenario(model="gpt2", hardware=hw)
    assert Scenario.model_validate(sc.model_dump(mode="json")) == sc
    assert HardwareConfig(cluster="8x-a100-80gb", num_gpus=8).num_gpus == 8
    reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "gpt2", "hardware": {"gpu": "8x-a100-80gb",
                                                                                    "num_gpus": 3}}),
           "num_gpus=3 contradicts cluster '8x-a100-80gb'")


def test_top_zero_and_nan_thresholds_are_rejected(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "gpt2", "hardware": {"gpu": "a100-80gb"}}))
    for argv in (["recommend", str(path), "--top", "0"], ["recommend", str(path), "--top", "-3"],
                 ["validate", "--max-median", "nan"], ["validate", "--max-worst", "inf"],
                 ["validate", "--max-median", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "must be" in capsys.readouterr().err


def test_memory_bytes_beyond_the_bound_is_rejected_and_the_bound_prints(tmp_path, capsys):
    reject(tmp_path, capsys, ["estimate", "--format", "table"],
           json.dumps({"model": "gpt2", "hardware": {"memory_bytes": limits.MAX_GPU_MEMORY_BYTES + 1}}),
           "hardware.memory_bytes")
    rc, out, _ = run_cli(tmp_path, capsys, ["estimate", "--format", "table"],
                         json.dumps({"model": "gpt2", "hardware": {"memory_bytes": limits.MAX_GPU_MEMORY_BYTES}}))
    assert rc == 0 and "fits" in out


def test_recommend_requests_with_huge_batches_stay_fast(tmp_path, capsys):
    """global_batch_size 2^63 - 1 hung the search (divisors of the per-rank batch in O(sqrt n))."""
    req = {"scenario": {"model": "llama-2-7b", "hardware": {"gpu": "a100-80gb", "num_gpus": 8}}}
    reject(tmp_path, capsys, ["recommend"], json.dumps({**req, "global_batch_size": 2**63 - 1}), "global_batch_size")
    reject(tmp_path, capsys, ["recommend"], json.dumps({**req, "global_batch_tokens": 2**41}), "global_batch_tokens")
    t0 = time.perf_counter()
    rc, out, _ = run_cli(tmp_path, capsys, ["recommend"], json.dumps({**req, "global_batch_size": 2**32}))
    assert rc == 0 and "global batch 4294967296 sequences" in out and time.perf_counter() - t0 < 10


# ---- echo, encodings, pipes ---------------------------------------------------------------------------

def test_huge_inputs_are_not_echoed(tmp_path, capsys):
    reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "x" * 50_000_000}), "larger than 1 MiB")
    err = reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "y" * 500_000}), "unknown model preset")
    assert err.count("y") < 100
    err = reject(tmp_path, capsys, ["estimate"], json.dumps({"model": "gpt2", "z" * 500_000: 1}), "Extra inputs")
    assert err.count("z") < 100


def test_non_utf8_file_is_named(tmp_path, capsys):
    err = reject(tmp_path, capsys, ["estimate"], b'{"model": "caf\xe9"}', "not UTF-8")
    assert "input.json" in err
    records = tmp_path / "r.jsonl"
    records.write_bytes(b'{"x": "\xff"}\n')
    rc, _, err = run_cli(tmp_path, capsys, ["validate", str(records)])
    assert rc == 2 and "r.jsonl" in err and "not UTF-8" in err


def test_presets_into_a_closed_pipe_is_quiet():
    r = subprocess.run(f"{sys.executable} -m calc presets | head -1", shell=True, cwd=ROOT, capture_output=True,
                       text=True)
    assert r.stdout.startswith("# models") and r.stderr == "", r.stderr


# ---- calc.contract.boundary -------------------------------------------------------------------------------------

def test_boundary_bounds():
    with pytest.raises(UserError, match="nested too deeply"):
        check_depth("[" * 33 + "]" * 33, "x")
    check_depth('["' + "[" * 10_000 + '"]', "x")  # brackets inside a string are text
    assert parse_json('{"a": [[[1]]], "b": "{[{["}', "x") == {"a": [[[1]]], "b": "{[{["}
    assert parse_json(str(2**63 - 1), "x") == 2**63 - 1
    for bad in (str(2**63), "-" + str(2**63), "1" * 5000, "-Infinity", "[1e999]"):
        with pytest.raises(UserError):
            parse_json(bad, "x")
    bomb = zlib.compress(b" " * 200_000_000, 9)
    t0 = time.perf_counter()
    with pytest.raises(UserError, match="decompresses to more than"):
        decompress(bomb, "config")
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(UserError, match="cut short"):
        decompress(zlib.compress(b"{}")[:-3], "config")
    assert len(excerpt("q" * 10_000_000)) < 100 and len(excerpt(list(range(10**5)))) < 100


def test_ds_config_types_are_strict():
    for cfg, needle in (({"train_batch_size": math.inf}, "train_batch_size must be an integer"),
                        ({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": [1]}}, "optimizer.params"),
                        ({"train_batch_size": 8, "bf16": {"enabled": True, "bf16_optimizer_states": "false",
                                                          "bf16_master_weights_and_grads": True}},
                         "bf16.bf16_optimizer_states must be true or false"),
                        ({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adam_w_mode": "no"}}},
                         "adam_w_mode"),
                        ({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer": {
                            "device": ["cpu"]}}}, "device must be none, cpu or nvme")):
        with pytest.raises(ValueError, match=needle):
            scenario_from_ds_config(cfg, "gpt2", "a100-80gb")


def test_markdown_in_user_text_is_escaped():
    shown = fmt.literal("unsupported model_type '[Click here](https://evil.example) ![t](https://e.x/p.png)' "
                        "<img src=x> **b** :red[r] www.x.io")
    assert not ACTIVE_MARKDOWN.search(shown), ACTIVE_MARKDOWN.search(shown)
    assert fmt.literal("offload_optimizer needs zero_stage 1, 2 or 3") == "offload_optimizer needs zero_stage 1, 2 or 3"


def test_markdown_table_keeps_each_cell_in_its_place():
    """ui.fmt.table: a '|' or a line break in a cell does not add a column or end the table."""
    rows = [{"name | alias": "a|b", "value": "1\n2"}, {"name | alias": fmt.plain("- not a list"), "value": ""}]
    text = fmt.table(rows)
    assert len(text.splitlines()) == 4
    [df] = markdown_tables(text)
    assert list(df.columns) == ["name | alias", "value"]
    assert df.to_dict("records") == [{"name | alias": "a|b", "value": "1 2"},
                                     {"name | alias": "\\- not a list", "value": ""}]
    assert fmt.table([]) == ""


# ---- the app --------------------------------------------------------------------------------------------

def _link(config_text: str) -> dict[str, str]:
    return {"config": base64.urlsafe_b64encode(zlib.compress(config_text.encode(), 9)).decode().rstrip("=")}


@pytest.mark.parametrize("config_text, needle", [
    ('{"model_type":"llama","num_hidden_layers":100000000}', "num_hidden_layers"),
    (DEEP, "nested too deeply"),
    ('{"model_type":"llama","hidden_size":Infinity}', "Infinity"),
    ("{" + " " * 10_000_000 + "}", "decompresses to more than"),
], ids=["layers", "deep", "infinity", "bomb"])
def test_hostile_config_links_fall_back_to_the_default(config_text, needle):
    t0 = time.perf_counter()
    at = open_app(params=_link(config_text))
    assert time.perf_counter() - t0 < 30  # a fresh AppTest session; the link itself is rejected in ms
    assert scenario(at) == state.DEFAULT_SCENARIO
    assert any(needle in w.value for w in at.warning), [w.value for w in at.warning]


def test_markdown_in_a_link_is_shown_as_text():
    evil = "[Click here](https://evil.example) ![t](https://evil.example/pixel.png)"
    at = open_app(params=_link(json.dumps({"model_type": evil})))
    warning = [w.value for w in at.warning][0]
    assert "unsupported model" in warning and not ACTIVE_MARKDOWN.search(warning), warning
    at = open_app(params={"model": evil})
    warning = [w.value for w in at.warning][0]
    assert "unknown model preset" in warning and not ACTIVE_MARKDOWN.search(warning), warning
    with pytest.raises(state.UrlError, match="longer than"):
        state.params_to_scenario({"model": "m" * 10_000})


def _widget(at, key):
    for kind in ("text_area", "selectbox", "radio"):
        found = [w for w in getattr(at, kind) if w.key == key]
        if found:
            return found[0]
    raise KeyError(key)


def test_config_box_and_upload_reject_hostile_json_and_keep_the_scenario():
    at = open_app()
    _widget(at, "sc_model_source").set_value("config")
    at.run()
    _widget(at, "sc_config_text").set_value(json.dumps(LLAMA))
    at.run()
    good = scenario(at)
    assert good.model == LLAMA
    for text, needle in ((DEEP, "nested too deeply"), ('{"model_type": "llama", "hidden_size": 1e400}', "out of range"),
                         ('{"model_type": ["llama"]}', "unsupported model")):
        _widget(at, "sc_config_text").set_value(text)
        at.run()
        assert_clean(at)
        assert any(needle in e.value for e in at.sidebar.error), [e.value for e in at.sidebar.error]
        assert scenario(at) == good  # the last valid scenario stays current
    _widget(at, "sc_config_text").set_value(json.dumps(LLAMA))
    at.run()
    up = [w for w in at.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("deep.json", DEEP.encode(), "application/json"))
    at.run()
    assert_clean(at)
    assert any("nested too deeply" in e.value and "unchanged" in e.value for e in at.sidebar.error)
    assert _widget(at, "sc_config_text").value == json.dumps(LLAMA)  # the box keeps the user's config
    assert scenario(at) == good and at.get("plotly_chart")  # and the page still shows it
    up = [w for w in at.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("latin1.json", b'{"model_type": "caf\xe9"}', "application/json"))
    at.run()
    assert any("latin1.json: not UTF-8" in e.value for e in at.sidebar.error), [e.value for e in at.sidebar.error]
    assert scenario(at) == good
    up = [w for w in at.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("bert.json", b'{"model_type": "bert", "hidden_size": 768}', "application/json"))
    at.run()
    assert any("unsupported model_type 'bert'" in e.value for e in at.sidebar.error)
    assert _widget(at, "sc_config_text").value == json.dumps(LLAMA) and scenario(at) == good


@pytest.mark.parametrize("text, needle", [
    (DEEP, "nested too deeply"),
    ('{"train_batch_size": Infinity}', "Infinity"),
    ('{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": [1]}}', "optimizer.params must be an object"),
], ids=["deep", "inf", "params"])
def test_ds_config_box_rejects_hostile_json(text, needle):
    at = open_app("export")
    [t for t in at.text_area if t.key == "exp_import_text"][0].set_value(text)
    at.run()
    assert_clean(at)
    assert any(needle in e.value for e in at.error), [e.value for e in at.error]


@pytest.mark.parametrize("mutation, needle", [
    ({"peak_allocated_bytes": 0}, "greater than 0"),
    ({"peak_allocated_bytes": 2**62}, "less than or equal"),
])
def test_record_box_rejects_bad_records(mutation, needle):
    at = open_app("validation")
    for text in (json.dumps({**_record_line(), **mutation}), DEEP):
        [t for t in at.text_area if t.key == "val_paste"][0].set_value(text)
        at.run()
        assert_clean(at)
        want = needle if text != DEEP else "nested too deeply"
        assert any(want in e.value for e in at.error), [e.value for e in at.error]

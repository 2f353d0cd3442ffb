"""What the CLI writes and prints, under hostile input: files only where -o says (never through a symbolic link,
never over a file without --force, all or nothing), every character a terminal would obey made visible, strict
JSON, launch files that agree with the node layout, bounded messages for huge input."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from calc.cli.main import main
from calc.contract.boundary import parse_json
from calc.contract.errors import UserError
from calc.contract.files import append_line, write_file, write_files
from calc.contract.output import for_terminal, strict_json
from calc.contract.scenario import Scenario
from calc.export import ExportOptions, accelerate_config, export_bundle, launch_lines, node_layout_problem

SCENARIO = {"model": "gpt2", "hardware": {"gpu": "a100-80gb"}, "training": {"zero_stage": 2, "precision": "bf16-mixed"}}
BUNDLE = ["accelerate.yaml", "ds_config.json", "launch.sh", "requirements.txt", "train.py"]
# every kind of character a terminal obeys: ESC (a colour, a window title), BEL, CR, backspace, a C1 CSI, DEL, the
# right-to-left override and an isolate
HOSTILE = "x\x1b[31mred\x1b]0;title\x07\r\x08\x9b2J\x7f\u202eevil\u2066"


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCENARIO))
    return path


def export(scenario_file: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["export", str(scenario_file), "-o", str(out), *extra])
    return code, capsys.readouterr().err


# ---- writes ------------------------------------------------------------------------------------

def test_a_symlinked_file_in_the_folder_is_refused_and_its_target_untouched(tmp_path, scenario_file, capsys):
    out, target = tmp_path / "run", tmp_path / "precious"
    out.mkdir()
    target.write_text("keep")
    target.chmod(0o600)
    (out / "train.py").symlink_to(target)
    for extra in ((), ("--force",)):
        code, err = export(scenario_file, out, *extra, capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and "train.py is a symbolic link" in err
    assert target.read_text() == "keep" and stat.S_IMODE(target.stat().st_mode) == 0o600  # no chmod through it
    assert sorted(p.name for p in out.iterdir()) == ["train.py"]  # nothing written beside it either


def test_a_dangling_link_is_refused(tmp_path, scenario_file, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "launch.sh").symlink_to(tmp_path / "would-be-created")
    code, err = export(scenario_file, out, "--force", capsys=capsys)
    assert code == 2 and "launch.sh is a symbolic link" in err
    assert not (tmp_path / "would-be-created").exists()


@pytest.mark.parametrize("through", ["folder", "above"])
def test_an_output_folder_reached_through_a_link_is_refused(tmp_path, scenario_file, capsys, through):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    out = tmp_path / "link" if through == "folder" else tmp_path / "link" / "run"
    code, err = export(scenario_file, out, capsys=capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{tmp_path / 'link'} is a symbolic link" in err and str(real) in err  # names the real path to give
    assert list(real.iterdir()) == []


def test_an_existing_bundle_is_replaced_only_with_force(tmp_path, scenario_file, capsys):
    out = tmp_path / "run"
    assert export(scenario_file, out, capsys=capsys)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == BUNDLE  # no temporary file left
    (out / "train.py").write_text("my edits")
    code, err = export(scenario_file, out, capsys=capsys)
    assert code == 2 and err.count("\n") == 1
    assert "already holds ds_config.json, train.py, accelerate.yaml, launch.sh, requirements.txt: give --force" in err
    assert (out / "train.py").read_text() == "my edits"
    assert export(scenario_file, out, "--force", capsys=capsys)[0] == 0
    files, _ = export_bundle(Scenario.model_validate(SCENARIO))
    assert all((out / name).read_text() == text for name, text in files.items())
    assert sorted(p.name for p in out.iterdir()) == BUNDLE


def test_one_existing_file_is_named_alone(tmp_path, scenario_file, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "launch.sh").write_text("old")
    code, err = export(scenario_file, out, capsys=capsys)
    assert code == 2 and "already holds launch.sh: give --force to replace it" in err
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh"]  # all or nothing


def test_modes_come_from_creation_under_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_files(str(tmp_path / "d"), {"a.sh": "#!/bin/sh\n", "b.zip": b"PK\x05\x06"},
                    executable=frozenset({"a.sh"}))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "d" / "a.sh").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "d" / "b.zip").stat().st_mode) == 0o640
    assert (tmp_path / "d" / "b.zip").read_bytes() == b"PK\x05\x06"  # bytes are written as they are


def test_single_file_writers_follow_the_same_rules(tmp_path, scenario_file, capsys):
    out = tmp_path / "ds.json"
    assert main(["export-deepspeed", str(scenario_file), "-o", str(out)]) == 0
    assert main(["export-deepspeed", str(scenario_file), "-o", str(out)]) == 2
    assert "already holds ds.json: give --force" in capsys.readouterr().err
    assert main(["export-deepspeed", str(scenario_file), "-o", str(out), "--force"]) == 0
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert main(["export-deepspeed", str(scenario_file), "-o", str(link), "--force"]) == 2
    assert "link.json is a symbolic link" in capsys.readouterr().err and not (tmp_path / "elsewhere.json").exists()
    with pytest.raises(UserError, match="a file name is needed"):
        write_file(str(tmp_path) + os.sep, "x")
    (tmp_path / "sub").mkdir()
    with pytest.raises(UserError, match="not a regular file"):
        write_file(str(tmp_path / "sub"), "x", force=True)
    with pytest.raises(UserError, match="ds.json exists and is not a folder"):
        write_files(str(out), {"a": "x"})


def test_record_files_grow_by_lines_and_never_through_a_link(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_line(str(path), '{"a": 1}')
    append_line(str(path), '{"a": 2}')
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(UserError, match="symbolic link"):
        append_line(str(link), "{}")
    assert path.read_text().count("\n") == 2


# ---- the terminal --------------------------------------------------------------------------------

def test_for_terminal_makes_every_obeyed_character_visible():
    shown = for_terminal(HOSTILE)
    assert all(ord(c) >= 0x20 and not 0x7f <= ord(c) <= 0x9f and c not in "\u202e\u2066" for c in shown)
    assert shown.startswith("x\\u001b[31mred\\u001b]0;title\\u0007\\u000d\\u0008\\u009b2J\\u007f\\u202eevil")
    assert for_terminal("a\tb\nc", lines=True) == "a\tb\nc" and for_terminal("a\tb\nc") == "a\\u0009b\\u000ac"
    assert for_terminal("名前 ü") == "名前 ü"  # ordinary text is left alone
    assert for_terminal("a" * 10**6, limit=50) == "a" * 50 + "... (1,000,000 characters)"
    assert json.loads(for_terminal(json.dumps({"k": "\x85\u202e"}, ensure_ascii=False), lines=True)) == \
        {"k": "\x85\u202e"}  # JSON text stays the same JSON


def raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u2066"]


def test_error_lines_show_hostile_keys_and_ids_escaped(tmp_path, capsys):
    cases = [{"model": "gpt2", "hardware": {"gpu": HOSTILE}},  # an unknown preset id
             {"model": "gpt2", HOSTILE: 1},  # an unknown key
             {"model": {"model_type": "llama", HOSTILE: 1, "hidden_size": "x"}}]  # a config.json field
    for i, doc in enumerate(cases):
        path = tmp_path / f"{HOSTILE[:3]}{i}.json"  # the file's name too
        path.write_text(json.dumps(doc, ensure_ascii=False))
        assert main(["estimate", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and not raw_controls(err), err


def test_calibrate_summary_and_validate_table_escape_record_fields(tmp_path, capsys):
    from calc.evidence.validate import compare, load_all
    from tests.calc.evidence.test_calibrate import cuda_like

    run = next(r for r in load_all() if r.device == "fake" and r.engine == "torch-single"
               and abs(compare(r).error_pct) < 0.01)
    doc = cuda_like(run)
    doc["name"], doc["env"]["device_name"] = HOSTILE, HOSTILE
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(doc))
    assert main(["calibrate", str(rec), "-o", str(tmp_path / "cal.json")]) == 0
    out = capsys.readouterr().out
    assert "x\\u001b[31mred" in out and not raw_controls(out)
    main(["validate", str(rec)])
    printed = capsys.readouterr()
    assert "x\\u001b[31mred" in printed.out + printed.err and not raw_controls(printed.out + printed.err)
    scen = tmp_path / "s.json"
    scen.write_text(json.dumps({**SCENARIO, "hardware": {"gpu": None, "memory_bytes": 80 * 2**30}}))
    for fmt in ("table", "json"):  # the calibration's machine, in the table and in the JSON
        assert main(["estimate", str(scen), "--calibration", str(tmp_path / "cal.json"), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "x\\u001b[31mred" in out and not raw_controls(out)
        if fmt == "json":
            assert HOSTILE in json.loads(out)["calibrated"]["machine"]


# ---- bounded messages --------------------------------------------------------------------------

def test_a_long_preset_id_is_an_unknown_preset_not_an_os_error(tmp_path, capsys):
    for n in (251, 300, 10**5):
        path = tmp_path / "s.json"
        path.write_text(json.dumps({"model": "a" * n, "hardware": {"gpu": "a100-80gb"}}))
        assert main(["estimate", str(path)]) == 2
        err = capsys.readouterr().err
        assert "unknown model preset" in err and err.count("\n") == 1 and len(err) < 400


def test_a_huge_argument_gives_a_short_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["presets", HOSTILE + "b" * 10**5])  # about the most one argument can hold (128 KiB on Linux)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice" in err and len(err) < 1000 and not raw_controls(err)


# ---- strict JSON --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "0"])
def test_a_learning_rate_that_is_not_finite_and_positive_is_refused(scenario_file, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["export", str(scenario_file), "-o", str(tmp_path / "run"), f"--learning-rate={value}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--learning-rate: must be a finite number > 0" in err.splitlines()[-1]
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError):
        ExportOptions(learning_rate=float(value))


def test_json_we_write_is_strict():
    assert strict_json({"lr": 1e-5}) == '{\n  "lr": 1e-05\n}\n'
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            strict_json({"lr": bad})


def test_duplicate_keys_are_refused_with_the_key_named(tmp_path, capsys):
    with pytest.raises(UserError, match="the key 'zero_stage' appears twice"):
        parse_json('{"training": {"zero_stage": 3, "zero_stage": 0}}', "s.json")
    path = tmp_path / "s.json"
    path.write_text('{"model": "gpt2", "model": "llama-2-7b"}')
    assert main(["estimate", str(path)]) == 2
    assert "the key 'model' appears twice" in capsys.readouterr().err


# ---- launch files and the node layout --------------------------------------------------------------

def layout(num_gpus: int, gpus_per_node: int | None = None) -> Scenario:
    hw = {"gpu": "a100-80gb", "num_gpus": num_gpus} | ({"gpus_per_node": gpus_per_node} if gpus_per_node else {})
    training = {"zero_stage": 3, "precision": "bf16-mixed"}
    return Scenario.model_validate({**SCENARIO, "hardware": hw, "training": training})


@pytest.mark.parametrize(("gpus", "per_node", "nodes"), [(1, None, 1), (8, None, 1), (16, None, 2), (12, 6, 2),
                                                         (12, 4, 3), (64, 8, 8)])
def test_launch_lines_and_accelerate_agree_with_the_nodes(gpus, per_node, nodes):
    sc = layout(gpus, per_node)
    cfg = yaml.safe_load(accelerate_config(sc))
    assert (cfg["num_machines"], cfg["num_processes"]) == (nodes, gpus)  # accelerate's num_processes is the total
    lines = launch_lines(sc)
    each = gpus // nodes
    assert (f"--hostfile hostfile --num_nodes {nodes} --num_gpus {each} " if nodes > 1 else f"--num_gpus {each} ") \
        in lines


@pytest.mark.slow  # accelerate imports torch
@pytest.mark.parametrize(("gpus", "per_node"), [(1, None), (16, None), (12, 4)])
def test_accelerate_reads_the_config_as_the_node_layout(gpus, per_node, tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate.yaml"
    path.write_text(accelerate_config(layout(gpus, per_node)))
    loaded = config_args.ClusterConfig.from_yaml_file(str(path))  # accelerate's own loader
    each = per_node or min(gpus, 8)
    assert loaded.num_processes == gpus and loaded.num_processes // loaded.num_machines == each


@pytest.mark.parametrize(("gpus", "per_node", "even"), [(12, None, 6), (12, 8, 6), (10, 4, 2), (7, 4, 1)])
def test_gpus_that_do_not_fill_whole_nodes_are_refused_with_a_way_out(gpus, per_node, even, tmp_path, capsys):
    sc = layout(gpus, per_node)
    problem = node_layout_problem(sc)
    assert problem is not None and f"Set GPUs per node to {even} ({gpus // even} nodes of {even})" in str(problem)
    path = tmp_path / "s.json"
    path.write_text(sc.model_dump_json())
    assert main(["export", str(path), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "start the same number of processes on every node" in err
    assert not (tmp_path / "run").exists()


# ---- what the user said twice ------------------------------------------------------------------------

def test_a_cluster_with_another_gpu_is_refused_not_overridden(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "gpt2", "hardware": {"cluster": "8x-a100-80gb", "gpu": "rtx-4090"}}))
    assert main(["estimate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpu 'rtx-4090' contradicts cluster '8x-a100-80gb'" in err
    path.write_text(json.dumps({"model": "gpt2", "hardware": {"cluster": "8x-a100-80gb", "gpu": "a100-80gb"}}))
    assert main(["estimate", str(path)]) == 0  # the same GPU said twice agrees


@pytest.mark.parametrize(("top", "listed"), [((), 2), (("--top", "1"), 1), (("--top", "10"), 10)])
def test_a_request_files_max_candidates_holds_unless_top_is_given(tmp_path, capsys, top, listed):
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"scenario": {"model": "gpt2", "hardware": {"gpu": "a100-80gb"}}, "max_candidates": 2}))
    assert main(["recommend", str(path), "--format", "json", *top]) == 0
    rec = json.loads(capsys.readouterr().out)
    groups = {c["group"] for c in rec["candidates"]}
    assert max(sum(c["group"] == g for c in rec["candidates"]) for g in groups) == listed

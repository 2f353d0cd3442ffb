"""Published GPU figures (data/published_gpu.yaml): the loader refuses hostile input, the committed file is what
its header says, the report predicts each entry in its source's metric and counts only what is fully stated
and estimable, `python -m calc validate --published` prints it, and docs/published_gpu.md is up to date."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.cli.main import main
from calc.contract.published import (
    MAX_PUBLISHED_FILE_BYTES,
    UNIT_BYTES,
    PublishedError,
    load_published,
    parse_published,
    scenario_or_reason,
)
from calc.contract.scenario import FRAMEWORKS, Scenario, unmodelled_values
from calc.evidence import published as evidence
from calc.memory.engine import estimate

ROOT = Path(__file__).resolve().parents[3]
ESTIMABLE = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
             "training": {"precision": "amp-bf16", "micro_batch_size": 2, "seq_len": 1024}}


def entry(**changes) -> dict:
    """A valid entry (transformers, estimable today), with `changes` applied."""
    base = {
        "id": "example-llama3.2-1b", "split": "held-out",
        "source": {"url": "https://example.org/page", "where": "a table", "row": "| 1B | 7.1 GiB |"},
        "setup": {"model": "Llama 3.2 1B", "gpu": "A100 80GB", "num_gpus": 1, "framework": "transformers",
                  "version": "transformers 4.x", "method": "full", "precision": "amp bf16"},
        "metric": "peak_allocated", "metric_stated": True, "figure": 20.0, "unit": "GiB", "complete": True,
        "scenario": copy.deepcopy(ESTIMABLE),
    }
    base.update(changes)
    return base


def text_of(*entries: dict) -> str:
    return yaml.safe_dump({"schema_version": 1, "entries": list(entries)}, sort_keys=False)


@pytest.fixture(scope="module")
def committed():
    return load_published()


# ---- the committed data ------------------------------------------------------------------------------------

def test_committed_file_covers_every_framework_and_both_splits(committed):
    assert len(committed.entries) >= 90
    assert {e.setup.framework for e in committed.entries} == set(FRAMEWORKS)
    assert {e.split for e in committed.entries} == {"development", "held-out"}


def test_development_set_is_torchtunes_readme_and_docs(committed):
    for e in committed.entries:
        torchtune_docs = e.source.repo == "pytorch/torchtune" and (
            e.source.file == "README.md" or e.source.file.startswith("docs/"))
        assert (e.split == "development") == torchtune_docs, e.id


def test_every_source_is_pinned_to_a_commit_and_names_its_row(committed):
    for e in committed.entries:
        assert e.source.repo and e.source.commit and e.source.file, e.id
        assert e.source.commit in e.source.url and e.source.file in e.source.url, e.id


def test_every_entry_is_a_scenario_or_says_why_not(committed):
    for e in committed.entries:
        got = scenario_or_reason(e)
        assert isinstance(got, Scenario) or (isinstance(got, str) and got.strip()), e.id
        if e.not_in_contract:
            assert isinstance(got, str) and e.not_in_contract[0] in got


def test_figure_bytes_follow_the_printed_unit(committed):
    for e in committed.entries[:20]:
        assert e.figure_bytes == round(e.figure * UNIT_BYTES[e.unit])


# ---- the loader: strict and bounded -------------------------------------------------------------------------

def test_valid_entry_loads():
    f = parse_published(text_of(entry()))
    assert f.entries[0].figure_bytes == 20 * 2**30


@pytest.mark.parametrize("text,needle", [
    ("schema_version: 1\nentries: [{id: x, figure: .nan}]", "JSON value"),
    ("schema_version: 1\nentries: [{id: x, figure: .inf}]", "JSON value"),
    ("schema_version: 1\nwhen: 2024-09-24\nentries: []", "JSON value"),
    ("a: &a [1, 2]\nb: *a", "aliases"),
    ("schema_version: 1\nentries: [\n", "not valid YAML"),
    ("- just\n- a list", "mapping"),
    ("schema_version: 1\nentries: [{figure: 123456789012345678901234567890}]", "int"),
    ("[" * 40 + "]" * 40, "nested"),
])
def test_hostile_text_is_refused_in_one_line(text, needle):
    with pytest.raises(PublishedError) as exc:
        parse_published(text, "f.yaml")
    message = str(exc.value)
    assert needle in message and "\n" not in message and message.startswith("f.yaml")


def test_oversized_file_is_refused_before_parsing():
    with pytest.raises(PublishedError, match="larger than"):
        parse_published("#" * (MAX_PUBLISHED_FILE_BYTES + 1))


@pytest.mark.parametrize("changes,needle", [
    ({"surprise": 1}, "surprise"),
    ({"figure": 0}, "figure"),
    ({"figure": -3.0}, "figure"),
    ({"figure": 1e9}, "figure"),
    ({"figure": "7.4"}, "figure"),
    ({"unit": "GBytes"}, "unit"),
    ({"metric": "nvidia-smi-ish"}, "metric"),
    ({"split": "train"}, "split"),
    ({"complete": False}, "incomplete_because"),
    ({"incomplete_because": "why"}, "incomplete_because"),
    ({"id": "Has Spaces"}, "id"),
    ({"source": {"url": "http://insecure.example", "where": "t", "row": "r"}}, "url"),
    ({"source": {"url": "https://e.org", "where": "t", "row": "r", "commit": "not-a-sha"}}, "commit"),
    ({"setup": {"model": "m"}}, "setup"),
    ({"metric_stated": "yes"}, "metric_stated"),
    ({"not_in_contract": ["x"] * 17}, "not_in_contract"),
])
def test_bad_fields_are_named(changes, needle):
    with pytest.raises(PublishedError, match=needle):
        parse_published(text_of(entry(**changes)))


def test_duplicate_ids_are_refused():
    with pytest.raises(PublishedError, match="twice"):
        parse_published(text_of(entry(), entry()))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_any_text_loads_or_fails_with_a_published_error(text):
    with contextlib.suppress(PublishedError):  # anything else (a traceback) fails the test
        parse_published(text)


@settings(max_examples=30, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                    max_leaves=12))
def test_any_scenario_value_is_estimable_or_has_a_reason(junk):
    f = parse_published(text_of(entry(scenario={"model": "gpt2", "training": {"seq_len": 128}})))
    e = f.entries[0].model_copy(update={"scenario": {"model": junk}})
    got = scenario_or_reason(e)
    assert isinstance(got, (Scenario, str))


# ---- the report ---------------------------------------------------------------------------------------------

def _file(*entries: dict):
    return parse_published(text_of(*entries))


@pytest.mark.parametrize("metric", ["peak_allocated", "peak_active", "peak_reserved", "sum_peak_allocated",
                                    "device_used"])
def test_prediction_is_the_estimate_in_the_sources_metric(metric):
    case = evidence.report(_file(entry(metric=metric))).cases[0]
    est = estimate(Scenario.model_validate(ESTIMABLE), target="cuda")
    peak = est.peak_allocated_bytes
    expected = {"peak_allocated": peak, "peak_active": peak, "sum_peak_allocated": peak,
                "peak_reserved": peak + est.device_total_bytes.reserve_expected_bytes,
                "device_used": est.device_total_bytes.expected}[metric]
    assert case.predicted_bytes == expected
    assert case.error_pct == pytest.approx(100 * (expected - 20 * 2**30) / (20 * 2**30), abs=1e-3)
    assert case.not_estimable is None


def test_sum_over_gpus_multiplies_the_per_gpu_peak():
    two = {**ESTIMABLE, "hardware": {"gpu": "a100-80gb", "num_gpus": 2}}
    case = evidence.report(_file(entry(metric="sum_peak_allocated", scenario=two))).cases[0]
    assert case.predicted_bytes == 2 * estimate(Scenario.model_validate(two), target="cuda").peak_allocated_bytes


def test_only_stated_estimable_entries_are_counted():
    sc = ESTIMABLE
    near = entry(id="near", figure=estimate(Scenario.model_validate(sc)).peak_allocated_bytes / 2**30 * 1.05)
    far = entry(id="far", figure=1.0)
    unstated = entry(id="unstated", complete=False, incomplete_because="the batch is not given")
    # a framework this version still refuses (calc.contract.scenario.unmodelled_values)
    refused_framework = unmodelled_values()["framework"][0]
    refused = entry(id="refused", split="development", scenario={**sc, "training": {"framework": refused_framework}})
    rep = evidence.report(_file(near, far, unstated, refused))
    by_id = {c.id: c for c in rep.cases}
    assert by_id["refused"].not_estimable and refused_framework in by_id["refused"].not_estimable
    assert by_id["unstated"].error_pct is not None and not by_id["unstated"].counted
    whole = rep.frameworks[-1]
    assert (whole.framework, whole.split, whole.entries) == ("all", "all", 4)
    assert (whole.counted, whole.incomplete, whole.not_estimable) == (2, 1, 1)
    errs = [abs(by_id[i].error_pct) for i in ("near", "far")]
    assert whole.median_abs_error_pct == pytest.approx(statistics.median(errs))
    assert whole.worst_abs_error_pct == pytest.approx(max(errs))
    assert whole.within_10_pct == sum(e <= evidence.WITHIN_PCT for e in errs)
    rows = {(s.framework, s.split) for s in rep.frameworks}
    assert {("transformers", "all"), ("all", "development"), ("all", "held-out")} <= rows


def test_committed_report_has_a_row_per_framework(committed):
    rep = evidence.report(committed)
    assert {s.framework for s in rep.frameworks} == {*FRAMEWORKS, "all"}
    whole = rep.frameworks[-1]
    assert whole.entries == len(committed.entries)
    assert whole.not_estimable == sum(c.not_estimable is not None for c in rep.cases)


# ---- the command line ---------------------------------------------------------------------------------------

def test_cli_published_prints_entries_and_frameworks(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(text_of(entry(), entry(id="later", scenario={**ESTIMABLE, "training": {"compile": True}})))
    assert main(["validate", "--published", str(path)]) == 0
    out = capsys.readouterr().out
    assert "example-llama3.2-1b" in out and "not yet estimable" in out and "training.compile = true" in out
    assert "transformers" in out and "within 10 %" in out


def test_cli_published_thresholds(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(text_of(entry(figure=1.0)))
    assert main(["validate", "--published", str(path), "--max-worst", "5"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_published_bad_file_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("schema_version: 1\nentries: [{figure: .nan}]")
    assert main(["validate", "--published", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "JSON value" in err


def test_cli_published_refuses_measurement_files_too(capsys):
    assert main(["validate", "data/measured_cpu.jsonl", "--published"]) == 2


def test_plain_validate_groups_records_per_framework(tmp_path, capsys):
    lines = (ROOT / "data" / "measured_cpu.jsonl").read_text().splitlines()[:3]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    frameworks = {json.loads(line)["scenario"]["training"].get("framework", "transformers") for line in lines}
    for fw in frameworks:
        assert any(row.split()[:2] == ["framework", fw] and row.split()[2] == "3" for row in out.splitlines())


# ---- the generated page ---------------------------------------------------------------------------------------

@functools.cache
def _doc_script():
    name = "vramcalc_published_doc_script"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "published_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_published_page_is_up_to_date():
    assert _doc_script().main(["--check"]) == 0, "run: python scripts/published_doc.py"


def test_check_mode_sees_a_stale_page(tmp_path, monkeypatch, capsys):
    doc = _doc_script()
    page = tmp_path / "published_gpu.md"
    page.write_text(doc.render().replace("| torchtune |", "| torch tune |", 1))
    monkeypatch.setattr(doc, "PAGE", page)
    monkeypatch.setattr(doc, "ROOT", tmp_path)
    assert doc.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().out
    assert doc.main([]) == 0 and doc.main(["--check"]) == 0


def test_trainable_params_are_reported_beside_the_stated_count():
    lora = {**ESTIMABLE, "training": {**ESTIMABLE["training"], "lora": {"rank": 8, "targets": "attention"}}}
    stated = {**entry()["setup"], "method": "lora", "trainable_params": 1234}
    case = evidence.report(_file(entry(scenario=lora, setup=stated))).cases[0]
    assert case.stated_trainable_params == 1234
    assert case.predicted_trainable_params == estimate(Scenario.model_validate(lora)).model.trainable_params


def test_stated_trainable_params_agree_with_the_engine_where_estimable(committed):
    """LitGPT prints the adapters' parameter count: once such an entry is estimable, the engine must count the
    same adapters (the count is exact: r x (in + out) per adapted linear)."""
    rep = evidence.report(committed)
    for c in rep.cases:
        if c.stated_trainable_params is not None and c.predicted_trainable_params is not None:
            assert c.predicted_trainable_params == c.stated_trainable_params, c.id

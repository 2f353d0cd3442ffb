"""Validation page: predicted vs measured for the data set (calc.evidence.validate), the filters, and a user's
own record checked by pydantic with an error that names the field.

The records built here are test fixtures with made-up "measured" values (prediction x a factor): they
exercise the page, they are not measurements and are never written to data/."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

import calc.evidence.validate
from calc.contract.record import MeasurementRecord
from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.memory.engine import estimate
from tests.app.test_app_helpers import all_text, assert_clean, chart, open_app, open_folded, tables
from ui import compute


def fixture_record(sc: Scenario, factor: float, name: str, device: str = "cpu") -> MeasurementRecord:
    pred = estimate(sc, target="cuda" if device == "cuda" else "cpu").peak_allocated_bytes
    meas = round(pred * factor)
    return MeasurementRecord(
        name=name, scenario=sc, device=device,
        env={"python": "3.11", "torch": "2.x", "transformers": "5.x", "device_name": "test fixture"},
        peak_allocated_bytes=meas, peak_phase="backward",
        phase_peaks_bytes={"forward": meas // 2, "backward": meas, "optimizer": meas // 2},
        step_phase_peaks_bytes=[{"forward": meas // 2, "backward": meas, "optimizer": meas // 2}],
        weights_bytes=1, initial_allocated_bytes=1, num_params=sc.spec.total_params(),
        trainable_params=sc.spec.total_params(), steps=3, measured_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        wall_seconds=1.0)


FIXTURES = [
    (Scenario(model="gpt2", training={"micro_batch_size": 2, "seq_len": 256}), 1.02, "gpt2 b2"),
    (Scenario(model="pythia-160m", training={"seq_len": 512, "precision": "fp32"}), 0.97, "pythia fp32"),
    (Scenario(model="qwen2.5-0.5b", training={"seq_len": 256, "activation_checkpointing": "full"}), 1.05, "qwen ckpt"),
]


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    path = tmp_path / "fixture.jsonl"
    path.write_text("\n".join(fixture_record(sc, f, n).to_json_line() for sc, f, n in FIXTURES) + "\n")
    monkeypatch.setattr(calc.evidence.validate, "DATA_DIR", tmp_path)
    compute._report.clear()
    yield calc.evidence.validate.report(calc.evidence.validate.load_all([path]))
    compute._report.clear()


def test_data_set_plot_and_filters(dataset):
    at = open_app("validation")
    rep = dataset
    assert [m.value for m in at.metric] == [f"{len(rep.cases):,}", f"{rep.median_abs_error_pct:.2f} %",
                                            f"{rep.worst_abs_error_pct:.2f} %"]
    fig = chart(at, "val_scatter")
    pts = {(round(x, 9), round(y, 9)) for t in fig["data"] if t.get("mode") == "markers"
           for x, y in zip(t["x"], t["y"], strict=True)}
    assert pts == {(round(c.measured_bytes / GiB, 9), round(c.predicted_bytes / GiB, 9)) for c in rep.cases}
    line = [t for t in fig["data"] if t.get("name") == "y = x (perfect)"][0]
    assert line["x"] == line["y"]
    assert fig["layout"]["xaxis"]["type"] == "log"
    [t for t in at.toggle if t.key == "val_log"][0].set_value(False)
    at.run()
    assert_clean(at)
    assert chart(at, "val_scatter")["layout"]["xaxis"].get("type") != "log"
    hist = chart(at, "val_hist")
    assert sorted(hist["data"][0]["x"]) == pytest.approx(sorted(c.error_pct for c in rep.cases))
    table = [d for d in at.dataframe if "error %" in d.value.columns][0].value
    assert list(table["error %"]) == pytest.approx([c.error_pct for c in rep.cases])
    [m for m in at.multiselect if m.key == "val_family"][0].set_value(["gpt2"])
    at.run()
    assert_clean(at)
    table = [d for d in at.dataframe if "error %" in d.value.columns][0].value
    assert list(table["run"]) == ["gpt2 b2"]
    [m for m in at.multiselect if m.key == "val_family"][0].set_value([])
    [m for m in at.multiselect if m.key == "val_precision"][0].set_value(["fp32"])
    [m for m in at.multiselect if m.key == "val_device"][0].set_value(["cpu"])
    at.run()
    table = [d for d in at.dataframe if "error %" in d.value.columns][0].value
    assert list(table["run"]) == ["pythia fp32"]
    assert "1 of 3 runs shown." in all_text(at)


def test_own_record_is_checked_and_plotted(dataset):
    at = open_app("validation")
    sc = Scenario(model="llama-3.2-1b", training={"seq_len": 512})
    rec = fixture_record(sc, 1.10, "my run")
    case = calc.evidence.validate.compare(rec)
    up = [w for w in at.get("file_uploader") if w.key == "val_upload"][0]
    up.set_value(("record.json", rec.model_dump_json(indent=2).encode(), "application/json"))
    at.run()
    assert_clean(at)
    assert f"measured {case.measured_bytes / GiB:,.2f} GiB" in all_text(at)
    assert f"({case.error_pct:+.2f} %" in all_text(at)
    star = [t for t in chart(at, "val_scatter")["data"] if t.get("name") == "your record"][0]
    assert star["x"] == pytest.approx([case.measured_bytes / GiB])
    assert star["y"] == pytest.approx([case.predicted_bytes / GiB])


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"schema_version": 1}', "scenario: Field required"),
    ("WRONG_PEAK", "peak_allocated_bytes"),
    ("WRONG_MODEL", "unknown model preset"),
])
def test_bad_record_names_the_field(text, message):
    good = json.loads(fixture_record(FIXTURES[0][0], 1.0, "x").to_json_line())
    if text == "WRONG_PEAK":
        text = json.dumps({**good, "peak_allocated_bytes": -5})
    elif text == "WRONG_MODEL":
        text = json.dumps({**good, "scenario": {**good["scenario"], "model": "no-such-model"}})
    at = open_app("validation")
    [t for t in at.text_area if t.key == "val_paste"][0].set_value(text)
    at.run()
    assert_clean(at)
    errs = [e.value for e in at.error]
    assert any(message in e for e in errs), errs


def test_huge_upload_is_refused():
    at = open_app("validation")
    up = [w for w in at.get("file_uploader") if w.key == "val_upload"][0]
    up.set_value(("big.jsonl", b"{}\n" * (2**20), "application/json"))
    at.run()
    assert_clean(at)
    assert any("the limit is 1 MiB" in e.value for e in at.error)


def test_committed_data_set_renders():
    """Whatever data/*.jsonl holds now (possibly nothing yet): no exception, and the count shown is
    calc.evidence.validate's."""
    at = open_app("validation")
    files = calc.evidence.validate.default_data_files()
    if not files:
        assert any("No measured runs are committed yet" in i.value for i in at.info)
    else:
        rep = calc.evidence.validate.report(calc.evidence.validate.load_all(files))
        assert at.metric[0].value == f"{len(rep.cases):,}"
        n = calc.evidence.validate.run_counts(rep.cases)
        # the headline, in a box and not folded: where the runs ran, what they check and what they do not
        box = (at.info if n.gpu else at.warning)[0].value
        assert (f"**{n.total:,} measured runs, none on a GPU**" in box) == (n.gpu == 0)
        assert f"{n.deepspeed_cpu:,} with DeepSpeed on its CPU accelerator, {n.fake:,} with fake tensors" in box
        assert "**peak allocated**" in box and "do not check the **device total**" in box
        assert "bash measure/run_gpu.sh" in box


def test_run_counts_say_where_each_run_ran(dataset):
    n = calc.evidence.validate.run_counts(dataset.cases)
    assert (n.torch_cpu, n.deepspeed_cpu, n.fake, n.gpu) == (3, 0, 0, 0) and n.total == len(dataset.cases)
    gpu = dataset.cases[0].model_copy(update={"device": "cuda"})
    ds = dataset.cases[1].model_copy(update={"sharding": "zero2x2"})
    fake = dataset.cases[2].model_copy(update={"device": "fake"})
    assert calc.evidence.validate.run_counts([gpu, ds, fake]) == calc.evidence.validate.RunCounts(
        torch_cpu=0, deepspeed_cpu=1, fake=1, gpu=1)


def test_evidence_tables_are_filled_when_opened():
    """The folded DeepSpeed and model-family evidence and the modelled-from-source list: sent once opened."""
    at = open_app("validation")
    assert not [t for t in tables(at) if "behaviour" in t.columns or "family" in t.columns]
    open_folded(at)
    behaviours = next(t for t in tables(at) if "behaviour" in t.columns)
    assert list(behaviours["behaviour"]) == [b for b, _s in calc.evidence.validate.DEEPSPEED_BEHAVIOURS]
    families = next(t for t in tables(at) if "family" in t.columns)
    assert list(families["family"]) == [f for f, _m, _s in calc.evidence.validate.FAMILY_EVIDENCE]
    assert all(tr_what in all_text(at) for tr_what, _w in compute.modelled_from_source())

"""User text on the pages is shown as written (ui.fmt.literal, the one Markdown/HTML escape): a calibration
record's device name in the verdict and the "applied on trust" caption, a record's name; a Compare link with an
unknown GPU or cluster is a visible message, not a default column; GPUs that do not fill whole nodes get a reason
on the Export page instead of launch files."""

from __future__ import annotations

import json

import pytest

from calc.contract.scenario import Scenario
from tests.app.test_app_helpers import PROSE, assert_clean, chart, open_app, scenario, texts
from tests.calc.evidence.test_calibrate import cuda_like
from ui import fmt, state

# a link, an image, HTML, math, code, emphasis and a bare autolink: each renders as something else in Markdown
MARKDOWN = "[click](https://e.vil) ![i](https://e.vil/i.png) <b>bold</b> $x^2$ `code` **loud** www.e.vil"


def test_literal_shows_controls_and_markdown_as_written():
    assert fmt.literal("a\u202eb\x1bc\nd") == "a\\\\u202eb\\\\u001bc\nd"  # the escape's backslash escaped in turn
    assert fmt.literal("[x](y)") == "\\[x\\](y)"


@pytest.fixture(scope="module")
def run():
    from calc.evidence.validate import compare, load_all

    return next(r for r in load_all() if r.device == "fake" and r.engine == "torch-single"
                and abs(compare(r).error_pct) < 0.01)


def assert_shown_as_written(at, text: str) -> list[str]:
    """Every Markdown element that quotes `text` quotes it escaped; the elements that do."""
    quoting = [t for t in texts(at, PROSE) if "e.vil" in t]
    for t in quoting:
        assert "[click](" not in t and "<b>" not in t and "$x^2$" not in t and "`code`" not in t, t
        assert fmt.literal(text[:22]) in t, t  # "[click](https://e.vil)", escaped (a message quotes 60 characters)
    assert quoting, "the text is shown somewhere"
    return quoting


def test_a_calibration_records_device_name_is_shown_as_written(run):
    sc = Scenario.model_validate({"model": "llama-3.2-1b", "hardware": {"memory_bytes": 80 * 2**30},
                                  "training": {"seq_len": 1024}})
    at = open_app(params=state.scenario_to_params(sc))
    assert scenario(at).hardware.gpu is None  # so the calibration is "applied on trust", naming its machine
    doc = cuda_like(run)
    doc["env"]["device_name"] = MARKDOWN
    up = [w for w in at.file_uploader if w.key == "cal_upload_0"][0]
    up.set_value([("r.json", json.dumps(doc).encode(), "application/json")])
    at.run()
    assert_clean(at)
    quoting = assert_shown_as_written(at, MARKDOWN)
    assert any(t.startswith(f"Calibrated on **a100-80gb ({fmt.literal(MARKDOWN)})**") for t in quoting)
    assert any("Applied on trust" in t and fmt.literal(MARKDOWN) in t for t in quoting)


def test_a_validation_records_name_is_shown_as_written(run):
    at = open_app("validation")
    doc = json.loads(run.to_json_line())
    doc["name"] = MARKDOWN
    up = [w for w in at.file_uploader][0]
    up.set_value([("r.json", json.dumps(doc).encode(), "application/json")])
    at.run()
    assert_clean(at)
    assert_shown_as_written(at, MARKDOWN)
    star = [t for t in chart(at, "val_scatter")["data"] if t.get("name") == "your record"][0]
    assert star["customdata"][0][0] == fmt.plot_text(MARKDOWN) and "&lt;b&gt;bold&lt;/b&gt;" in fmt.plot_text(MARKDOWN)


@pytest.mark.parametrize(("column", "says"), [("g.nope.2~z.0", "unknown GPU preset 'nope'"),
                                              ("c.nope~z.0", "unknown cluster preset 'nope'"),
                                              ("g.8x-a100-80gb.8~z.0", "unknown GPU preset '8x-a100-80gb'"),
                                              (f"c.{'x' * 150}", "unknown cluster preset 'xxx")])
def test_a_compare_link_with_an_unknown_gpu_or_cluster_is_a_message(column, says):
    assert len(state.compare_from_param("c.1x-h100-sxm~z.0~f.1_g.a100-80gb.2~z.0")) == 2  # the form is right
    at = open_app("compare", {"model": "gpt2", state.COMPARE_PARAM: f"c.1x-h100-sxm~z.0~f.1_{column}"})
    assert_clean(at)
    warnings = [w.value for w in at.warning if "comparison is not valid" in w.value]
    assert len(warnings) == 1 and fmt.literal(says) in warnings[0] and len(warnings[0]) < 400
    assert at.session_state[state.COMPARE] == list(state.DEFAULT_COMPARE)


def test_the_export_page_says_why_gpus_that_fill_no_whole_nodes_cannot_launch():
    at = open_app("export", {"model": "gpt2", "gpu": "a100-80gb", "gpus": "12", "zero": "2",
                             "prec": "bf16-mixed"})
    assert_clean(at)
    errors = [e.value for e in at.error if "No launch line" in e.value]
    assert len(errors) == 1 and "Set GPUs per node to 6 (2 nodes of 6)" in errors[0]
    names = [b.proto.label for b in at.get("download_button")]
    assert "Download ds_config.json" in names and "Download launch.sh" not in names
    assert "Download accelerate.yaml" not in names


# ---- every text box, upload and link parameter, fed Markdown --------------------------------------------

CONFIGS = [{"model_type": MARKDOWN}, {"model_type": "llama", "hidden_size": MARKDOWN},
           {"model_type": "llama", "hidden_size": 4096, "vocab_size": [MARKDOWN]}]


def _box(at, key: str):
    return [w for w in [*at.text_area, *at.text_input] if w.key == key][0]


@pytest.mark.parametrize("config", CONFIGS, ids=["model_type", "hidden_size", "vocab_size"])
def test_a_pasted_config_json_is_quoted_as_written(config):
    at = open_app()
    [r for r in at.radio if r.key == "sc_model_source"][0].set_value("config").run()
    _box(at, "sc_config_text").set_value(json.dumps(config)).run()
    assert_clean(at)
    assert_shown_as_written(at, MARKDOWN)


def _record(run, device_name: str = "NVIDIA A100-SXM4-80GB", name: str = "r") -> str:
    doc = cuda_like(run)
    doc["name"], doc["env"]["device_name"] = name, device_name
    return json.dumps(doc)


@pytest.mark.parametrize(("page", "key", "text"), [
    ("export", "exp_import_text", lambda run: json.dumps({"zero_optimization": {"stage": MARKDOWN}})),
    ("validation", "val_paste", lambda run: _record(run, name=MARKDOWN)),
    ("calculator", "cal_paste_0", lambda run: _record(run, device_name=MARKDOWN)),
], ids=["ds_config", "validation record", "calibration record"])
def test_pasted_files_are_quoted_as_written(page, key, text, run):
    at = open_app(page, {"model": "gpt2", "gpu": "a100-80gb"})
    _box(at, key).set_value(text(run)).run()
    assert_clean(at)
    assert_shown_as_written(at, MARKDOWN)


@pytest.mark.parametrize(("params", "text"), [
    ({"model": MARKDOWN}, MARKDOWN), ({"model": "gpt2", "gpu": MARKDOWN}, MARKDOWN),
    ({"model": "gpt2", state.COMPARE_PARAM: f"g.{MARKDOWN}.2~z.0_c.8x-a100-80gb~z.0"}, MARKDOWN),
], ids=["model", "gpu", "cmp"])  # cal= takes a GPU id by its pattern, never quoting it
def test_link_parameters_are_quoted_as_written(params, text):
    at = open_app("compare" if state.COMPARE_PARAM in params else "calculator", params)
    assert_clean(at)
    assert_shown_as_written(at, text)

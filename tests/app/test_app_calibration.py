"""The Calculator page's calibration section (ui/calibration.py) and its URL form (ui.state): typed
numbers and uploaded records make a calibration, the numbers on screen are calc.evidence.calibrate's, the
calibration travels in the link and can be cleared, a record the engine misses is reported with a
link to the Validation page, another GPU is refused, bad input gets a message."""

from __future__ import annotations

import json

import pytest

from calc.contract.units import MiB
from calc.evidence.calibrate import apply, fit, observations_from_text
from calc.evidence.validate import compare, load_all
from calc.memory.engine import estimate
from tests.app.test_app_helpers import all_text, assert_clean, metric, open_app, scenario
from tests.calc.evidence.test_calibrate import GPU, cuda_like
from ui import fmt, state

LINK = {"model": "llama-3.2-1b", "gpu": GPU, "seq": "1024"}


@pytest.fixture(scope="module")
def runs():
    return [r for r in load_all() if r.device == "fake" and r.engine == "torch-single"
            and abs(compare(r).error_pct) < 0.01][:3]


def _widget(at, kind: str, key: str):
    return [w for w in at.get(kind) if getattr(w, "key", None) == key][0]


def _button(at, key: str):
    return [b for b in at.button if b.key == key][0]


def check_calibrated(at, cal) -> None:
    """What the section shows equals calc.evidence.calibrate.apply for the page's scenario."""
    assert_clean(at)
    sc = scenario(at)
    ce = apply(cal, estimate(sc), sc)
    dt = ce.device_total_bytes
    assert metric(at, "Device total, calibrated (GiB)") == fmt.gib(dt.expected)
    assert metric(at, "Calibrated range (GiB)") == f"{dt.low / fmt.GiB:,.2f} – {dt.high / fmt.GiB:,.2f}"
    assert "Applied: " + "; ".join(ce.applied) in all_text(at)
    assert metric(at, "Headroom, calibrated (GiB)") == fmt.gib(ce.headroom_bytes)
    table = [d for d in at.dataframe if "Calibrated (GiB)" in d.value.columns][0].value
    assert list(table["Calibrated (GiB)"])[-2] == pytest.approx(dt.expected / fmt.GiB)
    assert list(table["Uncalibrated (GiB)"])[-2] == pytest.approx(ce.uncalibrated_device_total_bytes.expected / fmt.GiB)


def test_three_numbers_calibrate_and_travel_in_the_link():
    at = open_app(params=LINK)
    assert "Ran one configuration on your GPU already?" in all_text(at)
    sc = scenario(at)
    peak = estimate(sc).peak_allocated_bytes
    _widget(at, "number_input", "cal_alloc").set_value(peak)
    _widget(at, "number_input", "cal_reserved").set_value(int(peak * 1.07))
    _widget(at, "number_input", "cal_used_mib").set_value(int(peak * 1.07) // MiB + 650)
    _button(at, "cal_fit_numbers").click()
    at.run()
    cal = at.session_state[state.CALIBRATION]
    assert cal.reserve_ratio.value == pytest.approx(1.07, abs=1e-6) and cal.records == 1
    check_calibrated(at, cal)
    assert "Calibrated on **a100-80gb**" in all_text(at)
    param = at.query_params[state.CALIBRATION_PARAM]
    param = param[0] if isinstance(param, list) else param
    assert len(param) < 120
    # the link reproduces it in a new session, for another scenario on the same GPU too
    again = open_app(params={**LINK, "seq": "4096", state.CALIBRATION_PARAM: param})
    restored = again.session_state[state.CALIBRATION]
    assert restored.reserve_ratio.value == pytest.approx(1.07, abs=1e-5)
    check_calibrated(again, restored)
    # and it can be cleared: gone from the session and from the URL
    _button(again, "cal_clear").click()
    again.run()
    assert_clean(again)
    assert state.CALIBRATION not in again.session_state
    assert state.CALIBRATION_PARAM not in again.query_params
    assert "Ran one configuration on your GPU already?" in all_text(again)


def test_inconsistent_numbers_get_a_message():
    at = open_app(params=LINK)
    _widget(at, "number_input", "cal_alloc").set_value(10 * 2**30)
    _widget(at, "number_input", "cal_reserved").set_value(9 * 2**30)
    _widget(at, "number_input", "cal_used_mib").set_value(12 * 1024)
    _button(at, "cal_fit_numbers").click()
    at.run()
    assert_clean(at)
    assert any("below allocated" in e.value for e in at.error)
    assert state.CALIBRATION not in at.session_state


def test_uploaded_records_that_disagree_point_to_validation(runs):
    at = open_app(params=LINK)
    good, off = cuda_like(runs[0]), cuda_like(runs[1], extra_pct=9.0)
    up = _widget(at, "file_uploader", "cal_upload_0")
    up.set_value([("a.json", json.dumps(good).encode(), "application/json"),
                  ("b.json", json.dumps(off).encode(), "application/json")])
    at.run()
    cal = at.session_state[state.CALIBRATION]
    want = fit(observations_from_text(json.dumps(good), "a.json") + observations_from_text(json.dumps(off), "b.json"))
    assert cal.model_dump() == want.model_dump() and len(cal.disagreements) == 1
    check_calibrated(at, cal)
    assert any("Validation page" in w.value for w in at.warning)
    links = [p.proto for p in at.get("page_link") if p.proto.label == "Open the Validation page"]
    assert len(links) == 1 and links[0].page == "Validation"


def test_pasted_record_and_hostile_paste(runs):
    at = open_app(params=LINK)
    doc = cuda_like(runs[0])
    doc["peak_reserved_bytes"] = float("nan")
    _widget(at, "text_area", "cal_paste_0").set_value(json.dumps(doc))
    at.run()
    assert_clean(at)
    assert any("peak_reserved_bytes" in e.value for e in at.error)
    _widget(at, "text_area", "cal_paste_0").set_value("[" * 50_000 + "]" * 50_000)
    at.run()
    assert_clean(at)
    assert any("nested too deeply" in e.value for e in at.error)
    _widget(at, "text_area", "cal_paste_0").set_value(json.dumps(cuda_like(runs[0])))
    at.run()
    assert_clean(at)
    assert at.session_state[state.CALIBRATION].records == 1


def test_another_gpu_is_not_calibrated(runs):
    cal = fit(observations_from_text(json.dumps(cuda_like(runs[0])), "r.json"))
    at = open_app(params={**LINK, "gpu": "h100-sxm", state.CALIBRATION_PARAM: state.calibration_to_param(cal)})
    assert any("applies only to the machine it was measured on" in w.value for w in at.warning)
    with pytest.raises(KeyError):
        metric(at, "Device total, calibrated (GiB)")


@pytest.mark.parametrize("bad", ["v2~n_1", "v1~n_1~r_nan_0.02~o_1_1", "v1~n_1~r_1.05_0.02~o_5_1~zz_3",
                                 "v1~n_x~r_1.05_0.02~o_5_1", "v1~n_1~o_5_1", "v1~" + "w_1~" * 400])
def test_a_bad_calibration_link_is_reported(bad):
    with pytest.raises(state.UrlError):
        state.calibration_from_param(bad)
    at = open_app(params={**LINK, state.CALIBRATION_PARAM: bad})
    assert any("calibration is not valid" in w.value for w in at.warning)
    assert state.CALIBRATION not in at.session_state


def test_url_form_round_trips(runs):
    docs = [cuda_like(r, ratio=1.04 + 0.01 * i, per_token=4096.0) for i, r in enumerate(runs)]
    docs[2] = cuda_like(runs[2], extra_pct=-8.0)
    cal = fit([o for i, d in enumerate(docs) for o in observations_from_text(json.dumps(d), f"r{i}")])
    text = state.calibration_to_param(cal)
    back = state.calibration_from_param(text)
    assert state.calibration_to_param(back) == text
    assert back.gpu == cal.gpu and back.records == cal.records and len(back.disagreements) == 1
    sc = scenario(open_app(params=LINK))
    a, b = apply(cal, estimate(sc), sc), apply(back, estimate(sc), sc)
    for k in ("low", "expected", "high"):
        assert getattr(b.device_total_bytes, k) == pytest.approx(getattr(a.device_total_bytes, k), rel=1e-5)

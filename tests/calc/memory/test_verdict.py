"""One verdict (issue 8): calc.memory.verdict decides fits / does not fit / unknown from GPU memory, host RAM and
NVMe, and the CLI, the Calculator, Compare and Recommend all show that same verdict."""

from __future__ import annotations

import contextlib
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calc.cli.main import main as cli
from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.memory.estimate import estimate
from calc.memory.verdict import gib_short, headline, make_verdict, short
from calc.recommend import RecommendRequest, optimization_waterfall, recommend
from tests.app.test_app_helpers import all_text, assert_clean, open_app
from tests.positions import within_positions
from ui import state

# ---- the verdict itself -----------------------------------------------------------------------------


def test_every_known_limit_met_fits():
    v = make_verdict(10 * GiB, 24 * GiB, 50 * GiB, 64 * GiB, 0, None)
    assert v.fits is True and v.reasons == []
    assert [lim.resource for lim in v.limits] == ["gpu", "host_ram"]  # no NVMe limit when nothing goes there
    assert headline(v) == "fits with 14 GiB headroom per GPU" and short(v) == "fits"


def test_any_exceeded_limit_does_not_fit_and_says_by_how_much():
    v = make_verdict(18 * GiB, 24 * GiB, round(100.41 * GiB), 64 * GiB, 0, None)
    assert v.fits is False
    assert v.reasons == ["offload needs 100.41 GiB of host RAM per node; this node has 64 GiB"]
    assert headline(v) == "does not fit: offload needs 100.41 GiB of host RAM per node; this node has 64 GiB"
    assert short(v) == "does not fit (host RAM)"
    gpu = make_verdict(30 * GiB, 24 * GiB, 0, None, 0, None)
    assert gpu.fits is False and gpu.reasons == ["needs 30 GiB per GPU; the GPU has 24 GiB (short by 6 GiB)"]


def test_an_unknown_limit_is_asked_for_not_assumed():
    v = make_verdict(10 * GiB, 24 * GiB, 0, None, 500 * 10**9, None)
    assert v.fits is None and v.limit("nvme").fits is None and v.limit("nvme").available_bytes is None
    assert "this node's NVMe space is unknown (set it under Hardware)" in v.reasons[0]
    assert headline(v).startswith("fits on the GPU with 14 GiB headroom, but offload needs")
    # an exceeded limit wins over an unknown one
    assert make_verdict(30 * GiB, 24 * GiB, 5, None, 0, None).fits is False
    assert make_verdict(1, None, 0, None, 0, None).fits is None  # no GPU size


def test_gib_short():
    assert gib_short(64 * GiB) == "64 GiB" and gib_short(round(1027.83 * GiB)) == "1,027.83 GiB"


# ---- every page and the CLI agree ---------------------------------------------------------------------

MODELS = st.sampled_from(["gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "llama-2-7b"])
OFFLOADS = st.sampled_from([(0, "none", "none"), (1, "cpu", "none"), (2, "cpu", "none"), (3, "cpu", "cpu"),
                            (3, "nvme", "none"), (3, "nvme", "nvme"), (2, "none", "none"), (3, "none", "none")])


@st.composite
def scenarios(draw) -> Scenario:
    zero, off_opt, off_par = draw(OFFLOADS)
    hardware = {"gpu": draw(st.sampled_from(["rtx-4090", "a100-80gb", "l4"])),
                "num_gpus": draw(st.sampled_from([1, 2, 8]))}
    ram = draw(st.sampled_from([None, 16, 64, 512]))
    if ram is not None:
        hardware["cpu_ram_bytes"] = ram * GiB
    nvme = draw(st.sampled_from([None, 100, 4000]))
    if nvme is not None:
        hardware["nvme_bytes"] = nvme * GiB
    training = {"micro_batch_size": draw(st.integers(1, 4)), "seq_len": draw(st.sampled_from([512, 2048])),
                "precision": "bf16-mixed" if zero else draw(st.sampled_from(["amp-bf16", "bf16-mixed"])),
                "activation_checkpointing": draw(st.sampled_from(["none", "full"])), "zero_stage": zero,
                "offload_optimizer": off_opt, "offload_params": off_par}
    model = draw(MODELS)
    training["seq_len"] = within_positions(model, training["seq_len"])
    return Scenario.model_validate({"model": model, "hardware": hardware, "training": training})


def _cli_verdict(sc: Scenario, tmp: str) -> dict:
    path = f"{tmp}/scenario.json"
    with open(path, "w") as f:
        f.write(sc.model_dump_json())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["estimate", path]) == 0
    return json.loads(out.getvalue())["verdict"]


ENGINE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAGES = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ENGINE
@given(scenarios())
def test_cli_json_carries_the_engine_verdict(sc):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert _cli_verdict(sc, tmp) == estimate(sc).verdict.model_dump(mode="json")


@PAGES
@given(scenarios())
def test_calculator_and_compare_show_the_engine_verdict(sc):
    v = estimate(sc).verdict
    at = open_app(params=state.scenario_to_params(sc))
    assert f"**{headline(v)}**" in all_text(at)
    t = sc.training
    col = state.CompareColumn(gpu=sc.hardware.gpu, num_gpus=sc.hardware.num_gpus, zero_stage=t.zero_stage,
                              offload_optimizer=t.offload_optimizer, offload_params=t.offload_params)
    other = state.CompareColumn(cluster="8x-a100-80gb")
    params = {**state.scenario_to_params(sc), state.COMPARE_PARAM: state.compare_to_param([col, other])}
    at = open_app("compare", params)
    assert_clean(at)
    assert col.apply(sc) == sc  # a GPU x count column keeps the sidebar's host RAM / NVMe
    assert f"**{headline(v)}**" in all_text(at)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_recommend_candidates_and_waterfall_steps_carry_the_engine_verdict(sc):
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=2))
    for c in rec.candidates:
        assert c.verdict == estimate(c.scenario).verdict and c.verdict.fits is not False
    for s in optimization_waterfall(sc):
        assert s.verdict == estimate(s.scenario).verdict and s.fits == s.verdict.fits

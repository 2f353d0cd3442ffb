"""Serve page: the plan of the chosen model and GPU as a sentence, the budget bar, concurrency against context
length and the launch line; a setup that does not start says so; bad input is one message, not a traceback."""

from __future__ import annotations

from calc.contract.scenario import Scenario
from calc.serve.plan import launch_command, plan
from tests.app.test_app_helpers import ROOT, all_text, assert_clean, go, open_app
from ui import state


def serve_page():
    at = open_app()
    at.run()
    return go(at, "serve")


def test_default_plan_matches_the_engine():
    """The page starts from the scenario the other pages share: the default's model on its GPU."""
    at = serve_page()
    assert_clean(at)
    shared = state.DEFAULT_SCENARIO
    assert at.selectbox(key="srv_model").value == shared.model
    assert at.selectbox(key="srv_gpu").value == shared.resolved_hardware().gpu
    expected = plan(expected_scenario(shared))
    text = all_text(at)
    if expected.starts:
        assert f"{expected.kv_cache_tokens:,} tokens of KV cache" in text
    assert f"{expected.kv_bytes_per_token:,}" in [m.value for m in at.metric]
    assert at.code[0].value == launch_command(expected_scenario(shared))
    assert len(at.get("plotly_chart")) == 2


def expected_scenario(shared: Scenario) -> Scenario:
    """The page's first plan: 8,192-token requests, or the model's own context when shorter (Llama 2: 4,096)."""
    length = min(8192, shared.spec.max_position_embeddings)
    return Scenario.model_validate({"model": shared.model, "mode": "serve",
                                    "hardware": {"gpu": shared.resolved_hardware().gpu},
                                    "inference": {"weights": "bf16"}, "serving": {"max_model_len": length}})


def test_the_page_starts_from_the_shared_scenario_model_and_gpu():
    at = open_app(params={"model": "llama-3.1-8b", "gpu": "h100-sxm"})
    at = go(at, "serve")
    assert_clean(at)
    assert at.selectbox(key="srv_model").value == "llama-3.1-8b"
    assert at.selectbox(key="srv_gpu").value == "h100-sxm"
    expected = plan(expected_scenario(Scenario(model="llama-3.1-8b", hardware={"gpu": "h100-sxm"})))
    assert f"{expected.kv_cache_tokens:,} tokens of KV cache" in all_text(at)
    assert at.code[0].value.startswith("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 1")


def test_a_model_too_big_for_the_gpu_does_not_start():
    at = serve_page()
    at.selectbox(key="srv_model").set_value("llama-3.1-70b")
    at.selectbox(key="srv_gpu").set_value("a100-80gb")
    at.number_input(key="srv_len").set_value(8192)
    at.run()
    assert_clean(at)
    assert "Does not start" in at.error[0].value
    sc = Scenario.model_validate({"model": "llama-3.1-70b", "mode": "serve", "hardware": {"gpu": "a100-80gb"},
                                  "inference": {"weights": "bf16"}, "serving": {"max_model_len": 8192}})
    assert launch_command(sc) == at.code[0].value


def test_tensor_parallel_that_does_not_divide_the_heads_is_one_message():
    at = serve_page()
    at.number_input(key="srv_tp").set_value(3)
    at.run()
    assert_clean(at)
    assert "must divide the 32 attention heads" in at.error[0].value


def test_the_page_speaks_chinese():
    from tests.app.test_app_helpers import visible_text
    from tests.calc.contract.test_i18n import CJK, KEEP, english_runs

    at = open_app("calculator", {"lang": "zh"})
    at.run()
    at = go(at, "serve")
    shown = visible_text(at.main)
    assert any(CJK.search(t) for t in shown)
    assert [run for t in shown for run in english_runs(t, 3, KEEP)] == []


def test_validation_page_lists_the_published_serving_logs():
    from calc.serve.published import compare, published_logs
    from tests.app.test_app_helpers import tables

    at = open_app()
    at.run()
    at = go(at, "validation")
    rows = [t for t in tables(at) if "predicted" in t.columns]
    assert rows, "no serving table"
    table = rows[-1]
    expected = [c for log in published_logs() for c in compare(log)]
    assert len(table) == len(expected)
    assert f"{expected[0].predicted:,.4g}" == table["predicted"].iloc[0]


def test_the_page_and_the_cli_give_the_same_plan(tmp_path):
    """A user who tries a setup on the page and scripts it with `python -m calc serve --format json` reads the same
    figures and the same launch line: the page's widgets set, the scenario they stand for written to a file and
    run through the CLI in its own process."""
    import json
    import subprocess
    import sys

    at = serve_page()
    at.selectbox(key="srv_model").set_value("qwen3-8b")
    at.selectbox(key="srv_gpu").set_value("l40s")
    at.radio(key="srv_kv").set_value("fp8")
    at.slider(key="srv_util").set_value(0.8)
    at.number_input(key="srv_len").set_value(16384)
    at.run()
    assert_clean(at)
    scenario = {"model": "qwen3-8b", "mode": "serve", "hardware": {"gpu": "l40s"},
                "serving": {"gpu_memory_utilization": 0.8, "max_model_len": 16384, "kv_cache_dtype": "fp8"}}
    (tmp_path / "serve.json").write_text(json.dumps(scenario))
    r = subprocess.run([sys.executable, "-m", "calc", "serve", str(tmp_path / "serve.json"), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    assert cli["starts"]
    text = all_text(at)
    assert f"About **{cli['max_concurrency']:,.2f}** requests of 16,384 tokens at once" in text
    assert f"{cli['kv_cache_tokens']:,} tokens of KV cache" in text
    assert f"{cli['kv_bytes_per_token']:,}" in [m.value for m in at.metric]
    assert f"{cli['largest_max_model_len']:,}" in [m.value for m in at.metric]
    assert at.code[0].value == cli["launch_command"]

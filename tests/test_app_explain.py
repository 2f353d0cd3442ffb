"""Explain page: one section per topic, every figure in the text computed by calc/ for the current
scenario (and follows it when the sidebar changes), and the "common claims, checked" table."""

from __future__ import annotations

from test_app_helpers import all_text, assert_clean, open_app, scenario

from calc import parallel, precision
from calc.engine import estimate
from calc.scenario import Optimizer, Precision, Scenario
from ui import fmt, state

TOPICS = ["Where memory goes", "Optimizer states", "Mixed precision", "Activation checkpointing", "ZeRO", "Offload",
          "FlashAttention", "Parallelism", "Quantization and LoRA / QLoRA", "Monitoring", "Troubleshooting",
          "Common claims, checked"]


def _tables(at) -> list:
    return [t.value for t in at.table]


def test_every_topic_has_a_section():
    at = open_app("explain")
    headers = [h.value for h in at.header]
    assert headers == TOPICS


def test_numbers_are_the_engines_for_the_current_scenario():
    at = open_app("explain")
    sc = scenario(at)
    est = estimate(sc)
    text = all_text(at)
    assert f"the peak ({fmt.gib(est.peak_allocated_bytes)} allocated) falls at **{est.peak_event}**" in text
    assert f"expected {fmt.gib(est.device_total_bytes.expected)}" in text
    assert f"{sc.spec.total_params():,} parameters" in text
    # ZeRO: the paper's formula over 8 data-parallel GPUs (the scenario has one GPU) for AMP bf16 AdamW
    zero = [t for t in _tables(at) if "model states per GPU (paper)" in t.columns][0]
    p = sc.training.precision
    k = precision.master_bytes_per_param(p) + precision.optimizer_state_bytes(Optimizer.adamw, p, [((1,), 1)])
    want = [fmt.gib(parallel.zero_model_state_bytes(sc.spec.total_params(), s, 8, k_bytes=k, weight_bytes=4,
                                                    grad_bytes=4)) for s in range(4)]
    assert list(zero["model states per GPU (paper)"]) == want
    # mixed precision: bytes per parameter straight from calc.precision
    prec = [t for t in _tables(at) if "model states / param" in t.columns][0]
    rows = {r["precision"]: r for r in prec.to_dict("records")}
    for q in Precision:
        total = (precision.weight_bytes_per_param(q) + precision.grad_bytes_per_param(q)
                 + precision.master_bytes_per_param(q) + precision.optimizer_state_bytes(Optimizer.adamw, q, [((1,), 1)]))
        assert int(rows[q.value]["model states / param"]) == total
    # FlashAttention: eager vs SDPA peaks at the current sequence length
    attn = [t for t in _tables(at) if "SDPA / Flash" in t.columns][0]
    first = attn.to_dict("records")[0]
    data = sc.model_dump(mode="json")
    data["training"]["attention"] = "eager"
    assert first["eager"] == fmt.gib(estimate(Scenario.model_validate(data)).peak_allocated_bytes)
    assert first["SDPA / Flash"] == fmt.gib(est.peak_allocated_bytes)


def test_claims_checked_against_calc():
    at = open_app("explain")
    claims = [t for t in _tables(at) if "engine's answer" in t.columns][0]
    records = claims.to_dict("records")

    class _Rows:
        def __getitem__(self, prefix: str):
            return next(r for r in records if r["claim"].startswith(prefix))

    rows = _Rows()
    zero = rows["ZeRO on 8 GPUs, 7B model, mixed-precisio"]
    for s in range(4):
        assert fmt.gb(parallel.zero_model_state_bytes(7_000_000_000, s, 8), 2) in zero["engine's answer"]
    assert "112.00 GB / 38.50 GB / 26.25 GB / 14.00 GB" in zero["engine's answer"]
    assert zero["verdict"] == "does not hold"
    assert "1,120 GB" in rows["A 70B model's mixed-precision Adam model "]["engine's answer"]
    qlora = rows["QLoRA quantizes the optimizer states to 4"]
    assert "8.0 bytes per trainable parameter" in qlora["engine's answer"]
    assert qlora["verdict"] == "does not hold"
    full = rows["A 1B-7B model fine-tunes fully on one 80 "]
    e = estimate(Scenario(model="llama-2-7b", hardware={"gpu": "a100-80gb"},
                          training={"precision": "bf16-mixed", "attention": "sdpa",
                                    "activation_checkpointing": "full"}))
    assert f"device total {fmt.gib(e.device_total_bytes.expected)}" in full["engine's answer"]
    assert full["verdict"] == ("holds" if e.fits else "does not hold")
    assert "4 bytes per parameter" in rows["Pure-bf16 AdamW keeps fp32 optimizer sta"]["engine's answer"]
    assert len(claims) >= 10
    assert set(claims["verdict"]) <= {"holds", "does not hold"}


def test_text_follows_the_sidebar():
    at = open_app("explain")
    [s for s in at.selectbox if s.key == "sc_model"][0].set_value("gpt2")
    [s for s in at.selectbox if s.key == "sc_precision"][0].set_value("bf16-mixed")
    at.run()
    assert_clean(at)
    sc = scenario(at)
    assert sc == Scenario.model_validate({**state.DEFAULT_SCENARIO.model_dump(mode="json"), "model": "gpt2",
                                          "training": {**state.DEFAULT_SCENARIO.training.model_dump(mode="json"),
                                                       "precision": "bf16-mixed"}})
    est = estimate(sc)
    text = all_text(at)
    assert "GPT-2 (124M)" in text
    assert f"the peak ({fmt.gib(est.peak_allocated_bytes)} allocated)" in text
    assert "Why master weights keep model states at 16 bytes per parameter" in text


def test_inference_and_moe_scenarios_render():
    for sc in (Scenario(model="mixtral-8x7b", hardware={"cluster": "8x-h100-sxm"}, training={"zero_stage": 3}),
               Scenario(model="llama-3.1-8b", mode="inference", hardware={"gpu": "l4"}),
               Scenario(model="qwen2.5-0.5b", hardware={"memory_bytes": 8 * 2**30}, training={"lora": {}})):
        at = open_app("explain", state.scenario_to_params(sc))
        assert scenario(at) == sc
        assert [h.value for h in at.header] == TOPICS
    assert "Mixtral 8x7B" in all_text(open_app("explain", state.scenario_to_params(
        Scenario(model="mixtral-8x7b", hardware={"gpu": "h100-sxm"}))))

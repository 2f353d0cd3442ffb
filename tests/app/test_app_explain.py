"""Explain page: one section per topic, every figure computed by calc/ for the current scenario (and
following the sidebar), the one bytes-per-parameter story shared with the Calculator, the lessons'
plots, and the articles' claims table from data/claims.yaml."""

from __future__ import annotations

import re

from calc.contract.scenario import Scenario
from calc.contract.units import GiB
from calc.evidence.claims import check_all, load_claims
from calc.memory.engine import estimate
from calc.memory.per_param import bytes_per_param
from tests.app.test_app_helpers import all_text, chart, open_app, open_folded, scenario, tables, traces
from ui import fmt, state

TOPICS = ["Where memory goes", "Bytes per parameter", "Optimizer states", "Mixed precision",
          "Activation checkpointing", "FlashAttention", "ZeRO", "Offload", "Parallelism",
          "Quantization and LoRA / QLoRA", "What to try, in order", "Worked recipes", "Model size x hardware",
          "The largest micro-batch", "Monitoring", "Troubleshooting", "Serving: the KV cache", "Common claims, checked"]
MIXED_7B = Scenario(model="llama-2-7b", hardware={"gpu": "a100-80gb"},
                    training={"precision": "bf16-mixed", "activation_checkpointing": "full"})


def _table(at, column: str):
    return next(t for t in tables(at) if column in t.columns)


def _variant(sc: Scenario, **training) -> Scenario:
    data = sc.model_dump(mode="json")
    data["training"].update(training)
    return Scenario.model_validate(data)


def test_every_topic_has_a_section_and_no_dangling_pointer():
    at = open_app("explain")
    assert [h.value for h in at.header] == TOPICS
    text = all_text(at)
    assert "see Optimizer implementation" not in text
    anchors = set(re.findall(r"\]\(#([a-z0-9-]+)\)", text))
    assert anchors and all(a in {h.proto.anchor for h in at.header} for a in anchors)


def test_numbers_are_the_engines_for_the_current_scenario():
    at = open_app("explain")
    sc = scenario(at)
    est = estimate(sc)
    text = all_text(at)
    assert f"the peak ({fmt.gib(est.peak_allocated_bytes)} allocated) falls at **{est.peak_event}**" in text
    assert f"expected {fmt.gib(est.device_total_bytes.expected)}" in text
    terms = _table(at, "formula").to_dict("records")
    assert [t["at the peak"] for t in terms] == [fmt.gib(c.bytes) for c in est.components if c.bytes]
    # FlashAttention: activations at this scenario's sequence length, eager vs SDPA
    attn = _table(at, "activations, SDPA").to_dict("records")
    row = next(r for r in attn if "(this scenario)" in r["sequence length"])
    eager = estimate(_variant(sc, attention="eager"))
    assert row["activations, eager"] == fmt.gib(max(eager.timeline.activations))
    assert row["activations, SDPA"] == fmt.gib(max(estimate(_variant(sc, attention="sdpa")).timeline.activations))
    # checkpointing: the activations column is the lesson; every row says where its peak falls
    ck = _table(at, "extra FLOPs (recompute)").to_dict("records")
    full = estimate(_variant(sc, activation_checkpointing="full", checkpoint_every=1))
    every = next(r for r in ck if r["checkpointing"] == "every layer")
    assert every["activations (largest)"] == fmt.gib(max(full.timeline.activations))
    # the phase in brackets only where the event's name does not say it ("optimizer step", not "... (optimizer)")
    place = full.peak_event if full.peak_phase in full.peak_event else f"{full.peak_event} ({full.peak_phase})"
    assert every["peak falls at"] == place
    if est.peak_phase == "optimizer":
        assert "where no activations are alive, so checkpointing cannot lower it" in text


def test_bytes_per_parameter_table_is_calc_per_param():
    at = open_app("explain", state.scenario_to_params(MIXED_7B))
    rows = {r["precision · optimizer (impl)"]: r for r in _table(at, "at the optimizer step").to_dict("records")}
    for label, training in (("bf16-mixed · adamw (foreach)", {}), ("bf16-mixed · adamw (fused)", {"optimizer_impl": "fused"}),
                            ("bf16 · adamw-8bit (foreach)", {"precision": "bf16", "optimizer": "adamw-8bit"}),
                            ("fp32 · adamw (foreach)", {"precision": "fp32"})):
        b = bytes_per_param(_variant(MIXED_7B, **training))
        r = rows[label]
        for col, field in (("weights", "weights"), ("gradients (.grad)", "gradients"),
                           ("fp32 master weights", "master_weights"), ("optimizer states", "optimizer_states"),
                           ("held (model states)", "held"), ("gradients at the step", "step_gradients"),
                           ("step scratch", "optimizer_temporaries"), ("at the optimizer step", "at_step")):
            assert r[col] == f"{getattr(b, field):,.2f}", (label, col)
    # DeepSpeed at ZeRO-0 keeps the 16-bit grads beside their fp32 copies (FP16_UnfusedOptimizer): 2 B more
    assert rows["bf16-mixed · adamw (foreach)"]["at the optimizer step"] == "24.00"
    assert rows["bf16-mixed · adamw (fused)"]["at the optimizer step"] == "18.00"
    text = all_text(at)
    assert "The leanest there is **bf16 · adamw-8bit (foreach)**" in text
    assert "Why bf16-mixed gradients are 2.00 B and then 6.00 B per parameter" in text
    assert "FP16_UnfusedOptimizer" in text
    assert "(4 + 4 + K = 8 bytes per parameter)" not in text
    fig = chart(at, "explain_bpp")
    assert traces(fig)["total at the optimizer step"]["x"][list(rows).index("bf16-mixed · adamw (foreach)")] == 24


def test_explain_and_calculator_quote_the_same_gradient_bytes_per_param():
    """bf16-mixed at ZeRO-0 (DeepSpeed) at an optimizer-step peak: the Calculator's gradient component says
    16-bit gradients and their fp32 copies at 2 + 4 B (with DeepSpeed's reason) and Explain's table says 6.00
    at the step, 2.00 through backward."""
    params = state.scenario_to_params(MIXED_7B)
    est = estimate(MIXED_7B)
    assert est.peak_phase == "optimizer"
    calc = open_folded(open_app("calculator", params))  # the term sources are filled when opened
    comps = next(df for df in tables(calc) if "Formula" in df.columns)
    grad = comps[comps["Component"] == "16-bit gradients and their fp32 copies for the optimizer step"].iloc[0]
    n = est.model.trainable_params
    assert f"{n:,} trainable params x (2 + 4) B" in grad["Formula"]
    assert "frees neither before the step" in all_text(calc)
    explain = open_app("explain", params)
    row = next(r for r in _table(explain, "at the optimizer step").to_dict("records")
               if r["precision · optimizer (impl)"] == "bf16-mixed · adamw (foreach)")
    assert float(row["gradients at the step"]) == int(grad["bytes"].replace(",", "")) / n == 6
    assert float(row["gradients (.grad)"]) == 2


def test_zero_section_names_its_hardware_and_uses_the_same_bytes_per_param():
    at = open_app("explain")  # the default scenario has one RTX 4090
    text = all_text(at)
    assert "On **8 x NVIDIA GeForce RTX 4090** (the sidebar's GPU, 8 of them: this scenario has 1" in text
    zero = _table(at, "model states per GPU").to_dict("records")
    sc = scenario(at)
    for stage, r in enumerate(zero):
        data = _variant(sc, zero_stage=stage).model_dump(mode="json")
        data["hardware"]["num_gpus"] = 8
        b = bytes_per_param(Scenario.model_validate(data))
        assert r["model states / param"] == f"{b.held:,.2f}"
        assert r["model states per GPU"] == fmt.gib(b.held * b.params)
    sweep = traces(chart(at, "explain_zero"))
    assert set(sweep) == {"ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"}
    z3 = sweep["ZeRO-3"]["y"]
    assert z3 == sorted(z3, reverse=True)  # stage 3 keeps falling with more GPUs


def test_lesson_plots_are_drawn_from_the_engine():
    at = open_app("explain", state.scenario_to_params(MIXED_7B))
    timeline = chart(at, "explain_timeline")
    assert max(sum(t["y"][i] for t in timeline["data"] if t.get("stackgroup")) for i in range(3)) > 0
    att = traces(chart(at, "explain_attention"))
    eager, sdpa = att["eager attention (S x S scores kept)"], att["SDPA / FlashAttention"]
    assert all(e >= s for e, s in zip(eager["y"], sdpa["y"], strict=True))
    i = eager["x"].index(2048)
    assert abs(sdpa["y"][i] * GiB - max(estimate(_variant(MIXED_7B, attention="sdpa")).timeline.activations)) < 1e-6 * GiB
    ck = chart(at, "explain_ckpt")["data"][0]
    assert "every layer" in ck["text"] and "none" in ck["text"]


def test_what_to_try_recipes_and_micro_batch():
    at = open_app("explain")
    text = all_text(at)
    assert any(link.proto.page == "Recommend" for link in at.get("page_link")
               if "waterfall" in link.proto.label)
    steps = _table(at, "turns on").to_dict("records")
    assert steps[0]["step"].startswith("0") and "baseline" in steps[0]["step"]
    recipes = [t.to_dict("records") for t in tables(at) if "recipe" in t.columns]
    flat = {r["recipe"]: r for rs in recipes for r in rs}
    assert flat["QLoRA r=64, NF4 base (the article's setting)"]["verdict"] == "fits"
    assert flat["full fine-tune, ZeRO-3 + optimizer offload to CPU"]["verdict"] == "does not fit (host RAM)"
    assert "max_batch_size = (total memory - static overhead)" in text
    assert "The engine's search (`calc.memory.fit`" in text


def test_claims_table_is_the_data_file_checked_against_the_engine():
    at = open_app("explain")
    assert not [t for t in tables(at) if "engine (setting)" in t.columns]  # folded until a reader opens them
    at = open_folded(at)
    shown = [r for t in tables(at) if "engine (setting)" in t.columns for r in t.to_dict("records")]
    claims = load_claims()
    assert len(shown) == len(claims)
    results = {r.claim.quote: r for r in check_all()}
    for row in shown:
        r = next(v for q, v in results.items() if fmt.plain(q) == row["original"])
        assert row["verdict"] == r.verdict == r.claim.verdict
    zero3 = next(r for r in shown if "45GB/卡" in r["original"])
    assert zero3["verdict"] == "does not hold" and "GB" in zero3["engine (setting)"]
    assert "4.2 专业级方案" in zero3["section"]


def test_text_follows_the_sidebar():
    at = open_app("explain")
    [s for s in at.selectbox if s.key == "sc_model"][0].set_value("gpt2")
    [s for s in at.selectbox if s.key == "sc_precision"][0].set_value("bf16-mixed")
    at.run()
    sc = scenario(at)
    assert sc.model == "gpt2" and sc.training.precision.value == "bf16-mixed"
    est = estimate(sc)
    text = all_text(at)
    assert "GPT-2 (124M)" in text
    assert f"the peak ({fmt.gib(est.peak_allocated_bytes)} allocated)" in text


def test_inference_and_moe_scenarios_render():
    for sc in (Scenario(model="mixtral-8x7b", hardware={"cluster": "8x-h100-sxm"}, training={"zero_stage": 3}),
               Scenario(model="llama-3.1-8b", mode="inference", hardware={"gpu": "l4"}),
               Scenario(model="qwen2.5-0.5b", hardware={"memory_bytes": 8 * 2**30}, training={"lora": {}})):
        at = open_app("explain", state.scenario_to_params(sc))
        assert scenario(at) == sc
        assert [h.value for h in at.header] == TOPICS


def test_bytes_per_parameter_table_by_zero_stage():
    """The table's ZeRO control: each stage's rows are calc.memory.per_param on 8 data-parallel GPUs."""
    at = open_app("explain", state.scenario_to_params(MIXED_7B))
    for stage in (2, 3):
        next(w for w in at.button_group if w.key == "explain_bpp_zero").set_value(stage)
        at.run()
        rows = {r["precision · optimizer (impl)"]: r for r in _table(at, "at the optimizer step").to_dict("records")}
        data = _variant(MIXED_7B, zero_stage=stage).model_dump(mode="json")
        data["hardware"]["num_gpus"] = 8
        b = bytes_per_param(Scenario.model_validate(data))
        row = rows["bf16-mixed · adamw (foreach)"]
        assert (row["held (model states)"], row["at the optimizer step"]) == (f"{b.held:,.2f}", f"{b.at_step:,.2f}")
        assert f"per GPU under ZeRO-{stage} over 8 data-parallel GPUs" in all_text(at)
    assert rows["bf16-mixed · adamw (foreach)"]["held (model states)"] == "2.00"  # 16 B / 8 at stage 3


def test_expert_parallel_table_is_the_engines_for_a_moe_model():
    sc = Scenario(model="mixtral-8x7b", hardware={"cluster": "8x-h100-sxm"}, training={"zero_stage": 3})
    at = open_app("explain", state.scenario_to_params(sc))
    table = _table(at, "experts split over")
    assert list(table["experts split over"]) == ["1", "2", "4", "8"]
    for ep, shown in zip((1, 2, 4, 8), table["peak"], strict=True):
        expected = estimate(_variant(sc, sharding="fsdp2", expert_parallel=ep)).peak_allocated_bytes
        assert shown == fmt.gib(expected)
    dense = open_app("explain", state.scenario_to_params(MIXED_7B))
    assert not [t for t in tables(dense) if "experts split over" in t.columns]

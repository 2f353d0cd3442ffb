"""Calculator page (app.py): default render, every sidebar widget changed, the numbers on screen equal
calc.memory.engine.estimate for the scenario the widgets describe, bad input shows a message (never a
traceback), and the URL reproduces the scenario."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calc.contract.presets import model_presets
from calc.contract.scenario import Precision, Scenario
from calc.contract.units import GiB
from calc.memory.engine import estimate
from calc.memory.host import host_ram_words
from calc.memory.result import CATEGORIES
from calc.memory.verdict import gib_short, headline
from tests.app.test_app_helpers import all_text, assert_clean, chart, go, metric, open_app, scenario, tables, traces
from ui import fmt, state
from ui import plots as charts


def _update(sc: Scenario, **kw: Any) -> Scenario:
    """`sc` with dotted-path fields replaced, validated like the app validates."""
    data = sc.model_dump(mode="json")
    for path, v in kw.items():
        node = data
        parts = path.split("__")
        for p in parts[:-1]:
            node = node[p] if node.get(p) is not None else node.setdefault(p, {})
        node[parts[-1]] = v
    return Scenario.model_validate(data)


def check_numbers(at, expected: Scenario) -> None:
    """Everything the Calculator shows equals what calc/ returns for `expected`."""
    assert_clean(at)
    assert scenario(at) == expected
    est = estimate(expected)
    dt = est.device_total_bytes
    assert metric(at, "Peak allocated (GiB)") == fmt.gib(est.peak_allocated_bytes)
    assert metric(at, "Device total (GiB)") == fmt.gib(dt.expected)
    assert metric(at, "GPU memory (GiB)") == fmt.gib(est.gpu_memory_bytes)
    assert metric(at, "Headroom (GiB)") == fmt.gib(est.headroom_bytes)
    text = all_text(at)
    if est.gpu_memory_bytes is not None:  # the engine's one verdict, in its own words
        assert f"**{headline(est.verdict)}**" in text
    assert f"The peak falls at **{est.peak_event}" in text  # with its phase when the event does not name it
    # the stacked bar: one trace per segment, x in GiB, exact bytes in the hover data
    bar = traces(chart(at, "calc_breakdown"))
    segs = charts.segments(est)
    assert sum(n for _, n in segs) == dt.expected
    for key, n in segs:
        t = bar[charts.SHORT_LABELS[key]]
        assert t["x"][0] == pytest.approx(n / GiB, rel=1e-12, abs=1e-12)
        assert t["customdata"][0] == f"{n:,}"
    # the timeline: stacked areas by category, the peak marked at the engine's peak index
    tl = traces(chart(at, "calc_timeline"))
    for c in CATEGORIES:
        assert tl[charts.SHORT_LABELS[c]]["y"] == pytest.approx([v / GiB for v in getattr(est.timeline, c)])
    assert tl["Peak"]["x"] == [est.timeline.peak_index]
    assert tl["Peak"]["y"][0] == pytest.approx(est.peak_allocated_bytes / GiB)
    # the components table carries exact bytes
    table = next(t for t in tables(at) if "Formula" in t.columns)
    got = list(zip(table["Component"], table["bytes"], table["Formula"], strict=True))
    assert got[:len(est.components)] == [(c.label, f"{c.bytes:,}", c.formula) for c in est.components]
    assert dict((a, b) for a, b, _ in got)["Device total (expected)"] == f"{dt.expected:,}"
    assert dict((a, b) for a, b, _ in got)["Peak allocated"] == f"{est.peak_allocated_bytes:,}"
    # the URL holds the scenario
    assert dict(at.query_params) == state.scenario_to_params(expected)


def _largest(sc: Scenario, field: str) -> int:
    from ui.compute import largest_fitting

    return largest_fitting(sc.model_dump_json(), field)


def test_default_render_matches_engine():
    at = open_app()
    assert at.title[0].value == "GPU memory calculator"
    check_numbers(at, state.DEFAULT_SCENARIO)


def test_folded_sections_are_filled_when_opened():
    """The term sources and the scenario JSON are sent only once their expander is opened (a rerun)."""
    at = open_app()
    sc = scenario(at)
    assert not at.code and "Source:" not in all_text(at)
    at.session_state["calc_sources"] = True
    at.session_state["calc_json"] = True
    at.run()
    assert_clean(at)
    assert json.loads(at.code[0].value) == json.loads(sc.model_dump_json(exclude_defaults=True))
    est = estimate(sc)
    assert all(f"Source: {c.source}" in all_text(at) for c in est.components)


def test_largest_batch_and_sequence_are_the_engine_boundary():
    sc = Scenario(model="llama-3.2-1b", hardware={"gpu": "a100-80gb"})
    at = open_app(params=state.scenario_to_params(sc))
    check_numbers(at, sc)
    mbs, seq = _largest(sc, "micro_batch_size"), _largest(sc, "seq_len")
    assert metric(at, "Largest micro-batch that fits") == f"{mbs:,}"
    assert metric(at, "Longest sequence that fits (tokens)") == f"{seq:,}"
    assert estimate(_update(sc, training__micro_batch_size=mbs)).verdict.limit("gpu").fits
    assert not estimate(_update(sc, training__micro_batch_size=mbs + 1)).verdict.limit("gpu").fits
    assert estimate(_update(sc, training__seq_len=seq)).verdict.limit("gpu").fits
    assert not estimate(_update(sc, training__seq_len=seq + 1)).verdict.limit("gpu").fits


# (widget key, value, scenario field changes or None when the widget only reveals others)
STEPS: list[tuple[str, Any, dict[str, Any] | None]] = [
    ("sc_model", "llama-3.2-1b", {"model": "llama-3.2-1b"}),
    ("sc_mode", "inference", {"mode": "inference", "training__precision": "bf16"}),  # 16-bit weights proposed
    ("sc_mode", "train", {"mode": "train"}),
    ("sc_precision", "amp-bf16", {"training__precision": "amp-bf16"}),
    ("sc_hw_kind", "cluster", {"hardware": {"cluster": "8x-a100-80gb"}}),
    ("sc_cluster", "4x-rtx-4090", {"hardware": {"cluster": "4x-rtx-4090"}}),
    ("sc_hw_kind", "custom", {"hardware": {"memory_bytes": 24 * GiB, "num_gpus": 1}}),
    ("sc_mem_gib", 40.0, {"hardware": {"memory_bytes": 40 * GiB, "num_gpus": 1}}),
    ("sc_num_gpus", 2, {"hardware": {"memory_bytes": 40 * GiB, "num_gpus": 2}}),
    ("sc_hw_kind", "gpu", {"hardware": {"gpu": "rtx-4090", "num_gpus": 2}}),
    ("sc_gpu", "a100-80gb", {"hardware": {"gpu": "a100-80gb", "num_gpus": 2}}),
    ("sc_num_gpus", 4, {"hardware": {"gpu": "a100-80gb", "num_gpus": 4}}),
    ("sc_mbs", 2, {"training__micro_batch_size": 2}),
    ("sc_seq", 1024, {"training__seq_len": 1024}),
    ("sc_ga", 4, {"training__gradient_accumulation_steps": 4}),
    ("sc_precision", "bf16-mixed", {"training__precision": "bf16-mixed"}),
    ("sc_optimizer", "sgd-momentum", {"training__optimizer": "sgd-momentum"}),
    ("sc_impl", "fused", {"training__optimizer_impl": "fused"}),
    ("sc_optimizer", "adamw", {"training__optimizer": "adamw"}),
    ("sc_attention", "eager", {"training__attention": "eager"}),
    ("sc_ckpt", "full", {"training__activation_checkpointing": "full"}),
    ("sc_every", 2, {"training__checkpoint_every": 2}),
    ("sc_ckpt", "selective", {"training__activation_checkpointing": "selective"}),
    ("sc_pp", 2, {"training__pipeline_parallel": 2}),
    ("sc_pp", 1, {"training__pipeline_parallel": 1}),
    ("sc_zero", 2, {"training__zero_stage": 2}),
    ("sc_sharding", "fsdp2", {"training__sharding": "fsdp2"}),
    ("sc_sharding", "deepspeed", {"training__sharding": "deepspeed"}),
    ("sc_off_opt", "cpu", {"training__offload_optimizer": "cpu"}),
    ("sc_zero", 3, {"training__zero_stage": 3}),
    ("sc_off_par", "nvme", {"training__offload_params": "nvme"}),
    ("sc_tp", 2, {"training__tensor_parallel": 2}),
    ("sc_sp", True, {"training__sequence_parallel": True}),
    ("sc_lora", True, {"training__lora": {}}),
    ("sc_lora_rank", 8, {"training__lora__rank": 8}),
    ("sc_lora_targets", "attention", {"training__lora__targets": "attention"}),
    ("sc_lora_base", "bf16", None),
    ("sc_ram_gib", 512.0, {"hardware__cpu_ram_bytes": 512 * GiB}),
    ("sc_nvme_gib", 2048.0, {"hardware__nvme_bytes": 2048 * GiB}),
]


def _widget(at, key):
    for kind in ("selectbox", "number_input", "radio", "checkbox", "toggle", "text_area"):
        found = [w for w in getattr(at, kind) if w.key == key]
        if found:
            return found[0]
    raise KeyError(key)


def test_every_sidebar_widget_changes_the_numbers():
    at = open_app()
    expected = state.DEFAULT_SCENARIO
    for key, value, change in STEPS:
        _widget(at, key).set_value(value)
        at.run()
        if change:
            data = expected.model_dump(mode="json")
            for path, v in change.items():
                if path in ("model", "mode"):
                    data[path] = v
                elif path == "hardware":
                    data["hardware"] = v
                else:
                    node = data
                    parts = path.split("__")
                    for p in parts[:-1]:
                        node = node[p] if node.get(p) is not None else node.setdefault(p, {})
                    node[parts[-1]] = v
            expected = Scenario.model_validate(data)
        check_numbers(at, expected)


def test_quantized_lora_needs_amp_then_fits():
    at = open_app()
    _widget(at, "sc_precision").set_value("bf16-mixed")
    _widget(at, "sc_lora").set_value(True)
    at.run()
    _widget(at, "sc_lora_base").set_value("nf4")
    at.run()
    assert_clean(at)
    errs = [e.value for e in at.sidebar.error]
    assert any("quantized LoRA base weights" in e for e in errs), errs
    assert any("The scenario is not valid" in e.value for e in at.main.error)
    assert not at.get("plotly_chart")  # nothing computed for an impossible scenario
    _widget(at, "sc_precision").set_value("amp-bf16")
    at.run()
    expected = _update(state.DEFAULT_SCENARIO, training__lora={"base_weights": "nf4"})
    check_numbers(at, expected)


def test_impossible_combination_is_shown_next_to_the_widget():
    at = open_app()
    _widget(at, "sc_off_opt").set_value("cpu")
    at.run()
    assert_clean(at)
    # the message sits in the "Memory savers" expander, right under the offload widgets
    savers = [e for e in at.sidebar.expander if e.label == "Memory savers"][0]
    assert any("offload_optimizer needs zero_stage 1, 2 or 3" in e.value for e in savers.error)
    assert scenario(at) == state.DEFAULT_SCENARIO  # the last valid scenario is kept
    _widget(at, "sc_zero").set_value(1)
    at.run()
    check_numbers(at, _update(state.DEFAULT_SCENARIO, training__zero_stage=1, training__offload_optimizer="cpu"))


def test_pipeline_with_zero3_is_refused_next_to_the_widget():
    at = open_app(params=state.scenario_to_params(Scenario(model="llama-2-7b", hardware={"cluster": "8x-a100-80gb"},
                                                             training={"zero_stage": 3})))
    _widget(at, "sc_pp").set_value(2)
    at.run()
    assert_clean(at)
    par = [e for e in at.sidebar.expander if e.label == "Parallelism"][0]
    assert any("pipeline_parallel" in e.value for e in par.error), [e.value for e in at.sidebar.error]


def test_offload_needs_are_checked_against_the_host():
    sc = Scenario(model="llama-2-70b", hardware={"cluster": "8x-a100-80gb"},
                  training={"precision": "bf16-mixed", "zero_stage": 3, "offload_optimizer": "cpu",
                            "offload_params": "cpu", "activation_checkpointing": "full"})
    at = open_app(params=state.scenario_to_params(sc))
    check_numbers(at, sc)
    est = estimate(sc)
    host = sc.resolved_hardware().cpu_ram_bytes
    assert metric(at, "CPU RAM needed per node (GiB)") == fmt.gib(est.cpu_ram_bytes)
    verdict = "fits" if est.cpu_ram_bytes <= host else "does not fit"
    assert f"Host RAM per node: {fmt.gib(host)}; offload needs {fmt.gib(est.cpu_ram_bytes)} ({verdict})" in all_text(at)
    # the headline agrees with the Offload box: the GPU has room, the host does not (issue 8)
    assert est.verdict.fits is False and est.verdict.limit("gpu").fits
    assert [e for e in at.error if "does not fit: offload needs" in e.value and "host RAM per node" in e.value]
    _widget(at, "sc_ram_gib").set_value(4096.0)
    at.run()
    sc2 = _update(sc, hardware__cpu_ram_bytes=4096 * GiB)
    check_numbers(at, sc2)
    assert f"Host RAM per node: {fmt.gib(4096 * GiB)}; offload needs {fmt.gib(est.cpu_ram_bytes)} (fits)" in all_text(at)


def test_tensor_parallel_must_divide_the_gpus():
    at = open_app()
    _widget(at, "sc_tp").set_value(2)
    at.run()
    assert_clean(at)
    par = [e for e in at.sidebar.expander if e.label == "Parallelism"][0]
    assert any("num_gpus=1 is not a multiple" in e.value for e in par.error)


def _config_text(preset: str) -> str:
    return json.dumps(model_presets()[preset].config)


def test_pasted_config_json():
    at = open_app()
    _widget(at, "sc_model_source").set_value("config")
    at.run()
    assert_clean(at)
    assert any("paste a Hugging Face config.json" in e.value for e in at.sidebar.error)
    text = _config_text("qwen2.5-0.5b")
    _widget(at, "sc_config_text").set_value(text)
    at.run()
    expected = _update(state.DEFAULT_SCENARIO, model=json.loads(text))
    check_numbers(at, expected)
    assert "config" in at.query_params


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "llama", "hidden_size": ', "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"model_type": "bert", "hidden_size": 768}', "bert"),
    ('{"model_type": "llama", "hidden_size": -5}', "hidden_size"),
])
def test_malformed_config_json_names_the_problem(text, message):
    at = open_app()
    _widget(at, "sc_model_source").set_value("config")
    at.run()
    _widget(at, "sc_config_text").set_value(text)
    at.run()
    assert_clean(at)
    model_box = [e for e in at.sidebar.expander if e.label == "Model"][0]
    errs = [e.value for e in model_box.error]
    assert any(message in e for e in errs), errs


def test_uploaded_config_json_and_a_huge_upload():
    at = open_app()
    _widget(at, "sc_model_source").set_value("config")
    at.run()
    up = [w for w in at.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("config.json", _config_text("gpt2").encode(), "application/json"))
    at.run()
    # GPT-2's position table holds 1,024 tokens: the default 2,048 is brought down to it, and the page says so
    check_numbers(at, _update(state.DEFAULT_SCENARIO, model=json.loads(_config_text("gpt2")), training__seq_len=1024))
    assert any("at most 1,024 tokens per sequence" in c.value for c in at.sidebar.caption)
    at2 = open_app()
    _widget(at2, "sc_model_source").set_value("config")
    at2.run()
    up = [w for w in at2.sidebar.get("file_uploader") if w.key == "sc_config_file"][0]
    up.set_value(("huge.json", b"{" + b" " * (3 * 2**20) + b"}", "application/json"))
    at2.run()
    assert_clean(at2)
    assert any("the limit is 1 MiB" in e.value for e in at2.sidebar.error)


def test_a_link_reproduces_the_scenario():
    sc = Scenario(model="mistral-7b", hardware={"cluster": "8x-h100-sxm"},
                  training={"precision": "bf16-mixed", "zero_stage": 3, "offload_params": "cpu",
                            "activation_checkpointing": "full", "checkpoint_every": 4, "micro_batch_size": 3,
                            "lora": {"rank": 32}})
    at = open_app(params=state.scenario_to_params(sc))
    check_numbers(at, sc)
    # widgets show the linked scenario
    assert _widget(at, "sc_model").value == "mistral-7b"
    assert _widget(at, "sc_zero").value == 3
    assert _widget(at, "sc_lora_rank").value == 32


def test_a_bad_link_warns_and_falls_back():
    at = open_app(params={"model": "llama-2-7b", "zero": "9"})
    assert any("zero" in w.value and "not valid" in w.value for w in at.warning)
    check_numbers(at, state.DEFAULT_SCENARIO)


def test_scenario_survives_page_switches():
    at = open_app()
    _widget(at, "sc_model").set_value("qwen2.5-7b")
    _widget(at, "sc_zero").set_value(1)
    at.run()
    expected = _update(state.DEFAULT_SCENARIO, model="qwen2.5-7b", training__zero_stage=1)
    for page in ("compare", "explain", "export", "validation", "calculator"):
        go(at, page)
        assert scenario(at) == expected
        assert _widget(at, "sc_model").value == "qwen2.5-7b"
        assert _widget(at, "sc_zero").value == 1
        assert dict(at.query_params).items() >= state.scenario_to_params(expected).items()
    check_numbers(at, expected)


def test_7b_zero2_offload_on_the_4090_workstation_does_not_fit_its_64_gib_of_host_ram():
    sc = Scenario(model="llama-2-7b", hardware={"cluster": "1x-rtx-4090"},
                  training={"precision": "bf16-mixed", "zero_stage": 2, "offload_optimizer": "cpu",
                            "activation_checkpointing": "full"})
    at = open_app(params=state.scenario_to_params(sc))
    check_numbers(at, sc)
    v = estimate(sc).verdict
    assert v.fits is False and [lim.resource for lim in v.limits] == ["gpu", "host_ram"]
    assert v.reasons == [f"offload needs {gib_short(v.limit('host_ram').needed_bytes)} of host RAM per node; "
                         "this node has 64 GiB"]
    assert not at.success or all("fits with" not in s.value for s in at.success)


def test_unknown_host_ram_is_asked_for_not_assumed():
    sc = Scenario(model="llama-2-7b", hardware={"gpu": "rtx-4090"},
                  training={"precision": "bf16-mixed", "zero_stage": 2, "offload_optimizer": "cpu",
                            "activation_checkpointing": "full"})
    at = open_app(params=state.scenario_to_params(sc))
    check_numbers(at, sc)
    assert estimate(sc).verdict.fits is None
    assert any("host RAM per node; this node's host RAM is unknown (set it under Hardware)" in w.value
               for w in at.warning)
    # the need is shown part by part, each with its source, and the node's sentence reads the same figures
    h = estimate(sc).host_memory
    text = all_text(at)
    assert all(p.label in text and p.source in text and fmt.gib(p.allocated_bytes) in text for p in h.parts)
    assert str(host_ram_words(h)) in text


def test_global_batch_travels_in_the_link_and_the_sidebar():
    sc = Scenario(model="llama-2-7b", hardware={"gpu": "rtx-4090"}, training={"global_batch_tokens": 2**20})
    params = state.scenario_to_params(sc)
    assert params["gbt"] == str(2**20)
    at = open_app(params=params)
    assert at.number_input(key="sc_gbt").value == 2**20 and scenario(at) == sc


def test_switching_to_inference_proposes_16_bit_weights():
    sc = Scenario(model="phi-3-mini", hardware={"gpu": "rtx-4090"})  # AMP bf16: fp32 weights for training
    at = open_app(params=state.scenario_to_params(sc))
    [r for r in at.sidebar.radio if r.key == "sc_mode"][0].set_value("inference")
    at.run()
    want = _update(sc, mode="inference", training__precision="bf16")
    check_numbers(at, want)
    assert estimate(want).verdict.fits  # 3.8 B parameters in bf16 fit a 24 GB card
    assert Precision.amp_fp16.for_inference(gpu_bf16=True) == Precision.fp16_mixed
    assert Precision.fp32.for_inference(gpu_bf16=False) == Precision.fp16_mixed
    assert Precision.bf16_mixed.for_inference(gpu_bf16=True) == Precision.bf16_mixed


def test_zero0_mixed_precision_runs_under_deepspeed_or_plain_pytorch():
    """At ZeRO 0 a *-mixed model is DeepSpeed's (16-bit grads kept through the step) or a plain PyTorch loop's:
    the sidebar offers both, and the engine's 2 B/param difference reaches the page."""
    at = open_app("calculator", {"model": "llama-3.2-1b", "gpu": "a100-80gb", "prec": "bf16-mixed"})
    box = _widget(at, "sc_runner0")
    assert box.value == "deepspeed" and scenario(at).training.sharding == "deepspeed"
    ds_peak = estimate(scenario(at)).peak_allocated_bytes
    box.set_value("torch").run()
    assert_clean(at)
    sc = scenario(at)
    assert sc.training.sharding == "torch" and estimate(sc).peak_allocated_bytes < ds_peak
    assert at.query_params.get("shard") in ("torch", ["torch"])  # a shared link keeps it
    _widget(at, "sc_zero").set_value(2).run()  # ZeRO 2: the box is gone, the scenario is DeepSpeed's again
    assert not [w for w in at.selectbox if w.key == "sc_runner0"] and scenario(at).training.sharding == "deepspeed"


def test_expert_parallel_control_only_for_moe_models():
    at = open_app()
    assert not [w for w in at.number_input if w.key == "sc_ep"]  # the default model is dense
    steps = (("sc_model", "qwen3-30b-a3b"), ("sc_num_gpus", 8), ("sc_zero", 3), ("sc_sharding", "fsdp2"),
             ("sc_ep", 4))
    for key, value in steps:
        _widget(at, key).set_value(value)
        at.run()
    expected = _update(state.DEFAULT_SCENARIO, model="qwen3-30b-a3b", hardware__num_gpus=8,
                       training__zero_stage=3, training__sharding="fsdp2", training__expert_parallel=4)
    check_numbers(at, expected)
    assert at.query_params.get("ep") == "4"
    _widget(at, "sc_ep").set_value(3)  # 3 does not divide the 128 experts: said next to the control
    at.run()
    par = [e for e in at.sidebar.expander if e.label == "Parallelism"][0]
    assert any("must divide the 128 experts" in e.value for e in par.error)


def test_the_default_sequence_length_follows_the_model_and_a_chosen_one_stays():
    """GPT-2's learned position table holds 1,024 tokens: picked alone, it takes 1,024 and the section says why;
    back on a RoPE model the default 2,048 returns; a length the user chose survives a change of model."""
    at = open_app(params=state.scenario_to_params(Scenario(model="gpt2", hardware={"gpu": "rtx-4090"})))
    assert scenario(at).training.seq_len == 1024 and _widget(at, "sc_seq").value == 1024
    assert any("at most 1,024 tokens per sequence" in c.value for c in at.sidebar.caption)
    _widget(at, "sc_model").set_value("llama-2-7b")
    at.run()
    assert scenario(at).training.seq_len == 2048
    _widget(at, "sc_seq").set_value(512)
    at.run()
    _widget(at, "sc_model").set_value("gpt2")
    at.run()
    assert scenario(at).training.seq_len == 512 and not any("at most" in c.value for c in at.sidebar.caption)
    assert _widget(at, "sc_seq").max == 1024  # the box takes no longer sequence for this model

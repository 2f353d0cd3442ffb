"""calc.recommend: every candidate fits and the list is sorted by speed; the pruned search finds the
same winner as brute force; method changes only when allowed and needed; the model x hardware table and
the waterfall have the expected shapes; the CLI's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calc.contract.scenario import Attention, Offload, Scenario
from calc.memory.engine import estimate
from calc.recommend import (
    DEFAULT_SAFETY_MARGIN,
    Candidate,
    RecommendRequest,
    enumerate_combos,
    methods_for,
    optimization_waterfall,
    recommend,
    recommendation_table,
)
from calc.recommend.search import new_search, search_combos
from tests.positions import within_positions

ROOT = Path(__file__).resolve().parents[3]


def sc(model: str, hw: str, **training) -> Scenario:
    return Scenario(model=model, hardware={"cluster": hw}, training={"seq_len": within_positions(model, 2048), **training})


def check_fits(c: Candidate, usable: int) -> None:
    est = estimate(c.scenario)  # recomputed from the candidate's own scenario
    assert est.device_total_bytes.expected == c.device_total_expected_bytes
    assert c.device_total_expected_bytes <= usable
    assert usable <= est.gpu_memory_bytes


@pytest.fixture(scope="module")
def rec_8b():
    req = RecommendRequest(scenario=sc("llama-3.1-8b", "8x-a100-80gb"), global_batch_tokens=2**20, max_candidates=8)
    return req, recommend(req)


def test_candidates_fit_and_are_sorted(rec_8b):
    req, rec = rec_8b
    assert [g.group for g in rec.groups] == ["full", "adapters"]  # a full fine-tuning scenario gets both
    assert rec.usable_bytes == int(rec.gpu_memory_bytes * (1 - DEFAULT_SAFETY_MARGIN))
    for group in ("full", "adapters"):
        cands = [c for c in rec.candidates if c.group == group]
        assert 1 <= len(cands) <= 8
        speeds = [c.tokens_per_s_per_gpu for c in cands]
        assert speeds == sorted(speeds, reverse=True)
        assert [c.rank for c in cands] == list(range(1, len(cands) + 1))
        for c in cands:
            check_fits(c, rec.usable_bytes)
            assert c.verdict == estimate(c.scenario).verdict and c.verdict.fits
            assert c.method_change == (group == "adapters")  # the scenario asked for full fine-tuning
            assert (c.scenario.training.lora is not None) == (group == "adapters")
            assert c.scenario.training.attention == Attention.sdpa  # eager is dominated


def test_global_batch_is_reached(rec_8b):
    _, rec = rec_8b
    assert rec.target_global_batch_sequences == 2**20 // 2048
    for c in rec.candidates:
        t = c.scenario.training
        assert t.micro_batch_size * t.gradient_accumulation_steps * c.scenario.data_parallel == 512
        assert c.global_batch_tokens == 2**20


def test_explanation_names_the_winner_and_an_alternative(rec_8b):
    _, rec = rec_8b
    e = rec.groups[0].explanation
    assert e.startswith("ZeRO-") or e.startswith("no ZeRO")
    assert "fastest configuration that fits" in e and "tokens/s per GPU" in e
    assert "up to" in e or "would fit too" in e  # a faster one that does not fit, or a slower one that does
    assert "%" not in rec.explanation or "x faster" in rec.explanation or " % faster" in rec.explanation


def test_search_prunes_most_of_the_space(rec_8b):
    _, rec = rec_8b
    st = rec.stats
    assert st.pruned_dominated > 0 and st.pruned_bound > 0
    assert st.memory_estimates < st.combinations / 4


def test_branch_and_bound_matches_brute_force():
    """Exhaustive: every combination at every micro-batch split; the pruned search must find the same
    fastest fitting speed."""
    base = sc("qwen2.5-1.5b", "4x-rtx-4090")
    req = RecommendRequest(scenario=base, global_batch_size=64, max_candidates=3)
    s = new_search(req)
    best = 0.0
    combos = enumerate_combos(base, methods_for(base, "full", widen=False))
    for c in combos:
        per, mbs = s.split(c)
        for mb in mbs:
            if s.fit(c, mb, per // mb).ok:
                best = max(best, s.speed(c, mb, per).tokens_per_s)
    top = search_combos(new_search(req), combos, 1)
    assert top and top[0].raw.tokens_per_s == pytest.approx(best, rel=1e-12)


def test_no_nvme_when_cpu_offload_fits_and_no_nvme_below_zero3():
    rec = recommend(RecommendRequest(scenario=sc("llama-3.1-8b", "1x-a100-80gb"), global_batch_tokens=2**19,
                                     max_candidates=20))
    assert rec.candidates
    for c in rec.candidates:
        t = c.scenario.training
        if t.offload_optimizer == Offload.nvme:
            assert t.zero_stage == 3


def test_method_change_only_when_allowed_and_needed():
    # a 3 GiB card: even ZeRO-3 with everything offloaded to NVMe leaves too much on the GPU
    tiny = Scenario.model_validate({"model": "llama-3.1-70b", "hardware": {"gpu": "rtx-4090", "memory_bytes": 3 * 2**30}})
    strict = recommend(RecommendRequest(scenario=tiny, global_batch_size=8, max_candidates=3))
    assert strict.candidates == [] and strict.explanation.startswith("nothing fits")
    assert any("allow_method_change" in n for n in strict.notes)
    # where the training method as given fits, allowing a change does not switch to one
    fits = sc("llama-3.2-1b", "1x-a100-80gb")
    loose = recommend(RecommendRequest(scenario=fits, global_batch_size=8, max_candidates=3, allow_method_change=True))
    assert loose.candidates and not loose.method_change
    for c in loose.candidates:
        assert c.method_change == (c.group == "adapters")
        check_fits(c, loose.usable_bytes)


def test_safety_margin_is_respected():
    base = sc("llama-3.1-8b", "1x-a100-80gb")
    tight = recommend(RecommendRequest(scenario=base, global_batch_size=16, safety_margin=0.3, max_candidates=5))
    assert tight.usable_bytes == int(tight.gpu_memory_bytes * 0.7)
    for c in tight.candidates:
        assert c.device_total_expected_bytes <= tight.usable_bytes


def test_inference_recommendation():
    base = Scenario(model="llama-3.1-8b", hardware={"cluster": "1x-rtx-4090"}, mode="inference",
                    training={"precision": "bf16", "seq_len": 1024})
    rec = recommend(RecommendRequest(scenario=base, max_candidates=3))
    for c in rec.candidates:
        check_fits(c, rec.usable_bytes)


def test_request_validation():
    with pytest.raises(ValueError, match="not both"):
        RecommendRequest(scenario=sc("gpt2", "1x-rtx-4090"), global_batch_size=8, global_batch_tokens=8192)


# ---- table --------------------------------------------------------------------------------------

def test_table_shapes_and_cells_come_from_the_search():
    models, hw = ["llama-3.2-1b", "llama-3.1-405b"], ["1x-rtx-4090", "8x-h100-sxm"]
    table = recommendation_table(models, hw)
    assert table.models == models and table.hardware == hw
    assert len(table.cells) == 2 and all(len(r) == 2 for r in table.cells)
    small_4090, big_4090 = table.cells[0][0], table.cells[1][0]
    assert small_4090.status == "fits" and small_4090.tokens_per_s_per_gpu > 0
    assert big_4090.status == "nothing-fits" and "QLoRA" in big_4090.note
    # 405B on one 8x H100 node fits only as QLoRA split by TP 8, which the Trainer + DeepSpeed stack does not train
    # (data/stack_support.yaml: QLoRA with AutoTP stops in DeepSpeed's _create_param_mapping), so nothing is offered
    big_h100 = table.cells[1][1]
    assert big_h100.status == "nothing-fits"
    for row in table.cells:
        for cell in row:
            if cell.scenario is not None:
                assert estimate(cell.scenario).device_total_bytes.expected <= cell.usable_bytes
    md = table.to_markdown()
    assert md.count("\n|") >= 3 and "1x-rtx-4090" in md


def test_table_reports_method_change_cells():
    # 405B on one A100: full fine-tuning needs ~6.5 TB of offload (the node has 3.84 TB of NVMe)
    table = recommendation_table(["llama-3.1-405b"], ["1x-a100-80gb"])
    assert table.cells[0][0].status == "nothing-fits"


def test_method_change_when_the_host_cannot_hold_the_offload():
    # 8B on a 12 GiB card with 16 GiB RAM and 100 GB NVMe: offloading 128 GB of states is impossible,
    # QLoRA fits on the GPU
    base = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {
        "gpu": "rtx-4090", "memory_bytes": 12 * 2**30, "cpu_ram_bytes": 16 * 2**30, "nvme_bytes": 100 * 10**9},
        "training": {"seq_len": 1024}})
    strict = recommend(RecommendRequest(scenario=base, global_batch_size=4, max_candidates=3))
    assert [c.group for c in strict.candidates] == ["adapters"] * len(strict.candidates) and strict.candidates
    assert strict.method_change and "host RAM" in strict.groups[0].explanation
    loose = recommend(RecommendRequest(scenario=base, global_batch_size=4, max_candidates=3, allow_method_change=True))
    assert loose.method_change and loose.candidates
    assert all(c.method_change for c in loose.candidates)


# ---- waterfall ----------------------------------------------------------------------------------

def test_waterfall_order_and_effects():
    steps = optimization_waterfall(sc("llama-3.1-70b", "8x-a100-80gb"))
    names = [s.name for s in steps]
    assert names == ["baseline", "mixed precision", "FlashAttention / SDPA", "activation checkpointing", "ZeRO-1",
                     "ZeRO-2", "ZeRO-3", "optimizer offload", "parameter offload", "8-bit optimizer", "LoRA", "QLoRA"]
    by = {s.name: s for s in steps}
    assert by["baseline"].scenario.training.precision.value == "fp32"
    # DeepSpeed's ZeRO-1 with the exported overlap_comm already keeps only the rank's gradient partition
    # (measured), so ZeRO-2 saves nothing more on top of it
    assert by["ZeRO-3"].device_total_expected_bytes < by["ZeRO-2"].device_total_expected_bytes \
        <= by["ZeRO-1"].device_total_expected_bytes < by["activation checkpointing"].device_total_expected_bytes
    assert by["optimizer offload"].device_total_expected_bytes < by["ZeRO-3"].device_total_expected_bytes
    assert by["parameter offload"].device_total_expected_bytes < by["optimizer offload"].device_total_expected_bytes
    assert by["optimizer offload"].tokens_per_s_per_gpu < by["ZeRO-3"].tokens_per_s_per_gpu
    assert by["LoRA"].scenario.training.offload_optimizer == Offload.none
    assert [s.method_change for s in steps][-3:] == [True, True, True] and not any(s.method_change for s in steps[:-3])
    ram = steps[0].scenario.resolved_hardware().cpu_ram_bytes
    for s in steps:
        est = estimate(s.scenario)
        assert s.verdict == est.verdict and s.fits == est.verdict.fits  # the one verdict, no margin of its own
        gpu_ok = s.device_total_expected_bytes <= est.gpu_memory_bytes
        assert s.fits == (gpu_ok and s.cpu_ram_bytes <= ram)
        assert s.tight == (bool(s.fits) and s.device_total_expected_bytes > est.gpu_memory_bytes
                           * (1 - DEFAULT_SAFETY_MARGIN))
        assert s.step == steps.index(s)
    # 70B's fp32 master + Adam states + fp32 grads (16 B/param) exceed the node's 1 TiB of host RAM
    assert by["optimizer offload"].cpu_ram_bytes > ram and by["optimizer offload"].fits is False


def test_waterfall_on_one_gpu_skips_zero_steps():
    steps = optimization_waterfall(sc("llama-3.1-8b", "1x-rtx-4090"))
    names = [s.name for s in steps]
    assert "ZeRO-1" not in names and "optimizer offload" in names
    off = next(s for s in steps if s.name == "optimizer offload")
    assert off.scenario.training.zero_stage == 2


# ---- CLI ----------------------------------------------------------------------------------------

def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calc", *args], capture_output=True, text=True, cwd=ROOT,
                          input=stdin, timeout=120)


def test_cli_recommend_table_and_json(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"model": "llama-3.2-1b", "hardware": {"cluster": "8x-a100-80gb"},
                             "training": {"micro_batch_size": 4, "gradient_accumulation_steps": 2,
                                          "global_batch_tokens": 4 * 2 * 8 * 2048}}))
    r = run_cli("recommend", str(f), "--top", "3")
    assert r.returncode == 0, r.stderr
    assert "tok/s/GPU" in r.stdout and "fastest configuration that fits" in r.stdout
    r = run_cli("recommend", str(f), "--format", "json", "--top", "2")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [c["group"] for c in data["candidates"]] == ["full", "full", "adapters", "adapters"]
    assert data["target_global_batch_sequences"] == 4 * 2 * 8
    for c in data["candidates"]:
        assert c["verdict"]["fits"] is True and c["verdict"]["limits"][0]["resource"] == "gpu"


def test_cli_recommend_request_file(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"scenario": {"model": "llama-3.2-1b", "hardware": {"cluster": "1x-rtx-4090"}},
                             "global_batch_size": 32, "safety_margin": 0.2}))
    r = run_cli("recommend", str(f), "--format", "json", "--top", "1")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["usable_bytes"] == int(data["gpu_memory_bytes"] * 0.8)


@pytest.mark.parametrize(("content", "msg"), [
    ("{not json", "not valid JSON"),
    (json.dumps({"model": "no-such-model"}), "unknown model preset"),
    (json.dumps({"scenario": {"model": "gpt2"}, "safety_margin": 2}), "safety_margin"),
    (json.dumps({"model": "gpt2", "hardware": {"memory_bytes": 2**34}}), "GPU preset"),
])
def test_cli_recommend_bad_input_exits_2(tmp_path, content, msg):
    f = tmp_path / "bad.json"
    f.write_text(content)
    r = run_cli("recommend", str(f))
    assert r.returncode == 2
    assert msg in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_cli_recommend_missing_file_exits_2(tmp_path):
    r = run_cli("recommend", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "cannot read" in r.stderr


# ---- groups, slow configurations, FSDP2 (issue 8) ----------------------------------------------------

@pytest.mark.parametrize(("ratio", "words"), [(1.12, "12 % faster"), (2.46, "about 2.5x faster"),
                                              (30.13, "about 30x faster"), (0.5, "about 2.0x slower"),
                                              (0.9, "11 % slower"), (1.002, "about as fast")])
def test_speed_comparisons_read_as_times(ratio, words):
    from calc.recommend import speed_ratio_words

    assert speed_ratio_words(ratio) == words


def test_70b_on_8x_a100_offers_both_groups_and_says_full_is_offload_bound():
    base = sc("llama-2-70b", "8x-a100-80gb", precision="bf16-mixed")
    # 8 sequences per step: the offloaded optimizer step is amortised over one sequence per GPU
    rec = recommend(RecommendRequest(scenario=base, global_batch_size=8, max_candidates=3))
    full, adapters = rec.groups
    assert full.group == "full" and adapters.group == "adapters"
    assert adapters.best_tokens_per_s_per_gpu > 10 * full.best_tokens_per_s_per_gpu
    best_full = next(c for c in rec.candidates if c.group == "full")
    assert best_full.slow is not None and "tokens/s per GPU is" in best_full.slow
    assert best_full.tokens_per_s_per_gpu < 0.1 * best_full.compute_bound_tokens_per_s_per_gpu
    advice = " ".join(full.advice)
    assert "More GPUs:" in advice and "x A100" in advice  # how many GPUs would hold it without offload
    assert "Adapters:" in advice and "x faster" in advice
    assert "%" not in rec.explanation.split("Adapters")[-1]  # "about 100x faster", not "10000%"
    assert all(c.slow is None for c in rec.candidates if c.group == "adapters")


def test_the_scenarios_global_batch_amortises_offload_and_every_speed_says_its_batch():
    """The search reaches training.global_batch_tokens (in whole sequences), so the offloaded optimizer step
    is shared by more tokens: full fine-tuning of 70B on 8 x A100 runs several times faster at 262,144 tokens
    per step than at 8 sequences, and the sentence names the batch."""
    base = sc("llama-2-70b", "8x-a100-80gb", precision="bf16-mixed")
    small = recommend(RecommendRequest(scenario=base, global_batch_size=8, max_candidates=1))
    rec = recommend(RecommendRequest(scenario=base, max_candidates=1))
    assert rec.target_global_batch_sequences == base.training.global_batch_tokens // 2048 == 128
    for c in rec.candidates:
        t = c.scenario.training
        assert c.global_batch_tokens == t.micro_batch_size * t.gradient_accumulation_steps * c.scenario.data_parallel \
            * t.seq_len == 128 * 2048
    assert rec.groups[0].best_tokens_per_s_per_gpu > 3 * small.groups[0].best_tokens_per_s_per_gpu
    assert "at 262,144 tokens per step" in rec.groups[0].explanation


def test_unknown_host_ram_is_a_condition_never_fits():
    """One RTX 4090 without a host machine: the offloaded winner's headline states the host RAM it needs as a
    condition, not 'the fastest configuration that fits', and its table cell says the same."""
    from calc.memory.verdict import short

    base = Scenario(model="llama-2-7b", hardware={"gpu": "rtx-4090", "num_gpus": 1})
    rec = recommend(RecommendRequest(scenario=base, max_candidates=2))
    full = rec.groups[0]
    best = next(c for c in rec.candidates if c.group == "full")
    assert best.verdict.fits is None
    need = best.verdict.limit("host_ram").needed_bytes
    assert "the fastest configuration that fits" not in full.explanation
    assert f"fits if the node has >= {need / 2**30:,.2f} GiB of host RAM" in full.explanation
    assert short(best.verdict).startswith("fits if the node has >= ")


def test_lora_scenario_pins_the_adapters_group():
    base = sc("llama-3.2-1b", "1x-a100-80gb", lora={"rank": 8})
    rec = recommend(RecommendRequest(scenario=base, global_batch_size=8, max_candidates=2))
    assert [g.group for g in rec.groups] == ["adapters"]
    assert rec.candidates and all(c.scenario.training.lora.rank == 8 and not c.method_change for c in rec.candidates)


def test_fsdp2_scenario_keeps_its_sharding_in_recommend_and_waterfall():
    base = sc("llama-3.2-1b", "8x-a100-80gb", precision="bf16-mixed", zero_stage=3, sharding="fsdp2")
    rec = recommend(RecommendRequest(scenario=base, global_batch_size=16, max_candidates=3))
    assert rec.candidates
    for c in rec.candidates:
        t = c.scenario.training
        assert t.sharding == "fsdp2" and t.zero_stage != 1 and t.offload_optimizer == Offload.none
    steps = optimization_waterfall(base)
    assert all(s.scenario.training.sharding == "fsdp2" for s in steps)
    assert "ZeRO-1" not in [s.name for s in steps] and "optimizer offload" not in [s.name for s in steps]


def test_waterfall_says_why_a_step_needs_more_memory():
    steps = optimization_waterfall(sc("llama-3.1-8b", "8x-a100-80gb"))
    for prev, s in zip(steps, steps[1:], strict=False):
        rose = s.device_total_expected_bytes > prev.device_total_expected_bytes
        assert (s.why_more is not None) == rose
        if rose:
            assert "more per GPU than the step before" in s.why_more


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "llama-4-scout"])
def test_adapters_on_families_that_refuse_lora_all_linear(model):
    """peft's all-linear is refused on these MoE families (calc.contract.architectures.ALL_LINEAR_LORA_REFUSED): the
    recommender and the waterfall put their adapters on the attention projections instead of failing."""
    from calc.contract.architectures import ALL_LINEAR_LORA_REFUSED

    sc = Scenario.model_validate({"model": model, "hardware": {"cluster": "8x-a100-80gb"}})
    assert sc.spec.family in ALL_LINEAR_LORA_REFUSED
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=3))
    adapters = [c for c in rec.candidates if c.group == "adapters"]
    assert adapters and all(c.scenario.training.lora.targets == "attention" for c in adapters)
    steps = optimization_waterfall(sc)
    lora_steps = [s for s in steps if s.scenario.training.lora is not None]
    assert lora_steps and all(s.scenario.training.lora.targets == "attention" for s in lora_steps)


def test_package_names_are_their_modules():
    """calc.recommend's names are the objects its submodules define (imported, not copied)."""
    import importlib

    import calc.recommend as package

    modules = [importlib.import_module(f"calc.recommend.{m}")
               for m in ("combos", "models", "search", "table", "waterfall", "words", "workload")]
    assert set(package.__all__) <= set(dir(package))
    for name in package.__all__:
        assert any(getattr(m, name, None) is getattr(package, name) for m in modules), name
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


def test_usable_bytes_is_the_one_rounding_of_the_safety_margin():
    """Every page and the search use calc.recommend.usable_bytes: memory less the margin, rounded down (a
    configuration fits when its expected total is at most that)."""
    from calc.contract.scenario import Scenario
    from calc.recommend import DEFAULT_SAFETY_MARGIN, RecommendRequest, recommend, usable_bytes

    assert usable_bytes(10) == 9 and usable_bytes(15) == 13  # 13.5 rounds down, not to 14
    assert usable_bytes(24 * 2**30, 0.0) == 24 * 2**30
    sc = Scenario(model="gpt2", hardware={"gpu": "rtx-4090", "num_gpus": 1})
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=1))
    assert rec.usable_bytes == usable_bytes(rec.gpu_memory_bytes, DEFAULT_SAFETY_MARGIN)


@pytest.mark.parametrize("framework", ["torchtune", "litgpt"])
def test_a_framework_scenario_is_searched_within_its_recipes(framework):
    """torchtune's and LitGPT's single-device recipes: the search keeps the framework and its plain-PyTorch
    sharding, tries only their dtypes and what their paths model, and every candidate it ranks fits."""
    base = Scenario(model="llama-3.1-8b", hardware={"gpu": "a100-80gb"},
                    training={"framework": framework, "seq_len": 1024})
    rec = recommend(RecommendRequest(scenario=base, global_batch_size=1, max_candidates=4))
    assert rec.candidates, rec
    for c in rec.candidates:
        t = c.scenario.training
        assert (t.framework, t.sharding, t.zero_stage, t.tensor_parallel) == (framework, "torch", 0, 1)
        check_fits(c, rec.usable_bytes)


def test_no_zero_is_called_ddp_only_with_data_parallel_ranks():
    """One GPU (or TP over all of them) has no replicas to keep in step: the label says "no ZeRO", not DDP."""
    from calc.contract.enums import Checkpointing, Optimizer, Precision
    from calc.contract.i18n import render
    from calc.recommend.combos import Combo
    from calc.recommend.words import short_label

    def combo(dp: int, tp: int = 1) -> Combo:
        return Combo(Precision.bf16_mixed, Checkpointing.none, 1, Attention.sdpa, 0, Offload.none, Offload.none,
                     tp, 1, Optimizer.adamw, dp=dp)

    assert render(short_label(combo(8)), "en").startswith("no ZeRO (DDP)")
    for one_rank in (combo(1), combo(1, tp=8)):
        assert "DDP" not in render(short_label(one_rank), "en")
    assert "DDP" not in render(short_label(combo(1)), "zh")

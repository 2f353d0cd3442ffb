"""training.framework = "litgpt": LitGPT's GPT and finetune/full.py's step, against the records LitGPT itself made
on the CPU (data/measured_litgpt.jsonl), and the contract around it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.boundary import validate
from calc.contract.precision import for_loop_adam_elements
from calc.contract.record import load_records
from calc.contract.scenario import FRAMEWORK_DEFAULTS, Scenario
from calc.memory.estimate import estimate
from calc.sim.frameworks.litgpt import LITGPT_CHUNK_TOKENS, litgpt_chunk_rows, litgpt_param_numels

RECORDS = Path(__file__).resolve().parents[3] / "data" / "measured_litgpt.jsonl"
SMALL = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 352,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}
# the engine's rows that stand for each phase of a record (the record's forward includes the loss)
PHASE_ROWS = {"forward": ("forward", "loss"), "backward": ("backward",), "optimizer": ("optimizer",)}


def _records():
    return load_records(RECORDS)


def _litgpt(model=None, **training) -> Scenario:
    return Scenario.model_validate({"model": model or SMALL, "training": {"framework": "litgpt", **training}})


def _error(record) -> float:
    est = estimate(record.run_scenario(), target="cpu").peak_allocated_bytes
    return (est - record.peak_allocated_bytes) / record.peak_allocated_bytes


def test_the_records_are_litgpt_runs_of_several_shapes_and_precisions():
    records = _records()
    assert len(records) >= 6
    assert {r.scenario.training.framework for r in records} == {"litgpt"}
    assert {r.scenario.training.precision.value for r in records} == {"bf16", "amp-bf16"}
    assert {r.scenario.training.micro_batch_size == 1 for r in records} == {True, False}  # view and copy paths
    assert len({r.scenario.spec.family for r in records}) >= 3
    assert {r.scenario.training.lora is None for r in records} == {True, False}  # full.py and lora.py


def test_engine_matches_the_litgpt_records():
    errors = [abs(_error(r)) for r in _records()]
    assert statistics.median(errors) <= 0.005
    assert max(errors) <= 0.02


def _phase_cases():
    return [pytest.param(r, phase, id=f"{r.name}-{phase}") for r in _records() for phase in PHASE_ROWS]


@pytest.mark.parametrize(("record", "phase"), _phase_cases())
def test_every_phase_peak_matches(record, phase):
    """Not only the peak: the forward (with the loss), backward and optimizer phases each within 0.5 %."""
    tl = estimate(record.run_scenario(), target="cpu").timeline
    est = max(tl.total(i) for i, p in enumerate(tl.phases) if p in PHASE_ROWS[phase])
    measured = getattr(record.phase_peaks_bytes, phase)
    assert abs(est - measured) <= 0.005 * measured, (est, measured)


def test_framework_defaults_fill_what_the_scenario_leaves_out():
    dumped = _litgpt().training.model_dump(mode="json")
    assert FRAMEWORK_DEFAULTS["litgpt"]
    for field, value in FRAMEWORK_DEFAULTS["litgpt"].items():
        assert dumped[field] == value, field
    again = Scenario.model_validate(_litgpt(precision="bf16").model_dump(mode="json"))
    assert again.training.precision.value == "bf16" and again.training.cross_entropy == "chunked"


@pytest.mark.parametrize("training", [
    {"cross_entropy": "standard"},
    {"precision": "bf16-mixed"},
    {"attention": "eager"},
    {"activation_checkpointing": "full"},
    {"lora": {"rank": 8, "alpha": 16, "targets": "attention"}},  # amp-bf16: LitGPT keeps the frozen base fp32
    {"precision": "bf16", "lora": {"rank": 8, "alpha": 16, "targets": "attention", "base_weights": "nf4"}},
    {"sharding": "deepspeed"},
])
def test_what_the_litgpt_path_does_not_model_is_refused(training):
    with pytest.raises(ValueError, match="framework litgpt"):
        _litgpt(**training)


@pytest.mark.parametrize("model", [{**SMALL, "tie_word_embeddings": True}, {**SMALL, "model_type": "gpt2"},
                                   {**SMALL, "model_type": "mistral", "sliding_window": 64}])
def test_models_outside_the_litgpt_path_are_refused(model):
    with pytest.raises(ValueError, match="framework litgpt is modelled for Llama"):
        _litgpt(model)


def test_a_lora_scenario_reads_back_from_its_json():
    """A record's scenario is read back by boundary.validate (strict JSON): the lora block's name lists too."""
    sc = _litgpt(precision="bf16", lora={"rank": 8, "alpha": 16, "targets": "attention"})
    assert validate(Scenario, json.loads(sc.model_dump_json()), "scenario") == sc


def test_chunked_loss_belongs_to_a_framework_that_has_one():
    with pytest.raises(ValueError, match="cross_entropy chunked is the loss"):
        Scenario.model_validate({"model": SMALL, "training": {"cross_entropy": "chunked"}})


@given(rows=st.integers(1, 5000), chunk=st.integers(1, 300))
def test_chunk_rows_split_like_tensor_split(rows, chunk):
    parts = litgpt_chunk_rows(rows, chunk)
    assert sum(parts) == rows
    assert all(p == chunk for p in parts[:-1]) and 1 <= parts[-1] <= chunk


@given(order=st.lists(st.integers(1, 10**6), min_size=1, max_size=40))
def test_for_loop_adam_keeps_the_previous_denominator(order):
    """Two temporaries of the current parameter beside the previous one's denom: between 2 and 3 x the largest,
    and exactly 2 x the largest when no parameter follows one at least half its size."""
    n = for_loop_adam_elements(order)
    assert 2 * max(order) <= n <= 3 * max(order)
    if all(2 * cur < prev for prev, cur in zip(order, order[1:], strict=False)):
        assert n == 2 * max(order)


def test_litgpt_lists_lm_head_before_the_embedding():
    """GPT registers lm_head first, then wte: for-loop Adam's step holds three vocabulary-sized temporaries."""
    spec = _litgpt().spec
    numels = litgpt_param_numels(spec)
    assert sum(numels) == spec.total_params()
    assert numels[:2] == (1000 * 128, 1000 * 128) and for_loop_adam_elements(numels) == 3 * 1000 * 128


def test_the_loop_keeps_the_fp32_logits_through_the_optimizer_step():
    """finetune/full.py's `logits` (fp32 after Fabric's convert_output) is alive in the step: 4 x B x S x V."""
    small, big = (_litgpt(micro_batch_size=b, seq_len=256, precision="bf16") for b in (1, 2))
    rows = [estimate(sc, "cpu").timeline for sc in (small, big)]
    step = [tl.other[len(tl.events) - 1] for tl in rows]
    assert step[1] - step[0] == 4 * 256 * 1000 + 16 * 256  # + the second sequence's input_ids and labels


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(2, 400), precision=st.sampled_from(["bf16", "amp-bf16"]))
def test_more_tokens_never_need_less_memory(batch, seq, precision):
    one = estimate(_litgpt(micro_batch_size=batch, seq_len=seq, precision=precision), "cpu").peak_allocated_bytes
    more = estimate(_litgpt(micro_batch_size=batch, seq_len=seq + LITGPT_CHUNK_TOKENS, precision=precision),
                    "cpu").peak_allocated_bytes
    assert more > one


@pytest.mark.slow
def test_a_fresh_litgpt_run_matches_the_engine():
    """LitGPT itself, measured now through measure's entry point (one shape no record has), against the engine."""
    pytest.importorskip("litgpt")
    pytest.importorskip("lightning")
    from measure.entry import measure

    sc = _litgpt({**SMALL, "hidden_size": 64, "intermediate_size": 160, "vocab_size": 700}, micro_batch_size=3,
                 seq_len=150, precision="bf16")
    record = measure(sc, "cpu", steps=2)
    assert any("LitGPT" in note for note in record.notes)
    assert abs(_error(record)) <= 0.005


@pytest.mark.slow
def test_a_committed_record_is_reproduced_exactly():
    """LitGPT run again on the smallest committed LoRA and full fine-tuning configs: the same peak, to the byte
    (the data set cannot drift from the runner). Two steps reach the steady state the three recorded did."""
    pytest.importorskip("litgpt")
    pytest.importorskip("lightning")
    from measure.frameworks.litgpt_run import measure_litgpt

    for lora in (False, True):
        record = min((r for r in _records() if (r.scenario.training.lora is not None) == lora),
                     key=lambda r: r.peak_allocated_bytes)
        again = measure_litgpt(record.scenario, "cpu", steps=2)
        assert again.peak_allocated_bytes == record.peak_allocated_bytes, record.name


@pytest.mark.parametrize("training", [{}, {"precision": "bf16", "cross_entropy_chunks": 64},
                                      {"precision": "bf16", "lora": {"rank": 8, "alpha": 16, "targets": "all-linear"}}])
def test_a_litgpt_link_names_only_what_differs_from_its_defaults(training):
    from ui.state import params_to_scenario, scenario_to_params

    sc = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
                                  "training": {"framework": "litgpt", **training}})
    params = scenario_to_params(sc)
    assert params_to_scenario(params) == sc
    if not training:  # the recipe's defaults (precision, loss, sharding) are not repeated in the link
        assert set(params) == {"model", "gpu", "fw"}


def _litgpt_lora_peak(**lora) -> int:
    sc = Scenario.model_validate({"model": "llama-3.1-8b", "hardware": {"gpu": "a100-80gb"},
                                  "training": {"framework": "litgpt", "precision": "bf16", "lora": {"rank": 8, **lora}}})
    return estimate(sc).peak_allocated_bytes


def test_litgpt_default_lora_recipe_is_estimated_and_subsets_count_their_tensors():
    """finetune/lora.py's defaults (lora_query and lora_value, lora_dropout 0.05) are what most LitGPT LoRA runs use:
    estimated, with fewer adapted parts holding less, dropout adding its dropped input, and zero_pad's copy."""
    qv = _litgpt_lora_peak(targets=["q_proj", "v_proj"])
    assert _litgpt_lora_peak(targets=["q_proj"]) < qv
    assert _litgpt_lora_peak(targets=["q_proj", "v_proj"], dropout=0.05) > qv
    assert _litgpt_lora_peak(targets=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) > qv


@pytest.mark.parametrize(("lora", "reason"), [
    ({"targets": ["q_proj", "lm_head"]}, "lora_head"),
    ({"targets": ["q_proj", "gate_proj"]}, "the MLP only as a whole"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"base_weights": "int8"}, "bnb.int8-training is not modelled"),
])
def test_litgpt_lora_refuses_what_its_flags_or_the_engine_cannot_say(lora, reason):
    """LitGPT's flags adapt the MLP only as a whole and train no module in full; its chunked lm_head adapter is not
    modelled: each refused with its reason, not estimated as if absent."""
    with pytest.raises(ValueError, match=reason):
        _litgpt_lora_peak(**lora)


def _litgpt_qlora(**training):
    lora = {"rank": 8, "base_weights": "nf4", **training.pop("lora", {})}
    return Scenario.model_validate({"model": "llama-2-7b", "hardware": {"gpu": "a100-40gb"}, "training": {
        "framework": "litgpt", "precision": "bf16", "optimizer": "paged-adamw", "lora": lora, **training}})


@pytest.mark.parametrize(("training", "reason"), [
    ({"precision": "amp-bf16"}, "bf16-true only"),
    ({"optimizer": "adamw"}, "PagedAdamW"),
])
def test_litgpt_qlora_refuses_what_finetune_lora_does_not_run(training, reason):
    """finetune/lora.py refuses quantization with mixed precision and always trains a quantized model with
    bitsandbytes' PagedAdamW: a scenario saying otherwise is refused with the reason."""
    with pytest.raises(ValueError, match=reason):
        _litgpt_qlora(**training)


def test_litgpt_qlora_counts_its_4bit_head_and_stable_embedding():
    """LitGPT's QLoRA quantizes lm_head too (its weights are less than the transformers path's, which keeps lm_head
    in bf16) and keeps the StableEmbedding's gradients and the replaced embedding, each a named part."""
    sc = _litgpt_qlora()
    est = estimate(sc)
    hf = estimate(Scenario.model_validate({"model": "llama-2-7b", "hardware": {"gpu": "a100-40gb"}, "training": {
        "precision": "bf16", "optimizer": "paged-adamw", "lora": {"rank": 8, "base_weights": "nf4"}}}))
    spec = sc.spec
    vh = spec.vocab_size * spec.hidden_size
    lm_head_saving = 2 * vh - (vh // 2 + vh // 64 * 4 + 64)  # bf16 lm_head vs its nf4 data, absmax and code
    litgpt_weights = next(c.bytes for c in est.components if c.key == "weights")
    hf_weights = next(c.bytes for c in hf.components if c.key == "weights")
    assert hf_weights - litgpt_weights < lm_head_saving  # the replaced embedding and the norm's params added back
    grads = next(c for c in est.components if c.key == "stable_embedding_grads")
    assert grads.bytes == 2 * (vh + 2 * spec.hidden_size)
    assert "zero_grad" in grads.source
    # gradients, drawn as such at every moment of the step (the forward's too: they stay from step 1 on)
    assert grads.category == "gradients" and est.breakdown.gradients >= grads.bytes
    assert min(est.timeline.gradients) >= grads.bytes
    assert sum(c.bytes for c in est.components) == est.peak_allocated_bytes


def test_the_records_cover_litgpt_qlora():
    lora = [r.scenario.training.lora for r in _records() if r.scenario.training.lora is not None]
    kinds = {(x.base_weights, x.double_quant) for x in lora if x.quantized}
    assert kinds == {("nf4", False), ("nf4", True), ("fp4", False), ("fp4", True)}
    held_out = [r for r in _records() if r.name.startswith("heldout-") and r.scenario.training.lora is not None
                and r.scenario.training.lora.quantized]
    assert len(held_out) >= 4


def test_the_records_cover_litgpt_lora_subsets_and_dropout():
    loras = [r.scenario.training.lora for r in _records() if r.scenario.training.lora is not None]
    assert any(isinstance(lo.targets, tuple) and {"q_proj", "v_proj"} <= set(lo.targets) and lo.dropout for lo in loras)
    assert any(isinstance(lo.targets, tuple) and "k_proj" not in lo.targets for lo in loras)


def test_the_records_cover_litgpt_gradient_accumulation():
    """fit's micro-steps (loss / accumulation, gradients kept between them), full and LoRA."""
    accumulating = [r for r in _records() if r.scenario.training.gradient_accumulation_steps > 1]
    assert {r.scenario.training.lora is None for r in accumulating} == {True, False}

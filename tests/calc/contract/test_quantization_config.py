"""A pasted config.json's quantization_config: which weights it sets, the precedence of the scenario's own fields,
and the one-line refusals of what the estimate does not model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calc.contract.boundary import error_message
from calc.contract.errors import UserError
from calc.contract.quantization_config import config_quantization
from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate
from ui import state

BASE = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
NF4_DQ = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
          "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
CONFIGS = [
    (NF4_DQ, ("nf4", True)),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, ("fp4", False)),  # BitsAndBytesConfig's default type
    ({"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False}, ("int8", False)),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, ("gptq-int4", False)),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": False}, ("gptq-int8", False)),  # Qwen's
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, ("awq-int4", False)),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}, ("fp8", False)),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, ("fp8", False)),  # Meta's FP8 checkpoints
]


def _model(qc) -> dict:
    return {**BASE, "quantization_config": qc}


@pytest.mark.parametrize(("qc", "want"), CONFIGS)
def test_quantization_config_sets_inference_weights(qc, want):
    sc = Scenario.model_validate({"model": _model(qc), "mode": "inference"})
    assert (sc.inference.weights, sc.inference.double_quant) == want
    assert str(sc.quantization_note()) == f"the config's quantization_config sets inference.weights = {want[0]}"
    assert estimate(sc).notes == [str(sc.quantization_note())]


def test_the_scenario_field_wins_and_the_note_says_so():
    sc = Scenario.model_validate({"model": _model(NF4_DQ), "mode": "inference", "inference": {"weights": "bf16"}})
    assert sc.inference.weights == "bf16" and not sc.inference.double_quant
    assert "overrides" in str(sc.quantization_note())


def test_quantized_config_estimates_less_than_its_16bit_twin():
    quant = Scenario.model_validate({"model": _model(NF4_DQ), "mode": "inference"})
    plain = Scenario.model_validate({"model": BASE, "mode": "inference"})
    assert estimate(quant).breakdown.parameters < estimate(plain).breakdown.parameters


def test_lora_training_takes_the_base_weights_from_the_config():
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    sc = Scenario.model_validate({"model": _model(qc), "training": {"lora": {"rank": 8}}})
    assert sc.training.lora.base_weights == "nf4"
    assert "lora.base_weights = nf4" in str(sc.quantization_note())


def test_lora_on_gptq_is_refused():
    with pytest.raises(ValueError, match="LoRA on gptq-int4"):
        Scenario.model_validate({"model": _model(CONFIGS[3][0]), "training": {"lora": {}}})


def test_full_fine_tuning_notes_the_config_is_not_used():
    sc = Scenario.model_validate({"model": _model(NF4_DQ)})
    assert sc.training.lora is None
    assert "not used" in str(sc.quantization_note())


def test_the_setting_survives_a_dump_and_a_link():
    sc = Scenario.model_validate({"model": _model(NF4_DQ), "mode": "inference", "inference": {"new_tokens": 32}})
    assert Scenario.model_validate(sc.model_dump()) == sc
    assert state.params_to_scenario(state.scenario_to_params(sc)) == sc


HOSTILE = [
    ("not an object", "must be an object"),
    ({"quant_method": "hqq"}, "quant_method 'hqq' is not modelled"),
    ({"quant_method": "mxfp4"}, "mixture-of-experts"),  # a dense model: MXFP4 stores routed experts only
    ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "list of module names"),
    ({"quant_method": None}, "quant_method None is not modelled"),
    ({"quant_method": "bitsandbytes"}, "neither or both"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True}, "neither or both"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": "yes"}, "neither or both"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "int2"}, "not nf4 or fp4"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": "true"}, "true or false"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits 4 or 8 and group_size 128"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "bits 4 or 8 and group_size 128"),
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, "bits 4 and group_size 128"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits 4 and group_size 128"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size"),
]


@pytest.mark.parametrize(("qc", "message"), HOSTILE)
def test_unmodelled_quantization_is_refused_in_one_line(qc, message):
    with pytest.raises(ValueError, match=message) as err:
        Scenario.model_validate({"model": _model(qc), "mode": "inference"})
    assert "\n" not in error_message(err.value)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
                                        "bnb_4bit_use_double_quant", "bits", "group_size", "weight_block_size",
                                        "modules_to_not_convert", "llm_int8_skip_modules"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.text(max_size=8),
                                 st.sampled_from(["bitsandbytes", "gptq", "awq", "fp8", "nf4", "fp4", "fbgemm_fp8",
                                                  "mxfp4"]),
                                 st.lists(st.integers(0, 256), max_size=3),
                                 st.lists(st.text(alphabet="model.layers*0123_(|)+?[]\\$^", max_size=24),
                                          max_size=6))))
def test_any_quantization_config_parses_or_says_why(qc):
    """Whatever a config holds, the parser answers a modelled weight kind or a UserError, never a crash."""
    try:
        got = config_quantization({"quantization_config": qc})
    except UserError as exc:
        assert str(exc)
        return
    assert got is not None and got.weights in ("int8", "nf4", "fp4", "gptq-int4", "gptq-int8", "awq-int4", "fp8",
                                                       "mxfp4")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="model.layers.self_attn.mlp*0123456789_lm_head(|)+?\\", max_size=40), max_size=8))
def test_any_skip_list_estimates_or_says_why_quickly(skip):
    """A pasted FP8 config with any modules_to_not_convert: an estimate, or one line naming the entry, in well under
    a second (the patterns are regular expressions; only bounded ones are compiled)."""
    import time

    from calc.memory.engine import estimate

    started = time.perf_counter()
    try:
        sc = Scenario.model_validate({"model": _model({"quant_method": "fp8", "modules_to_not_convert": skip}),
                                      "mode": "inference", "training": {"seq_len": 64}})
        assert estimate(sc).peak_allocated_bytes > 0
    except ValueError as exc:
        assert "\n" not in error_message(exc)
    assert time.perf_counter() - started < 1.0

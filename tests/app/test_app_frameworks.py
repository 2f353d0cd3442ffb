"""The sidebar's framework, LoRA-module and generation choices: each reaches the scenario the engine estimates,
the link, and the numbers on the page."""

from __future__ import annotations

import pytest

from calc.contract.scenario import FRAMEWORK_DEFAULTS, Scenario
from tests.app.test_app_calculator import _widget, check_numbers
from tests.app.test_app_helpers import all_text, assert_clean, open_app, scenario
from ui import state
from ui.labels import FRAMEWORK_LABELS
from ui.widgets import offered_frameworks


def tr_label(framework: str) -> str:
    return FRAMEWORK_LABELS[framework]


def _expected(**training) -> Scenario:
    data = state.DEFAULT_SCENARIO.model_dump(mode="json", exclude_defaults=True)
    data["training"] = training
    return Scenario.model_validate(data)


def test_only_modelled_frameworks_are_offered():
    at = open_app()
    options = _widget(at, "sc_framework").options
    assert list(options) == [tr_label(f) for f in offered_frameworks()]  # shown by their names
    assert "transformers" in offered_frameworks() and "torchtitan" not in offered_frameworks()


@pytest.mark.parametrize("framework", ["torchtune", "litgpt"])
def test_choosing_a_framework_brings_its_recipe_defaults(framework):
    at = open_app()
    _widget(at, "sc_framework").set_value(framework)
    at.run()
    expected = _expected(framework=framework)  # the contract fills the recipe's defaults
    dumped = expected.training.model_dump(mode="json")
    assert {k: dumped[k] for k in FRAMEWORK_DEFAULTS[framework]} == FRAMEWORK_DEFAULTS[framework]
    assert _widget(at, "sc_precision").value == FRAMEWORK_DEFAULTS[framework]["precision"]  # the widgets show them
    check_numbers(at, expected)
    text = all_text(at)
    assert "cross_entropy = chunked" in text  # the defaults are stated under the choice
    assert state.scenario_to_params(scenario(at))["fw"] == framework


def test_back_to_transformers_restores_its_defaults():
    at = open_app()
    _widget(at, "sc_framework").set_value("torchtune")
    at.run()
    _widget(at, "sc_framework").set_value("transformers")
    at.run()
    check_numbers(at, state.DEFAULT_SCENARIO)


def test_lora_module_list_dropout_and_modules_to_save():
    at = open_app()
    _widget(at, "sc_lora").set_value(True)
    at.run()
    _widget(at, "sc_lora_targets").set_value("list")
    at.run()
    names = [w for w in at.multiselect if w.key == "sc_lora_names"][0]
    assert {"q_proj", "v_proj", "down_proj", "lm_head"} <= set(names.options)  # the model's own names
    names.set_value(["q_proj", "v_proj"])
    _widget(at, "sc_lora_dropout").set_value(0.05)
    [w for w in at.multiselect if w.key == "sc_lora_save"][0].set_value(["lm_head"])
    at.run()
    assert_clean(at)
    lora = scenario(at).training.lora
    assert lora.targets == ("q_proj", "v_proj") and lora.dropout == 0.05 and lora.modules_to_save == ("lm_head",)
    check_numbers(at, scenario(at))
    params = state.scenario_to_params(scenario(at))
    assert params["lora_t"] == "q_proj,v_proj" and params["lora_save"] == "lm_head"
    assert state.params_to_scenario(params) == scenario(at)


def test_an_empty_module_list_is_refused_with_its_reason():
    at = open_app()
    _widget(at, "sc_lora").set_value(True)
    at.run()
    _widget(at, "sc_lora_targets").set_value("list")
    at.run()
    assert any("name at least one module" in e.value for e in at.sidebar.error)


def test_generation_choices_reach_the_scenario():
    at = open_app()
    _widget(at, "sc_mode").set_value("inference")
    at.run()
    _widget(at, "sc_gen").set_value(256)
    _widget(at, "sc_kv").set_value("static")
    _widget(at, "sc_wq").set_value("nf4")
    at.run()
    _widget(at, "sc_wdq").set_value(True)
    at.run()
    inf = scenario(at).inference
    assert (inf.new_tokens, inf.kv_cache, inf.weights, inf.double_quant) == (256, "static", "nf4", True)
    check_numbers(at, scenario(at))
    params = state.scenario_to_params(scenario(at))
    assert state.params_to_scenario(params) == scenario(at)


def test_a_litgpt_qlora_link_shows_its_stable_embedding_part():
    """LitGPT's QLoRA from a link: the Calculator estimates what finetune/lora.py --quantize bnb.nf4-dq runs, with
    the StableEmbedding's gradients named among the parts, and the same numbers as calc/."""
    params = {"model": "llama-2-7b", "gpu": "rtx-4090", "seq": "1024", "prec": "bf16", "opt": "paged-adamw",
              "fw": "litgpt", "lora": "1", "lora_r": "8", "lora_a": "16", "lora_t": "q_proj,v_proj", "lora_w": "nf4",
              "lora_dq": "1"}
    at = open_app(params=params)
    expected = state.params_to_scenario(params)
    assert expected.training.lora.double_quant and expected.training.framework == "litgpt"
    check_numbers(at, expected)
    assert "StableEmbedding gradients" in all_text(at)

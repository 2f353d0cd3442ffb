"""LoRA as people configure it: target lists in Hugging Face module names (each family's own, lm_head included),
lora_dropout and modules_to_save. The records in data/ (tests/calc/evidence/test_accuracy.py) check the bytes;
these check the names, the counts and the mechanisms' direction and size."""

from __future__ import annotations

import json

import pytest

from calc.contract.boundary import validate
from calc.contract.scenario import Scenario
from calc.memory.estimate import estimate

# peft's default target_modules for llama-style models (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
PEFT_LLAMA_DEFAULT = ("q_proj", "v_proj")


def scenario(model: str = "llama-3.2-1b", **lora) -> Scenario:
    return Scenario.model_validate({"model": model, "training": {
        "precision": "bf16", "micro_batch_size": 1, "seq_len": 1024, "lora": {"rank": 16, **lora}}})


@pytest.mark.parametrize(("model", "names"), [
    ("llama-3.2-1b", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}),
    ("gpt2", {"c_attn", "c_proj", "c_fc", "lm_head"}),
    ("phi-3-mini", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}),
    ("pythia-160m", {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h", "lm_head"}),
])
def test_linear_module_names_are_the_families_own(model, names):
    assert set(scenario(model).spec.linear_module_names()) == names


def test_mla_names():
    names = set(scenario("deepseek-v3", targets="attention").spec.linear_module_names())
    assert {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"} <= names


def test_unknown_name_is_refused_with_the_models_names():
    with pytest.raises(ValueError, match=r"c_attn .*q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                                        r"lm_head"):
        scenario(targets=("q_proj", "c_attn"))


def test_moe_mlp_names_are_refused_where_peft_moves_them_onto_the_experts():
    with pytest.raises(ValueError, match="routed experts"):
        scenario("deepseek-v2-lite", targets=("q_proj", "gate_proj"))
    assert scenario("mixtral-8x7b", targets=("q_proj", "v_proj")).spec  # attention names are fine
    with pytest.raises(ValueError, match="gate_proj is not a linear module"):  # Mixtral's experts are no nn.Linear
        scenario("mixtral-8x7b", targets=("gate_proj",))


def test_peft_default_counts_r_times_in_plus_out_of_q_and_v():
    sc = scenario(targets=PEFT_LLAMA_DEFAULT)
    s = sc.spec
    per_layer = 16 * (s.hidden_size + s.num_heads * s.head_dim) + 16 * (s.hidden_size + s.num_kv_heads * s.head_dim)
    assert estimate(sc).model.trainable_params == s.num_layers * per_layer


@pytest.mark.parametrize("model", ["llama-3.2-1b", "phi-3-mini", "pythia-160m", "deepseek-v2-lite"])
def test_lists_of_every_name_equal_the_sets(model):
    """The attention projections' names select what "attention" does; every name but lm_head what "all-linear"
    does (dense models: peft's all-linear leaves lm_head out). Not GPT-2, whose c_proj names an MLP module too."""
    spec = scenario(model, targets="attention").spec
    attention = tuple({spec.module_name(lin.name) for lin in spec.linear_layers() if lin.block == "attention"})
    assert spec.lora_params(16, attention) == spec.lora_params(16, "attention")
    if spec.num_experts == 1:
        everything = tuple(n for n in spec.linear_module_names() if n != spec.module_name("lm_head"))
        assert spec.lora_params(16, everything) == spec.lora_params(16, "all-linear")


def test_gpt2_c_proj_names_both_attention_and_mlp_projections():
    """peft matches the last component of the module path: attn.c_proj and mlp.c_proj alike."""
    spec = scenario("gpt2", targets=("c_proj",)).spec
    h = spec.hidden_size
    assert spec.lora_params(8, ("c_proj",)) == spec.num_layers * 8 * ((h + h) + (4 * h + h))


def test_lm_head_adapter_adds_its_params_and_activations():
    without, with_head = scenario(targets=PEFT_LLAMA_DEFAULT), scenario(targets=(*PEFT_LLAMA_DEFAULT, "lm_head"))
    s = without.spec
    a, b = estimate(without), estimate(with_head)
    assert b.model.trainable_params - a.model.trainable_params == 16 * (s.hidden_size + s.vocab_size)
    # A's r-wide output (B saves it) and the adapter's V-wide product at least
    assert b.peak_allocated_bytes - a.peak_allocated_bytes >= 2 * 1024 * 16


def test_dropout_saves_each_adapted_modules_dropped_input_and_mask():
    """Without dropout the adapters of q_proj and v_proj keep the input the layer already has; with it each keeps
    its own dropped copy (bf16) and a 1-byte mask (CUDA): 2 x (2 + 1) bytes per element instead of 2."""
    a, b = estimate(scenario(targets=PEFT_LLAMA_DEFAULT)), estimate(scenario(targets=PEFT_LLAMA_DEFAULT, dropout=0.1))
    s = scenario().spec
    per_layer = 1024 * s.hidden_size
    grew = b.peak_allocated_bytes - a.peak_allocated_bytes
    assert (s.num_layers - 1) * per_layer * (2 * 3 - 2) <= grew <= s.num_layers * per_layer * 2 * 3


def test_dropout_is_free_in_inference():
    sc = scenario(targets=PEFT_LLAMA_DEFAULT, dropout=0.1)
    plain = scenario(targets=PEFT_LLAMA_DEFAULT)
    infer = {"mode": "inference"}
    assert (estimate(sc.model_copy(update=infer)).peak_allocated_bytes
            == estimate(plain.model_copy(update=infer)).peak_allocated_bytes)


@pytest.mark.parametrize("module", ["lm_head", "embed_tokens"])
def test_modules_to_save_trains_a_full_copy(module):
    """peft keeps the frozen original and trains a deepcopy: its weights, bf16 gradient and AdamW's two states."""
    plain, saved = scenario(targets=PEFT_LLAMA_DEFAULT), scenario(targets=PEFT_LLAMA_DEFAULT, modules_to_save=(module,))
    s = plain.spec
    copy = s.vocab_size * s.hidden_size
    a, b = estimate(plain), estimate(saved)
    assert b.model.trainable_params - a.model.trainable_params == copy
    assert b.peak_allocated_bytes - a.peak_allocated_bytes >= copy * (2 + 2 * 2)  # weights + AdamW states


def test_modules_to_save_refuses_what_is_not_modelled():
    with pytest.raises(ValueError, match="without ZeRO"):
        Scenario.model_validate({"model": "llama-3.2-1b", "training": {
            "precision": "amp-bf16", "zero_stage": 2, "lora": {"modules_to_save": ["lm_head"]}}})
    with pytest.raises(ValueError, match="modules_to_save: q_proj"):
        scenario(modules_to_save=("q_proj",))


def test_lists_survive_strict_json_validation():
    """Records and scenario files are validated strictly; the names arrive as JSON arrays."""
    data = json.loads(json.dumps({"model": "gpt2", "training": {"precision": "bf16", "lora": {
        "targets": ["c_attn", "lm_head"], "modules_to_save": ["wte"]}}}))
    sc = validate(Scenario, data, "scenario")
    assert sc.training.lora.targets == ("c_attn", "lm_head") and sc.training.lora.modules_to_save == ("wte",)


def test_copies_beside_fp32_adapters_stay_bf16():
    """peft upcasts only the adapters: under amp the trainable copy keeps bf16 weights, gradients and AdamW states,
    the adapters fp32 ones."""
    from calc.memory.states import model_states

    def states(**lora):
        sc = Scenario.model_validate({"model": "llama-3.2-1b", "training": {
            "precision": "amp-bf16", "lora": {"rank": 16, "targets": PEFT_LLAMA_DEFAULT, **lora}}})
        return sc, model_states(sc, sc.spec.num_layers, True, True, "cuda", False)

    sc, plain = states()
    _, saved = states(modules_to_save=("lm_head",))
    copy = sc.spec.vocab_size * sc.spec.hidden_size
    assert saved.weights - plain.weights == 2 * copy
    assert saved.grads - plain.grads == 2 * copy
    assert saved.optimizer - plain.optimizer == 2 * 2 * copy

"""URL state: every valid scenario survives scenario -> query parameters -> scenario, parameters are
strings, defaults are left out, and a bad link fails with a message naming the parameter."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calc.contract.presets import cluster_presets, gpu_presets, model_presets
from calc.contract.scenario import Attention, Checkpointing, Offload, Optimizer, OptimizerImpl, Precision, Scenario
from ui import state

MODELS = sorted(model_presets())


@st.composite
def scenarios(draw) -> Scenario:
    hw_kind = draw(st.sampled_from(["gpu", "cluster", "custom"]))
    if hw_kind == "gpu":
        hw = {"gpu": draw(st.sampled_from(sorted(gpu_presets()))), "num_gpus": draw(st.sampled_from([1, 2, 8, 64]))}
    elif hw_kind == "cluster":
        hw = {"cluster": draw(st.sampled_from(sorted(cluster_presets())))}
    else:
        hw = {"memory_bytes": draw(st.integers(1, 2**40)), "num_gpus": draw(st.integers(1, 16))}
    t = {
        "micro_batch_size": draw(st.integers(1, 64)), "seq_len": draw(st.integers(1, 65536)),
        "gradient_accumulation_steps": draw(st.integers(1, 64)),
        "precision": draw(st.sampled_from(list(Precision))).value,
        "optimizer": draw(st.sampled_from(list(Optimizer))).value,
        "optimizer_impl": draw(st.sampled_from(list(OptimizerImpl))).value,
        "activation_checkpointing": draw(st.sampled_from(list(Checkpointing))).value,
        "checkpoint_every": draw(st.integers(1, 8)), "attention": draw(st.sampled_from(list(Attention))).value,
        "zero_stage": draw(st.integers(0, 3)), "offload_optimizer": draw(st.sampled_from(list(Offload))).value,
        "offload_params": draw(st.sampled_from(list(Offload))).value,
        "tensor_parallel": draw(st.sampled_from([1, 2, 4])), "pipeline_parallel": draw(st.sampled_from([1, 2])),
        "sequence_parallel": draw(st.booleans()),
    }
    if draw(st.booleans()):
        t["lora"] = {"rank": draw(st.integers(1, 256)), "alpha": draw(st.sampled_from([8, 16.5, 32])),
                     "targets": draw(st.sampled_from(["all-linear", "attention"])),
                     "base_weights": draw(st.sampled_from(["bf16", "int8", "nf4"]))}
    data = {"model": draw(st.sampled_from(MODELS)), "hardware": hw,
            "mode": draw(st.sampled_from(["train", "inference"])), "training": t}
    try:
        return Scenario.model_validate(data)
    except ValueError:
        return draw(st.nothing())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(scenarios())
def test_round_trip(sc):
    params = state.scenario_to_params(sc)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())
    assert state.params_to_scenario(params) == sc


def test_config_dict_round_trip_and_defaults_left_out():
    sc = Scenario(model=model_presets()["qwen2.5-7b"].config)
    params = state.scenario_to_params(sc)
    assert set(params) == {"config"}
    assert state.params_to_scenario(params) == sc
    assert state.scenario_to_params(Scenario(model="gpt2")) == {"model": "gpt2"}
    assert state.params_to_scenario({"unrelated": "1"}) is None


def test_a_link_without_a_model_takes_the_default_model():
    sc = state.params_to_scenario({"cluster": "8x-a100-80gb"})
    assert sc.model == state.DEFAULT_SCENARIO.model and sc.hardware.cluster == "8x-a100-80gb"
    assert state.params_to_scenario({"mbs": "4"}).training.micro_batch_size == 4


@pytest.mark.parametrize("params, message", [
    ({"model": "gpt2", "zero": "9"}, "zero:"),
    ({"model": "gpt2", "mbs": "two"}, "mbs:"),
    ({"model": "gpt2", "prec": "fp8"}, "prec:"),
    ({"model": "nope"}, "unknown model preset"),
    ({"config": "%%%"}, "config:"),
    ({"config": "x" * 30_000}, "config:"),
    ({"model": "gpt2", "off_par": "cpu"}, "offload_params needs zero_stage 3"),
])
def test_bad_links_name_the_parameter(params, message):
    with pytest.raises(state.UrlError, match=message):
        state.params_to_scenario(params)


def test_compare_columns_round_trip():
    cols = [state.CompareColumn(cluster="8x-a100-80gb", zero_stage=3, offload_params="nvme"),
            state.CompareColumn(gpu="a100-80gb-pcie", num_gpus=4, offload_optimizer="cpu", zero_stage=1)]
    assert state.compare_from_param(state.compare_to_param(cols)) == cols
    with pytest.raises(state.UrlError, match="unknown GPU preset 'qwen-free.gpu-1'"):  # a dot in the id: split right
        state.compare_from_param("c.8x-a100-80gb~z.0_g.qwen-free.gpu-1.4~z.0")
    with pytest.raises(state.UrlError, match="2 to 4 columns"):
        state.compare_from_param(state.compare_to_param(cols[:1]))
    with pytest.raises(state.UrlError, match="unknown part"):
        state.compare_from_param("c.x~q.1_c.y")


def test_every_training_field_has_a_url_parameter():
    """A link carries the whole scenario: each TrainingConfig field (LoRA's through lora_*) has a short name."""
    from calc.contract.scenario import InferenceConfig, LoraConfig, TrainingConfig

    covered = {path[1] for path in state.URL_FIELDS.values() if path[0] == "training"}
    assert set(TrainingConfig.model_fields) - covered == set()
    lora = {path[2] for path in state.URL_FIELDS.values() if path[:2] == ("training", "lora")}
    assert set(LoraConfig.model_fields) - lora == set()
    inference = {path[1] for path in state.URL_FIELDS.values() if path[0] == "inference"}
    assert set(InferenceConfig.model_fields) - inference == set()

"""Module paths and modules_to_not_convert: the paths are the ones transformers registers, the patterns skip what
transformers' own should_convert_module skips, hostile patterns are refused in one line, and the skipped modules
keep their 16-bit bytes in the estimate and the serving plan."""

from __future__ import annotations

import time
import warnings

import pytest

from calc.contract.errors import UserError
from calc.contract.module_paths import MAX_PATTERNS, check_patterns, linear_path, model_paths, skipped
from calc.contract.presets import model_presets
from calc.contract.quantization_config import config_quantization
from calc.contract.quantized import fp8_weight_bytes, mxfp4_weight_bytes
from calc.contract.scenario import Scenario
from calc.memory.engine import estimate
from tests.calc.contract.test_presets import _SMALL_CONFIGS, _one_config_per_family


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    return transformers, torch


def _short_model(hf, model_id: str):
    """The family's model with one MoE layer after its dense ones, built on the meta device."""
    from calc.contract.architectures import spec_from_hf_config

    transformers, torch = hf
    cfg = dict(_SMALL_CONFIGS[model_id] if model_id in _SMALL_CONFIGS else model_presets()[model_id].config)
    layers = spec_from_hf_config(cfg).dense_layers + 1
    cfg["num_hidden_layers"] = layers
    if cfg.get("layer_types"):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_hf_config(cfg)
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
            config.pad_token_id = None
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    return spec, model


@pytest.mark.parametrize("model_id", _one_config_per_family())
def test_every_weight_has_the_path_transformers_registers(hf, model_id):
    spec, model = _short_model(hf, model_id)
    modules = dict(model.named_modules())
    for index in range(spec.num_layers):
        for lin in spec.linear_layers(index < spec.dense_layers):
            path = linear_path(spec, lin, index)
            assert path in modules, (model_id, lin.name, path)
    for name, path in model_paths(spec).items():
        assert path in modules or (name == "lm_head" and spec.tie_word_embeddings), (model_id, path)


PATTERN_LISTS = [
    ["lm_head"], ["model.layers.1"], ["model.layers.*.self_attn"], ["down_proj"], ["mlp.gate"],
    ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],  # gpt-oss's
    ["model.layers.0.mlp", "model.layers.3.mlp.experts", "q_proj"], ["transformer.h.0", "attn.c_proj"],
    ["gpt_neox.layers.*.attention", "dense_4h_to_h"], ["model.layers.1.self_attn.q", "k_proj", "feed_forward"],
]


@pytest.mark.parametrize("model_id", ["tinyllama-1.1b", "gpt-oss-20b", "deepseek-v2-lite", "gpt2", "pythia-160m",
                                      "llama-4-scout"])
def test_patterns_skip_what_transformers_skips(hf, model_id):
    from transformers.quantizers.quantizers_utils import should_convert_module

    _, model = _short_model(hf, model_id)
    names = [name for name, _ in model.named_modules() if name]
    for patterns in PATTERN_LISTS:
        for name in names:
            assert skipped(name, tuple(patterns)) == (not should_convert_module(name, patterns)), (name, patterns)


@pytest.mark.parametrize("bad", [
    "lm_head", [1, 2], ["(a+)+$"], ["model|lm_head"], ["*.mlp"], ["model.**"], ["a*b*c*d"], ["x" * 201],
    ["a" * 10] * (MAX_PATTERNS + 1), [f"m{i}.*" for i in range(17)]])
def test_hostile_patterns_are_refused_in_one_line(bad):
    with pytest.raises(UserError) as exc:
        check_patterns(bad)
    assert "\n" not in str(exc.value)


def test_the_most_costly_accepted_patterns_stay_fast():
    """Sixteen patterns of two stars each that never match, over every module of Llama 3.1 405B."""
    cfg = {**model_presets()["llama-3.1-405b"].config, "quantization_config": {
        "quant_method": "fbgemm_fp8", "modules_to_not_convert": [f"m.*o.*zz{i}" for i in range(16)]
        + [f"model.layers.{i}.self_attn.q_proj" for i in range(4000)]}}
    started = time.perf_counter()
    sc = Scenario.model_validate({"model": cfg, "mode": "inference", "training": {"seq_len": 128}})
    estimate(sc)
    assert time.perf_counter() - started < 2.0


def _llama_fp8(skip: list[str] | None) -> dict:
    qc: dict = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}
    if skip is not None:
        qc["modules_to_not_convert"] = skip
    return {**model_presets()["tinyllama-1.1b"].config, "quantization_config": qc}


def _weights(model: dict | str, weights: str | None = None) -> int:
    inference = {} if weights is None else {"weights": weights}  # None: the config's quantization_config
    sc = Scenario.model_validate({"model": model, "mode": "inference", "inference": inference,
                                  "training": {"seq_len": 64, "attention": "eager"}})
    return next(c.bytes for c in estimate(sc).components if c.key == "weights")


def test_skipped_modules_keep_their_16_bit_bytes():
    spec = model_presets()["tinyllama-1.1b"].spec
    assert config_quantization(_llama_fp8(None)).weights == "fp8"
    every = _weights(_llama_fp8(None))
    kept = _weights(_llama_fp8(["model.layers.*.self_attn", "model.layers.0.mlp"]))
    attention = [lin for lin in spec.linear_layers() if lin.block == "attention"]
    mlp = [lin for lin in spec.linear_layers() if lin.block == "mlp"]

    def extra(lins) -> int:  # 16-bit bytes less the fp8 bytes of these weights
        return sum(2 * lin.weights - fp8_weight_bytes(lin.out_features, lin.in_features) for lin in lins)

    assert kept - every == spec.num_layers * extra(attention) + extra(mlp)


def test_mxfp4_stores_only_the_routed_experts_and_needs_them():
    spec = model_presets()["gpt-oss-20b"].spec
    experts = [lin for lin in spec.linear_layers() if lin.expert]
    packed = sum(lin.count * mxfp4_weight_bytes(lin.out_features, lin.in_features) for lin in experts)
    assert _weights("gpt-oss-20b", "bf16") - _weights("gpt-oss-20b", "mxfp4") == spec.num_layers * (
        sum(2 * lin.weights for lin in experts) - packed)
    assert packed == pytest.approx(sum(lin.weights for lin in experts) * 4.25 / 8)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        Scenario.model_validate({"model": "tinyllama-1.1b", "mode": "inference", "inference": {"weights": "mxfp4"}})


def test_the_gpt_oss_hub_config_is_read_as_mxfp4():
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": PATTERN_LISTS[5]}
    cfg = {**model_presets()["gpt-oss-20b"].config, "quantization_config": qc}
    sc = Scenario.model_validate({"model": cfg, "mode": "serve"})
    assert sc.inference.weights == "mxfp4" and sc.not_converted == tuple(PATTERN_LISTS[5])


def test_gptq_packs_32_over_bits_values_per_int32():
    """A 4096 x 4096 weight, groups of 128: qweight, qzeros, fp16 scales and g_idx at 4 and 8 bits."""
    from calc.contract.quantized import gptq_weight_bytes

    groups = 4096 // 128
    assert gptq_weight_bytes(4096, 4096, 128, 8) == 4 * (4096 // 4) * 4096 + 4 * groups * 4096 // 4 \
        + 2 * groups * 4096 + 4 * 4096
    assert gptq_weight_bytes(4096, 4096, 128, 4) == 4 * (4096 // 8) * 4096 + 4 * groups * 4096 // 8 \
        + 2 * groups * 4096 + 4 * 4096

"""Presets: every file loads, every model's parameter count equals transformers' own count exactly
(built on the meta device, no weights) and the published count within 0.5%, and a bad file fails
loudly with its path."""

from __future__ import annotations

import re
import warnings

import pytest

import calc.contract.presets as presets
from calc.contract.architectures import PEFT_EXPERT_ADAPTER_FAMILIES
from calc.contract.presets import GpuPreset, PresetError, cluster_presets, gpu_presets, model_presets

MODEL_IDS = sorted(model_presets())
MiB = 2**20
GiB = 2**30


def _clear_caches() -> None:
    for fn in (presets.model_presets, presets.gpu_presets, presets.cluster_presets, presets._spec_for_preset):
        fn.cache_clear()


# ---- (a) everything loads ---------------------------------------------------------------
def test_counts_and_required_ids():
    models, gpus, clusters = model_presets(), gpu_presets(), cluster_presets()
    assert len(models) >= 30
    assert len(gpus) >= 15
    for required in ("gpt2", "llama-2-7b", "llama-3.1-8b", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-7b",
                     "gemma-2-9b", "phi-3-mini", "pythia-160m", "tinyllama-1.1b"):
        assert required in models
    for required in ("rtx-4090", "a100-80gb", "h100-sxm", "h200", "mi300x", "t4"):
        assert required in gpus
    for required in ("1x-rtx-4090", "8x-a100-80gb", "64x-a100-80gb"):
        assert required in clusters


def test_every_model_names_its_sources():
    for p in model_presets().values():
        assert p.source.startswith("https://huggingface.co/") and p.source.endswith("config.json"), p.id
        assert p.params_source is None or p.params_source.startswith("https://"), p.id


# ---- (b) our count == transformers' count, exactly ---------------------------------------
@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    transformers.logging.set_verbosity_error()
    return transformers, torch


@pytest.mark.parametrize("preset_id", MODEL_IDS)
def test_param_count_matches_transformers(hf, preset_id):
    transformers, torch = hf
    preset = model_presets()[preset_id]
    cfg = dict(preset.config)
    model_type = cfg.pop("model_type")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(model_type, **cfg)
        # token ids only matter for an embedding's padding_idx; keep them inside the vocabulary
        if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
            config.pad_token_id = None
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    hf_count = sum(p.numel() for p in model.parameters())
    assert hf_count == preset.spec.total_params(), (
        f"{preset_id}: transformers {hf_count:,} vs ours {preset.spec.total_params():,}"
    )
    # the order DeepSpeed ZeRO-1/2 partition the parameters in (calc.contract.parallel.zero12_rank0_partition)
    emb, layer_list, top = preset.spec.param_numel_blocks()
    assert [p.numel() for p in model.parameters()] == [*emb, *[n for layer in layer_list for n in layer], *top]


# ---- (c) our count vs the published count ------------------------------------------------
@pytest.mark.parametrize("preset_id", MODEL_IDS)
def test_published_params_within_half_percent(preset_id):
    preset = model_presets()[preset_id]
    ours = preset.spec.total_params()
    rel = abs(ours - preset.published_params) / preset.published_params
    assert rel <= preset.published_tolerance, f"{preset_id}: ours {ours:,} vs published {preset.published_params:,} ({rel:.3%})"


# ---- (d) a bad preset fails loudly, naming its file ---------------------------------------
GOOD_MODEL = """\
id: {id}
name: Tiny
source: https://huggingface.co/x/y/blob/main/config.json
published_params: 1000
config:
  model_type: llama
  vocab_size: 100
  hidden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 4
"""


@pytest.fixture
def presets_dir(tmp_path, monkeypatch):
    for kind in ("models", "gpus", "clusters"):
        (tmp_path / kind).mkdir()
    monkeypatch.setattr(presets, "PRESETS_DIR", tmp_path)
    _clear_caches()
    yield tmp_path
    _clear_caches()


def _expect_error(loader, path):
    with pytest.raises(PresetError) as exc:
        loader()
    assert str(path) in str(exc.value)
    return str(exc.value)


def test_good_tmp_preset_loads(presets_dir):
    (presets_dir / "models" / "tiny.yaml").write_text(GOOD_MODEL.format(id="tiny"))
    assert list(model_presets()) == ["tiny"]


def test_malformed_yaml(presets_dir):
    path = presets_dir / "models" / "broken.yaml"
    path.write_text("id: broken\nname: [unclosed\n")
    _expect_error(model_presets, path)


def test_unknown_field(presets_dir):
    path = presets_dir / "models" / "tiny.yaml"
    path.write_text(GOOD_MODEL.format(id="tiny") + "flops_per_token: 12\n")
    assert "flops_per_token" in _expect_error(model_presets, path)


def test_id_must_equal_file_name(presets_dir):
    path = presets_dir / "models" / "tiny.yaml"
    path.write_text(GOOD_MODEL.format(id="other"))
    _expect_error(model_presets, path)


def test_unsupported_model_type(presets_dir):
    path = presets_dir / "models" / "tiny.yaml"
    path.write_text(GOOD_MODEL.format(id="tiny").replace("model_type: llama", "model_type: t5"))
    assert "unsupported model_type" in _expect_error(model_presets, path)


def test_cluster_with_unknown_gpu(presets_dir):
    path = presets_dir / "clusters" / "2x-nothing.yaml"
    path.write_text("id: 2x-nothing\nname: x\ngpu: nothing\nnum_gpus: 2\ngpus_per_node: 2\n"
                    "cpu_ram_bytes_per_node: 1073741824\n")
    _expect_error(cluster_presets, path)


# ---- (e) GPU and cluster sanity ----------------------------------------------------------
@pytest.mark.parametrize("gpu_id, mib", [("a100-80gb", 81920), ("rtx-4090", 24564), ("h100-sxm", 81559),
                                         ("a100-40gb", 40960), ("h200", 143771), ("t4", 15360)])
def test_memory_is_the_nvidia_smi_total(gpu_id, mib):
    assert gpu_presets()[gpu_id].memory_bytes == mib * MiB


def test_gpu_fields_are_consistent():
    for g in gpu_presets().values():
        assert g.memory_bytes % MiB == 0, g.id
        # the marketing label is a GB (or, for some, roughly GiB) figure: the reported total sits between
        # 0.95 x label x 1e9 and label x 2**30 -- catches a GB/GiB/MiB slip of any real size
        label = float(re.match(r"^(\d+(?:\.\d+)?) GB$", g.memory_label).group(1))
        assert 0.95 * label * 1e9 <= g.memory_bytes <= label * GiB, g.id
        assert g.bf16 == (g.bf16_tflops > 0), g.id
        assert g.fp32_tflops < g.fp16_tflops, g.id
        assert g.source.startswith("https://"), g.id
        assert g.notes, g.id


def test_cluster_shapes():
    clusters = cluster_presets()
    for c in clusters.values():
        assert c.cpu_ram_bytes_per_node % GiB == 0, c.id
        multi_node = c.num_gpus > c.gpus_per_node
        assert (c.inter_node_bandwidth_bytes_per_s > 0) == multi_node, c.id
    assert clusters["1x-rtx-4090"].cpu_ram_bytes_per_node == 64 * GiB
    assert clusters["8x-a100-80gb"].cpu_ram_bytes_per_node == 1024 * GiB
    big = clusters["64x-a100-80gb"]
    assert (big.num_gpus, big.gpus_per_node, big.inter_node_bandwidth_bytes_per_s) == (64, 8, 25e9)
    assert clusters["64x-h100-sxm"].inter_node_bandwidth_bytes_per_s == 50e9
    assert gpu_presets()[clusters["4x-rtx-4090"].gpu].nvlink_bandwidth_bytes_per_s == 0


# ---- one list of a model's linear layers; GPU architecture as a closed set (issue 8) ---------------------

@pytest.mark.parametrize("preset", sorted(model_presets()))
def test_linear_layer_list_feeds_the_parameter_counts_lora_and_speed(preset):
    from calc.contract.scenario import Scenario
    from calc.memory.engine import estimate
    from calc.speed import lora_params_per_layer

    spec = model_presets()[preset].spec  # the counts (checked against transformers above) sum this list
    assert {lin.block for lin in spec.linear_layers()} == {"attention", "mlp"}
    # peft cannot wrap Llama 4's router, and rewrites all-linear onto the experts of the MoE families it converts
    targets = "attention" if spec.family in ("llama4_text", *PEFT_EXPERT_ADAPTER_FAMILIES) else "all-linear"
    sc = Scenario(model=preset, training={"lora": {"rank": 16, "targets": targets},
                                          "attention": "sdpa" if spec.sdpa_supported else "eager"})
    per_layer = lora_params_per_layer(spec, sc.training)
    dense = spec.lora_params_per_layer(16, targets, dense=True) if spec.dense_layers else per_layer
    want = (spec.num_layers - spec.dense_layers) * per_layer + spec.dense_layers * dense
    assert estimate(sc).model.trainable_params == want == spec.lora_params(16, targets)


def test_lora_counts_agree_where_they_drifted():
    """Mixtral's experts are 3-D parameters (not nn.Linear: peft's all-linear skips them), phi-3 and GPT-2 fuse
    q/k/v: the engine and the speed model used two different lists (13.6 M vs 240 M for Mixtral)."""
    from calc.contract.scenario import Scenario
    from calc.speed import lora_params_per_layer

    for preset, want in (("mixtral-8x7b", 13_631_488), ("phi-3-mini", 25_165_824), ("gpt2", 2_359_296)):
        targets = "attention" if preset == "mixtral-8x7b" else "all-linear"  # same count: experts are no nn.Linear
        sc = Scenario(model=preset, training={"lora": {"rank": 16, "targets": targets}})
        assert lora_params_per_layer(sc.spec, sc.training) * sc.spec.num_layers == want


def test_gpu_architecture_is_a_closed_set_and_hopper_gets_its_workspace():
    from calc.contract.scenario import Scenario
    from calc.memory.engine import estimate
    from calc.memory.overhead import CUBLAS_WORKSPACE_BYTES_OLDER, CUBLAS_WORKSPACE_BYTES_SM90

    with pytest.raises(ValueError, match="architecture"):
        GpuPreset.model_validate({**gpu_presets()["h100-sxm"].model_dump(), "architecture": "Hopper (GH100)"})
    ws = {}
    for gpu in ("h100-sxm", "a100-80gb", None):
        sc = Scenario(model="gpt2", hardware={"gpu": gpu} if gpu else {})
        ws[gpu] = next(c.bytes for c in estimate(sc).components if c.key == "cublas_workspace")
    assert ws["h100-sxm"] == 2 * CUBLAS_WORKSPACE_BYTES_SM90
    assert ws["a100-80gb"] == ws[None] == 2 * CUBLAS_WORKSPACE_BYTES_OLDER  # no GPU: not Hopper's


@pytest.mark.parametrize("preset", sorted(model_presets()))
def test_total_params_is_the_linear_list_plus_the_named_other_params(preset):
    """The counts read one list of matrices (ModelSpec.linear_layers) plus named non-matmul parameters; the
    per-tensor shapes (optimizer memory) must add up to the same total, so no family's count can drift."""
    from math import prod

    spec = model_presets()[preset].spec
    moe_layers = spec.num_layers - spec.dense_layers
    linears = (moe_layers * sum(lin.params for lin in spec.linear_layers())
               + spec.dense_layers * sum(lin.params for lin in spec.linear_layers(dense=True)))
    other = spec.num_layers * sum(spec.layer_other_params().values()) + sum(spec.model_other_params().values())
    assert spec.total_params() == linears + other
    assert spec.total_params() == sum(prod(shape) * n for shape, n in spec.param_shapes())


# families or options no preset has: GLM-4.5 (qk norms, biases), MLA with attention_bias, llama's mlp_bias
_SMALL_CONFIGS = {
    "glm4_moe-toy": dict(model_type="glm4_moe", vocab_size=128, hidden_size=64, intermediate_size=96,
                         moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                         first_k_dense_replace=1, attention_bias=True, use_qk_norm=True),
    "deepseek_v3-bias-toy": dict(model_type="deepseek_v3", vocab_size=128, hidden_size=64, intermediate_size=96,
                                 moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
                                 n_group=2, topk_group=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
                                 qk_nope_head_dim=8, v_head_dim=8, attention_bias=True),
    "llama-bias-toy": dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                           mlp_bias=True),
}


def _one_config_per_family() -> list[str]:
    by_family: dict[str, str] = {}
    for pid, p in sorted(model_presets().items(), key=lambda kv: kv[1].spec.total_params()):
        by_family.setdefault(p.spec.family, pid)
    return sorted(by_family.values()) + sorted(_SMALL_CONFIGS)


@pytest.mark.parametrize("model_id", _one_config_per_family())
def test_linear_list_is_what_transformers_builds_per_layer(hf, model_id):
    """Each decoder layer transformers builds (first and last: a MoE model's dense and MoE layers) holds the
    list's matrices (one tensor each, matched by size) and nothing but them, their biases and the named rest;
    the whole (shortened) model's count is the total and the per-tensor shapes' sum."""
    from math import prod

    from calc.contract.architectures import spec_from_hf_config

    transformers, torch = hf
    cfg = dict(_SMALL_CONFIGS[model_id] if model_id in _SMALL_CONFIGS else model_presets()[model_id].config)
    spec = spec_from_hf_config(cfg)
    layers = spec.dense_layers + 1  # one MoE layer after the dense ones keeps the meta build cheap
    cfg["num_hidden_layers"] = layers
    if cfg.get("layer_types"):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_hf_config(cfg)  # the shortened model
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
            config.pad_token_id = None
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers][0]
    for index, dense in ((0, spec.dense_layers > 0), (layers - 1, False)):
        params = dict(blocks[index].named_parameters())
        linears = spec.linear_layers(dense)
        matrices = sorted(p.numel() for n, p in params.items() if p.dim() >= 2 and "bias" not in n)
        assert matrices == sorted(lin.weights for lin in linears), model_id
        other = sum(spec.layer_other_params().values())
        assert sum(p.numel() for p in params.values()) == sum(lin.params for lin in linears) + other, model_id
    total = sum(p.numel() for p in model.parameters())
    assert total == spec.total_params() == sum(prod(shape) * n for shape, n in spec.param_shapes()), model_id


def test_one_preset_is_read_alone_and_equals_the_full_load():
    """A command about one model reads only its file (calc.contract.presets._spec_for_preset); the spec is the one the
    whole directory gives, and ids that are not file names still get the full list's error."""
    _clear_caches()
    alone = presets.resolve_model("llama-3.1-8b")
    assert presets.model_presets.cache_info().currsize == 0  # nothing else was read
    with pytest.raises(ValueError, match="unknown model preset"):
        presets.resolve_model("../models/llama-3.1-8b")
    assert alone == model_presets()["llama-3.1-8b"].spec
    _clear_caches()

"""A config.json is accepted only if transformers would build and run it (calc.contract.hf_rules), checked with
transformers itself: for every family the presets hold, a small valid config is built on the meta device, a tiny
copy runs one forward, and our boundary accepts it; then each mutation of a set of hostile edits is given to
transformers (config init, meta-device build, tiny forward) and to our boundary, and the two must agree: every
refusal of ours is one transformers makes too, and every refusal of transformers in the set is ours.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

from calc.contract.architectures import spec_from_hf_config
from calc.contract.errors import UserError
from calc.contract.hf_rules import HF_ACTIVATIONS, HF_LAYER_TYPES, ROPE_REQUIRED_KEYS, activation_key
from calc.contract.presets import model_presets

pytestmark = pytest.mark.slow

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
TINY_MOE = dict(num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8,
                qk_nope_head_dim=8, v_head_dim=8)


def _family_configs() -> dict[str, dict[str, Any]]:
    """One preset's config per family, the smallest first, shrunk to a few thousand parameters."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(model_presets().values(), key=lambda p: p.spec.total_params()):
        if p.config["model_type"] in out:
            continue
        cfg = {k: v for k, v in p.config.items() if k not in ("rope_scaling", "rope_parameters", "quantization_config")}
        cfg.update({k: v for k, v in {**TINY, **TINY_MOE}.items() if k in cfg})
        cfg.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)  # ids of the full vocabulary
        if cfg["model_type"] == "gpt2":
            cfg.update(n_embd=64, n_layer=2, n_head=4, n_positions=64)
        if cfg["model_type"] in ("deepseek_v2", "deepseek_v3"):
            cfg["num_key_value_heads"] = 4  # MLA: one latent key per query head
        if cfg.get("n_group"):
            cfg.update(n_group=2, topk_group=1)
        if cfg.get("q_lora_rank"):
            cfg["q_lora_rank"] = 24
        if cfg.get("layer_types"):
            cfg["layer_types"] = cfg["layer_types"][:2]
        for key in ("sliding_window", "attention_chunk_size"):
            if cfg.get(key):
                cfg[key] = 16
        out[cfg["model_type"]] = cfg
    return out


FAMILIES = _family_configs()


def _mutations(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    gpt2 = cfg["model_type"] == "gpt2"
    heads, kv = ("n_head", "n_head") if gpt2 else ("num_attention_heads", "num_key_value_heads")
    act = "activation_function" if gpt2 else activation_key(cfg["model_type"])
    return {
        "hidden not a multiple of heads": {heads: 6, **({} if gpt2 else {kv: 2})},
        "heads wider than hidden": {heads: 128, kv: 128},
        "head_dim 0": {"head_dim": 0},
        "head_dim negative": {"head_dim": -16},
        "head_dim odd": {"head_dim": 15},
        "head_dim other than hidden / heads": {"head_dim": 32},
        "unknown activation": {act: "swishy"},
        "layer_types too short": {"layer_types": ["full_attention"]},
        "layer_types unknown entry": {"layer_types": ["full_attention", "bogus_attention"]},
        "unknown rope type": {"rope_parameters": {"rope_type": "bogus", "rope_theta": 10000.0}},
        "rope type without its factor": {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}},
        "legacy rope_scaling missing keys": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0},
                                             "rope_theta": 10000.0},
        "linear rope with its factor": {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 10000.0}},
        "valid default rope": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "kv heads not dividing heads": {"num_key_value_heads": 3},
        "kv heads above heads": {"num_key_value_heads": 8},
        "kv heads half the heads": {"num_key_value_heads": 2},
        "top-k above the experts": {"num_experts_per_tok": 5},
        "n_group not dividing the experts": {"n_group": 3},
        "topk_group above n_group": {"topk_group": 3},
    }


def _transformers_refuses(cfg: dict[str, Any]) -> str | None:
    """Where transformers stops on this config.json: at config init, the meta-device build or a tiny forward."""
    import torch
    import transformers

    cfg = copy.deepcopy(cfg)
    model_type = cfg.pop("model_type")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = transformers.AutoConfig.for_model(model_type, **cfg)
        except Exception as exc:  # noqa: BLE001 - any refusal counts
            return f"config: {exc!r}"[:200]
        try:
            with torch.device("meta"):
                transformers.AutoModelForCausalLM.from_config(config)
        except Exception as exc:  # noqa: BLE001
            return f"build: {exc!r}"[:200]
        try:
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
            model(torch.randint(0, 100, (1, 8)))
        except Exception as exc:  # noqa: BLE001
            return f"forward: {exc!r}"[:200]
    return None


def _we_refuse(cfg: dict[str, Any]) -> str | None:
    try:
        spec_from_hf_config(copy.deepcopy(cfg))
    except UserError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 400, message
        return message
    return None


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    transformers.logging.set_verbosity_error()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_we_refuse_exactly_what_transformers_refuses(hf, family):
    base = FAMILIES[family]
    assert _transformers_refuses(base) is None and _we_refuse(base) is None, family
    disagree = []
    for name, change in _mutations(base).items():
        cfg = {**base, **change}
        theirs, ours = _transformers_refuses(cfg), _we_refuse(cfg)
        if (theirs is None) != (ours is None):
            disagree.append(f"{name}: transformers {theirs or 'accepts'} / ours {ours or 'accepts'}")
    assert not disagree, f"{family}:\n" + "\n".join(disagree)


def test_every_mutation_is_refused_somewhere_and_accepted_somewhere_else():
    """The set tests rules, not one family's quirks: each hostile edit is refused by at least one family (and the
    valid control edit by none)."""
    refused: dict[str, set[str]] = {}
    for family, base in FAMILIES.items():
        for name, change in _mutations(base).items():
            if _we_refuse({**base, **change}) is not None:
                refused.setdefault(name, set()).add(family)
    for name in _mutations(FAMILIES["llama"]):
        if name.startswith("valid"):
            assert not refused.get(name), name
        else:
            assert refused.get(name), f"{name}: no family refuses it"


def test_our_closed_sets_are_transformers_own(hf):
    from transformers.activations import ACT2FN
    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ACT2FN) == HF_ACTIVATIONS
    assert set(ALLOWED_ATTN_LAYER_TYPES) == HF_LAYER_TYPES
    assert set(ROPE_INIT_FUNCTIONS) | {"default"} == set(ROPE_REQUIRED_KEYS)


def test_gpt2_sequence_beyond_n_positions_is_refused_like_its_position_table(hf):
    """GPT-2's learned position table has n_positions rows: a longer sequence is an index error in the forward,
    and check_positions refuses it first (RoPE families run past max_position_embeddings)."""
    import torch
    import transformers

    from calc.contract.hf_rules import check_positions

    cfg = dict(FAMILIES["gpt2"])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model(torch.zeros(1, 64, dtype=torch.long))
    with pytest.raises(IndexError):
        model(torch.zeros(1, 65, dtype=torch.long))
    check_positions(spec_from_hf_config(FAMILIES["gpt2"]), 64)
    with pytest.raises(UserError, match="n_positions=64"):
        check_positions(spec_from_hf_config(FAMILIES["gpt2"]), 65)
    check_positions(spec_from_hf_config(FAMILIES["llama"]), 65)  # RoPE: no table to run past
    # the scenario asks it: a stated longer sequence is refused, no stated one takes the table's length
    from calc.contract.scenario import Scenario

    hw = {"gpu": "h100-sxm"}
    with pytest.raises(ValueError, match="n_positions=64"):
        Scenario.model_validate({"model": FAMILIES["gpt2"], "hardware": hw, "training": {"seq_len": 65}})
    with pytest.raises(ValueError, match="n_positions=64"):  # prompt + generated tokens
        Scenario.model_validate({"model": FAMILIES["gpt2"], "hardware": hw, "mode": "inference",
                                 "training": {"seq_len": 60}, "inference": {"new_tokens": 5}})
    assert Scenario.model_validate({"model": FAMILIES["gpt2"], "hardware": hw}).training.seq_len == 64


def _one_expert_configs() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(model_presets().values(), key=lambda p: p.spec.total_params()):
        spec = p.spec
        if not spec.moe or spec.family in out:
            continue
        cfg = {k: v for k, v in p.config.items() if k != "quantization_config"}
        cfg.update({k: 1 for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in cfg})
        cfg.update(num_experts_per_tok=1, num_hidden_layers=spec.dense_layers + 1)
        if cfg.get("n_group"):
            cfg.update(n_group=1, topk_group=1)
        if cfg.get("layer_types"):
            cfg["layer_types"] = cfg["layer_types"][:cfg["num_hidden_layers"]]
        out[spec.family] = cfg
    return out


@pytest.mark.parametrize("family", sorted(_one_expert_configs()))
def test_one_expert_keeps_the_router_and_the_moe_block(hf, family):
    """A MoE family with a single expert still builds its router, a 1-expert stack and its shared experts /
    dense layers (transformers' MoE block does not turn into a dense MLP): our count is transformers' count, and
    the memory engine estimates it through the MoE path."""
    import torch
    import transformers

    from calc.contract.scenario import Scenario
    from calc.engine import estimate

    cfg = _one_expert_configs()[family]
    spec = spec_from_hf_config(dict(cfg))
    hf_cfg = dict(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
        if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= config.vocab_size:
            config.pad_token_id = None
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == spec.total_params(), family
    assert any(lin.name == "router" for lin in spec.linear_layers()), family
    attention = "eager" if spec.attention_sinks else "sdpa"
    scenario = Scenario.model_validate({"model": cfg, "hardware": {"gpu": "h100-sxm"},
                                        "training": {"seq_len": 256, "attention": attention}})
    assert estimate(scenario).peak_allocated_bytes > 0

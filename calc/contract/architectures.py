"""Reading a Hugging Face config.json into a ModelSpec (calc.contract.model_spec): transformers' own defaults for
each family's config class, strict readers of the config's values, and the fields each family's config gives.
The names of calc.contract.model_spec that callers import from here are re-exported (ModelSpec, the family sets,
per_spec).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from calc.contract.boundary import excerpt, problem, require
from calc.contract.errors import UserError
from calc.contract.hf_rules import MLA, NO_KV_HEADS, activation_key, check_config, head_dim
from calc.contract.i18n import T_
from calc.contract.limits import MAX_LAYERS
from calc.contract.model_spec import (
    ALL_LINEAR_LORA_REFUSED,
    GEMMA_FAMILIES,
    PEFT_EXPERT_ADAPTER_FAMILIES,
    QK_NORM_FAMILIES,
    QWEN_WINDOW_FAMILIES,
    SUPPORTED_FAMILIES,
    Family,
    Linear,
    ModelSpec,
    default_lora_targets,
    per_spec,
)
from calc.contract.multimodal import WRAPPERS, read_wrapper, vision_params

__all__ = ["ALL_LINEAR_LORA_REFUSED", "GEMMA_FAMILIES", "PEFT_EXPERT_ADAPTER_FAMILIES", "QK_NORM_FAMILIES",
           "QWEN_WINDOW_FAMILIES", "SUPPORTED_FAMILIES", "Family", "Linear", "ModelSpec", "default_lora_targets",
           "per_spec", "spec_from_hf_config"]

# transformers' own defaults for each config class (transformers 5.x `AutoConfig.for_model`),
# so a partial config.json resolves exactly as `AutoConfig` would resolve it.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, hidden_act="silu", max_position_embeddings=2048,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False, attention_dropout=0.0),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                    max_position_embeddings=131072, tie_word_embeddings=False, attention_dropout=0.0),
    "qwen2": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, hidden_act="silu", max_position_embeddings=32768,
                  tie_word_embeddings=False, attention_dropout=0.0),
    "qwen3": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, head_dim=128, hidden_act="silu", max_position_embeddings=32768,
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0),
    "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                 activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                 tie_word_embeddings=True),
    "gpt_neox": dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                     intermediate_size=24576, hidden_act="gelu", attention_dropout=0.0, hidden_dropout=0.0,
                     max_position_embeddings=2048, tie_word_embeddings=False, use_parallel_residual=True,
                     attention_bias=True),
    "phi3": dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=32, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                 hidden_act="silu", max_position_embeddings=4096, tie_word_embeddings=False),
    "gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                   tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0, sliding_window=4096),
    "mixtral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                    max_position_embeddings=131072, tie_word_embeddings=False, attention_dropout=0.0,
                    num_experts_per_tok=2, num_local_experts=8),
    "qwen3_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768,
                      tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, num_experts=128,
                      num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[]),
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_hidden_layers=61, num_attention_heads=128, hidden_act="silu",
                        max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
                        attention_dropout=0.0, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                        first_k_dense_replace=3, norm_topk_prob=True, n_group=8, topk_group=4, q_lora_rank=1536,
                        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
    "deepseek_v2": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1407,
                        num_hidden_layers=32, num_attention_heads=32, hidden_act="silu", max_position_embeddings=2048,
                        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, n_routed_experts=64,
                        n_shared_experts=2, first_k_dense_replace=0, q_lora_rank=1536, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, topk_method="greedy",
                        n_group=None, topk_group=None),
    "gpt_oss": dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
                    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
                    num_experts_per_tok=4, sliding_window=128, attention_bias=True, tie_word_embeddings=False,
                    max_position_embeddings=131072, hidden_act="silu", attention_dropout=0.0),
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                        tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
                        final_logit_softcapping=None, attn_logit_softcapping=None, sliding_window=4096,
                        sliding_window_pattern=6),
    "llama4_text": dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                        max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=False,
                        attention_dropout=0.0, num_local_experts=16, num_experts_per_tok=1, use_qk_norm=True,
                        attention_chunk_size=8192, interleave_moe_layer_step=1, no_rope_layer_interval=4,
                        attn_temperature_tuning=True),
    "glm4_moe": dict(vocab_size=151552, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
                     num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8, hidden_act="silu",
                     max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=False,
                     attention_dropout=0.0, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8,
                     first_k_dense_replace=1, norm_topk_prob=True, n_group=1, topk_group=1, use_qk_norm=False,
                     partial_rotary_factor=0.5),
}

# ModelSpec field -> the config.json key it is read from (for error messages)
_CONFIG_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads", "num_experts": "num_local_experts",
                "experts_per_token": "num_experts_per_tok"}

# GPT-2 config keys use their own names; everything else uses the Llama names.
_GPT2_KEYS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
              "activation_function": "hidden_act"}


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def spec_from_hf_config(config: dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json dict, filling transformers' defaults."""
    if not isinstance(config, dict):
        raise UserError(T_("model config must be a JSON object (a config.json dict)"))
    text = read_wrapper(config)
    if text is not None:  # a multimodal wrapper: its language model, with the vision side's weights
        spec = spec_from_hf_config(text, name)
        return ModelSpec.model_validate({**dict(spec), "wrapper": config["model_type"],
                                         "vision_params": vision_params(config, spec.hidden_size)})
    family = config.get("model_type")
    if not isinstance(family, str) or family not in _HF_DEFAULTS:
        raise UserError(T_("unsupported model_type {family}; supported: {supported}", family=excerpt(family),
                           supported=", ".join((*SUPPORTED_FAMILIES, *WRAPPERS))))
    explicit_none = ("n_inner", "q_lora_rank")  # None means something for these (4 x hidden; no q bottleneck)
    cfg = {**_HF_DEFAULTS[family], **{k: v for k, v in config.items() if v is not None or k in explicit_none}}
    if family == "gpt2":
        cfg = {_GPT2_KEYS.get(k, k): v for k, v in cfg.items()}
    try:
        check_config(family, cfg)  # what transformers itself would refuse, before any field is read
        return _build_spec(family, cfg, name)
    except ValidationError as exc:  # a bound of ModelSpec: name the config.json key, not ours
        err = exc.errors(include_url=False, include_input=False)[0]
        key = _CONFIG_KEYS.get(str(err["loc"][0]), str(err["loc"][0])) if err["loc"] else "config"
        raise UserError(lambda lang: f"{key}: {problem(err, lang)}") from None
    except (TypeError, KeyError, ZeroDivisionError) as exc:
        raise UserError(T_("bad {family} config: {reason}", family=family, reason=excerpt(str(exc)))) from None


# Strict readers of config.json values: JSON integers for sizes (no true, no 4096.7), booleans for
# flags (no "false"), finite numbers for rates. A wrong type names the key instead of being coerced.
def _int(cfg: dict[str, Any], *keys: str, default: Any = None) -> int:
    value = require(_first(cfg, *keys, default=default), int, keys[0])
    if value < 1:
        raise UserError(T_("{key} must be >= 1, got {value}", key=keys[0], value=value))
    return value


def _flag(cfg: dict[str, Any], key: str, default: bool = False) -> bool:
    return require(_first(cfg, key, default=default), bool, key)


def _rate(cfg: dict[str, Any], *keys: str, default: float) -> float:
    return float(require(_first(cfg, *keys, default=default), (int, float), keys[0]))


def _optional_number(cfg: dict[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    return None if value is None else float(require(value, (int, float), key))


def _build_spec(family: str, cfg: dict[str, Any], name: str | None) -> ModelSpec:
    """The ModelSpec of a config (transformers' defaults filled in): the fields every family reads, then the
    family's own, then the sliding window of the families that attend through one."""
    fields, rope = _common_fields(family, cfg, name)
    family_fields = _FAMILY_FIELDS.get(family)
    if family_fields is not None:
        fields.update(family_fields(cfg, rope))
    fields.update(_window_fields(family, cfg, fields["num_layers"]))
    if family == "phi3":
        fields["rotary_fraction"] = _rate(rope, "partial_rotary_factor", default=1.0)
    if family in QK_NORM_FAMILIES:
        fields["qk_norm"] = True
    return ModelSpec(**fields)


def _common_fields(family: str, cfg: dict[str, Any], name: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields every family reads, under the Llama names (GPT-2's are renamed before), and the config's
    rope_parameters (a JSON object, read by some families)."""
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    # MLA's head width is its q/k width (qk_nope_head_dim + qk_rope_head_dim, set by _mla_fields)
    width = 1 if family in MLA else head_dim(family, cfg, hidden, heads)
    # gpt2's n_inner: null means 4 x hidden; any given width must be a positive integer (0 is not "default")
    inner = 4 * hidden if cfg.get("intermediate_size") is None else _int(cfg, "intermediate_size")
    rope = require(cfg.get("rope_parameters", {}), dict, "rope_parameters")
    return dict(
        family=family,
        name=name,
        vocab_size=_int(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads if family in NO_KV_HEADS else _int(cfg, "num_key_value_heads", default=heads),
        head_dim=width,
        intermediate_size=inner,
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings"),
        hidden_act=require(cfg.get(activation_key(family), "silu"), str, activation_key(family)),
        attention_dropout=_rate(cfg, "attention_dropout", "attn_pdrop", default=0.0),
        hidden_dropout=_rate(cfg, "hidden_dropout", "resid_pdrop", default=0.0),
        embedding_dropout=_rate(cfg, "embd_pdrop", default=0.0),
    ), rope


def _attention_bias(cfg: dict[str, Any]) -> dict[str, Any]:
    """attention_bias: biases on q, k, v and o."""
    bias = _flag(cfg, "attention_bias")
    return dict(qkv_bias=bias, o_bias=bias)


def _llama(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(_attention_bias(cfg), mlp_bias=_flag(cfg, "mlp_bias"))


def _qwen2(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(qkv_bias=True)


def _qwen3(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return _attention_bias(cfg)


def _gpt2(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(qkv_bias=True, o_bias=True, mlp_bias=True, parallel_residual=False)


def _gpt_neox(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    bias = _flag(cfg, "attention_bias", True)
    return dict(qkv_bias=bias, o_bias=bias, mlp_bias=True, parallel_residual=_flag(cfg, "use_parallel_residual", True),
                rotary_fraction=_rate(rope, "partial_rotary_factor", default=_rate(cfg, "rotary_pct", default=0.25)))


def _gpt_oss(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(_attention_bias(cfg), num_experts=_int(cfg, "num_local_experts"),
                experts_per_token=_int(cfg, "num_experts_per_tok"), sliding_window=_int(cfg, "sliding_window"),
                layer_types=_layer_types(cfg, default=("sliding_attention", "full_attention")),
                attention_sinks=True, expert_bias=True, router_renorm=False)


def _deepseek_v2(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    if require(cfg.get("topk_method", "greedy"), str, "topk_method") != "greedy":
        raise UserError(T_("deepseek_v2 with topk_method group_limited_greedy is not supported; use greedy"))
    return dict(_mla_fields(cfg, _int(cfg, "num_attention_heads")), rope_complex=True, router_fp32_softmax=True,
                **_routed_moe_fields({**cfg, "n_group": 0, "norm_topk_prob": False}))


def _deepseek_v3(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(_mla_fields(cfg, _int(cfg, "num_attention_heads")), **_routed_moe_fields(cfg))


def _glm4_moe(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(qkv_bias=_flag(cfg, "attention_bias"), qk_norm=_flag(cfg, "use_qk_norm"), **_routed_moe_fields(cfg),
                rotary_fraction=_rate(rope, "partial_rotary_factor",
                                      default=_rate(cfg, "partial_rotary_factor", default=0.5)))


def _llama4_text(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return _llama4_fields(cfg)


def _softcapping(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(final_logit_softcapping=_optional_number(cfg, "final_logit_softcapping"),
                attn_logit_softcapping=_optional_number(cfg, "attn_logit_softcapping"))


def _gemma3_text(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(_attention_bias(cfg), **_softcapping(cfg), sliding_window=_int(cfg, "sliding_window"),
                layer_types=_gemma3_layer_types(cfg))


def _gemma2(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(_attention_bias(cfg), **_softcapping(cfg))


def _mixtral(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    return dict(num_experts=_int(cfg, "num_local_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"))


def _qwen3_moe(cfg: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    if _int(cfg, "decoder_sparse_step") != 1 or require(cfg.get("mlp_only_layers", []), list, "mlp_only_layers"):
        raise UserError(T_("qwen3_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers) is not "
                           "supported; every layer must be a MoE layer"))
    return dict(_attention_bias(cfg), num_experts=_int(cfg, "num_experts"),
                experts_per_token=_int(cfg, "num_experts_per_tok"),
                intermediate_size=_int(cfg, "moe_intermediate_size"), router_renorm=_flag(cfg, "norm_topk_prob"))


# each family's own fields (from its config and its rope_parameters); Mistral and Phi-3 have none
_FAMILY_FIELDS: dict[str, Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3, "glm4_moe": _glm4_moe, "llama4_text": _llama4_text,
    "gemma3_text": _gemma3_text, "gemma2": _gemma2, "mixtral": _mixtral, "qwen3_moe": _qwen3_moe,
}


def _window_fields(family: str, cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """Every layer attends through config.sliding_window when it is set (Mistral, Mixtral, Phi-3: the model builds
    create_sliding_window_causal_mask); Qwen's configs null it unless use_sliding_window."""
    if not (family in ("mistral", "mixtral", "phi3")
            or (family in QWEN_WINDOW_FAMILIES and _flag(cfg, "use_sliding_window"))):
        return {}
    window = cfg.get("sliding_window")  # null or 0: no window (transformers' convention)
    fields: dict[str, Any] = {"sliding_window": _int(cfg, "sliding_window") if window not in (None, 0) else None}
    if family in ("qwen2", "qwen3") and fields["sliding_window"] is not None:
        fields.update(_qwen_window_layers(cfg, layers))
    return fields


def _gemma3_layer_types(cfg: dict[str, Any]) -> tuple[str, ...]:
    """Gemma3TextConfig: the config's layer_types, else every `sliding_window_pattern`-th layer global
    (the repeating unit is kept, not one entry per layer)."""
    if cfg.get("layer_types"):
        return _layer_types(cfg, default=())
    pattern = _int(cfg, "sliding_window_pattern", default=6)
    if pattern > MAX_LAYERS:
        raise UserError(T_("sliding_window_pattern must be <= {limit}, got {value}", limit=MAX_LAYERS, value=pattern))
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(pattern))


def _llama4_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Llama4TextConfig (Llama 4 Scout): every layer a MoE layer (each token through every expert, scaled
    by its sigmoid router score, plus one shared expert as wide as an expert); RoPE layers attend in chunks
    of attention_chunk_size (the engine's "sliding" kind: the same mask is built once kv_length reaches
    it) and every no_rope_layer_interval-th layer is a NoPE layer with global attention."""
    layers = _int(cfg, "num_hidden_layers")
    step = _int(cfg, "interleave_moe_layer_step")
    moe_layers = cfg.get("moe_layers")
    if step != 1 or (moe_layers is not None and require(moe_layers, list, "moe_layers") != list(range(layers))):
        raise UserError(T_("llama4_text with dense layers (interleave_moe_layer_step != 1 or moe_layers) is not "
                           "supported; every layer must be a MoE layer (Llama 4 Scout)"))
    no_rope = cfg.get("no_rope_layers")
    if no_rope:
        flags = tuple(require(v, int, "no_rope_layers") for v in require(no_rope, list, "no_rope_layers")[:MAX_LAYERS])
    else:
        interval = _int(cfg, "no_rope_layer_interval")
        flags = tuple(int((i + 1) % interval != 0) for i in range(min(interval, MAX_LAYERS)))
    types = tuple("sliding_attention" if f else "full_attention" for f in flags)
    return dict(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                num_experts=_int(cfg, "num_local_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"),
                shared_experts=1, router_renorm=False, rope_complex=True,
                sliding_window=_int(cfg, "attention_chunk_size"), layer_types=types,
                qk_l2_norm=_flag(cfg, "use_qk_norm"),
                # Meta's config.json writes attn_temperature_tuning as 4 (truthy), transformers as a bool
                attn_temperature_tuning=bool(require(cfg["attn_temperature_tuning"], (bool, int),
                                                     "attn_temperature_tuning")))


def _qwen_window_layers(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """Qwen2 / Qwen3 with use_sliding_window: the config's layer_types, else layers from
    max_window_layers (default 28) on slide and the ones below attend fully (Qwen2Config.__post_init__).
    With no sliding layer the model builds no window mask, so the window is dropped."""
    first = _count(cfg, "max_window_layers") if "max_window_layers" in cfg else 28
    default = tuple("sliding_attention" if i >= first else "full_attention" for i in range(min(layers, MAX_LAYERS)))
    types = _layer_types(cfg, default=default)
    if "sliding_attention" not in types:
        return {"sliding_window": None}
    return {"layer_types": None if "full_attention" not in types else types}


def _layer_types(cfg: dict[str, Any], default: tuple[str, ...]) -> tuple[str, ...]:
    """config.json's layer_types: a list of strings (each checked by ModelSpec); `default` when absent."""
    types = cfg.get("layer_types")
    if types is None:
        return default
    types = require(types, list, "layer_types")
    return tuple(require(t, str, "layer_types") for t in types[:MAX_LAYERS + 1])


def _count(cfg: dict[str, Any], key: str) -> int:
    """A count that may be 0 (shared experts, dense layers, router groups); null counts as 0."""
    value = cfg.get(key)
    value = 0 if value is None else require(value, int, key)
    if value < 0:
        raise UserError(T_("{key} must be >= 0, got {value}", key=key, value=value))
    return value


def _mla_fields(cfg: dict[str, Any], heads: int) -> dict[str, Any]:
    """DeepSeek-V2/V3 multi-head latent attention: one kv head per q head, q/k heads nope + rope wide."""
    rope_dim = _int(cfg, "qk_rope_head_dim")
    return dict(num_kv_heads=heads, head_dim=_int(cfg, "qk_nope_head_dim") + rope_dim,
                qkv_bias=_flag(cfg, "attention_bias"), q_lora_rank=_count(cfg, "q_lora_rank"),
                kv_lora_rank=_int(cfg, "kv_lora_rank"), qk_rope_head_dim=rope_dim, v_head_dim=_int(cfg, "v_head_dim"))


def _routed_moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3 / GLM-4.5 MoE: routed experts behind a sigmoid group-limited router, shared experts,
    and first_k_dense_replace dense layers."""
    return dict(num_experts=_int(cfg, "n_routed_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"),
                intermediate_size=_int(cfg, "moe_intermediate_size"),
                dense_intermediate_size=_int(cfg, "intermediate_size"),
                dense_layers=min(_count(cfg, "first_k_dense_replace"), _int(cfg, "num_hidden_layers")),
                shared_experts=_count(cfg, "n_shared_experts"), router_groups=_count(cfg, "n_group"),
                router_renorm=_flag(cfg, "norm_topk_prob"))

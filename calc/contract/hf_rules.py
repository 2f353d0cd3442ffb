"""What transformers refuses in a config.json, refused here first with the same reason in one line.

A config.json is accepted only if transformers would build and run it (transformers 5.23: its config classes'
`@strict` validators, `__post_init__` and modeling code). These are our rules, each citing the behaviour it
mirrors; tests/calc/contract/test_hf_rules.py builds every family's small config and each mutation with
transformers itself (config init, a meta-device build and one tiny forward) and checks that we refuse exactly what
transformers refuses. Called by calc.contract.architectures.spec_from_hf_config on the config with transformers'
defaults filled in (GPT-2's keys renamed to the Llama names), before any field is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calc.contract.boundary import excerpt, require
from calc.contract.errors import UserError
from calc.contract.i18n import T_

if TYPE_CHECKING:
    from calc.contract.model_spec import ModelSpec

# transformers/activations.py ACT2CLS: the names `ACT2FN[config.hidden_act]` resolves (a KeyError at build otherwise)
HF_ACTIVATIONS = frozenset({
    "gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
    "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu", "relu",
    "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu",
})
# transformers/configuration_utils.py ALLOWED_ATTN_LAYER_TYPES: validate_layer_type refuses any other entry
HF_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "reference_sliding_attention", "linear_attention",
})
# modeling_rope_utils.py: ROPE_INIT_FUNCTIONS (a KeyError at build for any other rope_type) plus "default", and
# the keys each type's _validate_<type>_rope_parameters requires (a KeyError at config init when one is missing;
# original_max_position_embeddings and rope_theta are filled in by standardize_rope_params).
ROPE_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "proportional": (),
}
PHI3_ROPE_TYPES = ("default", "longrope")  # Phi3Config.validate_rope
# Families whose config class checks hidden_size % num_attention_heads (validate_architecture: Llama, GPT-NeoX,
# Gemma 2 / 3, DeepSeek-V2) or whose attention does (GPT2Attention.__init__); the others size q by head_dim.
HEADS_DIVIDE_HIDDEN = ("llama", "gpt2", "gpt_neox", "gemma2", "gemma3_text", "deepseek_v2")
NO_ROPE = ("gpt2",)  # learned absolute positions (wpe)
MLA = ("deepseek_v2", "deepseek_v3")
GROUP_ROUTED = ("deepseek_v3", "glm4_moe")  # router_logits.view(-1, n_group, n_routed_experts // n_group)
NO_KV_HEADS = ("gpt2", "gpt_neox")  # multi-head attention: num_key_value_heads is not read


def activation_key(family: str) -> str:
    """The config key the family's MLP reads its activation from (Gemma: hidden_activation; GPT-2's
    activation_function is renamed to hidden_act before)."""
    return "hidden_activation" if family in ("gemma2", "gemma3_text") else "hidden_act"


def head_dim(family: str, cfg: dict[str, Any], hidden: int, heads: int) -> int:
    """The attention head width transformers builds: `getattr(config, "head_dim", hidden // heads)` in most
    families (a given 0 is used, and fails), `head_dim or hidden // heads` in Mistral and Mixtral (0 means unset),
    and hidden // heads where attention ignores head_dim (GPT-2, GPT-NeoX). Refused when it is not >= 1."""
    given = cfg.get("head_dim")
    if family in ("gpt2", "gpt_neox") or given is None or (family in ("mistral", "mixtral") and given == 0):
        value = hidden // heads
        if value < 1:
            raise UserError(T_("hidden_size={hidden} / num_attention_heads={heads} gives head_dim 0; transformers "
                               "cannot build a zero-width head", hidden=hidden, heads=heads))
        return value
    value = require(given, int, "head_dim")
    if value < 1:
        raise UserError(T_("{key} must be >= 1, got {value}", key="head_dim", value=value))
    return value


def check_config(family: str, cfg: dict[str, Any]) -> None:
    """Every rule below, in the order transformers meets them (config init, build, forward)."""
    _layer_types(cfg)
    hidden, heads = _positive(cfg, "hidden_size"), _positive(cfg, "num_attention_heads")
    if family in HEADS_DIVIDE_HIDDEN and hidden % heads:
        raise UserError(T_("hidden_size={hidden} is not a multiple of num_attention_heads={heads}, which {family} "
                           "requires", hidden=hidden, heads=heads, family=family))
    if family not in ("deepseek_v2", "deepseek_v3"):
        head_dim(family, cfg, hidden, heads)
    _rope(family, cfg)
    if family not in NO_ROPE:
        _even_rotary(family, cfg, hidden, heads)
    if family != "gpt_oss":  # gpt-oss's experts run their own clamped SwiGLU; hidden_act is not read
        key = activation_key(family)
        act = require(cfg.get(key, "silu"), str, key)
        if act not in HF_ACTIVATIONS:
            raise UserError(T_("{key}: unknown activation function {act}; transformers has {known} and others", key=key,
                               act=excerpt(act), known="silu, gelu, gelu_new, gelu_pytorch_tanh, relu, quick_gelu"))
    if family == "gpt_neox" and require(cfg.get("head_dim") or 0, int, "head_dim") < 0:
        # GPTNeoXRotaryEmbedding: `head_dim or hidden_size // num_attention_heads` sizes the rotary table
        raise UserError(T_("{key} must be >= 1, got {value}", key="head_dim", value=cfg["head_dim"]))
    if family in MLA:
        _mla(family, cfg, heads)
    if family in GROUP_ROUTED:
        _router_groups(cfg)


def _positive(cfg: dict[str, Any], key: str) -> int:
    value = require(cfg.get(key), int, key)
    if value < 1:
        raise UserError(T_("{key} must be >= 1, got {value}", key=key, value=value))
    return value


def _layer_types(cfg: dict[str, Any]) -> None:
    """PreTrainedConfig.validate_layer_type (every family): each entry a known layer type, one per layer."""
    types = cfg.get("layer_types")
    if types is None:
        return
    types = require(types, list, "layer_types")
    for t in types:
        if require(t, str, "layer_types") not in HF_LAYER_TYPES:
            raise UserError(T_("layer_types: unknown entry {entry}; transformers allows layer types such as "
                               "full_attention and sliding_attention", entry=excerpt(t)))
    layers = cfg.get("num_hidden_layers")
    if isinstance(layers, int) and len(types) != layers:
        raise UserError(T_("layer_types has {n} entries but num_hidden_layers is {layers}; transformers needs one "
                           "per layer", n=len(types), layers=layers))


def rope_dicts(family: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The RoPE parameter dicts transformers validates and builds from: the legacy rope_scaling, else
    rope_parameters (PreTrainedConfig.convert_rope_params_to_dict; Gemma 3 always nests a full_attention dict,
    which rope_scaling updates, and a sliding_attention one: Gemma3TextConfig.convert_rope_params_to_dict), and
    of a nested dict only the entries named by a layer type the config declares (nested_rope_parameter_keys)."""
    params, legacy = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    if params is not None:
        require(params, dict, "rope_parameters")
    if legacy is not None:
        require(legacy, dict, "rope_scaling")
    if family == "gemma3_text":
        params = dict(params or {})
        params["full_attention"] = {"rope_type": "default", **require(params.get("full_attention") or {}, dict,
                                                                      "rope_parameters"), **(legacy or {})}
        params["sliding_attention"] = params.get("sliding_attention") or {"rope_type": "default"}
    else:
        params = legacy or params
    if not params:
        return []
    labels = declared_layer_types(family, cfg)
    nested = [params[k] for k in params if k in labels and params[k] is not None]
    if not any(k in labels for k in params):
        return [params]
    return [require(d, dict, "rope_parameters") for d in nested]


def declared_layer_types(family: str, cfg: dict[str, Any]) -> set[str]:
    """The layer types a family's config declares after its __post_init__: the config's own list, else Gemma 3's
    sliding_window_pattern, Gemma 2's and gpt-oss's alternation, Qwen's max_window_layers, Llama 4's NoPE layers."""
    if isinstance(cfg.get("layer_types"), list):
        return {t for t in cfg["layer_types"] if isinstance(t, str)}
    layers = cfg.get("num_hidden_layers") if isinstance(cfg.get("num_hidden_layers"), int) else 0
    if family == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern", 6)
        pattern = pattern if isinstance(pattern, int) and pattern > 0 else 6
        return ({"sliding_attention"} if pattern > 1 and layers else set()) | (
            {"full_attention"} if layers >= pattern else set())
    if family in ("gemma2", "gpt_oss"):
        return ({"sliding_attention"} if layers else set()) | ({"full_attention"} if layers >= 2 else set())
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        first = cfg.get("max_window_layers", 28)
        sliding = cfg.get("use_sliding_window") is True and cfg.get("sliding_window") is not None
        first = first if isinstance(first, int) else 28
        return ({"full_attention"} if not sliding or first > 0 else set()) | (
            {"sliding_attention"} if sliding and layers > first else set())
    if family == "llama4_text":
        return {"chunked_attention", "full_attention"} if layers else set()
    return set()


def _rope(family: str, cfg: dict[str, Any]) -> None:
    """Every config validates its RoPE parameters' keys at init (GPT-2's too, which never builds a rotary
    embedding); an unknown rope_type is a KeyError where the rotary embedding is built, and Phi-3's config allows
    only two types."""
    for params in rope_dicts(family, cfg):
        rope_type = params.get("rope_type", params.get("type", "default"))
        known = PHI3_ROPE_TYPES if family == "phi3" else tuple(ROPE_REQUIRED_KEYS)
        if family in NO_ROPE and rope_type not in ROPE_REQUIRED_KEYS:
            continue
        if not isinstance(rope_type, str) or rope_type not in known:
            raise UserError(T_("rope_parameters: unknown rope_type {rope_type}; {family} allows {known}",
                               rope_type=excerpt(rope_type), family=family, known=", ".join(known)))
        missing = [k for k in ROPE_REQUIRED_KEYS[rope_type] if k not in params]
        if missing:
            raise UserError(T_("rope_parameters: rope_type {rope_type} needs {keys}", rope_type=rope_type,
                               keys=", ".join(missing)))


def _even_rotary(family: str, cfg: dict[str, Any], hidden: int, heads: int) -> None:
    """RotaryEmbeddingConfigMixin.validate_rope: a head wider than 4 that RoPE rotates whole must be even."""
    if family == "deepseek_v2":  # its config's head_dim is not what RoPE rotates (qk_rope_head_dim is)
        return
    width = cfg.get("qk_rope_head_dim") if family == "deepseek_v3" and cfg.get("head_dim") is None else None
    width = width if width is not None else head_dim(family, cfg, hidden, heads)
    for params in rope_dicts(family, cfg) or [{}]:
        factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", _rotary_default(family, cfg)))
        if not isinstance(factor, (int, float)) or isinstance(factor, bool):
            continue  # a wrong type is named by the reader of partial_rotary_factor
        if width > 4 and width % 2 and int(width * factor) == width:
            raise UserError(T_("head_dim={width} is odd: RoPE rotates pairs of channels, so a fully rotated head "
                               "must be even", width=width))


def _rotary_default(family: str, cfg: dict[str, Any]) -> Any:
    return cfg.get("rotary_pct", 0.25) if family == "gpt_neox" else 1.0


def _mla(family: str, cfg: dict[str, Any], heads: int) -> None:
    """DeepSeek-V2/V3 attention keeps one latent key per query head, and repeat_kv still repeats it
    num_attention_heads // num_key_value_heads times (a shape mismatch in the forward unless that is 1);
    DeepSeek-V3 sizes its rotary embedding by config.head_dim, which its config sets to qk_rope_head_dim."""
    kv = cfg.get("num_key_value_heads")
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or heads // kv != 1):
        raise UserError(T_("{family}: num_key_value_heads={kv} must equal num_attention_heads={heads} (multi-head "
                           "latent attention keeps a key per query head)", family=family, kv=excerpt(kv),
                           heads=heads))
    if family == "deepseek_v3" and cfg.get("head_dim") is not None and cfg["head_dim"] != cfg.get("qk_rope_head_dim"):
        raise UserError(T_("deepseek_v3: head_dim={head_dim} must equal qk_rope_head_dim={rope} (its rotary embedding "
                           "is sized by head_dim)", head_dim=excerpt(cfg["head_dim"]),
                           rope=excerpt(cfg.get("qk_rope_head_dim"))))


def _router_groups(cfg: dict[str, Any]) -> None:
    """DeepseekV3TopkRouter / Glm4MoeTopkRouter: router_logits.view(-1, n_group, n_routed_experts // n_group),
    then topk(topk_group) over the groups."""
    groups = require(cfg.get("n_group") if cfg.get("n_group") is not None else 1, int, "n_group")
    experts = require(cfg.get("n_routed_experts"), int, "n_routed_experts")
    if groups < 1 or experts % groups:
        raise UserError(T_("n_group={groups} must divide n_routed_experts={experts} (the router splits the experts "
                           "into equal groups)", groups=groups, experts=experts))
    topk_group = require(cfg.get("topk_group") if cfg.get("topk_group") is not None else 1, int, "topk_group")
    if not 0 <= topk_group <= groups:
        raise UserError(T_("topk_group={topk} must be between 0 and n_group={groups}", topk=topk_group, groups=groups))


# ---- rules on a model together with the job (Scenario._fits_model) ----------------------------------------------

def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Tensor parallelism splits attention by whole heads. transformers' tp_plan shards q/k/v column-wise as
    DTensor Shard(0) (torch.chunk sizes: a head cut across ranks, and the forward's view to head_dim fails; its
    generate() reports such a model "cannot be evenly sharded by head": distributed/tensor_parallel.py
    get_kv_heads_per_rank), and DeepSpeed AutoTP hands out whole KV-head groups, num_kv_heads // tp plus one to
    the first num_kv_heads % tp ranks (module_inject/tp_shard.py get_shard_size), so with fewer groups than ranks
    some ranks hold no attention and the others twice the even share. The estimate models even shards: the
    tensor-parallel size must divide the KV heads (and so the attention heads)."""
    if spec.num_heads % tp:
        raise UserError(T_("tensor_parallel={tp} must divide the {heads} attention heads", tp=tp,
                           heads=spec.num_heads))
    if spec.num_kv_heads % tp:
        raise UserError(T_("tensor_parallel={tp} must divide the {kv_heads} key/value heads: transformers cannot "
                           "split a head across ranks and DeepSpeed AutoTP gives each rank whole key/value head "
                           "groups, so some ranks would hold no attention; use a tensor_parallel that divides "
                           "{kv_heads}", tp=tp, kv_heads=spec.num_kv_heads))


def longest_sequence(spec: ModelSpec) -> int | None:
    """The most tokens a sequence of this model can hold: GPT-2's learned position table (wpe) has n_positions
    rows; RoPE families compute positions on the fly and have no such bound (None)."""
    return spec.max_position_embeddings if spec.family in NO_ROPE else None


def check_positions(spec: ModelSpec, tokens: int) -> None:
    """A sequence past the learned position table indexes past it (an IndexError in the forward)."""
    limit = longest_sequence(spec)
    if limit is not None and tokens > limit:
        raise UserError(T_("{tokens} tokens per sequence exceed {family}'s n_positions={limit} (its learned position "
                           "table has one row per position)", tokens=tokens, family=spec.family,
                           limit=spec.max_position_embeddings))

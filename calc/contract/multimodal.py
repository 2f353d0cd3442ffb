"""Multimodal wrappers read as their language model: a config.json whose `text_config` holds the decoder (Gemma 3,
Mistral 3, Qwen2.5-VL, Llama 4, LLaVA) is estimated as that decoder, with the vision tower's and the projector's
weights counted as the wrapper builds them (transformers 5.23 <Wrapper>ForConditionalGeneration; the counts are
checked against it on the meta device by tests/calc/contract/test_multimodal.py). The estimate models text
sequences: the vision tower's weights are held and trained like the rest, its activations (images) are not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from calc.contract.boundary import require
from calc.contract.errors import UserError
from calc.contract.i18n import T_, Text

if TYPE_CHECKING:
    from calc.contract.model_spec import ModelSpec


class Wrapper(NamedTuple):
    text_family: str  # the decoder's model_type when text_config does not name one (the config class's default)
    vision: str  # the vision tower's reader (VISION_PARAMS)
    tie_default: bool  # the wrapper config's tie_word_embeddings default
    tie_from_text: bool  # True: the decoder's own tie_word_embeddings also ties (LLaVA-style configs)


WRAPPERS: dict[str, Wrapper] = {
    "gemma3": Wrapper("gemma3_text", "siglip", True, False),  # Gemma3Config: tie_word_embeddings = True
    "mistral3": Wrapper("mistral", "pixtral", True, False),  # Mistral3Config: tie_word_embeddings = True
    "qwen2_5_vl": Wrapper("qwen2", "qwen2_5_vl", False, True),
    "llama4": Wrapper("llama4_text", "llama4", False, True),
    "llava": Wrapper("llama", "clip", False, True),
}
# text_config model types that are one of our families under another name (same modules, same shapes):
# Qwen2.5-VL's decoder is Qwen2's (q/k/v biases) with multimodal RoPE, which changes no parameter.
TEXT_FAMILY_ALIASES = {"qwen2_5_vl_text": "qwen2"}
_NOT_TEXT = ("model_type", "vision_config", "text_config", "architectures", "quantization_config")


def read_wrapper(config: dict[str, Any]) -> dict[str, Any] | None:
    """The language model's config.json of a multimodal wrapper (its model_type one of our families, the tied
    embeddings decided as the wrapper decides them); None for a config that is no wrapper."""
    model_type = config.get("model_type")
    wrapper = WRAPPERS.get(model_type) if isinstance(model_type, str) else None
    if wrapper is None:
        return None
    text = config.get("text_config")
    if text is None:  # Qwen2.5-VL's hub configs keep the decoder's keys at the top level
        text = {k: v for k, v in config.items() if k not in _NOT_TEXT}
    text = dict(require(text, dict, "text_config"))
    family = require(text.get("model_type") or wrapper.text_family, str, "text_config.model_type")
    text["model_type"] = TEXT_FAMILY_ALIASES.get(family, family)
    outer_tie = config.get("tie_word_embeddings")
    outer_tie = wrapper.tie_default if outer_tie is None else require(outer_tie, bool, "tie_word_embeddings")
    inner_tie = require(text.get("tie_word_embeddings", False), bool, "text_config.tie_word_embeddings")
    text["tie_word_embeddings"] = outer_tie or (wrapper.tie_from_text and inner_tie)
    if family == "qwen2_5_vl_text" or config.get("text_config") is None:
        text.update(_mrope_as_default(text))
    return text


def _mrope_as_default(text: dict[str, Any]) -> dict[str, Any]:
    """Qwen2_5_VLTextConfig.convert_rope_params_to_dict: multimodal RoPE ("mrope") runs as the default type."""
    out = {}
    for key in ("rope_scaling", "rope_parameters"):
        rope = text.get(key)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "mrope":
            out[key] = {k: v for k, v in rope.items() if k not in ("type", "mrope_section")} | {"rope_type": "default"}
    return out


def vision_params(config: dict[str, Any], text_hidden: int) -> int:
    """The vision tower's and the projector's parameters, as the wrapper builds them on a text_hidden-wide decoder."""
    vision = require(config.get("vision_config") or {}, dict, "vision_config")
    return VISION_PARAMS[WRAPPERS[config["model_type"]].vision](vision, config, text_hidden)


def model_note(spec: ModelSpec) -> Text | None:
    """What the estimate says about a wrapper read as its language model (None for a plain decoder)."""
    if spec.wrapper is None:
        return None
    return T_("{wrapper} is read as its language model ({family}); the vision tower and projector add {params} "
              "parameters, counted with the weights (activations are estimated for text sequences)",
              wrapper=spec.wrapper, family=spec.family, params=f"{spec.vision_params:,}")


def _dims(vision: dict[str, Any], defaults: dict[str, Any]) -> dict[str, int]:
    """The vision config's sizes (positive JSON integers), the config class's defaults where absent."""
    out: dict[str, int] = {}
    for key, default in defaults.items():
        value = vision.get(key, default)
        if isinstance(default, bool):
            out[key] = require(value, bool, f"vision_config.{key}")
            continue
        value = require(value, int, f"vision_config.{key}")
        if value < 1:
            raise UserError(T_("{key} must be >= 1, got {value}", key=f"vision_config.{key}", value=value))
        out[key] = value
    return out


def _encoder_layer(h: int, i: int) -> int:
    """A ViT encoder layer with biases everywhere: q, k, v, out (4 x (H x H + H)), fc1 / fc2 (H x I + I,
    I x H + H) and two LayerNorms (weight + bias)."""
    return 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h


def _feature_layers(config: dict[str, Any]) -> int:
    """How many vision layers' features the projector concatenates (vision_feature_layer: an int or a list)."""
    layer = config.get("vision_feature_layer", -1)
    return len(layer) if isinstance(layer, list) else 1


def _siglip(vision: dict[str, Any], config: dict[str, Any], text_hidden: int) -> int:
    """SiglipVisionModel (Gemma 3): patch Conv2d with bias, a learned position per patch, the encoder, a
    post-LayerNorm and (vision_use_head) the attention-pooling head; Gemma3MultiModalProjector's V x T projection
    and its RMSNorm."""
    d = _dims(vision, dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_channels=3,
                           image_size=224, patch_size=16, vision_use_head=True))
    h, i = d["hidden_size"], d["intermediate_size"]
    patches = (d["image_size"] // d["patch_size"]) ** 2
    tower = (h * d["num_channels"] * d["patch_size"] ** 2 + h + patches * h + d["num_hidden_layers"] * _encoder_layer(h, i)
             + 2 * h)
    if d["vision_use_head"]:  # probe, nn.MultiheadAttention (in_proj 3H x H + 3H, out_proj), LayerNorm, MLP
        tower += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
    return tower + h * text_hidden + h


def _clip(vision: dict[str, Any], config: dict[str, Any], text_hidden: int) -> int:
    """CLIPVisionModel (LLaVA): class embedding, patch Conv2d without bias, positions for the patches and the
    class token, pre- and post-LayerNorm around the encoder; LlavaMultiModalProjector's two linears."""
    d = _dims(vision, dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_channels=3,
                           image_size=336, patch_size=14))
    h, i = d["hidden_size"], d["intermediate_size"]
    positions = (d["image_size"] // d["patch_size"]) ** 2 + 1
    tower = h + h * d["num_channels"] * d["patch_size"] ** 2 + positions * h + 2 * 2 * h \
        + d["num_hidden_layers"] * _encoder_layer(h, i)
    bias = require(config.get("multimodal_projector_bias", True), bool, "multimodal_projector_bias")
    t = text_hidden
    return tower + (h * _feature_layers(config) * t + t * bias) + (t * t + t * bias)


def _pixtral(vision: dict[str, Any], config: dict[str, Any], text_hidden: int) -> int:
    """PixtralVisionModel (Mistral 3): patch Conv2d without bias, an RMSNorm, layers of RMSNorms, bias-free q/k/v/o
    and a gated MLP; Mistral3MultiModalProjector's RMSNorm, patch merger (s^2 V -> V) and two linears."""
    d = _dims(vision, dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_channels=3,
                           patch_size=14))
    h, i = d["hidden_size"], d["intermediate_size"]
    layer = 2 * h + 4 * h * h + 3 * h * i
    tower = h * d["num_channels"] * d["patch_size"] ** 2 + h + d["num_hidden_layers"] * layer
    merge = require(config.get("spatial_merge_size", 2), int, "spatial_merge_size")
    bias = require(config.get("multimodal_projector_bias", False), bool, "multimodal_projector_bias")
    t = text_hidden
    return tower + h + h * merge * merge * h + (h * _feature_layers(config) * t + t * bias) + (t * t + t * bias)


def _qwen2_5_vl(vision: dict[str, Any], config: dict[str, Any], text_hidden: int) -> int:
    """Qwen2_5_VisionTransformerPretrainedModel: Conv3d patches without bias (temporal x patch x patch), blocks of two
    RMSNorms, a fused qkv and proj with biases and a gated MLP with biases; the merger's RMSNorm and its two
    linears over s^2 merged patches."""
    d = _dims(vision, dict(hidden_size=3584, intermediate_size=3420, depth=32, in_channels=3, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=3584))
    h, i = d["hidden_size"], d["intermediate_size"]
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * (h * i + i) + (i * h + h)
    patch = h * d["in_channels"] * d["temporal_patch_size"] * d["patch_size"] ** 2
    merged = h * d["spatial_merge_size"] ** 2
    merger = h + (merged * merged + merged) + (merged * d["out_hidden_size"] + d["out_hidden_size"])
    return patch + d["depth"] * block + merger


def _llama4(vision: dict[str, Any], config: dict[str, Any], text_hidden: int) -> int:
    """Llama4VisionModel: class embedding, positions for the patches and the class token, an unfold + bias-free
    linear patch embedding, pre/post LayerNorms, encoder layers with biases, the pixel-shuffle adapter's two
    bias-free linears; Llama4MultiModalProjector's bias-free linear to the text width."""
    d = _dims(vision, dict(hidden_size=768, intermediate_size=5632, num_hidden_layers=34, num_channels=3,
                           image_size=448, patch_size=14, vision_output_dim=7680, projector_input_dim=4096,
                           projector_output_dim=4096))
    h, i = d["hidden_size"], d["intermediate_size"]
    positions = (d["image_size"] // d["patch_size"]) ** 2 + 1
    tower = h + positions * h + h * d["num_channels"] * d["patch_size"] ** 2 + 2 * 2 * h \
        + d["num_hidden_layers"] * _encoder_layer(h, i)
    adapter = d["projector_input_dim"] * i + d["projector_output_dim"] ** 2
    return tower + adapter + d["vision_output_dim"] * text_hidden


VISION_PARAMS: dict[str, Callable[[dict[str, Any], dict[str, Any], int], int]] = {
    "siglip": _siglip, "clip": _clip, "pixtral": _pixtral, "qwen2_5_vl": _qwen2_5_vl, "llama4": _llama4,
}

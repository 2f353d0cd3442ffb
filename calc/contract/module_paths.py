"""Where each weight sits in the Hugging Face model (its module path, "model.layers.3.mlp.down_proj"), and which of
them a quantization_config's modules_to_not_convert keeps out of the conversion.

The paths are those transformers' AutoModelForCausalLM registers (checked against a model built from a config for
every family in tests/calc/contract/test_module_paths.py). The patterns follow transformers 5.23's
quantizers/quantizers_utils.py should_convert_module: a module is skipped when a pattern matches its path from the
start as a regular expression up to a module boundary ("model.layers.1" skips "model.layers.1.mlp.up_proj", not
"model.layers.11.mlp.up_proj"; "model.layers.*.self_attn" every attention block), or is a suffix of it ("lm_head").
vLLM's is_layer_skipped compares whole names, which agrees for the names a checkpoint lists.

A pattern is a regular expression of the user's: only letters, digits, "_", "." and at most MAX_STARS "*" are
accepted, so matching stays linear-ish in the name and no pattern can make an estimate hang.
"""

from __future__ import annotations

import re
from functools import lru_cache

from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.model_spec import Linear, ModelSpec

PATTERN_CHARS = re.compile(r"[A-Za-z0-9_.*]+")
MAX_PATTERNS = 4096  # Meta's FP8 405B lists 511 modules by name
MAX_PATTERN_CHARS = 200
MAX_STARS = 2  # per pattern: "model.layers.*.self_attn" has one
MAX_STARRED = 16  # patterns with a "*": real configs have a handful
BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"  # the match ends at a module boundary

LAYER_PREFIX = {"gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers"}
ATTENTION_BLOCK = {"gpt2": "attn", "gpt_neox": "attention"}
MLP_BLOCK = {"llama4_text": "feed_forward"}
SHARED_EXPERTS = {"llama4_text": "shared_expert"}  # the others: shared_experts (DeepSeek, GLM-4.5)
EMBEDDING_PATH = {"gpt2": "transformer.wte", "gpt_neox": "gpt_neox.embed_in"}


def layer_prefix(spec: ModelSpec, index: int) -> str:
    return f"{LAYER_PREFIX.get(spec.family, 'model.layers')}.{index}"


def linear_path(spec: ModelSpec, lin: Linear, index: int) -> str:
    """The module path of decoder layer `index`'s weight `lin`: an nn.Linear's own path; a routed expert stack's
    experts module (FP8Experts / Mxfp4GptOssExperts replace that module whole); a router's module."""
    prefix, family = layer_prefix(spec, index), spec.family
    if lin.block == "attention":
        return f"{prefix}.{ATTENTION_BLOCK.get(family, 'self_attn')}.{spec.module_name(lin.name)}"
    mlp = f"{prefix}.{MLP_BLOCK.get(family, 'mlp')}"
    if lin.expert:
        return f"{mlp}.experts"
    if lin.shared:
        return f"{mlp}.{SHARED_EXPERTS.get(family, 'shared_experts')}.{spec.module_name(lin.name)}"
    return f"{mlp}.{spec.module_name(lin.name)}"


def model_paths(spec: ModelSpec) -> dict[str, str]:
    """The module paths of the weights outside the decoder layers."""
    return {"embed_tokens": EMBEDDING_PATH.get(spec.family, "model.embed_tokens"), "lm_head": "lm_head"}


def check_patterns(patterns: object) -> tuple[str, ...]:
    """modules_to_not_convert as a config states it: a list of module-path patterns (UserError otherwise)."""
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise UserError(T_("the config's modules_to_not_convert must be a list of module names"))
    if len(patterns) > MAX_PATTERNS:
        raise UserError(T_("the config's modules_to_not_convert lists {n} modules; at most {limit} are read",
                           n=f"{len(patterns):,}", limit=f"{MAX_PATTERNS:,}"))
    for p in patterns:
        if len(p) > MAX_PATTERN_CHARS or not PATTERN_CHARS.fullmatch(p) or p.startswith("*") or "**" in p \
                or p.count("*") > MAX_STARS:
            raise UserError(T_("the config's modules_to_not_convert entry {entry} is not a module name: letters, "
                               "digits, '_', '.' and at most {stars} '*' (not first, not doubled), up to {chars} "
                               "characters", entry=repr(p[:40]), stars=MAX_STARS, chars=MAX_PATTERN_CHARS))
    if sum("*" in p for p in patterns) > MAX_STARRED:
        raise UserError(T_("the config's modules_to_not_convert has more than {n} patterns with '*'", n=MAX_STARRED))
    return tuple(patterns)


@lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(rf"(?:{'|'.join(patterns)}){BOUNDARY}")


def skipped(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether modules_to_not_convert (checked by check_patterns) keeps the module at `path` unconverted."""
    return bool(patterns) and (path.endswith(patterns) or _matcher(patterns).match(path) is not None)


def converted_layers(spec: ModelSpec, lin: Linear, indices: range, patterns: tuple[str, ...]) -> int:
    """How many of the decoder layers `indices` convert `lin` (the rest keep it 16-bit)."""
    if not patterns:
        return len(indices)
    return sum(not skipped(linear_path(spec, lin, i), patterns) for i in indices)

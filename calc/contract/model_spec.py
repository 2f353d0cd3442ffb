"""A decoder-only transformer's shapes, normalised across families (ModelSpec): its linear layers as transformers
registers them, and exact parameter counts that equal `sum(p.numel() for p in model.parameters())` of the
transformers implementation (checked by tests/calc/contract/test_presets.py on the meta device). Reading a Hugging
Face config.json into a ModelSpec is calc.contract.architectures; what is computed once per spec is memoized by
per_spec.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from functools import cached_property
from math import prod
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.errors import UserError
from calc.contract.i18n import T_
from calc.contract.limits import (
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_SOFTCAP,
    MAX_VISION_PARAMS,
    MAX_VOCAB,
)
from calc.memo import Memo

Family = Literal["llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "phi3", "gemma2", "mixtral", "qwen3_moe",
                 "gemma3_text", "glm4_moe", "deepseek_v3", "deepseek_v2", "gpt_oss", "llama4_text"]
SUPPORTED_FAMILIES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "phi3", "gemma2", "mixtral", "qwen3_moe", "gemma3_text",
    "glm4_moe", "deepseek_v3", "deepseek_v2", "gpt_oss", "llama4_text",
)
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe", "gemma3_text")  # per-head RMSNorm on q and k before RoPE (always)
# peft 0.21 rewrites target_modules="all-linear" on these transformers-5 MoE families (their v4 -> v5 weight
# conversion, peft/utils/transformers_weight_conversion.py _convert_peft_config_moe): adapters on the routed
# experts' 3-D weights and the router via target_parameters, and none on modules named gate_proj / up_proj /
# down_proj (shared experts, dense layers). Not modelled, so LoRA all-linear is refused there.
PEFT_EXPERT_ADAPTER_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "glm4_moe")
# Families where LoRA all-linear is refused (above; and Llama 4, whose router peft wraps and breaks): their
# adapters go on the attention projections.
ALL_LINEAR_LORA_REFUSED = (*PEFT_EXPERT_ADAPTER_FAMILIES, "llama4_text")


def default_lora_targets(family: str) -> str:
    """The LoRA targets a recommendation uses: every linear layer, or the attention projections where
    all-linear is refused (ALL_LINEAR_LORA_REFUSED)."""
    return "attention" if family in ALL_LINEAR_LORA_REFUSED else "all-linear"
# The Hugging Face module name of each calc linear (the last component of its module path, which peft's
# target_modules list matches), the Llama names, then each family's own (transformers 5.x modeling_<family>.py).
HF_MODULE_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "qkv": "qkv_proj",
                   "q_a": "q_a_proj", "q_b": "q_b_proj", "kv_a": "kv_a_proj_with_mqa", "kv_b": "kv_b_proj",
                   "gate": "gate_proj", "up": "up_proj", "down": "down_proj", "gate_up": "gate_up_proj",
                   "shared_gate": "gate_proj", "shared_up": "up_proj", "shared_down": "down_proj",
                   "router": "gate", "lm_head": "lm_head", "embed_tokens": "embed_tokens"}
HF_FAMILY_MODULE_NAMES = {
    "gpt2": {"qkv": "c_attn", "o": "c_proj", "up": "c_fc", "down": "c_proj", "embed_tokens": "wte"},
    "gpt_oss": {"router": "router"}, "llama4_text": {"router": "router"},
    "gpt_neox": {"qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h",
                 "embed_tokens": "embed_in"},
}
# Families whose decoder layers are mixture-of-experts blocks (router, expert stacks, shared experts) whatever the
# expert count: transformers builds the router and a 1 x out x in stack for a single expert too.
MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "llama4_text")
QWEN_WINDOW_FAMILIES = ("qwen2", "qwen3", "qwen3_moe")  # a sliding window only with use_sliding_window
GEMMA_FAMILIES = ("gemma2", "gemma3_text")  # (1 + w) fp32 RMSNorms, sandwich norms, sqrt(H)-scaled embedding


class Linear(NamedTuple):
    """One matmul weight of a decoder layer (out x in, `count` of them: MoE experts), with its bias."""

    name: str  # q, k, v, o, qkv, q_a, q_b, kv_a, kv_b, gate, up, down, gate_up, router, shared_gate, ...
    in_features: int
    out_features: int
    count: int = 1
    block: Literal["attention", "mlp"] = "attention"
    fused: bool = False  # several projections in one weight (qkv, gate_up)
    expert: bool = False  # a routed MoE expert weight (a 3-D nn.Parameter, not an nn.Linear)
    module: bool = True  # an nn.Linear / Conv1D module (peft can wrap it); False for raw nn.Parameters
    bias: bool = False  # an out-wide bias per weight (the Linear's own, or gpt-oss's expert / router bias)
    shared: bool = False  # an always-on shared expert's nn.Linear (DeepSeek, GLM-4.5)

    @property
    def weights(self) -> int:
        return self.in_features * self.out_features * self.count

    @property
    def params(self) -> int:
        """Weights and bias: every parameter this entry stands for."""
        return self.weights + (self.out_features * self.count if self.bias else 0)

    def shapes(self) -> list[tuple[tuple[int, ...], int]]:
        """(shape, count) of the tensors as registered: out x in (a routed expert stack: E x out x in; GPT-2's
        Conv1D stores in x out, the same size), and the bias."""
        lead, n = ((self.count,), 1) if self.expert else ((), self.count)
        weight = [(lead + (self.out_features, self.in_features), n)]
        return weight + ([(lead + (self.out_features,), n)] if self.bias else [])

    def lora_target(self, targets: str | tuple[str, ...], module_name: str) -> bool:
        """peft's 'all-linear' wraps every nn.Linear / Conv1D but lm_head; 'attention' only the attention
        projections (MLA's q_a / q_b / kv_a / kv_b / o); a list of names every nn.Linear / Conv1D whose module
        name (`module_name`, HF_MODULE_NAMES) it lists (peft's check_target_module_exists matches the last
        component of the module path). Shared experts: only the families whose all-linear peft rewrites onto the
        routed experts have them (PEFT_EXPERT_ADAPTER_FAMILIES, refused there), and that rewrite drops the
        gate_proj / up_proj / down_proj modules, so a set never targets them (a list naming them is refused there
        by the scenario)."""
        if not self.module or self.expert:
            return False
        if isinstance(targets, tuple):
            return module_name in targets
        return not self.shared and (targets == "all-linear" or self.block == "attention")

    def tp_in(self, tp: int) -> int:
        """Megatron tensor parallelism: o and down are row-parallel (input split), the rest column-parallel."""
        return tp if self.name in ("o", "down", "shared_down") else 1

    def tp_out(self, tp: int) -> int:
        return 1 if self.name in ("o", "down", "shared_down") else tp


class ModelSpec(BaseModel):
    """A decoder-only transformer, normalised across families. Shapes only, no weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Family
    # Upper bounds (calc.contract.limits, each with its reason) keep every estimate's cost bounded.
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    hidden_size: int = Field(ge=1, le=MAX_HIDDEN)
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    num_heads: int = Field(ge=1, le=MAX_HEADS)
    num_kv_heads: int = Field(ge=1, le=MAX_HEADS)
    head_dim: int = Field(ge=1, le=MAX_HEAD_DIM)
    intermediate_size: int = Field(ge=1, le=MAX_INTERMEDIATE, description="MLP inner width (per expert for MoE)")
    max_position_embeddings: int = Field(ge=1, le=MAX_POSITIONS)
    tie_word_embeddings: bool
    hidden_act: str = Field(max_length=64)
    qkv_bias: bool = False  # bias on q/k/v projections (qwen2, gpt2, gpt_neox)
    o_bias: bool = False  # bias on the attention output projection
    mlp_bias: bool = False
    num_experts: int = Field(1, ge=1, le=MAX_EXPERTS, description="MoE experts per layer (1 = dense)")
    experts_per_token: int = Field(1, ge=1, le=MAX_EXPERTS)
    attention_dropout: float = Field(0.0, ge=0, lt=1)
    hidden_dropout: float = Field(0.0, ge=0, lt=1, description="residual / MLP output dropout")
    embedding_dropout: float = Field(0.0, ge=0, lt=1)
    rotary_fraction: float = Field(1.0, ge=0, le=1, description="share of head_dim that gets RoPE")
    parallel_residual: bool = False  # gpt_neox: attn and MLP read the same input
    final_logit_softcapping: float | None = Field(None, gt=0, le=MAX_SOFTCAP)  # gemma2: tanh(logits / c) * c
    attn_logit_softcapping: float | None = Field(None, gt=0, le=MAX_SOFTCAP)
    sliding_window: int | None = Field(None, ge=1, le=MAX_POSITIONS,
                                       description="SDPA needs an explicit mask past this length")
    layer_types: tuple[Literal["sliding_attention", "full_attention"], ...] | None = Field(
        None, max_length=MAX_LAYERS, description="per-layer attention kind, repeating (Gemma 3, gpt-oss); "
        "None = every layer alike")
    q_lora_rank: int = Field(0, ge=0, le=MAX_HIDDEN, description="MLA: q through a bottleneck this wide (0 = q_proj)")
    kv_lora_rank: int = Field(0, ge=0, le=MAX_HIDDEN, description="MLA (DeepSeek): compressed KV width; 0 = none")
    qk_rope_head_dim: int = Field(0, ge=0, le=MAX_HEAD_DIM, description="MLA: rotary part of each q/k head")
    v_head_dim: int = Field(0, ge=0, le=MAX_HEAD_DIM, description="MLA: value head width")
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, Gemma 3, GLM-4.5 use_qk_norm)
    shared_experts: int = Field(0, ge=0, le=MAX_EXPERTS, description="MoE: always-on shared experts (one MLP)")
    dense_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="MoE: the first k layers are dense")
    dense_intermediate_size: int = Field(0, ge=0, le=MAX_INTERMEDIATE, description="MoE: the dense layers' MLP width")
    router_groups: int = Field(0, ge=0, le=MAX_EXPERTS, description="sigmoid router, group-limited top-k (DeepSeek-V3)")
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit joins each softmax row
    expert_bias: bool = False  # gpt-oss: biases on the experts, the router and a clamped SwiGLU
    router_fp32_softmax: bool = False  # DeepSeek-V2: fp32 linear + softmax router, top-k scaled, not renormalised
    rope_complex: bool = False  # DeepSeek-V2, Llama 4: RoPE as a complex multiply on fp32 copies (freqs_cis)
    qk_l2_norm: bool = False  # Llama 4: weightless L2 norm of q and k on its RoPE layers (use_qk_norm)
    attn_temperature_tuning: bool = False  # Llama 4: its NoPE layers scale q by a per-position factor
    router_renorm: bool = True  # MoE: top-k weights renormalised to sum 1 (Mixtral always; Qwen3-MoE norm_topk_prob)
    vision_params: int = Field(0, ge=0, le=MAX_VISION_PARAMS, description="a multimodal wrapper's vision tower "
                               "and projector (calc.contract.multimodal), held and trained with the decoder")
    wrapper: str | None = Field(None, max_length=32, description="the multimodal wrapper's model_type, if any")
    name: str | None = None

    @model_validator(mode="after")
    def _heads(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise UserError(T_("num_attention_heads={heads} is not divisible by num_key_value_heads={kv_heads}",
                               heads=self.num_heads, kv_heads=self.num_kv_heads))
        if self.experts_per_token > self.num_experts:
            raise UserError(T_("num_experts_per_tok exceeds num_local_experts"))
        return self

    @cached_property
    def value_key(self) -> str:
        """The spec by value, for memo keys (per_spec, calc.sim.context.Ctx.shape_free): its JSON, made once per
        object. A str keeps its hash, so a key that holds it hashes as cheaply as an id would; hashing the model
        hashes its 45 fields each time (about 1 us, more than a recorded block's evaluation)."""
        return self.model_dump_json()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> ModelSpec:
        """pydantic's copy, without the value key of the spec it copies (made again for the copy when asked)."""
        copied = super().model_copy(update=update, deep=deep)
        if "value_key" in vars(copied):
            del copied.value_key
        return copied

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends through the sliding window (all layers, unless layer_types says)."""
        return self.layer_types is None or self.layer_types[layer % len(self.layer_types)] == "sliding_attention"

    @property
    def layer_period(self) -> int:
        """Layers repeat with this period (Gemma 2 alternates local / global attention)."""
        if self.layer_types is not None:
            return len(self.layer_types)
        return 2 if self.family == "gemma2" else 1

    @property
    def moe(self) -> bool:
        """Mixture-of-experts layers (router + expert stacks), also with one expert (MOE_FAMILIES)."""
        return self.num_experts > 1 or self.family in MOE_FAMILIES

    @property
    def gated_mlp(self) -> bool:
        return self.family not in ("gpt2", "gpt_neox")

    @property
    def uses_layernorm(self) -> bool:
        """LayerNorm (weight + bias) rather than RMSNorm (weight only)."""
        return self.family in ("gpt2", "gpt_neox")

    @property
    def sdpa_supported(self) -> bool:
        """Whether transformers runs this family with SDPA (gpt-oss's attention sinks: eager only)."""
        return not self.attention_sinks

    @property
    def experts_run_per_token(self) -> int:
        """Routed experts whose matmuls each token goes through in transformers: the top-k, except for
        Llama 4, whose Llama4TextMoe runs every token through every expert (scaled by its router score;
        modeling_llama4.py), so the compute is the whole expert stack's."""
        return self.num_experts if self.family == "llama4_text" else self.experts_per_token

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): compressed KV, decoupled RoPE."""
        return self.kv_lora_rank > 0

    @property
    def rotary_dim(self) -> int:
        """Width of each head that RoPE rotates (the cos / sin tensors' last dimension)."""
        if self.mla:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.rotary_fraction)

    @property
    def v_width(self) -> int:
        """All value heads: what the attention output and o_proj carry."""
        return self.num_heads * (self.v_head_dim if self.mla else self.head_dim)

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---- parameter counts -------------------------------------------------------------
    def embedding_params(self) -> int:
        """Token embedding V*H, plus GPT-2's learned positions P*H."""
        other = self.model_other_params()
        return other["embed_tokens"] + other.get("wpe (learned positions)", 0)

    def lm_head_params(self) -> int:
        """Output projection V*H; zero when tied to the input embedding."""
        return self.model_other_params().get("lm_head", 0)

    def norm_params(self) -> int:
        """One normalisation layer: H (RMSNorm) or 2H (LayerNorm weight + bias)."""
        return 2 * self.hidden_size if self.uses_layernorm else self.hidden_size

    def linear_layers(self, dense: bool = False) -> list[Linear]:
        """Every matmul weight of one decoder layer, as transformers registers it: the one list that the
        parameter counts, LoRA (engine and speed model) and ZeRO-3's per-layer fetches read. `dense`: one
        of a MoE model's first `dense_layers` layers (a plain gated MLP instead of the experts).
        Fused projections are one weight (gpt2's c_attn, neox's query_key_value, phi3's qkv_proj and
        gate_up_proj); MoE experts are 3-D nn.Parameters (transformers 5: gate_up_proj and down_proj of
        shape E x out x in) and the router a plain nn.Parameter, none of them an nn.Linear."""
        return self._attention_linears() + self._mlp_linears(dense)

    def _attention_linears(self) -> list[Linear]:
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        if self.mla:
            return self._mla_linears()
        if self.family in ("gpt2", "gpt_neox", "phi3"):
            qkv = [Linear("qkv", h, q + 2 * kv, fused=True, bias=self.qkv_bias)]
        else:
            qkv = [Linear(n, h, w, bias=self.qkv_bias) for n, w in (("q", q), ("k", kv), ("v", kv))]
        return qkv + [Linear("o", q, h, bias=self.o_bias)]

    def _mla_linears(self) -> list[Linear]:
        """DeepseekV3Attention: q (q_proj, or q_a_proj -> q_b_proj), kv_a_proj_with_mqa -> kv_b_proj, o_proj
        (biases on q_a / kv_a / o with attention_bias); the latent norms are in layer_other_params."""
        h, nh, r, kvl, ql, bias = (self.hidden_size, self.num_heads, self.qk_rope_head_dim, self.kv_lora_rank,
                                   self.q_lora_rank, self.qkv_bias)
        q = [Linear("q_a", h, ql, bias=bias), Linear("q_b", ql, self.q_width)] if ql else [Linear("q", h, self.q_width)]
        return q + [Linear("kv_a", h, kvl + r, bias=bias), Linear("kv_b", kvl, nh * (self.head_dim - r + self.v_head_dim)),
                    Linear("o", self.v_width, h, bias=bias)]

    def _mlp_linears(self, dense: bool) -> list[Linear]:
        h, i, bias = self.hidden_size, self.intermediate_size, self.mlp_bias
        if self.moe and dense:
            return _gated("", h, self.dense_intermediate_size, bias)
        if self.moe:
            e, eb = self.num_experts, self.expert_bias
            mlp = [Linear("gate_up", h, 2 * i, e, block="mlp", fused=True, expert=True, bias=eb),
                   Linear("down", i, h, e, block="mlp", expert=True, bias=eb),
                   Linear("router", h, e, block="mlp", module=False, bias=eb)]
            return mlp + (_gated("shared_", h, self.shared_experts * i, bias) if self.shared_experts else [])
        if self.family == "phi3":
            return [Linear("gate_up", h, 2 * i, block="mlp", fused=True), Linear("down", i, h, block="mlp")]
        if self.gated_mlp:
            return _gated("", h, i, bias)
        return [Linear("up", h, i, block="mlp", bias=bias), Linear("down", i, h, block="mlp", bias=bias)]

    def layer_other_shapes(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """One decoder layer's parameters that are no matmul weight or bias, by transformers' names:
        name -> (shape, how many)."""
        other = {"layer norms": ((self.hidden_size,), self.layer_norm_params() // self.hidden_size)}
        if self.qk_norm:
            other["q_norm + k_norm"] = ((self.head_dim,), 2)
        if self.mla and self.q_lora_rank:
            other["q_a_layernorm"] = ((self.q_lora_rank,), 1)
        if self.mla:
            other["kv_a_layernorm"] = ((self.kv_lora_rank,), 1)
        if self.attention_sinks:
            other["sinks"] = ((self.num_heads,), 1)
        return other

    def model_other_shapes(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """Parameters outside the decoder layers, by name (lm_head absent when tied to the embedding)."""
        h = self.hidden_size
        other = {"vision tower + projector": ((self.vision_params,), 1)} if self.vision_params else {}
        other["embed_tokens"] = ((self.vocab_size, h), 1)
        if self.family == "gpt2":
            other["wpe (learned positions)"] = ((self.max_position_embeddings, h), 1)
        other["final norm"] = ((h,), self.norm_params() // h)
        if not self.tie_word_embeddings:
            other["lm_head"] = ((self.vocab_size, h), 1)
        return other

    def layer_other_params(self) -> dict[str, int]:
        return {name: prod(shape) * n for name, (shape, n) in self.layer_other_shapes().items()}

    def model_other_params(self) -> dict[str, int]:
        return {name: prod(shape) * n for name, (shape, n) in self.model_other_shapes().items()}

    def module_name(self, name: str) -> str:
        """The Hugging Face module name of the calc linear (or "lm_head" / "embed_tokens") called `name`."""
        return HF_FAMILY_MODULE_NAMES.get(self.family, {}).get(name, HF_MODULE_NAMES[name])

    def linear_module_names(self) -> tuple[str, ...]:
        """The module names of this model's nn.Linear / Conv1D layers (what a LoRA target list may name), in
        the order a decoder layer runs them (a MoE model's dense layers first), then lm_head."""
        kinds = [True, False] if self.dense_layers else [False]
        names = [self.module_name(lin.name) for d in kinds for lin in self.linear_layers(d)
                 if lin.module and not lin.expert]
        return tuple(dict.fromkeys([*names, self.module_name("lm_head")]))

    def lora_targeted(self, lin: Linear, targets: str | tuple[str, ...]) -> bool:
        """Whether peft puts an adapter on this decoder-layer linear (Linear.lora_target)."""
        return lin.lora_target(targets, self.module_name(lin.name))

    def lora_on_lm_head(self, targets: str | tuple[str, ...]) -> bool:
        """An adapter on lm_head: only when a target list names it (peft's all-linear leaves the output layer out)."""
        return isinstance(targets, tuple) and self.module_name("lm_head") in targets

    def lora_params_per_layer(self, rank: int, targets: str | tuple[str, ...], tp: int = 1,
                              dense: bool = False) -> int:
        """peft adapter weights per layer, r x (in + out) for each targeted nn.Linear, with this GPU's
        tensor-parallel slice. `dense`: one of a MoE model's dense layers."""
        return sum(rank * (lin.in_features // lin.tp_in(tp) + lin.out_features // lin.tp_out(tp)) * lin.count
                   for lin in self.linear_layers(dense) if self.lora_targeted(lin, targets))

    def lora_lm_head_params(self, rank: int, targets: str | tuple[str, ...], tp: int = 1) -> int:
        """An adapter on lm_head (H in, V / tp out: vocab-parallel), or 0."""
        return rank * (self.hidden_size + self.vocab_size // tp) if self.lora_on_lm_head(targets) else 0

    def lora_params(self, rank: int, targets: str | tuple[str, ...], tp: int = 1, layers: int | None = None,
                    first: bool = True, last: bool = True) -> int:
        """Adapter weights of `layers` layers (default all) counted from the first (a MoE model's dense
        layers first, as in linear_layers), and lm_head's adapter on the `last` stage."""
        layers = self.num_layers if layers is None else layers
        dense = min(layers, self.dense_layers) if first else 0
        return ((layers - dense) * self.lora_params_per_layer(rank, targets, tp)
                + dense * self.lora_params_per_layer(rank, targets, tp, dense=True)
                + (self.lora_lm_head_params(rank, targets, tp) if last else 0))

    def modules_to_save_shapes(self, names: tuple[str, ...], tp: int = 1, first: bool = True,
                               last: bool = True) -> list[tuple[tuple[int, ...], int]]:
        """The trainable copies peft's ModulesToSaveWrapper makes (copy.deepcopy of the module, beside the frozen
        original; peft/utils/other.py ModulesToSaveWrapper.update) of lm_head (V / tp x H, the last stage) and the
        token embedding (V / tp x H, the first stage). A deepcopy is a tensor of its own: with tied embeddings the
        trainable copy is untied from the frozen original."""
        wanted = {"lm_head": last, "embed_tokens": first}
        return [((self.vocab_size // tp, self.hidden_size), 1) for calc_name, here in wanted.items()
                if here and self.module_name(calc_name) in names]

    def lora_target_names(self, targets: str | tuple[str, ...]) -> frozenset[str]:
        """calc names of the linears peft wraps in any kind of layer (a MoE model's dense and MoE layers), and
        "lm_head" when its adapter is asked for."""
        kinds = [False, True] if self.dense_layers else [False]
        names = {lin.name for d in kinds for lin in self.linear_layers(d) if self.lora_targeted(lin, targets)}
        return frozenset(names | ({"lm_head"} if self.lora_on_lm_head(targets) else set()))

    def attention_params(self) -> int:
        """The attention block's linears (with biases), its q/k or latent norms and gpt-oss's sinks."""
        linears = sum(lin.params for lin in self.linear_layers() if lin.block == "attention")
        return linears + sum(n for k, n in self.layer_other_params().items() if k != "layer norms")

    def mlp_params_per_expert(self) -> int:
        """One routed expert's weights and biases (MoE); the whole MLP of a dense model."""
        experts = [lin for lin in self.linear_layers() if lin.expert]
        if not experts:
            return self.mlp_params()
        return sum(lin.params // lin.count for lin in experts)

    def mlp_params(self, dense: bool = False) -> int:
        """The MLP block's linears: all experts, the router and any shared experts for MoE."""
        return sum(lin.params for lin in self.linear_layers(dense) if lin.block == "mlp")

    def dense_layer_delta(self) -> int:
        """Parameters a dense layer of a MoE model has beyond (negative: below) a MoE layer."""
        if not self.dense_layers:
            return 0
        return self.mlp_params(dense=True) - self.mlp_params()

    def norms_per_layer(self) -> int:
        return 4 if self.family in GEMMA_FAMILIES else 2

    def layer_norm_params(self) -> int:
        """The layer's H-wide normalisation weights (replicated under tensor parallelism)."""
        return self.norms_per_layer() * self.norm_params()

    def layer_params(self) -> int:
        """One (MoE, where the model has dense first layers) decoder layer: its linears and the rest."""
        return self.layer_matmul_params() + self.layer_norm_params()

    def layer_matmul_params(self) -> int:
        """Everything in a layer but its H-wide norms: the weights matmuls use (and TP splits)."""
        return self.attention_params() + self.mlp_params()

    def total_params(self) -> int:
        """Exact `sum(p.numel())` of the transformers CausalLM model (tied weights counted once)."""
        return (
            sum(self.model_other_params().values())
            + self.num_layers * self.layer_params()
            + self.dense_layers * self.dense_layer_delta()
        )

    def active_params(self) -> int:
        """Parameters touched per token (MoE: only experts_per_token experts)."""
        inactive = (self.num_experts - self.experts_per_token) * self.mlp_params_per_expert()
        return self.total_params() - (self.num_layers - self.dense_layers) * inactive

    def param_shapes(self) -> list[tuple[tuple[int, ...], int]]:
        """(shape, count) of every parameter tensor, as the transformers module registers them (used for
        shape-dependent optimizer memory: Adafactor, for-loop temporaries, 8-bit): the linear list of each
        layer kind (a MoE model's dense first layers apart) and the named rest."""
        L, dense = self.num_layers, self.dense_layers
        mlps = [(self._mlp_linears(dense=False), L - dense)] + ([(self._mlp_linears(dense=True), dense)] if dense else [])
        shapes = list(self.model_other_shapes().values())
        shapes += [(shape, n * L) for shape, n in self.layer_other_shapes().values()]
        shapes += [(shape, n * L) for lin in self._attention_linears() for shape, n in lin.shapes()]
        for linears, layers in mlps:
            shapes += [(shape, n * layers) for lin in linears for shape, n in lin.shapes()]
        return shapes


    def layer_param_numels(self, dense: bool = False) -> tuple[int, ...]:
        """Elements of each parameter tensor of one decoder layer in the order transformers registers them
        (`named_parameters()`, the order DeepSpeed ZeRO-1/2 flatten and partition), from linear_layers (each
        weight, then its bias) and layer_other_shapes. The layer norms come first in GPT-NeoX, around the
        attention in GPT-2 (ln_1, attn, ln_2, mlp) and last elsewhere (self_attn, mlp, then the norms); Phi-3
        registers o_proj before qkv_proj, gpt-oss its sinks first, MLA each latent norm after its projection,
        Mixtral and gpt-oss the router before the experts (tests/calc/contract/test_presets.py checks every preset).
        `dense`: one of a MoE model's dense first layers."""
        other = self.layer_other_shapes()

        def tensors(lin: Linear) -> list[int]:
            return [prod(shape) for shape, n in lin.shapes() for _ in range(n)]

        def extra(key: str) -> list[int]:
            shape, n = other.get(key, ((0,), 0))
            return [prod(shape)] * n

        linears = self.linear_layers(dense)
        attn_lins = [lin for lin in linears if lin.block == "attention"]
        if self.family == "phi3":
            attn_lins = attn_lins[-1:] + attn_lins[:-1]
        attn = extra("sinks")
        for lin in attn_lins:
            attn += tensors(lin) + extra({"q_a": "q_a_layernorm", "kv_a": "kv_a_layernorm"}.get(lin.name, ""))
        attn += extra("q_norm + k_norm")
        mlp_lins = [lin for lin in linears if lin.block == "mlp"]
        if self.family in ("mixtral", "gpt_oss"):
            mlp_lins.sort(key=lambda lin: lin.name != "router")
        mlp = [x for lin in mlp_lins for x in tensors(lin)]
        norms = extra("layer norms")
        if self.family == "gpt2":
            half = len(norms) // 2
            return tuple(norms[:half] + attn + norms[half:] + mlp)
        if self.family == "gpt_neox":
            return tuple(norms + attn + mlp)
        return tuple(attn + mlp + norms)

    def param_numel_blocks(self) -> tuple[tuple[int, ...], list[tuple[int, ...]], tuple[int, ...]]:
        """Every parameter tensor's elements in registration order, grouped as backward meets them: (the
        embedding: a multimodal wrapper's vision side as one block, embed_tokens and GPT-2's wpe; each decoder
        layer from layer 0; the top: final norm, then lm_head when untied). From model_other_shapes and layer_param_numels."""
        other = self.model_other_shapes()
        emb = tuple(prod(s) for k in ("vision tower + projector", "embed_tokens", "wpe (learned positions)") if k in other
                    for s, n in [other[k]] for _ in range(n))
        top = tuple(prod(s) for k in ("final norm", "lm_head") if k in other for s, n in [other[k]] for _ in range(n))
        moe, dense = self.layer_param_numels(), self.layer_param_numels(dense=True) if self.dense_layers else ()
        return emb, [dense if i < self.dense_layers else moe for i in range(self.num_layers)], top

    def routed_expert_shapes(self) -> list[tuple[tuple[int, ...], int]]:
        """The routed experts' 3-D stacks (and gpt-oss's expert biases) among param_shapes: (shape, count)
        with the expert dim first, over all MoE layers; [] for a dense model."""
        if not self.moe:
            return []
        moe_layers = self.num_layers - self.dense_layers
        return [(shape, n * moe_layers) for lin in self._mlp_linears(dense=False) if lin.expert
                for shape, n in lin.shapes()]

    def routed_expert_params_per_layer(self) -> int:
        """One MoE layer's routed-expert weights and biases (all experts)."""
        return sum(lin.params for lin in self._mlp_linears(dense=False) if lin.expert) if self.moe else 0


def _gated(prefix: str, h: int, i: int, bias: bool) -> list[Linear]:
    """A gated MLP's gate_proj, up_proj and down_proj (a dense layer, or MoE shared experts: prefix 'shared_')."""
    shared = prefix == "shared_"
    return [Linear(f"{prefix}gate", h, i, block="mlp", bias=bias, shared=shared),
            Linear(f"{prefix}up", h, i, block="mlp", bias=bias, shared=shared),
            Linear(f"{prefix}down", i, h, block="mlp", bias=bias, shared=shared)]


T = TypeVar("T")
_facts: Memo[tuple[str, Hashable], Any] = Memo("facts per model spec", 4096)


def per_spec(spec: ModelSpec, what: Hashable, fn: Callable[[], T]) -> T:
    """fn() memoized by the spec's value (ModelSpec.value_key) and `what`: listing a spec's linears, or counting
    its parameters, costs more than the arithmetic of a step-time or memory estimate, and a search asks thousands
    of times about the same spec. The result is shared: treat it as read-only."""
    return _facts.get((spec.value_key, what), fn)

"""Per-family transformer shapes: a normalised ModelSpec built from a Hugging Face config dict,
and exact parameter counts that equal `sum(p.numel() for p in model.parameters())` of the
transformers implementation (checked by tests/calc/contract/test_presets.py on the meta device).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from calc.contract.boundary import excerpt, problem, require
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
    MAX_VOCAB,
)

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
QWEN_WINDOW_FAMILIES = ("qwen2", "qwen3", "qwen3_moe")  # a sliding window only with use_sliding_window
GEMMA_FAMILIES = ("gemma2", "gemma3_text")  # (1 + w) fp32 RMSNorms, sandwich norms, sqrt(H)-scaled embedding

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

    def lora_target(self, targets: str) -> bool:
        """peft's 'all-linear' wraps every nn.Linear / Conv1D but lm_head; 'attention' only the attention
        projections (MLA's q_a / q_b / kv_a / kv_b / o). Shared experts: only the families whose all-linear
        peft rewrites onto the routed experts have them (PEFT_EXPERT_ADAPTER_FAMILIES, refused there), and
        that rewrite drops the gate_proj / up_proj / down_proj modules, so they are never targeted."""
        if not self.module or self.expert or self.shared:
            return False
        return targets == "all-linear" or self.block == "attention"

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
    name: str | None = None

    @model_validator(mode="after")
    def _heads(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise UserError(T_("num_attention_heads={heads} is not divisible by num_key_value_heads={kv_heads}",
                               heads=self.num_heads, kv_heads=self.num_kv_heads))
        if self.experts_per_token > self.num_experts:
            raise UserError(T_("num_experts_per_tok exceeds num_local_experts"))
        return self

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
        if self.num_experts > 1 and dense:
            return _gated("", h, self.dense_intermediate_size, bias)
        if self.num_experts > 1:
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
        other = {"embed_tokens": ((self.vocab_size, h), 1)}
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

    def lora_params_per_layer(self, rank: int, targets: str, tp: int = 1, dense: bool = False) -> int:
        """peft adapter weights per layer, r x (in + out) for each targeted nn.Linear ('all-linear' or
        'attention'), with this GPU's tensor-parallel slice. `dense`: one of a MoE model's dense layers."""
        return sum(rank * (lin.in_features // lin.tp_in(tp) + lin.out_features // lin.tp_out(tp)) * lin.count
                   for lin in self.linear_layers(dense) if lin.lora_target(targets))

    def lora_params(self, rank: int, targets: str, tp: int = 1, layers: int | None = None, first: bool = True) -> int:
        """Adapter weights of `layers` layers (default all) counted from the first (a MoE model's dense
        layers first, as in linear_layers)."""
        layers = self.num_layers if layers is None else layers
        dense = min(layers, self.dense_layers) if first else 0
        return ((layers - dense) * self.lora_params_per_layer(rank, targets, tp)
                + dense * self.lora_params_per_layer(rank, targets, tp, dense=True))

    def lora_target_names(self, targets: str) -> frozenset[str]:
        """Names of the linears peft wraps in any kind of layer (a MoE model's dense and MoE layers)."""
        kinds = [False, True] if self.dense_layers else [False]
        return frozenset(lin.name for d in kinds for lin in self.linear_layers(d) if lin.lora_target(targets))

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
        embedding: embed_tokens and GPT-2's wpe; each decoder layer from layer 0; the top: final norm, then
        lm_head when untied). From model_other_shapes and layer_param_numels."""
        other = self.model_other_shapes()
        emb = tuple(prod(s) for k in ("embed_tokens", "wpe (learned positions)") if k in other
                    for s, n in [other[k]] for _ in range(n))
        top = tuple(prod(s) for k in ("final norm", "lm_head") if k in other for s, n in [other[k]] for _ in range(n))
        moe, dense = self.layer_param_numels(), self.layer_param_numels(dense=True) if self.dense_layers else ()
        return emb, [dense if i < self.dense_layers else moe for i in range(self.num_layers)], top

    def routed_expert_shapes(self) -> list[tuple[tuple[int, ...], int]]:
        """The routed experts' 3-D stacks (and gpt-oss's expert biases) among param_shapes: (shape, count)
        with the expert dim first, over all MoE layers; [] for a dense model."""
        if self.num_experts == 1:
            return []
        moe_layers = self.num_layers - self.dense_layers
        return [(shape, n * moe_layers) for lin in self._mlp_linears(dense=False) if lin.expert
                for shape, n in lin.shapes()]

    def routed_expert_params_per_layer(self) -> int:
        """One MoE layer's routed-expert weights and biases (all experts)."""
        return sum(lin.params for lin in self._mlp_linears(dense=False) if lin.expert) if self.num_experts > 1 else 0


def _gated(prefix: str, h: int, i: int, bias: bool) -> list[Linear]:
    """A gated MLP's gate_proj, up_proj and down_proj (a dense layer, or MoE shared experts: prefix 'shared_')."""
    shared = prefix == "shared_"
    return [Linear(f"{prefix}gate", h, i, block="mlp", bias=bias, shared=shared),
            Linear(f"{prefix}up", h, i, block="mlp", bias=bias, shared=shared),
            Linear(f"{prefix}down", i, h, block="mlp", bias=bias, shared=shared)]


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def spec_from_hf_config(config: dict[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json dict, filling transformers' defaults."""
    if not isinstance(config, dict):
        raise UserError(T_("model config must be a JSON object (a config.json dict)"))
    family = config.get("model_type")
    if not isinstance(family, str) or family not in _HF_DEFAULTS:
        raise UserError(T_("unsupported model_type {family}; supported: {supported}", family=excerpt(family),
                           supported=", ".join(SUPPORTED_FAMILIES)))
    explicit_none = ("n_inner", "q_lora_rank")  # None means something for these (4 x hidden; no q bottleneck)
    cfg = {**_HF_DEFAULTS[family], **{k: v for k, v in config.items() if v is not None or k in explicit_none}}
    if family == "gpt2":
        cfg = {_GPT2_KEYS.get(k, k): v for k, v in cfg.items()}
    try:
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
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    head_dim = _int(cfg, "head_dim", default=max(1, hidden // heads))
    # gpt2's n_inner: null means 4 x hidden; any given width must be a positive integer (0 is not "default")
    inner = 4 * hidden if cfg.get("intermediate_size") is None else _int(cfg, "intermediate_size")
    rope = require(cfg.get("rope_parameters", {}), dict, "rope_parameters")
    fields: dict[str, Any] = dict(
        family=family,
        name=name,
        vocab_size=_int(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_int(cfg, "num_key_value_heads", default=heads),
        head_dim=head_dim,
        intermediate_size=inner,
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings"),
        hidden_act=require(_first(cfg, "hidden_activation", "hidden_act", default="silu"), str, "hidden_act"),
        attention_dropout=_rate(cfg, "attention_dropout", "attn_pdrop", default=0.0),
        hidden_dropout=_rate(cfg, "hidden_dropout", "resid_pdrop", default=0.0),
        embedding_dropout=_rate(cfg, "embd_pdrop", default=0.0),
    )
    if family in ("llama",):
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                      mlp_bias=_flag(cfg, "mlp_bias"))
    elif family == "qwen2":
        fields.update(qkv_bias=True)
    elif family == "qwen3":
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"))
    elif family in ("gpt2", "gpt_neox"):
        bias = family == "gpt2" or _flag(cfg, "attention_bias", True)
        fields.update(qkv_bias=bias, o_bias=bias, mlp_bias=True,
                      parallel_residual=family == "gpt_neox" and _flag(cfg, "use_parallel_residual", True))
        if family == "gpt_neox":
            fields["rotary_fraction"] = _rate(rope, "partial_rotary_factor",
                                              default=_rate(cfg, "rotary_pct", default=0.25))
    elif family == "gpt_oss":
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                      num_experts=_int(cfg, "num_local_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"),
                      sliding_window=_int(cfg, "sliding_window"),
                      layer_types=_layer_types(cfg, default=("sliding_attention", "full_attention")),
                      attention_sinks=True, expert_bias=True, router_renorm=False)
    elif family == "deepseek_v2":
        if require(cfg.get("topk_method", "greedy"), str, "topk_method") != "greedy":
            raise UserError(T_("deepseek_v2 with topk_method group_limited_greedy is not supported; use greedy"))
        fields.update(_mla_fields(cfg, heads), rope_complex=True, router_fp32_softmax=True,
                      **_routed_moe_fields({**cfg, "n_group": 0, "norm_topk_prob": False}))
    elif family == "deepseek_v3":
        fields.update(_mla_fields(cfg, heads), **_routed_moe_fields(cfg))
    elif family == "glm4_moe":
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), qk_norm=_flag(cfg, "use_qk_norm"),
                      **_routed_moe_fields(cfg),
                      rotary_fraction=_rate(rope, "partial_rotary_factor",
                                            default=_rate(cfg, "partial_rotary_factor", default=0.5)))
    elif family == "llama4_text":
        fields.update(_llama4_fields(cfg))
    elif family == "gemma3_text":
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                      final_logit_softcapping=_optional_number(cfg, "final_logit_softcapping"),
                      attn_logit_softcapping=_optional_number(cfg, "attn_logit_softcapping"),
                      sliding_window=_int(cfg, "sliding_window"), layer_types=_gemma3_layer_types(cfg))
    elif family == "gemma2":
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                      final_logit_softcapping=_optional_number(cfg, "final_logit_softcapping"),
                      attn_logit_softcapping=_optional_number(cfg, "attn_logit_softcapping"))
    elif family == "mixtral":
        fields.update(num_experts=_int(cfg, "num_local_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"))
    elif family == "qwen3_moe":
        if _int(cfg, "decoder_sparse_step") != 1 or require(cfg.get("mlp_only_layers", []), list, "mlp_only_layers"):
            raise UserError(T_("qwen3_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers) is not "
                               "supported; every layer must be a MoE layer"))
        fields.update(qkv_bias=_flag(cfg, "attention_bias"), o_bias=_flag(cfg, "attention_bias"),
                      num_experts=_int(cfg, "num_experts"), experts_per_token=_int(cfg, "num_experts_per_tok"),
                      intermediate_size=_int(cfg, "moe_intermediate_size"),
                      router_renorm=_flag(cfg, "norm_topk_prob"))
    # Every layer attends through config.sliding_window when it is set (Mistral, Mixtral, Phi-3: the
    # model builds create_sliding_window_causal_mask); Qwen's configs null it unless use_sliding_window.
    if family in ("mistral", "mixtral", "phi3") or (family in QWEN_WINDOW_FAMILIES and _flag(cfg, "use_sliding_window")):
        window = cfg.get("sliding_window")  # null or 0: no window (transformers' convention)
        fields["sliding_window"] = _int(cfg, "sliding_window") if window not in (None, 0) else None
        if family in ("qwen2", "qwen3") and fields["sliding_window"] is not None:
            fields.update(_qwen_window_layers(cfg, fields["num_layers"]))
    if family == "phi3":
        fields["rotary_fraction"] = _rate(rope, "partial_rotary_factor", default=1.0)
    if family in QK_NORM_FAMILIES:
        fields["qk_norm"] = True
    return ModelSpec(**fields)


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


T = TypeVar("T")
_PER_SPEC: dict[tuple[int, Any], tuple[ModelSpec, Any]] = {}


def per_spec(spec: ModelSpec, what: Any, fn: Callable[[], T]) -> T:
    """fn() memoized by the spec's identity and `what` (the entry keeps the spec alive, so its id is not
    reused while it lives): hashing a ModelSpec, or listing its linears, costs more than the arithmetic
    of a step-time or memory estimate, and a search asks thousands of times about the same spec. The
    result is shared: treat it as read-only."""
    hit = _PER_SPEC.get((id(spec), what))
    if hit is not None:
        return hit[1]
    out = fn()
    if len(_PER_SPEC) >= 4096:
        _PER_SPEC.clear()
    _PER_SPEC[(id(spec), what)] = (spec, out)
    return out

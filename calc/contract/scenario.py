"""The scenario contract: what the user asks about (model + hardware + training setup).

The same JSON drives the CLI (`python -m calc estimate`), the app, the recommender, the
DeepSpeed export and the measurement scripts, so every field is validated here and nowhere else.
"""

from __future__ import annotations

from enum import Enum
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from calc.contract.architectures import PEFT_EXPERT_ADAPTER_FAMILIES, ModelSpec
from calc.contract.boundary import read_json, validate
from calc.contract.enums import (  # noqa: F401 - the scenario contract re-exports its settings
    BASE_WEIGHTS,
    FRAMEWORKS,
    PLAIN_WEIGHT_PRECISION,
    Attention,
    BaseWeights,
    Checkpointing,
    Framework,
    InferenceWeights,
    LoraTargetSet,
    Mode,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
)
from calc.contract.errors import UserError
from calc.contract.hardware import HardwareConfig
from calc.contract.hf_rules import check_positions, check_tensor_parallel, longest_sequence
from calc.contract.i18n import T_, Text
from calc.contract.lora import MAX_MODULE_NAMES, LoraConfig  # noqa: F401 - the scenario re-exports it
from calc.contract.parallel import REDUCE_BUCKET_ELEMENTS
from calc.contract.quantization_config import ConfigQuantization, config_quantization
from calc.contract.quantized import torchao_nf4_block_elements, torchtune_nf4
from calc.contract.serving import ServingConfig, check_serving_fits
from calc.contract.training_rules import (  # noqa: F401 - TORCHTUNE_FAMILIES: the scenario re-exports it
    TORCHTUNE_FAMILIES,
    activation_offload_fits,
    litgpt_training_fits,
    refuse_optimizer_in_backward,
    torchtune_supported,
)

# What each framework's recipes do when the scenario does not say (one source: the scenario reads it, the pages
# state it); each framework adds its recipes' defaults where its support lands.
FRAMEWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformers": {}, "torchtitan": {},
    # torchtune 0.6.1's single-device recipes (recipes/full_finetune_single_device.py, lora_finetune_single_device.py)
    # and their configs (recipes/configs/llama3_2/*, qwen2_5/*): `dtype: bf16` builds the model in bf16
    # (training.get_dtype, set_default_dtype) and torch.optim.AdamW keeps its states in the parameters' dtype, so
    # everything is bf16; no autocast, no master copies. torch.optim.AdamW without foreach / fused: PyTorch's
    # default on CUDA, foreach. enable_activation_checkpointing: cfg.get(..., False). The loss of every config:
    # CEWithChunkedOutputLoss (8 output chunks). One device, plain PyTorch (no DeepSpeed).
    "torchtune": {"precision": "bf16", "optimizer": "adamw", "optimizer_impl": "foreach",
                  "activation_checkpointing": "none", "cross_entropy": "chunked", "sharding": "torch"},
    # litgpt/finetune/full.py and lora.py (litgpt 0.5.13): `precision or get_default_supported_precision(
    # training=True)` is "bf16-mixed" (Lightning's torch.autocast over fp32 weights = amp-bf16; "bf16-true" is
    # our bf16); optimizer "AdamW" = torch.optim.AdamW with torch's defaults (instantiate_torch_optimizer passes
    # no `fused`: foreach on CUDA); the loss is litgpt.utils.chunked_cross_entropy over 128-token chunks; no
    # activation checkpointing on one device (FSDPStrategy's activation_checkpointing_policy only with several)
    "litgpt": {"precision": "amp-bf16", "optimizer": "adamw", "optimizer_impl": "foreach",
               "cross_entropy": "chunked", "activation_checkpointing": "none", "sharding": "torch"},
}
LITGPT_FAMILIES = ("llama", "mistral", "qwen2")  # one fused qkv, RMSNorm, LLaMAMLP, RoPE on the whole head


# The default global batch: 262,144 tokens, 128 sequences of 2,048 tokens per optimizer step, the effective batch
# of common supervised fine-tuning recipes (Stanford Alpaca: 128 sequences; Tulu 3 SFT: 128 sequences).
# Pre-training-like jobs take 0.5-4M tokens (GPT-3: 0.5-3.2M; Llama 2: 4M): the sidebar offers them.
DEFAULT_GLOBAL_BATCH_TOKENS = 2**18
GLOBAL_BATCH_CHOICES = (2**15, 2**16, 2**17, 2**18, 2**19, 2**20, 2**21, 2**22)


class TrainingConfig(BaseModel):
    """How the step is run. Defaults are a plain single-GPU bf16 AdamW run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_batch_size: int = Field(1, ge=1, le=65536, description="sequences per GPU per micro-step")
    seq_len: int = Field(2048, ge=1, le=4_194_304, description="tokens per sequence")
    gradient_accumulation_steps: int = Field(1, ge=1, le=65536)
    global_batch_tokens: int = Field(
        DEFAULT_GLOBAL_BATCH_TOKENS, ge=1, le=2**40, description="tokens per optimizer step over all GPUs, the "
        "batch the recommender reaches (micro-batch x accumulation x data parallel, in whole sequences) and every "
        "speed is quoted at; default 2^18 (fine-tuning), 2^20-2^22 for pre-training-like jobs")
    precision: Precision = Precision.amp_bf16
    optimizer: Optimizer = Optimizer.adamw
    optimizer_impl: OptimizerImpl = Field(
        OptimizerImpl.foreach, description="the optimizer's kernels; default: the framework's (FRAMEWORK_DEFAULTS)")
    activation_checkpointing: Checkpointing = Checkpointing.none
    checkpoint_every: int = Field(1, ge=1, le=1024, description="with full: checkpoint 1 of every k layers")
    attention: Attention = Attention.sdpa
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage; 0 = plain data parallel")
    offload_optimizer: Offload = Offload.none
    offload_params: Offload = Offload.none
    sharding: Literal["deepspeed", "fsdp2", "torch"] = Field(
        "deepspeed", description="what runs the step: DeepSpeed (ZeRO 0-3; at stage 0 a 16-bit model's optimizer "
        "is wrapped in DeepSpeed's FP16_(Unfused)Optimizer), PyTorch FSDP2 for stage 2/3 (fully_shard per layer; "
        "stage 3 = FULL_SHARD, stage 2 = reshard_after_forward=False), or plain PyTorch (torch: single GPU or DDP, "
        "zero_stage 0)")
    reduce_bucket_size: int = Field(
        REDUCE_BUCKET_ELEMENTS, ge=1, le=10**12, description="DeepSpeed zero_optimization.reduce_bucket_size, in elements "
        "(its default; the export writes it): ZeRO-1/2 keep two such gradient buckets in backward, ZeRO-3 one")
    tensor_parallel: int = Field(1, ge=1, le=1024)
    pipeline_parallel: int = Field(1, ge=1, le=1024)
    sequence_parallel: bool = False
    expert_parallel: int = Field(
        1, ge=1, le=1024, description="MoE expert parallelism: the routed experts are split over this many ranks, "
        "tokens reach them by all-to-all (transformers' DistributedConfig(ep_size=...), AllToAllEP); the rest of "
        "the model is FSDP2-sharded over all ranks and each expert over num_gpus / expert_parallel ranks")
    lora: LoraConfig | None = None
    framework: Framework = Field(
        "transformers", description="whose model code and training loop the tensors come from: transformers "
        "(the HF Trainer), torchtune, litgpt or torchtitan; each brings its recipes' defaults (FRAMEWORK_DEFAULTS)")
    compile: bool = Field(False, description="torch.compile the model (inductor decides what backward keeps)")
    optimizer_in_backward: bool = Field(
        False, description="step each parameter in its gradient hook and free the gradient at once "
        "(torchtune's optimizer_in_bwd)")
    activation_offload: bool = Field(
        False, description="move saved activations to pinned host memory in forward, back in backward "
        "(torchtune's OffloadActivations); counted in host RAM too")
    cross_entropy: Literal["standard", "liger-fused", "chunked"] = Field(
        "standard", description="standard = the model's loss (full B x S x V logits and their fp32 copies); "
        "liger-fused = Liger Kernel's LigerFusedLinearCrossEntropy (`use_liger_kernel=True`): lm_head and "
        "the loss in token chunks, gradients computed in the forward (modelled from its source); chunked = the "
        "logits and the loss taken over chunks of the sequence (torchtune's CEWithChunkedOutputLoss, LitGPT's "
        "chunked_cross_entropy)")
    cross_entropy_chunks: int | None = Field(
        None, ge=1, le=65536, description="with chunked: torchtune's number of output chunks, LitGPT's tokens per "
        "chunk; null = the framework's own (torchtune 8 chunks, LitGPT 128-token chunks)")
    keep_outputs: bool = Field(
        False, description="the loop keeps the model's output object: `outputs = model(**batch); "
        "loss = outputs.loss; loss.backward()` holds the logits (and a KV cache) through backward, the "
        "optimizer step and the next forward; False = HF Trainer (`loss = model(...).loss`)")

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data: Any) -> Any:
        """Fields the scenario leaves out take the framework's recipe defaults (FRAMEWORK_DEFAULTS), so a
        dumped scenario states them and validates again to itself."""
        if not isinstance(data, dict):
            return data
        framework = data.get("framework", "transformers")
        defaults = FRAMEWORK_DEFAULTS.get(framework) if isinstance(framework, str) else None
        missing = {k: v for k, v in (defaults or {}).items() if k not in data}
        return {**missing, **data} if missing else data

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        _refuse_unmodelled(self)
        if self.activation_offload:
            activation_offload_fits(self)
        if self.framework == "litgpt":
            litgpt_training_fits(self)
        elif self.framework == "torchtune":
            torchtune_supported(self)
        elif self.cross_entropy == "chunked":
            raise UserError(T_("cross_entropy chunked is the loss of LitGPT's and torchtune's recipes: choose "
                               "framework litgpt or torchtune, or another cross_entropy"))
        if self.cross_entropy_chunks is not None and self.cross_entropy != "chunked":
            raise UserError(T_("cross_entropy_chunks applies to cross_entropy chunked"))
        if self.optimizer_in_backward:
            refuse_optimizer_in_backward(self)
        if self.offload_params != Offload.none and self.zero_stage != 3:
            raise UserError(T_("offload_params needs zero_stage 3 (only ZeRO-3 partitions the weights)"))
        if self.offload_optimizer != Offload.none and self.zero_stage == 0:
            raise UserError(T_("offload_optimizer needs zero_stage 1, 2 or 3 (DeepSpeed ZeRO-Offload)"))
        if self.offload_optimizer == Offload.nvme and self.zero_stage != 3:
            raise UserError(T_("offload_optimizer nvme needs zero_stage 3 (ZeRO-Infinity); use cpu at stage 1-2"))
        if self.pipeline_parallel > 1 and self.zero_stage > 1:
            raise UserError(T_("pipeline_parallel > 1 works with zero_stage 0 or 1 (DeepSpeed's pipeline engine)"))
        if self.sharding == "torch" and self.zero_stage != 0:
            raise UserError(T_("sharding torch (plain PyTorch) has no ZeRO: use zero_stage 0, or sharding deepspeed"))
        if self.sharding == "fsdp2":
            if self.zero_stage == 1:
                raise UserError(T_("sharding fsdp2 shards gradients and weights: use zero_stage 2 or 3 (or 0)"))
            if self.offload_optimizer != Offload.none or self.offload_params != Offload.none:
                raise UserError(T_("offload is modelled for DeepSpeed ZeRO; use sharding deepspeed"))
            if self.pipeline_parallel > 1 or self.tensor_parallel > 1:
                raise UserError(T_("sharding fsdp2 is modelled for data parallelism only (tensor/pipeline = 1)"))
        if self.expert_parallel > 1 and (self.sharding != "fsdp2" or self.zero_stage not in (2, 3)):
            raise UserError(T_("expert_parallel > 1 is modelled for transformers' expert parallelism, which runs "
                               "under FSDP2: use sharding fsdp2 with zero_stage 2 or 3"))
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise UserError(T_("sequence_parallel needs tensor_parallel > 1 (Megatron-style SP)"))
        if self.lora is not None and self.lora.quantized and self.precision.is_mixed:
            raise UserError(T_("quantized LoRA base weights (int8/nf4/fp4) are used with amp or bf16, not *-mixed"))
        if self.optimizer.bitsandbytes and self.optimizer_impl == OptimizerImpl.for_loop:
            raise UserError(T_("{optimizer} (bitsandbytes) has no for-loop implementation; use foreach or fused",
                               optimizer=self.optimizer.value))
        return self


# Values the contract names whose mechanisms the engine does not model yet, each refused with its reason (one place:
# a mechanism that lands removes its line).
_UNMODELLED: tuple[tuple[str, Any], ...] = (
    ("framework", "torchtitan"),
    ("compile", True),
)
_UNMODELLED_LORA: tuple[tuple[str, Any], ...] = (
)


def unmodelled_values() -> dict[str, tuple[Any, ...]]:
    """training.<field> (lora.<field>) -> the values of it that this version refuses (the tests walk the rest)."""
    out: dict[str, tuple[Any, ...]] = {}
    for prefix, rows in (("", _UNMODELLED), ("lora.", _UNMODELLED_LORA)):
        for field, value in rows:
            out[prefix + field] = (*out.get(prefix + field, ()), value)
    return out


def _refused(obj: Any, field: str, value: Any) -> bool:
    got = getattr(obj, field)
    if value == "nonzero":
        return bool(got)
    if value == "list":
        return isinstance(got, tuple)
    if value == "nonempty":
        return bool(got)
    return got == value


def _refuse_unmodelled(t: TrainingConfig) -> None:
    for prefix, rows, obj in (("", _UNMODELLED, t), ("lora.", _UNMODELLED_LORA, t.lora)):
        for field, value in rows if obj is not None else ():
            if _refused(obj, field, value):
                raise UserError(T_("training.{field} = {value} is not modelled by this version of the calculator",
                                   field=prefix + field, value=_shown(getattr(obj, field))))


def _shown(value: Any) -> str:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return "[" + ", ".join(value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _lora_names_fit(lora: LoraConfig, spec: ModelSpec) -> None:
    """A target list names the model's own linear modules (ModelSpec.linear_module_names; peft raises on a
    name that matches nothing) and, on the MoE families whose MLP names peft rewrites onto the routed experts'
    weights (PEFT_EXPERT_ADAPTER_FAMILIES), no MLP module; modules_to_save names lm_head or the embedding."""
    names = spec.linear_module_names()
    for name in lora.targets if isinstance(lora.targets, tuple) else ():
        if name not in names:
            raise UserError(T_("lora.targets: {name} is not a linear module of this model; its linear modules: "
                               "{names}", name=name, names=", ".join(names)))
    mlp = {spec.module_name(lin.name) for d in (False, True) for lin in spec.linear_layers(d) if lin.block == "mlp"}
    attention = {spec.module_name(lin.name) for lin in spec.linear_layers() if lin.block == "attention"}
    experts = isinstance(lora.targets, tuple) and spec.family in PEFT_EXPERT_ADAPTER_FAMILIES
    for name in lora.targets if experts else ():
        if name in mlp - attention:
            raise UserError(T_("lora.targets: on {family}, peft moves {name} onto the routed experts' weights, "
                               "which the estimate does not model; target the attention projections or lm_head",
                               family=spec.family, name=name))
    savable = (spec.module_name("lm_head"), spec.module_name("embed_tokens"))
    for name in lora.modules_to_save:
        if name not in savable:
            raise UserError(T_("lora.modules_to_save: {name} is not modelled; the estimate trains {names} in full",
                               name=name, names=" / ".join(savable)))


def _lora_fits_training(t: TrainingConfig, spec: ModelSpec) -> None:
    """No lm_head adapter under Liger's fused loss. modules_to_save is modelled where its 16-bit trainable copies
    (peft does not upcast them) share the adapters' dtype (calc.contract.precision.adapter_bytes: bf16 and *-mixed)
    or, beside fp32 adapters, without ZeRO; under FSDP2 in bf16 (measured; the root group holds the copies)."""
    from calc.contract.precision import adapter_bytes  # calc.contract.precision imports this module

    lora = t.lora
    if lora is not None and t.cross_entropy == "liger-fused" and isinstance(lora.targets, tuple) \
            and spec.module_name("lm_head") in lora.targets:
        # Liger's fused loss reads lm_head.weight, which on peft's wrapped layer is the frozen base weight alone
        raise UserError(T_("an adapter on lm_head does not run under liger-fused cross-entropy (it reads the "
                           "base weight); use standard cross-entropy or leave lm_head out of lora.targets"))
    if lora is None or not lora.modules_to_save:
        return
    if adapter_bytes(t.precision) != 2 and t.zero_stage:
        raise UserError(T_("lora.modules_to_save with fp32 adapters (fp32, amp) is modelled without ZeRO: its "
                           "16-bit copies and the fp32 adapters would share DeepSpeed's flat buffers; use zero_stage "
                           "0, or precision bf16 / bf16-mixed"))
    if t.sharding == "fsdp2" and t.zero_stage in (2, 3) and t.precision != Precision.bf16:
        raise UserError(T_("lora.modules_to_save under sharding fsdp2 is modelled in precision bf16"))


class InferenceConfig(BaseModel):
    """What an inference run does (mode inference): one prefill forward, or generation with a KV cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    new_tokens: int = Field(0, ge=0, le=4_194_304, description="tokens generated after the prompt (seq_len); "
                            "0 = one prefill forward")
    kv_cache: Literal["dynamic", "static"] = Field(
        "dynamic", description="dynamic = grown as tokens arrive (HF DynamicCache); static = preallocated for "
        "prompt + new tokens (HF StaticCache, LitGPT's KV cache)")
    weights: InferenceWeights | None = Field(
        None, description="how the weights are stored: plain bf16 / fp16 / fp32, bitsandbytes int8 / nf4 / fp4, "
        "GPTQ or AWQ int4 (groups of 128), FineGrainedFP8 (fp8 with 128 x 128 block scales); null = the training "
        "precision's weight dtype. A pasted config.json's quantization_config sets it when the scenario does not")
    double_quant: bool = Field(False, description="bitsandbytes bnb_4bit_use_double_quant: the 4-bit blocks' "
                               "absmax constants quantized again (nf4 / fp4 only)")

    @property
    def quantized(self) -> bool:
        """The weights are stored by a quantization library (not plain bf16 / fp16 / fp32)."""
        return self.weights is not None and self.weights not in PLAIN_WEIGHT_PRECISION

    def precision(self, training: Precision) -> Precision:
        """The precision the inference run computes in: plain weights in their own dtype, quantized ones in 16 bits
        (bf16, or fp16 where the training precision asks for fp16), else the training precision."""
        if self.weights is None:
            return training
        return PLAIN_WEIGHT_PRECISION.get(self.weights) or training.for_inference(gpu_bf16=True)

    @model_validator(mode="after")
    def _double_quant(self) -> InferenceConfig:
        if self.double_quant and self.weights not in ("nf4", "fp4"):
            raise UserError(T_("inference.double_quant applies to 4-bit weights (nf4 / fp4)"))
        return self



def _fill(data: dict[str, Any], key: str, q: ConfigQuantization, field: str = "weights") -> dict[str, Any]:
    """`data` with data[key][field] (and double_quant) from the config's quantization unless data[key] states
    them; a validated block (an object, not a dict) is kept as it is."""
    block = data.get(key, {})
    if not isinstance(block, dict) or field in block:
        return data
    filled = {**block, field: q.weights}
    if q.double_quant and "double_quant" not in block:
        filled["double_quant"] = True
    return {**data, key: filled}


def _torchao_nf4_fits(spec: ModelSpec, targets: str | tuple[str, ...]) -> None:
    """torchtune's QLoRA: torchao's to_nf4 quantizes whole scaler blocks and refuses a weight that is not one."""
    adapted, block = spec.lora_target_names(targets), torchao_nf4_block_elements()
    for lin in spec.linear_layers():
        if torchtune_nf4(spec.family, lin.name, adapted) and (lin.in_features * lin.out_features) % block:
            raise UserError(T_("framework torchtune, QLoRA: torchao stores {name} ({rows} x {cols}) as NF4 only in "
                               "whole blocks of {block} weights; this model's is not a multiple",
                               name=spec.module_name(lin.name), rows=lin.out_features,
                               cols=lin.in_features, block=f"{block:,}"))


class Scenario(BaseModel):
    """Model + hardware + training setup. `model` is a preset id or a Hugging Face config dict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | dict[str, Any]
    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    mode: Mode = Mode.train
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    serving: ServingConfig | None = Field(None, description="mode serve: the engine and its flags (null = vLLM's "
                                          "defaults); inference.weights says how the weights are stored")

    @model_validator(mode="before")
    @classmethod
    def _sequence_within_positions(cls, data: Any) -> Any:
        """A model with a learned position table (GPT-2's n_positions rows) and no seq_len stated takes the shorter
        of the default and its table, so picking GPT-2 alone is a scenario that runs; a stated seq_len past the
        table is refused (_fits_model)."""
        if not isinstance(data, dict) or data.get("model") is None:
            return data
        training = data.get("training", {})
        if not isinstance(training, dict) or "seq_len" in training:
            return data
        try:
            spec = resolve_positions_spec(data["model"])
        except (ValueError, TypeError):  # a bad model is reported by the model field's own validation
            return data
        seq_len = default_seq_len(spec)
        if seq_len == TrainingConfig.model_fields["seq_len"].default:
            return data
        return {**data, "training": {**training, "seq_len": seq_len}}

    @model_validator(mode="before")
    @classmethod
    def _config_quantization(cls, data: Any) -> Any:
        """A pasted config.json's quantization_config sets how the weights are stored: inference.weights (and
        double_quant) in mode inference, lora.base_weights when training with LoRA. A field the scenario states
        wins (the notes say so); full fine-tuning trains 16-bit weights, so there it sets nothing."""
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            return data
        q = config_quantization(data["model"])
        if q is None:
            return data
        if data.get("mode", Mode.train) in (Mode.inference, "inference", Mode.serve, "serve"):
            return _fill(data, "inference", q)
        training = data.get("training")
        lora = training.get("lora") if isinstance(training, dict) else None
        if not isinstance(lora, dict):
            return data
        if q.weights not in BASE_WEIGHTS:
            raise UserError(T_("LoRA on {weights} base weights is not modelled by this version of the calculator; "
                               "use a bitsandbytes (int8 / nf4 / fp4) or 16-bit checkpoint", weights=q.weights))
        return {**data, "training": _fill(training, "lora", q, "base_weights")}

    def quantization_note(self) -> Text | None:
        """What the pasted config's quantization_config did to this scenario, for the pages and the estimate."""
        q = config_quantization(self.model) if isinstance(self.model, dict) else None
        if q is None:
            return None
        lora = self.training.lora
        if self.mode in (Mode.inference, Mode.serve):
            field, got = "inference.weights", self.inference.weights
        elif lora is not None:
            field, got = "lora.base_weights", lora.base_weights
        else:
            return T_("the config's quantization_config ({weights}) is not used: full fine-tuning trains 16-bit "
                      "weights", weights=q.weights)
        if got == q.weights:
            return T_("the config's quantization_config sets {field} = {weights}", field=field, weights=q.weights)
        return T_("{field} = {got} set in the scenario overrides the config's quantization_config ({weights})",
                  field=field, got=got, weights=q.weights)

    @cached_property
    def not_converted(self) -> tuple[str, ...]:
        """A pasted config's modules_to_not_convert, where its quantization is the one the scenario stores
        (inference.weights or lora.base_weights): those modules keep the 16-bit dtype."""
        q = config_quantization(self.model) if isinstance(self.model, dict) else None
        if q is None:
            return ()
        lora = self.training.lora
        stored = (lora.base_weights if lora is not None else
                  self.inference.weights if self.mode in (Mode.inference, Mode.serve) else None)
        return q.not_converted if stored == q.weights else ()

    @cached_property
    def spec(self) -> ModelSpec:
        """The resolved architecture (from the preset or the config dict)."""
        from calc.contract.presets import resolve_model

        return resolve_model(self.model)

    @model_validator(mode="after")
    def _fits_model(self) -> Scenario:
        spec = self.spec  # raises a ValueError naming the problem for unknown presets / bad configs
        t = self.training
        if self.mode != Mode.serve:  # vLLM replicates K/V heads when they are fewer than the GPUs (check_serving_fits)
            check_tensor_parallel(spec, t.tensor_parallel)
            new_tokens = self.inference.new_tokens if self.mode == Mode.inference else 0
            check_positions(spec, t.seq_len + new_tokens)
        if self.serving is not None and self.mode != Mode.serve:
            raise UserError(T_("the serving block applies to mode serve"))
        if self.mode == Mode.serve:
            check_serving_fits(self.serving or ServingConfig(), spec.num_heads, spec.num_kv_heads,
                               self.resolved_hardware().num_gpus, spec.mla, spec.max_position_embeddings)
        if spec.num_layers < t.pipeline_parallel:
            raise UserError(T_("pipeline_parallel={pp} exceeds the {layers} layers", pp=t.pipeline_parallel,
                               layers=spec.num_layers))
        gpus = self.resolved_hardware().num_gpus
        model_parallel = t.tensor_parallel * t.pipeline_parallel
        if gpus % model_parallel:
            raise UserError(T_("num_gpus={gpus} is not a multiple of tensor_parallel x pipeline_parallel = "
                               "{model_parallel}", gpus=gpus, model_parallel=model_parallel))
        self._expert_parallel_fits(gpus)
        if t.optimizer_in_backward and gpus > 1 and self.mode == Mode.train:
            raise UserError(T_("optimizer_in_backward is modelled on one GPU (torchtune's single-device recipes): "
                               "data-parallel gradients are reduced after their hooks run; use num_gpus 1"))
        if spec.attention_sinks and t.attention != Attention.eager and self.mode != Mode.serve:
            raise UserError(T_("attention: gpt_oss runs eager attention in transformers (its attention sinks "
                               "have no SDPA path); choose eager"))
        if t.lora is not None and t.lora.targets == "all-linear" and spec.family == "llama4_text":
            raise UserError(T_("LoRA all-linear on llama4_text: peft wraps Llama 4's router (an nn.Linear that "
                               "returns a tuple) and its forward fails; target attention"))
        if t.lora is not None and t.lora.targets == "all-linear" and spec.family in PEFT_EXPERT_ADAPTER_FAMILIES:
            raise UserError(T_("LoRA all-linear on {family}: peft puts adapters on the routed experts' weights "
                               "and the router, which the estimate does not model; target attention",
                               family=spec.family))
        if t.lora is not None:
            _lora_names_fit(t.lora, spec)
            _lora_fits_training(t, spec)
        if t.framework == "torchtune" and t.lora is not None and t.lora.quantized:
            _torchao_nf4_fits(spec, t.lora.targets)
        if t.framework == "litgpt":
            self._litgpt_fits(spec, gpus)
        if t.framework == "torchtune":
            self._torchtune_builds(gpus)
        if t.activation_offload and self.mode == Mode.train and (gpus > 1 or spec.family not in TORCHTUNE_FAMILIES):
            raise UserError(T_("activation_offload is modelled on one GPU for Llama, Qwen2 and Mistral models (an "
                               "RMSNorm before the output head); use num_gpus 1"))
        if self.inference.weights == "mxfp4" and self.mode in (Mode.inference, Mode.serve) and not spec.moe:
            raise UserError(T_("inference.weights mxfp4 stores a mixture-of-experts model's routed experts (as "
                               "gpt-oss ships them); this model has none: choose another weight format"))
        if t.lora is not None and self.mode == Mode.inference and self.inference.weights is not None:
            raise UserError(T_("with LoRA the base model's storage is lora.base_weights; leave inference.weights "
                               "unset"))
        if self.mode == Mode.inference and self.inference.quantized and (t.zero_stage == 3
                                                                         or t.offload_params != Offload.none):
            raise UserError(T_("quantized inference weights (inference.weights {weights}) are not partitioned or "
                               "offloaded by ZeRO-3; use zero_stage 0-2 without parameter offload",
                               weights=self.inference.weights))
        quantized = t.lora is not None and t.lora.quantized
        if quantized and self.mode == Mode.train and t.zero_stage == 3:
            raise UserError(T_("quantized (int8/nf4) base weights are not partitioned by ZeRO-3; use stage 0-2"))
        if quantized and t.sharding == "fsdp2" and t.zero_stage in (2, 3):
            raise UserError(T_("quantized (int8/nf4/fp4) base weights are modelled with DeepSpeed or plain PyTorch, "
                               "not under FSDP2 (which would shard the packed 4-bit storage)"))
        return self

    def _litgpt_fits(self, spec: ModelSpec, gpus: int) -> None:
        """LitGPT's GPT as the calculator models it: a llama-style config (LITGPT_FAMILIES) without tied
        embeddings (GPT keeps lm_head apart from wte) or a sliding window, trained on one GPU."""
        if spec.family not in LITGPT_FAMILIES or spec.tie_word_embeddings or spec.sliding_window is not None:
            raise UserError(T_("framework litgpt is modelled for Llama, Mistral and Qwen2 configs without tied "
                               "embeddings or a sliding window"))
        if gpus > 1:
            raise UserError(T_("framework litgpt is modelled on one GPU in plain PyTorch (sharding torch)"))
        if self.mode != Mode.train:
            raise UserError(T_("framework litgpt is modelled for its fine-tuning scripts (finetune_full, "
                               "finetune_lora), not for its generation"))

    def _torchtune_builds(self, gpus: int) -> None:
        """torchtune's builders make Llama 3, Qwen2 and Mistral decoders with head_dim = hidden / heads (only Qwen2
        with q / k / v biases); its single-device recipes run on one GPU."""
        spec = self.spec
        if gpus > 1:
            raise UserError(T_("framework torchtune is modelled for its single-device recipes: use one GPU"))
        if self.mode != Mode.train:
            raise UserError(T_("framework torchtune is modelled for training (its fine-tuning recipes); use mode "
                               "train, or framework transformers for inference"))
        plain = spec.head_dim * spec.num_heads == spec.hidden_size and not spec.mlp_bias and not spec.o_bias
        if spec.family not in TORCHTUNE_FAMILIES or not plain or (spec.family != "qwen2" and spec.qkv_bias):
            raise UserError(T_("framework torchtune is modelled for its Llama 3, Qwen2 and Mistral builders (head_dim "
                               "= hidden_size / heads, no MLP or output bias); this {family} model is not one of them",
                               family=spec.family))

    def _expert_parallel_fits(self, gpus: int) -> None:
        """expert_parallel splits a MoE model's routed experts evenly over ranks of one training job."""
        ep, experts = self.training.expert_parallel, self.spec.num_experts
        if ep == 1:
            return
        if experts == 1:
            raise UserError(T_("expert_parallel > 1 needs a mixture-of-experts model; this one is dense"))
        if self.mode != Mode.train:
            raise UserError(T_("expert_parallel is modelled for training (transformers' all-to-all dispatch); use 1"))
        if experts % ep:
            raise UserError(T_("expert_parallel={ep} must divide the {experts} experts per layer", ep=ep,
                               experts=experts))
        if gpus % ep:
            raise UserError(T_("expert_parallel={ep} must divide num_gpus={gpus}", ep=ep, gpus=gpus))

    def variant(self, **fields: Any) -> Scenario:
        """This scenario with some top-level fields (model, hardware, mode, training) replaced,
        validated again. The one way to make a variant: every other field is carried over, so a field
        added later survives the recommender, the waterfall, the what-ifs and Compare."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(fields)
        return type(self).model_validate(data)

    def with_training(self, **changes: Any) -> Scenario:
        """This scenario with some training fields changed (ValidationError / ValueError if the result
        is not a valid scenario)."""
        training = TrainingConfig.model_validate({**self.training.model_dump(), **changes})
        return self.variant(training=training)

    def resolved_hardware(self) -> HardwareConfig:
        """Hardware with a cluster preset expanded into gpu / num_gpus / gpus_per_node."""
        return self._hardware

    @cached_property
    def _hardware(self) -> HardwareConfig:
        from calc.contract.presets import resolve_hardware

        return resolve_hardware(self.hardware)

    @cached_property
    def data_parallel(self) -> int:
        t = self.training
        return self.resolved_hardware().num_gpus // (t.tensor_parallel * t.pipeline_parallel)

    @property
    def global_batch_sequences(self) -> int:
        """training.global_batch_tokens in whole sequences (at least one): the recommender's target."""
        return max(1, round(self.training.global_batch_tokens / self.training.seq_len))

    @property
    def accumulation_to_global_batch(self) -> int:
        """The gradient accumulation that brings this micro-batch and data parallelism nearest the global batch."""
        return max(1, round(self.global_batch_sequences / (self.training.micro_batch_size * self.data_parallel)))

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains as the scenario stands: micro-batch x accumulation x data parallel x
        seq_len (the batch its speed is quoted at)."""
        t = self.training
        return t.micro_batch_size * t.gradient_accumulation_steps * self.data_parallel * t.seq_len


def load_scenario(path: str, data: Any = None) -> Scenario:
    """A scenario JSON file (or '-' for stdin) read by calc.contract.boundary.read_json and validated strictly, or
    already-read `data` validated (no true for 1, no 4096.7 for 4096); UserError naming the file otherwise."""
    if data is None:
        data = read_json(path)
    return validate(Scenario, data, "stdin" if path == "-" else path)


def resolve_positions_spec(model: Any) -> ModelSpec | None:
    """The model's architecture when it is a preset id or a config dict (None otherwise), for defaults that depend
    on it before the scenario is validated."""
    if not isinstance(model, (str, dict)):
        return None
    from calc.contract.presets import resolve_model

    return resolve_model(model)


def default_seq_len(spec: ModelSpec | None) -> int:
    """The sequence length a scenario takes when it states none: 2048, or a shorter learned position table."""
    default = TrainingConfig.model_fields["seq_len"].default
    limit = None if spec is None else longest_sequence(spec)
    return default if limit is None else min(default, limit)

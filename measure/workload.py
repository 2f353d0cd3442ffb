"""The reference workload: the exact training / inference step the calculator predicts.

A scenario becomes: a transformers CausalLM built from its config with random weights (seed 0), one
`input_ids` batch, an optimizer, and `steps` optimizer steps of

    loss = model(input_ids=input_ids, labels=input_ids).loss   # the output object is dropped at once
                                    # (keep_outputs: `outputs = model(...)`; `loss = outputs.loss`, and
                                    # `outputs` is kept until the next forward rebinds it)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss

with the precision, optimizer, checkpointing and attention the scenario asks for. Every choice below
is one line of the contract in the module docstring of measure/__init__.py; change both together.
The step is written once and runs unchanged on cuda, cpu and under FakeTensorMode; the tracker
(measure/trackers.py) marks the phases and attributes the bytes.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from calc.contract.precision import BNB_OPTIMIZER_CLASSES
from calc.contract.scenario import Checkpointing, Mode, Optimizer, OptimizerImpl, Precision, Scenario
from calc.contract.scenario import LoraConfig as LoraSpec
from measure.activation_offload import ActivationOffload, offload_decoder_activations

LEARNING_RATE = 1e-4
FP16_MIXED_LOSS_SCALE = 1024.0  # static loss scale of the fp16-mixed reference (multiply loss, divide grads)

# Attention submodule of a decoder layer, by the attribute name each family uses.
ATTENTION_ATTRS = ("self_attn", "attn", "attention")
# LoRA "attention" targets: the attention projections of every supported family, as one peft regex.
LORA_ATTENTION_REGEX = (
    r".*\.(self_attn|attn|attention)\.(q_proj|k_proj|v_proj|o_proj|qkv_proj|c_attn|c_proj|query_key_value|dense"
    r"|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)"
)


class UnsupportedError(ValueError):
    """The scenario cannot be run on this device (the message says why)."""


@dataclass(frozen=True)
class PrecisionPlan:
    """Where each number lives for one Precision (see calc.contract.scenario.Precision)."""

    weights: torch.dtype  # dtype the model is built in
    autocast: torch.dtype | None  # forward under torch.autocast(device, this), or None
    masters: bool  # fp32 master copies that the optimizer updates (bf16-mixed / fp16-mixed)
    grad_scaler: bool  # torch.amp.GradScaler (amp-fp16)
    static_loss_scale: float | None  # fp16-mixed


def precision_plan(precision: Precision) -> PrecisionPlan:
    return {
        Precision.fp32: PrecisionPlan(torch.float32, None, False, False, None),
        Precision.amp_bf16: PrecisionPlan(torch.float32, torch.bfloat16, False, False, None),
        Precision.amp_fp16: PrecisionPlan(torch.float32, torch.float16, False, True, None),
        Precision.bf16: PrecisionPlan(torch.bfloat16, None, False, False, None),
        Precision.bf16_mixed: PrecisionPlan(torch.bfloat16, None, True, False, None),
        Precision.fp16_mixed: PrecisionPlan(torch.float16, None, True, False, FP16_MIXED_LOSS_SCALE),
    }[precision]


def hf_config_dict(scenario: Scenario) -> dict[str, Any]:
    """The Hugging Face config dict of the scenario's model (a preset's `config`, or the dict itself; a copy)."""
    from calc.export.torchtune import model_config_dict

    return model_config_dict(scenario)


def layer_key(cfg: dict[str, Any]) -> str:
    return "n_layer" if cfg.get("model_type") == "gpt2" else "num_hidden_layers"


def with_layers(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The same config with `num_layers` decoder layers (per-layer lists such as layer_types cut to fit)."""
    cfg = copy.deepcopy(cfg)
    if cfg.get("model_type") == "gpt2":
        cfg.pop("num_hidden_layers", None)
    cfg[layer_key(cfg)] = num_layers
    if isinstance(cfg.get("layer_types"), list):
        types = cfg["layer_types"]
        cfg["layer_types"] = [types[i % len(types)] for i in range(num_layers)]
    return cfg


def build_config(cfg: dict[str, Any], attention: str) -> Any:
    from transformers import AutoConfig

    cfg = dict(cfg)
    model_type = cfg.pop("model_type")
    for key in ("torch_dtype", "dtype", "architectures", "transformers_version", "_name_or_path"):
        cfg.pop(key, None)  # the dtype comes from the scenario's precision, never from the config
    config = AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = attention
    return config


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks (transformers 5: GradientCheckpointingLayer subclasses), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_full_checkpointing(model: nn.Module, every: int) -> None:
    """Checkpoint whole decoder layers: those with index % every == 0 (use_reentrant=False).

    transformers 5 wraps each GradientCheckpointingLayer's `forward` (not `__call__`, so module hooks stay
    outside) and checkpoints it when the layer's `gradient_checkpointing` attribute is True; we set that
    attribute per layer ourselves so the pattern does not depend on the transformers version.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.2x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for i, layer in enumerate(decoder_layers(model)):
        layer.gradient_checkpointing = i % every == 0


def enable_selective_checkpointing(model: nn.Module) -> None:
    """Checkpoint each decoder layer's attention submodule call (projections, RoPE and the attention core);
    the MLP and norms keep their activations. use_reentrant=False. Like transformers' own full
    checkpointing, the recomputed call gets no KV cache (a second cache update would change its shapes).
    """
    from torch.utils.checkpoint import checkpoint

    for layer in decoder_layers(model):
        attn = next((getattr(layer, a) for a in ATTENTION_ATTRS if hasattr(layer, a)), None)
        if attn is None:
            raise UnsupportedError(f"selective checkpointing: no attention submodule in {type(layer).__name__}")
        original = attn.forward

        def forward(*args: Any, _original: Any = original, _module: nn.Module = attn, **kwargs: Any) -> Any:
            if not (torch.is_grad_enabled() and _module.training):
                return _original(*args, **kwargs)
            for key in ("past_key_values", "past_key_value", "layer_past"):
                if kwargs.get(key) is not None:
                    kwargs[key] = None
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        attn.forward = forward


def _lora(model: nn.Module, scenario: Scenario, plan: PrecisionPlan, fake: bool) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise UnsupportedError("LoRA scenarios need peft (pip install -r measure/requirements.txt)") from None
    lora = scenario.training.lora
    assert lora is not None
    names = lora.targets
    targets = list(names) if isinstance(names, tuple) else "all-linear" if names == "all-linear" else LORA_ATTENTION_REGEX
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=targets,  # a list: module names, matched on the last component of each module's path
        lora_dropout=lora.dropout,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )
    # peft keeps adapters in fp32 (autocast_adapter_dtype) unless the run keeps everything in 16 bits.
    keep_16bit = plan.weights != torch.float32 and scenario.training.precision != Precision.fp32
    if not fake:
        return _all_targets_matched(get_peft_model(model, config, autocast_adapter_dtype=not keep_16bit), lora.targets)
    # Fake tensors cannot be moved or cast in place (Module._apply swaps them, and FakeTensorMode holds a
    # weakref to each), so create the adapters directly in the dtype peft would end with and skip its
    # move-to-the-base-layer's-device-and-dtype step (everything is on the cpu already).
    from peft.tuners.tuners_utils import BaseTunerLayer

    original_move = BaseTunerLayer._move_adapter_to_device_of_base_layer
    original_to = nn.Module.to

    def to_cpu_is_a_no_op(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None and (device is None or device.type == "cpu"):
            return self
        return original_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None  # type: ignore[method-assign]
    nn.Module.to = to_cpu_is_a_no_op  # type: ignore[method-assign]
    try:
        with default_dtype(plan.weights if keep_16bit else torch.float32), _fake_module_deepcopy():
            return _all_targets_matched(get_peft_model(model, config, autocast_adapter_dtype=False), lora.targets)
    except RuntimeError as exc:
        raise UnsupportedError(f"LoRA on this model is unsupported on this device (fake): {exc}") from None
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = original_move  # type: ignore[method-assign]
        nn.Module.to = original_to  # type: ignore[method-assign]


@contextlib.contextmanager
def _fake_module_deepcopy() -> Iterator[None]:
    """peft's ModulesToSaveWrapper deep-copies the module it trains (modules_to_save); a deepcopy of fake tensors
    lands in a fake mode of its own, which the forward cannot mix with the model's. Copy modules instead as new
    parameters of the same shape and dtype made in the current mode (what deepcopy allocates), anything else as
    deepcopy does."""
    import copy

    original = copy.deepcopy

    def fresh(module: nn.Module) -> nn.Module:
        new = copy.copy(module)
        new._parameters = {k: None if p is None else nn.Parameter(torch.empty_like(p), requires_grad=p.requires_grad)
                           for k, p in module._parameters.items()}
        new._buffers = {k: None if b is None else torch.empty_like(b) for k, b in module._buffers.items()}
        new._modules = {k: None if m is None else fresh(m) for k, m in module._modules.items()}
        return new

    copy.deepcopy = lambda x, *a, **k: fresh(x) if isinstance(x, nn.Module) else original(x, *a, **k)
    try:
        yield
    finally:
        copy.deepcopy = original


def _all_targets_matched(model: nn.Module, targets: Any) -> nn.Module:
    """peft raises only when no name of a target list matches; a record must not silently leave one out."""
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    missing = sorted(set(targets) - adapted) if isinstance(targets, tuple) else []
    if missing:
        raise UnsupportedError(f"LoRA targets {missing} match no module of this model")
    return model


def quantize_base(model: nn.Module, lora: LoraSpec, device: torch.device) -> None:
    """What transformers' BitsAndBytesConfig does to the model (integrations/bitsandbytes.py
    replace_with_bnb_linear): every plain nn.Linear and Conv1D, except the modules get_keys_to_not_convert names
    (lm_head, tied weights, the last parameter), becomes a bitsandbytes Linear8bitLt (load_in_8bit, threshold
    6.0) or Linear4bit (load_in_4bit: bnb_4bit_quant_type nf4 / fp4, bnb_4bit_use_double_quant, bf16 compute);
    bitsandbytes quantizes each weight when it is moved to `device` (Int8Params / Params4bit .to)."""
    import bitsandbytes as bnb  # noqa: PLC0415  (only for quantized bases)
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = get_keys_to_not_convert(model) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, module in list(model.named_modules()):
        if not should_convert_module(name, skip) or not (isinstance(module, Conv1D) or type(module) is nn.Linear):
            continue
        weight = module.weight.data.T if isinstance(module, Conv1D) else module.weight.data  # Conv1D is in x out
        out_features, in_features = weight.shape
        bias = module.bias is not None
        if lora.base_weights == "int8":
            new = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False, threshold=6.0)
            new.weight = bnb.nn.Int8Params(weight.contiguous(), requires_grad=False, has_fp16_weights=False)
        else:
            new = bnb.nn.Linear4bit(in_features, out_features, bias=bias, compute_dtype=torch.bfloat16,
                                    compress_statistics=lora.double_quant, quant_type=lora.base_weights)
            new.weight = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, quant_type=lora.base_weights,
                                           compress_statistics=lora.double_quant)
        if bias:
            new.bias = nn.Parameter(module.bias.data, requires_grad=False)
        new.source_cls = type(module)  # as transformers marks it (peft reads the original class)
        model.set_submodule(name, new.to(device))


def quantization_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors bitsandbytes keeps beside each quantized weight, outside parameters and buffers: a
    Params4bit's QuantState (absmax, code; with double quant the offset and the nested state's absmax and
    code) and an Int8Params' SCB (its CB is the int8 weight itself)."""
    out: list[torch.Tensor] = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out += [qs.absmax, qs.code]
            if qs.nested:
                out += [qs.offset, qs.state2.absmax, qs.state2.code]
    for m in model.modules():
        state = getattr(m, "state", None)
        scb = getattr(state, "SCB", None) if state is not None else None
        scb = scb if scb is not None else getattr(getattr(m, "weight", None), "SCB", None)
        if isinstance(scb, torch.Tensor):
            out.append(scb)
    return out


@contextlib.contextmanager
def fake_mode_patches() -> Iterator[None]:
    """Make transformers take, on fake tensors, the branch it takes on real ones for our inputs.

    With no KV cache (training with checkpointing), transformers looks for packed sequences in
    position_ids; on real tensors it reads the values, finds none and builds no mask (SDPA runs with
    is_causal), but on fake tensors it cannot read them and materialises a (B, 1, S, S) mask. Our
    position_ids are always arange(S): one sequence per row, so the real answer is None.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def build_model(scenario: Scenario, device: torch.device, num_layers: int | None = None,
                fake: bool = False, weights: torch.dtype | None = None) -> nn.Module:
    """AutoModelForCausalLM.from_config with random weights (seed 0), built in the run's dtype, on `device`.

    weights: build in this dtype instead of the precision's (sharded runs keep fp32 params for FSDP2's
    mixed precision)."""
    from transformers import AutoModelForCausalLM

    t = scenario.training
    plan = precision_plan(run_precision(scenario))
    lora = t.lora
    if lora is not None and lora.quantized and fake:
        raise UnsupportedError(f"LoRA base_weights {lora.base_weights} (bitsandbytes) is unsupported on this device "
                               "(fake): bitsandbytes quantizes real tensors")
    cfg = hf_config_dict(scenario)
    if num_layers is not None:
        cfg = with_layers(cfg, num_layers)
    if weights is None:
        # LoRA base weights: 16-bit, frozen (bf16, or fp16 for a plain fp16 base; bitsandbytes quantizes bf16)
        weights = plan.weights if lora is None else torch.float16 if lora.base_weights == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    # On a GPU the weights are made where they run: random init of a 7B model on the host takes minutes and
    # leaves nothing behind on the device. bitsandbytes quantizes host tensors when they move, so QLoRA bases
    # are still built on the host.
    on_device = device.type == "cuda" and not fake and not (lora is not None and lora.quantized)
    try:
        config = build_config(cfg, t.attention.value)
        with default_dtype(weights), (device if on_device else contextlib.nullcontext()):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=t.attention.value, dtype=weights)
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        msg = str(exc).split(". ")[0] if str(exc) else type(exc).__name__
        raise UnsupportedError(f"transformers cannot build this {cfg.get('model_type')} model: {msg}") from None
    if lora is not None and lora.quantized:
        try:
            quantize_base(model, lora, device)
        except ImportError:
            raise UnsupportedError(f"LoRA base_weights {lora.base_weights} needs bitsandbytes, which is not "
                                   "installed") from None
    if not fake and device.type != "cpu":
        model = model.to(device)
        if on_device:
            torch.cuda.empty_cache()  # the init's temporaries: the run's reserve starts from the weights alone
    if t.cross_entropy == "liger-fused" and scenario.mode == Mode.train:
        _liger_fused_loss(model, device, fake)
    if scenario.mode == Mode.inference:
        model.eval()
        if lora is not None:
            model = _lora(model, scenario, plan, fake)
        return model
    model.train()
    if t.activation_checkpointing == Checkpointing.full:
        enable_full_checkpointing(model, t.checkpoint_every)
    elif t.activation_checkpointing == Checkpointing.selective:
        enable_selective_checkpointing(model)
    if lora is not None:
        model = _lora(model, scenario, plan, fake)
    return model


def _liger_fused_loss(model: nn.Module, device: torch.device, fake: bool) -> None:
    """Liger Kernel's fused linear cross-entropy only (its RMSNorm / SwiGLU / RoPE kernels left off, so
    the rest of the model is the transformers one the calculator models). Triton: CUDA only."""
    if fake or device.type != "cuda":
        raise UnsupportedError("cross_entropy liger-fused runs Liger Kernel's Triton kernels: it needs CUDA "
                               f"(not {'fake' if fake else device.type})")
    try:
        from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance
    except ImportError:
        raise UnsupportedError("cross_entropy liger-fused needs liger-kernel (pip install liger-kernel)") from None
    _apply_liger_kernel_to_instance(model=model, rope=False, rms_norm=False, swiglu=False, geglu=False,
                                    cross_entropy=False, fused_linear_cross_entropy=True)


def make_optimizer(params: list[torch.Tensor], scenario: Scenario, device_type: str,
                   fake: bool = False) -> torch.optim.Optimizer:
    t = scenario.training
    impl = t.optimizer_impl
    if t.optimizer.bitsandbytes:
        return _bitsandbytes_optimizer(params, t.optimizer, fake)
    kwargs: dict[str, Any] = {"lr": LEARNING_RATE}
    if impl == OptimizerImpl.fused:
        if t.optimizer == Optimizer.adafactor:
            raise UnsupportedError("torch.optim.Adafactor has no fused implementation; use foreach or for-loop")
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = impl == OptimizerImpl.foreach  # explicit: the CPU default would be for-loop
    if t.optimizer == Optimizer.adamw:
        return torch.optim.AdamW(params, **kwargs)  # weight_decay 0.01 (torch default)
    if t.optimizer == Optimizer.adam:
        return torch.optim.Adam(params, **kwargs)
    if t.optimizer == Optimizer.sgd:
        return torch.optim.SGD(params, momentum=0.0, **kwargs)
    if t.optimizer == Optimizer.sgd_momentum:
        return torch.optim.SGD(params, momentum=0.9, **kwargs)
    if t.optimizer == Optimizer.adafactor:
        if fake:
            raise UnsupportedError("adafactor is unsupported on this device (fake): torch.optim.Adafactor reads "
                                   "parameter norms with .item(), which fake tensors cannot answer")
        return torch.optim.Adafactor(params, **kwargs)
    raise UnsupportedError(f"optimizer {t.optimizer.value} is not supported")


def _bitsandbytes_optimizer(params: list[torch.Tensor], optimizer: Optimizer, fake: bool) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit, PagedAdamW (32-bit states) and PagedAdamW8bit. On CPU bitsandbytes keeps the
    paged optimizers' states in ordinary tensors (optim/optimizer.py get_state_buffer): CUDA managed memory
    exists on CUDA only."""
    if fake:
        raise UnsupportedError(f"{optimizer.value} (bitsandbytes) is unsupported on this device (fake)")
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise UnsupportedError(f"{optimizer.value} needs bitsandbytes, which is not installed") from None
    return getattr(bnb.optim, BNB_OPTIMIZER_CLASSES[optimizer])(params, lr=LEARNING_RATE)


class OptimizersInBackward:
    """torchtune's optimizer_in_bwd (training/memory.py register_optim_in_bwd_hooks): one optimizer per trainable
    parameter, stepped, and its gradient freed (zero_grad: set_to_none), by a post-accumulate-grad hook as soon as
    autograd has accumulated that parameter's gradient; `state` is every optimizer's, as the runner reads it."""

    def __init__(self, by_param: dict[nn.Parameter, torch.optim.Optimizer], hooks: list[Any]) -> None:
        self.by_param = by_param
        self.hooks = hooks

    def remove_hooks(self) -> None:
        """Unhook the parameters. A hook lives in the parameter's C++ side, so the cycle parameter -> hook ->
        optimizer -> parameter is invisible to the garbage collector: without this every model measured with
        optimizer_in_backward stays allocated after its run (on a GPU, inflating every later record)."""
        for h in self.hooks:
            h.remove()
        self.hooks.clear()

    @property
    def state(self) -> dict[Any, Any]:
        return {p: s for opt in self.by_param.values() for p, s in opt.state.items()}


def optimizers_in_backward(params: list[nn.Parameter], scenario: Scenario, device_type: str,
                           fake: bool) -> OptimizersInBackward:
    by_param = {p: make_optimizer([p], scenario, device_type, fake=fake) for p in params}

    def step(param: torch.Tensor) -> None:
        opt = by_param[param]
        opt.step()
        opt.zero_grad()

    hooks = [p.register_post_accumulate_grad_hook(step) for p in params]
    return OptimizersInBackward(by_param, hooks)


class NullTracker:
    """The tracker interface the step calls; does nothing (used for warm-up runs and tests)."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        yield

    def step_done(self) -> None:
        pass


@dataclass
class Workload:
    scenario: Scenario
    device: torch.device
    model: nn.Module
    input_ids: torch.Tensor
    plan: PrecisionPlan
    fake: bool = False
    params: list[nn.Parameter] = field(default_factory=list)  # trainable model parameters
    masters: list[torch.Tensor] | None = None  # fp32 copies (bf16-mixed / fp16-mixed)
    optimizer: torch.optim.Optimizer | OptimizersInBackward | None = None
    scaler: Any = None
    outputs: Any = None  # keep_outputs: the last model output, as `outputs = model(**batch)` keeps it
    offload: ActivationOffload | None = None  # activation_offload: the decoder's saved tensors on the host

    @property
    def training(self) -> bool:
        return self.scenario.mode == Mode.train

    def release(self) -> None:
        """Break what keeps the model alive after the run (optimizer-in-backward hooks), so its memory is freed."""
        if isinstance(self.optimizer, OptimizersInBackward):
            self.optimizer.remove_hooks()


def run_precision(scenario: Scenario) -> Precision:
    """The precision the step runs in: inference.weights' own (plain weights in their dtype) in mode inference."""
    if scenario.mode != Mode.inference:
        return scenario.training.precision
    if scenario.inference.quantized:
        raise UnsupportedError(f"inference.weights {scenario.inference.weights} is not measured by this workload: "
                               "the quantization libraries' kernels need CUDA")
    return scenario.inference.precision(scenario.training.precision)


def build_workload(scenario: Scenario, device: torch.device, num_layers: int | None = None,
                   fake: bool = False) -> Workload:
    """Model and input on the device; no optimizer yet (see `prepare_optimizer`)."""
    t = scenario.training
    model = build_model(scenario, device, num_layers=num_layers, fake=fake)
    vocab = model.config.get_text_config().vocab_size
    input_ids = torch.randint(0, vocab, (t.micro_batch_size, t.seq_len), device=device)
    offload = None
    if t.activation_offload and scenario.mode == Mode.train:
        if fake:
            raise UnsupportedError("activation_offload is unsupported on this device (fake): its host copies "
                                   "cannot be made outside the fake mode")
        offload = offload_decoder_activations(model, device)
    return Workload(scenario, device, model, input_ids, precision_plan(run_precision(scenario)), fake=fake, offload=offload)


def prepare_optimizer(w: Workload, tracker: Any) -> None:
    """fp32 master copies (created before step 1, one per 16-bit trainable parameter) and the optimizer."""
    if not w.training:
        return
    tracker = tracker if tracker is not None else NullTracker()
    w.params = [p for p in w.model.parameters() if p.requires_grad]
    targets: list[torch.Tensor] = list(w.params)
    if w.plan.masters:
        with tracker.category("optimizer_states"), torch.no_grad():
            w.masters = [p.detach().float() if p.dtype != torch.float32 else p for p in w.params]
        targets = w.masters
    if w.scenario.training.optimizer_in_backward:
        w.optimizer = optimizers_in_backward(w.params, w.scenario, w.device.type, w.fake)
    else:
        w.optimizer = make_optimizer(targets, w.scenario, w.device.type, fake=w.fake)
    if w.plan.grad_scaler:
        w.scaler = torch.amp.GradScaler(w.device.type)


def _autocast(w: Workload) -> contextlib.AbstractContextManager[Any]:
    if w.plan.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(w.device.type, dtype=w.plan.autocast)


def _forward_loss(w: Workload) -> torch.Tensor:
    if w.scenario.training.keep_outputs:  # rebound only when the next forward returns
        w.outputs = w.model(input_ids=w.input_ids, labels=w.input_ids)
        return w.outputs.loss
    return w.model(input_ids=w.input_ids, labels=w.input_ids).loss


def train_step(w: Workload, tracker: Any) -> None:
    """One optimizer step: gradient_accumulation_steps forward/backward micro-steps, then the update."""
    accum = w.scenario.training.gradient_accumulation_steps
    opt = w.optimizer
    assert opt is not None
    if isinstance(opt, OptimizersInBackward):
        _step_in_backward(w, tracker)
        return
    loss = None
    for micro in range(accum):
        with tracker.phase("forward"), _autocast(w):
            loss = _forward_loss(w)
        with tracker.phase("backward"):
            if w.scaler is not None:
                w.scaler.scale(loss).backward()
            elif w.plan.static_loss_scale is not None:
                (loss * w.plan.static_loss_scale).backward()
            else:
                loss.backward()
            if micro < accum - 1:
                del loss
                loss = None
    with tracker.phase("optimizer"):
        if w.masters is not None:
            with tracker.category("gradients"), torch.no_grad():
                for p, m in zip(w.params, w.masters, strict=True):
                    if m is p or p.grad is None:
                        continue
                    m.grad = p.grad.float()  # one parameter at a time: at most one 16-bit grad alive
                    p.grad = None
                    if w.plan.static_loss_scale is not None:
                        m.grad.div_(w.plan.static_loss_scale)
        if w.scaler is not None:
            if w.fake:  # GradScaler.step reads found_inf with .item(), which fake tensors cannot answer
                w.scaler.unscale_(opt)
                opt.step()
            else:
                w.scaler.step(opt)
            w.scaler.update()
        else:
            opt.step()
        if w.masters is not None:
            with torch.no_grad():
                for p, m in zip(w.params, w.masters, strict=True):
                    if m is not p:
                        p.data.copy_(m)
        opt.zero_grad(set_to_none=True)
        del loss


def _step_in_backward(w: Workload, tracker: Any) -> None:
    """optimizer_in_backward: the parameters are stepped inside backward (OptimizersInBackward), one at a time;
    the optimizer phase only marks the end of the step (nothing is left to step or free)."""
    with tracker.phase("forward"), _autocast(w):
        loss = _forward_loss(w)
    with tracker.phase("backward"):
        loss.backward()
    with tracker.phase("optimizer"):
        del loss


def inference_step(w: Workload, tracker: Any) -> None:
    """inference.new_tokens 0: model(input_ids) under no_grad with the config's use_cache (True): KV cache and
    logits alive together. new_tokens > 0: greedy `model.generate` of exactly new_tokens tokens (min_new_tokens
    too, so a random model's end-of-sequence token does not stop it early) with the scenario's cache."""
    inf = w.scenario.inference
    with tracker.phase("forward"), torch.no_grad(), _autocast(w):
        out = w.model(input_ids=w.input_ids) if inf.new_tokens == 0 else _generate(w, tracker)
        del out


def _generate(w: Workload, tracker: Any) -> Any:
    """Greedy generation of exactly new_tokens tokens. MemTracker refuses a second call of the root module within
    one iteration unless its module stats are reset: a forward hook (it runs after MemTracker's own global hook)
    resets them after each of generate's forwards; the byte counts are not touched by the reset."""
    inf = w.scenario.inference
    if w.fake:
        raise UnsupportedError("generation is unsupported on this device (fake): generate reads values of its "
                               "tensors (the padding check, the stopping criteria) that fake tensors cannot answer")
    reset = getattr(tracker, "reset_mod_stats", None)
    hook = w.model.register_forward_hook(lambda *_: reset()) if reset is not None else None
    try:
        return w.model.generate(w.input_ids, attention_mask=torch.ones_like(w.input_ids),
                                max_new_tokens=inf.new_tokens, eos_token_id=None, do_sample=False,
                                cache_implementation="static" if inf.kv_cache == "static" else None,
                                pad_token_id=0)
    finally:
        if hook is not None:
            hook.remove()


def run_steps(w: Workload, tracker: Any, steps: int) -> None:
    for _ in range(steps):
        if w.training:
            train_step(w, tracker)
        else:
            inference_step(w, tracker)
        tracker.step_done()

"""LitGPT's fine-tuning step, measured: litgpt.GPT(Config(...)) under Lightning Fabric on one device.

The step is litgpt/finetune/full.py's `fit` (litgpt 0.5.13, Lightning 2.6):
    logits = model(input_ids)    # a _FabricModule: autocast (bf16-mixed) or bf16 weights; logits cast to fp32
    loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])   # 128-row chunks (litgpt/utils.py;
                                                                          # cross_entropy_chunks: chunk_size)
    fabric.backward(loss); optimizer.step(); optimizer.zero_grad()
or with LoRA finetune/lora.py's (litgpt.lora.GPT, mark_only_lora_as_trainable, `model(input_ids,
lm_head_chunk_size=128)`, the last chunk shortened by a token, chunked_cross_entropy of the list),
with input_ids and targets two int64 (B, S) tensors, as LitGPT's data loaders give them, and the optimizer
`torch.optim.AdamW(model.parameters())` with its defaults (instantiate_torch_optimizer passes no `fused`).
The scenario's model (a Hugging Face config dict or a preset) is mapped onto a litgpt Config once
(`litgpt_config`); only the llama-style families whose mechanisms the calculator models are accepted.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import torch

from calc.contract.litgpt_lora import litgpt_lora_flags, litgpt_quantize_mode
from calc.contract.record import MeasurementRecord
from calc.contract.scenario import Precision, Scenario
from calc.export.litgpt import FABRIC_PRECISION
from measure.runner import (
    measure_depths,
    memtracker_fields,
    optimizer_state_bytes,
    peak_phase,
    weights_bytes,
)
from measure.trackers import PhaseMemTracker
from measure.workload import (
    UnsupportedError,
    Workload,
    hf_config_dict,
    make_optimizer,
    precision_plan,
    quantization_state_tensors,
)

LITGPT_FAMILIES = ("llama", "mistral", "qwen2")  # RMSNorm, LLaMAMLP, one fused qkv, full RoPE


def litgpt_config(hf: dict[str, Any], num_layers: int | None = None, lora: Any = None) -> Any:
    """The litgpt Config of a llama-style Hugging Face config (litgpt/config.py names): one fused qkv Linear,
    RMSNorm, LLaMAMLP, rotary on the whole head, the HF vocabulary as the padded one (no further padding); with
    `lora`, litgpt.lora's Config with finetune/lora.py's flags."""
    from litgpt import Config

    if lora is not None:
        from litgpt.lora import Config

    family = hf.get("model_type")
    if family not in LITGPT_FAMILIES:
        raise UnsupportedError(f"framework litgpt is measured for {', '.join(LITGPT_FAMILIES)} configs, not {family}")
    if hf.get("tie_word_embeddings"):
        raise UnsupportedError("framework litgpt: LitGPT's GPT keeps lm_head apart from the embedding (no tying)")
    heads = hf["num_attention_heads"]
    return Config(
        name=f"hf-{family}", block_size=hf.get("max_position_embeddings", 4096),
        vocab_size=hf["vocab_size"], padded_vocab_size=hf["vocab_size"],
        n_layer=num_layers or hf["num_hidden_layers"], n_embd=hf["hidden_size"], n_head=heads,
        n_query_groups=hf.get("num_key_value_heads", heads), head_size=hf.get("head_dim"),
        intermediate_size=hf["intermediate_size"], rotary_percentage=1.0, parallel_residual=False,
        bias=False, attn_bias=bool(hf.get("attention_bias", family == "qwen2")),
        norm_class_name="RMSNorm", norm_eps=hf.get("rms_norm_eps", 1e-5), mlp_class_name="LLaMAMLP",
        rope_base=int(hf.get("rope_theta", 10000)), **(litgpt_lora_flags(lora) if lora is not None else {}))


def _check(scenario: Scenario) -> None:
    t = scenario.training
    if t.precision not in FABRIC_PRECISION:
        raise UnsupportedError(f"framework litgpt measures precisions {', '.join(p.value for p in FABRIC_PRECISION)}")
    if t.activation_checkpointing.value != "none":
        raise UnsupportedError("framework litgpt: training without checkpointing is measured")
    if t.lora is not None and t.precision != Precision.bf16:
        raise UnsupportedError("framework litgpt: LoRA is measured in bf16-true")
    if t.cross_entropy != "chunked" or t.keep_outputs:
        raise UnsupportedError("framework litgpt: finetune/full.py's chunked_cross_entropy")
    if scenario.resolved_hardware().num_gpus != 1 or scenario.mode.value != "train":
        raise UnsupportedError("framework litgpt: one-device training is measured")


def _build(scenario: Scenario, num_layers: int | None) -> tuple[Any, Workload, torch.Tensor]:
    """Fabric, the workload (model set up by Fabric, input_ids) and the targets."""
    import lightning as L
    from litgpt import GPT
    from litgpt.lora import GPT as LoraGPT
    from litgpt.lora import mark_only_lora_as_trainable

    t = scenario.training
    fabric = L.Fabric(accelerator="cpu", devices=1, precision=FABRIC_PRECISION[t.precision])
    if t.lora is not None and t.lora.quantized:
        _use_bitsandbytes_precision(fabric, t.lora)
    torch.manual_seed(0)
    config = litgpt_config(hf_config_dict(scenario), num_layers, t.lora)
    with fabric.init_module(empty_init=False):
        model = GPT(config) if t.lora is None else LoraGPT(config)
    if t.lora is not None:
        mark_only_lora_as_trainable(model)
    model.max_seq_length = t.seq_len  # finetune/*.py: the longest sequence of the data set
    model = fabric.setup_module(model) if t.lora is not None else fabric.setup(model)
    input_ids = torch.randint(0, config.padded_vocab_size, (t.micro_batch_size, t.seq_len))
    targets = torch.randint(0, config.padded_vocab_size, (t.micro_batch_size, t.seq_len))
    return fabric, Workload(scenario, torch.device("cpu"), model, input_ids, precision_plan(t.precision)), targets


def _use_bitsandbytes_precision(fabric: Any, lora: Any) -> None:
    """finetune/lora.py's --quantize bnb.<mode>: Fabric(plugins=BitsandbytesPrecision(mode, bf16), precision=None).
    Fabric's connector refuses that plugin without CUDA, so the plugin is put where the bf16-true one stood; its own
    code then runs as it is: nn.Linear replaced by _NF4Linear / _FP4Linear (-dq: compress_statistics) under
    init_module, lm_head included (no ignore_modules), quantized by bitsandbytes when setup_module moves the
    model to the device, bf16 as the default dtype in forward, the outputs cast back."""
    from lightning.fabric.plugins import BitsandbytesPrecision

    plugin = BitsandbytesPrecision(litgpt_quantize_mode(lora), torch.bfloat16)
    fabric._connector.precision = plugin
    fabric._strategy.precision = plugin
    fabric._precision = plugin


def _bnb_optimizer_and_stable_embedding(fabric: Any, w: Workload) -> Any:
    """finetune/lora.py under BitsandbytesPrecision: instantiate_bnb_optimizer("AdamW", model.parameters()) (a
    PagedAdamW over every parameter: states only where a gradient comes), then wte swapped for bitsandbytes'
    StableEmbedding (its LayerNorm after the lookup), the old weight copied in and the module cast to its dtype.
    The new module's parameters require grad and are in no optimizer; main's `old_embedding` keeps the old one
    alive through fit. Returns that old module."""
    from bitsandbytes.nn import StableEmbedding
    from litgpt.utils import instantiate_bnb_optimizer

    optimizer = instantiate_bnb_optimizer("AdamW", w.model.parameters())
    old_embedding = w.model.transformer.wte
    w.model.transformer.wte = StableEmbedding(old_embedding.num_embeddings, old_embedding.embedding_dim)
    with torch.no_grad():
        w.model.transformer.wte.weight.copy_(old_embedding.weight)
    w.model.transformer.wte = w.model.transformer.wte.to(device=old_embedding.weight.device,
                                                         dtype=old_embedding.weight.dtype)
    w.optimizer = fabric.setup_optimizers(optimizer)
    return old_embedding


def _step(fabric: Any, w: Workload, targets: torch.Tensor, tracker: Any) -> None:
    """finetune/full.py's step (fit), or finetune/lora.py's with LoRA, one optimizer step: gradient_accumulation_steps
    micro-steps, each backward of loss / accumulation (fit's `fabric.backward(loss / ...)`), then the step."""
    from litgpt.utils import chunked_cross_entropy

    t = w.scenario.training
    chunk = t.cross_entropy_chunks  # None: the function's default, 128 rows
    kwargs = {} if chunk is None else {"chunk_size": chunk}
    accumulation = t.gradient_accumulation_steps
    for _ in range(accumulation):
        with tracker.phase("forward"):
            # fit's local `logits` (fp32: Fabric's convert_output) stays bound through backward and the step until
            # the next forward returns
            if t.lora is None:
                w.outputs = w.model(w.input_ids)
                loss = chunked_cross_entropy(w.outputs[..., :-1, :], targets[..., 1:], **kwargs)
            else:  # finetune/lora.py: the lm_head in 128-token chunks, the last one shortened by a token
                w.outputs = w.model(w.input_ids, lm_head_chunk_size=chunk or 128)
                w.outputs[-1] = w.outputs[-1][..., :-1, :]
                loss = chunked_cross_entropy(w.outputs, targets[..., 1:], **kwargs)
        with tracker.phase("backward"):
            fabric.backward(loss / accumulation if accumulation > 1 else loss)
    with tracker.phase("optimizer"):
        w.optimizer.step()
        w.optimizer.zero_grad()
        del loss


def _measure_once(scenario: Scenario, device: str, steps: int, num_layers: int | None) -> dict[str, Any]:
    gc.collect()
    fabric, w, targets = _build(scenario, num_layers)
    out: dict[str, Any] = {}
    mt = PhaseMemTracker()
    mt.track_external(w.model, w.input_ids, targets)
    if scenario.training.lora is not None and scenario.training.lora.quantized:
        # the Linear4bit quantization state (absmax, code, nested state) lives in attributes, not parameters
        mt.track_parameters(*quantization_state_tensors(w.model))
    with mt:
        w.params = [p for p in w.model.parameters() if p.requires_grad]
        t = scenario.training
        old_embedding = None
        if t.lora is not None and t.lora.quantized:
            old_embedding = _bnb_optimizer_and_stable_embedding(fabric, w)
        else:
            w.optimizer = fabric.setup_optimizers(make_optimizer(w.params, scenario, "cpu"))
        out["weights_bytes"] = weights_bytes(w) + (0 if old_embedding is None else
                                                   old_embedding.weight.numel() * old_embedding.weight.element_size())
        out["initial_allocated_bytes"] = mt.current_total()
        for _ in range(steps):
            _step(fabric, w, targets, mt)
            mt.step_done()
    out.update(memtracker_fields(mt))
    out["peak_allocated_bytes"] = mt.phase_peak[peak_phase(mt.phase_peak)]
    out["optimizer_state_bytes"] = optimizer_state_bytes(w)
    out["num_params"] = sum(p.numel() for p in w.model.parameters())
    out["trainable_params"] = sum(p.numel() for p in w.params)
    out["notes"] = ["peak = MemTracker's live tensor bytes (no 512-byte rounding, no allocator cache); CPU kernels",
                    f"LitGPT {_litgpt_version()} GPT under Lightning Fabric {_fabric_precision_words(t)}: "
                    f"finetune/{'full' if t.lora is None else 'lora'}.py's step"]
    del w, old_embedding
    with contextlib.suppress(Exception):
        del fabric
    gc.collect()
    return out


def _fabric_precision_words(t: Any) -> str:
    if t.lora is not None and t.lora.quantized:
        mode = litgpt_quantize_mode(t.lora)
        return (f"BitsandbytesPrecision({mode}, bf16) (--quantize bnb.{mode}; Fabric's CUDA-only check bypassed), "
                "StableEmbedding, bitsandbytes PagedAdamW")
    return f"precision {FABRIC_PRECISION[t.precision]}"


def _litgpt_version() -> str:
    from importlib.metadata import version

    return version("litgpt")


def measure_litgpt(scenario: Scenario, device: str, steps: int = 3, name: str | None = None,
                   num_layers: int | None = None) -> MeasurementRecord:
    """Measure a framework-litgpt scenario on the CPU (real tensors counted by MemTracker)."""
    if device != "cpu":
        raise UnsupportedError("framework litgpt is measured with --device cpu")
    _check(scenario)
    return measure_depths(_measure_once, scenario, device, steps, name, num_layers, False)

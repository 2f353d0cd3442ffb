"""torchtune's own training step, measured: a scenario with training.framework "torchtune" becomes a torchtune
TransformerDecoder built by its component builder (random weights, seed 0, built in the recipe's dtype) and
`steps` steps of the single-device full fine-tuning recipe's loop (recipes/full_finetune_single_device.py,
torchtune 0.6.1, `_loss_step` and `train`):

    logits = model(tokens)                      # a list of output chunks (set_num_output_chunks) or fp32 logits
    labels = hstack((labels[..., 1:], ignore_labels_cache[:b]))
    loss = loss_fn(logits, labels); del logits  # CEWithChunkedOutputLoss / CrossEntropyLoss
    current_loss = loss * current_num_tokens
    running_loss += current_loss
    current_loss.backward()
    scale_grads(model, 1 / num_tokens); optimizer.step(); optimizer.zero_grad(set_to_none=True)

with activation checkpointing on every TransformerSelfAttentionLayer (training.set_activation_checkpointing) where
the scenario asks for full checkpointing; with LoRA the family's lora_* builder and only the adapters trained
(lora_finetune_single_device.py, the same loop). MemTracker counts the tensors (measure/trackers.py), as for the
transformers reference loop (measure/runner.py), without ModTracker's module gradient hooks
(`_no_module_grad_hooks`), and the record is built the same way; --device fake runs it under FakeTensorMode.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from calc.contract.files import append_line
from calc.contract.record import MeasurementRecord
from calc.contract.scenario import Checkpointing, Mode, Precision, Scenario
from calc.export.torchtune import torchtune_lora_args
from measure.activation_offload import offload_torchtune_activations
from measure.runner import measure_depths, memtracker_fields, unique_storage_bytes
from measure.trackers import PhaseMemTracker
from measure.workload import (
    UnsupportedError,
    default_dtype,
    make_optimizer,
    precision_plan,
)

IGNORE_INDEX = -100  # CEWithChunkedOutputLoss / CrossEntropyLoss default


def torchtune_builder_args(sc: Scenario, num_layers: int | None) -> tuple[str, dict[str, Any]]:
    """The torchtune component builder of the scenario's model and its arguments (calc.export.torchtune, the one
    place a model is mapped to torchtune; its export writes the same builder into the recipe config)."""
    from calc.export import torchtune as tt

    try:
        return tt.torchtune_builder_args(sc, num_layers)
    except ValueError as exc:
        raise UnsupportedError(str(exc)) from None


def build_torchtune_model(sc: Scenario, num_layers: int | None) -> nn.Module:
    """The model as the recipe builds it: under the recipe's default dtype (training.set_default_dtype; the RoPE
    cache stays fp32), LoRA's builder and only the adapters trainable where the scenario has LoRA; then activation
    checkpointing and the output chunks."""
    import importlib

    from torchtune import modules

    path, args = torchtune_builder_args(sc, num_layers)
    module, name = path.rsplit(".", 1)
    t = sc.training
    if t.lora is not None:  # the LoRA builder of the same family (lora_llama3_2, lora_qwen2, ...)
        name = f"lora_{name}"
        args = {**args, **torchtune_lora_args(t.lora)}
    builder = getattr(importlib.import_module(module), name)
    torch.manual_seed(0)
    with default_dtype(precision_plan(t.precision).weights):
        model = builder(**args)
    if t.lora is not None:  # lora_finetune_single_device: only the adapters train
        from torchtune.modules.peft import get_adapter_params, set_trainable_params

        set_trainable_params(model, get_adapter_params(model))
    model.train()
    if t.activation_checkpointing == Checkpointing.full:
        set_activation_checkpointing(model, {modules.TransformerSelfAttentionLayer})
    if t.cross_entropy == "chunked":
        model.set_num_output_chunks(t.cross_entropy_chunks or 8)
    return model


# torchtune.training cannot be imported beside torchao 0.17 (its quantization module imports names torchao no
# longer has), so its two helpers the recipe calls are written out here as they are in torchtune 0.6.1.

def set_activation_checkpointing(model: nn.Module, module_types: set[type]) -> None:
    """torchtune.training.set_activation_checkpointing(model, auto_wrap_policy=<a set of module types>):
    apply_activation_checkpointing with a ModuleWrapPolicy and its default (non-reentrant) checkpoint_wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    apply_activation_checkpointing(model, auto_wrap_policy=ModuleWrapPolicy(module_types))


def scale_grads(model: nn.Module, scaler: torch.Tensor) -> None:
    """torchtune.training.scale_grads: every gradient multiplied in place (training/_grad_scaler.py)."""
    scaler = scaler.to(next(model.parameters()).device)
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= scaler


def loss_function(sc: Scenario) -> nn.Module:
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    t = sc.training
    if t.cross_entropy == "chunked":
        return CEWithChunkedOutputLoss(num_output_chunks=t.cross_entropy_chunks or 8, ignore_index=IGNORE_INDEX)
    return nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)


def check_torchtune(sc: Scenario) -> None:
    t = sc.training
    if sc.mode != Mode.train:
        raise UnsupportedError("framework torchtune: only training is measured")
    if t.precision not in (Precision.bf16, Precision.fp32):
        raise UnsupportedError("framework torchtune: the recipes' dtype is bf16 or fp32")
    if t.lora is not None and t.lora.base_weights not in ("bf16", "nf4"):
        raise UnsupportedError("framework torchtune: LoRA on bf16 or NF4 base weights")
    if sc.resolved_hardware().num_gpus > 1:
        raise UnsupportedError("framework torchtune: the single-device recipe only")
    if t.activation_offload and t.activation_checkpointing != Checkpointing.full:
        raise UnsupportedError("framework torchtune: enable_activation_offloading needs activation checkpointing")


class TorchtuneStep:
    """The recipe's state between steps: model, loss, optimizer, the ignore-labels cache, the tokens."""

    def __init__(self, sc: Scenario, num_layers: int | None) -> None:
        t = sc.training
        self.model = build_torchtune_model(sc, num_layers)
        self.loss_fn = loss_function(sc)
        self.tokens = torch.randint(0, sc.spec.vocab_size, (t.micro_batch_size, t.seq_len))
        self.ignore_labels_cache = torch.full((t.micro_batch_size, 1), IGNORE_INDEX)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, sc, "cpu")
        self.accum = t.gradient_accumulation_steps
        # enable_activation_offloading: the recipe's activations_handling_ctx (measure/activation_offload.py)
        self.offload = offload_torchtune_activations(self.model, torch.device("cpu")) if t.activation_offload \
            else contextlib.nullcontext()

    def loss_step(self, labels: torch.Tensor) -> torch.Tensor:
        with self.offload:
            logits = self.model(self.tokens)
        labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, labels)
        del logits  # the recipe frees the logits before backward
        return loss

    def train_step(self, tracker: Any) -> None:
        running_loss: Any = 0
        num_tokens: Any = 0
        for _ in range(self.accum):
            labels = self.tokens  # the batch's labels: the tokens themselves
            current_num_tokens = (labels != IGNORE_INDEX).sum()
            num_tokens += current_num_tokens
            with tracker.phase("forward"):
                current_loss = self.loss_step(labels) * current_num_tokens
                running_loss += current_loss
            with tracker.phase("backward"):
                current_loss.backward()
        with tracker.phase("optimizer"):
            scale_grads(self.model, 1 / num_tokens)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        del current_loss, running_loss  # the recipe resets running_loss after logging it


def _measure_torchtune_once(sc: Scenario, device: str, steps: int, num_layers: int | None) -> dict[str, Any]:
    gc.collect()
    if device == "fake":  # nothing allocated: the same step on fake tensors, counted the same way
        from torch._subclasses.fake_tensor import FakeTensorMode

        if sc.training.activation_offload:
            raise UnsupportedError("activation_offload is unsupported on this device (fake): its host copies "
                                   "cannot be made outside the fake mode")

        with _unscaled_rope_frequencies(), FakeTensorMode():
            return _measure_torchtune_on(sc, steps, num_layers)
    return _measure_torchtune_on(sc, steps, num_layers)


@contextlib.contextmanager
def _unscaled_rope_frequencies() -> Iterator[None]:
    """Llama3ScaledRoPE.apply_scaling compares each frequency with Python `if`s, which fake tensors cannot answer;
    under fake the frequencies are left unscaled: the same shapes and dtypes, so the same bytes."""
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    original = Llama3ScaledRoPE.apply_scaling
    Llama3ScaledRoPE.apply_scaling = lambda self, freqs, *args, **kwargs: freqs  # type: ignore[method-assign]
    try:
        yield
    finally:
        Llama3ScaledRoPE.apply_scaling = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_module_grad_hooks() -> Iterator[None]:
    """MemTracker's ModTracker puts a multi-grad hook on each module's inputs and outputs; such a hook holds the
    gradients it has seen until every tensor of its group has one, which no run without the tracker does. With
    torchtune's chunked output that keeps one more chunk's logits gradient alive where the output weight's
    gradients are summed (measured: with the hooks the backward peak is that chunk's bytes higher, without them
    it is the tensors the step itself keeps). The hooks only attribute bytes to modules, so they are left out."""
    import torch.distributed._tools.mod_tracker as mod_tracker

    class _NoHook:
        def remove(self) -> None:
            pass

    original = mod_tracker.register_multi_grad_hook
    mod_tracker.register_multi_grad_hook = lambda *args, **kwargs: _NoHook()
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = original


def _measure_torchtune_on(sc: Scenario, steps: int, num_layers: int | None) -> dict[str, Any]:
    step = TorchtuneStep(sc, num_layers)
    mt = PhaseMemTracker()
    mt.track_external(step.model, step.tokens, step.ignore_labels_cache)
    out: dict[str, Any] = {}
    with _no_module_grad_hooks(), mt:
        out["weights_bytes"] = unique_storage_bytes(list(step.model.parameters()) + list(step.model.buffers()))
        out["initial_allocated_bytes"] = mt.current_total()
        for _ in range(steps):
            step.train_step(mt)
            mt.step_done()
    out.update(memtracker_fields(mt))
    out["peak_allocated_bytes"] = max(mt.phase_peak.values())
    states = [v for state in step.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    out["optimizer_state_bytes"] = unique_storage_bytes(states)
    out["num_params"] = sum(p.numel() for p in step.model.parameters())
    out["trainable_params"] = sum(p.numel() for p in step.params)
    out["notes"] = ["peak = MemTracker's live tensor bytes (no 512-byte rounding, no allocator cache, no "
                    "kernel-internal workspaces); CPU kernels",
                    "torchtune 0.6.1 TransformerDecoder from its component builder; the single-device full "
                    "fine-tuning recipe's step; inputs: the tokens and the recipe's ignore_labels_cache",
                    "MemTracker without ModTracker's module gradient hooks (they hold gradients no plain run keeps)"]
    del step
    gc.collect()
    return out


def measure_torchtune(sc: Scenario, device: str, steps: int = 3, name: str | None = None,
                      num_layers: int | None = None, extrapolate_layers: bool = False) -> MeasurementRecord:
    """Measure a torchtune scenario on the CPU (measure.entry.measure dispatches here)."""
    if device not in ("cpu", "fake"):
        raise UnsupportedError("framework torchtune is measured with --device cpu or fake")
    check_torchtune(sc)
    return measure_depths(_measure_torchtune_once, sc, device, steps, name, num_layers, extrapolate_layers)


# ---- the committed records (data/measured_torchtune.jsonl) -----------------------------------------------------------

_ROPE_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_LLAMA32 = {"model_type": "llama", "vocab_size": 2000, "hidden_size": 128, "intermediate_size": 344,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "tie_word_embeddings": True, "rope_scaling": _ROPE_SCALING}
_LLAMA31 = {**_LLAMA32, "tie_word_embeddings": False, "vocab_size": 3000, "num_hidden_layers": 3}
_LLAMA3 = {k: v for k, v in _LLAMA31.items() if k != "rope_scaling"} | {"num_key_value_heads": 4}
_QWEN2 = {"model_type": "qwen2", "vocab_size": 2500, "hidden_size": 128, "intermediate_size": 300,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "tie_word_embeddings": True}
_MISTRAL = {"model_type": "mistral", "vocab_size": 2200, "hidden_size": 128, "intermediate_size": 320,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 256,
            "sliding_window": None}
_BASE = {"framework": "torchtune", "micro_batch_size": 2, "seq_len": 128}
# QLoRA: torchao's to_nf4 quantizes in whole scaler blocks (64 x 256 elements), so every linear needs a multiple of
# 16,384 weights: hidden 256, intermediate 512
_QLORA_LLAMA31 = {**_LLAMA31, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2}
_QLORA_LLAMA32 = {**_QLORA_LLAMA31, "tie_word_embeddings": True, "vocab_size": 2000}
_QLORA_MISTRAL = {**_MISTRAL, "hidden_size": 256, "intermediate_size": 512}
_QLORA_QWEN2 = {**_QWEN2, "hidden_size": 256, "intermediate_size": 1024}


def _qlora(targets: str | list[str], rank: int = 8, **more: Any) -> dict[str, Any]:
    return {"rank": rank, "alpha": 2 * rank, "targets": targets, "base_weights": "nf4", **more}


# name -> (model, training fields beyond _BASE); the framework's defaults fill the rest
TORCHTUNE_SUITE: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tt-llama3.2-tied-bf16-chunked8": (_LLAMA32, {}),
    "tt-llama3.2-tied-bf16-b1-s256": (_LLAMA32, {"micro_batch_size": 1, "seq_len": 256}),
    "tt-llama3.2-tied-bf16-ckpt": (_LLAMA32, {"activation_checkpointing": "full"}),
    "tt-llama3.1-bf16-chunked8": (_LLAMA31, {"micro_batch_size": 3, "seq_len": 96}),
    "tt-llama3.1-bf16-chunks5-s100": (_LLAMA31, {"seq_len": 100, "cross_entropy_chunks": 5}),
    "tt-llama3.1-bf16-standard-loss": (_LLAMA31, {"cross_entropy": "standard"}),
    "tt-llama3.1-bf16-ckpt-accum2": (_LLAMA31, {"activation_checkpointing": "full", "gradient_accumulation_steps": 2}),
    "tt-llama3-mha-bf16-sgd": (_LLAMA3, {"optimizer": "sgd-momentum"}),
    "tt-llama3-mha-fp32-chunked8": (_LLAMA3, {"precision": "fp32", "micro_batch_size": 1}),
    "tt-llama3.2-tied-fp32-ckpt": (_LLAMA32, {"precision": "fp32", "activation_checkpointing": "full"}),
    "tt-qwen2-tied-bf16-chunked8": (_QWEN2, {}),
    "tt-qwen2-bf16-ckpt-b1": (_QWEN2 | {"tie_word_embeddings": False, "num_hidden_layers": 3},
                              {"activation_checkpointing": "full", "micro_batch_size": 1, "seq_len": 192}),
    "tt-qwen2-fp32-standard-loss": (_QWEN2, {"precision": "fp32", "cross_entropy": "standard"}),
    "tt-llama3.2-tied-lora-attention": (_LLAMA32, {"lora": {"rank": 8, "alpha": 16, "targets": "attention"}}),
    "tt-llama3.1-lora-all-linear-ckpt": (_LLAMA31, {"lora": {"rank": 16, "alpha": 32, "targets": "all-linear"},
                                                    "activation_checkpointing": "full"}),
    "tt-mistral-bf16-chunked8": (_MISTRAL, {}),
    "tt-mistral-lora-attention-ckpt": (_MISTRAL, {"lora": {"rank": 8, "alpha": 16, "targets": "attention"},
                                                  "activation_checkpointing": "full"}),
    "tt-qwen2-lora-all-linear-b1": (_QWEN2, {"lora": {"rank": 8, "alpha": 16, "targets": "all-linear"},
                                             "micro_batch_size": 1, "seq_len": 160}),
    # QLoRA (quantize_base): the first five were the development cases, the last three were measured after
    "tt-qlora-llama3.1-attention": (_QLORA_LLAMA31, {"lora": _qlora("attention")}),
    "tt-qlora-llama3.1-all-linear-ckpt": (_QLORA_LLAMA31, {"lora": _qlora("all-linear"),
                                                           "activation_checkpointing": "full"}),
    "tt-qlora-llama3.2-tied-all-linear-dropout": (_QLORA_LLAMA32, {"lora": _qlora("all-linear", 16, dropout=0.05),
                                                                   "micro_batch_size": 1, "seq_len": 200}),
    "tt-qlora-mistral-attention-ckpt-accum2": (_QLORA_MISTRAL, {"lora": _qlora("attention"),
                                                                "activation_checkpointing": "full",
                                                                "gradient_accumulation_steps": 2}),
    "tt-qlora-qwen2-tied-attention-b3": (_QLORA_QWEN2, {"lora": _qlora("attention"), "micro_batch_size": 3,
                                                        "seq_len": 96}),
    "tt-qlora-qwen2-all-linear-ckpt-dropout": (_QLORA_QWEN2, {"lora": _qlora("all-linear", dropout=0.1),
                                                              "activation_checkpointing": "full",
                                                              "micro_batch_size": 1, "seq_len": 160}),
    "tt-qlora-llama3.1-qv-ckpt-s256": (_QLORA_LLAMA31, {"lora": _qlora(["q_proj", "v_proj"], 4),
                                                        "activation_checkpointing": "full", "micro_batch_size": 1,
                                                        "seq_len": 256}),
    "tt-qlora-mistral-all-linear-s96": (_QLORA_MISTRAL, {"lora": _qlora("all-linear", 16), "seq_len": 96}),
}


# full-size presets under FakeTensorMode: name -> (preset, training fields beyond the framework)
TORCHTUNE_FAKE_SUITE: dict[str, tuple[str, dict[str, Any]]] = {
    "tt-fake-llama-3.2-1b-bf16-s2048": ("llama-3.2-1b", {"micro_batch_size": 1, "seq_len": 2048}),
    "tt-fake-llama-3.2-3b-bf16-2x4096-ckpt": ("llama-3.2-3b", {"micro_batch_size": 2, "seq_len": 4096,
                                                               "activation_checkpointing": "full"}),
    "tt-fake-qwen2.5-0.5b-bf16-4x1024": ("qwen2.5-0.5b", {"micro_batch_size": 4, "seq_len": 1024}),
}


def suite_scenario(name: str) -> Scenario:
    if name in TORCHTUNE_FAKE_SUITE:
        preset, training = TORCHTUNE_FAKE_SUITE[name]
        return Scenario.model_validate({"model": preset, "training": {"framework": "torchtune", **training}})
    model, training = TORCHTUNE_SUITE[name]
    return Scenario.model_validate({"model": model, "training": {**_BASE, **training}})


def main(argv: list[str] | None = None) -> int:
    """python -m measure.frameworks.torchtune_run [-o FILE] [--only NAME ...]: measure the suite on the CPU."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m measure.frameworks.torchtune_run")
    ap.add_argument("-o", "--output", help="append each record as one JSON line to this file")
    ap.add_argument("--only", nargs="*", help="suite entries to run (default: all)")
    args = ap.parse_args(argv)
    for name in args.only or [*TORCHTUNE_SUITE, *TORCHTUNE_FAKE_SUITE]:
        device = "fake" if name in TORCHTUNE_FAKE_SUITE else "cpu"
        line = measure_torchtune(suite_scenario(name), device, steps=3, name=name).to_json_line()
        print(line[:160], flush=True)
        if args.output:
            append_line(args.output, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

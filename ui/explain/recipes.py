"""Worked recipes: a few named scenarios per question ("7B on one RTX 4090?"), each run through
the engine and the speed model by the page. Scenario JSON, so they are data, not code paths."""

from __future__ import annotations

from typing import Any

import streamlit as st

from calc.contract.i18n import N_
from calc.contract.scenario import Scenario
from calc.memory.engine import estimate
from calc.memory.host import host_ram_words
from ui.explain.figures import hardware_label, run, speed

W4090 = {"cluster": "1x-rtx-4090"}
A100X8 = {"cluster": "8x-a100-80gb"}
CKPT = {"activation_checkpointing": "full", "attention": "sdpa"}

RECIPES: tuple[tuple[str, str, tuple[tuple[str, dict[str, Any], str], ...]], ...] = (
    (N_("7B on one RTX 4090"), N_("Llama-2-7B, 1 x 2,048 tokens, a workstation with 64 GiB of host RAM and a 2 TB NVMe SSD"), (
        (N_("full fine-tune, ZeRO-2 + optimizer offload to CPU"),
         {"model": "llama-2-7b", "hardware": W4090,
          "training": {"precision": "bf16-mixed", "zero_stage": 2, "offload_optimizer": "cpu", **CKPT}},
         N_("the GPU fits; the host RAM decides:")),
        (N_("full fine-tune, ZeRO-3 + optimizer offload to NVMe"),
         {"model": "llama-2-7b", "hardware": W4090,
          "training": {"precision": "bf16-mixed", "zero_stage": 3, "offload_optimizer": "nvme", **CKPT}},
         N_("fits, but every step streams the optimizer states through the SSD")),
        (N_("LoRA r=16, bf16 base"),
         {"model": "llama-2-7b", "hardware": W4090,
          "training": {"precision": "amp-bf16", "lora": {"rank": 16}, **CKPT}},
         N_("13.5 GB of frozen bf16 weights; the adapters train at full speed")),
        (N_("QLoRA r=16, NF4 base"),
         {"model": "llama-2-7b", "hardware": W4090,
          "training": {"precision": "amp-bf16", "lora": {"rank": 16, "base_weights": "nf4"}, **CKPT}},
         N_("3.5 GB of 4-bit base weights; room for longer sequences or bigger batches")),
    )),
    (N_("13B on one RTX 4090"), N_("Llama-2-13B, 1 x 512 tokens (article 001's case)"), (
        (N_("LoRA r=16, bf16 base"),
         {"model": "llama-2-13b", "hardware": W4090,
          "training": {"precision": "amp-bf16", "lora": {"rank": 16}, "seq_len": 512, **CKPT}},
         N_("26 GB of bf16 weights alone exceed the card")),
        (N_("QLoRA r=64, NF4 base (the article's setting)"),
         {"model": "llama-2-13b", "hardware": W4090,
          "training": {"precision": "amp-bf16", "lora": {"rank": 64, "base_weights": "nf4"}, "seq_len": 512, **CKPT}},
         N_("fits: 6.8 GB of NF4 weights + r=64 adapters with fp32 AdamW states")),
    )),
    (N_("70B on 8 x A100 80GB"), N_("Llama-2-70B, 1 x 2,048 tokens per GPU, one node with 1 TiB of host RAM"), (
        (N_("full fine-tune, ZeRO-3 + checkpointing"),
         {"model": "llama-2-70b", "hardware": A100X8, "training": {"precision": "bf16-mixed", "zero_stage": 3, **CKPT}},
         N_("16 B/param / 8 GPUs = 140 GB per GPU of model states")),
        (N_("full fine-tune, ZeRO-3 + optimizer offload to CPU"),
         {"model": "llama-2-70b", "hardware": A100X8,
          "training": {"precision": "bf16-mixed", "zero_stage": 3, "offload_optimizer": "cpu", **CKPT}},
         N_("the GPUs fit; the host RAM decides:")),
        (N_("full fine-tune, pure bf16 + 8-bit AdamW, ZeRO-3"),
         {"model": "llama-2-70b", "hardware": A100X8,
          "training": {"precision": "bf16", "optimizer": "adamw-8bit", "zero_stage": 3, **CKPT}},
         N_("6 B/param; no fp32 master copy, so use stochastic rounding or Kahan summation for the bf16 updates")),
        (N_("full fine-tune, ZeRO-3 + optimizer offload to NVMe"),
         {"model": "llama-2-70b", "hardware": A100X8,
          "training": {"precision": "bf16-mixed", "zero_stage": 3, "offload_optimizer": "nvme", **CKPT}},
         N_("fits; the SSDs are the bottleneck (every step streams the optimizer states through them)")),
        (N_("LoRA r=16, bf16 base, ZeRO-3"),
         {"model": "llama-2-70b", "hardware": A100X8,
          "training": {"precision": "bf16-mixed", "zero_stage": 3, "lora": {"rank": 16}, **CKPT}},
         N_("the frozen weights are sharded; the adapters are tiny")),
    )),
)


@st.cache_data(max_entries=2, show_spinner=False)
def recipe_rows() -> list[dict[str, Any]]:
    """Each recipe with the engine's device total, verdict (GPU, host RAM, NVMe) and tokens/s. Titles,
    settings, labels and notes are English message ids (the page translates them with ui.language.tr)."""
    out = []
    for title, setting, items in RECIPES:
        rows = []
        for label, data, note in items:
            sc = Scenario.model_validate(data)
            # at the default global batch, as every speed in the app: the accumulation that reaches it
            sc = sc.with_training(gradient_accumulation_steps=sc.accumulation_to_global_batch)
            est = estimate(sc)
            # a host-RAM row's note quotes the engine's parts (calc.memory.host), not a rule of thumb
            words = host_ram_words(est.host_memory)
            rows.append({"label": label, "note": note, "host_words": words, "run": run(sc), "speed": speed(sc),
                         "hardware": hardware_label(sc), "scenario": data, "tokens_per_step": sc.tokens_per_step})
        out.append({"title": title, "setting": setting, "rows": rows})
    return out

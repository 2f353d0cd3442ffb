"""vramcalc side by side with peer calculators, in one process: CPU time per estimate (prints numbers; not a test).

    PYTHONPATH=. python benchmarks/peers.py [--rounds 15]

The workload of issue 12: Llama-2-70B (80 layers), training, bf16 mixed precision, ZeRO-3, 64x A100-80GB,
micro-batch 1 x 4096 tokens. Each figure is the median over --rounds rounds of the CPU time
(time.process_time) per call, so other work on a shared machine does not inflate it. vramcalc is timed
three times: a repeated scenario (its memo answers), a new shape on every call (the memo and the profiles
kept per shape cleared first, so the recorded blocks are evaluated for the shape and the timeline composed
again; what does not depend on the shape, the blocks' recordings and the model states, is kept) and a new
parallel layout of the same shape on every call (GPU count x ZeRO stage; the block profiles kept, as in a
search).

Peers are measured when they are importable and skipped otherwise; this script installs nothing:
- llm-analysis (PyPI `llm-analysis`; it pins transformers < 5, so install it with --no-deps into a
  scratch environment): LLMAnalysis.training with its Llama-2-70B config, the same parallelism and ZeRO-3;
- George614/gpu-mem-calculator (GitHub, not on PyPI; `pip install -e` a checkout): GPUMemoryCalculator
  with the 70B shape, DeepSpeed ZeRO-3.
Their configuration objects are built once, outside the timed calls, as vramcalc's presets are.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import time
from collections.abc import Callable

from calc.contract.scenario import Scenario
from calc.memory.engine import clear_memo, estimate

LAYERS, HIDDEN, HEADS, VOCAB = 80, 8192, 64, 32000
GPUS, BATCH, SEQ = 64, 1, 4096


def scenario(batch: int = BATCH, seq: int = SEQ, gpus: int = GPUS, zero: int = 3) -> Scenario:
    return Scenario.model_validate({
        "model": "llama-2-70b", "hardware": {"gpu": "a100-80gb", "num_gpus": gpus},
        "training": {"micro_batch_size": batch, "seq_len": seq, "precision": "bf16-mixed", "zero_stage": zero,
                     "activation_checkpointing": "full"}})


def per_call_us(fn: Callable[[], object], rounds: int, calls: int) -> float:
    """Median over rounds of the CPU microseconds per call."""
    fn()  # imports and one-time set-up outside the timing
    out = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            fn()
        out.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(out)


def vramcalc_cases() -> dict[str, Callable[[], object]]:
    sc = scenario()
    shapes = itertools.cycle([scenario(b, s) for b in (1, 2, 3, 4) for s in (1024, 2048, 3072, 4096, 6144, 8192)])

    def new_shape() -> object:
        clear_memo()
        return estimate(next(shapes))

    layouts = itertools.cycle([scenario(gpus=g, zero=z) for g in (8, 16, 32, 64, 128, 256) for z in (0, 1, 2, 3)])

    def new_layout() -> object:  # what a search asks: the same shape on another parallel layout
        clear_memo(profiles=False)
        return estimate(next(layouts))

    return {"vramcalc, repeated scenario": lambda: estimate(sc), "vramcalc, new shape each call": new_shape,
            "vramcalc, new layout each call": new_layout}


def llm_analysis_case() -> Callable[[], object] | None:
    try:
        from llm_analysis.analysis import (
            ActivationRecomputation,
            DSZeRO,
            LLMAnalysis,
            ParallelismConfig,
            get_dtype_config_by_name,
            get_gpu_config_by_name,
            get_model_config_by_name,
        )
    except Exception:  # noqa: BLE001 - not installed, or installed against another transformers
        return None
    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    analysis = LLMAnalysis(get_model_config_by_name("upstage_Llama-2-70b-instruct-v2"),
                           get_gpu_config_by_name("a100-sxm-80gb"), get_dtype_config_by_name("w16a16e16"),
                           ParallelismConfig(dp_size=GPUS))
    return lambda: analysis.training(batch_size_per_gpu=BATCH, gradient_accumulation_steps=1, seq_len=SEQ,
                                     activation_recomputation=ActivationRecomputation(2), ds_zero=DSZeRO(3),
                                     flash_attn=True, mlp_gated_linear_units=True)


def george614_case() -> Callable[[], object] | None:
    try:
        from gpu_mem_calculator.core.calculator import GPUMemoryCalculator
        from gpu_mem_calculator.core.models import (
            EngineConfig,
            GPUConfig,
            ModelConfig,
            ParallelismConfig,
            TrainingConfig,
        )
    except Exception:  # noqa: BLE001 - not installed
        return None
    calc = GPUMemoryCalculator(
        model_config=ModelConfig(name="llama2-70b", num_parameters=68_976_648_192, num_layers=LAYERS,
                                 hidden_size=HIDDEN, num_attention_heads=HEADS, vocab_size=VOCAB, max_seq_len=SEQ),
        training_config=TrainingConfig(batch_size=BATCH, gradient_accumulation_steps=1, dtype="bf16",
                                       optimizer="adamw", activation_checkpointing=1),
        parallelism_config=ParallelismConfig(data_parallel_size=GPUS, tensor_parallel_size=1,
                                             pipeline_parallel_size=1),
        engine_config=EngineConfig(type="deepspeed", zero_stage=3, offload_optimizer="none", offload_param="none"),
        gpu_config=GPUConfig(num_gpus=GPUS, gpu_memory_gb=80))
    return calc.calculate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    cases: dict[str, Callable[[], object] | None] = {
        **vramcalc_cases(), "llm-analysis": llm_analysis_case(), "George614/gpu-mem-calculator": george614_case()}
    print(f"Llama-2-70B training, ZeRO-3, {GPUS}x A100-80GB, {BATCH} x {SEQ} tokens; CPU time per call, "
          f"median of {args.rounds} rounds")
    for name, fn in cases.items():
        if fn is None:
            print(f"{name:32s} {'skipped (not installed)':>24s}")
            continue
        us = per_call_us(fn, args.rounds, calls=max(5, min(200, int(20_000 / max(1.0, _probe_us(fn))))))
        print(f"{name:32s} {us:10.1f} us per estimate  ({1e6 / us:9,.0f} per s)")


def _probe_us(fn: Callable[[], object]) -> float:
    start = time.process_time()
    for _ in range(5):
        fn()
    return (time.process_time() - start) / 5 * 1e6


if __name__ == "__main__":
    main()

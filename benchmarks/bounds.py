"""Worst-case cost of a scenario at the bounds of calc.contract.limits (a benchmark that prints numbers, not a
test): estimate, fit, recommend and the DeepSpeed export, on one core, for the largest shapes and
counts validation lets through. Run: PYTHONPATH=. python benchmarks/bounds.py
"""

from __future__ import annotations

import time

from calc.contract import limits
from calc.contract.scenario import Scenario
from calc.export import export_deepspeed
from calc.memory.engine import estimate
from calc.memory.fit import largest_fitting
from calc.recommend import RecommendRequest, recommend

DENSE = {"model_type": "llama", "num_hidden_layers": limits.MAX_LAYERS, "hidden_size": limits.MAX_HIDDEN,
         "num_attention_heads": limits.MAX_HEADS, "num_key_value_heads": limits.MAX_HEADS,
         "head_dim": limits.MAX_HIDDEN // limits.MAX_HEADS, "intermediate_size": limits.MAX_INTERMEDIATE,
         "vocab_size": limits.MAX_VOCAB, "max_position_embeddings": limits.MAX_POSITIONS}
MOE = {**DENSE, "model_type": "mixtral", "num_local_experts": limits.MAX_EXPERTS,
       "num_experts_per_tok": limits.MAX_EXPERTS, "sliding_window": limits.MAX_POSITIONS}
GPT2 = {"model_type": "gpt2", "n_layer": limits.MAX_LAYERS, "n_embd": limits.MAX_HIDDEN, "n_head": limits.MAX_HEADS,
        "n_positions": limits.MAX_POSITIONS, "vocab_size": limits.MAX_VOCAB}
BIG_JOB = {"micro_batch_size": 65536, "seq_len": 4_194_304, "gradient_accumulation_steps": 65536,
           "attention": "eager", "precision": "fp32", "optimizer": "adafactor", "optimizer_impl": "for-loop"}

CASES = {
    "dense, max shapes, 1 GPU": (DENSE, {"gpu": "h100-sxm"}, BIG_JOB),
    "dense, full ckpt every 1, ZeRO-3 + NVMe offload, 65,536 GPUs": (
        DENSE, {"gpu": "h100-sxm", "num_gpus": 65536},
        {**BIG_JOB, "activation_checkpointing": "full", "zero_stage": 3, "offload_optimizer": "nvme",
         "offload_params": "nvme"}),
    "dense, TP 1,024 x PP 64 on 65,536 GPUs": (
        DENSE, {"gpu": "h100-sxm", "num_gpus": 65536},
        {**BIG_JOB, "tensor_parallel": 1024, "pipeline_parallel": 64, "sequence_parallel": True, "zero_stage": 1}),
    "MoE, 2,048 experts, LoRA r=4096 nf4 on attention": (
        MOE, {"gpu": "mi300x", "num_gpus": 65536},
        {**BIG_JOB, "precision": "amp-bf16", "lora": {"rank": 4096, "targets": "attention", "base_weights": "nf4"}}),
    "deep and narrow (everything fits: the search estimates most)": (
        {"model_type": "llama", "num_hidden_layers": limits.MAX_LAYERS, "hidden_size": 128, "num_attention_heads": 2,
         "intermediate_size": 256, "vocab_size": 1024}, {"gpu": "h100-sxm", "num_gpus": 65536},
        {"micro_batch_size": 1, "seq_len": 4096, "gradient_accumulation_steps": 65536}),
    "gpt2, max shapes, selective ckpt": (GPT2, {"gpu": "h100-sxm", "num_gpus": 8},
                                         {**BIG_JOB, "activation_checkpointing": "selective"}),
}


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    try:
        out = fn()
    except ValueError as exc:  # e.g. recommend needs a GPU preset
        out = f"ValueError: {str(exc)[:60]}"
    return time.perf_counter() - t0, out


def main() -> None:
    print(f"{'case':62s} {'estimate s':>10s} {'fit s':>7s} {'recommend s':>11s} {'export s':>8s}")
    for name, (model, hw, training) in CASES.items():
        sc = Scenario.model_validate({"model": model, "hardware": hw, "training": training})
        t_est, _ = timed(lambda sc=sc: estimate(sc))
        t_fit, _ = timed(lambda sc=sc: (largest_fitting(sc, "micro_batch_size"), largest_fitting(sc, "seq_len")))
        t_rec, _ = timed(lambda sc=sc: recommend(RecommendRequest(scenario=sc, allow_method_change=True)))
        t_exp, _ = timed(lambda sc=sc: export_deepspeed(sc))
        print(f"{name:62s} {t_est:10.3f} {t_fit:7.2f} {t_rec:11.2f} {t_exp:8.3f}")


if __name__ == "__main__":
    main()

"""Step time and tokens/s per GPU for a scenario: compute, exposed communication and offload, each
term with its formula and source. Seconds and bytes inside; convert at the edge.

Conventions (said once, used in every module of this package):

* FLOPs per token follow PaLM (Chowdhery et al. 2022, arXiv 2204.02311, appendix B) and
  Narayanan et al. 2021 (arXiv 2104.04473, eq. 3): a matmul with weight W costs 2|W| FLOPs per token
  forward and 4|W| backward (input gradient + weight gradient), so training costs 6 x N per token
  (Kaplan et al. 2020, arXiv 2001.08361, table 1). N counts the weights that are multiplied per token:
  every decoder layer's linear maps (for MoE only the experts a token is routed to) plus the LM head
  (V x H, also when tied); the embedding lookup and norms do no matmul.
* Attention scores and context (QK^T and PV) add 2 x 2 x S x d_attn per layer per token forward,
  i.e. 12 x L x S x d_attn per token for training, counting the full S x S square (non-causal), as
  PaLM and Megatron do. FlashAttention's causal kernels skip the masked half, but the published MFU
  figures we calibrate against use the full-square convention, so using it keeps our MFU comparable;
  `SpeedAssumptions.attention_flops="causal"` halves the term instead.
* Frozen LoRA base weights need no weight gradient: 4 x N_base (forward + input gradient) plus 6 x the
  adapters' own weights (Hu et al. 2021, arXiv 2106.09685; the QLoRA paper, Dettmers et al. 2023,
  arXiv 2305.14314, section 2, for the dequantise-then-matmul scheme).
* Recomputation: full checkpointing of 1 in k layers reruns those layers' forward (2 x N_layer +
  4 x S x d_attn per token and layer); selective checkpointing reruns only the attention core
  (4 x S x d_attn per layer; Korthikanti et al. 2022, arXiv 2205.05198, section 5).
* The executed FLOPs (model FLOPs + recomputation) run at `mfu` x the GPU's dense peak for the compute
  dtype. Because recomputation is included, `mfu` is strictly a hardware-FLOPs utilisation in PaLM's
  terms; `SpeedEstimate.mfu_model` reports the model-FLOPs utilisation the step time implies.

Calibration of the default `mfu` = 0.40 (bf16 dense decoder training, A100/H100 class):
* Llama 2 (Touvron et al. 2023, arXiv 2307.09288, table 2): 184,320 A100-80GB GPU hours for 2T
  tokens at 7B and 1,720,320 at 70B, i.e. 3,014 and 323 tokens/s per GPU; with 6N + 12LSd FLOPs per
  token that is an MFU of 0.46 (7B) and 0.45 (70B) at 312 TFLOPS, including all cluster overheads.
* PaLM table 3 lists MFU 46.2% (PaLM 540B), 32.5% (Gopher), 29.7% (MT-NLG 530B), 21.3% (GPT-3).
* Megatron-LM (Narayanan et al. 2021, table 1) reaches 44-52% of A100 peak in hardware FLOPs with
  full recomputation on 3D-parallel GPT models.
* llm-analysis (cli99/llm-analysis) defaults to a flops efficiency of 1.0 and notes "~0.5" for
  Megatron-LM; we take the lower 0.40 because the models here are run with DeepSpeed/HF, not
  Megatron's fused kernels. tests/calc/speed/test_speed.py checks the Llama 2 figures within a stated tolerance.

Where each part lives: `assumptions` (the named constants and SpeedAssumptions), `hardware` (the GPU, the node
shape and which link a collective takes), `terms` (each term's seconds and the numbers behind them, no words),
`formulas` (each term's label, formula and source, no arithmetic), `step` (step_time: the terms added up into
StepTime) and `throughput` (SpeedEstimate, estimate_speed, and the rate bounds the recommender ranks by).

May import calc.contract, calc.sim and calc.memory; never calc.recommend, calc.evidence, calc.export or calc.cli.
"""

from calc.speed.assumptions import (
    COMM_EFFICIENCY,
    CPU_ADAM_PARAMS_PER_S_PER_NODE,
    DEFAULT_INTER_NODE_BYTES_PER_S,
    DEFAULT_MFU,
    DEFAULT_NVME_BYTES_PER_S,
    EAGER_SCORE_PASSES,
    NVLINK_BRIDGE_GROUP,
    ZERO3_FETCH_LATENCY_S,
    SpeedAssumptions,
)
from calc.speed.hardware import Link, SpeedHardware, hardware_of, link, peak_flops_per_s
from calc.speed.step import StepTerm, StepTime, step_time
from calc.speed.terms import StepConfig, lora_params_per_layer, lora_params_total, shape_numbers
from calc.speed.throughput import (
    SpeedEstimate,
    SpeedTerm,
    compute_rate_bound,
    estimate_speed,
    split_rate_bound,
    to_estimate,
)

__all__ = [
    "COMM_EFFICIENCY", "CPU_ADAM_PARAMS_PER_S_PER_NODE", "DEFAULT_INTER_NODE_BYTES_PER_S", "DEFAULT_MFU",
    "DEFAULT_NVME_BYTES_PER_S", "EAGER_SCORE_PASSES", "NVLINK_BRIDGE_GROUP", "ZERO3_FETCH_LATENCY_S", "Link",
    "SpeedAssumptions", "SpeedEstimate", "SpeedHardware", "SpeedTerm", "StepConfig", "StepTerm", "StepTime",
    "compute_rate_bound", "estimate_speed", "hardware_of", "link", "lora_params_per_layer", "lora_params_total",
    "peak_flops_per_s", "shape_numbers", "split_rate_bound", "step_time", "to_estimate",
]

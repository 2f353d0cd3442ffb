"""vLLM's memory budget on one GPU (vLLM 0.13.0, vllm/v1/worker/gpu_worker.py).

Worker.init_device: requested_memory = total_memory x gpu_memory_utilization (MemorySnapshot.total_memory is
torch.cuda.mem_get_info's total: what nvidia-smi reports, as the GPU presets hold it); start-up fails when the free
memory is below it. Worker.determine_available_memory runs the profile run under
vllm/utils/mem_utils.py memory_profiling, whose non_kv_cache_memory = weights_memory (the torch memory the model
load took, "Model loading took X GiB") + torch_peak_increase (the profile run's peak above it) + non_torch_increase
(NCCL, cuBLAS handles, attention-backend buffers); available_kv_cache_memory = int(requested_memory - non_kv).
CUDA graphs are captured after the KV cache is allocated (compile_or_warm_up_model), outside that budget: in 0.13
their memory comes out of the headroom 1 - gpu_memory_utilization leaves (later releases subtract an estimate).
"""

from __future__ import annotations

from typing import NamedTuple

from calc.contract.presets import gpu_presets, model_presets
from calc.contract.quantized import mxfp4_weight_bytes
from calc.contract.scenario import Attention, Mode, Scenario
from calc.contract.serving import ServingConfig
from calc.contract.units import GiB, MiB
from calc.memory.inference_weights import inference_scenario, quantized, quantized_states
from calc.memory.overhead import CUDA_CONTEXT_BYTES
from calc.memory.states import model_states

MODEL_DTYPE_BYTES = 2  # vLLM's dtype auto: the config's 16-bit dtype; fp32 checkpoints are served in 16 bits too
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
# profile_run's _dummy_sampler_run samples every row with top-k and top-p (v1/sample/ops/topk_topp_sampler.py
# forward_native, the default on CUDA without VLLM_USE_FLASHINFER_SAMPLER): at apply_top_k_top_p's scatter the
# 16-bit logits (2), their fp32 copy (4), the sorted values (4) and int64 indices (8), the top-k mask (1), the
# softmax / cumsum of the sorted values (4), the top-p mask (1) and the scattered result (4) are alive per value
LOGITS_BYTES_PER_VALUE = 2 + 4 + 4 + 8 + 1 + 4 + 1 + 4
# Non-torch memory the profile measures (non_torch_increase). Published 0.11-0.13 logs print it: 0.06 GiB
# (Qwen2.5-7B AWQ on a 16 GB card), 0.21 GiB (Qwen3-235B FP8, TP 4 on L40S), 0.35 GiB (Llama 3.1 8B on an RTX 3090,
# 0.6); NCCL adds its buffers with tensor parallelism. A cited estimate, not a model.
NON_TORCH_BYTES = 200 * MiB
NON_TORCH_TP_BYTES = 100 * MiB  # with tensor_parallel > 1: NCCL communicators, custom all-reduce buffers
# CUDA graph pool after capture ("Graph capturing finished in N secs, took X GiB"): 0.4-0.7 GiB for 7-30B dense
# models at the default 67 capture sizes in published 0.11-0.13 logs, a few GiB for large MoE models with expert
# parallelism. A cited estimate.
CUDA_GRAPH_BYTES = 512 * MiB
# vllm/engine/arg_utils.py get_batch_defaults (OpenAI API server, `vllm serve`): GPUs of 70 GiB or more that are
# not an A100 batch 8,192 tokens and 1,024 sequences; the rest 2,048 and 256
LARGE_GPU_BYTES = 70 * GiB
BATCH_DEFAULTS = {"large": (8192, 1024), "other": (2048, 256)}


def batch_limits(serving: ServingConfig, total_bytes: int, gpu_name: str, max_model_len: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): the flags, else get_batch_defaults for the GPU; a default token
    budget is capped at max_num_seqs x max_model_len (_set_default_max_num_seqs_and_batched_tokens_args)."""
    large = total_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower()
    tokens, seqs = BATCH_DEFAULTS["large" if large else "other"]
    seqs = serving.max_num_seqs or seqs
    if serving.max_num_batched_tokens is not None:
        return serving.max_num_batched_tokens, seqs
    return min(seqs * max_model_len, tokens), seqs


def config_sliding_window(sc: Scenario) -> int | None:
    """config.json's sliding_window as vLLM reads it (ModelConfig.get_sliding_window); the ModelSpec keeps it for
    the families that mask with it in transformers, not for Gemma 2."""
    cfg = sc.model if isinstance(sc.model, dict) else model_presets()[sc.model].config
    if sc.spec.family == "gemma2":
        window = cfg.get("sliding_window", 4096)  # Gemma2Config's default
        return window if isinstance(window, int) and window > 0 else None
    return sc.spec.sliding_window


def checkpoint_weights(model: str | dict) -> str:
    """How a preset's hub checkpoint stores its weights (gpt-oss: MXFP4 experts), else 16-bit (vLLM's dtype
    auto); a pasted config's quantization_config has set inference.weights already."""
    preset = model_presets().get(model) if isinstance(model, str) else None
    return (preset.checkpoint_weights if preset else None) or "bf16"


def served_weights(sc: Scenario) -> str:
    """How the served weights are stored: inference.weights, else as the checkpoint stores them."""
    return sc.inference.weights or checkpoint_weights(sc.model)


def weights_scenario(sc: Scenario, tp: int) -> Scenario:
    """The scenario whose weights vLLM loads on one GPU: inference with the serving tensor parallelism, stored as
    inference.weights says (calc.memory.inference_weights: the one source of weight bytes)."""
    update: dict[str, object] = {"tensor_parallel": tp, "pipeline_parallel": 1}
    if sc.spec.attention_sinks:  # the estimate models gpt-oss's sinks in eager attention only; weights do not care
        update["attention"] = Attention.eager
    training = sc.training.model_copy(update=update)
    inference = sc.inference.model_copy(update={"weights": served_weights(sc)})
    # built from the validated fields without validating again: vLLM replicates K/V heads that are fewer than the
    # GPUs (calc.contract.serving checked the layout), which the training-side rule (hf_rules.check_tensor_parallel)
    # refuses for transformers' and AutoTP's shards
    fields = {name: getattr(sc, name) for name in type(sc).model_fields}
    fields.update(mode=Mode.inference, serving=None, training=training, inference=inference)
    loaded = type(sc).model_construct(**fields)
    precision = inference_scenario(loaded.model_construct(**{**fields, "training": training.model_copy(
        update={"tensor_parallel": 1})})).training.precision  # what inference.weights computes in
    fields["training"] = training.model_copy(update={"precision": precision})
    return type(sc).model_construct(**fields)


def weights_bytes(sc: Scenario, tp: int) -> int:
    """"Model loading took X GiB": the parameters on one GPU (calc.memory.states.model_states, quantized as
    inference.weights says), the vocabulary padded to a multiple of 64 (VocabParallelEmbedding / ParallelLMHead,
    split over tp), and the rotary cos/sin cache buffer (rotary_embedding/base.py: max positions x rotary dim in the
    model dtype, one per model through get_rope's cache)."""
    wsc = weights_scenario(sc, tp)
    spec = wsc.spec
    st = model_states(wsc, spec.num_layers, True, True)
    if quantized(wsc):
        st = quantized_states(wsc, st, spec.num_layers, True)
    padded = -(-spec.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    tables = 1 if spec.tie_word_embeddings else 2
    padding = (padded - spec.vocab_size) * spec.hidden_size * tables * MODEL_DTYPE_BYTES // tp
    rope = spec.max_position_embeddings * spec.rotary_dim * MODEL_DTYPE_BYTES if spec.rotary_dim else 0
    mxfp4 = mxfp4_padding_bytes(wsc, tp) if wsc.inference.weights == "mxfp4" else 0
    return st.weights + padding + rope + replicated_kv_bytes(wsc, tp) + mxfp4


# bytes per weight of each inference.weights kind, for the replicated K/V projections (scales not counted)
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1, "nf4": 0.5, "fp4": 0.5, "gptq-int4": 0.5,
                "gptq-int8": 1, "awq-int4": 0.5, "mxfp4": 2}  # mxfp4 keeps attention 16-bit
# vllm/model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights: the MoE backend pads each
# expert's (intermediate / tp, hidden) to multiples of its kernel's tile. Hopper runs the Triton kernels
# (triton_kernels on SM 9.0-10.x: intermediate to 64), Blackwell FlashInfer's MXFP4 x BF16 (both to 256), the rest
# (Ampere, Ada) Marlin, which needs n % 256 and k % 128 (intermediate to 128, hidden to 256)
MXFP4_TILES = {"hopper": (64, 1), "blackwell": (256, 256)}
MXFP4_MARLIN_TILES = (128, 256)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def mxfp4_padding_bytes(sc: Scenario, tp: int) -> int:
    """What vLLM's padded MXFP4 expert tensors (w13 and w2: uint8 values, uint8 scales per 32, bf16 biases) add
    to the unpadded count calc.memory.inference_weights makes, on this GPU's architecture."""
    spec = sc.spec
    gpu = sc.resolved_hardware().gpu
    arch = gpu_presets()[gpu].architecture if gpu in gpu_presets() else None
    inter_tile, hidden_tile = MXFP4_TILES.get(arch or "", MXFP4_MARLIN_TILES)
    inter, hidden = spec.intermediate_size // tp, spec.hidden_size

    def experts(i: int, h: int) -> int:  # one expert: w13 (2i x h), w2 (h x i) and their biases
        return mxfp4_weight_bytes(2 * i, h) + mxfp4_weight_bytes(h, i) + MODEL_DTYPE_BYTES * (2 * i + h)

    per_layer = experts(_round_up(inter, inter_tile), _round_up(hidden, hidden_tile)) - experts(inter, hidden)
    return per_layer * spec.num_experts * (spec.num_layers - spec.dense_layers)


def replicated_kv_bytes(sc: Scenario, tp: int) -> int:
    """With more GPUs than KV heads, QKVParallelLinear gives each GPU one whole KV head (num_kv_head_replicas =
    tp // KV heads, vllm/model_executor/layers/linear.py) where calc.memory splits the K and V projections by tp:
    the difference, in the weights' storage."""
    spec = sc.spec
    if spec.mla or tp <= spec.num_kv_heads:
        return 0
    extra = 2 * (spec.head_dim - spec.kv_width // tp) * spec.hidden_size * spec.num_layers
    return int(extra * WEIGHT_BYTES[sc.inference.weights or "bf16"])


class ActivationTerms(NamedTuple):
    """The profile run's torch peak above the weights (torch_peak_increase), in its parts."""

    hidden_bytes: int  # hidden states and residual of max_num_batched_tokens tokens
    layer_bytes: int  # the largest transient inside one layer
    logits_bytes: int  # the dummy sampler run's logits

    @property
    def total(self) -> int:
        return max(self.hidden_bytes + self.layer_bytes, self.hidden_bytes // 2 + self.logits_bytes)


def activation_terms(sc: Scenario, tp: int, tokens: int, seqs: int) -> ActivationTerms:
    """Modelled from vLLM's source, not checked against a measured profile: GPUModelRunner.profile_run runs
    _dummy_run(max_num_batched_tokens) then _dummy_sampler_run on min(max_num_seqs, tokens) rows. The forward keeps
    hidden_states and residual (16-bit, hidden wide); inside a layer the largest transient is the MLP's gate_up
    output and its activation (2I/tp + I/tp wide), the attention's qkv and output ((q + 2 kv)/tp + q/tp wide), or
    fused_moe's intermediate caches (top-k x (2I + I)/tp + top-k x H wide, fused_moe.py); the sampler's top-k /
    top-p pass holds LOGITS_BYTES_PER_VALUE per logit of every row (vocabulary wide, gathered from the
    tensor-parallel ranks) while the forward's hidden states are still referenced."""
    spec, b = sc.spec, MODEL_DTYPE_BYTES
    h, i = spec.hidden_size, spec.intermediate_size
    hidden = 2 * tokens * h * b
    qkv = (spec.q_width + 2 * spec.kv_width) // tp + spec.v_width // tp
    widths = [qkv, 3 * i // tp]
    if spec.num_experts > 1:
        k = spec.experts_per_token
        widths.append(k * 3 * i // tp + k * h)
        if spec.dense_layers:
            widths.append(3 * (spec.dense_intermediate_size or spec.intermediate_size) // tp)
    layer = tokens * max(widths) * b
    logits = min(seqs, tokens) * spec.vocab_size * LOGITS_BYTES_PER_VALUE
    return ActivationTerms(hidden, layer, logits)


def non_torch_bytes(tp: int) -> int:
    """NON_TORCH_BYTES, and NCCL's share with tensor parallelism (a cited estimate)."""
    return NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tp > 1 else 0)


def cuda_graph_bytes(serving: ServingConfig) -> int:
    """CUDA_GRAPH_BYTES with CUDA graphs, 0 with --enforce-eager (a cited estimate)."""
    return CUDA_GRAPH_BYTES if serving.cuda_graphs else 0


def cuda_context_bytes() -> int:
    """The CUDA context, created before vLLM's first snapshot: not in the budget, but it lowers the free memory
    the start-up check compares with requested_memory (calc.memory.overhead.CUDA_CONTEXT_BYTES)."""
    return CUDA_CONTEXT_BYTES["expected"]


def requested_bytes(total_bytes: int, utilization: float) -> float:
    """Worker.init_device: total_memory x gpu_memory_utilization (a float; int() only at the end)."""
    return total_bytes * utilization


def available_kv_bytes(total_bytes: int, utilization: float, non_kv_bytes: int) -> int:
    """determine_available_memory: int(requested_memory - non_kv_cache_memory)."""
    return int(requested_bytes(total_bytes, utilization) - non_kv_bytes)

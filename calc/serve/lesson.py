"""The figures of the serving lesson (the Explain page): why the KV cache dominates serving memory, what GQA, MLA,
sliding windows and an fp8 KV cache each do to it, and why gpu_memory_utilization is a share of the GPU's total
memory. Every number is the planner's (calc.serve.plan, calc.serve.kv_cache) for the user's own model, or for a
named preset where that model lacks the feature; the page only words and draws them.
"""

from __future__ import annotations

from typing import NamedTuple

from calc.contract.scenario import Mode, Scenario, TrainingConfig
from calc.contract.serving import ServingConfig
from calc.serve import budget, kv_cache
from calc.serve.parts import Reason, ServePlan, gpu_memory, kv_dtype_bytes, layer_specs, serving_of, verdict
from calc.serve.plan import plan

TYPICAL_CONTEXT = 8192  # tokens per request in the "typical load" sentence (capped at the model's positions)
TYPICAL_REQUESTS = 16  # requests at once in that sentence
LONG_CONTEXT = 32768  # the sliding-window example's request length (capped at the preset's positions)
GQA_PRESET = "llama-3.1-8b"  # 8 KV heads for 32 attention heads
MLA_PRESET = "deepseek-v3"  # one 512 + 64 latent per token and layer
SLIDING_PRESET = "gemma-3-12b"  # 5 of every 6 layers keep a 1,024-token window
PAIR_UTILIZATIONS = (0.9, 0.45)  # two servers on one GPU: both at vLLM's default, then both at half of it


def serving_variant(sc: Scenario) -> Scenario:
    """The scenario as a vLLM server with its defaults on the scenario's GPU (itself when already mode serve). The
    training block goes back to its defaults: a served model is not trained, so its LoRA adapters and training
    layout do not apply (the weights' storage is inference.weights, kept)."""
    if sc.mode == Mode.serve:
        return sc
    return sc.variant(mode=Mode.serve, serving=ServingConfig(), training=TrainingConfig())


def preset_variant(sc: Scenario, preset: str) -> Scenario:
    """A preset served with vLLM's defaults on the same hardware (one GPU per replica)."""
    return Scenario.model_validate({"model": preset, "mode": "serve", "hardware": sc.hardware,
                                    "serving": {"kv_cache_dtype": serving_of(sc).kv_cache_dtype}})


def formula_bytes_per_token(sc: Scenario) -> int:
    """KV cache per token on one GPU by the textbook formula: 2 (K and V) x layers x KV heads x head_dim x dtype
    bytes; MLA caches one latent of kv_lora_rank + qk_rope_head_dim per layer instead. Written out independently of
    calc.serve.kv_cache's spec classes (a test checks that the two agree)."""
    spec, serving = sc.spec, serving_of(sc)
    dtype = kv_dtype_bytes(sc, serving)
    if spec.mla:
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * dtype
    heads = max(1, spec.num_kv_heads // serving.tensor_parallel)
    return 2 * spec.num_layers * heads * spec.head_dim * dtype


def mha_bytes_per_token(sc: Scenario) -> int:
    """What full multi-head attention would cache per token: K and V for every attention head (MLA: K of
    qk_nope + qk_rope and V of v_head_dim per head, as DeepSeek's MHA form)."""
    spec = sc.spec
    dtype = kv_dtype_bytes(sc, serving_of(sc))
    if spec.mla:
        return spec.num_layers * spec.num_heads * (spec.head_dim + spec.v_head_dim) * dtype
    return 2 * spec.num_layers * spec.num_heads * spec.head_dim * dtype


class FeatureRow(NamedTuple):
    """One KV cache feature as a model shows it: the bytes per token (or per request) with and without it."""

    preset: str | None  # None: the user's own model
    name: str
    with_bytes: int
    without_bytes: int


def request_bytes(sc: Scenario, context: int, windows: bool = True) -> int:
    """The KV cache one request of `context` tokens holds (kv_cache.needed_bytes), with the model's sliding windows
    or as if every layer kept every token."""
    serving = serving_of(sc)
    total, name = gpu_memory(sc)
    tokens, _seqs = budget.batch_limits(serving, total, name, context)
    layers = layer_specs(sc, serving) if windows else kv_cache.layer_specs(
        sc.spec, serving.tensor_parallel, kv_dtype_bytes(sc, serving), None)
    return kv_cache.needed_bytes(layers, serving.block_size, context, tokens)


def has_sliding(sc: Scenario) -> bool:
    return any(s.kind == "sliding" for s in layer_specs(sc, serving_of(sc)))


def own_or(sc: Scenario, preset: str, has: bool) -> tuple[str | None, Scenario]:
    """The user's model when it has the feature, else the named preset on the same hardware."""
    return (None, sc) if has else (preset, preset_variant(sc, preset))


def feature_rows(sc: Scenario) -> dict[str, FeatureRow]:
    """GQA, MLA (bytes per token against full multi-head attention), sliding windows (one long request's KV cache
    with and without the windows) and fp8 (bytes per token against the 16-bit cache), each for the user's model
    where it has the feature, else for GQA_PRESET / MLA_PRESET / SLIDING_PRESET."""
    spec = sc.spec
    rows: dict[str, FeatureRow] = {}
    gqa = not spec.mla and spec.num_kv_heads < spec.num_heads
    for key, preset, has in (("gqa", GQA_PRESET, gqa), ("mla", MLA_PRESET, spec.mla)):
        pid, psc = own_or(sc, preset, has)
        rows[key] = FeatureRow(pid, psc.spec.name or psc.spec.family, formula_bytes_per_token(psc),
                               mha_bytes_per_token(psc))
    pid, psc = own_or(sc, SLIDING_PRESET, has_sliding(sc))
    long = min(LONG_CONTEXT, psc.spec.max_position_embeddings)
    rows["sliding"] = FeatureRow(pid, psc.spec.name or psc.spec.family, request_bytes(psc, long),
                                 request_bytes(psc, long, windows=False))
    fp8 = sc.variant(serving=serving_of(sc).model_copy(update={"kv_cache_dtype": "fp8"}))
    auto = sc.variant(serving=serving_of(sc).model_copy(update={"kv_cache_dtype": "auto"}))
    rows["fp8"] = FeatureRow(None, spec.name or spec.family, plan(fp8).kv_bytes_per_token,
                             plan(auto).kv_bytes_per_token)
    return rows


class PairOutcome(NamedTuple):
    """A second server started on a GPU where a first one already runs, both at `utilization`."""

    utilization: float
    free_bytes: int  # what the second server's start-up snapshot sees free
    requested_bytes: int  # utilization x the GPU's TOTAL memory
    reason: Reason  # calc.serve.parts.verdict for the second server
    largest_second: float  # the largest fraction the second server may ask for at start (0 when none)


def second_server(sc: Scenario, utilization: float) -> PairOutcome:
    """The first server holds its budget (its KV cache fills it), its CUDA graphs and its CUDA context; the second
    creates its own context, then Worker.init_device compares the free memory with utilization x total."""
    first = plan(sc, utilization)
    context = budget.cuda_context_bytes()
    free = first.gpu_memory_bytes - first.requested_bytes - first.cuda_graph_bytes - 2 * context
    second = plan(sc, utilization)  # the same server again: the same budget and needs
    needed = kv_cache.needed_bytes(layer_specs(sc, serving_of(sc)), serving_of(sc).block_size, second.max_model_len,
                                   second.max_num_batched_tokens)
    reason, _short = verdict(free, second.requested_bytes, second.kv_cache_bytes, needed)
    largest = max(0, free) * 1000 // first.gpu_memory_bytes / 1000
    return PairOutcome(utilization, free, second.requested_bytes, reason, largest)


class ServeLesson(NamedTuple):
    plan: ServePlan  # the user's model served with vLLM's defaults on the scenario's GPU
    name: str
    gpu_name: str
    gpu_memory_bytes: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    mla: bool
    latent_dims: tuple[int, int]  # MLA: (kv_lora_rank, qk_rope_head_dim); (0, 0) otherwise
    formula_bytes_per_token: int
    context: int  # the typical request length
    requests: int
    typical_kv_bytes: int  # requests x one request of context tokens
    free_at_start_bytes: int  # total - this server's CUDA context: what the start-up check compares with
    features: dict[str, FeatureRow]
    pairs: tuple[PairOutcome, ...]


def serving_lesson(sc: Scenario) -> ServeLesson:
    """Every figure of the serving lesson for the scenario (ValueError when it cannot be served, e.g. no GPU)."""
    ssc = serving_variant(sc)
    spec, serving = ssc.spec, serving_of(ssc)
    p = plan(ssc)
    _total, gpu_name = gpu_memory(ssc)
    context = min(TYPICAL_CONTEXT, spec.max_position_embeddings)
    return ServeLesson(
        plan=p, name=spec.name or spec.family, gpu_name=gpu_name, gpu_memory_bytes=p.gpu_memory_bytes, layers=spec.num_layers,
        heads=spec.num_heads, kv_heads=1 if spec.mla else spec.num_kv_heads, head_dim=spec.head_dim,
        dtype_bytes=kv_dtype_bytes(ssc, serving), mla=spec.mla,
        latent_dims=(spec.kv_lora_rank, spec.qk_rope_head_dim) if spec.mla else (0, 0),
        formula_bytes_per_token=formula_bytes_per_token(ssc),
        context=context, requests=TYPICAL_REQUESTS, typical_kv_bytes=TYPICAL_REQUESTS * request_bytes(ssc, context),
        free_at_start_bytes=p.gpu_memory_bytes - budget.cuda_context_bytes(), features=feature_rows(ssc),
        pairs=tuple(second_server(ssc, u) for u in PAIR_UTILIZATIONS))


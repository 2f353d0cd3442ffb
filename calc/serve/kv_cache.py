"""vLLM's KV cache, layer by layer and block by block (vLLM 0.13.0).

Each attention layer returns a KV cache spec (vllm/attention/layer.py Attention.get_kv_cache_spec,
MLAAttention.get_kv_cache_spec); the KV cache manager groups the layers by spec (vllm/v1/core/kv_cache_utils.py
get_kv_cache_groups), cuts the memory the profile run left into blocks (get_kv_cache_config_from_groups,
get_num_blocks) and logs "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request: Cx"
(_report_kv_cache_config, get_max_concurrency_for_kv_cache_config). The functions below follow those steps with
the same integer arithmetic, in bytes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, NamedTuple

from calc.contract.architectures import ModelSpec

AttentionKind = Literal["full", "sliding", "mla"]
FP8_BYTES = 1  # --kv-cache-dtype fp8 (fp8_e4m3): stored as torch.uint8 (vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE)


def cdiv(a: int, b: int) -> int:
    """vllm/utils/math_utils.py cdiv: ceiling division."""
    return -(a // -b)


class LayerSpec(NamedTuple):
    """One layer's KV cache spec on one GPU (vllm/v1/kv_cache_interface.py FullAttentionSpec, SlidingWindowSpec,
    MLAAttentionSpec); equal specs fall in one group."""

    kind: AttentionKind
    num_kv_heads: int  # per GPU: ModelConfig.get_num_kv_heads = max(1, total // tp); MLA: 1
    head_size: int  # MLA: kv_lora_rank + qk_rope_head_dim, the one latent it caches
    dtype_bytes: int
    sliding_window: int | None = None

    def page_size_bytes(self, block_size: int) -> int:
        """AttentionSpec.page_size_bytes: 2 (K and V) x block_size x kv heads x head size x dtype bytes;
        MLAAttentionSpec: no factor 2, one latent vector per token."""
        per_token = self.num_kv_heads * self.head_size * self.dtype_bytes
        return block_size * per_token if self.kind == "mla" else 2 * block_size * per_token

    def max_memory_usage_bytes(self, block_size: int, max_model_len: int, max_num_batched_tokens: int) -> int:
        """What one request of max_model_len tokens may hold. FullAttentionSpec: cdiv(max_model_len, block) pages.
        SlidingWindowSpec: the last sliding_window - 1 tokens plus one chunk of newly scheduled tokens, at most
        max_model_len, and one page more because the window need not start at a block boundary."""
        page = self.page_size_bytes(block_size)
        if self.kind != "sliding":
            return cdiv(max_model_len, block_size) * page
        assert self.sliding_window is not None
        tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return (cdiv(tokens, block_size) + 1) * page


def sliding_window_of(spec: ModelSpec, layer: int, window: int | None) -> int | None:
    """The window vLLM gives layer `layer` (None = full attention). Interleaved families pass a per-layer window
    (gemma2.py / gemma3.py from config.layer_types, gpt_oss.py on even layers); the others take the model-level
    config.sliding_window on every layer, which vllm/engine/arg_utils.py sets in CacheConfig only when the model is
    not interleaved (Mistral v0.1, Phi-3). Llama 4's chunked local attention is a FullAttentionSpec on every
    layer: vllm/config/vllm.py disables the hybrid KV cache manager for attention_chunk_size by default, and
    unify_hybrid_kv_cache_specs turns its local layers into full ones."""
    if window is None or spec.family == "llama4_text":
        return None
    if spec.family == "gemma2":  # transformers' Gemma2Config.layer_types: even layers slide
        return window if layer % 2 == 0 else None
    return window if spec.is_sliding(layer) else None


def layer_specs(spec: ModelSpec, tp: int, dtype_bytes: int, window: int | None) -> list[LayerSpec]:
    """Every decoder layer's spec on one GPU of a tensor-parallel group of `tp`; `window` the config's
    sliding_window (calc.serve.budget reads it from the config: ModelSpec drops Gemma 2's)."""
    if spec.mla:  # deepseek_v2.py: Attention(head_size=kv_lora_rank + qk_rope_head_dim, use_mla=True)
        mla = LayerSpec("mla", 1, spec.kv_lora_rank + spec.qk_rope_head_dim, dtype_bytes)
        return [mla] * spec.num_layers
    heads = max(1, spec.num_kv_heads // tp)  # vllm/config/model.py get_num_kv_heads: replicated below one a GPU
    out = []
    for layer in range(spec.num_layers):
        w = sliding_window_of(spec, layer, window)
        out.append(LayerSpec("full" if w is None else "sliding", heads, spec.head_dim, dtype_bytes, w))
    return out


class KvGroups(NamedTuple):
    """The KV cache groups (KVCacheGroupSpec): one spec and how many layers each group stands for."""

    specs: tuple[LayerSpec, ...]  # one per group
    group_size: int  # layers per group: the KVCacheTensors each block is cut from
    layers: int  # real layers (without the padding the grouping adds)


def kv_groups(layers: list[LayerSpec]) -> KvGroups:
    """get_kv_cache_groups with the hybrid manager on (vLLM's default): one spec for all layers is one group
    (_get_kv_cache_groups_uniform_spec); several layer types are split into groups of equal size
    (_get_kv_cache_groups_uniform_page_size): the group size is the fewest layers of a type, or the most when
    that is under 1.25 x the fewest, and each type gets cdiv(its layers, group size) groups, the last padded. The
    page size is the same for every type here (same heads and head size), so unify_kv_cache_spec_page_size keeps
    the block size."""
    counts = Counter(layers)
    if len(counts) == 1:
        return KvGroups((layers[0],), len(layers), len(layers))
    fewest, most = min(counts.values()), max(counts.values())
    group_size = most if most < fewest * 1.25 else fewest
    specs: list[LayerSpec] = []
    for spec, n in counts.items():  # dict order: the order the layer types first appear, as vLLM's defaultdict
        specs += [spec] * cdiv(n, group_size)
    return KvGroups(tuple(specs), group_size, len(layers))


def page_bytes(groups: KvGroups, block_size: int) -> int:
    """get_uniform_page_size: every group's page has the same size."""
    sizes = {s.page_size_bytes(block_size) for s in groups.specs}
    assert len(sizes) == 1, sizes
    return sizes.pop()


def num_blocks(groups: KvGroups, block_size: int, available_bytes: int) -> int:
    """get_num_blocks: available // page_size // group_size (each block is one page in each of group_size
    tensors, and every group shares those tensors)."""
    return max(0, available_bytes // page_bytes(groups, block_size) // groups.group_size)


def kv_cache_tokens(groups: KvGroups, block_size: int, blocks: int) -> int:
    """_report_kv_cache_config: "GPU KV cache size" = num_blocks // number of groups x block_size."""
    return blocks // len(groups.specs) * block_size


def blocks_per_request(groups: KvGroups, block_size: int, max_model_len: int, batched_tokens: int) -> int:
    """get_max_concurrency_for_kv_cache_config's num_block_per_request: cdiv(group_size x the sum of each group's
    max_memory_usage_bytes, page_size x group_size)."""
    usage = groups.group_size * sum(s.max_memory_usage_bytes(block_size, max_model_len, batched_tokens)
                                    for s in groups.specs)
    return cdiv(usage, page_bytes(groups, block_size) * groups.group_size)


def max_concurrency(groups: KvGroups, block_size: int, blocks: int, max_model_len: int, batched_tokens: int) -> float:
    """get_max_concurrency_for_kv_cache_config: num_blocks / blocks per request (logged with %.2f)."""
    return blocks / blocks_per_request(groups, block_size, max_model_len, batched_tokens)


def needed_bytes(layers: list[LayerSpec], block_size: int, max_model_len: int, batched_tokens: int) -> int:
    """max_memory_usage_bytes over every layer's spec: the KV cache one request of max_model_len needs;
    check_enough_kv_cache_memory refuses to start when it exceeds the available memory (0.13 checks the layers
    before grouping them, so a hybrid model's padding is not counted here)."""
    return sum(s.max_memory_usage_bytes(block_size, max_model_len, batched_tokens) for s in layers)


def longest_model_len(layers: list[LayerSpec], block_size: int, available_bytes: int, upper: int,
                      batched_tokens: int) -> int:
    """estimate_max_model_len: the binary search vLLM prints in its error message, from 1 to `upper`; 0 when one
    token does not fit."""
    def fits(n: int) -> bool:
        return needed_bytes(layers, block_size, n, batched_tokens) <= available_bytes

    if not fits(1):
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def spec_bytes_per_token(layers: list[LayerSpec]) -> int:
    """The KV cache one token takes on one GPU by the spec classes: the sum over layers of page_size_bytes /
    block_size (block_size cancels)."""
    return sum(s.page_size_bytes(1) for s in layers)


def pool_bytes_per_token(groups: KvGroups) -> int:
    """Bytes of KV cache memory per token of the logged "GPU KV cache size": page per token x group_size x
    groups; above spec_bytes_per_token by the padding layers of a hybrid model."""
    return groups.group_size * len(groups.specs) * groups.specs[0].page_size_bytes(1)

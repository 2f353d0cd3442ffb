"""Serving memory: what a serving engine (vLLM, SGLang) does with a GPU, read from the engine's source.

Pinned to vLLM 0.13.0 (the wheel on PyPI, December 2025); every rule cites the file and function it comes from.

- calc.serve.kv_cache: the KV cache spec of each layer (vllm/v1/kv_cache_interface.py page_size_bytes), how the
  KV cache manager groups layer types (vllm/v1/core/kv_cache_utils.py get_kv_cache_groups), the number of blocks,
  the logged "GPU KV cache size" and "Maximum concurrency", the largest max_model_len.
- calc.serve.budget: the memory budget (vllm/v1/worker/gpu_worker.py determine_available_memory): weights, the
  profile run's activation peak, non-torch memory, CUDA graphs, what is left for the KV cache.
- calc.serve.plan: the plan of one scenario (ServePlan), the verdict, and the inverse questions (the longest
  context that starts, the gpu_memory_utilization a target concurrency needs).
- calc.serve.sglang: SGLang's budget (mem_fraction_static) and token pool, where it differs.
- calc.serve.lesson: the Explain page's serving lesson (KV bytes per token, GQA / MLA / sliding windows / fp8,
  two servers on one GPU), for the user's model or a named preset.
- calc.serve.table: the serving view of the model x hardware table (serving_cell).

May import: calc.memo, calc.contract, calc.sim, calc.memory (the weights come from calc.memory.states and
calc.memory.inference_weights, the one source of weight bytes). The CLI (calc.cli.serve) imports this wing.
"""

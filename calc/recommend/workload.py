"""The model x hardware table's workloads and axes: constants only, so that `python -m calc` can offer them
as choices without importing the recommender."""

from __future__ import annotations

from calc.contract.scenario import DEFAULT_GLOBAL_BATCH_TOKENS, GLOBAL_BATCH_CHOICES

# The table's default workload: 2,048-token sequences at the scenario's default global batch (one source for the
# batch: the app's table reads the sidebar's, calc.contract.scenario.DEFAULT_GLOBAL_BATCH_TOKENS explains it).
TABLE_SEQ_LEN = 2048
TABLE_GLOBAL_BATCH_TOKENS = DEFAULT_GLOBAL_BATCH_TOKENS
# The workloads the table is offered for (the Recommend page's choices and `python -m calc table`'s).
TABLE_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
TABLE_BATCH_TOKENS = GLOBAL_BATCH_CHOICES
TABLE_MODELS = ("llama-3.2-1b", "llama-3.1-8b", "llama-2-13b", "qwen2.5-32b", "llama-3.1-70b", "llama-3.1-405b")
TABLE_HARDWARE = ("1x-rtx-4090", "1x-a100-80gb", "8x-a100-80gb", "8x-h100-sxm", "64x-a100-80gb", "64x-h100-sxm")

"""calc.serve.table: the serving view of the model x hardware table, against the budget worked by hand."""

from __future__ import annotations

import pytest

from calc.contract.units import GiB
from calc.serve.table import SERVING_CONTEXT, hardware_of, serving_cell, serving_table, tensor_parallel_choices


def test_llama_8b_on_one_a100_starts_on_one_gpu():
    c = serving_cell("llama-3.1-8b", "1x-a100-80gb")
    assert (c.tensor_parallel, c.replicas, c.context, c.starts) == (1, 1, SERVING_CONTEXT, True)
    # the budget is 0.9 x the A100's 81,920 MiB; the KV cache holds 128 KiB per token
    assert c.budget_bytes == int(81920 * 2**20 * 0.9)
    assert c.max_concurrency == pytest.approx(c.kv_cache_tokens / 8192, rel=0.01)
    assert c.kv_cache_tokens * 131072 < c.budget_bytes - c.weights_bytes


def test_a_model_whose_weights_exceed_the_budget_does_not_start():
    c = serving_cell("llama-2-13b", "1x-rtx-4090")
    assert not c.starts and c.reason == "no_kv_memory" and c.weights_bytes > c.budget_bytes
    assert c.context == 4096  # Llama 2's own limit, below the table's 8,192
    assert c.max_concurrency == 0


def test_tensor_parallel_grows_until_the_weights_fit_and_replicas_fill_the_gpus():
    c = serving_cell("llama-3.1-70b", "8x-a100-80gb")
    # 70.6 B parameters x 2 bytes = 131 GiB: over one GPU's 72 GiB budget, under two
    assert c.tensor_parallel == 2 and c.replicas == 4 and c.starts
    assert c.weights_bytes < c.budget_bytes < 2 * c.weights_bytes
    assert c.total_concurrency == pytest.approx(4 * c.max_concurrency)
    big = serving_cell("llama-3.1-405b", "64x-h100-sxm")
    assert big.tensor_parallel == 8 and not big.starts  # one node at most: 756 GiB / 8 > 71.7 GiB
    assert big.weights_bytes / GiB > 90


def test_choices_and_the_table():
    assert tensor_parallel_choices("llama-3.1-8b", hardware_of("64x-h100-sxm")) == \
        [1, 2, 4, 8]
    t = serving_table(["llama-3.2-1b"], ["1x-rtx-4090", "8x-h100-sxm"])
    assert [c.hardware for c in t[0]] == ["1x-rtx-4090", "8x-h100-sxm"] and t[0][1].replicas == 8
    with pytest.raises(ValueError):
        serving_cell("llama-3.1-8b", "no-such-gpu")

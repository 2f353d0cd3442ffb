"""calc.serve's KV cache equals vLLM 0.13.0's own classes for every model preset: data/vllm_kv_cache.yaml was
written by scripts/vllm_kv_table.py from vLLM's FullAttentionSpec / SlidingWindowSpec / MLAAttentionSpec and
kv_cache_utils' grouping, block and concurrency functions, building each layer's spec from the preset's config.json
without calc/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calc.contract.presets import model_presets
from calc.contract.scenario import Scenario
from calc.serve import kv_cache
from calc.serve.plan import layer_specs

ROOT = Path(__file__).resolve().parents[3]
TABLE = yaml.safe_load((ROOT / "data" / "vllm_kv_cache.yaml").read_text())
CASES = [(model, row) for model, rows in TABLE["models"].items() for row in rows]


def test_the_table_covers_every_preset_and_family():
    assert set(TABLE["models"]) == set(model_presets())
    families = {model_presets()[m].config["model_type"] for m in TABLE["models"]}
    assert len(families) == 16  # every family the presets hold
    assert TABLE["vllm_version"] == "0.13.0"


@pytest.mark.parametrize(("model", "row"), CASES, ids=[f"{m}-tp{r['tensor_parallel']}-{r['kv_cache_dtype']}"
                                                       for m, r in CASES])
def test_kv_cache_equals_vllm(model, row):
    tp = row["tensor_parallel"]
    sc = Scenario.model_validate({"model": model, "mode": "serve", "hardware": {"memory_bytes": 2**37, "num_gpus": tp},
                                  "serving": {"tensor_parallel": tp, "kv_cache_dtype": row["kv_cache_dtype"]}})
    layers = layer_specs(sc, sc.serving)
    groups = kv_cache.kv_groups(layers)
    bs, length, tokens = TABLE["block_size"], TABLE["max_model_len"], TABLE["max_num_batched_tokens"]
    blocks = kv_cache.num_blocks(groups, bs, TABLE["available_bytes"])
    got = {"tensor_parallel": tp, "kv_cache_dtype": row["kv_cache_dtype"],
           "kv_bytes_per_token": kv_cache.spec_bytes_per_token(layers), "kv_groups": len(groups.specs),
           "num_blocks": blocks, "kv_cache_tokens": kv_cache.kv_cache_tokens(groups, bs, blocks),
           "max_concurrency": round(kv_cache.max_concurrency(groups, bs, blocks, length, tokens), 6),
           "needed_bytes": kv_cache.needed_bytes(layers, bs, length, tokens)}
    assert got == row

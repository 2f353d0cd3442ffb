"""Recommend page, the model x hardware table's serving view: per model preset x hardware, what vLLM gives
(calc.serve.table.serving_cell), its assumptions stated above the table."""

from __future__ import annotations

from calc.recommend import TABLE_HARDWARE, TABLE_MODELS
from calc.serve.table import SERVING_CONTEXT, serving_cell
from tests.app.test_app_helpers import all_text, assert_clean, open_app, tables
from ui import fmt


def serving_view():
    at = open_app("recommend")
    at.radio(key="rec_table_view").set_value("serving").run()
    assert_clean(at)
    return at


def test_the_serving_view_shows_what_vllm_gives_per_cell():
    at = serving_view()
    text = all_text(at)
    assert "Each cell: **vLLM 0.13** with its defaults (gpu_memory_utilization 0.9" in text
    assert "**8,192 tokens**" in text and "`--kv-cache-dtype auto`" in text
    df = next(t for t in tables(at) if "model" in t.columns and "8x A100 80GB" in t.columns)
    assert len(df) == len(TABLE_MODELS) and len(df.columns) == len(TABLE_HARDWARE) + 1
    rows = {r["model"].split(" (")[0]: r for r in df.to_dict("records")}
    # Llama 3.1 8B on one A100: one replica, its concurrency the planner's
    c = serving_cell("llama-3.1-8b", "1x-a100-80gb", SERVING_CONTEXT)
    assert rows["Llama 3.1 8B"]["1x A100 80GB"] == f"{c.max_concurrency:,.1f} requests (TP 1)"
    # Llama 3.1 70B on 8 A100s: TP 2 (131 GiB of weights over 72 GiB budgets), 4 replicas
    c = serving_cell("llama-3.1-70b", "8x-a100-80gb", SERVING_CONTEXT)
    assert (c.tensor_parallel, c.replicas) == (2, 4)
    assert rows["Llama 3.1 70B"]["8x A100 80GB"] == \
        f"{4 * c.max_concurrency:,.1f} requests (4 replicas of TP 2, {c.max_concurrency:,.1f} each)"
    # Llama 2 13B on an RTX 4090: the weights alone are over 0.9 x 24 GiB; and its context is 4,096 tokens
    c = serving_cell("llama-2-13b", "1x-rtx-4090", SERVING_CONTEXT)
    cell = rows["Llama 2 13B"]["1x RTX 4090 workstation"]
    assert cell == f"does not start (weights {fmt.gib(c.weights_bytes)} > budget {fmt.gib(c.budget_bytes)} per GPU " \
                   "at TP 1)"
    assert "(at 4,096 tokens, the model's limit)" in rows["Llama 2 13B"]["1x A100 80GB"]
    # the training table's own widgets are not drawn in the serving view
    assert not [s for s in at.selectbox if s.key == "rec_seq"]


def test_the_training_view_is_the_default_and_comes_back():
    at = open_app("recommend")
    assert at.radio(key="rec_table_view").value == "training"
    at = serving_view()
    at.radio(key="rec_table_view").set_value("training").run()
    assert_clean(at)
    assert [s for s in at.selectbox if s.key == "rec_seq"]


def test_the_serving_view_in_chinese():
    # the view is chosen in English, then the sidebar's language switch reruns the page in Chinese (AppTest cannot
    # send the page's Chinese-labelled configuration picker back through a rerun it starts itself)
    at = serving_view()
    at.sidebar.get("button_group")[0].set_value("zh").run()
    assert_clean(at)
    assert at.radio(key="rec_table_view").value == "serving"
    text = all_text(at)
    assert "每个单元格：**vLLM 0.13** 的默认设置（gpu_memory_utilization 0.9" in text and "**8,192 token**" in text
    df = next(t for t in tables(at) if len(t.columns) == len(TABLE_HARDWARE) + 1 and len(t) == len(TABLE_MODELS))
    cells = list(df.astype(str).values.ravel())
    assert any("个请求（4 个 TP 2 副本，每个" in v for v in cells)
    assert any(v.startswith("无法启动（TP 1 时每张 GPU 的权重") for v in cells)


def test_the_request_length_is_the_users_choice():
    """32,768-token requests: the sentence says so, and each cell is the planner's at that length (a model with
    fewer positions says its own limit)."""
    at = serving_view()
    at.selectbox(key="rec_srv_ctx").set_value(32768).run()
    assert_clean(at)
    assert "**32,768 tokens**" in all_text(at)
    df = next(t for t in tables(at) if "model" in t.columns and "8x A100 80GB" in t.columns)
    rows = {r["model"].split(" (")[0]: r for r in df.to_dict("records")}
    c = serving_cell("llama-3.1-8b", "1x-a100-80gb", 32768)
    assert rows["Llama 3.1 8B"]["1x A100 80GB"] == f"{c.max_concurrency:,.1f} requests (TP 1)"
    assert c.max_concurrency < serving_cell("llama-3.1-8b", "1x-a100-80gb", SERVING_CONTEXT).max_concurrency

"""Explain in Simplified Chinese: the page's headings, prose, tables and charts come from the explain
catalogue, the claims' verdicts and units read in Chinese, and the English the page shows is the
same text as before the page was translated (calc.evidence.claims' English path is the message ids)."""

from __future__ import annotations

import re

from calc.contract.i18n import translate
from calc.contract.scenario import Scenario
from calc.evidence.claims import SHOWN_WORDS, VERDICT_WORDS, Claimed, check_all, load_claims
from tests.app.test_app_helpers import all_text, chart, open_app, open_folded, tables, traces
from tests.calc.contract.test_i18n import KEEP, english_runs
from ui import fmt, state

CJK = re.compile(r"[\u3400-\u9fff]")
MIXED_7B = Scenario(model="llama-2-7b", hardware={"gpu": "a100-80gb"},
                    training={"precision": "bf16-mixed", "activation_checkpointing": "full"})


def _table(at, column: str):
    return next(t for t in tables(at) if column in t.columns)


def _axis_titles(fig) -> list[str]:
    return [v["title"]["text"] for k, v in fig["layout"].items() if k.startswith(("xaxis", "yaxis")) and "title" in v]


def test_explain_in_chinese_headings_prose_and_claims():
    at = open_folded(open_app("explain", {"lang": "zh", **state.scenario_to_params(MIXED_7B)}))
    assert at.title[0].value == "显存都去哪儿了，又该怎么办"
    headers = [h.value for h in at.header]
    assert headers[0] == "显存去哪儿了" and "梯度检查点" in headers and headers[-1] == "常见说法，逐条核对"
    assert all(CJK.search(h) or h in ("FlashAttention", "ZeRO") for h in headers)
    # the anchors stay the English ones, so links and shared URLs work in both languages
    assert [h.proto.anchor for h in at.header][0] == "where-memory-goes"
    text = all_text(at)
    assert "为什么 bf16-mixed 的梯度先是每参数 2.00 B，后来变成 6.00 B" in text
    assert "其中最省的是 **bf16 · adamw-8bit (foreach)**" in text
    # the claims: the article's own words, a Chinese gist, verdict and claimed unit
    claims = [r for t in tables(at) if "引擎（设定）" in t.columns for r in t.to_dict("records")]
    assert len(claims) == len(load_claims())
    zero3 = next(r for r in claims if "45GB/卡" in r["原文"])
    assert zero3["结论"] == "不成立" and "4.2 专业级方案" in zero3["小节"]
    assert zero3["说法"] == "同一设定，ZeRO-3 切分后：每卡 45 GB。"
    assert {r["结论"] for r in claims} <= {"成立", "部分成立", "不成立", "未建模"}
    adam = next(r for r in claims if r["声称"] == "16 B/参数")
    assert adam["结论"] == "成立" and "每参数" in adam["引擎（设定）"]
    # tables: Chinese column names over the same numbers
    bpp = {r["精度 · 优化器（实现）"]: r for r in _table(at, "优化器步时").to_dict("records")}
    assert bpp["bf16-mixed · adamw (foreach)"]["优化器步时"] == "24.00"
    ck = _table(at, "额外 FLOPs（重计算）").to_dict("records")
    assert [r["梯度检查点"] for r in ck][:2] == ["无", "每一层"]


def test_explain_charts_in_chinese():
    at = open_folded(open_app("explain", {"lang": "zh", **state.scenario_to_params(MIXED_7B)}))
    for key in ("explain_bpp", "explain_attention", "explain_zero", "explain_ckpt"):
        fig = chart(at, key)
        titles = _axis_titles(fig)
        assert titles and all(CJK.search(t) for t in titles), (key, titles)
        for t in fig["data"]:
            hover = re.sub(r"%\{[^}]*\}|<[^>]*>", " | ", t.get("hovertemplate", ""))
            assert not english_runs(hover, 2, KEEP), (key, hover)
    assert {"权重", "梯度（.grad）", "fp32 主权重", "优化器状态", "优化器步时的总量"} <= set(traces(chart(at, "explain_bpp")))
    assert "eager 注意力（保留 S x S 分数）" in traces(chart(at, "explain_attention"))
    assert "每一层" in chart(at, "explain_ckpt")["data"][0]["text"]
    zero = chart(at, "explain_zero")
    assert set(traces(zero)) == {"ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"}


def test_other_scenarios_render_in_chinese():
    for sc in (Scenario(model="mixtral-8x7b", hardware={"cluster": "8x-h100-sxm"}, training={"zero_stage": 3}),
               Scenario(model="llama-3.1-8b", mode="inference", hardware={"gpu": "l4"}),
               Scenario(model="qwen2.5-0.5b", hardware={"memory_bytes": 8 * 2**30}, training={"lora": {}})):
        at = open_app("explain", {"lang": "zh", **state.scenario_to_params(sc)})
        text = all_text(at)
        assert "常见说法，逐条核对" in [h.value for h in at.header]
        if sc.mode.value == "inference":
            assert "把侧边栏切换到训练，就能看到瀑布图。" in text
        if sc.spec.num_experts > 1:
            assert "**专家并行。** Mixtral" in text
        if sc.hardware.memory_bytes:
            assert "1 x 自定义 8.00 GiB GPU" in text


def test_claims_english_is_unchanged_and_chinese_is_translated():
    for r in check_all():
        assert r.engine_in("en") == r.engine_text and r.setup_in("en") == r.setup
        assert r.claim.claimed.render("en") == r.claim.claimed.text
        assert r.verdict_in("en") == r.verdict and r.verdict_in("zh") == translate(VERDICT_WORDS[r.verdict], "zh")
        zh = re.sub(r"\w+=[^,，;；]+", "", r.engine_in("zh") + r.setup_in("zh"))  # what-ifs are field=value
        assert zh and not re.search(r"\b(?:parameters?|attention|checkpointing|train|inference|offload)\b", zh), zh
    assert Claimed(low=True, unit="fits").render("zh") == "放得下"
    assert Claimed(low=False, unit="fits").render("zh") == "放不下"
    assert Claimed(low=4, unit="x").render("zh") == "4 倍" and Claimed(low=4, unit="x").text == "4x"
    assert Claimed(low=16, unit="B/param").render("zh") == "16 B/参数"
    assert Claimed(low=30, unit="GB", test="at_least").render("zh") == "> 30 GB"


def test_every_shown_claim_text_with_words_is_in_the_catalogue():
    """A claim's `shown` text with English words in it must be marked (calc.evidence.claims.SHOWN_WORDS),
    or it would stay English on the Chinese page."""
    shown = {c.claimed.shown for c in load_claims() if c.claimed.shown}
    worded = {s for s in shown if re.search(r"[A-Za-z]{2,}", s)}
    assert worded <= set(SHOWN_WORDS)
    assert all(translate(s, "zh") != s for s in SHOWN_WORDS)


def test_english_page_keeps_its_words():
    at = open_folded(open_app("explain"))
    assert at.header[0].value == "Where memory goes"
    rows = [r for t in tables(at) if "engine (setting)" in t.columns for r in t.to_dict("records")]
    results = {fmt.plain(r.claim.quote): r for r in check_all()}
    for row in rows:
        r = results[row["original"]]
        assert row["verdict"] == r.verdict and row["claimed"] == fmt.plain(r.claim.claimed.text)
        assert row["engine (setting)"] == fmt.plain(r.engine_text + (f" — {r.setup}" if r.setup else ""))
    assert not CJK.search(" ".join(h.value for h in at.header))

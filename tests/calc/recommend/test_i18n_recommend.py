"""The recommender in Chinese: its sentences (calc.recommend.phrase) say in Chinese what they say in
English, the Compare and Recommend pages and the CLI tables speak Chinese with `lang=zh`, and English
stays what it was (the English sentences, the JSON, the CLI without --lang)."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

from calc.cli.main import main
from calc.contract.scenario import Scenario
from calc.recommend import RecommendRequest, optimization_waterfall, recommend, speed_ratio_words
from calc.recommend.models import Recommendation
from calc.recommend.phrase import T_, Phrase, joined, lower_first, pad
from tests.app.test_app_helpers import chart, open_app, tables, texts

ROOT = Path(__file__).resolve().parents[3]
CJK = re.compile(r"[\u3400-\u9fff]")
A100 = {"model": "llama-3.1-8b", "hardware": {"cluster": "1x-a100-80gb"}}


# ---- Phrase: the English string, renderable in Chinese -------------------------------------------

def test_phrase_is_its_english_and_renders_nested_fields_in_chinese():
    inner = speed_ratio_words(3.0)
    p = T_("{change}: up to {ratio}, but {reason}", change=T_("without offload"), ratio=inner, reason="x")
    assert p == "without offload: up to about 3.0x faster, but x" and isinstance(p, str)
    assert p.render("zh") == "不卸载：最多可快约 3.0 倍，但x"
    assert joined("; ", [T_("recomputation"), T_("the same")]).render("zh") == "重计算；相同"
    low = lower_first(T_("Full fine-tuning does not fit this hardware; {explanation}", explanation="E"))
    assert low.startswith("full fine-tuning") and low.render("zh").startswith("全参微调")
    assert lower_first("QLoRA r16 + no ZeRO") == "QLoRA r16 + no ZeRO"  # a name keeps its capitals
    assert lower_first("LoRA r16") == "LoRA r16" and lower_first("The fastest") == "the fastest"


def test_phrase_survives_pickle_and_pydantic_and_dumps_as_english():
    rec = recommend(RecommendRequest(scenario=Scenario.model_validate(A100), max_candidates=2))
    back = pickle.loads(pickle.dumps(rec))  # st.cache_data
    assert isinstance(back.groups[0].label, Phrase) and back.groups[0].label.render("zh") == "全参微调（训练全部权重）"
    assert back.explanation.render("zh") == rec.explanation.render("zh")
    data = json.loads(rec.model_dump_json())
    assert data["groups"][0]["label"] == "Full fine-tuning (every weight trained)"
    assert Recommendation.model_validate(data).explanation == rec.explanation  # the JSON reads back (as English)


def test_recommendation_and_waterfall_render_in_chinese():
    sc = Scenario.model_validate(A100)
    rec = recommend(RecommendRequest(scenario=sc, max_candidates=2))
    for c in rec.candidates:
        zh = c.label.render("zh")
        assert CJK.search(zh) and c.label.render("en") == c.label
    assert CJK.search(rec.groups[0].explanation.render("zh"))
    steps = optimization_waterfall(sc)
    assert [s.name.render("zh") for s in steps[:4]] == ["基线", "混合精度", "FlashAttention / SDPA", "梯度检查点"]
    assert all(CJK.search(s.change.render("zh")) for s in steps if s.name not in ("FlashAttention / SDPA",))


def test_padding_counts_cjk_as_two_columns():
    assert pad("结论", 7) == "结论   " and pad("fits", 7) == f"{'fits':<7}" and pad("#", 2, ">") == " #"


# ---- the CLI -------------------------------------------------------------------------------------

def _write(tmp_path: Path, data) -> str:
    p = tmp_path / "s.json"
    p.write_text(json.dumps(data))
    return str(p)


def test_cli_recommend_table_in_chinese(tmp_path, capsys):
    path = _write(tmp_path, A100)
    assert main(["recommend", path, "--top", "2", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert "== 全参微调（训练全部权重） ==" in out and "结论" in out and "配置" in out
    assert "[更换训练方法]" in out and "1 GiB = 2^30 字节" in out
    assert main(["recommend", path, "--top", "2", "--format", "json", "--lang", "zh"]) == 0
    assert not CJK.search(capsys.readouterr().out)  # JSON stays English


def test_cli_estimate_table_in_chinese_and_english_by_default(tmp_path, capsys):
    path = _write(tmp_path, {"model": "gpt2", "hardware": {"cluster": "1x-rtx-4090"}})
    assert main(["estimate", path, "--format", "table", "--lang", "zh"]) == 0
    zh = capsys.readouterr().out
    assert "峰值显存" in zh and "（1 GiB = 2^30 字节）" in zh and "优化器状态" in zh
    assert main(["estimate", path, "--format", "table"]) == 0
    en = capsys.readouterr().out
    assert main(["estimate", path, "--format", "table", "--lang", "en"]) == 0
    assert capsys.readouterr().out == en and en.startswith("model ") and "peak allocated" in en
    assert en.splitlines()[-1] == "(1 GiB = 2^30 bytes)"


def test_cli_english_reads_no_catalogue(tmp_path):
    """`python -m calc recommend` stays fast: English never imports Babel nor reads a catalogue, and the
    evidence and export wings are left to their own commands."""
    path = _write(tmp_path, A100)
    code = ("import sys, io, contextlib; from calc.cli.main import main; from calc.contract import i18n\n"
            f"with contextlib.redirect_stdout(io.StringIO()): main(['recommend', {path!r}, '--top', '1'])\n"
            "assert 'babel' not in sys.modules and i18n.catalogue.cache_info().currsize == 0\n"
            "assert not [m for m in sys.modules if m.startswith(('calc.evidence', 'calc.export'))], sys.modules")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---- the pages -----------------------------------------------------------------------------------

def _table_columns(at) -> list[str]:
    return [c for t in tables(at) for c in t.columns] + [c for d in at.dataframe for c in d.value.columns]


def test_recommend_page_in_chinese():
    at = open_app("recommend", {"lang": "zh"})
    shown = "\n".join(texts(at))
    for want in ("能放下什么，下一步开启什么", "下一步开启什么", "最快的配置", "模型规模 x 硬件",
                 "全参微调（训练全部权重）", "每一格：calc.recommend"):
        assert want in shown, want
    cols = _table_columns(at)
    assert {"步", "开启", "设备总占用", "结论", "配置", "模型"} <= set(cols), cols
    assert any(b.label.startswith("把配置 #1") for b in at.button)
    assert at.selectbox[0].label == "配置"


def test_compare_page_in_chinese():
    at = open_app("compare", {"lang": "zh"})
    shown = "\n".join(texts(at))
    assert "对比场景" in shown and "差异（每张 GPU，GiB）" in shown and "峰值出现在" in shown
    rows = at.dataframe[0].value
    assert "每张 GPU（GiB）" in rows.columns
    assert {"峰值显存", "设备总占用（预期）", "显存", "余量"} <= set(rows["每张 GPU（GiB）"])


def test_recommend_waterfall_chart_names_its_steps_in_chinese():
    at = open_app("recommend", {"lang": "zh"})
    xs = [x for t in chart(at, "rec_waterfall")["data"] for x in (t.get("x") or []) if isinstance(x, str)]
    assert "0. 基线" in xs and "1. 混合精度" in xs, xs[:5]


def test_table_markdown_in_chinese():
    from calc.recommend import recommendation_table

    table = recommendation_table(["llama-3.1-405b"], ["1x-rtx-4090"])
    zh, en = table.to_markdown("zh"), table.to_markdown()
    assert zh.startswith("| 模型 | 1x-rtx-4090 |") and "放不下（连 QLoRA 也不行）" in zh and "每一格：" in zh
    assert en.startswith("| model | 1x-rtx-4090 |") and "does not fit (not even QLoRA)" in en

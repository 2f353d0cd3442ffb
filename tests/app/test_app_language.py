"""The app's language (issue 13): `?lang=zh` opens in Chinese, the sidebar switch changes it, the URL
and the navigation links keep it across pages, the browser's locale is the default, a bad `?lang=`
falls back to English quietly; and the Calculator and its sidebar say their words in Chinese."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

from calc.contract.i18n import translate
from tests.app.test_app_helpers import APP, TIMEOUT, assert_clean, go, open_app, visible_text
from tests.calc.contract.test_i18n import CJK, KEEP, english_runs
from ui import language, widgets

ZH_TITLE = translate("GPU memory calculator", "zh")


def _switch(at: AppTest):
    return at.get("button_group")[0]  # the sidebar's segmented control, the only one in the app


def _link_params(at: AppTest) -> list[dict[str, list[str]]]:
    return [parse_qs(link.proto.query_string) for link in at.sidebar.get("page_link")]


def test_catalogue_has_the_calculator_in_chinese():
    assert ZH_TITLE != "GPU memory calculator" and CJK.search(ZH_TITLE)


def test_lang_zh_opens_in_chinese():
    at = open_app("calculator", {"lang": "zh"})
    assert at.title[0].value == ZH_TITLE
    assert _switch(at).value == "zh"
    assert [e.label for e in at.sidebar.expander][:2] == [translate("Model", "zh"), translate("Hardware", "zh")]
    assert at.query_params["lang"] == "zh"


def test_english_by_default_and_no_lang_in_the_url():
    at = open_app("calculator")
    assert at.title[0].value == "GPU memory calculator"
    assert _switch(at).value == "en"
    assert "lang" not in at.query_params
    assert all("lang" not in q for q in _link_params(at))


def test_the_switch_changes_the_language_and_the_links_and_pages_keep_it():
    at = open_app("calculator")
    _switch(at).set_value("zh").run()
    assert_clean(at)
    assert at.title[0].value == ZH_TITLE
    assert at.query_params["lang"] == "zh"
    links = _link_params(at)
    assert len(links) == len(widgets.PAGES) and all(q.get("lang") == ["zh"] and q.get("model") for q in links)
    assert [link.proto.label for link in at.sidebar.get("page_link")][0] == translate("Calculator", "zh")
    go(at, "compare")  # another page: same session, still Chinese, the URL still says so
    assert at.session_state[language.LANG] == "zh" and at.query_params["lang"] == "zh"
    assert _switch(at).value == "zh"
    go(at, "calculator")
    assert at.title[0].value == ZH_TITLE and at.query_params["lang"] == "zh"
    _switch(at).set_value("en").run()  # and back: English drops the parameter
    assert at.title[0].value == "GPU memory calculator"
    assert "lang" not in at.query_params and all("lang" not in q for q in _link_params(at))


@pytest.mark.parametrize(("locale", "title"), [("zh-CN", ZH_TITLE), ("zh-Hans-TW", ZH_TITLE),
                                               ("en-GB", "GPU memory calculator"), ("de-DE", "GPU memory calculator")])
def test_browser_locale_is_the_default(locale, title):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.context["locale"] = locale
    at.run()
    assert_clean(at)
    assert at.title[0].value == title


def test_the_link_beats_the_browser_locale():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.context["locale"] = "zh-CN"
    at.query_params["lang"] = "en"
    at.run()
    assert at.title[0].value == "GPU memory calculator"


@pytest.mark.parametrize("bad", ["xx", "", "zh" * 40, "<script>"])
def test_an_unknown_lang_falls_back_to_english_quietly(bad):
    at = open_app("calculator", {"lang": bad})
    assert at.title[0].value == "GPU memory calculator"
    assert not at.warning  # quietly (the error box below the title is the default scenario's verdict)
    assert "lang" not in at.query_params  # the URL is rewritten to what is shown


def test_calculator_sidebar_has_no_english_prose_in_chinese():
    at = open_app("calculator", {"lang": "zh"})
    shown = visible_text(at.sidebar)
    assert any(CJK.search(t) for t in shown)
    assert [run for t in shown for run in english_runs(t, 3, KEEP)] == []


def test_calculator_words_in_chinese():
    at = open_app("calculator", {"lang": "zh"})
    labels = {m.label for m in at.metric}
    assert {translate("Peak allocated (GiB)", "zh"), translate("Headroom (GiB)", "zh")} <= labels
    # the default does not fit: no micro-batch figure, a sentence in Chinese instead
    assert any(translate("No micro-batch fits at sequence length {seq_len}, not even 1, with everything else "
                         "unchanged.", "zh", seq_len="2,048") == m.value for m in at.markdown)
    subheaders = [s.value for s in at.subheader]
    assert translate("What fits", "zh") in subheaders and translate("Components", "zh") in subheaders
    assert any("显存" in t for t in visible_text(at.main))


def test_invalid_scenario_message_in_chinese():
    """A validator's message (calc.contract.scenario) reaches the sidebar and the page body in Chinese."""
    at = open_app("calculator", {"lang": "zh", "model": "llama-2-7b", "sp": "1"})  # sequence parallel without tensor parallel
    assert "序列并行" in at.warning[0].value  # the link's problem, in Chinese
    at = open_app("calculator", {"lang": "zh"})
    at.sidebar.checkbox(key="sc_sp").check().run()
    errors = [e.value for e in at.error]
    assert any("序列并行" in e and "tensor_parallel" in e for e in errors), errors
    assert any(e.startswith(translate("The scenario is not valid: {problem}. Change the setting marked in the "
                                      "sidebar.", "zh", problem="")[:5]) for e in errors)


def test_invalid_scenario_message_in_english_is_unchanged():
    at = open_app("calculator")
    at.sidebar.checkbox(key="sc_sp").check().run()
    assert any("sequence_parallel needs tensor_parallel \\> 1 (Megatron-style SP)" in e.value for e in at.error)


# ---- calc's messages: English str(), Chinese on request ----------------------------------------

def test_validator_messages_render_in_both_languages():
    import pickle

    from pydantic import ValidationError

    from calc.contract.boundary import error_message, one_line, parse_json
    from calc.contract.errors import UserError
    from calc.contract.scenario import Scenario
    from ui import state

    data = {"model": "llama-2-7b", "training": {"sequence_parallel": True}}
    with pytest.raises(ValidationError) as info:
        Scenario.model_validate(data)
    english = "training: sequence_parallel needs tensor_parallel > 1 (Megatron-style SP)"
    assert one_line(info.value) == english == state.error_text(info.value, "en")
    chinese = state.error_text(info.value, "zh")
    assert chinese.startswith("training: ") and "序列并行" in chinese and chinese == one_line(info.value, lang="zh")
    with pytest.raises(state.UrlError) as url:
        state.params_to_scenario({"model": "llama-2-7b", "sp": "1"})
    assert str(url.value) == english
    assert url.value.render("zh") == chinese
    with pytest.raises(UserError) as bad:
        parse_json('{"a": NaN}', "config.json")
    assert str(bad.value) == "config.json: a: NaN is not a number (JSON has no NaN or Infinity)"
    assert "不是数值" in error_message(bad.value, "zh") and error_message(bad.value) == str(bad.value)
    again = pickle.loads(pickle.dumps(bad.value))  # pickles as its English line
    assert str(again) == str(bad.value) and again.render("zh") == str(bad.value)


def test_pydantic_messages_in_chinese_by_error_type():
    """pydantic's own messages (range, type, choice, unknown field) are worded in Chinese by their error type;
    English keeps pydantic's words."""
    from pydantic import ValidationError

    from calc.contract.boundary import error_message
    from calc.contract.scenario import Scenario

    cases = [({"training": {"micro_batch_size": 0}}, "不能小于 1", "greater than or equal to 1"),
             ({"training": {"seq_len": "abc"}}, "必须是整数", "valid integer"),
             ({"training": {"precision": "fp7"}}, "必须是以下之一：'fp32'", "Input should be 'fp32'"),
             ({"bogus": 1}, "不是已知字段", "Extra inputs are not permitted")]
    for extra, zh, en in cases:
        with pytest.raises(ValidationError) as info:
            Scenario.model_validate({"model": "gpt2", **extra})
        assert zh in error_message(info.value, "zh") and en in error_message(info.value)


def test_cluster_names_in_column_names_follow_the_language():
    """Compare's column names carry the cluster's short name in the session's language ('1x RTX 4090 工作站')."""
    at = open_app("compare", {"lang": "zh"})
    shown = " ".join(visible_text(at))
    assert "1x RTX 4090 工作站" in shown and "workstation" not in shown
    assert "1x RTX 4090 workstation" in " ".join(visible_text(open_app("compare")))

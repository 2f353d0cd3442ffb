"""The two languages: catalogues complete and consistent, the glossary kept, every page in Chinese.

The English text is the message ids themselves; the Chinese is in locales/zh/LC_MESSAGES/*.po
(scripts/i18n.py writes the ids, translators fill them in). What fails here:
- an id in the code that the catalogue lacks, an empty, fuzzy or stale entry;
- a translation whose `{fields}`, **bold** or `code` marks differ from the English;
- English prose left in a Chinese translation (outside glossary.yaml's keep_english terms);
- a glossary term translated some other way, one id translated two ways in two domains;
- a page that raises, or shows English prose, when rendered in Chinese.
"""

from __future__ import annotations

import importlib.util
import os
import re
import string
from functools import cache
from pathlib import Path

import pytest

from calc.contract import i18n
from calc.contract.presets import load_yaml

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("i18n_tool", ROOT / "scripts" / "i18n.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

# Domains whose catalogue is complete, and pages that render wholly in Chinese. Each grows as its
# part of the app is translated; when the whole app is, they are all of DOMAINS / every page.
# I18N_STRICT=all (or a comma list of domains and pages) checks more while translating.
DONE_DOMAINS: set[str] = set(i18n.DOMAINS)
ZH_PAGES: list[str] = ["calculator", "compare", "recommend", "explain", "export", "validation"]
_STRICT = os.environ.get("I18N_STRICT", "")
if _STRICT:
    _asked = set(i18n.DOMAINS) | {"calculator", "compare", "recommend", "explain", "export", "validation"} \
        if _STRICT == "all" else set(_STRICT.split(","))
    DONE_DOMAINS |= _asked & set(i18n.DOMAINS)
    ZH_PAGES += sorted(_asked & {"calculator", "compare", "recommend", "explain", "export", "validation"})

GLOSSARY = load_yaml((i18n.LOCALES_DIR / "glossary.yaml").read_text(encoding="utf-8"))
CJK = re.compile(r"[\u3400-\u9fff]")
# Not prose: code spans, {fields}, URLs, math, command-line flags, dotted/underscored identifiers.
MARKUP = re.compile(r"`[^`]*`|\{[A-Za-z0-9_]*\}|https?://\S+|\$[^$]*\$|--?[A-Za-z][\w-]*|\w+(?:[._/]\w+)+(?:\(\))?")
WORD_RUN = r"[A-Za-z][a-z]+(?:[ ,;:-]+[A-Za-z][a-z]+){%d,}"


def english_runs(text: str, words: int, keep: frozenset[str] = frozenset()) -> list[str]:
    """Runs of `words` or more English words in `text`, not counting code, {fields}, URLs, math and
    the terms in `keep` (each of which breaks a run)."""
    text = MARKUP.sub(" | ", text)
    for term in sorted(keep, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z]){re.escape(term)}(?![A-Za-z])", " | ", text)
    return re.findall(WORD_RUN % (words - 1), text)


KEEP = frozenset(GLOSSARY["keep_english"])


@cache
def entries(domain: str) -> list[tuple[str, str]]:
    return [(str(m.id), str(m.string)) for m in tool.read_catalogue(domain) if m.id and m.string]


def all_entries() -> list[tuple[str, str, str]]:
    return [(d, msgid, msgstr) for d in i18n.DOMAINS for msgid, msgstr in entries(d)]


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


# ---- the catalogues ----------------------------------------------------------------------------

def test_every_marker_has_a_literal_and_every_domain_extracts():
    for domain in i18n.DOMAINS:
        tool.extract(domain)  # raises MarkError on _(f"...") or _(variable)


@pytest.mark.parametrize("domain", sorted(i18n.DOMAINS))
def test_catalogue_is_complete(domain):
    if domain not in DONE_DOMAINS:
        pytest.skip(f"{domain}: not yet translated")
    assert [p for p in tool.problems() if p.startswith(f"{domain}:")] == []


def test_translations_keep_fields_and_markup():
    for domain, msgid, msgstr in all_entries():
        where = f"{domain}: {msgid[:50]!r}"
        assert _fields(msgstr) == _fields(msgid), where
        if _fields(msgid) and all(name.isidentifier() for name in _fields(msgid)):  # else literal braces
            msgstr.format(**{name: "x" for name in _fields(msgid)})  # no stray brace
        assert msgstr.count("**") == msgid.count("**"), f"bold marks differ: {where}"
        assert msgstr.count("`") == msgid.count("`"), f"code marks differ: {where}"
        assert msgstr.count("\n\n") <= msgid.count("\n\n") + 1, f"paragraphs differ: {where}"


def test_no_english_left_in_chinese():
    for domain, msgid, msgstr in all_entries():
        if english_runs(msgid, 2, KEEP):
            assert CJK.search(msgstr), f"{domain}: not translated: {msgstr[:60]!r}"
        assert not english_runs(msgstr, 3, KEEP), f"{domain}: English left: {english_runs(msgstr, 3, KEEP)}"


CJK_OR_FULL_WIDTH = re.compile(r"[\u3400-\u9fff\u3000-\u303f\uff00-\uffef]")


def ascii_brackets_in_chinese(text: str) -> list[str]:
    """The ASCII (...) of `text` that enclose or follow Chinese words: Chinese text takes full-width brackets.
    Code is exempt (a `code span`, a call such as max_memory_allocated(), a Markdown link's target), and so is a
    formula ("(总显存 - 静态开销) / ...")."""
    found = []
    for part in re.split(r"`[^`]*`", text):
        opened: list[int] = []
        for i, ch in enumerate(part):
            if ch == "(":
                opened.append(i)
            elif ch == ")" and opened:
                j = opened.pop()
                before = part[:j].rstrip()
                code = j and (part[j - 1] == "]" or part[j - 1].isascii() and (part[j - 1].isalnum() or part[j - 1] == "_"))
                formula = re.search(r" [-+/x×*] ", part[j + 1:i])
                chinese = CJK_OR_FULL_WIDTH.search(part[j + 1:i]) or (before and CJK_OR_FULL_WIDTH.match(before[-1]))
                if chinese and not code and not formula:
                    found.append(part[max(j - 10, 0):i + 1])
    return found


def test_ascii_brackets_in_chinese_are_found():
    assert ascii_brackets_in_chinese("序列长度 (tokens)") == ["序列长度 (tokens)"]
    assert ascii_brackets_in_chinese("序列长度（tokens）、`f(x)`、max_memory_allocated()、[链接](#zero)") == []
    assert ascii_brackets_in_chinese("公式：(总显存 - 静态开销) / 2") == []


def test_chinese_text_takes_full_width_brackets():
    bad = [(msgid[:50], found) for _d, msgid, msgstr in all_entries() if (found := ascii_brackets_in_chinese(msgstr))]
    assert bad == []


def test_glossary_terms_are_used_consistently():
    for domain, msgid, msgstr in all_entries():
        for term in GLOSSARY["terms"]:
            if re.search(rf"(?<![A-Za-z])(?:{term['en']})(?![A-Za-z])", MARKUP.sub(" ", msgid), re.IGNORECASE):
                assert term["zh"] in msgstr, f"{domain}: {term['en']!r} should be {term['zh']}: {msgstr[:80]!r}"


def test_one_sentence_one_translation():
    seen: dict[str, tuple[str, str]] = {}
    for domain, msgid, msgstr in all_entries():
        first = seen.setdefault(msgid, (domain, msgstr))
        assert first[1] == msgstr, f"{msgid[:50]!r}: {first[0]} and {domain} translate it differently"


def test_english_runs_finds_prose_but_not_terms():
    assert english_runs("显存 needs more host memory", 3) == ["needs more host memory"]
    assert english_runs("ZeRO-3 与 CPU offload 的 `torch.cuda.max_memory_allocated()`", 3, KEEP) == []
    assert english_runs("使用 {model} 在 Hugging Face Trainer 上", 3, KEEP) == []
    assert english_runs("Megatron-LM 的 --recompute-granularity selective 和 torch.optim.AdamW 选项", 3, KEEP) == []


# ---- the lookup --------------------------------------------------------------------------------

def test_english_is_the_id_and_loads_no_catalogue():
    assert i18n.translate("Peak {n}", "en", n=3) == "Peak 3"
    assert i18n.catalogue("en") == {}


def test_parse_lang():
    assert i18n.parse_lang("zh-CN") == "zh" and i18n.parse_lang("zh_Hans_CN") == "zh"
    assert i18n.parse_lang("en-US") == "en"
    assert i18n.parse_lang("fr") is None and i18n.parse_lang(None) is None and i18n.parse_lang("x" * 100) is None


def test_chinese_lookup_and_fallback():
    translated = [(msgid, msgstr) for _, msgid, msgstr in all_entries() if not _fields(msgid)]
    if translated:
        msgid, msgstr = translated[0]
        assert i18n.gettext(msgid, "zh") == msgstr
    assert i18n.gettext("an id nobody wrote", "zh") == "an id nobody wrote"
    text = i18n.T_("needs {need} of {have}", need="3 GiB", have=4)
    assert text.fields == {"need": "3 GiB", "have": "4"} and str(text) == "needs 3 GiB of 4"
    nested = i18n.T_("{what}, then {more}", what=text, more=2)
    assert str(nested) == "needs 3 GiB of 4, then 2" and nested.render("zh").endswith("2")


# ---- the app in Chinese ------------------------------------------------------------------------

@pytest.mark.parametrize("page", ZH_PAGES or ["calculator"])
def test_page_renders_in_chinese(page):
    if page not in ZH_PAGES:
        pytest.skip("no page translated yet")
    from tests.app.test_app_helpers import open_app, open_folded, visible_text

    at = open_folded(open_app(page, {"lang": "zh"}))
    shown = visible_text(at.main if os.environ.get("I18N_MAIN_ONLY") else at)
    assert any(CJK.search(t) for t in shown)
    left = [run for t in shown for run in english_runs(t, 4, KEEP)]
    assert left == [], left[:10]

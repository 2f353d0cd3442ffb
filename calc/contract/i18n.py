"""Languages: English (the message ids themselves) and Simplified Chinese (gettext catalogues).

Strings live in message catalogues, not in the code: every user-facing sentence is an English
message id, marked where it is written (`N_` in calc/, `_` in the app, see ui/language.py) and
translated in `locales/zh/LC_MESSAGES/<domain>.po`, the gettext format that translators' tools
(Poedit, Weblate, Lokalise) read. `python scripts/i18n.py update` extracts the ids from the code
into the catalogues; tests/calc/contract/test_i18n.py fails on a missing, empty or inconsistent translation.

English needs no catalogue: an id is its own English text, so the CLI and the engine never load
one unless Chinese is asked for. A sentence with numbers in it is one id with `{named}` fields,
filled after translation (the numbers come from the same formatter in both languages).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

Lang = Literal["en", "zh"]
LANGS: tuple[Lang, ...] = get_args(Lang)
DEFAULT_LANG: Lang = "en"
LANG_NAMES: dict[Lang, str] = {"en": "English", "zh": "中文"}
LOCALES_DIR = Path(__file__).resolve().parents[2] / "locales"
CATALOGUE_LANG = "zh"  # the one language with catalogues (English is the ids)

# One domain per part of the product, so that a catalogue stays a size a translator can review and
# the parts can be translated at the same time. The ids of all domains share one namespace: the same
# English sentence has one translation everywhere (tests/calc/contract/test_i18n.py checks it).
# domain -> the source files whose marked strings it holds (globs relative to the repository root).
# A file belongs to the first domain that matches it; the last two are catch-alls.
DOMAINS: dict[str, tuple[str, ...]] = {
    "recommend": ("pages/2_Compare.py", "pages/3_Recommend.py", "calc/recommend/*.py", "calc/cli/*.py",
                  "calc/memory/fit.py", "calc/speed/*.py", "calc/contract/variant.py"),
    "breakdown": ("ui/plots.py", "ui/verdict_box.py", "ui/calibration.py", "calc/memory/*.py", "calc/evidence/calibrate.py",
                  "calc/sim/*.py", "calc/contract/precision.py"),
    "explain": ("pages/4_Explain.py", "ui/explain/*.py", "data/claims.yaml", "calc/evidence/claims.py"),
    "export": ("pages/5_Export.py", "calc/export/*.py", "pages/6_Validation.py", "calc/evidence/validate.py",
               "calc/contract/record.py"),
    "app": ("app.py", "ui/*.py", "presets/clusters/*.yaml", "pages/7_Serve.py"),
    "calc": ("calc/**/*.py",),
}


def N_(msgid: str) -> str:
    """Marks `msgid` for the catalogues without translating it (calc/ has no language of its own:
    whoever shows the text translates it, with `translate`)."""
    return msgid


def parse_lang(value: object) -> Lang | None:
    """'zh', 'zh-CN', 'zh_Hans_CN' -> 'zh'; 'en-US' -> 'en'; anything else -> None."""
    if not isinstance(value, str) or len(value) > 35:  # a BCP 47 tag is short (RFC 5646 §4.4.1)
        return None
    primary = value.strip().replace("_", "-").split("-")[0].lower()
    return primary if primary in LANGS else None  # type: ignore[return-value]


@functools.cache
def catalogue(lang: Lang) -> dict[str, str]:
    """msgid -> translation for `lang`, from every domain's .po file (read once per process)."""
    if lang == DEFAULT_LANG:
        return {}
    from babel.messages.pofile import read_po  # only when a translation is asked for

    table: dict[str, str] = {}
    for path in sorted((LOCALES_DIR / lang / "LC_MESSAGES").glob("*.po")):
        with path.open("rb") as fh:
            for message in read_po(fh, locale=lang):
                if message.id and message.string and not message.fuzzy:
                    table[str(message.id)] = str(message.string)
    return table


def gettext(msgid: str, lang: Lang) -> str:
    """The translation of `msgid` in `lang`; the id itself (English) where there is none."""
    return catalogue(lang).get(msgid, msgid) if lang != DEFAULT_LANG else msgid


def translate(msgid: str, lang: Lang, **fields: object) -> str:
    """`gettext` with its `{named}` fields filled in. Without fields the text is returned as it is
    (braces in it are literal then)."""
    text = gettext(msgid, lang)
    return text.format(**fields) if fields else text


def render(value: object, lang: Lang = DEFAULT_LANG) -> str:
    """Any text in `lang`: a Text, anything else that renders itself (calc.recommend.phrase.Phrase), or a
    plain string shown as it is."""
    fn = getattr(value, "render", None)
    return fn(lang) if callable(fn) else str(value)


class Text(BaseModel):
    """A sentence the engine says, kept translatable: the message id and its fields, already
    formatted (numbers go through one formatter in both languages) or themselves a Text (a phrase
    inside a sentence, rendered in the same language). `str(text)` is the English."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    msgid: str
    fields: dict[str, str | Text] = {}

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        return translate(self.msgid, lang, **{k: render(v, lang) for k, v in self.fields.items()})

    def __str__(self) -> str:
        return self.render(DEFAULT_LANG)


def T_(msgid: str, **fields: object) -> Text:
    """A translatable sentence with its fields: `T_("needs {need} of {have}", need=..., have=...)`.
    Marks `msgid` for the catalogues like `N_` (so it must be a string literal)."""
    return Text(msgid=msgid, fields={k: v if isinstance(v, Text) else str(v) for k, v in fields.items()})

"""The recommender's sentences, kept translatable: a `Phrase` is the English text itself (a `str`,
so the CLI, the JSON and every English test see exactly what they saw before) that also remembers its
message id and its fields, so that `phrase.render("zh")` says it in Chinese.

The recommender builds its sentences out of other sentences (a configuration's label inside an
explanation inside advice), so a field may itself be a Phrase (or a calc.contract.i18n.Text, or anything with
`render(lang)`): it is rendered in the same language as the sentence around it. English renders
without loading a catalogue. `T_` here is calc.contract.i18n.T_ for nested sentences (scripts/i18n.py
extracts both); `joined` joins parts with a separator that is itself a message id ("; " -> "；").
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema

from calc.contract.i18n import DEFAULT_LANG, N_, Lang, render, translate


class Phrase(str):
    """An English sentence (the str value) with its message id and fields, renderable in any language."""

    msgid: str
    fields: dict[str, object]

    def __new__(cls, msgid: str, **fields: object) -> Phrase:
        english = translate(msgid, DEFAULT_LANG, **{k: render(v, DEFAULT_LANG) for k, v in fields.items()})
        self = super().__new__(cls, english)
        self.msgid, self.fields = msgid, fields
        return self

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        if lang == DEFAULT_LANG:
            return str.__str__(self)
        return translate(self.msgid, lang, **{k: render(v, lang) for k, v in self.fields.items()})

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by st.cache_data: keep the id and fields
        return (_rebuild, (type(self), self.msgid, self.fields, str.__str__(self)))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        """In a pydantic model: a Phrase stays a Phrase (a plain str, from JSON, is accepted as it is);
        dumped, it is its English text, so the JSON contract does not change."""
        return core_schema.json_or_python_schema(
            json_schema=core_schema.str_schema(),
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), core_schema.str_schema()]),
            serialization=core_schema.plain_serializer_function_ser_schema(str.__str__, return_schema=core_schema.str_schema()),
        )


class Joined(Phrase):
    """Parts joined by a separator that is a message id of its own (N_("; ") is "；" in Chinese)."""

    def __new__(cls, sep: str, parts: list[object]) -> Joined:
        self = str.__new__(cls, sep.join(render(p, DEFAULT_LANG) for p in parts))
        self.msgid, self.fields = sep, {"parts": list(parts)}
        return self

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        if lang == DEFAULT_LANG:
            return str.__str__(self)
        return translate(self.msgid, lang).join(render(p, lang) for p in self.fields["parts"])  # type: ignore[attr-defined]


class _LowerFirst(Phrase):
    """The English with its first letter lowered (to follow a semicolon), unless its first word is a name written
    with capitals inside (LoRA, QLoRA, ZeRO); other languages as they are."""

    def __new__(cls, inner: object) -> _LowerFirst:
        english = str(inner)
        first_word = english.split(" ", 1)[0]
        lowered = english if first_word[1:] != first_word[1:].lower() else english[:1].lower() + english[1:]
        self = str.__new__(cls, lowered)
        self.msgid, self.fields = "{text}", {"text": inner}
        return self

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        return str.__str__(self) if lang == DEFAULT_LANG else render(self.fields["text"], lang)


def _rebuild(cls: type[Phrase], msgid: str, fields: dict[str, object], english: str) -> Phrase:
    self = str.__new__(cls, english)
    self.msgid, self.fields = msgid, fields
    return self


def T_(msgid: str, **fields: object) -> Phrase:
    """A translatable sentence whose fields may be sentences themselves (see the module docstring)."""
    return Phrase(msgid, **fields)


def joined(sep: str, parts: list[object]) -> Phrase:
    """`sep.join(parts)` that renders each part, and the separator, in the sentence's language. `sep` is
    one of SEPARATORS."""
    return Joined(sep, parts)


def lower_first(text: object) -> Phrase:
    """`text` to follow a semicolon: the English lowercases its first letter, Chinese is unchanged."""
    return _LowerFirst(text)


SEPARATORS = (N_("; "),)  # ", " is calc.memory.verdict's; " + " needs no translation


def width(text: str) -> int:
    """Terminal columns of `text`: CJK characters take two (for aligned CLI tables in Chinese)."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def pad(text: str, cols: int, align: str = "<") -> str:
    """`f"{text:<cols}"` (or ">") counting terminal columns; the same as the f-string for ASCII."""
    fill = " " * max(0, cols - width(text))
    return text + fill if align == "<" else fill + text

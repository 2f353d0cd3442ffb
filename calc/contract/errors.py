"""Errors shared by the CLI and the modules it dispatches to."""

from __future__ import annotations

from collections.abc import Callable

from calc.contract.i18n import DEFAULT_LANG, Lang, Text


class UserError(ValueError):
    """Bad input from the user: the CLI prints it as one line and exits with code 2.

    The message is a plain string, a calc.contract.i18n.Text (`T_(...)`), or a function of the language (for a
    line framed around another error's message). `str(exc)` is always the English; `render(lang)` the
    message in `lang`, which the app shows. Pydantic keeps a validator's exception in its error's ctx,
    so calc.contract.boundary.one_line finds the UserError there and words it in the asked language too."""

    def __init__(self, message: str | Text | Callable[[Lang], str] = "") -> None:
        if isinstance(message, Text):
            self._words: Callable[[Lang], str] | None = message.render
        elif callable(message):
            self._words = message
        else:
            self._words = None
        super().__init__(self._words(DEFAULT_LANG) if self._words else message)

    def render(self, lang: Lang = DEFAULT_LANG) -> str:
        return self._words(lang) if self._words is not None else str(self)

    def __reduce__(self) -> tuple[type, tuple[str]]:  # pickles as its English line (the words are code)
        return type(self), (str(self),)

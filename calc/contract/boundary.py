"""The input boundary: every text a user hands the calculator becomes Python values here, or a
UserError with one short line naming where the problem is.

Every entry point parses through these functions: the CLI's files and stdin, the app's text boxes
and uploads (config.json, ds_config.json, measurement records), a link's query parameters
(`config=` is zlib-compressed JSON) and the validation data loader (calc.contract.record). They bound
size before reading, nesting depth before `json.loads` recurses, decompressed size before it is
allocated, and reject what JSON parsers let through but no field of ours can mean: NaN, Infinity,
1e400, integers beyond int64, and a key given twice in one object (readers disagree on which one
counts). Pydantic models are then validated in strict mode (no bool as an int, no 4096.7 truncated
to 4096, no "false" as a boolean). Messages quote at most a short excerpt of the input.
"""

from __future__ import annotations

import json
import math
import re
import string
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from calc.contract.errors import UserError
from calc.contract.i18n import DEFAULT_LANG, N_, T_, Lang, Text, translate
from calc.contract.limits import (
    MAX_EXCERPT_CHARS,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_INT,
    MAX_JSON_INT_DIGITS,
    MAX_MESSAGE_CHARS,
)

M = TypeVar("M", bound=BaseModel)


class JsonSyntaxError(UserError):
    """The text is not one JSON document (the records reader then tries JSON lines)."""


# ---- messages -------------------------------------------------------------------------------

def excerpt(value: Any, limit: int = MAX_EXCERPT_CHARS) -> str:
    """repr(value), cut to about `limit` characters (with the full length) so an error message never
    echoes a 50 MB input."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value):,} characters)"
    text = repr(value) if not isinstance(value, (dict, list)) or len(value) < 16 else \
        f"<{type(value).__name__} of {len(value):,} items>"
    return text if len(text) <= limit else text[:limit] + "..."


def short(message: str) -> str:
    """The first line of a message, at most MAX_MESSAGE_CHARS long, printable on any terminal."""
    line = (message.strip().splitlines() or [""])[0]
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 3] + "..."
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


# pydantic's own messages, by error type, for the other languages (English keeps pydantic's words).
PYDANTIC_WORDS: dict[str, str] = {
    "greater_than_equal": N_("must be at least {ge}"),
    "greater_than": N_("must be greater than {gt}"),
    "less_than_equal": N_("must be at most {le}"),
    "less_than": N_("must be less than {lt}"),
    "literal_error": N_("must be one of {expected}"),
    "enum": N_("must be one of {expected}"),
    "missing": N_("is required"),
    "extra_forbidden": N_("is not a known field"),
    "int_parsing": N_("must be a whole number"),
    "int_type": N_("must be a whole number"),
    "int_from_float": N_("must be a whole number"),
    "float_parsing": N_("must be a number"),
    "float_type": N_("must be a number"),
    "finite_number": N_("must be a finite number"),
    "bool_parsing": N_("must be true or false"),
    "bool_type": N_("must be true or false"),
    "string_type": N_("must be text"),
    "string_too_long": N_("must be at most {max_length} characters"),
    "dict_type": N_("must be an object"),
    "model_type": N_("must be an object"),
    "list_type": N_("must be a list"),
}


def problem(err: Any, lang: Lang = DEFAULT_LANG) -> str:
    """The message of one pydantic error (an item of `errors()`) in `lang`: a validator's own UserError
    (kept in the error's ctx) has its words in both languages; pydantic's own messages are worded by
    their error type (PYDANTIC_WORDS) outside English."""
    ctx = err.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, UserError):
        return cause.render(lang)
    msgid = PYDANTIC_WORDS.get(err.get("type", ""))
    if lang != DEFAULT_LANG and msgid is not None:
        names = [n for _, n, _, _ in string.Formatter().parse(msgid) if n]
        if all(n in ctx for n in names):
            return translate(msgid, lang, **{n: str(ctx[n])[:200] for n in names})  # short() bounds the line
    return str(err["msg"]).removeprefix("Value error, ")


def one_line(exc: ValidationError, whole: str = "scenario", lang: Lang = DEFAULT_LANG) -> str:
    """The first validation problem as 'field.path: message (+N more)' (`whole` when it is the
    input itself that is wrong, e.g. a list where a record belongs), in `lang`."""
    err = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(excerpt(p, 40) if not isinstance(p, (str, int)) or len(str(p)) > 40 else str(p)
                     for p in err["loc"]) or whole
    msg = problem(err, lang)
    if exc.error_count() > 1:
        return short(translate(N_("{where}: {message} (+{n} more)"), lang, where=where, message=msg,
                               n=exc.error_count() - 1))
    return short(f"{where}: {msg}")


def error_message(exc: BaseException, lang: Lang = DEFAULT_LANG) -> str:
    """One readable line for any rejected input, in `lang` (English by default)."""
    if isinstance(exc, ValidationError):
        return one_line(exc, lang=lang)
    if isinstance(exc, UserError):
        return short(exc.render(lang)) or exc.__class__.__name__
    return short(str(exc)) or exc.__class__.__name__


# ---- bytes -> text --------------------------------------------------------------------------

def decode(data: bytes, where: str) -> str:
    """UTF-8 (a byte-order mark is allowed), or UserError naming `where` and the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(T_("{where}: not UTF-8 text (byte {byte} at offset {offset}); save it as UTF-8",
                           where=where, byte=f"0x{data[exc.start]:02x}", offset=f"{exc.start:,}")) from None


def read_text(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> str:
    """A file's text ('-' is stdin), reading at most max_bytes + 1 bytes."""
    where = str(path)
    try:
        if where == "-":
            data = sys.stdin.buffer.read(max_bytes + 1)
            where = "stdin"
        else:
            with open(path, "rb") as fh:
                data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UserError(T_("cannot read {where}: {reason}", where=where,
                           reason=exc.strerror or exc.__class__.__name__)) from None
    if len(data) > max_bytes:
        raise UserError(T_("{where}: larger than {size}", where=where, size=_size(max_bytes)))
    return decode(data, where)


def decompress(data: bytes, where: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """zlib data, inflated to at most max_bytes (a 184-byte payload can inflate to gigabytes)."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error:
        raise UserError(T_("{where}: not zlib-compressed data", where=where)) from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise UserError(T_("{where}: decompresses to more than {size}", where=where, size=_size(max_bytes)))
    if not inflater.eof:
        raise UserError(T_("{where}: the compressed data is cut short", where=where))
    return out


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


# ---- text -> JSON values ----------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")


def check_depth(text: str, where: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Reject JSON nested too deeply max_depth before a recursive parser sees it (CPython's json
    raises RecursionError near 1,000 levels; pydantic and json.dumps recurse on what it returns)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= max_depth:
        return
    depth = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            if depth > max_depth:
                raise UserError(T_("{where}: nested too deeply (more than {depth} levels)", where=where,
                                   depth=max_depth))
        else:
            depth -= 1


class _Unfit:
    """A JSON number no field can hold (NaN, Infinity, 1e400, beyond int64), kept in place while
    parsing so the message can name where it is."""

    __slots__ = ("why",)

    def __init__(self, why: Text) -> None:
        self.why = why


def _hooks(found: list[_Unfit]) -> dict[str, Any]:
    """json.loads hooks that turn unfit numbers into _Unfit markers (recorded in `found`)."""
    def unfit(why: Text) -> _Unfit:
        found.append(_Unfit(why))
        return found[-1]

    def parse_int(literal: str) -> int | _Unfit:
        if len(literal.lstrip("-")) > MAX_JSON_INT_DIGITS or abs(value := int(literal)) > MAX_JSON_INT:
            return unfit(T_("the integer {value} is too large (the limit is 2^63 - 1)", value=excerpt(literal, 30)))
        return value

    def parse_float(literal: str) -> float | _Unfit:
        value = float(literal)
        return value if math.isfinite(value) else unfit(T_("the number {value} is out of range",
                                                              value=excerpt(literal, 30)))

    def parse_constant(name: str) -> _Unfit:
        return unfit(T_("{name} is not a number (JSON has no NaN or Infinity)", name=name))

    return dict(parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)


def _no_duplicate_keys(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json.loads' object hook that refuses a key given twice in one object: Python's json keeps the last, other
    readers the first or an error, so `{"zero_stage": 3, "zero_stage": 0}` would mean different things to them."""
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                raise UserError(T_("{where}: the key {key} appears twice in one object; give it once", where=where,
                                   key=excerpt(key, 40)))
            obj[key] = value
        return obj

    return build


def _path_of(value: Any, target: _Unfit) -> str:
    """'training.lora.alpha' / 'layers[3]': where `target` sits in the parsed value (depth <= 32)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            name = f"[{key}]" if isinstance(key, int) else (("." if path else "") + excerpt(key, 40).strip("'"))
            stack.append((child, path + name))
    return ""


def parse_json(text: str | bytes, where: str, max_bytes: int = MAX_JSON_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Bounded, finite JSON -> Python values; UserError (JsonSyntaxError for bad syntax) otherwise."""
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise UserError(T_("{where}: larger than {size}", where=where, size=_size(max_bytes)))
        text = decode(text, where)
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise UserError(T_("{where}: larger than {size}", where=where, size=_size(max_bytes)))
    if not text.strip():
        raise JsonSyntaxError(T_("{where}: empty (expected a JSON object)", where=where))
    check_depth(text, where, max_depth)
    found: list[_Unfit] = []
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys(where), **_hooks(found))
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(T_("{where}: not valid JSON ({reason} at line {line}, column {column})",
                                 where=where, reason=exc.msg, line=exc.lineno, column=exc.colno)) from None
    except RecursionError:  # unreachable after check_depth; kept so no input can give a traceback
        raise UserError(T_("{where}: nested too deeply", where=where)) from None
    if found:
        path, why = _path_of(value, found[0]), found[0].why
        raise UserError(lambda lang: f"{where}: {path + ': ' if path else ''}{why.render(lang)}")
    return value


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """parse_json of a file ('-' is stdin)."""
    return parse_json(read_text(path, max_bytes), "stdin" if str(path) == "-" else str(path), max_bytes)


# ---- JSON values -> validated models ------------------------------------------------------------

def validate(model: type[M], data: Any, where: str) -> M:
    """Validate JSON values (from parse_json) as `model` in strict JSON mode: integers must be JSON
    integers (no true, no 4.0, no "4"), booleans JSON booleans, enums their string values."""
    try:
        return model.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        whole = _WHOLE.get(model.__name__, model.__name__)
        raise UserError(lambda lang, e=exc: f"{where}: {one_line(e, whole, lang)}") from None
    except (ValueError, TypeError, ArithmeticError) as exc:  # a validator's own check
        raise UserError(lambda lang, e=exc: f"{where}: {error_message(e, lang)}") from None


_WHOLE = {"Scenario": "scenario", "MeasurementRecord": "record", "RecommendRequest": "request"}


def require(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    """`value` if it is a `kind` (bool never counts as int or float); ValueError naming `name`."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        got = excerpt(value)

        def words(lang: Lang) -> str:
            want = [translate(_KIND_NAMES[k], lang) if k in _KIND_NAMES else k.__name__ for k in kinds]
            while len(want) > 1:  # "an integer or a finite number"
                want[-2:] = [translate(N_("{first} or {second}"), lang, first=want[-2], second=want[-1])]
            return translate(N_("{name} must be {want}, got {value}"), lang, name=name, want=want[0], value=got)

        raise UserError(words)
    return value


_KIND_NAMES = {int: N_("an integer"), float: N_("a finite number"), bool: N_("true or false"), str: N_("a string"),
               dict: N_("a JSON object"), list: N_("a JSON list"), type(None): "null"}

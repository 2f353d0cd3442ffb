"""The message catalogues: extract the marked strings from the code into locales/zh/LC_MESSAGES/*.po.

    python scripts/i18n.py update   # add new ids (empty translation), drop removed ones, keep the rest
    python scripts/i18n.py check    # what is missing, empty, stale or fuzzy (exit 1 if anything)
    python scripts/i18n.py stats    # ids and translated ids per domain
    python scripts/i18n.py todo     # the untranslated ids as JSON {id: ""}, to fill in and hand to `fill`
    python scripts/i18n.py fill FILE.json   # set translations from {id: translation} (each id in any domain)

Marked strings: the first argument of `_(...)` (ui/language.py), `N_(...)` and `T_(...)` (calc/i18n.py),
which must be a string literal; and in YAML data files the keys YAML_KEYS names for them. Which file belongs to
which domain is calc.contract.i18n.DOMAINS. The .po files are written by Babel in the standard gettext format,
so a translator can open them in Poedit or any other gettext tool.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calc.contract.i18n import CATALOGUE_LANG, DOMAINS, LOCALES_DIR  # noqa: E402
from calc.contract.presets import load_yaml  # noqa: E402

MARKERS = frozenset({"_", "N_", "T_"})
# YAML data file (glob) -> the keys whose values are English the app shows.
YAML_KEYS: dict[str, tuple[str, ...]] = {
    "data/claims.yaml": ("gist", "reason"),  # the Explain page's claims
    "presets/clusters/*.yaml": ("name",),  # "8x A100 80GB (one DGX/HGX A100 node)"
}


HEADER = """\
# vramcalc: Simplified Chinese messages, domain {domain}. Written by `python scripts/i18n.py update`
# (ids from the code); translate with any gettext tool, following locales/glossary.yaml.
#"""


class MarkError(ValueError):
    """A marker called with something other than a string literal (an f-string, a variable)."""


def _marker_name(call: ast.Call) -> str | None:
    fn = call.func
    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
    return name if name in MARKERS else None


def python_messages(path: Path) -> Iterator[tuple[str, int]]:
    """(msgid, line) for every marked string in a Python file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _marker_name(node) and node.args:
            arg = node.args[0]
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                raise MarkError(f"{path.relative_to(ROOT)}:{node.lineno}: {_marker_name(node)}() needs a "
                                "string literal (put numbers in {named} fields)")
            yield arg.value, node.lineno


def yaml_messages(path: Path) -> Iterator[tuple[str, int]]:
    """(msgid, 0) for the YAML_KEYS values of a YAML mapping or list of mappings."""
    rel = path.relative_to(ROOT)
    keys = next((k for pattern, k in YAML_KEYS.items() if rel.match(pattern)), ())
    data = load_yaml(path.read_text(encoding="utf-8"))
    for item in data if isinstance(data, list) else [data]:
        for key in keys:
            value = item.get(key) if isinstance(item, dict) else None
            if isinstance(value, str) and value:
                yield value, 0


def _matches(domain: str) -> list[Path]:
    files: list[Path] = []
    for pattern in DOMAINS[domain]:
        files.extend(p for p in sorted(ROOT.glob(pattern)) if p.is_file() and p not in files)
    return files


def domain_files(domain: str) -> list[Path]:
    """The files of `domain`: those its globs match and no earlier domain's do."""
    taken: set[Path] = set()
    for name in DOMAINS:
        files = [p for p in _matches(name) if p not in taken]
        if name == domain:
            return files
        taken.update(files)
    raise KeyError(domain)


def extract(domain: str) -> dict[str, list[tuple[str, int]]]:
    """msgid -> its locations, in the order they appear."""
    found: dict[str, list[tuple[str, int]]] = {}
    for path in domain_files(domain):
        reader = yaml_messages if path.suffix in (".yaml", ".yml") else python_messages
        for msgid, line in reader(path):
            found.setdefault(msgid, []).append((str(path.relative_to(ROOT)), line))
    return found


def po_path(domain: str) -> Path:
    return LOCALES_DIR / CATALOGUE_LANG / "LC_MESSAGES" / f"{domain}.po"


def read_catalogue(domain: str) -> Catalog:
    path = po_path(domain)
    if not path.exists():
        return Catalog(locale=CATALOGUE_LANG, domain=domain)
    with path.open("rb") as fh:
        return read_po(fh, locale=CATALOGUE_LANG, domain=domain)


def known_translations() -> dict[str, str]:
    """Every translated id in any domain (a sentence moved between domains keeps its translation)."""
    known: dict[str, str] = {}
    for domain in DOMAINS:
        for m in read_catalogue(domain):
            if m.id and m.string:
                known.setdefault(str(m.id), str(m.string))
    return known


def update() -> None:
    known = known_translations()
    for domain in DOMAINS:
        old = read_catalogue(domain)
        new = Catalog(locale=CATALOGUE_LANG, domain=domain, project="vramcalc", version="1",
                      copyright_holder="vramcalc", fuzzy=False, header_comment=HEADER.replace("{domain}", domain),
                      last_translator="vramcalc", language_team="Simplified Chinese",
                      # the old file's dates: an update that changes no message changes no byte
                      creation_date=old.creation_date, revision_date=old.revision_date)
        for msgid, locations in extract(domain).items():
            previous = old.get(msgid)
            string = previous.string if previous is not None and previous.string else known.get(msgid, "")
            flags = ("python-brace-format",) if "{" in msgid else ()
            new.add(msgid, string, locations=locations, flags=flags,
                    auto_comments=previous.auto_comments if previous is not None else ())
        path = po_path(domain)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            write_po(fh, new, width=100, omit_header=False, sort_output=False, ignore_obsolete=True)


def problems() -> list[str]:
    """One line per missing, empty, fuzzy or stale catalogue entry."""
    out: list[str] = []
    for domain in DOMAINS:
        wanted = extract(domain)
        cat = read_catalogue(domain)
        have = {str(m.id): m for m in cat if m.id}
        for msgid, locations in wanted.items():
            where = f"{locations[0][0]}:{locations[0][1]}"
            m = have.get(msgid)
            if m is None:
                out.append(f"{domain}: missing from the catalogue ({where}): {msgid[:60]!r}")
            elif not m.string:
                out.append(f"{domain}: no translation ({where}): {msgid[:60]!r}")
            elif m.fuzzy:
                out.append(f"{domain}: fuzzy translation ({where}): {msgid[:60]!r}")
        out.extend(f"{domain}: stale id no longer in the code: {msgid[:60]!r}"
                   for msgid in have if msgid not in wanted)
    return out


def untranslated() -> dict[str, str]:
    """Every id of the code without a translation, mapped to "" (the `todo` command's JSON)."""
    update()
    return {str(m.id): "" for domain in DOMAINS for m in read_catalogue(domain) if m.id and not m.string}


def fill(path: Path) -> int:
    """Write the translations of a {id: translation} JSON file into whichever catalogues hold those ids."""
    wanted = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if v}
    update()
    placed: set[str] = set()
    for domain in DOMAINS:
        cat = read_catalogue(domain)
        changed = False
        for m in cat:
            if m.id and str(m.id) in wanted:
                m.string, m.flags = wanted[str(m.id)], m.flags - {"fuzzy"}
                placed.add(str(m.id))
                changed = True
        if changed:
            with po_path(domain).open("wb") as fh:
                write_po(fh, cat, width=100, omit_header=False, sort_output=False, ignore_obsolete=True)
    for msgid in sorted(set(wanted) - placed):
        print(f"not in any catalogue: {msgid[:60]!r}")
    return 1 if set(wanted) - placed else 0


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "todo":
        print(json.dumps(untranslated(), ensure_ascii=False, indent=1))
        return 0
    if command == "fill" and len(argv) == 2:
        return fill(Path(argv[1]))
    if command == "update":
        update()
        return 0
    if command == "stats":
        for domain in DOMAINS:
            cat = read_catalogue(domain)
            ids = [m for m in cat if m.id]
            print(f"{domain:12s} {sum(1 for m in ids if m.string):5d} / {len(ids):5d} translated")
        return 0
    if command == "check":
        found = problems()
        print("\n".join(found) if found else "catalogues complete")
        return 1 if found else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Writing the files a command produces (`export -o DIR`, `export-deepspeed -o FILE`, `calibrate -o FILE`, and the
records `python -m measure ... -o FILE` appends): the one way every command writes, so that none of them can be led
to write somewhere else.

The rules, and why:
- never through a symbolic link: a link planted where the output goes (the folder, a folder above it, or a file in
  it, dangling or not) would send the text, and launch.sh's executable bit, to whatever it points at. The message
  names the link and the real path to give instead.
- never over a file without `--force`: every file the command would replace is named first, and nothing is written.
- all or nothing per file: the text goes to a new temporary file in the same folder (O_CREAT | O_EXCL | O_NOFOLLOW,
  so it is ours), which then replaces the name at once (os.replace replaces a name, never follows it). A reader of
  the folder sees the old file or the new one, never half of one. The mode is given when the file is created (the
  umask applies, as for any new file): no chmod of a path that could have changed hands.
- a record file grows by whole lines (`append_line`): opened with O_APPEND | O_NOFOLLOW, never through a link either.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

from calc.contract.errors import UserError
from calc.contract.output import for_terminal

__all__ = ["append_line", "check_no_link", "write_file", "write_files"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def write_files(folder: str, files: Mapping[str, str | bytes], executable: frozenset[str] = frozenset(),
                force: bool = False, create_folder: bool = True) -> list[str]:
    """Write {name: text (as UTF-8) or bytes (e.g. a zip)} into `folder` (created if missing when `create_folder`),
    the names in `executable` with mode 0o755 (before the umask), the others 0o644; the paths written, in order.
    UserError, before anything is written, when a symlink is on the way or a file would be replaced without
    `force`."""
    check_no_link(folder)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise UserError(f"{_shown(folder)} exists and is not a folder")
    existing = [name for name in files if _existing(folder, name)]
    if existing and not force:
        raise UserError(f"{_shown(folder)} already holds {', '.join(map(_shown, existing))}: give --force to replace "
                        f"{'it' if len(existing) == 1 else 'them'}")
    try:
        if create_folder:
            os.makedirs(folder, exist_ok=True)
        check_no_link(folder)  # again: nothing may have appeared on the way while the folders were made
        return [_replace(folder, name, text, 0o777 if name in executable else 0o666) for name, text in files.items()]
    except OSError as exc:
        raise UserError(f"cannot write {_shown(folder)}: {exc.strerror or exc.__class__.__name__}") from None


def write_file(path: str, text: str | bytes, force: bool = False) -> str:
    """Write one file (its folder must exist), by write_files' rules."""
    folder, name = os.path.split(path)
    if not name:
        raise UserError(f"cannot write {_shown(path)}: a file name is needed, not a folder")
    return write_files(folder or os.curdir, {name: text}, force=force, create_folder=False)[0]


def append_line(path: str, line: str) -> None:
    """Add `line` and a line break to the file (created if missing), by write_files' rule on links."""
    folder = os.path.dirname(path) or os.curdir
    check_no_link(folder)
    if os.path.islink(path):
        raise UserError(f"{_shown(path)} is a symbolic link: remove it first (a file is never written through a link)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "ab") as fh:
            fh.write((line + "\n").encode("utf-8"))
    except OSError as exc:
        raise UserError(f"cannot write {_shown(path)}: {exc.strerror or exc.__class__.__name__}") from None


def check_no_link(path: str) -> None:
    """UserError when `path` or a folder above it is a symbolic link (the parts that do not exist yet are made by
    write_files itself)."""
    absolute = os.path.abspath(path)
    head, parts = absolute, []
    while True:
        head, tail = os.path.split(head)
        if not tail:
            break
        parts.append(tail)
    current = head
    for part in reversed(parts):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise UserError(f"{_shown(current)} is a symbolic link: files are written only where the path says; give "
                            f"the real path, {_shown(os.path.realpath(absolute))}")
        if not os.path.lexists(current):
            return


def _existing(folder: str, name: str) -> bool:
    """Whether `name` exists in `folder` as a regular file; UserError for a link or anything else that is not one."""
    if os.sep in name or (os.altsep and os.altsep in name) or name in ("", os.curdir, os.pardir):
        raise ValueError(f"not a file name: {name!r}")  # the names come from the code, never from a user
    path = os.path.join(folder, name)
    if os.path.islink(path):
        raise UserError(f"{_shown(path)} is a symbolic link: remove it first (a file is never written through a link)")
    if not os.path.lexists(path):
        return False
    if not os.path.isfile(path):
        raise UserError(f"{_shown(path)} exists and is not a regular file")
    return True


def _replace(folder: str, name: str, text: str | bytes, mode: int) -> str:
    """Write `text` to a new temporary file beside `name`, then rename it over `name`."""
    path = os.path.join(folder, name)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, _CREATE, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)  # UTF-8 under any locale
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    return path


def _shown(path: str) -> str:
    return for_terminal(path, limit=200)

"""Paths the OS cannot take, found before any work (issue 23: exit 2, never exit 3 after the run).

Linux limits a file name to NAME_MAX bytes (255) and a path to PATH_MAX (4096). A report is
written through a temporary beside it (`.NAME.XXXXXXXX`, report.write_atomic), so its name must
leave room for that prefix and suffix too.
"""

from __future__ import annotations

import os

NAME_MAX = 255
PATH_MAX = 4096
# write_atomic's temporary: "." + name + "." + mkstemp's 8 random characters
TEMP_EXTRA = len("." + "." + "XXXXXXXX")


def _limits(path: str) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system holding `path`'s nearest existing folder."""
    folder = os.path.dirname(os.path.abspath(path)) or "/"
    while folder != "/" and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return NAME_MAX, PATH_MAX


def path_problem(text: str, temporary: bool = False) -> str | None:
    """Why `text` cannot name a file here, or None; `temporary`: it is written through a
    temporary beside it, whose name is TEMP_EXTRA bytes longer."""
    if not text:
        return "it is empty"
    if "\0" in text:
        return "it contains a NUL byte"
    name_max, path_max = _limits(text)
    try:
        full = os.fsencode(os.path.abspath(os.path.expanduser(text)))
    except (UnicodeError, FileNotFoundError):  # abspath of a relative path in a deleted cwd
        full = os.fsencode(text)
    if len(full) >= path_max:
        return f"it is {len(full)} bytes long, over the system's limit of {path_max - 1}"
    for part in full.split(b"/"):
        if len(part) > name_max:
            return (f"a name in it is {len(part)} bytes long, over the system's limit of "
                    f"{name_max}")
    last = full.rstrip(b"/").rsplit(b"/", 1)[-1]
    if temporary and len(last) + TEMP_EXTRA > name_max:
        return (f"its name is {len(last)} bytes long; objdebug writes it through a temporary "
                f"{TEMP_EXTRA} bytes longer, over the system's limit of {name_max} (keep it to "
                f"{name_max - TEMP_EXTRA})")
    return None

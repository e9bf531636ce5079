"""Where a finding points in the user's files: a config key's line, a data row's line.

A finding's `location` ({"file", "line"}) is optional; CI serializers (GitHub annotations, GitLab
Code Quality) attach it to the file and line so the finding shows up beside that line. Found by
scanning the TOML text, because tomllib keeps no line numbers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\s*(#.*)?$")


def config_key(source: str, dotted: str) -> dict[str, Any] | None:
    """The line of `section.key` in the config file `source` (also under [tool.objdebug.section]);
    the section header's line when the key is not written there (e.g. set with --set); None when
    the config is not a readable file."""
    path = Path(source)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    section, key = dotted.rsplit(".", 1)
    wanted = {section, f"tool.objdebug.{section}"}
    current, header_line = None, None
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for number, text in enumerate(lines, start=1):
        m = _HEADER.match(text)
        if m and not text.lstrip().startswith("[["):
            current = m.group(1).replace(" ", "").replace('"', "")
            if current in wanted and header_line is None:
                header_line = number
            continue
        if current in wanted and key_re.match(text):
            return {"file": str(path), "line": number}
    return {"file": str(path), "line": header_line} if header_line else {"file": str(path)}


def data_row(path: str | None, line: int | None) -> dict[str, Any] | None:
    """A data file's row (JSONL line, 1-based)."""
    if not path:
        return None
    return {"file": str(path), **({"line": int(line)} if line else {})}


# --------------------------------------------------------------------------- MindSpore error texts
_FRAME = re.compile(r"^# \d+ In file (?P<file>.+?):(?P<line>\d+)", re.M)
_OURS = (str(Path(__file__).resolve().parents[1]),)  # objdebug's own wrapper Cells


def user_frame(text: str) -> tuple[str, int] | None:
    """The deepest frame of MindSpore's 'Traceback of Net Construct Code' that is the user's code."""
    found = None
    for m in _FRAME.finditer(text):
        path = m.group("file")
        if "site-packages/mindspore" in path or "/mindspore/" in path:
            continue
        if path.startswith(_OURS) and (Path(path).parent.name == "engine"
                                       or Path(path).name == "contract.py"):
            continue
        found = (path, int(m.group("line")))
    return found


def location(text: str) -> str | None:
    """'file:line' of the user's code in a MindSpore error text, if it names one."""
    where = user_frame(text)
    return f"{where[0]}:{where[1]}" if where else None

"""What killed runs left behind, removed by later runs (issue 23).

SIGKILL (or the OOM killer) gives a run no chance to clean up: its scratch folder
(`$TMPDIR/objdebug-XXXXXXXX`, with a 133 MB kernel-meta dump in it) and a report's temporary
(`.r.xml.XXXXXXXX` beside the report) stayed for ever. Now each scratch folder holds the pid of
the process that made it (OWNER); a later run removes the scratch folders whose owner is no longer
alive, and, before writing a report, that report's temporaries older than this process. Only
names objdebug makes are touched: `objdebug-` + mkdtemp's 8 characters (or `objdebug-msrun-` + 8),
with an OWNER file naming a dead process.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

OWNER = ".objdebug-owner"
_SCRATCH = re.compile(r"^objdebug-(msrun-)?[a-z0-9_]{8}$")
STARTED = time.time()  # imported at the start of a run: "older than the run"


def mark(folder: str) -> None:
    """Record this process as the folder's owner."""
    Path(folder, OWNER).write_text(f"{os.getpid()}\n", encoding="utf-8")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_scratch(tmpdir: str | None = None) -> list[str]:
    """Remove scratch folders of dead objdebug processes in $TMPDIR; returns what was removed."""
    removed = []
    root = Path(tmpdir or tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for p in entries:
        if not _SCRATCH.match(p.name) or p.is_symlink() or not p.is_dir():
            continue
        try:
            pid = int((p / OWNER).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue  # not provably ours and dead: left alone
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
    return removed


def clean_report_temporaries(path: Path) -> None:
    """Remove `.NAME.XXXXXXXX` beside `path` left by a run older than this one."""
    pattern = re.compile(r"^\." + re.escape(path.name) + r"\.[A-Za-z0-9_]{8}$")
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return
    for p in siblings:
        try:
            if pattern.match(p.name) and p.is_file() and not p.is_symlink() \
                    and p.stat().st_mtime < STARTED:
                p.unlink()
        except OSError:
            pass

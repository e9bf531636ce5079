"""Serializers: one module per output format, all from a RunResult (or its saved JSON)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def report_stages(report: dict) -> list[str]:
    """The report's stages in run order, then any stage only its results name (e.g. baseline)."""
    stages = list(report.get("stages", []))
    for r in report.get("results", []):
        if r["stage"] not in stages:
            stages.append(r["stage"])
    return stages


def summary_counts(s: dict) -> str:
    """'3 pass, 1 warn, 0 fail, 0 error, 2 skipped' (+ ', 1 note' when there are INFO findings)."""
    text = (f"{s.get('PASS', 0)} pass, {s.get('WARN', 0)} warn, {s.get('FAIL', 0)} fail, "
            f"{s.get('ERROR', 0)} error, {s.get('SKIP', 0)} skipped")
    notes = s.get("INFO", 0)
    return text + (f", {notes} note{'s' if notes != 1 else ''}" if notes else "")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; reports are shared artefacts
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

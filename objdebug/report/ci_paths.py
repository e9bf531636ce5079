"""Paths as a CI system wants them: relative to the checked-out repository when inside it."""

from __future__ import annotations

import os
from pathlib import Path


def repo_relative(path: str, root: str | None = None) -> str:
    """`path` relative to `root` (default: $GITHUB_WORKSPACE, $CI_PROJECT_DIR, else the working
    directory) when it lies inside it; unchanged otherwise. Forward slashes, as CI UIs expect."""
    root = root or os.environ.get("GITHUB_WORKSPACE") or os.environ.get("CI_PROJECT_DIR") or os.getcwd()
    try:
        rel = Path(path).resolve().relative_to(Path(root).resolve())
    except (ValueError, OSError):
        return Path(path).as_posix()
    return rel.as_posix()


def finding_location(report: dict, finding: dict) -> dict:
    """The finding's own location, else the target's config file (no line): every CI finding needs
    a file, and the config is what a user edits to act on it."""
    loc = dict(finding.get("location") or {})
    if not loc.get("file"):
        source = report.get("config", {}).get("source") or ""
        loc = {"file": source} if source and not source.startswith("<") else {}
    return loc

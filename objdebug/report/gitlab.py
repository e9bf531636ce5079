"""GitLab Code Quality report (the JSON GitLab shows in merge requests).

One issue per WARN/FAIL/ERROR/INFO finding: description, check_name, fingerprint, severity,
location.path and location.lines.begin. GitLab compares fingerprints between the base and the
merge request to show new and fixed issues, so a fingerprint hashes what identifies a finding —
code, stage, check, condition and file — never its measured numbers, which change run to run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from objdebug.report import write_atomic
from objdebug.report.ci_paths import finding_location, repo_relative

DEFAULT_PATH = "gl-code-quality-report.json"
# GitLab's severities: info, minor, major, critical, blocker
SEVERITY = {"FAIL": "critical", "ERROR": "major", "WARN": "minor", "INFO": "info"}


def issues(report: dict[str, Any], root: str | None = None) -> list[dict[str, Any]]:
    out = []
    for r in report.get("results", []):
        for f in r.get("findings", []):
            severity = SEVERITY.get(f["verdict"])
            if severity is None:
                continue
            loc = finding_location(report, f)
            path = repo_relative(loc["file"], root) if loc.get("file") else "objdebug.toml"
            ident = "\0".join([f["code"], r["stage"], r["check"], f.get("condition", ""), path])
            out.append({
                "description": f"{f['code']} {f['verdict']} [{r['stage']}/{r['check']}] {f['message']}"
                               + (f" — fix: {f['fix']}" if f.get("fix") else ""),
                "check_name": f["code"],
                "fingerprint": hashlib.sha256(ident.encode("utf-8")).hexdigest(),
                "severity": severity,
                "location": {"path": path, "lines": {"begin": int(loc.get("line") or 1)}},
            })
    return out


def dumps(report: dict[str, Any], root: str | None = None) -> str:
    return json.dumps(issues(report, root), indent=2, ensure_ascii=False) + "\n"


def write(report: dict[str, Any], path: str, root: str | None = None) -> None:
    write_atomic(path, dumps(report, root))

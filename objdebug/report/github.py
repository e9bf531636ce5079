"""GitHub Actions: workflow-command annotations and the job summary.

Each FAIL or ERROR finding becomes an `::error`, each WARN a `::warning` and each INFO (a note,
never a failure) a `::notice`, with `file=`/`line=` where the finding has a location. GitHub reads
these lines from the step's stdout. The Markdown report is appended to $GITHUB_STEP_SUMMARY.
Escaping follows GitHub's runner (toolkit `command.ts`): %, CR and LF in the message; also : and ,
in properties.
"""

from __future__ import annotations

import os
from typing import Any

from objdebug.report.ci_paths import finding_location, repo_relative

LEVELS = {"FAIL": "error", "ERROR": "error", "WARN": "warning", "INFO": "notice"}
SUMMARY_LIMIT = 1024 * 1024  # GitHub refuses a step summary over 1 MiB


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(report: dict[str, Any], result: dict[str, Any], finding: dict[str, Any]) -> str | None:
    """One workflow command line for a finding, or None for PASS/SKIP."""
    level = LEVELS.get(finding["verdict"])
    if level is None:
        return None
    props = {}
    loc = finding_location(report, finding)
    if loc.get("file"):
        props["file"] = repo_relative(loc["file"])
        if loc.get("line"):
            props["line"] = str(loc["line"])
    props["title"] = finding["code"]
    message = (f"{finding['verdict']} [{result['stage']}/{result['check']}] {finding['message']}"
               + (f"\nfix: {finding['fix']}" if finding.get("fix") else ""))
    head = ",".join(f"{k}={escape_property(v)}" for k, v in props.items())
    return f"::{level} {head}::{escape_data(message)}"


def annotations(report: dict[str, Any]) -> list[str]:
    lines = [annotation(report, r, f) for r in report.get("results", []) for f in r.get("findings", [])]
    return [line for line in lines if line]


def summary(report: dict[str, Any]) -> str:
    """The Markdown report without figures (a job summary cannot show local PNGs), within 1 MiB."""
    from objdebug.report import markdown

    text = markdown.render(report, figures=[])
    data = text.encode("utf-8")
    if len(data) > SUMMARY_LIMIT:
        note = "\n\n_(truncated: GitHub's step summary holds 1 MiB; see the JSON or HTML report)_\n"
        text = data[:SUMMARY_LIMIT - len(note.encode()) - 4].decode("utf-8", errors="ignore") + note
    return text


def append_summary(report: dict[str, Any], path: str | None = None) -> str | None:
    """Append the summary to `path` (default $GITHUB_STEP_SUMMARY); returns the path, or None."""
    path = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as fh:  # appended: other steps write there too
        fh.write(summary(report))
    return path

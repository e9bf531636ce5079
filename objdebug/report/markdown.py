"""A Markdown report (DIR/report.md) with its figures as PNG files beside it (DIR/fig-NAME.png),
for merge-request comments and artifact browsers. Built from a report dict only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from objdebug.report import (TOP_LISTS, compile_cache_line, findings_with, model_state_line, report_stages, summary_counts,
                             write_atomic)
from objdebug.report.figures import Drawn, draw_all
from objdebug.report.contract_table import HEADERS as CONTRACT_HEADERS, contract_tables

FILE_NAME = "report.md"


def _text(s: str) -> str:
    """User text: nothing that looks like an HTML tag may render as one."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", s)


def _cell(x: Any) -> str:
    if x is None:
        return ""
    text = f"{x:.4g}" if isinstance(x, float) else _text(str(x))
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def figure_file(d: Drawn) -> str:
    return f"fig-{d.name}.png"


def render(report: dict[str, Any], figures: list[Drawn] | None = None) -> str:
    figures = draw_all(report) if figures is None else figures
    passed = bool(report.get("passed"))
    s = report.get("summary", {})
    target = report.get("target", {})
    cfg = report.get("config", {})
    stages = report_stages(report)

    def figs(stage: str) -> list[str]:
        out = []
        for d in figures:
            if d.stage != stage:
                continue
            out += ([f"![{d.title}]({figure_file(d)})", ""] if d.png is not None
                    else [f"_Figure “{d.title}” not drawn: {d.skipped}_", ""])
        return out

    lines = [f"# objdebug report: {'PASSED' if passed else 'FAILED'}", ""]
    lines.append(f"- target: `{cfg.get('source', '')}` ({target.get('form', '')}: objective "
                 f"`{target.get('objective', '')}`" + (f", model `{target.get('model')}`" if target.get("model") else "")
                 + ")")
    lines.append(f"- profile: **{report.get('profile', {}).get('name', '')}** · device {report.get('device')} · "
                 f"mode {report.get('mode')} · seed {report.get('seed')} · created {report.get('created')}")
    if model_state_line(report):
        lines.append(f"- {model_state_line(report)}")
    lines.append(f"- result: {summary_counts(s)} · exit code {report.get('exit_code')}"
                 + (" · strict" if report.get("strict") else ""))
    lines.append("")
    lines += figs("summary")

    for heading, _, verdicts in TOP_LISTS:  # what failed the gate first, then the notes
        listed = findings_with(report, verdicts)
        if listed:
            lines += [f"## {heading}", ""]
            for r, f in listed:
                lines.append(f"- **{f['verdict']} {f['code']}** [{r['stage']}/{r['check']}] {_text(f['message'])}")
                if f.get("fix"):
                    lines.append(f"  - fix: {_text(f['fix'])}")
            lines.append("")

    for stage in stages:
        results = [r for r in report.get("results", []) if r["stage"] == stage]
        lines += [f"## {stage}", ""]
        comp = report.get("compiles", {}).get("by_stage", {}).get(stage)
        if stage in report.get("timings", {}) or comp:
            bits = []
            if stage in report.get("timings", {}):
                bits.append(f"{report['timings'][stage]} s")
            if comp:
                bits.append(f"{comp.get('count', 0)} graph compiles ({_cell(float(comp.get('seconds', 0)))} s)")
            lines += [f"_{' · '.join(bits)}_", ""]
        rows = [[f["code"], r["check"], f["verdict"], f.get("value"), f["message"]]
                for r in results for f in r.get("findings", [])]
        lines += _table(["code", "check", "verdict", "value", "message"], rows) if rows \
            else ["_No findings._"]
        lines.append("")
        for table in contract_tables(report, stage):  # OBJ210: one row's labels at a glance
            lines += [f"**{_text(table['title'])}**", ""] + _table(CONTRACT_HEADERS, table["rows"]) + [""]
        for r in results:
            if r.get("error"):
                lines += [f"<details><summary>{r['check']}: exception</summary>", "", "```",
                          r["error"], "```", "</details>", ""]
        lines += figs(stage)

    lines += ["## Configuration and versions", ""]
    lines += _table(["package", "version"], [[k, v] for k, v in report.get("versions", {}).items()])
    lines.append("")
    lines += _table(["timing", "seconds"], [[k, v] for k, v in report.get("timings", {}).items()])
    lines.append("")
    comp = report.get("compiles", {})
    held = f", {comp['holds_model']} holding the model" if "holds_model" in comp else ""
    lines.append(f"{comp.get('count', 0)} graph compiles{held}, {comp.get('seconds', 0)} s.")
    if compile_cache_line(report):
        lines.append(f"{_text(compile_cache_line(report))}.")
    lines.append("")
    if comp.get("by_check"):
        lines += _table(["check", "compiles", "seconds", "graphs used"],
                        [[k, v.get("count", 0), v.get("seconds", 0), ", ".join(v.get("uses", []))]
                         for k, v in comp["by_check"].items()])
        lines.append("")
    for title, obj in (("Profile", report.get("profile", {})), ("Config", cfg),
                       ("Options", report.get("options") or None),
                       ("Baseline", report.get("extra", {}).get("baseline"))):
        if obj:
            lines += [f"<details><summary>{title}</summary>", "", "```json",
                      json.dumps(obj, indent=2), "```", "</details>", ""]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], directory: str | Path, figures: list[Drawn] | None = None) -> str:
    """Write DIR/report.md and its figure PNGs; returns the Markdown path."""
    figures = draw_all(report) if figures is None else figures
    directory = Path(directory)
    for d in figures:
        if d.png is not None:
            write_atomic(directory / figure_file(d), d.png)
    path = directory / FILE_NAME
    write_atomic(path, render(report, figures))
    return str(path)

"""A self-contained HTML report: one file, figures inlined as base64 PNG data URIs, no scripts,
no external links — it opens offline from a CI artifact. Built from a report dict only, so
`objdebug render RESULT.json --html DIR` gives the same bytes as the run that wrote the JSON.
"""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path
from typing import Any

from objdebug.core.findings import Verdict
from objdebug.report import (TOP_LISTS, compile_cache_line, findings_with, model_state_line, report_stages, summary_counts,
                             write_atomic)
from objdebug.report.figures import Drawn, draw_all
from objdebug.report import batch_rows
from objdebug.report.contract_table import HEADERS as CONTRACT_HEADERS, contract_tables

FILE_NAME = "index.html"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;
 padding:1em 2em;color:#212121;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f5f5f5}
.badge{display:inline-block;padding:.15em .6em;border-radius:.3em;color:#fff;font-weight:600}
.PASS{background:#2e7d32}.WARN{background:#f9a825;color:#212121}.FAIL{background:#c62828}
.ERROR{background:#6a1b9a}.INFO{background:#1565c0}.SKIP{background:#78909c}
.fix{color:#37474f;font-size:.9em}.muted{color:#757575;font-size:.9em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#424242}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
nav a{margin-right:1em}
""" + batch_rows.CSS


def _badge(verdict: str, text: str | None = None) -> str:
    return f'<span class="badge {escape(verdict)}">{escape(text or verdict)}</span>'


def _fmt(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escape before)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _kv(items: dict[str, Any]) -> str:
    return _table(["key", "value"], [[escape(str(k)), escape(_fmt(v))] for k, v in items.items()])


def _figure_html(d: Drawn) -> str:
    if d.png is None:
        return (f'<p class="muted" id="fig-{escape(d.name)}">Figure “{escape(d.title)}” not drawn: '
                f"{escape(d.skipped or '')}</p>")
    data = base64.b64encode(d.png).decode("ascii")
    return (f'<figure id="fig-{escape(d.name)}"><img alt="{escape(d.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{escape(d.title)}</figcaption></figure>')


def _findings_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for res in results:
        for f in res.get("findings", []):
            msg = escape(f["message"])
            if f.get("fix"):
                msg += f'<div class="fix">fix: {escape(f["fix"])}</div>'
            rows.append([escape(f["code"]), escape(res["check"]), _badge(f["verdict"]),
                         escape(_fmt(f.get("value"))), msg])
    if not rows:
        return '<p class="muted">No findings (every finding of this stage was deselected).</p>'
    return _table(["code", "check", "verdict", "value", "message"], rows)


def _errors(results: list[dict[str, Any]]) -> str:
    out = []
    for res in results:
        if res.get("error"):
            out.append(f"<details><summary>{escape(res['check'])}: exception</summary>"
                       f"<pre>{escape(res['error'])}</pre></details>")
    return "".join(out)


def _stage_verdict(results: list[dict[str, Any]]) -> str:
    verdicts = [Verdict(f["verdict"]) for r in results for f in r.get("findings", [])]
    return max(verdicts, key=lambda v: (v.rank, v is Verdict.INFO)).value if verdicts else "SKIP"


def render(report: dict[str, Any], figures: list[Drawn] | None = None) -> str:
    """The report as one HTML document."""
    figures = draw_all(report) if figures is None else figures
    passed = bool(report.get("passed"))
    s = report.get("summary", {})
    target = report.get("target", {})
    cfg = report.get("config", {})
    stages = report_stages(report)

    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>objdebug report: {'PASSED' if passed else 'FAILED'}</title>"
             f"<style>{_CSS}</style></head><body>"]
    parts.append(f"<h1>objdebug report {_badge('PASS' if passed else 'FAIL', 'PASSED' if passed else 'FAILED')}</h1>")
    parts.append(f"<p>target <code>{escape(str(cfg.get('source', '')))}</code> · "
                 f"{escape(str(target.get('form', '')))}: objective <code>{escape(str(target.get('objective', '')))}</code>"
                 + (f", model <code>{escape(str(target.get('model')))}</code>" if target.get("model") else "")
                 + f"<br>profile <b>{escape(str(report.get('profile', {}).get('name', '')))}</b> · device "
                 f"{escape(str(report.get('device', '')))} · mode {escape(str(report.get('mode', '')))} · seed "
                 f"{escape(str(report.get('seed', '')))} · created {escape(str(report.get('created', '')))}</p>")
    if model_state_line(report):
        parts.append(f"<p>{escape(model_state_line(report))}</p>")
    parts.append(f"<p>{summary_counts(s)} · exit code "
                 f"{escape(str(report.get('exit_code')))}"
                 + (" · strict (warnings fail)" if report.get("strict") else "") + "</p>")
    nav = "".join(f'<a href="#stage-{escape(st)}">{escape(st)}</a>' for st in stages)
    parts.append(f'<nav>{nav}<a href="#configuration">configuration</a></nav>')
    for d in figures:
        if d.stage == "summary":
            parts.append(_figure_html(d))

    # what did not pass first: the reader of a failed gate wants the reasons at the top; then notes
    for heading, anchor, verdicts in TOP_LISTS:
        listed = findings_with(report, verdicts)
        if listed:
            parts.append(f"<h2 id=\"{anchor}\">{heading}</h2><ul>")
            for r, f in listed:
                parts.append(f"<li>{_badge(f['verdict'])} <b>{escape(f['code'])}</b> "
                             f"[{escape(r['stage'])}/{escape(r['check'])}] {escape(f['message'])}"
                             + (f"<div class=\"fix\">fix: {escape(f['fix'])}</div>" if f.get("fix") else "")
                             + "</li>")
            parts.append("</ul>")

    for stage in stages:
        results = [r for r in report.get("results", []) if r["stage"] == stage]
        seconds = report.get("timings", {}).get(stage)
        comp = report.get("compiles", {}).get("by_stage", {}).get(stage, {})
        parts.append(f"<h2 id=\"stage-{escape(stage)}\">{escape(stage)} {_badge(_stage_verdict(results))}</h2>")
        meta = []
        if seconds is not None:
            meta.append(f"{_fmt(seconds)} s")
        if comp:
            meta.append(f"{comp.get('count', 0)} graph compiles ({_fmt(comp.get('seconds', 0.0))} s)")
        if meta:
            parts.append(f"<p class=\"muted\">{escape(' · '.join(meta))}</p>")
        parts.append(_findings_table(results))
        for table in contract_tables(report, stage):  # OBJ210: one row's labels at a glance
            parts.append(f"<h3>{escape(table['title'])}</h3>"
                         + _table(CONTRACT_HEADERS, [[escape(str(c)) for c in row] for row in table["rows"]]))
        if stage == "batches":  # the pipeline's rows token by token, as `objdebug batches --show`
            parts += [batch_rows.html(view) for view in batch_rows.views(report)]
        parts.append(_errors(results))
        for d in figures:
            if d.stage == stage:
                parts.append(_figure_html(d))

    parts.append("<h2 id=\"configuration\">Configuration and versions</h2>")
    parts.append("<h3>Versions</h3>" + _kv(report.get("versions", {})))
    parts.append("<h3>Timings (s)</h3>" + _kv(report.get("timings", {})))
    comp = report.get("compiles", {})
    cache = compile_cache_line(report)
    held = f" ({comp['holds_model']} holding the model)" if "holds_model" in comp else ""
    parts.append(f"<h3>Graph compiles</h3><p>{comp.get('count', 0)} compiles{held}, "
                 f"{_fmt(comp.get('seconds', 0.0))} s"
                 + (f"; {escape(cache)}" if cache else "") + "</p>"
                 + _table(["stage", "count", "seconds"],
                          [[escape(k), escape(_fmt(v.get("count"))), escape(_fmt(v.get("seconds")))]
                           for k, v in comp.get("by_stage", {}).items()])
                 + (_table(["check", "compiles", "seconds", "graphs used"],
                           [[escape(k), escape(_fmt(v.get("count", 0))), escape(_fmt(v.get("seconds", 0.0))),
                             escape(", ".join(v.get("uses", [])))]
                            for k, v in comp["by_check"].items()]) if comp.get("by_check") else ""))
    parts.append("<h3>Target</h3>" + _kv(target))
    parts.append("<h3>Profile</h3><pre>" + escape(json.dumps(report.get("profile", {}), indent=2)) + "</pre>")
    parts.append("<h3>Config</h3><pre>" + escape(json.dumps(cfg, indent=2)) + "</pre>")
    if report.get("options"):
        parts.append("<h3>Options</h3><pre>" + escape(json.dumps(report["options"], indent=2)) + "</pre>")
    if report.get("extra", {}).get("baseline"):
        parts.append("<h3>Baseline</h3>" + _kv(report["extra"]["baseline"]))
    parts.append(f"<p class=\"muted\">objdebug {escape(str(report.get('versions', {}).get('objdebug', '')))} · "
                 f"re-render with <code>objdebug render RESULT.json --html DIR</code></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(report: dict[str, Any], directory: str | Path, figures: list[Drawn] | None = None) -> str:
    """Write DIR/index.html atomically; returns its path."""
    path = Path(directory) / FILE_NAME
    write_atomic(path, render(report, figures))
    return str(path)

"""Terminal report: a summary table, then the details of whatever did not pass."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from objdebug.report import compile_cache_line, model_state_line, summary_counts
from objdebug.report.contract_table import HEADERS as CONTRACT_HEADERS, contract_tables

_COLOURS = {"PASS": "32", "INFO": "34", "WARN": "33", "FAIL": "31", "ERROR": "35", "SKIP": "36"}


def _v(verdict: str, colour: bool, text: str | None = None) -> str:
    text = verdict if text is None else text
    return f"\033[{_COLOURS[verdict]}m{text}\033[0m" if colour else text


def _num(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _memory_text(report: dict[str, Any]) -> str:
    """'peak RSS 2.1 GiB (own processes 3.2 GiB)' from the report's extra.memory, or ''."""
    mem = report.get("extra", {}).get("memory")
    if not isinstance(mem, dict) or not isinstance(mem.get("peak_rss_bytes"), int) or not mem["peak_rss_bytes"]:
        return ""
    own = mem.get("isolated_peak_rss_bytes")
    return (f"peak RSS {mem['peak_rss_bytes'] / 2 ** 30:.2f} GiB"
            + (f" (own processes {own / 2 ** 30:.2f} GiB)" if isinstance(own, int) and own else ""))


def render(report: dict[str, Any], colour: bool = False, verbose: bool = False) -> str:
    """Render a report dict (see json_report.to_dict) as text."""
    lines = []
    cfg = report["config"]
    target = report.get("target", {})
    comp = report.get("compiles", {})
    lines.append(f"objdebug {report['versions'].get('objdebug', '')} · target {cfg.get('source')}")
    lines.append(f"  {target.get('form', '')}: objective {target.get('objective')}"
                 + (f", model {target.get('model')}" if target.get("model") else "")
                 + f" · device {report['device']} · mode {report['mode']} · seed {report['seed']}"
                 + f" · profile {report['profile']['name']}")
    cache = compile_cache_line(report, short=True)
    lines.append(f"  {comp.get('count', 0)} graph compiles, {comp.get('holds_model', 0)} holding the model "
                 f"({comp.get('seconds', 0):.1f} s) · "
                 + (f"{cache} · " if cache else "")
                 + (f"{memory} · " if (memory := _memory_text(report)) else "")
                 + f"total {report['timings'].get('total', 0):.1f} s")
    if model_state_line(report):
        lines.append(f"  {model_state_line(report)}")
    for note in target.get("notes", []):  # how the model is called (objdebug/engine/model_inputs.py)
        lines.append(f"  note: {note}")
    rows = []
    for res in report["results"]:
        for f in res["findings"]:
            rows.append([res["stage"], res["check"], f["code"], _v(f["verdict"], colour), _num(f["value"])])
    lines.append("")
    lines.append(tabulate(rows, headers=["stage", "check", "code", "verdict", "value"], tablefmt="simple")
                 if rows else "(no findings)")
    details = [(res, f) for res in report["results"] for f in res["findings"]
               if verbose or f["verdict"] not in ("PASS",)]
    if details:
        lines.append("")
        for res, f in details:
            lines.append(f"{_v(f['verdict'], colour)} {f['code']} [{res['stage']}/{res['check']}] {f['message']}")
            if f.get("fix"):
                lines.append(f"    fix: {f['fix']}")
            if f["verdict"] == "ERROR" and res.get("error") and verbose:
                lines.append("    " + res["error"].replace("\n", "\n    "))
    for table in contract_tables(report):  # OBJ210: shown when coverage did not pass, or -v
        if verbose or table["failing"]:
            lines += ["", table["title"], tabulate(table["rows"], headers=CONTRACT_HEADERS, tablefmt="simple")]
    lines.append("")
    lines.append(final_line(report, colour))
    return "\n".join(lines) + "\n"


def final_line(report: dict[str, Any], colour: bool = False) -> str:
    """'PASSED: 9 pass, 0 warn, ... (exit 0)': the whole output under --quiet."""
    status = "PASSED" if report["passed"] else "FAILED"
    return (f"{_v('PASS' if report['passed'] else 'FAIL', colour, status)}"
            f": {summary_counts(report['summary'])} (exit {report['exit_code']})")

"""The monitor's JSONL log: the schema, reading a log back (`load_log`: a malformed line is an
InputError naming its number) and rendering it (`report`, `render_report`: `objdebug monitor-log`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from objdebug.core import jsonsafe
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.core.jsonsafe import number
from objdebug.monitor.judge import judge_log
from objdebug.rules import get_rule

SCHEMA = "objdebug.monitor/1"


def _num(x: Any) -> float:
    """A logged number back to float (jsonsafe.number); anything else is a ValueError."""
    value = number(x)
    if value is None:
        raise ValueError(repr(x))
    return value


def load_log(path: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """(header, step records, end record or None); a malformed line is an InputError with its number."""
    try:
        fh = open(path, "rb")  # bytes: a line that is not UTF-8 is named by its number
    except FileNotFoundError:
        raise InputError("monitor log not found", source=path) from None
    except OSError as exc:  # a folder, no permission, ...
        raise InputError(f"cannot read the monitor log: {exc.strerror or exc}", source=path) from None
    header, records, end = None, [], None
    with fh:
        for lineno, raw in _lines(fh, path):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", source=path,
                                 line=lineno) from None
            if not line.strip():
                continue
            try:
                obj = jsonsafe.loads(line)
            except json.JSONDecodeError as exc:
                if lineno == 1 and is_run_report(path):
                    raise InputError("this is an objdebug run report (--json), not a training-monitor "
                                     "log; render it with `objdebug render FILE`", source=path) from None
                if header is not None and not raw.endswith(b"\n") and not fh.read(1):
                    # the last line, cut: a crashed or killed training run leaves a readable log
                    header = {**header, "cut_line": lineno}
                    break
                raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", source=path,
                                 line=lineno) from None
            if not isinstance(obj, dict):
                raise InputError(f"each line must be a JSON object, but got {type(obj).__name__}",
                                 source=path, line=lineno)
            kind = obj.get("type")
            if header is None:
                if kind != "header" or obj.get("schema") != SCHEMA:
                    raise InputError(f"the first line must be a monitor header with schema '{SCHEMA}', "
                                     f"but got type {kind!r}, schema {obj.get('schema')!r}",
                                     source=path, line=lineno)
                if not isinstance(obj.get("components", []), list) \
                        or not isinstance(obj.get("thresholds", {}), dict):
                    raise InputError("header fields 'components' (a list) and 'thresholds' (an object) "
                                     "are malformed", source=path, line=lineno)
                for key, value in obj.get("thresholds", {}).items():  # judged as numbers later
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        raise InputError(f"header threshold '{key}' must be a number, but got "
                                         f"{value!r}", source=path, line=lineno)
                header = obj
            elif kind == "step":
                records.append(_parse_step(obj, path, lineno, header))
            elif kind == "end":
                if not _finding_list(obj.get("findings", [])):
                    raise InputError("end record field 'findings' must be a list of objects",
                                     source=path, line=lineno)
                end = obj
            else:
                raise InputError(f"field 'type' must be 'step' or 'end', but got {kind!r}",
                                 source=path, line=lineno)
    if header is None:
        raise InputError("the monitor log is empty", source=path)
    return header, records, end


def is_run_report(path: str) -> bool:
    """True when the whole file is an objdebug JSON run report (what --json writes)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = jsonsafe.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("tool") == "objdebug" and "schema_version" in data


def _lines(fh: Any, path: str):
    """(number, bytes) per line; a read error (e.g. EIO) is an InputError."""
    lineno = 0
    try:
        for lineno, raw in enumerate(fh, 1):
            yield lineno, raw
    except OSError as exc:
        raise InputError(f"cannot read the monitor log: {exc.strerror or exc}", source=path,
                         line=lineno + 1) from None


def _finding_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(f, dict) for f in x)


def _parse_step(obj: dict[str, Any], path: str, lineno: int, header: dict[str, Any]) -> dict[str, Any]:
    try:
        rec = {"step": int(obj["step"]), "loss": _num(obj["loss"]), "findings": obj.get("findings", [])}
        if not _finding_list(rec["findings"]):
            raise ValueError("'findings' must be a list of objects")
        comps = obj.get("components")
        if comps is not None:
            rec["components"] = {str(k): _num(v) for k, v in comps.items()}
        g = obj.get("grad")
        if g is not None:
            rec["grad"] = {**g, **{k: _num(g[k]) for k in ("global_norm", "mean_norm", "max_norm",
                                                            "max_mean_ratio")},
                           "max_param": str(g["max_param"]),
                           "nonfinite": int(g["nonfinite"]), "zero_params": [str(x) for x in g["zero_params"]],
                           "nonfinite_params": [str(x) for x in g.get("nonfinite_params", [])],
                           "n_params": int(g["n_params"])}
    except KeyError as exc:
        raise InputError(f"step record is missing field {exc.args[0]!r}", source=path, line=lineno) from None
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # "step": Infinity / 1e400
        raise InputError(f"step record has a malformed value: {exc}", source=path, line=lineno) from None
    return rec


def report(path: str) -> dict[str, Any]:
    """Re-judge a monitor log: {header, records, end, findings, recorded_failures, exit_code}."""
    header, records, end = load_log(path)
    findings = judge_log(header, records)
    recorded = [f for r in records for f in r["findings"] if f.get("verdict") == "FAIL"]
    if end:
        recorded += [f for f in end.get("findings", []) if f.get("verdict") == "FAIL"]
    failed = bool(recorded) or any(f.verdict is Verdict.FAIL for f in findings)
    return {"header": header, "records": records, "end": end, "findings": findings,
            "recorded_failures": recorded, "exit_code": 1 if failed else 0}


def render_report(rep: dict[str, Any], colour: bool = False) -> str:
    """Terminal rendering of `report(path)`: run summary, components, gradients, findings."""
    from tabulate import tabulate

    from objdebug.report.terminal import _v

    h, recs, end = rep["header"], rep["records"], rep["end"]
    lines = [f"objdebug monitor log · {h.get('source', '')} · created {h.get('created', '')} · "
             f"{len(recs)} steps · gradients every {h.get('every')} steps"
             + (f" · stopped: {end.get('reason')}" if end and end.get("stopped") else "")
             + ("" if end else " · no end record (run interrupted?)")
             + (f" · line {h['cut_line']} cut (not read)" if h.get("cut_line") else "")]
    rows = []
    for name in ["loss"] + list(h.get("components", [])):
        vals = np.array([r["loss"] if name == "loss" else r.get("components", {}).get(name, np.nan)
                         for r in recs], dtype=np.float64)
        if len(vals) == 0 or np.all(np.isnan(vals)):
            continue
        with np.errstate(all="ignore"):
            rows.append([name, f"{vals[0]:.4g}", f"{vals[-1]:.4g}", f"{np.nanmean(vals):.4g}",
                         f"{np.nanmin(vals):.4g}", f"{np.nanmax(vals):.4g}", int(np.sum(vals == 0.0))])
    lines += ["", tabulate(rows, headers=["series", "first", "last", "mean", "min", "max", "zero steps"],
                           tablefmt="simple") if rows else "(no steps recorded)"]
    grads = [r for r in recs if r.get("grad")]
    if grads:
        g_rows = [[r["step"], f"{r['grad']['global_norm']:.4g}", f"{r['grad']['max_mean_ratio']:.3g}",
                   r["grad"]["max_param"], r["grad"]["nonfinite"], len(r["grad"]["zero_params"])]
                  for r in grads[-8:]]
        lines += ["", tabulate(g_rows, headers=["step", "grad norm", "max/mean", "max at", "NaN/Inf",
                                                "zero params"], tablefmt="simple")]
    f_rows = [[f.code, _v(f.verdict.value, colour), "" if f.value is None else f"{f.value:.4g}",
               get_rule(f.code).name] for f in rep["findings"]]
    lines += ["", tabulate(f_rows, headers=["code", "verdict", "value", "rule"], tablefmt="simple"), ""]
    for f in rep["findings"]:
        if f.verdict is not Verdict.PASS:
            lines.append(f"{_v(f.verdict.value, colour)} {f.code} {f.message}")
            if f.fix:
                lines.append(f"    fix: {f.fix}")
    n_fail = sum(f.verdict is Verdict.FAIL for f in rep["findings"])
    status = "FAILED" if rep["exit_code"] else "PASSED"
    lines.append(f"{_v('FAIL' if rep['exit_code'] else 'PASS', colour, status)}: {n_fail} failing rule(s), "
                 f"{len(rep['recorded_failures'])} failure event(s) recorded (exit {rep['exit_code']})")
    return "\n".join(lines) + "\n"

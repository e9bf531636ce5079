"""Terminal report, as pytest and ruff print theirs: one line of counts per stage, then every FAIL /
WARN / ERROR and every note (INFO) in full, then the verdict line. Passes and skips are counted,
not listed (a run has some 60 findings); `verbose` (`-v`) adds the table of every finding and
details each one, passes and skip reasons included."""

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
    versions = report["versions"]
    # the MindSpore that ran it: users do not choose it (their Ascend image and MindFormers release do)
    ms = f" · MindSpore {versions['mindspore']}" if versions.get("mindspore") else ""
    lines.append(f"objdebug {versions.get('objdebug', '')}{ms} · target {cfg.get('source')}")
    lines.append(f"  {target.get('form', '')}: objective {target.get('objective')}"
                 + (f", model {target.get('model')}" if target.get("model") else "")
                 + f" · device {report['device']} · mode {report['mode']} · seed {report['seed']}"
                 + f" · profile {report['profile']['name']}")
    cache = compile_cache_line(report, short=True)
    held = f", {comp['holds_model']} holding the model" if "holds_model" in comp else ""  # older reports lack it
    lines.append(f"  {comp.get('count', 0)} graph compiles{held} ({comp.get('seconds', 0):.1f} s) · "
                 + (f"{cache} · " if cache else "")
                 + (f"{memory} · " if (memory := _memory_text(report)) else "")
                 + f"total {report['timings'].get('total', 0):.1f} s")
    if (c := report.get("extra", {}).get("compile_cache")) and c.get("status") == "unavailable" and c.get("reason"):
        lines.append(f"  compile cache unavailable: {c['reason']}")  # said once, in one line (issue 54)
    if model_state_line(report):
        lines.append(f"  {model_state_line(report)}")
    for note in target.get("notes", []):  # how the model is called (objdebug/engine/model_inputs.py)
        lines.append(f"  note: {note}")
    lines.append("")
    rows = [[res["stage"], res["check"], f["code"], _v(f["verdict"], colour), _num(f["value"])]
            for res in report["results"] for f in res["findings"]]
    if not rows:
        lines.append("(no findings)")
    elif verbose:  # every finding, one row each
        lines.append(tabulate(rows, headers=["stage", "check", "code", "verdict", "value"], tablefmt="simple"))
    else:
        lines += stage_counts(report, colour)
    details = [(res, f) for res in report["results"] for f in res["findings"]
               if verbose or f["verdict"] in SHOWN]
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
    if not verbose and (unlisted := _unlisted(report)):
        lines += ["", f"{unlisted} not listed; -v lists every finding (skip reasons included)"]
    if verbose and (times := time_profile_lines((report.get("extra") or {}).get("time_profile"))):
        lines += [""] + times  # where the run's time went (pipeline/time_profile.py)
    lines.append("")
    lines.append(final_line(report, colour))
    return "\n".join(lines) + "\n"


def time_profile_lines(profile: dict[str, Any] | None) -> list[str]:
    """A run's time profile (`extra.time_profile`) as a table: per step (load, contract probe,
    each stage, model state) its wall and the compiles, graph calls and host work in it."""
    steps = (profile or {}).get("steps") or {}
    if not steps:
        return []
    lines = ["time (s)        wall  compile    calls     host"]
    for name, e in steps.items():
        lines.append(f"  {name:<12}{e['wall']:>6.2f} {e['compile']:>8.2f} {e['calls']:>8.2f} {e['host']:>8.2f}")
    if "total" in profile:
        lines.append(f"  {'total':<12}{profile['total']:>6.2f} {profile['compile']:>8.2f} "
                     f"{profile['calls']:>8.2f} {profile['host']:>8.2f}  (outside the steps: {profile['other']:.2f})")
    return lines


# shown in full by default; the others are only counted per stage (`-v` shows them)
SHOWN = ("FAIL", "WARN", "ERROR", "INFO")
# a stage's counts, in summary_counts' order and words
_WORDS = (("PASS", "pass"), ("WARN", "warn"), ("FAIL", "fail"), ("ERROR", "error"), ("SKIP", "skipped"),
          ("INFO", "note"))


def stage_counts(report: dict[str, Any], colour: bool = False) -> list[str]:
    """One line per stage in run order: 'align      5 pass, 1 warn, 2 skipped' (verdicts it had)."""
    counts: dict[str, dict[str, int]] = {}
    for res in report["results"]:
        for f in res["findings"]:
            per = counts.setdefault(res["stage"], {})
            per[f["verdict"]] = per.get(f["verdict"], 0) + 1
    stages = list(counts)  # the results' order: the run's (the model state first)
    width = max((len(s) for s in stages), default=0)
    lines = []
    for stage in stages:
        parts = [_v(v, colour, f"{n} {word}" + ("s" if v == "INFO" and n != 1 else ""))
                 for v, word in _WORDS if (n := counts[stage].get(v, 0))]
        lines.append(f"{stage.ljust(width)}  {', '.join(parts)}")
    return lines


def _unlisted(report: dict[str, Any]) -> str:
    """'52 passes and 3 skips' (what the default output only counts), or ''."""
    verdicts = [f["verdict"] for res in report["results"] for f in res["findings"]]
    n_pass, n_skip = verdicts.count("PASS"), verdicts.count("SKIP")
    parts = ([f"{n_pass} pass{'es' if n_pass != 1 else ''}"] if n_pass else []) \
        + ([f"{n_skip} skip{'s' if n_skip != 1 else ''}"] if n_skip else [])
    return " and ".join(parts)


def final_line(report: dict[str, Any], colour: bool = False) -> str:
    """'PASSED: 9 pass, 0 warn, ... (exit 0)': the whole output under --quiet."""
    status = "PASSED" if report["passed"] else "FAILED"
    return (f"{_v('PASS' if report['passed'] else 'FAIL', colour, status)}"
            f": {summary_counts(report['summary'])} (exit {report['exit_code']})")

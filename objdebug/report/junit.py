"""JUnit XML: one <testsuite> per stage, one <testcase> per finding, for CI test dashboards.

FAIL -> <failure> with the finding's message and fix advice; ERROR -> <error> with the check's
exception; SKIP -> <skipped>; INFO (a note) -> a passing test with its text in <system-out>; WARN -> <failure type="WARN"> (or <skipped> with
`warnings_as_skipped`, for dashboards where only a red test should mean a failed gate).
Built from a report dict (json_report.to_dict / json_report.load), so a saved result re-renders
identically.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from objdebug.report import write_atomic


def _stage_order(report: dict[str, Any]) -> list[str]:
    order = list(report.get("stages", []))
    for res in report.get("results", []):
        if res["stage"] not in order:
            order.append(res["stage"])  # e.g. "baseline"
    return order


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _properties(report: dict[str, Any]) -> ET.Element:
    props = ET.Element("properties")
    versions = report.get("versions", {})
    target = report.get("target", {})
    for name, value in (("objdebug", versions.get("objdebug")), ("mindspore", versions.get("mindspore")),
                        ("python", versions.get("python")), ("config", report.get("config", {}).get("source")),
                        ("objective", target.get("objective")), ("model", target.get("model")),
                        ("profile", report.get("profile", {}).get("name")), ("device", report.get("device")),
                        ("mode", report.get("mode")), ("seed", report.get("seed"))):
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_text(value))
    return props


def _testcase(res: dict[str, Any], f: dict[str, Any], seconds: float,
              warnings_as_skipped: bool) -> tuple[ET.Element, str]:
    name = f"{f['code']} {f['condition']}" if f.get("condition") else f["code"]
    case = ET.Element("testcase", classname=f"objdebug.{res['stage']}.{res['check']}", name=name,
                      time=f"{seconds:.3f}")
    verdict, message = f["verdict"], f["message"]
    body = message + (f"\nfix: {f['fix']}" if f.get("fix") else "") + f"\nrule: objdebug explain {f['code']}"
    if f.get("value") is not None:
        body += f"\nvalue: {f['value']}"
    kind = "pass"
    if verdict == "FAIL" or (verdict == "WARN" and not warnings_as_skipped):
        el = ET.SubElement(case, "failure", message=message, type=verdict)
        el.text = body
        kind = "failure"
    elif verdict == "ERROR":
        el = ET.SubElement(case, "error", message=message, type="ERROR")
        el.text = body + ("\n\n" + res["error"] if res.get("error") else "")
        kind = "error"
    elif verdict in ("SKIP", "WARN"):
        ET.SubElement(case, "skipped", message=f"{verdict}: {message}")
        kind = "skipped"
    else:  # PASS, and INFO: a note never fails the suite; its text and fix go to system-out
        out = ET.SubElement(case, "system-out")
        out.text = body if verdict == "INFO" else message
    return case, kind


def to_element(report: dict[str, Any], warnings_as_skipped: bool = False) -> ET.Element:
    root = ET.Element("testsuites", name="objdebug")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    for stage in _stage_order(report):
        results = [r for r in report.get("results", []) if r["stage"] == stage]
        suite = ET.SubElement(root, "testsuite", name=f"objdebug.{stage}",
                              timestamp=_text(report.get("created")))
        suite.append(_properties(report))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        suite_time = 0.0
        for res in results:
            findings = res.get("findings", [])
            # a check's time is shared by its findings, so suite times add up to the check times
            per = float(res.get("seconds") or 0.0) / max(len(findings), 1)
            suite_time += float(res.get("seconds") or 0.0)
            for f in findings:
                case, kind = _testcase(res, f, per, warnings_as_skipped)
                suite.append(case)
                counts["tests"] += 1
                if kind == "failure":
                    counts["failures"] += 1
                elif kind == "error":
                    counts["errors"] += 1
                elif kind == "skipped":
                    counts["skipped"] += 1
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        suite.set("time", f"{suite_time:.3f}")
        total_time += suite_time
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{total_time:.3f}")
    return root


def dumps(report: dict[str, Any], warnings_as_skipped: bool = False) -> str:
    root = to_element(report, warnings_as_skipped)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write(report: dict[str, Any], path: str, warnings_as_skipped: bool = False) -> None:
    write_atomic(path, dumps(report, warnings_as_skipped))

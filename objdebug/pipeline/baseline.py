"""Compare a run with an earlier JSON report and turn regressions into findings (codes OBJ0xx).

A CI job keeps the last release's report and gates on it (`objdebug run --baseline OLD.json`):

- OBJ001: a finding's key number (`value`) moved the bad way by more than the tolerance. Which way
  is bad comes from each rule's `baseline:` front matter (objdebug/rules/OBJxxx.md), unless the
  profile's `[baseline.directions]` names a prefix of the code (the longest such prefix wins).
- OBJ002: a finding's verdict got worse (PASS < WARN < FAIL < ERROR).
- OBJ003: the two reports are not fully comparable (other target, profile, stages, or findings
  that disappeared).

The comparison works on report dicts (json_report.to_dict / json_report.load), so it needs no
MindSpore and is the same for a live run and a saved one. The result is one CheckResult with stage
"baseline", appended to the RunResult so that it counts for the exit code.
"""

from __future__ import annotations

import math
from typing import Any

from objdebug.core.errors import InputError
from objdebug.core.findings import CheckResult, Finding, Verdict
from objdebug.core.jsonsafe import number
from objdebug.pipeline.profile import load_profile
from objdebug.rules import DIRECTIONS, all_rules

STAGE = "baseline"
CHECK = "baseline-compare"


def _rank(verdict: Any) -> int:
    """A saved verdict's severity; an unknown string counts as a pass (nothing to regress from)."""
    try:
        return Verdict(verdict).rank
    except ValueError:
        return 0


def load(path: str) -> dict[str, Any]:
    """An earlier JSON report, checked enough to compare with; InputError names the file."""
    from objdebug.report import json_report

    data = json_report.load(path)
    results = data.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) and isinstance(r.get("findings"), list)
                                                for r in results):
        raise InputError("For '--baseline', the report must have a 'results' list of checks with "
                         "'findings', but it does not", source=path)
    problem = _shape_problem(data)  # what the comparison reads: exit 2 now, not exit 3 after the run
    if problem:
        raise InputError(f"For '--baseline', {problem}", source=path)
    data.setdefault("_source", str(path))
    return data


def _shape_problem(data: dict[str, Any]) -> str | None:
    from objdebug.report.json_report import _VERDICTS

    for key in ("config", "profile"):
        if key in data and not isinstance(data[key], dict):
            return f"'{key}' must be an object, but got {type(data[key]).__name__}"
    if "stages" in data and not isinstance(data["stages"], list):
        return f"'stages' must be a list, but got {type(data['stages']).__name__}"
    for i, res in enumerate(data["results"]):
        for j, f in enumerate(res["findings"]):
            where = f"results[{i}].findings[{j}]"
            if not isinstance(f, dict) or not isinstance(f.get("code"), str):
                return f"'{where}' must be an object with a string 'code'"
            if f.get("verdict") not in _VERDICTS:
                return f"'{where}.verdict' must be one of {list(_VERDICTS)}, but got {f.get('verdict')!r}"
    return None


def _longest(code: str, table: dict[str, Any]) -> Any:
    best = max((p for p in table if code.startswith(p)), key=len, default=None)
    return table[best] if best is not None else None


def direction(code: str, overrides: dict[str, Any] | None = None) -> tuple[str, float | None]:
    """(direction, per-code absolute tolerance or None) for a finding code: the profile's
    `[baseline.directions]` (longest prefix) over the rule's front matter; an unknown code: none."""
    entry = _longest(code, dict(overrides or {}))
    if entry is not None:
        return str(entry), None
    rule = all_rules().get(code)
    if rule is None:
        return "none", None
    return rule.baseline, rule.baseline_tolerance


def _worse_by(how: str, old: float, new: float) -> float:
    """How far `new` is worse than `old` (positive: worse)."""
    if how == "higher":
        return old - new
    if how == "lower":
        return new - old
    if how == "abs_higher":
        return abs(old) - abs(new)
    if how == "abs_lower":
        return abs(new) - abs(old)
    raise InputError(f"For '[baseline] directions', each direction must be in {list(DIRECTIONS)}, "
                     f"but got '{how}'.")


def _keyed(report: dict[str, Any]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """Findings by (stage, check, code, occurrence), leaving out earlier baseline comparisons."""
    out: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for res in report.get("results", []):
        if res.get("stage") == STAGE:
            continue
        seen: dict[str, int] = {}
        for f in res.get("findings", []):
            n = seen.get(f["code"], 0)
            seen[f["code"]] = n + 1
            out[(res.get("stage", ""), res.get("check", ""), f["code"], n)] = {**f, "_error": res.get("error")}
    return out


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs = []
    for label, get in (
        ("objective", lambda r: (r.get("config", {}).get("objective") or {}).get("factory")),
        ("model", lambda r: (r.get("config", {}).get("model") or {}).get("factory")),
        ("profile", lambda r: (r.get("profile") or {}).get("name")),
        ("stages", lambda r: r.get("stages")),
    ):
        a, b = get(old), get(new)
        if a != b:
            diffs.append(f"{label} {a!r} -> {b!r}")
    return diffs


def compare(new: dict[str, Any], old: dict[str, Any], settings: dict[str, Any] | None = None,
            error_fails: bool = True) -> CheckResult:
    """Judge report `new` against report `old`; one finding per regression (see module doc)."""
    # `settings`: the profile's [baseline] section, or single keys over default.toml's
    th = load_profile().section("baseline").replace(**dict(settings or {}))
    abs_tol = float(th["abs_tolerance"])
    rel_tol = float(th["rel_tolerance"])
    per_code_tol = dict(th["tolerances"])
    dir_overrides = dict(th["directions"])
    value_verdict = str(th["regression_verdict"]).upper()
    if value_verdict not in ("WARN", "FAIL"):
        raise InputError(f"For '[baseline] regression_verdict', the value must be in ['warn', 'fail'], "
                         f"but got {th['regression_verdict']!r}.")
    value_verdict = Verdict(value_verdict)

    result = CheckResult(stage=STAGE, check=CHECK)
    now, before = _keyed(new), _keyed(old)
    value_regs, verdict_regs, compared = [], [], 0
    for key, f in now.items():
        g = before.get(key)
        if g is None:
            continue
        stage, check, code, _ = key
        where = f"{code} [{stage}/{check}]"
        old_rank, new_rank = _rank(g.get("verdict")), _rank(f.get("verdict"))
        if new_rank > old_rank:
            verdict = Verdict(f["verdict"])
            if verdict == Verdict.ERROR:
                verdict = Verdict.FAIL if error_fails else Verdict.WARN
            verdict_regs.append({"key": where, "old": g["verdict"], "new": f["verdict"]})
            result.findings.append(_finding(
                "OBJ002", verdict, f"{where} {g['verdict']} -> {f['verdict']}: {f['message']}",
                where, float(new_rank - old_rank)))
            continue  # a worse verdict already says it; do not report the same number twice
        how, code_tol = direction(code, dir_overrides)
        a, b = number(g.get("value")), number(f.get("value"))
        if how == "none" or a is None or b is None or "SKIP" in (f["verdict"], g["verdict"]) \
                or "ERROR" in (f["verdict"], g["verdict"]) or not math.isfinite(a):
            continue
        compared += 1
        base_tol = _longest(code, per_code_tol)
        base_tol = float(base_tol) if base_tol is not None else (code_tol if code_tol is not None else abs_tol)
        tol = max(base_tol, rel_tol * abs(a))
        worse = math.inf if not math.isfinite(b) else _worse_by(how, a, b)
        if worse > tol:
            change = f"{(b - a) / abs(a):+.1%}" if a != 0 and math.isfinite(b) else f"{b - a:+.4g}"
            value_regs.append({"key": where, "old": a, "new": b, "worse_by": worse, "tolerance": tol})
            result.findings.append(_finding(
                "OBJ001", value_verdict,
                f"{where} value {a:.4g} -> {b:.4g} ({change}, {how.replace('_', ' ')} is better; "
                f"worse by {worse:.4g} > tolerance {tol:.4g} = max(abs {base_tol:g}, {rel_tol:.0%} of |old|))",
                where, worse))
    if not value_regs:
        result.findings.append(_finding(
            "OBJ001", Verdict.PASS, f"{compared} finding values compared with the baseline, none moved "
            f"the bad way beyond tolerance (abs {abs_tol:g}, rel {rel_tol:.0%})", "", 0.0))
    if not verdict_regs:
        n = len(set(now) & set(before))
        result.findings.append(_finding("OBJ002", Verdict.PASS,
                                        f"{n} findings matched, no verdict got worse", "", 0.0))
    diffs = _differences(old, new)
    gone = [f"{k[2]} [{k[0]}/{k[1]}]" for k in before if k not in now and k[0] in new.get("stages", [])]
    if gone:
        shown = ", ".join(gone[:8]) + (f", ... ({len(gone) - 8} more)" if len(gone) > 8 else "")
        diffs.append(f"{len(gone)} baseline findings missing now: {shown}")
    if diffs:
        result.findings.append(_finding("OBJ003", Verdict.WARN, "baseline not fully comparable: "
                                        + "; ".join(diffs), "", float(len(diffs))))
    else:
        result.findings.append(_finding("OBJ003", Verdict.PASS, "same objective, model, profile and "
                                        "stages as the baseline", "", 0.0))
    result.value = {"source": old.get("_source"), "baseline_created": old.get("created"),
                    "compared": compared, "value_regressions": value_regs,
                    "verdict_regressions": verdict_regs, "differences": diffs,
                    "abs_tolerance": abs_tol, "rel_tolerance": rel_tol}
    return result


def _finding(code: str, verdict: Verdict, message: str, condition: str, value: float | None) -> Finding:
    return Finding.of(code, verdict, message, check=CHECK, stage=STAGE, condition=condition, value=value)


def apply(result, old: dict[str, Any], *, select: list[str] | None = None,
          ignore: list[str] | None = None) -> CheckResult:
    """Compare a RunResult with baseline report `old`; append the comparison to it and return it.

    select/ignore are the command line's; the profile's and config's lists apply as in api.run.
    """
    import time

    from objdebug.pipeline.profile import code_selected
    from objdebug.report import json_report

    start = time.perf_counter()
    res = compare(json_report.to_dict(result), old, result.profile.section("baseline"),
                  error_fails=result.profile.error_fails)
    sel = list(result.profile.data.get("select", [])) + list(result.config.run.select) + list(select or [])
    ign = list(result.profile.data.get("ignore", [])) + list(result.config.run.ignore) + list(ignore or [])
    res.findings = [f for f in res.findings if code_selected(f.code, sel, ign)]
    res.seconds = time.perf_counter() - start
    result.results.append(res)
    result.extra["baseline"] = {"source": old.get("_source"), "created": old.get("created"),
                                "passed": old.get("passed")}
    return res

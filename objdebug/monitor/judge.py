"""The monitor's rules: thresholds from the profile's [monitor] section; one step judged live
(`judge_step`) and a whole log re-judged (`judge_log`) by the same functions, so live warnings and
`objdebug monitor-log` agree."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Finding, Verdict, band
from objdebug.rules import codes_of
from objdebug.core.settings import Settings

CODES = codes_of("monitor")  # the rules whose page names the monitor


class TrainingStopped(RuntimeError):
    """Raised by `TrainingMonitor.step` with `stop_on_fail=True` when a rule fails."""

    def __init__(self, finding: dict[str, Any]):
        self.finding = finding
        super().__init__(f"objdebug monitor stopped training: {finding['code']} {finding['message']}")


def monitor_thresholds(profile: str = "default", overrides: dict[str, Any] | None = None) -> Settings:
    """The profile's [monitor] section (its defaults: checks/default.toml), then explicit overrides."""
    from objdebug.pipeline.profile import load_profile

    return load_profile(profile).section("monitor").replace(**(overrides or {}))


def _f(code: str, verdict: Verdict, message: str, value: float | None = None) -> Finding:
    return Finding.of(code, verdict, message, check="monitor", stage="monitor", value=value)


def judge_step(rec: dict[str, Any], state: dict[str, Any], th: dict[str, Any]) -> list[Finding]:
    """Live rules on one step record; `state` carries zero-run lengths between steps."""
    out = []
    step = rec["step"]
    values = {"loss": rec["loss"], **rec.get("components", {})}
    bad = [f"{k}={v}" for k, v in values.items() if not math.isfinite(v)]
    if bad:
        out.append(_f("OBJ601", Verdict.FAIL, f"step {step}: non-finite loss ({', '.join(bad)})"))
    runs = state.setdefault("zero_run", {})
    for name, v in rec.get("components", {}).items():
        runs[name] = runs.get(name, 0) + 1 if v == 0.0 else 0
        if runs[name] == th["dead_steps"]:
            out.append(_f("OBJ301", Verdict.FAIL,
                          f"step {step}: component '{name}' has been exactly 0 for {runs[name]} "
                          f"consecutive steps: its condition never triggered, check the data path "
                          f"(fail at dead_steps = {th['dead_steps']})", float(runs[name])))
    g = rec.get("grad")
    if g:
        out += _judge_grad(step, g, th, live=True)
    return out


def _judge_grad(step: int, g: dict[str, Any], th: dict[str, Any], live: bool) -> list[Finding]:
    out = []
    if g["nonfinite"]:
        out.append(_f("OBJ602", Verdict.FAIL, f"step {step}: {g['nonfinite']} NaN/Inf gradient elements "
                      f"in {', '.join(g['nonfinite_params'][:5])}", float(g["nonfinite"])))
    r = g["max_mean_ratio"]
    verdict = band(r, pass_if=lambda a: a <= th["ratio_warn"], fail_if=lambda a: a > th["ratio_fail"])
    if verdict is not Verdict.PASS and math.isfinite(r):
        out.append(_f("OBJ603", verdict, f"step {step}: max/mean per-parameter gradient norm ({g.get('ratio_over', 'all')}) = {r:.4g} "
                      f"(max {g['max_norm']:.3g} at '{g['max_param']}', mean {g['mean_norm']:.3g}); "
                      f"warn > {th['ratio_warn']:g}, fail > {th['ratio_fail']:g}", r))
    if g["global_norm"] == 0.0 and not g["nonfinite"]:
        out.append(_f("OBJ604", Verdict.FAIL, f"step {step}: every gradient is exactly 0 "
                      f"({g['n_params']} parameters): nothing trains", 0.0))
    elif g["zero_params"]:
        shown = ", ".join(g["zero_params"][:5]) + (" ..." if len(g["zero_params"]) > 5 else "")
        out.append(_f("OBJ604", Verdict.WARN, f"step {step}: {len(g['zero_params'])} of {g['n_params']} "
                      f"parameters get an all-zero gradient (disconnected?): {shown}",
                      float(len(g["zero_params"]))))
    return out


def _worst(findings: list[Finding]) -> Finding:
    return max(findings, key=lambda f: (f.verdict.rank, f.value if f.value is not None
                                        and math.isfinite(f.value) else 0.0))


def judge_log(header: dict[str, Any], records: list[dict[str, Any]]) -> list[Finding]:
    """One finding per code over a whole log, by the same rules as the live monitor."""
    # a log written with fewer thresholds (an older objdebug) is judged with today's defaults
    th = monitor_thresholds(overrides=header.get("thresholds", {}))
    names = list(header.get("components", []))
    state: dict[str, Any] = {}
    events: dict[str, list[Finding]] = {c: [] for c in CODES}
    for rec in records:
        for f in judge_step(rec, state, th):
            events[f.code].append(f)
    n = len(records)
    grads = [r for r in records if r.get("grad")]
    out = []

    def summary(code: str, ok: str, skip: str | None = None) -> None:
        if events[code]:
            worst = _worst(events[code])
            more = f" ({len(events[code])} events; first: {events[code][0].message})" \
                if len(events[code]) > 1 else ""
            out.append(_f(code, worst.verdict, worst.message + more, worst.value))
        elif skip:
            out.append(_f(code, Verdict.SKIP, skip))
        else:
            out.append(_f(code, Verdict.PASS, ok))

    no_grad = "no gradient records in the log" if not grads else None
    summary("OBJ601", f"loss and {len(names)} component(s) finite on all {n} steps")
    summary("OBJ301", f"no component exactly 0 for {th['dead_steps']} consecutive steps over {n} steps",
            None if names else "no components logged")
    out.append(_judge_scale(records, names, th))
    summary("OBJ602", f"no NaN/Inf gradient element in {len(grads)} gradient records", no_grad)
    ratios = [g["grad"]["max_mean_ratio"] for g in grads if math.isfinite(g["grad"]["max_mean_ratio"])]
    summary("OBJ603", f"max/mean per-parameter gradient norm <= {th['ratio_warn']:g} in all "
            f"{len(grads)} gradient records (max {max(ratios, default=float('nan')):.3g})", no_grad)
    summary("OBJ604", f"no all-zero parameter gradient in {len(grads)} gradient records", no_grad)
    return out


def _judge_scale(records: list[dict[str, Any]], names: list[str], th: dict[str, Any]) -> Finding:
    if len(names) < 2:
        return _f("OBJ303", Verdict.SKIP, "fewer than two components logged")
    means = {}
    for name in names:
        vals = np.array([r["components"][name] for r in records if name in r.get("components", {})])
        vals = vals[np.isfinite(vals)]
        if len(vals) and np.any(vals != 0):
            means[name] = float(np.mean(np.abs(vals)))
    if len(means) < 2:
        return _f("OBJ303", Verdict.PASS, f"{len(means)} live component(s): no scale to compare")
    big, small = max(means, key=means.get), min(means, key=means.get)
    x = means[big] / means[small]
    verdict = band(x, pass_if=lambda a: a <= th["scale_warn"], fail_if=lambda a: a > th["scale_fail"])
    return _f("OBJ303", verdict, f"largest/smallest mean |component| over the run = {x:.4g} ('{big}' "
              f"{means[big]:.4g} vs '{small}' {means[small]:.4g}); warn > {th['scale_warn']:g}, "
              f"fail > {th['scale_fail']:g}", x)

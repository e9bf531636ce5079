"""Training-time monitor: loss components every step, gradient health every N steps, to JSONL.

Two ways in:

- `MonitorCallback(path, ...)` for `Model.train` (a `mindspore.train.Callback`).
- `TrainingMonitor(path, ...)` for functional loops: call `.step(loss, components, grads, params)`
  after each `value_and_grad` step.

The log is one JSON object per line: a header (schema, component names, thresholds), one record
per step, and an end record. Every record that breaks a rule carries its findings; the same
rules re-judge a whole log in `judge_log` (used by `objdebug monitor-log`), so live warnings and the
report agree. Codes: OBJ301 (dead component) and OBJ303 (scale imbalance) as in the decompose
stage, OBJ601-OBJ604 for non-finite loss, non-finite gradients, exploding max/mean ratio and
zero gradients.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from objdebug.errors import InputError
from objdebug.findings import Finding, Verdict, band
from objdebug.jsonsafe import encode, number
from objdebug.naming import layer_of
from objdebug.rules import codes_of, get_rule
from objdebug.settings import Settings

SCHEMA = "objdebug.monitor/1"
CODES = codes_of("monitor")  # the rules whose page names the monitor

log = logging.getLogger("objdebug.monitor")


class TrainingStopped(RuntimeError):
    """Raised by `TrainingMonitor.step` with `stop_on_fail=True` when a rule fails."""

    def __init__(self, finding: dict[str, Any]):
        self.finding = finding
        super().__init__(f"objdebug monitor stopped training: {finding['code']} {finding['message']}")


def monitor_thresholds(profile: str = "default", overrides: dict[str, Any] | None = None) -> Settings:
    """The profile's [monitor] section (its defaults: checks/default.toml), then explicit overrides."""
    from objdebug.profile import load_profile

    return load_profile(profile).section("monitor").replace(**(overrides or {}))


# --------------------------------------------------------------------------- measurement
def grad_stats(names: Sequence[str], grads: Sequence[Any], stats: dict[str, np.ndarray] | None = None
               ) -> dict[str, Any]:
    """Global norm, per-layer norms, NaN/Inf count, all-zero params, max/mean per-parameter norm
    (over weight matrices when there are two or more; over all parameters in `max_mean_ratio_all`).

    The per-parameter reductions are the grad stage's (`objdebug.engine.gradients.GradientStats`,
    in graph, float32), `stats` when the gradient graph computed them already; a parameter's norm
    is taken over its finite elements (NaN/Inf are counted apart), so the ratio is OBJ202's
    `max_mean_ratio` on the same gradients (over all parameters: `max_mean_ratio_all`)."""
    from objdebug.engine.gradients import max_mean_ratio, reduce_gradients

    names = list(names)
    if stats is None:
        stats = reduce_gradients(grads) if len(grads) else {
            k: np.zeros(0) for k in ("finite_sq", "nonfinite")}
    sq_all, bad_all = stats["finite_sq"], stats["nonfinite"]
    matrix = [len(getattr(g, "shape", np.shape(g))) >= 2 for g in grads]
    norms, layers_sq, zero, bad_params = [], {}, [], []
    for name, sq, n_bad in zip(names, sq_all, bad_all):
        sq, n_bad = float(sq), int(n_bad)
        if n_bad:
            bad_params.append(name)
        if sq == 0.0 and not n_bad:
            zero.append(name)
        norms.append(math.sqrt(sq))
        layers_sq[layer_of(name)] = layers_sq.get(layer_of(name), 0.0) + sq
    arr = np.array(norms) if norms else np.zeros(1)
    # The ratio is taken over weight matrices: biases and norm gains carry small gradients by
    # construction and would inflate max/mean on a healthy model (18 vs 7 on the demo model).
    pick = [i for i, m in enumerate(matrix) if m] if sum(matrix) >= 2 else list(range(len(arr)))
    ratio, imax, mean = max_mean_ratio(arr, pick)
    ratio_all = max_mean_ratio(arr)[0]
    return {"global_norm": math.sqrt(float(np.sum(arr ** 2))), "mean_norm": mean,
            "max_norm": float(arr[imax]), "max_param": names[imax] if names else "",
            "max_mean_ratio": ratio,
            "ratio_over": "matrices" if sum(matrix) >= 2 else "all",
            "max_mean_ratio_all": ratio_all,
            "nonfinite": int(sum(int(b) for b in bad_all)), "nonfinite_params": bad_params[:20],
            "zero_params": zero, "n_params": len(norms),
            "layers": {k: math.sqrt(v) for k, v in layers_sq.items()}}


def _num(x: Any) -> float:
    """A logged number back to float (jsonsafe.number); anything else is a ValueError."""
    value = number(x)
    if value is None:
        raise ValueError(repr(x))
    return value


def _scalar(x: Any) -> float:
    if hasattr(x, "asnumpy"):
        x = x.asnumpy()
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


# --------------------------------------------------------------------------- rules
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


# --------------------------------------------------------------------------- the monitor
class TrainingMonitor:
    """Record a training run to JSONL and judge it as it goes.

    Args:
        path (str): the JSONL file to write (truncated).
        components (Sequence[str]): names of the loss components after the total. Default: ().
        every (int): record gradient health every `every` steps (and at step 1). Default: profile.
        stop_on_fail (bool): `step` raises `TrainingStopped` after a failing rule. Default: False.
        profile (str): profile whose [monitor] section gives the thresholds. Default: "default".
        thresholds (dict): overrides of single thresholds. Default: None.
    """

    def __init__(self, path: str | os.PathLike, components: Sequence[str] = (), every: int | None = None,
                 stop_on_fail: bool = False, profile: str = "default",
                 thresholds: dict[str, Any] | None = None, source: str = "helper"):
        self.thresholds = monitor_thresholds(profile, thresholds)
        if every is not None:
            self.thresholds = self.thresholds.replace(every=every)
        every = self.thresholds["every"]
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"For 'TrainingMonitor', the 'every' must be a positive int, but got {every!r}.")
        self.path = str(path)
        self.components = [str(c) for c in components]
        self.every = every
        self.stop_on_fail = stop_on_fail
        self.steps = 0
        self.failures: list[dict[str, Any]] = []
        self.should_stop = False
        self.closed = False
        self.raise_on_stop = True  # the callback asks Model.train to stop instead
        self._state: dict[str, Any] = {}
        self._records: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()
        self._fh = open(self.path, "w", encoding="utf-8")
        from objdebug.engine.runtime import versions

        self._write({"type": "header", "schema": SCHEMA, "tool": "objdebug", "source": source,
                     "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     "components": self.components, "every": every, "stop_on_fail": stop_on_fail,
                     "thresholds": self.thresholds, "profile": profile,
                     "codes": {c: get_rule(c).name for c in CODES}, "versions": versions()})

    def due(self, step: int | None = None) -> bool:
        """Is gradient health recorded at this (1-based) step?"""
        step = self.steps + 1 if step is None else step
        return step == 1 or step % self.every == 0

    def step(self, loss: Any, components: Any = None, grads: Sequence[Any] | None = None,
             params: Sequence[Any] | None = None, step: int | None = None,
             stats: dict[str, np.ndarray] | None = None) -> list[dict[str, Any]]:
        """Record one training step; returns its findings (dicts). Gradients are read only when due.

        `components`: a sequence aligned with the names, a dict, or a Tensor of shape [K].
        `grads`/`params`: the gradient tuple of `value_and_grad` and the parameters it was taken for.
        `stats`: their per-parameter statistics when a gradient graph reduced them already
        (`objdebug.engine.gradients.stats_on_host`); else they are reduced here.
        """
        if self.closed:
            raise RuntimeError(f"For 'TrainingMonitor.step', the monitor of '{self.path}' is closed; "
                               f"call reopen() to append to it.")
        self.steps = self.steps + 1 if step is None else int(step)
        rec: dict[str, Any] = {"type": "step", "step": self.steps,
                               "time": round(time.perf_counter() - self._t0, 4), "loss": _scalar(loss)}
        if components is not None and self.components:
            rec["components"] = self._components(components)
        if grads is not None and self.due(self.steps):
            names = [getattr(p, "name", f"param{i}") for i, p in enumerate(params)] if params is not None \
                else [f"param{i}" for i in range(len(grads))]
            rec["grad"] = grad_stats(names, grads, stats)
        findings = [f.to_dict() for f in judge_step(rec, self._state, self.thresholds)]
        if findings:
            rec["findings"] = [{k: f[k] for k in ("code", "verdict", "message")} for f in findings]
        self._records.append(rec)
        self._write(rec)
        for f in findings:
            log.warning("%s %s %s", f["verdict"], f["code"], f["message"])
            if f["verdict"] == "FAIL":
                self.failures.append(f)
                if self.stop_on_fail:
                    self.should_stop = True
        if self.should_stop and self.raise_on_stop:
            self.close(reason=f"stop_on_fail: {self.failures[0]['code']}")
            raise TrainingStopped(self.failures[0])
        return findings

    def _components(self, components: Any) -> dict[str, float]:
        if isinstance(components, dict):
            return {str(k): _scalar(v) for k, v in components.items()}
        if hasattr(components, "asnumpy"):
            components = components.asnumpy()
        if isinstance(components, np.ndarray):
            components = list(components.reshape(-1))
        values = [_scalar(c) for c in components]
        if len(values) != len(self.components):
            raise ValueError(f"For 'TrainingMonitor.step', the 'components' must have "
                             f"{len(self.components)} values {self.components}, but got {len(values)}.")
        return dict(zip(self.components, values))

    def summary(self) -> list[Finding]:
        """The run so far, judged as `objdebug monitor-log` judges the log."""
        header = {"components": self.components, "thresholds": self.thresholds}
        return judge_log(header, self._records)

    def close(self, reason: str | None = None) -> list[Finding]:
        if self.closed:
            return self.summary()
        findings = self.summary()
        self._write({"type": "end", "steps": self.steps, "stopped": self.should_stop, "reason": reason,
                     "seconds": round(time.perf_counter() - self._t0, 3),
                     "findings": [{k: f.to_dict()[k] for k in ("code", "verdict", "message")}
                                  for f in findings]})
        self._fh.close()
        self.closed = True
        return findings

    def reopen(self) -> None:
        """Append to the same log (a second `Model.train` call with the same callback)."""
        if self.closed:
            self._fh = open(self.path, "a", encoding="utf-8")
            self.closed = False
            self.should_stop = False

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close(reason="exception" if exc[0] is not None else None)

    def _write(self, obj: dict[str, Any]) -> None:
        self._fh.write(json.dumps(encode(obj)) + "\n")
        self._fh.flush()  # a crashed run still leaves a readable log


def _grad_cell(net: Any, params: list, has_aux: bool):
    """value_and_grad of the loss network with the gradient statistics reduced in the same graph
    (the engine's gradient family): (value, statistics, gradients)."""
    from objdebug.engine.gradients import ObjectiveGradient

    return ObjectiveGradient(net, params, has_aux=has_aux)


def __getattr__(name: str) -> Any:
    """`MonitorCallback` is built on first use, so reading a log never imports MindSpore."""
    if name == "MonitorCallback":
        globals()[name] = _make_callback_class()
        return globals()[name]
    raise AttributeError(f"module 'objdebug.monitor' has no attribute '{name}'")


def _make_callback_class() -> type:
    from mindspore.train import Callback

    return type("MonitorCallback", (_MonitorCallbackMixin, Callback), {
        "__doc__": _MonitorCallbackMixin.__doc__, "__module__": __name__})


class _MonitorCallbackMixin:
    """`Model.train` callback: loss every step, gradient health every `every` steps.

    The loss (and the components, if the train step returns `(loss, c1, ...)`) come from the
    step's outputs. On gradient steps the callback runs `value_and_grad` of the loss network
    (`loss_net`, default: the train network's `.network`, i.e. the WithLossCell) on the step's
    batch, after the update, in one extra compiled graph; if that network returns
    `(total, c1, ...)`, name the components and they are logged from it on those steps.
    `stop_on_fail=True` calls `run_context.request_stop()` after a failing rule.
    """

    def __init__(self, path: str | os.PathLike, components: Sequence[str] = (), every: int | None = None,
                 stop_on_fail: bool = False, loss_net: Any = None, profile: str = "default",
                 thresholds: dict[str, Any] | None = None):
        super().__init__()
        self.monitor = TrainingMonitor(path, components, every, stop_on_fail, profile, thresholds,
                                       source="callback")
        self.monitor.raise_on_stop = False
        self.loss_net = loss_net
        self._grad = None
        self._net: Any = None
        self._aux = False  # the gradient cell differentiates the first output only
        self._params: list = []
        self._offset = 0  # steps logged by earlier Model.train calls with this callback

    def on_train_begin(self, run_context: Any) -> None:
        if self.monitor.closed:
            self.monitor.reopen()
        self._offset = self.monitor.steps

    def _gradients(self, cb: Any) -> tuple[Any, list, Any, dict[str, np.ndarray]]:
        import mindspore as ms

        from objdebug.engine.gradients import stats_on_host

        if self._grad is None:
            self._net = self.loss_net or getattr(cb.train_network, "network", cb.train_network)
            self._params = list(self._net.trainable_params())
            self._aux = bool(self.monitor.components)
            self._grad = _grad_cell(self._net, self._params, self._aux)
        inputs = cb.train_dataset_element
        inputs = [x if isinstance(x, ms.Tensor) else ms.Tensor(x) for x in inputs]
        value, stats, grads = self._grad(*inputs)
        if isinstance(value, tuple) and not self._aux:
            # (loss, ...) with no components named: without has_aux, value_and_grad would
            # differentiate the SUM of the outputs; the loss is the first output only
            log.info("the loss network returns %d outputs and no components are named: the first "
                     "output is taken as the loss and differentiated alone (name the others with "
                     "components=[...] to log them)", len(value))
            self._aux = True
            self._grad = _grad_cell(self._net, self._params, True)
            value, stats, grads = self._grad(*inputs)
        comps = value[1:] if isinstance(value, tuple) else None
        return grads, self._params, comps, stats_on_host(stats)

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        out = cb.net_outputs
        k = len(self.monitor.components)
        comps = None
        if isinstance(out, (tuple, list)):
            if k and len(out) == 1 + k:
                comps = list(out[1:])
            loss = out[0]
        else:
            loss = out
        grads = params = stats = None
        step = self._offset + cb.cur_step_num
        if self.monitor.due(step) and getattr(cb, "train_dataset_element", None) is not None:
            grads, params, aux, stats = self._gradients(cb)
            comps = comps if comps is not None else aux
        self.monitor.step(loss, comps, grads, params, step=step, stats=stats)
        if self.monitor.should_stop:
            run_context.request_stop()

    def on_train_end(self, run_context: Any) -> None:
        reason = f"stop_on_fail: {self.monitor.failures[0]['code']}" if self.monitor.should_stop else None
        self.monitor.close(reason=reason)


# --------------------------------------------------------------------------- reading a log
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
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
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
    except (TypeError, ValueError, AttributeError) as exc:
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
             + ("" if end else " · no end record (run interrupted?)")]
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

"""The monitor in a training loop: `TrainingMonitor` for functional loops (call `.step` after each
`value_and_grad` step) and `MonitorCallback` for `Model.train` (built on first use, so reading a log
never imports MindSpore). Both write the JSONL log and judge each step with `rules`."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from objdebug.core.findings import Finding
from objdebug.core.jsonsafe import encode
from objdebug.monitor.log import SCHEMA
from objdebug.monitor.quantities import grad_stats
from objdebug.monitor.judge import CODES, TrainingStopped, judge_log, judge_step, monitor_thresholds
from objdebug.rules import get_rule

log = logging.getLogger("objdebug.monitor")


def _scalar(x: Any) -> float:
    if hasattr(x, "asnumpy"):
        x = x.asnumpy()
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


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
        `stats`: their per-parameter statistics when they were reduced already
        (`objdebug.engine.gradients.reduce_gradients`); else they are reduced here.
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
    """value_and_grad of the loss network (the engine's gradient family): (value, gradients);
    `reduce_gradients` reduces them in its own graph, compiled once per parameter set."""
    from objdebug.engine.gradients import ObjectiveGradient

    return ObjectiveGradient(net, params, has_aux=has_aux)


def _make_callback_class() -> type:
    from mindspore.train import Callback

    return type("MonitorCallback", (_MonitorCallbackMixin, Callback), {
        "__doc__": _MonitorCallbackMixin.__doc__, "__module__": "objdebug.monitor"})


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

        from objdebug.engine.gradients import reduce_gradients

        if self._grad is None:
            self._net = self.loss_net or getattr(cb.train_network, "network", cb.train_network)
            self._params = list(self._net.trainable_params())
            self._aux = bool(self.monitor.components)
            self._grad = _grad_cell(self._net, self._params, self._aux)
        inputs = cb.train_dataset_element
        inputs = [x if isinstance(x, ms.Tensor) else ms.Tensor(x) for x in inputs]
        value, grads = self._grad(*inputs)
        if isinstance(value, tuple) and not self._aux:
            # (loss, ...) with no components named: without has_aux, value_and_grad would
            # differentiate the SUM of the outputs; the loss is the first output only
            log.info("the loss network returns %d outputs and no components are named: the first "
                     "output is taken as the loss and differentiated alone (name the others with "
                     "components=[...] to log them)", len(value))
            self._aux = True
            self._grad = _grad_cell(self._net, self._params, True)
            value, grads = self._grad(*inputs)
        comps = value[1:] if isinstance(value, tuple) else None
        return grads, self._params, comps, reduce_gradients(grads)

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


MonitorCallback = None  # built on first use (objdebug.monitor.__getattr__)

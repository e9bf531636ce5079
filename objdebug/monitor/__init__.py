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

Layout: `quantities` (what a step measures), `rules` (thresholds and judging), `callback` (the
monitor in a loop, writing the log), `log` (the schema; reading and rendering a log).
"""

from __future__ import annotations

from typing import Any

from objdebug.monitor.callback import TrainingMonitor
from objdebug.monitor.log import SCHEMA, load_log, render_report, report
from objdebug.monitor.quantities import grad_stats
from objdebug.monitor.judge import CODES, TrainingStopped, judge_log, judge_step, monitor_thresholds

__all__ = ["CODES", "SCHEMA", "MonitorCallback", "TrainingMonitor", "TrainingStopped", "grad_stats",
           "judge_log", "judge_step", "load_log", "monitor_thresholds", "render_report", "report"]


def __getattr__(name: str) -> Any:
    """`MonitorCallback` is built on first use, so reading a log never imports MindSpore."""
    if name == "MonitorCallback":
        from objdebug.monitor import callback

        if callback.MonitorCallback is None:
            callback.MonitorCallback = callback._make_callback_class()
        return callback.MonitorCallback
    raise AttributeError(f"module 'objdebug.monitor' has no attribute '{name}'")

"""Where a run's time goes: each step (load, contract probe, every stage, the model state) split
into compiles (first calls of a graph at a shape), calls of graphs already compiled, and the rest
(host work: data, statistics). Kept in the JSON report as `extra.time_profile`; `-v` prints it (report/terminal.py).

Why: a wall alone does not say whether a slow `objdebug align` is compiles, slow graph calls or
host work (issue 48: a dynamic-shape forward called where a static one was), and the remedies
differ. The engine counts compile and call seconds as they happen (`Engine.call`); a step's share
is what those counters moved while it ran.
"""

from __future__ import annotations

import time
from typing import Any


class TimeProfile:
    """Per-step (wall, compile, calls, host) seconds of one run."""

    def __init__(self) -> None:
        self.steps: dict[str, dict[str, float]] = {}
        self._open: tuple[str, float, float, float] | None = None

    @staticmethod
    def _counters(engine: Any) -> tuple[float, float]:
        if engine is None:
            return 0.0, 0.0
        return float(engine.compiles.seconds), float(engine.call_seconds)

    def start(self, step: str, engine: Any = None) -> None:
        compile_s, calls_s = self._counters(engine)
        self._open = (step, time.perf_counter(), compile_s, calls_s)

    def stop(self, engine: Any = None) -> None:
        if self._open is None:
            return
        step, t0, c0, k0 = self._open
        self._open = None
        wall = time.perf_counter() - t0
        compile_s, calls_s = self._counters(engine)
        compile_s, calls_s = compile_s - c0, calls_s - k0
        entry = self.steps.setdefault(step, {"wall": 0.0, "compile": 0.0, "calls": 0.0, "host": 0.0})
        entry["wall"] += wall
        entry["compile"] += compile_s
        entry["calls"] += calls_s
        entry["host"] += max(wall - compile_s - calls_s, 0.0)

    def to_dict(self, total: float | None = None) -> dict[str, Any]:
        steps = {k: {f: round(v, 3) for f, v in e.items()} for k, e in self.steps.items()}
        out: dict[str, Any] = {"steps": steps}
        for field in ("compile", "calls", "host"):
            out[field] = round(sum(e[field] for e in self.steps.values()), 3)
        if total is not None:
            out["total"] = round(total, 3)
            # the run's own bookkeeping outside any step (versions, profile, cache manifest)
            out["other"] = round(max(total - sum(e["wall"] for e in self.steps.values()), 0.0), 3)
        return out


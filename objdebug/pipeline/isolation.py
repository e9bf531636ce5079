"""Memory-heavy measurements in a process of their own: its memory returns when it exits, and a
measurement that does not fit kills that process, never the run.

Why: MindSpore keeps what its memory pool took until the process ends, so every stage before the
long inputs leaves its peak behind, and a check that compares its own need with what is free when
it starts can still be the one that tips the machine over. A pre-training sanity check that the
kernel kills (SIGKILL) reports nothing, on exactly the models it exists for.

`run_isolated(ctx, "module:function", **arguments)` runs `function(ctx, **arguments)` in a fresh
Python process (`python -m objdebug.pipeline.isolation JOB`):

- the child loads the same target from the same config (pickled), then takes the parent's
  parameter values (a random-init model is the parent's model, not a re-initialised one), and
  runs on the same device, mode and seed, in a scratch directory of its own and never with the
  compile cache (MindSpore's cache files are numbered by compile order per process);
- it asks the kernel to choose it first under memory pressure (`oom_score_adj` 1000), and the
  parent watches MemAvailable while it runs: below `floor_bytes` the parent kills it. Either way
  `KilledForMemory` says how much the child held and what was left, and the check reports a SKIP
  with those numbers;
- its compiles join the parent's compile log (a graph the child compiled is a graph of the run);
- an exception in the child comes back as `IsolatedError` with its type and first line, so the
  check's crash becomes ERROR with the child's message, like a crash in the parent.

Arguments and results travel pickled: NumPy arrays, numbers, strings, dicts.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from objdebug.engine import watchdog
from objdebug.engine import host_memory
from objdebug.engine.host_memory import available_bytes, rss_bytes, total_bytes

# The parent's variables the child must not inherit: the compile cache (per process, by compile
# order) and the supervisor's watchdog pipe (the parent's, not the child's).
_DROP_ENV = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH", watchdog.FD_ENV,
             watchdog.PARENT_ENV)
FLOOR_ENV = "OBJDEBUG_ISOLATION_FLOOR_BYTES"  # tests: a floor that every child crosses
_POLL_S = 0.05
GIB = 1024 ** 3


class KilledForMemory(RuntimeError):
    """The child was killed for memory: by the parent (MemAvailable under the floor) or the kernel."""

    def __init__(self, by: str, child_rss_bytes: int, available_bytes: int | None, floor_bytes: int):
        self.by, self.child_rss_bytes = by, int(child_rss_bytes)
        self.available_bytes, self.floor_bytes = available_bytes, int(floor_bytes)
        left = f"{available_bytes / GIB:.2f} GiB" if available_bytes is not None else "unknown"
        super().__init__(f"its own process was killed for memory ({by}) holding "
                         f"{self.child_rss_bytes / GIB:.2f} GiB with {left} left on the machine")


class IsolatedError(RuntimeError):
    """An exception raised inside the child: its type and message."""


def floor_bytes() -> int:
    """MemAvailable below which the parent ends the child: what the rest of the machine (and the
    parent's own next allocation) needs to stay out of the kernel's OOM killer."""
    if os.environ.get(FLOOR_ENV):
        return int(os.environ[FLOOR_ENV])
    total = total_bytes() or 0
    return max(512 * 1024 ** 2, total // 32)


def available() -> bool:
    """Whether a measurement can run in a child here: a Linux /proc to watch it by, and not an
    msrun worker (a child would inherit the cluster's variables and try to join it; each worker's
    share of memory is guarded by the checks' estimates instead)."""
    from objdebug.engine.distributed import under_msrun

    return os.path.exists("/proc/meminfo") and not under_msrun()


def _named_parameters(target: Any):
    """(key, Parameter) of every parameter of the target's Cells, the key "role/name"."""
    for role, cell in (("model", target.model), ("objective", target.objective)):
        if cell is not None and hasattr(cell, "get_parameters"):
            for p in cell.get_parameters():
                yield f"{role}/{p.name}", p


def _parameters(target: Any) -> dict[str, np.ndarray]:
    """Every parameter value of the target's Cells, keyed by Cell role and name."""
    return {key: p.asnumpy() for key, p in _named_parameters(target)}


def run_isolated(ctx: Any, function: str, *, need_bytes: int | None = None, **arguments: Any) -> Any:
    """`function(ctx, **arguments)` ("package.module:name") in a child process; its result.

    `need_bytes`: what the measurement is estimated to take; this process first lets go of the
    graphs it no longer needs until that much (and the floor) is free, where it can
    (`Engine.make_room`). Raises KilledForMemory when the child is killed for memory,
    IsolatedError when it raised.
    """
    if need_bytes:
        ctx.engine.make_room("", want=int(need_bytes) + floor_bytes())
    return start_isolated(ctx, function, **arguments).result()


class Isolated:
    """A measurement running in a child process (`start_isolated`), watched by a thread of this
    process: `result()` waits for it, `cancel()` ends it."""

    def __init__(self, ctx: Any, job: str, proc: subprocess.Popen):
        import threading

        self.ctx, self.job, self.proc = ctx, job, proc
        self.cancelled = False
        self._watched: tuple[str | None, int, int | None] | None = None
        self._thread = threading.Thread(target=self._watch, name="objdebug-isolated", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            self._watched = _watch(self.proc)
        except BaseException:  # noqa: BLE001 - the child must not outlive a broken watch
            _kill(self.proc)
            self._watched = (None, 0, None)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """End the child now (its result is never read) and remove its folder."""
        self.cancelled = True
        _kill(self.proc)
        self._thread.join()
        shutil.rmtree(self.job, ignore_errors=True)

    def result(self) -> Any:
        """The function's result; KilledForMemory or IsolatedError as `run_isolated` says."""
        try:
            self._thread.join()
        except BaseException:  # interrupted while waiting: the child goes with the run
            self.cancel()
            raise
        try:
            return self._collect()
        finally:
            shutil.rmtree(self.job, ignore_errors=True)

    def _collect(self) -> Any:
        killed_by, held, left = self._watched or (None, 0, None)
        proc, job = self.proc, self.job
        host_memory.isolated_peak(held)
        floor = floor_bytes()
        if killed_by is None and proc.returncode == -signal.SIGKILL:
            killed_by = "by the kernel's OOM killer"  # it chose the child, as asked
        if killed_by is not None:
            raise KilledForMemory(killed_by, held, left, floor)
        result_path = os.path.join(job, "result.pkl")
        if not os.path.exists(result_path):
            tail = _log_tail(os.path.join(job, "child.log"))
            raise IsolatedError(f"the isolated process ended with code {proc.returncode}: {tail}")
        with open(result_path, "rb") as fh:
            result = pickle.load(fh)
        _merge_compiles(self.ctx.engine, result["compiles"])
        host_memory.isolated_peak(result.get("peak_rss_bytes", 0))
        if "error" in result:
            raise IsolatedError(result["error"])
        return result["value"]


def start_isolated(ctx: Any, function: str, *, stage: str | None = None, check: str | None = None,
                   cpus: set[int] | None = None, **arguments: Any) -> Isolated:
    """Start `function(ctx, **arguments)` in a child process and return at once; the handle's
    `result()` waits for it. `stage` / `check`: what its compiles are charged to (default: the
    engine's now). `cpus`: the only CPUs the child may run on, at a lower priority (a
    measurement beside the run keeps out of the way of the run's own compiles)."""
    from objdebug.core import leftovers

    # a scratch folder like the run's own: a run killed by SIGKILL leaves it to the next run to remove
    job = tempfile.mkdtemp(prefix="objdebug-")
    leftovers.mark(job)
    try:
        np.savez(os.path.join(job, "parameters.npz"), **_parameters(ctx.target))
        with open(os.path.join(job, "job.pkl"), "wb") as fh:
            pickle.dump({"config": ctx.config, "profile": ctx.profile, "function": function,
                         "arguments": arguments, "sys_path": list(sys.path),
                         "batch_size": ctx.engine.batch_size, "max_length": ctx.engine.max_length,
                         "vocab": ctx.engine._vocab, "buckets": ctx.engine.buckets,
                         "stage": stage or ctx.engine.stage, "check": check or ctx.engine.check,
                         "cpus": sorted(cpus) if cpus else None,
                         "debug": bool(getattr(ctx, "debug", False))}, fh)
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        # `-m objdebug...` must find this objdebug, installed or not (the user's modules come
        # from the parent's sys.path, set in the child)
        home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        with open(os.path.join(job, "child.log"), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "objdebug.pipeline.isolation", job],
                                    cwd=job, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
    except BaseException:
        shutil.rmtree(job, ignore_errors=True)
        raise
    return Isolated(ctx, job, proc)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _watch(proc: subprocess.Popen) -> tuple[str | None, int, int | None]:
    """Wait for the child; kill it when MemAvailable falls under the floor. -> (killed by whom or
    None, the child's largest RSS seen, MemAvailable at the end)."""
    floor, held, left = floor_bytes(), 0, None
    try:
        while proc.poll() is None:
            held = max(held, rss_bytes(proc.pid))
            left = available_bytes()
            if left is not None and left < floor:
                proc.kill()
                proc.wait()
                return (f"by objdebug: MemAvailable {left / GIB:.2f} GiB fell under the "
                        f"{floor / GIB:.2f} GiB floor", held, left)
            time.sleep(_POLL_S)
    finally:
        _kill(proc)  # (a child that ended already is left alone)
    return None, held, left


def _log_tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


def _merge_compiles(engine: Any, records: list[dict[str, Any]]) -> None:
    from objdebug.engine.core import CompileRecord

    for r in records:
        rec = CompileRecord(**r)
        engine.compiles.records.append(rec)
        engine.compiles.uses.setdefault(rec.check or rec.stage, set()).add(rec.graph)


# --------------------------------------------------------------------------- the child
def _child(job: str) -> int:
    from objdebug.engine import process_tree

    process_tree.die_with_parent()  # a run killed by SIGKILL takes its measurement along
    try:  # the kernel's first choice under memory pressure: this process, not the run
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write("1000")
    except OSError:
        pass
    with open(os.path.join(job, "job.pkl"), "rb") as fh:
        spec = pickle.load(fh)
    if spec.get("cpus"):  # beside the run: before MindSpore sizes its thread pools
        os.sched_setaffinity(0, spec["cpus"])
        os.nice(10)  # and the run's own work first where they meet on that core
    sys.path[:] = spec["sys_path"]
    out: dict[str, Any] = {"compiles": []}
    engine = None
    try:
        engine = _child_engine(spec, job)
        ctx = _child_context(spec, engine)
        module, name = spec["function"].split(":")
        import importlib

        fn = getattr(importlib.import_module(module), name)
        out["value"] = fn(ctx, **spec["arguments"])
        out["peak_rss_bytes"] = host_memory.run_peaks()["peak_rss_bytes"]
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent as text
        from objdebug.core import crash

        out["error"] = crash.summary(exc)
    if engine is not None:
        out["compiles"] = [asdict(r) for r in engine.compiles.records]
    tmp = os.path.join(job, "result.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(out, fh)
    os.replace(tmp, os.path.join(job, "result.pkl"))
    return 0


def _child_engine(spec: dict[str, Any], job: str):
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target

    cfg = spec["config"]
    runtime.quiet_logs(spec["debug"], None)
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    target = load_target(cfg)
    import mindspore as ms

    saved = np.load(os.path.join(job, "parameters.npz"))
    for key, p in _named_parameters(target):  # the run's values, not a fresh initialisation
        if key in saved.files:
            p.set_data(ms.Tensor(saved[key]))
    engine = Engine(target, batch_size=spec["batch_size"])
    engine.max_length, engine._vocab, engine.buckets = spec["max_length"], spec["vocab"], spec["buckets"]
    engine.stage, engine.check = spec["stage"], spec["check"]
    return engine


def _child_context(spec: dict[str, Any], engine: Any):
    from objdebug.pipeline.context import Context

    return Context(config=spec["config"], target=engine.target, engine=engine,
                   profile=spec["profile"], debug=spec["debug"])


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))

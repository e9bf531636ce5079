"""Graphs let go under memory pressure (Engine.make_room): the same numbers after a graph compiles
again, every compile counted, the user's own Cells kept, and what was let go in the report."""

from __future__ import annotations

import numpy as np
import pytest

from objdebug.engine import host_memory
from objdebug.engine.core import HEADROOM_ENV
from objdebug.engine import runtime
from objdebug.pipeline.runner import run_check
from objdebug.stages import stress

from .test_stress import Target

pytestmark = pytest.mark.skipif(host_memory.available_bytes() is None, reason="needs /proc/meminfo")


def _check(name: str):
    return next(c for c in stress.checks() if c.name == name)


def test_graphs_let_go_under_pressure_give_the_same_numbers(monkeypatch):
    t = Target("stress_healthy")
    with runtime.scratch_dir():
        first = run_check(_check("padding-invariance"), t.ctx, t.th)
        compiled = t.ctx.engine.compiles.count
        monkeypatch.setenv(HEADROOM_ENV, str(1 << 62))  # no machine has that: let go of everything
        t.ctx.engine.cell("stress.unused", lambda: _Unused())
        again = run_check(_check("padding-invariance"), t.ctx, t.th)  # graphs kept: no compile
        assert t.ctx.engine.compiles.count == compiled
        t.ctx.engine.check = "long-objective"  # as api.run names the running check: its graphs stay
        logits = run_check(_check("long-objective"), t.ctx, t.th.replace(objective_long_lengths=[64]))
        t.ctx.engine.check = ""
    assert first.error is None and again.error is None and logits.error is None, logits.error
    assert [r["loss"] for r in again.value["rows"]] == [r["loss"] for r in first.value["rows"]]
    released = [r["graph"] for r in t.ctx.engine.compiles.released]
    # the long objective's call let go of the engine's graphs that check does not use, least
    # recently called first; the model's forward stays (every stage's logits come from it)
    assert released[0] == "stress.unused" and "model.vjp" in released
    assert "model.forward" not in released and "objective.logit_grad" not in released
    assert "released" in t.ctx.engine.compiles.to_dict()
    # a graph let go compiles again when called again: the same numbers, one more compile counted
    monkeypatch.delenv(HEADROOM_ENV)
    before = t.ctx.engine.compiles.count
    with runtime.scratch_dir():
        third = run_check(_check("padding-invariance"), t.ctx, t.th)
    assert t.ctx.engine.compiles.count > before
    np.testing.assert_array_equal([r["loss"] for r in third.value["rows"]],
                                  [r["loss"] for r in first.value["rows"]])
    assert [r["grad_norm"] for r in third.value["rows"]] == [r["grad_norm"] for r in first.value["rows"]]


class _Unused:
    """An engine cell that never compiled (no compile_cache): letting it go is a no-op."""


def test_the_runs_peak_memory_is_in_the_report_and_the_terminal_line():
    from objdebug.report.terminal import _memory_text

    host_memory.start_run()
    blob = bytearray(64 * 1024 ** 2)  # 64 MiB touched: the peak must see it
    blob[::4096] = b"x" * len(blob[::4096])
    peaks = host_memory.run_peaks()
    assert peaks["peak_rss_bytes"] >= host_memory.rss_bytes() > 64 * 1024 ** 2
    host_memory.isolated_peak(3 * 2 ** 30)
    text = _memory_text({"extra": {"memory": host_memory.run_peaks()}})
    assert text.startswith("peak RSS ") and "(own processes 3.00 GiB)" in text
    assert _memory_text({"extra": {}}) == "" and _memory_text({}) == ""
    del blob


def test_each_stage_starts_with_the_headroom_rule(monkeypatch):
    """A stage can take its memory on the host without compiling (decompose's logits on a large
    vocabulary), so the runner applies the compile's headroom rule before every stage too: under
    pressure the graphs of the stages before it are let go when it starts."""
    from objdebug import api
    from objdebug.core.config import load_config
    from objdebug.engine.core import Engine

    from .conftest import TARGETS

    starts = []
    real = Engine.make_room

    def spy(self, compiling, want=None):
        if compiling == "":
            starts.append(self.stage)
        return real(self, compiling, want)

    monkeypatch.setattr(Engine, "make_room", spy)
    monkeypatch.setenv(HEADROOM_ENV, str(1 << 62))
    cfg = load_config(TARGETS / "stress_healthy" / "objdebug.toml")
    # the shared dynamic graphs (a run with a gradient stage has them): an align + correlate run on
    # CPU would score its rows through one fused static graph, never let go (engine/row_scoring.py)
    from objdebug.engine import row_scoring

    monkeypatch.setattr(row_scoring, "static_rows_wanted", lambda *args: False)
    result = api.run(cfg, stages=["align", "correlate"])
    assert starts[:2] == ["align", "correlate"]
    released = result.compiles.get("released", [])
    # at correlate's start the align stage's graphs went (the user's model.forward is never let go)
    assert any(r["stage"] == "correlate" and r["check"] == "" for r in released)
    assert all(r["graph"] != "model.forward" for r in released)

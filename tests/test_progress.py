"""The progress display: no-op by default, plain lines + heartbeat in logs, rich live view on a
terminal (a real run in a pseudo-terminal), Ctrl-C never swallowed.

The CLI run uses fixtures/targets/reports_tiny (one tiny model, a few seconds a run); the CI-log
run (stage lines, no escape codes) is in tests/test_ci_output.py, sharing its GitHub run.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from objdebug.core.progress import (LineProgress, LiveProgress, Progress, StageSummary, for_stream,
    shapes_text)

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fixtures" / "targets" / "reports_tiny"
LENIENT = TARGET / "lenient.toml"
ESC = re.compile(r"\x1b")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GITLAB", "CI_"))}
    env.update(PYTHONPATH=str(ROOT), GLOG_v="3", **extra)
    return env


# --------------------------------------------------------------------------- units
def test_shapes_text_keeps_distinct_shapes_without_dtypes():
    assert shapes_text("Int32[8, 256],Int32[8, 256]") == "[8, 256]"
    assert shapes_text("Int32[8, 64],Float32[3, 256, 64]") == "[8, 64] [3, 256, 64]"
    assert shapes_text("") == ""


def test_stage_summary_counts_verdicts_and_compiles():
    from objdebug.engine.core import CompileRecord
    from objdebug.core.findings import CheckResult, Finding, Verdict

    res = CheckResult("align", "x", findings=[Finding("OBJ101", Verdict.PASS, ""),
                                              Finding("OBJ102", Verdict.WARN, ""),
                                              Finding("OBJ103", Verdict.PASS, "")])
    s = StageSummary.of("align", [res], 2.25, [CompileRecord("g", "[1]", 1.5, "align")])
    assert s.counts == {"PASS": 2, "WARN": 1} and s.compiles == 1
    assert s.text() == "2 pass, 1 warn · 2.2 s · 1 compile (1.5 s)"


def test_default_progress_is_silent_and_for_stream_picks_by_tty():
    p = Progress()  # what api.run uses when the caller passes nothing
    with p.running(["align"]):
        p.compile_start("g", "[1]")
        with p.task("t", 2) as tick:
            tick()
    assert type(for_stream(io.StringIO())) is LineProgress
    assert type(for_stream(io.StringIO(), quiet=True)) is Progress


def test_line_progress_heartbeat_during_a_long_compile():
    """Stage lines, then a heartbeat line while a compile runs longer than the interval."""
    out = io.StringIO()
    p = LineProgress(out, heartbeat_s=0.2)
    with p.running(["align", "grad"]):
        p.stage_start("align")
        p.compile_start("objective.per_sample", "[8, 256]")
        time.sleep(0.7)
        p.compile_end("objective.per_sample", "[8, 256]", 0.7)
        with p.task("align: scoring answers", total=4) as tick:
            tick()
            time.sleep(0.5)
        p.stage_end(StageSummary("align", {"PASS": 5}, 1.2, 1, 0.7))
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["objdebug: stages align, grad", "objdebug: align (1/2): started"]
    assert any("compiling objective.per_sample [8, 256] for" in line for line in lines), lines
    assert any("align: scoring answers: batch 1/4, ETA" in line for line in lines), lines
    assert lines[-1] == "objdebug: align: done: 5 pass · 1.2 s · 1 compile (0.7 s)"
    assert not ESC.search(out.getvalue())
    assert not any(t.name == "objdebug-heartbeat" for t in threading.enumerate())  # stopped


def test_live_display_stops_and_reraises_keyboard_interrupt():
    out = io.StringIO()
    p = LiveProgress(out, force_terminal=True)  # as on a real terminal, without one
    with pytest.raises(KeyboardInterrupt):
        with p.running(["align"]):
            p.stage_start("align")
            p.compile_start("objective.per_sample", "[8, 64]")
            raise KeyboardInterrupt
    assert p._live is None
    assert "\x1b[?25h" in out.getvalue()  # the cursor is shown again: the terminal is left sane


# --------------------------------------------------------------------------- a real run
def test_terminal_shows_the_compile_while_it_runs_and_ctrl_c_leaves_it_sane():
    pexpect = pytest.importorskip("pexpect")
    # with a gradient stage: the shared dynamic graphs, and work left to interrupt after align starts
    # (align alone scores its few rows through one fused static graph and may end before the ^C)
    args = ["-m", "objdebug.cli", "run", "--stages", "align,grad", "-c", str(TARGET / "objdebug.toml"),
            "-p", str(LENIENT)]
    child = pexpect.spawn(sys.executable, args, env=_env(TERM="xterm-256color"), cwd=str(ROOT),
                          dimensions=(30, 120), encoding="utf-8", timeout=120)
    try:
        start = time.monotonic()
        child.expect(r"compiling (model\.forward|objective\.forward) (\[8, \d+\]|\(dynamic shapes\))")
        seen = time.monotonic() - start
        assert "PASSED" not in child.before  # seen during the run, not in the final report
        child.expect(r"stage align \(1/2\)")
        child.sendintr()  # Ctrl-C: the display stops, KeyboardInterrupt reaches the CLI
        child.expect(pexpect.EOF)
        after = child.before
    finally:
        child.close(force=True)
    assert "\x1b[?25h" in after  # cursor restored
    assert "interrupted" in after
    assert child.exitstatus not in (0, None) or child.signalstatus is not None
    assert seen < 60, f"the compile line took {seen:.0f} s to appear"


def test_quiet_prints_only_the_verdict_line():
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "-q",
                           "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT)],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "PASSED: 5 pass, 0 warn, 0 fail, 0 error, 0 skipped (exit 0)\n"
    assert "objdebug:" not in proc.stderr

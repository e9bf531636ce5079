"""SIGINT / SIGTERM: one line, exit 130 / 143, scratch directories removed, and the report files of
one run replaced all together or not at all. Real signals, sent to a real process."""

import os
import signal
import subprocess
import tempfile
import sys
import time
from pathlib import Path

import pytest

from .conftest import messages
from typer.testing import CliRunner

from objdebug.cli import app

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_a_run(tiny_target, tmp_path, signum, code):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    old = tmp_path / "r.json"
    old.write_text("old report\n")
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    env.pop("GLOG_v", None)  # as a user has it: MindSpore's own log lines stay hidden
    proc = subprocess.Popen([sys.executable, "-m", "objdebug.cli", "align", "-c",
                             str(tiny_target / "objdebug.toml"), "--json", str(old)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 120
        while not list(tmp.glob("objdebug-*")):  # the run reached its scratch directory
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    lines = messages(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("objdebug: error: interrupted after stage "), err
    assert lines[0].endswith("; no report written"), err
    assert list(tmp.iterdir()) == []          # scratch directory removed
    assert old.read_text() == "old report\n"  # the earlier report is untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_signal_while_writing_reports_keeps_the_old_set(tmp_path, monkeypatch):
    """A signal after the JUnit file but before the HTML one: neither old file changes."""
    from objdebug.report import figures

    junit, html_dir = tmp_path / "r.xml", tmp_path / "html"
    html_dir.mkdir()
    junit.write_text("<old/>")
    (html_dir / "index.html").write_text("<html>old</html>")

    def figures_then_signal(*args, **kwargs):  # drawn after the JUnit file, before the HTML
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by objdebug's handler
        time.sleep(1)                         # not reached: the handler raises first

    monkeypatch.setattr(figures, "draw_all", figures_then_signal)
    result = CliRunner().invoke(app, ["render", str(GOLDEN), "--junit", str(junit),
                                      "--html", str(html_dir)])
    assert result.exit_code == 143, result.output
    assert result.output.strip() == "objdebug: error: interrupted; no report written"
    assert junit.read_text() == "<old/>"
    assert (html_dir / "index.html").read_text() == "<html>old</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html", "r.xml"]  # no temporaries


def test_reports_of_one_run_are_committed_together(tmp_path):
    from objdebug.report import all_or_nothing, write_atomic

    a, b = tmp_path / "a.txt", tmp_path / "sub" / "b.txt"
    with all_or_nothing() as done:
        write_atomic(a, "new a")
        write_atomic(b, "new b")
        assert not a.exists() and not b.exists()  # staged only
    assert done.committed and a.read_text() == "new a" and b.read_text() == "new b"
    with pytest.raises(RuntimeError):
        with all_or_nothing() as done:
            write_atomic(a, "newer a")
            raise RuntimeError("boom")
    assert not done.committed and a.read_text() == "new a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "sub"]


def test_a_signal_that_library_code_swallows_still_stops_the_run(tiny_target, tmp_path, monkeypatch):
    """MindSpore's load_checkpoint catches BaseException and raises ValueError('...: SIGTERM'):
    the run must still stop as interrupted (143), not report a bad checkpoint (2)."""
    import mindspore as ms

    def load_checkpoint_like_mindspore(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except BaseException as exc:
            raise ValueError(f"Failed to read the checkpoint file: {exc}") from None

    monkeypatch.setattr(ms, "load_checkpoint", load_checkpoint_like_mindspore)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(app, ["align", "-c", str(tiny_target / "objdebug.toml")])
    assert result.exit_code == 143, result.output
    assert messages(result.output) == ["objdebug: error: interrupted after stage setup (during load); "
                                       "no report written"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith("objdebug-")] == []


# A second SIGINT that reaches Python's own C handler after the run's handler fired: MindSpore's
# C handler, installed while a graph runs, passes a signal on to the handler it replaced (Python's).
# Before: the run's handler had set SIG_IGN at the Python level, so the next check (here in the
# watchdog's os.write) printed "Exception ignored ... Signal 2 ignored due to race condition".
SECOND_SIGNAL = r'''
import ctypes, os, signal, sys, threading
from objdebug.core import exits
from objdebug.core.interrupts import raising_signals
from objdebug.engine import watchdog


class SigAction(ctypes.Structure):  # glibc's struct sigaction on Linux
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
threading.Thread(target=lambda: [os.read(r, 65536) for _ in iter(int, 1)], daemon=True).start()
watchdog._state["fd"] = w
pythons = SigAction()
try:
    with raising_signals():
        libc.sigaction(signal.SIGINT, None, ctypes.byref(pythons))  # Python's C-level handler
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100000):
                watchdog.send("graph", "'model.forward' [8, 64]")
        finally:
            # the cleanup goes on (a graph runs: MindSpore's handler chains to Python's) and a
            # second SIGINT comes (the supervisor sends it again every 0.5 s)
            libc.sigaction(signal.SIGINT, ctypes.byref(pythons), None)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                watchdog.send("graph", "")
except BaseException as exc:
    code, line = exits.ending(exc)
    sys.stderr.write(f"objdebug: error: {line}\n")
    sys.stderr.flush()
    os._exit(code)
'''


def test_a_second_signal_during_the_cleanup_is_silent(tmp_path):
    script = tmp_path / "second_signal.py"
    script.write_text(SECOND_SIGNAL)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines() == ["objdebug: error: interrupted; no report written"], proc.stderr


def test_a_signal_just_after_the_scratch_folder_is_made_removes_it(tiny_target, tmp_path, monkeypatch):
    """On a busy machine the run can be descheduled right after mkdtemp: a ^C then (what
    test_signal_during_a_run sends the moment the folder appears) left the folder behind."""
    from objdebug.core import leftovers

    mark = leftovers.mark

    def mark_then_signal(folder):
        mark(folder)
        if os.path.basename(folder).startswith("objdebug-"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)

    monkeypatch.setattr(leftovers, "mark", mark_then_signal)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(app, ["align", "-c", str(tiny_target / "objdebug.toml")])
    assert result.exit_code == 130, result.output
    assert messages(result.output) == ["objdebug: error: interrupted after stage setup (during load); "
                                       "no report written"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith("objdebug-")] == []

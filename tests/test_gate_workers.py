"""Issue 35, `--workers` under hostile settings: real msrun workers, real signals. The `--timeout`
covers the launcher and every worker; a CI runner's SIGKILL to the job's process group takes every
msrun process with it and leaves no report; a ^C after rank 0 finished its report is honest about
the files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import messages

ROOT = Path(__file__).resolve().parent.parent

# the workers' model factory sleeps: the run is in the workers, not in the launcher
SLEEPY_MODEL = '''import os
import time

from objdebug.demo.model import build_model


def build(**kwargs):
    time.sleep(float(os.environ.get("SLEEPY_SECONDS", "120")))
    return build_model(**kwargs)
'''


def _start(target, tmp, *args, sleep: float):
    (target / "sleepy_model.py").write_text(SLEEPY_MODEL)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp), SLEEPY_SECONDS=str(sleep))
    env.pop("GLOG_v", None)
    # its own process group, as a CI runner starts a job
    return subprocess.Popen([sys.executable, "-m", "objdebug.cli", "align", "-q", "--workers", "2",
                             "--set", "model.factory=sleepy_model:build", *args],
                            cwd=target, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _tree(marker: str) -> list[str]:
    """The command lines of live (not zombie) processes that name `marker` (the msrun folder
    under this test's TMPDIR, or the target's folder)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] == "Z":
            continue
        if marker in args or cwd.startswith(marker):
            out.append(f"{pid}: {args}")
    return out


def _wait_for_workers(proc, tmp, limit=180.0):
    deadline = time.time() + limit
    while sum("objdebug_worker.py" in a and "MS_SCHED" not in a for a in _tree(str(tmp))) < 1:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)


@pytest.mark.slow
def test_timeout_covers_the_launcher_and_every_worker(tiny_target, tmp_path):
    """Before: exit 0 after ~150 s (the workers' factory slept 120 s); now exit 3 at the timeout,
    one line naming the workers, no process and no scratch folder left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    t0 = time.time()
    proc = _start(tiny_target, tmp, "--timeout", "20", "--json", "r.json", sleep=120)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    took = time.time() - t0
    assert proc.returncode == 3, err
    assert took < 60, took
    (line,) = messages(err)
    assert line.startswith("objdebug: error: timed out after 20 s (--timeout) while 2 msrun "
                           "workers ran"), err
    assert line.endswith("; no report written"), err
    time.sleep(1)
    assert _tree(str(tmp)) == [] and _tree(str(tiny_target)) == []
    assert list(tmp.iterdir()) == []
    assert not (tiny_target / "r.json").exists()


def test_a_killed_job_takes_every_worker_and_leaves_no_report(tiny_target, tmp_path):
    """A CI runner's cancel: SIGKILL to the job's process group while the workers run. Before:
    msrun and its workers lived on and wrote r.json after the job was dead."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start(tiny_target, tmp, "--json", "r.json", sleep=6)
    try:
        _wait_for_workers(proc, tmp)
        time.sleep(2)  # the workers are in the factory's sleep
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 10
        while _tree(str(tmp)) or _tree(str(tiny_target)):
            assert time.time() < deadline, _tree(str(tmp)) + _tree(str(tiny_target))
            time.sleep(0.2)
        time.sleep(20)  # longer than the rest of the run would have taken
        assert not (tiny_target / "r.json").exists()
    finally:
        for line in _tree(str(tmp)) + _tree(str(tiny_target)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


@pytest.mark.slow
def test_sigint_after_rank_0_finished_its_report_is_honest(tiny_target, tmp_path):
    """^C after rank 0 recorded its report but before the launcher reported: the line says what
    the file system holds. The report of a cancelled run is not committed: no r.json."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start(tiny_target, tmp, "--json", "r.json", sleep=0)
    try:
        deadline = time.time() + 240
        # rank 0's record in the launcher's result folder: the run is over in rank 0
        while not list(tmp.glob("objdebug-msrun-*/results/rank_0.json")):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 130, err
    (line,) = messages(err)
    written = (tiny_target / "r.json").exists()
    assert line.endswith("; reports written" if written else "; no report written"), (line, written)
    assert not written  # a report that exists is the whole, uncancelled run's
    assert [p.name for p in tiny_target.iterdir() if p.name.startswith(".r.json")] == []
    time.sleep(1)
    assert _tree(str(tmp)) == []

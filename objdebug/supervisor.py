"""The `objdebug` command runs in a child of this small supervisor (issue 23): a run cannot hang,
cannot be made to pass by `os._exit(0)`, and leaves nothing behind when it must be killed.

Why a process: MindSpore compiles in C++ holding the GIL, so while a construct that never
terminates compiles (graph mode unrolling a huge Python loop: it grows until the machine runs out
of memory), no thread, timer or signal handler of that process can run. The supervisor imports
nothing heavy and only:
- forwards SIGINT/SIGTERM to the child; the child stops cleanly when MindSpore returns (exit
  130/143, its own line); if it has not ended GRACE seconds later, the supervisor kills it, removes
  its scratch folders, says where it was and exits 128 + signal;
- ends the run at the `--timeout` (the profile's `timeout`): one line naming the graph being
  compiled (engine/watchdog.py tells it) or, under `--workers`, the msrun workers the child waits
  for; the child killed with every process below it (msrun runs in a session of its own), exit 3;
- turns a child that ended with 0 without going through Python's exit (os._exit(0) from the
  target's code, which no in-process guard can catch when bound early) into exit 3 with a line:
  a run that did not reach its verdict is never a pass;
- returns the child's exit code otherwise (a signal's death as 128 + signal), 130 for a SIGINT
  that MindSpore's own handler turned into SIGTERM in the child (interrupts.reassert narrows it).
It is not used under msrun (the workers and the scheduler) or where fork is unavailable.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

from objdebug.engine import process_tree, watchdog

GRACE = 5.0  # seconds the child has to stop by itself after a forwarded signal
RESEND = 0.5  # seconds between forwards of that signal while the child runs (MindSpore may eat one)


def require_working_directory() -> None:
    """Exit 2 with one line when the working directory was deleted: every path is resolved
    against it, and MindSpore aborts (rc 134) without one."""
    try:
        os.getcwd()
    except FileNotFoundError:
        sys.stderr.write("objdebug: error: the working directory no longer exists (it was "
                         "deleted); cd to an existing directory\n")
        raise SystemExit(2) from None


def supervise() -> None:
    """Fork: the child returns and runs the command, the parent supervises and exits."""
    if os.environ.get("MS_ROLE") or os.environ.get(watchdog.PARENT_ENV) or not hasattr(os, "fork"):
        watchdog.connect()  # a re-executed child (cache fallback) finds its pipe again
        if watchdog._state["fd"] is not None:
            import atexit

            atexit.register(watchdog.clean_exit)
        return
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        process_tree.die_with_parent()  # its scratch folder is then removed by a later run (core/leftovers.py)
        os.set_inheritable(write, True)  # kept across the cache fallback's execve
        os.environ[watchdog.PARENT_ENV] = str(os.getppid())
        os.environ[watchdog.FD_ENV] = str(write)
        watchdog.connect()
        import atexit

        atexit.register(watchdog.clean_exit)
        return
    os.close(write)
    os._exit(_watch(pid, read))


class _Child:
    def __init__(self, pid: int, pipe: int | None = None):
        self.pid = pid
        self.pipe = pipe  # the read end of the child's event pipe
        self.rest = b""   # a line not complete yet
        self.graph = ""
        self.stage = ""
        self.dirs: set[str] = set()
        self.timeout = 0.0
        self.clean = False
        self.work = ""  # what a launcher waits for (`--workers`: "2 msrun workers ran")
        self.said: int | None = None  # the child printed its ending line and exits with this code

    def event(self, line: str) -> None:
        kind, _, text = line.partition(" ")
        if kind == "graph":
            self.graph = text
        elif kind == "stage":
            self.stage = text
        elif kind == "dir":
            self.dirs.add(text)
        elif kind == "undir":
            self.dirs.discard(text)
        elif kind == "timeout":
            try:
                self.timeout = max(0.0, float(text))
            except ValueError:
                pass
        elif kind == "clean":
            self.clean = True
        elif kind == "work":
            self.work = text
        elif kind == "said":
            try:
                self.said = int(text)
            except ValueError:
                pass

    def where(self) -> str:
        if self.graph:
            return f"while compiling graph {self.graph}"
        if self.work:
            return f"while {self.work}"
        return f"during stage {self.stage}" if self.stage else "during setup"

    def kill(self) -> None:
        """The child and everything below it: `--workers` runs msrun in a session of its own,
        which a kill of the child alone (or of this process group) would leave running."""
        process_tree.kill_tree(self.pid)
        os.waitpid(self.pid, 0)
        self.remove_dirs()

    def remove_dirs(self) -> None:
        """The scratch folders of a child that cannot remove them, those it told of last included:
        on a busy machine its "dir" line may still be in the pipe when it is killed."""
        self.drain()
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)

    def drain(self) -> None:
        """Read every event the child wrote so far (never blocks)."""
        if self.pipe is None:
            return
        os.set_blocking(self.pipe, False)
        data = b""
        while True:
            try:
                chunk = os.read(self.pipe, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            data += chunk
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            self.event(line.decode("utf-8", "replace"))


def _say(line: str) -> None:
    sys.stderr.write(f"objdebug: error: {line}\n")
    sys.stderr.flush()


def _watch(pid: int, read: int) -> int:
    child = _Child(pid, read)
    got: list[tuple[int, float]] = []

    sent = [0.0]

    def forward(signum, frame):
        if not got:
            got.append((signum, time.monotonic()))
            sent[0] = got[0][1]
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    start = time.monotonic()
    while True:
        try:
            ready, _, _ = select.select([read], [], [], 0.2)
        except InterruptedError:
            ready = []
        if ready:
            child.drain()
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return _as_sent(got, _code(child, status))
        now = time.monotonic()
        ending = child.timeout and now - start > child.timeout or got and now - got[0][1] > GRACE
        if ending:
            child.drain()
        if ending and child.said is not None:
            # the child said how the run ended and is slow to exit (a busy machine): its line is
            # the one line; end it quietly with its code
            child.kill()
            return _as_sent(got, child.said)
        if child.timeout and now - start > child.timeout:
            child.kill()
            _say(f"timed out after {child.timeout:g} s (--timeout) {child.where()}; no report "
                 f"written")
            return 3
        if got and now - sent[0] > RESEND and (child.drain() or child.said is None):
            # a signal that arrived while MindSpore ran a graph went to MindSpore's own handler
            # and may be lost; the child ignores signals once one fired, so sending again is safe
            # until it said its line (then it is exiting, with Python's handlers back)
            sent[0] = now
            try:
                os.kill(pid, got[0][0])
            except ProcessLookupError:
                pass
        if got and now - got[0][1] > GRACE:
            child.kill()
            signum = got[0][0]
            _say(f"interrupted {child.where()} ({signal.Signals(signum).name}; MindSpore did not "
                 f"return within {GRACE:g} s); no report written")
            return 128 + signum


def _as_sent(got: list[tuple[int, float]], code: int) -> int:
    """MindSpore's runtime turns a SIGINT into SIGTERM inside the child: the supervisor knows
    which signal the user sent."""
    if got and got[0][0] == signal.SIGINT and code == 128 + signal.SIGTERM:
        return 128 + signal.SIGINT
    return code


def _code(child: _Child, status: int) -> int:
    # what the child said before it ended, all of it: its "clean" line may have come after this
    # loop's last read (a busy machine), and a clean exit must not read as os._exit(0)
    child.drain()
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal (SIGKILL from outside, the OOM killer): clean up after it
        child.remove_dirs()
        return 128 - code
    if code == 0 and not child.clean:
        _say(f"the run ended with exit 0 without a verdict {child.where()}: the target's code ended "
             f"the process (os._exit?); a run that did not reach its verdict is not a pass")
        return 3
    return code

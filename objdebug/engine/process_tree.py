"""A process's descendants, from /proc (Linux): what must die with an interrupted launcher."""

from __future__ import annotations

import os
import signal


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first), empty where /proc is missing."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        here = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == here and p not in found]
        found += kids
        frontier += kids
    return found


def die_with_parent() -> None:
    """This process is killed with SIGKILL when its parent dies (Linux prctl PR_SET_PDEATHSIG):
    a supervisor's run, or an isolated measurement, never outlives the process that waits for it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _send(pid: int, signum: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and every process below it, sessions of their own included (msrun gives its
    workers a process group each); returns the pids killed.

    The tree is frozen first (SIGSTOP, top down, until a new listing finds no one new): a stopped
    process cannot start another, and its children stay its children, so none escapes by being
    re-parented while the tree is read. Then each one, and the group it leads, is killed."""
    frozen: list[int] = []
    while True:
        new = [p for p in [pid, *descendants(pid)] if p not in frozen]
        if not new:
            break
        for p in new:
            _send(p, signal.SIGSTOP)
        frozen += new
    for p in frozen:
        _send(p, signal.SIGKILL, group=p != pid)  # the root's group may be its parent's
        _send(p, signal.SIGKILL)
    return frozen


def alive(pid: int) -> bool:
    """`pid` is a live process (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return not os.path.isdir("/proc")  # no /proc: kill(0) is all we know
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")

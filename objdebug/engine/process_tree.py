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

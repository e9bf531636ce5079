"""What a stuck run's supervisor needs to know: the graph being compiled, the stage, the scratch
folders, whether the run ended through Python's normal exit (objdebug/supervisor.py).

MindSpore compiles in C++ holding the GIL: while a construct that never terminates compiles, no
Python code of this process runs, no thread and no signal handler. So the CLI runs in a child of
a small supervisor process, and this module sends it one line per event through a pipe: cheap
(a few writes per compile), and a no-op when there is no supervisor (the library, in-process tests).
"""

from __future__ import annotations

import os

FD_ENV = "OBJDEBUG_SUPERVISOR_FD"     # the pipe's write end, in the supervised child
PARENT_ENV = "OBJDEBUG_SUPERVISOR"    # the supervisor's pid: only its direct child writes
_state: dict = {"fd": None}


def connect() -> None:
    """In the supervised child (also after it re-executed itself): find the pipe."""
    try:
        if int(os.environ.get(PARENT_ENV, "0")) != os.getppid():
            return  # an msrun worker, a grandchild: the fd number means nothing here
        fd = int(os.environ[FD_ENV])
        os.fstat(fd)
    except (KeyError, ValueError, OSError):
        return
    _state["fd"] = fd


def send(kind: str, text: str = "") -> None:
    fd = _state["fd"]
    if fd is None:
        return
    line = f"{kind} {text}".strip().replace("\n", " ")[:400] + "\n"
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    except OSError:
        _state["fd"] = None  # the supervisor is gone: carry on alone


def compiling(graph: str | None, shapes: str = "") -> None:
    """Engine.call: `graph` [shapes] starts compiling (None: it returned)."""
    send("graph", f"'{graph}' {shapes}".rstrip() if graph else "")  # a dynamic-shape graph has no shapes


def stage(name: str | None) -> None:
    send("stage", name or "")


def timeout(seconds: float) -> None:
    """The run's time limit (--timeout, or the profile's); 0: none."""
    send("timeout", repr(float(seconds)))


def scratch(path: str, add: bool = True) -> None:
    """A folder the supervisor removes if it has to end the run."""
    send("dir" if add else "undir", path)


def said(code: int) -> None:
    """The command printed its one ending line and exits with `code`: a supervisor that must
    still kill it (its exit is slow on a busy machine) adds no second line."""
    send("said", str(int(code)))


def clean_exit() -> None:
    """atexit: the process ends through Python (a verdict, an error line), not os._exit."""
    send("clean")

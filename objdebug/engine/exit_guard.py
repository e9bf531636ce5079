"""The target's code may not end objdebug: `sys.exit(0)` / `os._exit(0)` in a factory or construct.

A gate that exits 0 with no verdict line looks like a pass (issue 23). What can be done in-process:

- `sys.exit(n)` raises SystemExit: `user_exits()` turns one raised by the run into an InputError
  (exit 2) that names the call.
- `os._exit(n)` ends the process at once, past every `except`, `finally` and atexit handler; it
  cannot be caught. While the guard is active `os._exit` is replaced by a function that raises the
  same SystemExit instead, in this process's main thread only: a forked child (a dataset worker,
  msrun's helpers) or another thread gets the real `os._exit`, because a forked child that raises
  instead of ending would run the parent's code a second time. User code that bound `_exit`
  before the run (`from os import _exit` at import time of a module imported earlier) or that
  calls `posix._exit` / C `exit()` is out of reach of any in-process guard; only a parent process
  could see it. That is not done: it would double every run's start-up and put a process between
  objdebug and msrun's signals, for code that deliberately bypasses Python's exit.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from objdebug.core.errors import InputError

_real_exit = os._exit


class UserExit(SystemExit):
    """os._exit(n) called by the target's code while the guard was active."""


def _raising_exit(owner: int):
    def _exit(code: int) -> None:
        if os.getpid() != owner or threading.current_thread() is not threading.main_thread():
            _real_exit(code)
        raise UserExit(code)
    return _exit


@contextlib.contextmanager
def user_exits(what: str = "the target's code") -> Iterator[None]:
    """Within the block, sys.exit / os._exit from the target's code are an InputError (exit 2)."""
    previous = os._exit
    os._exit = _raising_exit(os.getpid())
    try:
        yield
    except SystemExit as exc:
        raise InputError(exit_message(exc, what)) from None
    finally:
        os._exit = previous


def exit_message(exc: SystemExit, what: str) -> str:
    call = "os._exit" if isinstance(exc, UserExit) else "sys.exit"
    return (f"{what} called {call}({exc.code!r}): objdebug cannot reach a verdict when the "
            f"target ends the process; remove the exit call (raise an exception instead)")

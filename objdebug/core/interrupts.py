"""SIGINT / SIGTERM as an exception, so a stopped run cleans up and says where it stopped.

With Python's defaults SIGTERM ends the process at once (no `finally`, an empty scratch directory
left behind, rc -15) and SIGINT raises a KeyboardInterrupt that user code or MindSpore may swallow.
Inside `raising_signals()` both raise `Interrupted`, a BaseException (so a check's
`except Exception` cannot turn it into an ERROR finding), every `finally` runs (scratch directories
are removed, report temporaries deleted), and the CLI exits 128 + signal: 130 for SIGINT, 143 for
SIGTERM. MindSpore's C++ code is not interrupted: the signal is handled when the running call
(a graph compile, say) returns to Python.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_hold: dict[str, object] = {"depth": 0, "pending": None, "fired": None, "handler": None}


def _after_the_first(signum, frame) -> None:
    """What SIGINT/SIGTERM do once one fired: nothing. A Python function, not SIG_IGN: a signal
    that reaches Python's C handler anyway (MindSpore's C handler, installed while a graph runs,
    passes it on to the handler it replaced; the supervisor sends again every 0.5 s) would find
    SIG_IGN at the Python level and print "Signal 2 ignored due to race condition" with a
    traceback from whatever line ran (the watchdog's os.write), where one line is promised."""


def _ignore_later_signals() -> None:
    for s in SIGNALS:
        signal.signal(s, _after_the_first)


class Interrupted(BaseException):
    """The run was stopped by a signal; `after` is the last finished stage, `during` the current one."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.after: str | None = None
        self.during: str | None = None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 SIGINT, 143 SIGTERM

    def where(self) -> str:
        """' after stage align' / ' after stage setup' (nothing finished yet), plus the stage it
        was in; '' outside a run (render)."""
        if self.after is None and self.during is None:
            return ""
        text = f" after stage {self.after or 'setup'}"
        if self.during and self.during != self.after:
            text += f" (during {self.during})"
        return text


@contextlib.contextmanager
def raising_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise Interrupted (main thread only; elsewhere a no-op).

    Only the first signal raises: later ones are ignored, so the cleanup that the first one starts
    (removing a scratch directory, report temporaries) is not cut short by an impatient second ^C.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _hold["depth"]:  # inside held(): raised when the block ends
            _hold["pending"] = _hold["pending"] or signum
            return
        _ignore_later_signals()
        _hold["fired"] = signum
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    _hold["fired"], _hold["handler"] = None, handler
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        _hold["fired"], _hold["handler"] = None, None  # the next run in this process starts clean


def reassert() -> None:
    """Take SIGINT/SIGTERM back after MindSpore ran a graph.

    MindSpore's runtime installs its own C-level SIGINT handler when it first runs a graph, and
    that handler turns SIGINT into SIGTERM (measured on 2.10: a ^C after the first stage exited
    143, not 130). Python's signal.signal still reports our handler, so it is installed again
    (one sigaction per call) after every compile; a no-op outside raising_signals() or after a
    signal already fired."""
    handler = _hold["handler"]
    if handler is None or _hold["fired"] or threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, handler)


def swallowed() -> Interrupted | None:
    """The Interrupted to raise again when a signal fired but code on the way caught it as any
    exception (MindSpore's load_checkpoint turns it into "Failed to read ...: SIGTERM")."""
    signum = _hold["fired"]
    return Interrupted(signum) if signum else None


def raise_swallowed() -> None:
    """Raise the Interrupted that code on the way swallowed, if any (`swallowed`): the run stops
    there, as asked. Inside an `except` block the caught error is not chained to it: it was only
    the signal's disguise."""
    exc = swallowed()
    if exc is not None:
        raise exc from None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Delay SIGINT/SIGTERM until the block ends: a few renames that must happen all together.

    (Blocking the signal with pthread_sigmask would not do: MindSpore's threads would receive it
    and Python would still run the handler in the main thread, inside the block.)
    """
    _hold["depth"] += 1
    try:
        yield
    finally:
        _hold["depth"] -= 1
        if not _hold["depth"] and _hold["pending"]:
            pending, _hold["pending"] = _hold["pending"], None
            _ignore_later_signals()
            _hold["fired"] = pending
            raise Interrupted(pending)

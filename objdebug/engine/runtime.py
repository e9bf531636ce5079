"""MindSpore process setup: device, execution mode, seed, and a scratch working directory.

MindSpore writes `rank_0/` (compile failures) and `rewritten_network/` (auto mixed precision) into
the current directory; objdebug runs its MindSpore work inside a scratch directory so a user's
repository is never littered.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

os.environ.setdefault("GLOG_v", "3")  # MindSpore's INFO/WARNING logs drown the report

from objdebug.core.errors import InputError  # noqa: E402

_state: dict[str, object] = {}


def import_mindspore():
    """`import mindspore` with SIGINT/SIGTERM held until it is done: a signal inside the import
    leaves MindSpore half-imported, and its atexit hook then aborts the process (rc 134)."""
    from objdebug.core.interrupts import held

    with held():
        import mindspore
    _apply_quiet()
    return mindspore


def quiet_logs(debug: bool, user_level: str | None) -> None:
    """MindSpore's own `[ERROR]` log lines (a missing libcuda for `--device GPU`, a compile
    failure's dump) reach the terminal only under --debug; objdebug reports the error itself in one
    line. A user's own GLOG_v (`user_level`) is kept. Takes effect when MindSpore is first
    imported, which the commands do lazily. The user's libraries' own INFO lines (MindFormers, an
    HF-style port's banner) are held back the same way."""
    from objdebug.engine.third_party_logs import silence

    silence(debug)
    if user_level is None:
        os.environ["GLOG_v"] = "3" if debug else "4"  # 4: CRITICAL only
        quiet_mindspore(not debug)


def quiet_mindspore(quiet: bool) -> None:
    """Keep MindSpore's own Python log lines ([ERROR] about a missing libcuda, [CRITICAL] about a
    checkpoint it cannot read) off the terminal: objdebug reports the error in one line. The C++
    side reads GLOG_v at import (the CLI sets it); the Python logger is set here."""
    _state["quiet"] = quiet
    if "mindspore" in sys.modules:
        _apply_quiet()


def _apply_quiet() -> None:
    if not _state.get("quiet"):
        return
    try:
        import logging

        from mindspore import log as ms_log

        ms_log._get_logger().setLevel(logging.CRITICAL + 1)  # private, but the only handle
    except Exception:  # pragma: no cover - a MindSpore without it: its lines stay visible
        pass


def setup(device: str = "CPU", mode: str = "graph", seed: int = 0) -> None:
    """Configure MindSpore once per process; later calls may change mode and seed, not device."""
    ms = import_mindspore()

    current = _state.get("device")
    if current is None:
        from objdebug.engine.ms_versions import unsupported_reason

        if why := unsupported_reason(str(ms.__version__)):  # installed with --no-deps beside an old one
            raise InputError(why)
        try:
            ms.set_device(device)
        except (RuntimeError, ValueError) as exc:
            # MindSpore refuses set_device once a kernel has run in this process (a library
            # caller, or a test, ran MindSpore first); on the same device that is no problem
            if not ("initialized" in str(exc) and ms.get_context("device_target") == device):
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(f"For 'run.device', '{device}' is not available here: {first}") from None
        _state["device"] = device
        # MindSpore runs a full gc.collect() before every graph compile (~0.1 s here, most of it
        # walking the objects the imports of MindSpore, NumPy and SciPy made, none of which is
        # ever garbage): move them out of the collector's reach, once per process
        gc.freeze()
    elif current != device:
        raise InputError(f"For 'run.device', this process already runs on '{current}'; "
                         f"start a new process for '{device}'.")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(seed)
    _state["mode"] = mode


def device() -> str | None:
    return _state.get("device")  # type: ignore[return-value]


@contextlib.contextmanager
def scratch_dir() -> Iterator[str]:
    """Run the block in a temporary working directory, removed afterwards."""
    old = os.getcwd()
    from objdebug.core import leftovers
    from objdebug.core.interrupts import held
    from objdebug.engine import watchdog

    leftovers.clean_scratch()  # what runs killed by SIGKILL left
    tmp = None
    try:
        # a signal between mkdtemp and the `finally` that removes the folder (a busy machine
        # can deschedule the run right there) left it behind: it waits for the folder's setup
        with held():
            tmp = tempfile.mkdtemp(prefix="objdebug-")
            leftovers.mark(tmp)
            _state["user_dir"] = old
            os.chdir(tmp)
            watchdog.scratch(tmp)  # removed by the watchdog too, if it has to end a stuck run
        yield tmp
    finally:
        if tmp is not None:
            os.chdir(old)
            _state.pop("user_dir", None)
            shutil.rmtree(tmp, ignore_errors=True)
            watchdog.scratch(tmp, add=False)


def user_dir() -> str:
    """The user's working directory (outside a scratch directory: the current one): where the
    user's own code expects its relative paths to start (`[data] batches_kwargs`)."""
    return str(_state.get("user_dir") or os.getcwd())


def versions() -> dict[str, str]:
    import platform

    import numpy
    import scipy

    import objdebug

    out = {"objdebug": objdebug.__version__, "python": platform.python_version(),
           "numpy": numpy.__version__, "scipy": scipy.__version__, "platform": platform.platform()}
    try:
        out["mindspore"] = import_mindspore().__version__
    except Exception:  # pragma: no cover - mindspore is a hard dependency
        out["mindspore"] = "unavailable"
    return out

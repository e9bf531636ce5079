"""What an exception that ends a command means: its exit code and the one line that says why.

Exit codes: 0 all checks pass, 1 a check failed, 2 usage/config/input error (`InputError`),
3 internal error, 128 + signal for an interrupt (130 SIGINT, 143 SIGTERM). The CLI prints the line
as `objdebug: error: ...`; with --debug the traceback (and MindSpore's full text, when an input
error kept it) goes to stderr first.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator

from objdebug.core.errors import EXIT_INPUT_ERROR, EXIT_INTERNAL_ERROR, InputError
from objdebug.core.interrupts import Interrupted, swallowed

# what `ending` turns into an exit: every error, and the interrupts (SystemExit passes through)
ENDINGS = (Exception, KeyboardInterrupt, Interrupted)


@contextlib.contextmanager
def signals_first() -> Iterator[None]:
    """A signal that the user's code or MindSpore turned into another error is raised as itself."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as exc:
        if swallowed() is not None and not isinstance(exc, Interrupted):
            raise swallowed() from None
        raise


def ending(exc: BaseException, debug: bool = False) -> tuple[int, str]:
    """(exit code, one line) for an exception that ends a command."""
    if isinstance(exc, InputError):
        if debug:
            traceback.print_exception(exc)
            if getattr(exc, "detail", None):  # e.g. MindSpore's full compile error
                print(exc.detail, file=sys.stderr)
        return EXIT_INPUT_ERROR, str(exc)
    if isinstance(exc, Interrupted):
        written = "reports written" if getattr(exc, "reports_written", False) else "no report written"
        return exc.exit_code, f"interrupted{exc.where()}; {written}"
    if isinstance(exc, KeyboardInterrupt):  # a ^C outside raising_signals (another thread's handler)
        return 130, "interrupted; no report written"
    if debug:
        traceback.print_exception(exc)
        return EXIT_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}"
    first = (str(exc).strip().splitlines() or [""])[0]
    return EXIT_INTERNAL_ERROR, (f"internal error: {type(exc).__name__}: {first} "
                                 "(run with --debug for the traceback)")

"""Other libraries' output stays off the terminal unless --debug.

The README promises MindSpore's own log lines only with `--debug`; the same holds for what the
user's factories import and build: MindFormers logs ~14 ` - INFO - ` lines per command, an HF-style
port a banner at import; mindone 0.5.0 prints, at import of `mindone.transformers`, "None of
PyTorch, TensorFlow >= 2.0, or Flax have been found" (twice, a transformers WARNING), a
`FutureWarning` from `image_processing_auto.py` and "Config not found for parakeet" (three times).

- Python logging below WARNING is switched off for the whole process (every logger, whoever
  configured it); warnings and errors from the run itself still show (`silence`).
- While the user's factory module is imported and its factory called (`held_back`, in
  engine/target.py), everything that code writes is held back: `print` to stdout / stderr, Python
  warnings, log records of any level. A stream handler a library creates in that window keeps
  writing to the real stream afterwards (the window's stand-in forwards once it closes), so a
  later warning of the run is not lost. An error in that code still reaches the user: objdebug
  reports the exception itself in one line.

objdebug's own messages do not go through logging. Droppings in the working directory
(MindFormers' `./output/log/`) land in the scratch directory the target is loaded in
(`runtime.scratch_dir`), removed afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

_state = {"hold": False}  # set by the CLI (`silence(debug=False)`); the library API holds nothing back


def silence(debug: bool) -> None:
    """INFO and DEBUG records of every logger dropped, and the user's import-time output held
    back (not under --debug)."""
    logging.disable(logging.NOTSET if debug else logging.INFO)
    _state["hold"] = not debug


class _Held:
    """A stand-in for sys.stdout / sys.stderr: drops writes while the window is open, forwards
    them to the real stream after (to a handler that kept a reference to it)."""

    def __init__(self, real):
        self._real, self.open = real, True

    def write(self, text):
        return len(text) if self.open else self._real.write(text)

    def flush(self):
        if not self.open:
            self._real.flush()

    def __getattr__(self, name):  # fileno, encoding, isatty, ...: the real stream's
        return getattr(self._real, name)


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """The output of the code run inside (the user's factory import / call) held back, see the
    module docstring; a no-op under --debug and for the library API."""
    if not _state["hold"]:
        yield
        return
    out, err = _Held(sys.stdout), _Held(sys.stderr)
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            yield
    finally:
        out.open = err.open = False
        logging.disable(disabled)

"""Other libraries' log lines stay off the terminal unless --debug.

The README promises MindSpore's own log lines only with `--debug`; the same holds for what the
user's factories import: MindFormers logs ~14 ` - INFO - ` lines per command, an HF-style port a
banner at import. Python logging below WARNING is switched off for the whole process (every
logger, whoever configured it); warnings and errors still show. objdebug's own messages do not go
through logging. Droppings in the working directory (MindFormers' `./output/log/`) land in the
scratch directory the target is loaded in (`runtime.scratch_dir`), removed afterwards.
"""

from __future__ import annotations

import logging


def silence(debug: bool) -> None:
    """INFO and DEBUG records of every logger dropped (not under --debug)."""
    logging.disable(logging.NOTSET if debug else logging.INFO)

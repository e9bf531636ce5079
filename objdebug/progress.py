"""Progress display for long work: a bar on a terminal, silent otherwise."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


class Progress:
    """`with progress.task("align", total=9) as tick: ... tick()`; draws on stderr only on a TTY."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled

    @contextlib.contextmanager
    def task(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if self.enabled and total > 0:
                width = 24
                filled = int(width * done / total)
                self.stream.write(f"\r{label[:40]:<40} [{'#' * filled}{'.' * (width - filled)}] "
                                  f"{done}/{total}")
                self.stream.flush()

        try:
            yield tick
        finally:
            if self.enabled and total > 0:
                self.stream.write("\r" + " " * 80 + "\r")
                self.stream.flush()
